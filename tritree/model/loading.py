"""Loading Hugging Face checkpoints (safetensors shards + index) by their real tensor names.

Shards are read one at a time with ``safe_open`` and only the tensors needed are materialised
(the layers asked for, the local heads' slices), so a real-shape slice of K2.6 fits one GPU. Under
tensor parallelism each rank reads only its slices (``get_slice``) and its experts' tensors
(:mod:`tritree.model.parallel`).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict

import torch
from safetensors import safe_open

# At import, not in the function: triton.jit fixes a kernel's interpreter mode when its module loads.
from ..kernels.moe.int4 import GROUP
from ..kernels.quant import dequant_fp8, dequant_int4
from .config import KimiK2Config
from .kimi_k2 import DENSE_EXPERT_KEYS, EXPERT_LAYOUTS, layer_prefix, param_shapes
from .layers import rope_permutation
from .parallel import shard_config, shard_slice

log = logging.getLogger(__name__)
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
                dtype=torch.float32, tp=None, experts: str = "int4", stats: dict | None = None) -> tuple[dict, KimiK2Config]:
    """Parameters of a HF DeepSeek-V3-architecture checkpoint directory.

    ``layers``: the decoder layers to load (default all); ``cfg.num_local_heads`` /
    ``cfg.first_local_head`` select a tensor-parallel rank's heads. ``tp``
    (:class:`tritree.dist.TPGroup`): this rank's shard of everything (heads, experts, MLP intermediate,
    vocabulary; :mod:`tritree.model.parallel`), each tensor read as a slice; ``cfg`` is then the
    global config and the returned one the rank's. The RoPE permutation is applied.

    Routed experts (only the rank's ``E / world``, read one expert's tensor at a time straight into the
    layer's stacked tensors on ``device``, so loading holds no second copy of them):

    - ``experts="int4"`` (default): INT4 (compressed-tensors) routed experts stay packed: int32
      ``weight_packed`` and bf16 ``weight_scale`` stacked per layer into the INT4 layout of
      :mod:`tritree.model.kimi_k2` (``mlp.experts.w13_packed`` ...; no float copy of them is ever made),
      which the model runs through the fused W4A16 op. Experts stored otherwise (bf16, FP8 block-scaled as
      K2-Instruct's) load dense, as with ``"dense"``: FP8 is dequantised at load, there is no FP8 kernel.
    - ``experts="dense"``: every format dequantised to ``dtype`` and stacked (``mlp.experts.gate_proj.weight``
      ``[E, I, H]`` ...): the bf16 grouped path, for comparison.

    ``stats``: a dict filled with the loading's memory: ``host_rss_peak`` / ``host_anon_peak`` (bytes; the
    process's resident set, and its anonymous part that excludes the checkpoint's mapped file pages,
    sampled after every tensor read), ``host_rss_start`` / ``host_anon_start``, ``device_peak`` /
    ``device_start`` (bytes torch allocated on a CUDA ``device``, the peak counter reset at the start;
    None elsewhere) and ``routed_expert_bytes`` (the loaded routed experts); the same is logged at INFO on
    the ``tritree.model.loading`` logger.

    Returns ``(params, cfg)``. Raises ``KeyError`` naming a missing tensor, ``ValueError`` for a shape
    that contradicts the config, a quantised tensor this version does not dequantise, or a world
    size that does not divide the sharded dimensions.
    """
    if experts not in EXPERT_LAYOUTS:
        raise ValueError(f"experts must be one of {EXPERT_LAYOUTS}, got {experts!r}")
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
    meter = _MemoryMeter(device)
    params = {}
    handles = {}

    def tensor(name):
        file = wmap[name]
        if file not in handles:
            handles[file] = safe_open(file, "pt")
        return handles[file].get_slice(name)

    def file_of(n):
        return wmap.get(pre + n, wmap.get(pre + n + "_packed"))

    routed = defaultdict(list)  # stacked parameter name -> checkpoint names of its experts, in expert order
    for k in want:
        if want[k] != k:
            routed[want[k]].append(k)
    for k in sorted((k for k in want if want[k] == k), key=file_of):  # shard by shard
        sl = shard_slice(k, cfg, tp, shapes[k])
        t = _read_weight(tensor, wmap, pre + k, device, shapes[k], sl)
        t = _pad(_permute_rope(cfg, k, t), sl)
        params[k] = t.to(device=device, dtype=torch.float32 if k.endswith("e_score_correction_bias") else dtype)
        meter.sample()
    for i in sorted(layers):  # routed experts one layer at a time, each tensor written into its slot
        p = layer_prefix(i) + "mlp.experts."
        if p + "gate_proj.weight" not in routed:
            continue
        names = {proj: sorted(routed[p + proj], key=_expert_id) for proj in DENSE_EXPERT_KEYS}
        packed = [pre + n + "_packed" in wmap for per in names.values() for n in per]
        if experts == "int4" and all(packed):
            params.update(_load_int4_layer(tensor, wmap, pre, names, shapes, p, device, meter))
        elif experts == "int4" and any(packed):
            raise ValueError(f"layer {i}'s routed experts are partly INT4: tritree keeps a layer's experts in one "
                             f"format")
        else:
            for proj, per in names.items():
                full = shapes[p + proj]
                out = torch.empty((len(per), *full[1:]), dtype=dtype, device=device)
                for j, n in enumerate(per):
                    out[j] = _read_weight(tensor, wmap, pre + n, device, full[1:])
                    meter.sample()
                params[p + proj] = out
    if cfg.tie_word_embeddings:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]
    handles.clear()
    meter.report(stats, sum(t.nbytes for k, t in params.items() if ".mlp.experts." in k))
    return params, cfg


def _expert_id(name: str) -> int:
    return int(name.split("experts.")[1].split(".")[0])


def _load_int4_layer(tensor, wmap, pre, names, shapes, p, device, meter) -> dict:
    """One layer's INT4 routed experts, packed: ``names`` (``gate_proj.weight`` / ``up_proj.weight`` /
    ``down_proj.weight`` -> the local experts' checkpoint names, in order) -> the four stacked tensors of
    :class:`tritree.kernels.Int4Experts` under ``p + "w13_packed"`` ..., on ``device``. Each expert's
    ``weight_packed`` (int32) and ``weight_scale`` (bf16) are copied into their slot as read."""
    E = len(names["gate_proj.weight"])
    _, I, H = shapes[p + "gate_proj.weight"]
    if H % GROUP or I % GROUP:
        raise ValueError(f"INT4 experts need hidden ({H}) and intermediate ({I}) sizes that are multiples of {GROUP}")
    out = {p + "w13_packed": torch.empty(E, 2 * I, H // 8, dtype=torch.int32, device=device),
           p + "w13_scale": torch.empty(E, 2 * I, H // GROUP, dtype=torch.bfloat16, device=device),
           p + "w2_packed": torch.empty(E, H, I // 8, dtype=torch.int32, device=device),
           p + "w2_scale": torch.empty(E, H, I // GROUP, dtype=torch.bfloat16, device=device)}
    slots = {"gate_proj.weight": ("w13", slice(0, I)), "up_proj.weight": ("w13", slice(I, 2 * I)),
             "down_proj.weight": ("w2", slice(None))}
    for proj, per in names.items():
        w, rows = slots[proj]
        full = shapes[p + proj][1:]
        for j, n in enumerate(per):
            packed, scale = _read_int4(tensor, wmap, pre + n, full)
            out[p + w + "_packed"][j, rows] = packed
            out[p + w + "_scale"][j, rows] = scale
            meter.sample()
    return out


def _read_int4(tensor, wmap, name: str, want_shape):
    """``(weight_packed [out, in/8] int32, weight_scale [out, in/32])`` of an INT4 tensor, as stored, after
    checking its shapes (and ``weight_shape``, when stored) against ``want_shape`` ``(out, in)``."""
    packed, scale = name + "_packed", name + "_scale"
    if scale not in wmap:
        raise KeyError(f"INT4 tensor {packed!r} has no {scale!r}")
    p, s = tensor(packed), tensor(scale)
    out_f, in_f = want_shape
    for what, h, shape in ((packed, p, (out_f, in_f // 8)), (scale, s, (out_f, in_f // GROUP))):
        if tuple(h.get_shape()) != shape:
            raise ValueError(f"tensor {what!r} has shape {tuple(h.get_shape())}, the config implies {shape} "
                             f"(weight {tuple(want_shape)}, group {GROUP})")
    if name + "_shape" in wmap and tuple(int(x) for x in tensor(name + "_shape")[:].tolist()) != tuple(want_shape):
        raise ValueError(f"weight_shape of {name!r} is {tensor(name + '_shape')[:].tolist()}, the config implies "
                         f"{tuple(want_shape)}")
    if p.get_dtype() != "I32":
        raise ValueError(f"tensor {packed!r} is {p.get_dtype()}, expected I32 (compressed-tensors pack-quantized)")
    return p[:], s[:]


class _MemoryMeter:
    """Peak host resident set (all of it, and its anonymous part) sampled at each call of :meth:`sample`,
    and torch's peak allocation on a CUDA device over the loading."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.device_start = torch.cuda.memory_allocated(self.device)
        self.rss_start, self.anon_start = _host_rss()
        self.rss_peak, self.anon_peak = self.rss_start, self.anon_start

    def sample(self):
        rss, anon = _host_rss()
        self.rss_peak, self.anon_peak = max(self.rss_peak, rss), max(self.anon_peak, anon)

    def report(self, stats: dict | None, routed_bytes: int) -> None:
        self.sample()
        out = dict(host_rss_start=self.rss_start, host_rss_peak=self.rss_peak, host_anon_start=self.anon_start,
                   host_anon_peak=self.anon_peak,
                   device_start=self.device_start if self.cuda else None,
                   device_peak=torch.cuda.max_memory_allocated(self.device) if self.cuda else None,
                   routed_expert_bytes=routed_bytes)
        if stats is not None:
            stats.update(out)
        dev = (f", device {out['device_start'] / 2**20:.1f} -> peak {out['device_peak'] / 2**20:.1f} MiB"
               if self.cuda else "")
        log.info("loaded: host RSS %.1f -> peak %.1f MiB (anonymous %.1f -> %.1f MiB)%s, routed experts %.1f MiB",
                 self.rss_start / 2**20, self.rss_peak / 2**20, self.anon_start / 2**20, self.anon_peak / 2**20, dev,
                 routed_bytes / 2**20)


def _host_rss() -> tuple[int, int]:
    """``(resident, resident anonymous)`` bytes of this process (``/proc/self/statm``: resident minus its
    file-backed and shared pages; 0, 0 where there is no procfs)."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
    except OSError:
        return 0, 0
    page = os.sysconf("SC_PAGE_SIZE")
    resident, shared = int(fields[1]) * page, int(fields[2]) * page
    return resident, resident - shared


def _rows_cols(shape, sl):
    """The index of slice ``sl`` (dim, start, stop, padded) of a 2-D (or, along dim 0, 1-D) tensor, or of all
    of it."""
    if sl is None:
        return tuple(slice(None) for _ in shape)
    dim, a, b, _ = sl
    return ((slice(a, b),) + (slice(None),) * (len(shape) - 1)) if dim == 0 else (slice(None), slice(a, b))


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


def load_dflash_params(path: str, cfg=None, *, device="cpu", dtype=torch.float32, tp=None):
    """Parameters of a DFlash draft checkpoint directory (z-lab names: ``fc.weight``, ``layers.i...``),
    read shard by shard. Returns ``(params, cfg)``; ``KeyError`` names a missing tensor, ``ValueError``
    a shape that contradicts the config. Under ``tp`` each rank reads only its slices
    (:func:`tritree.model.parallel.shard_draft_params`) and gets its config (``tp_world``, its heads)."""
    from .config import DFlashConfig
    from .dflash import param_shapes as dflash_shapes
    from .parallel import draft_shard_slice, shard_draft_config

    cfg = cfg or DFlashConfig.from_hf(path)
    local = shard_draft_config(cfg, tp)
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
        sl = draft_shard_slice(name, cfg, tp, shapes[name])
        t = _read_weight(tensor, wmap, name, device, shapes[name], sl)
        params[name] = t.to(device=device, dtype=dtype)
    return params, local
