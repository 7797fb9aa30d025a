"""Loading Hugging Face checkpoints (safetensors shards + index) by their real tensor names.

Shards are read one at a time with ``safe_open`` and only the tensors needed are materialised
(the layers asked for, the local heads' slices), so a real-shape slice of K2.6 fits one GPU. Under
tensor parallelism each rank reads only its slices (``get_slice``) and its experts' tensors
(:mod:`tritree.model.parallel`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import torch
from safetensors import safe_open

# At import, not in the function: triton.jit fixes a kernel's interpreter mode when its module loads.
from ..kernels.quant import dequant_fp8, dequant_int4
from .config import KimiK2Config
from .kimi_k2 import layer_prefix, param_shapes
from .layers import rope_permutation
from .parallel import shard_config, shard_slice

_UNSUPPORTED_QUANT = ("qweight", "qzeros", "scales", "weight_zero_point", "input_scale")


def _weight_map(path: str) -> dict[str, str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    with safe_open(single, "pt") as f:
        return {k: single for k in f.keys()}


def _needed(cfg: KimiK2Config, layers, experts) -> dict[str, str]:
    """Checkpoint name -> parameter name (experts ``experts``, a range, are stacked after loading)."""
    want = {}
    for name in param_shapes(cfg):
        if ".layers." in name and int(name.split(".")[2]) not in layers:
            continue
        if ".mlp.experts." in name and not name.split("experts.")[1].split(".")[0].isdigit():
            i = int(name.split(".")[2])
            proj = name.split("experts.")[1]
            for e in experts:
                want[f"{layer_prefix(i)}mlp.experts.{e}.{proj}"] = name
            continue
        want[name] = name
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
    return want


def load_params(path: str, cfg: KimiK2Config | None = None, *, layers=None, device="cpu",
                dtype=torch.float32, tp=None) -> tuple[dict, KimiK2Config]:
    """Parameters of a HF DeepSeek-V3-architecture checkpoint directory.

    ``layers``: the decoder layers to load (default all); ``cfg.num_local_heads`` /
    ``cfg.first_local_head`` select a tensor-parallel rank's heads. ``tp``
    (:class:`tritree.dist.TPGroup`): this rank's shard of everything (heads, experts, MLP intermediate,
    vocabulary; :mod:`tritree.model.parallel`), each tensor read as a slice; ``cfg`` is then the
    global config and the returned one the rank's. The RoPE permutation is applied.
    Returns ``(params, cfg)``. Raises ``KeyError`` naming a missing tensor, ``ValueError`` for a shape
    that contradicts the config, a quantised tensor this version does not dequantise, or a world
    size that does not divide the sharded dimensions.
    """
    cfg = shard_config(cfg or KimiK2Config.from_hf(path), tp)
    layers = set(range(cfg.num_hidden_layers)) if layers is None else set(layers)
    wmap = _weight_map(path)
    pre = cfg.weight_prefix
    bad = [k for k in wmap if k.endswith(_UNSUPPORTED_QUANT)]
    if bad:
        raise ValueError(f"unsupported quantization: tensor {bad[0]!r} ({len(bad)} such); tritree reads bf16/fp16/"
                         f"fp32 weights, compressed-tensors INT4 (weight_packed + weight_scale) and FP8 e4m3 with "
                         f"weight_scale_inv block scales")
    e_loc = cfg.n_routed_experts // (tp.world if tp is not None else 1)
    first_expert = (tp.rank if tp is not None else 0) * e_loc
    want = _needed(cfg, layers, range(first_expert, first_expert + e_loc))
    missing = [pre + k for k in want if pre + k not in wmap and pre + k + "_packed" not in wmap]
    if missing:
        raise KeyError(f"checkpoint {path} has no tensor {missing[0]!r} ({len(missing)} missing; "
                       f"weight prefix {pre!r})")
    shapes = param_shapes(cfg.with_(num_local_heads=None))
    params, experts = {}, defaultdict(dict)
    handles = {}

    def tensor(name):
        file = wmap[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        return handles[file].get_slice(name)

    for k in sorted(want, key=lambda n: wmap.get(pre + n, wmap.get(pre + n + "_packed"))):  # shard by shard
        target = want[k]
        want_shape = shapes[target][1:] if target != k else shapes[target]
        sl = None if target != k else shard_slice(target, cfg, tp, want_shape)  # experts: whole, if this rank's
        t = _read_weight(tensor, wmap, pre + k, device, want_shape, sl)
        t = _pad(_permute_rope(cfg, target, t), sl)
        t = t.to(device=device, dtype=torch.float32 if ".mlp.gate." in target else dtype)
        if target != k:
            experts[target][int(k.split("experts.")[1].split(".")[0])] = t
        else:
            params[target] = t
    for name, per in experts.items():
        params[name] = torch.stack([per[e] for e in sorted(per)])
    if cfg.tie_word_embeddings:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]
    return params, cfg


def _rows_cols(shape, sl):
    """The index of slice ``sl`` (dim, start, stop, padded) of a 2-D tensor, or of all of it."""
    if sl is None:
        return tuple(slice(None) for _ in shape)
    dim, a, b, _ = sl
    return (slice(a, b), slice(None)) if dim == 0 else (slice(None), slice(a, b))


def _sub(sl, block):
    """``sl`` in units of ``block`` (scale rows / packed words), or None when not aligned to it."""
    dim, a, b, _ = sl
    return (dim, a // block, -(-b // block), None) if a % block == 0 else None


def _read_weight(tensor, wmap, name: str, device, want_shape, sl=None):
    """Slice ``sl`` (:func:`tritree.model.parallel.shard_slice`, unpadded) of one weight, reading only
    that slice, after checking the checkpoint's full shape against ``want_shape``. Dequantised when the
    checkpoint stores it as INT4 (``name + "_packed"``) or as FP8 with ``weight_scale_inv`` block scales,
    on ``device`` (the Triton kernels on a GPU). A quantised tensor whose slice does not start on a
    scale block is read whole and sliced after dequantisation."""
    def check(full):
        if tuple(full) != tuple(want_shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(full)}, the config implies {tuple(want_shape)}")

    if name in wmap:
        h = tensor(name)
        full = tuple(h.get_shape())
        check(full)
        idx = _rows_cols(full, sl)
        if h.get_dtype() != "F8_E4M3":
            return h[idx]
        if name + "_scale_inv" not in wmap:
            raise ValueError(f"FP8 tensor {name!r} has no {name + '_scale_inv'!r}")
        s = tensor(name + "_scale_inv")
        block = 128
        sub = _sub(sl, block) if sl is not None else None
        if sl is None or sub is not None:
            return dequant_fp8(h[idx].to(device), s[_rows_cols(s.get_shape(), sub)].to(device), dtype=torch.float32)
        return dequant_fp8(h[:].to(device), s[:].to(device), dtype=torch.float32)[idx].clone()  # no view of the whole
    packed, scale = name + "_packed", name + "_scale"
    if scale not in wmap:
        raise KeyError(f"INT4 tensor {packed!r} has no {scale!r}")
    p, s = tensor(packed), tensor(scale)
    pshape = tuple(p.get_shape())
    full = tuple(int(x) for x in tensor(name + "_shape")[:].tolist()) if name + "_shape" in wmap else (
        pshape[0], pshape[1] * 8)
    if full != (pshape[0], pshape[1] * 8):
        raise ValueError(f"weight_shape {full} of {name!r} does not match the packed {(pshape[0], pshape[1] * 8)}")
    check(full)
    group = 32
    if sl is not None and sl[0] == 1:  # columns: from a scale group's start (whole words), or read it all
        sub_s = _sub(sl, group)
        if sub_s is None:
            w = dequant_int4(p[:].to(device), s[:].to(device), dtype=torch.float32)
            return w[_rows_cols(full, sl)].clone()
        w = dequant_int4(p[_rows_cols(pshape, _sub(sl, 8))].to(device), s[_rows_cols(s.get_shape(), sub_s)].to(device),
                         dtype=torch.float32)
        return w[:, :sl[2] - sl[1]].clone()
    rows = _rows_cols(pshape, sl)  # rows (or all): the same rows of the packed words and the scales
    return dequant_int4(p[rows].to(device), s[rows].to(device), dtype=torch.float32)


def _permute_rope(cfg: KimiK2Config, name: str, t: torch.Tensor) -> torch.Tensor:
    """The checkpoint's interleaved rope rows -> halves (per head of ``q_b_proj`` / ``q_proj``;
    ``kv_a_proj``'s weight and bias); nothing when ``rope_interleave`` is false (rows already halves)."""
    if not cfg.rope_interleave:
        return t
    perm = rope_permutation(cfg.qk_rope_head_dim)
    if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
        t = t.reshape(-1, cfg.qk_head_dim, t.shape[-1]).clone()
        t[:, cfg.qk_nope_head_dim:] = t[:, cfg.qk_nope_head_dim:][:, perm]
        return t.reshape(-1, t.shape[-1])
    if name.endswith(("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_proj_with_mqa.bias")):
        t = t.clone()
        t[cfg.kv_lora_rank:] = t[cfg.kv_lora_rank:][perm]
        return t
    return t


def _pad(t: torch.Tensor, sl) -> torch.Tensor:
    """Zero-pads a slice to its padded length (the last vocabulary shard)."""
    if sl is None or sl[2] - sl[1] == sl[3]:
        return t
    shape = list(t.shape)
    shape[sl[0]] = sl[3]
    out = t.new_zeros(shape)
    out.narrow(sl[0], 0, t.shape[sl[0]]).copy_(t)
    return out


def load_dflash_params(path: str, cfg=None, *, device="cpu", dtype=torch.float32):
    """Parameters of a DFlash draft checkpoint directory (z-lab names: ``fc.weight``, ``layers.i...``),
    read shard by shard. Returns ``(params, cfg)``; ``KeyError`` names a missing tensor, ``ValueError``
    a shape that contradicts the config."""
    from .config import DFlashConfig
    from .dflash import param_shapes as dflash_shapes

    cfg = cfg or DFlashConfig.from_hf(path)
    wmap = _weight_map(path)
    shapes = dflash_shapes(cfg)
    missing = [k for k in shapes if k not in wmap]
    if missing:
        raise KeyError(f"draft checkpoint {path} has no tensor {missing[0]!r} ({len(missing)} missing)")
    params, handles = {}, {}

    def tensor(name):
        file = wmap[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        return handles[file].get_slice(name)

    for name in sorted(shapes, key=lambda n: wmap[n]):
        t = _read_weight(tensor, wmap, name, device, shapes[name])
        params[name] = t.to(device=device, dtype=dtype)
    return params, cfg
