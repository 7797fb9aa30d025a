"""Per-GPU memory of a Kimi K2.x target (and its DFlash draft) from the configs alone: no checkpoint, no GPU.

Every count is bytes on one rank of a tensor-parallel group of ``tp`` GPUs, laid out as
:mod:`tritree.model.parallel` shards the model:

- ``embed_tokens`` / ``lm_head``: vocabulary-parallel, ``ceil(V / tp)`` rows per rank (the last rank's
  zero-padded, so every rank holds the same); 0 for a tied ``lm_head``;
- attention: ``q_b_proj``, ``kv_b_proj`` rows and ``o_proj`` columns of the rank's ``H / tp`` heads;
  ``q_a_proj``, ``kv_a_proj_with_mqa`` and every norm replicated;
- dense-layer MLP and shared experts: split along the intermediate dimension;
- router (``gate.weight`` in ``weight_dtype``, as the checkpoint holds it, + ``e_score_correction_bias`` in
  float32, as tritree keeps it): replicated;
- routed experts: expert-parallel by default (``E / tp`` whole experts per rank, what parallel.py does) or,
  with ``expert_parallel=False``, tensor-parallel inside every expert (``I / tp`` of each expert's
  intermediate dimension; the split falls on whole quantisation groups: 32 columns for INT4, 128 for FP8);
- the DFlash draft: its attention heads, MLP and taps projection split like the target's
  (:func:`tritree.model.parallel.shard_draft_config`; its norms replicated), its K/V cache the rank's KV heads;
- the target's latent KV cache: replicated (every rank holds the full latent cache).

Routed-expert formats, per ``Linear [out, in]``: ``int4`` as the compressed-tensors checkpoint packs it
(``weight_packed`` int32 ``[out, in / 8]`` + bf16 ``weight_scale`` ``[out, in / 32]``: 0.5 B per weight +
2 B per 32; docs/SPEC.md section 7), ``fp8`` e4m3 with float32 ``weight_scale_inv`` per 128 x 128 block
(K2-Instruct), ``bf16`` dequantised. Every other weight is ``weight_dtype`` (bf16: the checkpoint's).

KV caches are paged: each request's ``ctx`` tokens round up to whole pages; the draft's K/V pool shares
the target's page table (:class:`tritree.engine.Engine`), so it holds the same number of pages.

Activations: an estimate of the largest set of live tensors while the engine prefills one prompt of
``ctx`` tokens whole (:func:`prefill_activation_bytes`). Prompts are prefilled one at a time, so it does
not grow with the batch. A decode step's activations (``[B, T, ...]`` for a tree of T tokens) are far
smaller at long context and are not counted; neither are the CUDA context, NCCL buffers, CUDA-graph
pools or allocator fragmentation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .model.config import DFlashConfig, KimiK2Config

GB = 10**9
GiB = 2**30
EXPERT_FORMATS = ("int4", "bf16", "fp8")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
ROUTER_BIAS_BYTES = 4  # load_params and init_params keep e_score_correction_bias in float32 (the weight: wb)
# Columns of an expert's intermediate dimension that an expert-TP split must keep together: a quantisation
# group's scale cannot be shared by two ranks.
SPLIT_GRANULE = {"int4": 32, "fp8": 128, "bf16": 1}


def linear_bytes(out_features: int, in_features: int, fmt: str = "bf16") -> int:
    """Bytes of one ``Linear [out, in]`` stored as ``fmt`` (``int4``, ``fp8`` or a dtype of ``DTYPE_BYTES``).

    ``int4``: ``out * ceil(in / 8)`` int32 words + ``out * ceil(in / 32)`` bf16 scales; ``fp8``: one byte per
    weight + a float32 scale per 128 x 128 block (edge blocks partial)."""
    if fmt == "int4":
        return out_features * math.ceil(in_features / 8) * 4 + out_features * math.ceil(in_features / 32) * 2
    if fmt == "fp8":
        return out_features * in_features + math.ceil(out_features / 128) * math.ceil(in_features / 128) * 4
    if fmt in DTYPE_BYTES:
        return out_features * in_features * DTYPE_BYTES[fmt]
    raise ValueError(f"unknown weight format {fmt!r} (int4, fp8 or one of {sorted(DTYPE_BYTES)})")


def expert_bytes(cfg: KimiK2Config, fmt: str, split: int = 1) -> int:
    """Bytes of one routed expert's ``gate_proj`` + ``up_proj`` ``[I, hidden]`` and ``down_proj`` ``[hidden, I]``
    in ``fmt``; with ``split > 1`` of one rank's ``I / split`` slice of it (expert-TP)."""
    i = cfg.moe_intermediate_size // split
    return 2 * linear_bytes(i, cfg.hidden_size, fmt) + linear_bytes(cfg.hidden_size, i, fmt)


def draft_param_count(d: DFlashConfig) -> int:
    """Parameters of a DFlash draft (``fc``, norms, its Qwen3 layers; it has no embedding or lm_head); of one
    rank's shard when ``d`` is one (``d.tp_world > 1``: ``fc`` holds its ``1 / tp_world`` of the input columns)."""
    h, dh = d.hidden_size, d.head_dim
    layer = (2 * h + 2 * dh + d.num_attention_heads * dh * h * 2 + d.num_key_value_heads * dh * h * 2
             + 3 * d.intermediate_size * h)
    return d.n_taps * h * h // d.tp_world + 2 * h + d.num_hidden_layers * layer


def _draft_on_rank(draft: DFlashConfig | None, tp: int) -> DFlashConfig | None:
    """One rank's view of ``draft`` over ``tp`` ranks (:func:`tritree.model.parallel.shard_draft_config`)."""
    if draft is None or tp == 1:
        return draft
    from .dist import TPGroup
    from .model.parallel import shard_draft_config

    return shard_draft_config(draft, TPGroup(tp, 0))


def pages_per_request(ctx: int, page_size: int) -> int:
    """Whole pages holding ``ctx`` tokens."""
    return -(-ctx // page_size)


def prefill_activation_bytes(cfg: KimiK2Config, draft: DFlashConfig | None, tp: int, ctx: int,
                             act_bytes: int = 2, expert_parallel: bool = True) -> int:
    """Estimated peak bytes per rank of the live tensors of one whole-prompt prefill of ``S = ctx`` tokens
    (``tritree.model.kimi_k2.prefill`` then ``dflash.materialize_context_``, as the engine runs them), the
    largest of four moments (``a`` = activation bytes, ``Vs = ceil(V / tp)``, ``n`` = the draft's taps;
    the engine takes the logits of the last position only, ``[1, Vs]``):

    - a routed-expert layer: the taps kept so far ``n S hidden a``, its ``[S top_k, I]`` intermediate,
      float32 ``[S, hidden]`` output, three ``[S, hidden]`` residual-stream tensors;
    - the logits: ``[1, Vs]`` in ``a`` and float32 at once, the taps, the final norm;
    - stacking the taps: float32 logits + the taps twice;
    - the draft's context K/V: float32 logits, the taps, ``fc``'s output, three copies of
      ``[draft layers, S, 2, Hkv, D]``.

    Attention is counted as a fused SDPA (no ``[S, S]`` scores). Routing scores (``[S, E]`` float32) and
    smaller temporaries are left out."""
    s, h = ctx, cfg.hidden_size
    vs = -(-cfg.vocab_size // tp)
    n = draft.n_taps if draft is not None else 0
    taps = n * s * h * act_bytes
    i_local = cfg.moe_intermediate_size // (1 if expert_parallel else tp)
    moe = taps + s * cfg.num_experts_per_tok * i_local * act_bytes + s * h * 4 + 3 * s * h * act_bytes
    logits = taps + s * h * act_bytes + vs * (4 + act_bytes)
    stack = 2 * taps + vs * 4
    phases = [moe if cfg.n_routed_experts else 0, logits, stack]
    if draft is not None:
        kv = draft.num_hidden_layers * s * 2 * _draft_on_rank(draft, tp).num_key_value_heads * draft.head_dim * act_bytes
        phases.append(vs * 4 + taps + s * h * act_bytes + 3 * kv)
    return max(phases)


@dataclass(frozen=True)
class Row:
    """One component: ``per_rank`` bytes on each GPU, ``total`` bytes of one copy (unpadded, a replicated
    tensor counted once), ``layout`` how it is spread over the ranks, ``kind`` ``weights`` / ``cache`` /
    ``activations``."""

    name: str
    per_rank: int
    total: int
    layout: str
    kind: str = "weights"


@dataclass(frozen=True)
class MemoryReport:
    """The rows and the setting they were computed for (bytes; ``ctx`` tokens per request)."""

    rows: tuple
    title: str
    tp: int
    experts: str
    expert_parallel: bool
    ctx: int
    batch: int
    page_size: int
    kv_dtype: str

    def _sum(self, kind: str) -> int:
        return sum(r.per_rank for r in self.rows if r.kind == kind)

    @property
    def weights(self) -> int:
        return self._sum("weights")

    @property
    def caches(self) -> int:
        return self._sum("cache")

    @property
    def activations(self) -> int:
        return self._sum("activations")

    @property
    def resident(self) -> int:
        """Weights + KV caches per rank (what stays allocated)."""
        return self.weights + self.caches

    @property
    def peak(self) -> int:
        """Resident + the activation estimate per rank."""
        return self.resident + self.activations

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name.startswith(name))

    def fits(self, gpu_bytes: int) -> bool:
        return self.peak <= gpu_bytes


def _check(cfg: KimiK2Config, draft: DFlashConfig | None, tp: int, experts: str, expert_parallel: bool,
           kv_dtype: str, weight_dtype: str, ctx: int, batch: int, page_size: int) -> None:
    """``ValueError`` for a setting parallel.py would refuse or that makes no sense."""
    for what, v in (("tp", tp), ("ctx", ctx), ("batch", batch), ("page_size", page_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be an int >= 1, got {v!r}")
    if experts not in EXPERT_FORMATS:
        raise ValueError(f"experts must be one of {EXPERT_FORMATS}, got {experts!r}")
    if kv_dtype not in DTYPE_BYTES or weight_dtype not in DTYPE_BYTES:
        raise ValueError(f"kv_dtype and weight_dtype must be one of {sorted(DTYPE_BYTES)}, got {kv_dtype!r}, "
                         f"{weight_dtype!r}")
    n_moe = sum(cfg.is_moe(i) for i in range(cfg.num_hidden_layers))
    need = [("num_attention_heads", cfg.num_attention_heads)]
    if n_moe:
        need.append(("moe_intermediate_size * n_shared_experts", cfg.moe_intermediate_size * cfg.n_shared_experts))
        if expert_parallel:
            need.append(("n_routed_experts", cfg.n_routed_experts))
        else:
            g = SPLIT_GRANULE[experts]
            if cfg.moe_intermediate_size % (tp * g):
                raise ValueError(f"moe_intermediate_size = {cfg.moe_intermediate_size} does not split into {tp} "
                                 f"slices of whole {g}-column groups ({experts} experts, expert-TP)")
    if n_moe < cfg.num_hidden_layers:
        need.append(("intermediate_size", cfg.intermediate_size))
    for what, n in need:
        if n % tp:
            raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel world size {tp}")
    if draft is not None and (draft.hidden_size, draft.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
        raise ValueError(f"the draft's hidden size / vocabulary ({draft.hidden_size}, {draft.vocab_size}) differ "
                         f"from the target's ({cfg.hidden_size}, {cfg.vocab_size}); it uses the target's embedding")


def memory_report(cfg: KimiK2Config, draft: DFlashConfig | None = None, *, tp: int = 8, ctx: int = 46_000,
                  batch: int = 1, page_size: int = 64, kv_dtype: str = "bf16", experts: str = "int4",
                  expert_parallel: bool = True, weight_dtype: str = "bf16", activations: bool = True,
                  title: str = "") -> MemoryReport:
    """Bytes per rank of ``cfg`` (the global config: all heads, all experts) and ``draft`` over ``tp`` GPUs
    with caches for ``batch`` requests of ``ctx`` tokens in pages of ``page_size`` (see the module).

    ``experts``: the routed experts' format (``int4`` / ``bf16`` / ``fp8``); ``expert_parallel``: whole
    experts per rank (True, tritree's layout) or every expert split along its intermediate dimension.
    ``activations``: add the prefill estimate. Raises ``ValueError`` for a sharding parallel.py would
    refuse (a dimension not divisible by ``tp``) or a draft of another hidden size / vocabulary."""
    _check(cfg, draft, tp, experts, expert_parallel, kv_dtype, weight_dtype, ctx, batch, page_size)
    wb, kvb = DTYPE_BYTES[weight_dtype], DTYPE_BYTES[kv_dtype]
    L, h, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    n_moe = sum(cfg.is_moe(i) for i in range(L))
    n_dense = L - n_moe
    rows = []

    def add(name, per_rank, total, layout, kind="weights"):
        if tp == 1 and kind == "weights":
            layout = "whole"
        rows.append(Row(name, int(per_rank), int(total), layout, kind))

    vs = -(-V // tp)
    add("embed_tokens", vs * h * wb, V * h * wb, f"vocab-parallel ({vs} rows)")
    if cfg.tie_word_embeddings:
        rows.append(Row("lm_head", 0, 0, "tied to embed_tokens"))
    else:
        add("lm_head", vs * h * wb, V * h * wb, f"vocab-parallel ({vs} rows)")
    lat = (cfg.q_lora_rank * h + cfg.latent_dim * h) * wb * L
    add(f"attention q_a, kv_a_with_mqa (x{L})", lat, lat, "replicated")
    per_head = (cfg.qk_head_dim * cfg.q_lora_rank + (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank
                + cfg.v_head_dim * h) * wb * L
    H = cfg.num_attention_heads
    add(f"attention q_b, kv_b, o (x{L})", per_head * (H // tp), per_head * H, f"head-parallel ({H // tp} heads)")
    norms = ((2 * h + cfg.q_lora_rank + cfg.kv_lora_rank) * L + h) * wb
    add("norms", norms, norms, "replicated")
    if n_dense:
        dense = 3 * cfg.intermediate_size * h * wb * n_dense
        add(f"dense MLP (x{n_dense})", dense // tp, dense, "intermediate-parallel")
    if n_moe:
        E = cfg.n_routed_experts
        shared = 3 * cfg.moe_intermediate_size * cfg.n_shared_experts * h * wb * n_moe
        add(f"shared experts (x{n_moe})", shared // tp, shared, "intermediate-parallel")
        router = (E * h * wb + E * ROUTER_BIAS_BYTES) * n_moe
        add(f"router (x{n_moe})", router, router, "replicated")
        whole = expert_bytes(cfg, experts) * E * n_moe
        if expert_parallel:
            per, layout = expert_bytes(cfg, experts) * (E // tp) * n_moe, f"expert-parallel ({E // tp} experts)"
        else:
            i = cfg.moe_intermediate_size // tp
            per, layout = expert_bytes(cfg, experts, tp) * E * n_moe, f"expert-TP (I {i} of each)"
        add(f"routed experts, {experts} (x{n_moe})", per, whole, layout)
    local_draft = _draft_on_rank(draft, tp)
    if draft is not None:
        add(f"DFlash draft ({draft.num_hidden_layers} layers)", draft_param_count(local_draft) * wb,
            draft_param_count(draft) * wb, "replicated" if tp == 1 else
            f"head-parallel ({local_draft.num_attention_heads} heads)")
    pages = batch * pages_per_request(ctx, page_size) + 1  # + the engine's sink page (finished rows write there)
    tokens = pages * page_size
    kv = L * tokens * cfg.latent_dim * kvb
    add(f"KV cache, MLA latent {cfg.latent_dim} (x{L})", kv, kv, "replicated", "cache")
    if draft is not None:
        dkv = draft.num_hidden_layers * tokens * 2 * local_draft.num_key_value_heads * draft.head_dim * kvb
        whole = draft.num_hidden_layers * tokens * 2 * draft.num_key_value_heads * draft.head_dim * kvb
        add(f"KV cache, draft K+V (x{draft.num_hidden_layers})", dkv, whole,
            "replicated" if dkv == whole else f"head-parallel ({local_draft.num_key_value_heads} KV heads)", "cache")
    if activations:
        act = prefill_activation_bytes(cfg, draft, tp, ctx, wb, expert_parallel)
        add("activations, prefill (estimate)", act, act, f"per rank, one {ctx}-token prompt", "activations")
    return MemoryReport(tuple(rows), title, tp, experts, expert_parallel, ctx, batch, page_size, kv_dtype)


def parse_size(text: str) -> int:
    """``'96'``, ``'96GB'``, ``'96G'`` -> 96 * 10^9 bytes; ``'89.4GiB'`` -> 89.4 * 2^30; ``'97887MiB'`` (as
    ``nvidia-smi`` reports a GPU's total) -> 97887 * 2^20. ``ValueError`` otherwise or for a size <= 0. A bare
    number is GB (10^9)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(gb|g|gib|mib)?\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a size such as 96, 96GB, 89.4GiB or 97887MiB, got {text!r}")
    return int(float(m.group(1)) * {"gib": GiB, "mib": 2**20}.get(m.group(2), GB))


def _gb(n: int) -> str:
    return f"{n / GB:9.3f}"


def _gib(n: int) -> str:
    return f"{n / GiB:9.3f}"


def format_report(rep: MemoryReport, gpu_bytes: int | None = None) -> str:
    """The table (GB = 10^9 B, GiB = 2^30 B; per rank and one copy's total) and, given ``gpu_bytes``, the
    verdict against that much memory per GPU."""
    split = "expert-parallel" if rep.expert_parallel else "expert-TP"
    pages = pages_per_request(rep.ctx, rep.page_size)
    lines = [f"{rep.title + ': ' if rep.title else ''}TP{rep.tp}, routed experts {rep.experts} ({split}), "
             f"{rep.batch} x {rep.ctx} tokens in pages of {rep.page_size} ({pages} pages = "
             f"{pages * rep.page_size} tokens a request), KV {rep.kv_dtype}"]
    w = max(len(r.name) for r in rep.rows)
    lw = max(len(r.layout) for r in rep.rows)
    head = f"{'component':<{w}}  {'layout':<{lw}}  {'GB/rank':>9}  {'GiB/rank':>9}  {'total GB':>9}"
    lines += [head, "-" * len(head)]
    for r in rep.rows:
        lines.append(f"{r.name:<{w}}  {r.layout:<{lw}}  {_gb(r.per_rank)}  {_gib(r.per_rank)}  {_gb(r.total)}")
    lines.append("-" * len(head))
    sums = [("weights", rep.weights), ("KV caches", rep.caches), ("resident (weights + caches)", rep.resident)]
    if rep.activations:
        sums.append(("peak (resident + activations)", rep.peak))
    for name, n in sums:
        lines.append(f"{name:<{w + lw + 2}}  {_gb(n)}  {_gib(n)}")
    if gpu_bytes is not None:
        lines.append(verdict(rep, gpu_bytes))
    return "\n".join(lines)


def verdict(rep: MemoryReport, gpu_bytes: int) -> str:
    """One line: whether the peak (else the resident part) fits ``gpu_bytes`` per GPU, with the margin."""
    cap = f"{gpu_bytes / GB:.1f} GB ({gpu_bytes / GiB:.1f} GiB) per GPU"
    left = (gpu_bytes - rep.peak) / GB
    if rep.fits(gpu_bytes):
        what = "peak" if rep.activations else "resident"
        return (f"FITS {cap}: {what} {rep.peak / GB:.1f} GB, {left:.1f} GB to spare (CUDA context, NCCL "
                f"buffers, graph pools and allocator slack not counted)")
    if rep.activations and rep.resident <= gpu_bytes:
        return (f"DOES NOT FIT {cap} with the prefill estimate: resident {rep.resident / GB:.1f} GB leaves "
                f"{(gpu_bytes - rep.resident) / GB:.1f} GB, the prefill needs ~{rep.activations / GB:.1f} GB")
    return (f"DOES NOT FIT {cap}: resident weights + caches {rep.resident / GB:.1f} GB, "
            f"{(rep.resident - gpu_bytes) / GB:.1f} GB over")
