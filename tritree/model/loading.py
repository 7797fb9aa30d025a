"""Loading Hugging Face checkpoints (safetensors shards + index) by their real tensor names.

Shards are read one at a time with ``safe_open`` and only the tensors needed are materialised
(the layers asked for, the local heads' slices), so a real-shape slice of K2.6 fits one GPU.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import torch
from safetensors import safe_open

from .config import KimiK2Config
from .kimi_k2 import layer_prefix, param_shapes, rope_permutation

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


def _needed(cfg: KimiK2Config, layers) -> dict[str, str]:
    """Checkpoint name -> parameter name (experts are stacked after loading)."""
    want = {}
    for name in param_shapes(cfg):
        if ".layers." in name and int(name.split(".")[2]) not in layers:
            continue
        if ".mlp.experts." in name and not name.split("experts.")[1].split(".")[0].isdigit():
            i = int(name.split(".")[2])
            proj = name.split("experts.")[1]
            for e in range(cfg.n_routed_experts):
                want[f"{layer_prefix(i)}mlp.experts.{e}.{proj}"] = name
            continue
        want[name] = name
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
    return want


def load_params(path: str, cfg: KimiK2Config | None = None, *, layers=None, device="cpu",
                dtype=torch.float32) -> tuple[dict, KimiK2Config]:
    """Parameters of a HF DeepSeek-V3-architecture checkpoint directory.

    ``layers``: the decoder layers to load (default all); ``cfg.num_local_heads`` /
    ``cfg.first_local_head`` select a tensor-parallel rank's heads. The RoPE permutation is applied.
    Returns ``(params, cfg)``. Raises ``KeyError`` naming a missing tensor, ``ValueError`` for a shape
    that contradicts the config or a quantised tensor this version does not dequantise.
    """
    cfg = cfg or KimiK2Config.from_hf(path)
    layers = set(range(cfg.num_hidden_layers)) if layers is None else set(layers)
    wmap = _weight_map(path)
    pre = cfg.weight_prefix
    bad = [k for k in wmap if k.endswith(_UNSUPPORTED_QUANT)]
    if bad:
        raise ValueError(f"unsupported quantization: tensor {bad[0]!r} ({len(bad)} such); tritree reads bf16/fp16/"
                         f"fp32 weights, compressed-tensors INT4 (weight_packed + weight_scale) and FP8 e4m3 with "
                         f"weight_scale_inv block scales")
    want = _needed(cfg, layers)
    missing = [pre + k for k in want if pre + k not in wmap and pre + k + "_packed" not in wmap]
    if missing:
        raise KeyError(f"checkpoint {path} has no tensor {missing[0]!r} ({len(missing)} missing; "
                       f"weight prefix {pre!r})")
    shapes = param_shapes(cfg.with_(num_local_heads=None))
    params, experts = {}, defaultdict(dict)
    handles = {}

    def read(name):
        file = wmap[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        return handles[file].get_tensor(name)

    for k in sorted(want, key=lambda n: wmap.get(pre + n, wmap.get(pre + n + "_packed"))):  # shard by shard
        target = want[k]
        want_shape = shapes[target][1:] if target != k else shapes[target]
        t = _read_weight(read, wmap, pre + k, device)
        if tuple(t.shape) != tuple(want_shape):
            raise ValueError(f"tensor {pre + k!r} has shape {tuple(t.shape)}, the config implies {tuple(want_shape)}")
        t = _to_local(cfg, target, t)
        t = t.to(device=device, dtype=torch.float32 if ".mlp.gate." in target else dtype)
        if target != k:
            experts[target][int(k.split("experts.")[1].split(".")[0])] = t
        else:
            params[target] = t
    for name, per in experts.items():
        params[name] = torch.stack([per[e] for e in range(cfg.n_routed_experts)])
    if cfg.tie_word_embeddings:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]
    return params, cfg


def _read_weight(read, wmap, name: str, device) -> torch.Tensor:
    """One weight, dequantised when the checkpoint stores it as INT4 (``name + "_packed"``) or as FP8
    with ``weight_scale_inv`` block scales; done on ``device`` (the Triton kernels on a GPU)."""
    from ..kernels.quant import dequant_fp8, dequant_int4

    if name in wmap:
        t = read(name)
        if t.dtype == torch.float8_e4m3fn:
            if name + "_scale_inv" not in wmap:
                raise ValueError(f"FP8 tensor {name!r} has no {name + '_scale_inv'!r}")
            return dequant_fp8(t.to(device), read(name + "_scale_inv").to(device), dtype=torch.float32)
        return t
    packed, scale = name + "_packed", name + "_scale"
    if scale not in wmap:
        raise KeyError(f"INT4 tensor {packed!r} has no {scale!r}")
    shape = read(name + "_shape").tolist() if name + "_shape" in wmap else None
    return dequant_int4(read(packed).to(device), read(scale).to(device), dtype=torch.float32, shape=shape)


def _to_local(cfg: KimiK2Config, name: str, t: torch.Tensor) -> torch.Tensor:
    """RoPE row permutation and the local heads' slice of one checkpoint tensor."""
    Hg, H0, H = cfg.num_attention_heads, cfg.first_local_head, cfg.heads
    perm = rope_permutation(cfg.qk_rope_head_dim)
    if name.endswith("self_attn.q_b_proj.weight"):
        t = t.view(Hg, cfg.qk_head_dim, -1)[H0:H0 + H].clone()
        t[:, cfg.qk_nope_head_dim:] = t[:, cfg.qk_nope_head_dim:][:, perm]
        return t.reshape(H * cfg.qk_head_dim, -1)
    if name.endswith("self_attn.kv_a_proj_with_mqa.weight"):
        t = t.clone()
        t[cfg.kv_lora_rank:] = t[cfg.kv_lora_rank:][perm]
        return t
    if name.endswith("self_attn.kv_b_proj.weight"):
        per = cfg.qk_nope_head_dim + cfg.v_head_dim
        return t.view(Hg, per, -1)[H0:H0 + H].reshape(H * per, -1).clone()
    if name.endswith("self_attn.o_proj.weight"):
        return t.view(t.shape[0], Hg, cfg.v_head_dim)[:, H0:H0 + H].reshape(t.shape[0], -1).clone()
    return t


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
    for name in sorted(shapes, key=lambda n: wmap[n]):
        file = wmap[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        t = _read_weight(handles[file].get_tensor, wmap, name, device)
        if tuple(t.shape) != tuple(shapes[name]):
            raise ValueError(f"tensor {name!r} has shape {tuple(t.shape)}, the config implies {tuple(shapes[name])}")
        params[name] = t.to(device=device, dtype=dtype)
    return params, cfg
