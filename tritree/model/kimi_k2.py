"""Kimi K2.x (DeepSeek-V3 architecture) as pure functions over a parameter dict.

Parameters are keyed by the Hugging Face tensor names without the checkpoint prefix
(``model.layers.0.self_attn.q_b_proj.weight`` ...), except routed experts, which are stacked per layer in one
of two layouts (:func:`param_shapes`):

- dense: ``model.layers.L.mlp.experts.{gate,up,down}_proj.weight``: ``[E, I, H]``, ``[E, I, H]``, ``[E, H, I]``
  in the model's dtype;
- INT4 (K2.6's checkpoint format kept packed, :class:`tritree.kernels.Int4Experts`):
  ``model.layers.L.mlp.experts.{w13_packed, w13_scale, w2_packed, w2_scale}``: int32 ``[E, 2I, H/8]``, bf16
  ``[E, 2I, H/32]``, int32 ``[E, H, I/8]``, bf16 ``[E, H, I/32]``; the MoE then runs the fused W4A16 op
  (:func:`tritree.kernels.routed_experts_int4`).
The rope output rows of ``q_b_proj`` (per head) and ``kv_a_proj_with_mqa`` are permuted at load time from
the checkpoint's interleaved pairs to halves, so RoPE is half-rotary everywhere (docs/SPEC.md section 2).
Checkpoints load under these names; :func:`to_kernel_layout_` (the Engine and ``bench decode`` call it once after
loading) then fuses some tensors for the kernels: the routed experts repacked, the shared expert's gate and up
rows in one tensor (``SHARED_GATE_UP_KEY``), each layer's ``q_a_proj`` and ``kv_a_proj_with_mqa`` rows in one
(``QKV_A_KEY``: at decode one launch of :func:`tritree.kernels.linear` normalises the rows and projects them), and
``q_b_proj`` with ``q_a_layernorm`` in its columns (``Q_B_KEY``). The functions take either form.

At decode (:func:`attention_verify`) the attention block is five launches around ``verify_mla``: the input norm with
the q_a / kv_a projection, the q_a norm with the q_b projection (:func:`tritree.kernels.linear` both),
:func:`tritree.kernels.mla_query_` (``W_UK`` into the query, RoPE, the latent norm and the write of the tree latents
into the cache), :func:`tritree.kernels.mla_output` (``W_UV``) and ``o_proj`` with the residual add.

The KV cache is one stacked latent pool ``kv: [layers, num_pages, P, kv_lora_rank + rope]`` with a page
table and lengths (the conventions of :mod:`tritree`).

Tensor parallelism: every function takes an optional ``tp`` (:class:`tritree.dist.TPGroup`) and then
expects this rank's parameters and config (:mod:`tritree.model.parallel`); partial sums are all-reduced
after ``o_proj`` and after each MLP, and the logits are this rank's vocabulary shard. ``tp=None`` or a
world of 1 is the single-process model, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import dist
from ..kernels import kv_write_, verify_mla
from ..kernels.linear import linear as fused_linear
from ..kernels.mla_decode import mla_output, mla_query_
from ..kernels.moe import routed_experts
from ..kernels.moe.block import moe_block
from ..kernels.moe.int4 import GROUP, Int4Experts, kernel_layout, routed_experts_int4
from ..kernels.moe.router import moe_route
from .config import KimiK2Config
from .layers import apply_rope, cos_sin, inv_freq_kept, linear, random_params, rms_norm

# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------

def rope_inv_freq(cfg: KimiK2Config, device=None) -> torch.Tensor:
    """The target's rope inverse frequencies, float32 [qk_rope_head_dim / 2] (kept per device, read-only)."""
    return inv_freq_kept(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling, device)


def rope_cos_sin(cfg: KimiK2Config, positions: torch.Tensor, dtype):
    """The rope tables (:func:`tritree.model.layers.cos_sin`: cos, signed sin ``[..., rope]``) at integer
    ``positions``, times the YaRN amplitude (``cfg.rope_amplitude``: 1.0 for K2.x). Computed once per
    forward and shared by every layer."""
    return cos_sin(rope_inv_freq(cfg, positions.device), positions, dtype, cfg.rope_amplitude)


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------

def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


INT4_EXPERT_KEYS = ("w13_packed", "w13_scale", "w2_packed", "w2_scale")
# The same tensors in the kernels' "mma" layout (:meth:`tritree.kernels.Int4Experts.to_layout`), after
# :func:`to_kernel_layout_`: the key says which order the bytes are in.
INT4_MMA_KEYS = ("w13_mma", "w13_mma_scale", "w2_mma", "w2_mma_scale")
DENSE_EXPERT_KEYS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
# The shared expert's gate and up rows in one tensor ``[2 Is, H]`` after :func:`to_kernel_layout_` (one pass of
# the MoE block's gate_up reads both), replacing ``shared_experts.gate_proj.weight`` and ``up_proj.weight``.
SHARED_GATE_UP_KEY = "shared_experts.gate_up_proj.weight"
# A dense (non-MoE) layer's gate and up rows in one tensor ``[2 I, H]`` after :func:`to_kernel_layout_` (one launch
# of :func:`tritree.kernels.linear` normalises the rows and computes ``silu(gate) * up``), replacing
# ``mlp.gate_proj.weight`` and ``mlp.up_proj.weight``.
DENSE_GATE_UP_KEY = "mlp.gate_up_proj.weight"
# ``q_a_proj``'s rows then ``kv_a_proj_with_mqa``'s in one tensor ``[q_lora_rank + latent_dim, H]`` after
# :func:`to_kernel_layout_`, the layer's input RMSNorm weight ``g`` folded into its columns (``W * g``:
# ``rmsnorm(x, g) W^T = rms(x) (W * g)^T``, so one launch of :func:`tritree.kernels.linear` normalises the rows and
# projects them), and their biases ``[q_lora_rank + latent_dim]`` when the checkpoint has them; replacing the two
# projections' tensors.
QKV_A_KEY = "self_attn.qkv_a_proj.weight"
QKV_A_BIAS_KEY = "self_attn.qkv_a_proj.bias"
# ``q_b_proj``'s weight with ``q_a_layernorm``'s weight folded into its columns after :func:`to_kernel_layout_`
# (the q_b projection normalises its input rows itself), replacing both tensors.
Q_B_KEY = "self_attn.q_b_normed_proj.weight"
EXPERT_LAYOUTS = ("dense", "int4")


def param_shapes(cfg: KimiK2Config, experts: str = "dense") -> dict[str, tuple]:
    """Every parameter's shape (local heads), with stacked experts; ``q_proj`` instead of the
    ``q_a`` / ``q_b`` pair when ``q_lora_rank`` is None; the attention biases with ``attention_bias``.
    ``experts``: the routed experts' layout, ``"dense"`` or ``"int4"`` (the module docstring; int32 / bf16
    tensors, the hidden and intermediate sizes multiples of 32). These are the checkpoint's tensors;
    :func:`to_kernel_layout_` then fuses some of them (``QKV_A_KEY``, ``Q_B_KEY``, ``SHARED_GATE_UP_KEY``, the
    experts' ``"mma"`` layout)."""
    if experts not in EXPERT_LAYOUTS:
        raise ValueError(f"experts must be one of {EXPERT_LAYOUTS}, got {experts!r}")
    H, Hd = cfg.heads, cfg.hidden_size
    s = {"model.embed_tokens.weight": (cfg.vocab_size, Hd), "model.norm.weight": (Hd,),
         "lm_head.weight": (cfg.vocab_size, Hd)}
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        s.update({
            p + "input_layernorm.weight": (Hd,), p + "post_attention_layernorm.weight": (Hd,),
            p + "self_attn.kv_a_proj_with_mqa.weight": (cfg.latent_dim, Hd),
            p + "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
            p + "self_attn.kv_b_proj.weight": (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
            p + "self_attn.o_proj.weight": (Hd, H * cfg.v_head_dim),
        })
        if cfg.q_lora_rank is None:
            s[p + "self_attn.q_proj.weight"] = (H * cfg.qk_head_dim, Hd)
        else:
            s.update({p + "self_attn.q_a_proj.weight": (cfg.q_lora_rank, Hd),
                      p + "self_attn.q_a_layernorm.weight": (cfg.q_lora_rank,),
                      p + "self_attn.q_b_proj.weight": (H * cfg.qk_head_dim, cfg.q_lora_rank)})
        if cfg.attention_bias:  # transformers' DeepSeek-V3: the projections from the hidden state
            s.update({p + "self_attn.kv_a_proj_with_mqa.bias": (cfg.latent_dim,),
                      p + "self_attn.o_proj.bias": (Hd,)})
            if cfg.q_lora_rank is not None:
                s[p + "self_attn.q_a_proj.bias"] = (cfg.q_lora_rank,)
        if cfg.is_moe(i):
            E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
            Is = I * cfg.n_shared_experts
            s.update({p + "mlp.gate.weight": (E, Hd), p + "mlp.gate.e_score_correction_bias": (E,)})
            if experts == "dense":
                s.update({p + "mlp.experts.gate_proj.weight": (E, I, Hd), p + "mlp.experts.up_proj.weight": (E, I, Hd),
                          p + "mlp.experts.down_proj.weight": (E, Hd, I)})
            else:
                if Hd % GROUP or I % GROUP:
                    raise ValueError(f"INT4 experts need hidden_size ({Hd}) and moe_intermediate_size ({I}) to be "
                                     f"multiples of {GROUP}")
                s.update({p + "mlp.experts.w13_packed": (E, 2 * I, Hd // 8),
                          p + "mlp.experts.w13_scale": (E, 2 * I, Hd // GROUP),
                          p + "mlp.experts.w2_packed": (E, Hd, I // 8), p + "mlp.experts.w2_scale": (E, Hd, I // GROUP)})
            s.update({
                p + "mlp.shared_experts.gate_proj.weight": (Is, Hd), p + "mlp.shared_experts.up_proj.weight": (Is, Hd),
                p + "mlp.shared_experts.down_proj.weight": (Hd, Is),
            })
        else:
            s.update({p + "mlp.gate_proj.weight": (cfg.intermediate_size, Hd),
                      p + "mlp.up_proj.weight": (cfg.intermediate_size, Hd),
                      p + "mlp.down_proj.weight": (Hd, cfg.intermediate_size)})
    return s


def init_params(cfg: KimiK2Config, seed: int = 0, dtype=torch.float32, device="cpu", experts: str = "dense") -> dict:
    """Random parameters (already in tritree's halves RoPE layout); the router's ``e_score_correction_bias`` in
    float32 (its weight in ``dtype``, as loaded). ``experts="int4"``:
    the same random routed experts quantised (:func:`quantize_experts`)."""
    params = random_params(param_shapes(cfg), seed, dtype, device, float32=("e_score_correction_bias",))
    if experts not in EXPERT_LAYOUTS:
        raise ValueError(f"experts must be one of {EXPERT_LAYOUTS}, got {experts!r}")
    return quantize_experts(params) if experts == "int4" else params


def _expert_layers(params) -> list[str]:
    """``model.layers.L.mlp.experts.`` prefixes of the layers with dense routed experts."""
    return sorted(k[:-len("gate_proj.weight")] for k in params if k.endswith(".mlp.experts.gate_proj.weight"))


def quantize_experts(params: dict) -> dict:
    """``params`` with every layer's dense routed experts replaced by their INT4 group quantisation
    (:meth:`tritree.kernels.Int4Experts.quantize`, symmetric, group 32), on the same device; the rest shared."""
    out = dict(params)
    for p in _expert_layers(params):
        q = Int4Experts.quantize(*(out.pop(p + k) for k in DENSE_EXPERT_KEYS))
        out.update({p + k: getattr(q, k) for k in INT4_EXPERT_KEYS})
    return out


def int4_experts(params, i: int) -> Int4Experts | None:
    """Layer ``i``'s routed experts when they are held INT4 (in the checkpoint layout, or the kernels' after
    :func:`to_kernel_layout_`), else None."""
    p = layer_prefix(i) + "mlp.experts."
    if p + "w13_packed" in params:
        return Int4Experts(*(params[p + k] for k in INT4_EXPERT_KEYS))
    if p + "w13_mma" in params:
        return Int4Experts(*(params[p + k] for k in INT4_MMA_KEYS), layout="mma")
    return None


def to_kernel_layout_(params: dict, device=None, layout: str | None = None) -> dict:
    """Every INT4 MoE layer's tensors in the layout the kernels of ``device`` read, in place (no second copy):

    - the routed experts in the layout the kernels of ``device`` (default: the experts' own) stream
      (:func:`tritree.kernels.moe.int4.kernel_layout`: the repacked ``"mma"`` layout on sm_90 and sm_120), or
      in ``layout`` when given, converted one expert at a time and filed under the layout's keys
      (``mlp.experts.w13_mma`` ... for ``"mma"``);
    - the shared expert's gate and up rows concatenated into ``mlp.shared_experts.gate_up_proj.weight``
      (``[2 Is, H]``: the MoE block's operand, :func:`tritree.kernels.moe.block`), and a dense layer's into
      ``mlp.gate_up_proj.weight`` (``DENSE_GATE_UP_KEY``, ``[2 I, H]``);
    - every layer's ``q_a_proj`` and ``kv_a_proj_with_mqa`` rows (and biases) concatenated into
      ``self_attn.qkv_a_proj.weight`` (``QKV_A_KEY``, ``[q_lora_rank + latent_dim, H]``), times the layer's input
      RMSNorm weight by column (rounded once to the weights' dtype): one projection of the hidden state with the
      norm in it; likewise ``q_b_proj`` times ``q_a_layernorm``'s weight (``Q_B_KEY``, ``[H qk_head_dim,
      q_lora_rank]``).

    ``params`` itself is updated and returned; call it once after loading (and sharding), before the first
    forward. Idempotent."""
    for k in [k for k in params if k.endswith(".mlp.gate_proj.weight")]:  # dense layers (experts are "experts.")
        p = k[:-len("gate_proj.weight")]
        params[p + "gate_up_proj.weight"] = torch.cat([params.pop(k), params.pop(p + "up_proj.weight")])
    for k in [k for k in params if k.endswith(".self_attn.q_a_proj.weight")]:
        p = k[:-len("q_a_proj.weight")]
        g = params[p[:-len("self_attn.")] + "input_layernorm.weight"]
        params[p + "qkv_a_proj.weight"] = _fold_norm(
            torch.cat([params.pop(k), params.pop(p + "kv_a_proj_with_mqa.weight")]), g)
        if p + "q_a_proj.bias" in params:
            params[p + "qkv_a_proj.bias"] = torch.cat([params.pop(p + "q_a_proj.bias"),
                                                       params.pop(p + "kv_a_proj_with_mqa.bias")])
        params[p + "q_b_normed_proj.weight"] = _fold_norm(params.pop(p + "q_b_proj.weight"),
                                                          params.pop(p + "q_a_layernorm.weight"))
    for k in [k for k in params if k.endswith(".mlp.experts.w13_packed") or k.endswith(".mlp.experts.w13_mma")]:
        p = k[:k.rindex(".") + 1]
        i = int(p.split(".")[2])
        ex = int4_experts(params, i)
        want = layout or kernel_layout(device if device is not None else ex.w13_packed.device, ex.hidden,
                                       ex.intermediate)
        m = p[:-len("experts.")] + "shared_experts."
        if m + "gate_proj.weight" in params:
            params[m + "gate_up_proj.weight"] = torch.cat([params.pop(m + "gate_proj.weight"),
                                                           params.pop(m + "up_proj.weight")])
        if want == ex.layout:
            continue
        ex = ex.to_layout_(want)
        old, new = (INT4_EXPERT_KEYS, INT4_MMA_KEYS) if want == "mma" else (INT4_MMA_KEYS, INT4_EXPERT_KEYS)
        for a, b, t in zip(old, new, (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)):
            del params[p + a]
            params[p + b] = t
    return params


def _dense_gate_up(params, p: str) -> torch.Tensor:
    """A dense layer's ``[gate; up]`` rows of MLP prefix ``p`` (concatenated here when the params were not passed
    through :func:`to_kernel_layout_`)."""
    w = params.get(p + "gate_up_proj.weight")
    if w is None:
        w = torch.cat([params[p + "gate_proj.weight"], params[p + "up_proj.weight"]])
    return w


def _shared_gate_up(params, p: str) -> torch.Tensor:
    """The shared expert's ``[gate; up]`` rows of MLP prefix ``p`` (concatenated here when the params were not
    passed through :func:`to_kernel_layout_`)."""
    w = params.get(p + SHARED_GATE_UP_KEY)
    if w is None:
        w = torch.cat([params[p + "shared_experts.gate_proj.weight"], params[p + "shared_experts.up_proj.weight"]])
    return w


# --------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------

def moe(params, cfg: KimiK2Config, i: int, h: torch.Tensor, tp=None, tree_lens=None) -> torch.Tensor:
    """Sigmoid-routed MoE with a shared expert. The router is one kernel launch (:func:`tritree.kernels.moe_route`,
    its weight in the model's dtype, fp32 logits); the routed experts run grouped by expert with no host sync:
    INT4 experts (the layer's ``mlp.experts.w13_packed`` ...) through the fused W4A16 op
    :func:`tritree.kernels.routed_experts_int4` (activations in bf16 there when the model runs in float32),
    dense ones through :func:`tritree.kernels.moe.routed_experts` (a per-expert loop on the CPU path).

    Under ``tp`` the router runs in full on every rank, each rank runs its own experts (the stacked
    expert weights hold ``E / world`` of them, from ``rank * E / world``) and its slice of the shared
    expert, and one all-reduce adds the partial outputs.

    ``tree_lens`` (``[B] int32``, with ``h [B, T, hidden]``): rows ``t >= tree_lens[b]`` are padding; they
    route to no expert (id -1, skipped), so a truncated tree reads only its own tokens' experts."""
    p = layer_prefix(i) + "mlp."
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    packed = int4_experts(params, i)
    offset = _expert_offset(params, cfg, i, packed, tp)
    # Sigmoid scores, the bias for selection, the group limit, top-k, normalisation, scaling, the EP offset;
    # padding rows route to id -1 with weight 0.
    idx, w = moe_route(x, params[p + "gate.weight"], params[p + "gate.e_score_correction_bias"].float(),
                       top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
                       norm_topk_prob=bool(cfg.norm_topk_prob), scaling=cfg.routed_scaling_factor,
                       expert_offset=offset, tree_lens=tree_lens,
                       rows_per_request=None if tree_lens is None else shape[1])
    if packed is not None:  # W4A16: 16-bit activations
        xa = x if x.dtype in (torch.bfloat16, torch.float16) else x.to(torch.bfloat16)
        out = routed_experts_int4(xa, idx, w, packed, global_experts=cfg.n_routed_experts).to(x.dtype)
    else:
        out = routed_experts(x, idx, w, *(params[p + "experts." + k] for k in DENSE_EXPERT_KEYS))
    Is = params[p + "shared_experts.down_proj.weight"].shape[1]
    gu = linear(x, _shared_gate_up(params, p))
    out = out + linear(F.silu(gu[:, :Is]) * gu[:, Is:], params[p + "shared_experts.down_proj.weight"])
    return dist.all_reduce_(tp, out).view(shape)


def _expert_offset(params, cfg: KimiK2Config, i: int, packed: Int4Experts | None, tp) -> int:
    """The first routed expert this rank holds (expert parallelism; 0 without ``tp``)."""
    if not dist.active(tp):
        return 0
    p = layer_prefix(i) + "mlp."
    e_loc = packed.num_experts if packed is not None else params[p + "experts.gate_proj.weight"].shape[0]
    if e_loc * tp.world != cfg.n_routed_experts:
        raise ValueError(f"layer {i} holds {e_loc} routed experts; expert parallelism over {tp.world} ranks "
                         f"needs {cfg.n_routed_experts} / {tp.world}")
    return tp.rank * e_loc  # other ranks' experts fall outside [0, e_loc): skipped by the expert kernels


def ffn(params, cfg: KimiK2Config, i: int, x: torch.Tensor, tp=None, tree_lens=None) -> torch.Tensor:
    """Layer ``i``'s feed-forward half on the residual stream ``x [B, S, hidden]``: ``x + mlp(rms_norm(x))`` (a
    SwiGLU in dense layers, the MoE in the others; intermediate-sharded under ``tp``, then all-reduced).

    INT4 MoE layers run :func:`tritree.kernels.moe.block` (post-attention norm, router, routed and shared experts
    and the residual add: five launches on sm_90 / sm_120 at decode row counts); under ``tp`` rank 0 adds the
    residual and the all-reduce follows. Dense layers: two launches of :func:`tritree.kernels.linear` at decode row
    counts (the norm with gate | up and SiLU-and-mul, down with the residual; rank 0 adds it under ``tp``). Layers
    of dense (bf16) experts: the norm, :func:`moe` and the add."""
    p = layer_prefix(i)
    if not cfg.is_moe(i):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        h = fused_linear(x2, _dense_gate_up(params, p + "mlp.").to(x.dtype), rms_eps=cfg.rms_norm_eps,
                         norm_weight=params[p + "post_attention_layernorm.weight"].to(x.dtype), act="silu_mul")
        out = fused_linear(h, params[p + "mlp.down_proj.weight"].to(x.dtype),
                           residual=x2 if not dist.active(tp) or tp.rank == 0 else None)
        return dist.all_reduce_(tp, out).view(shape)
    packed = int4_experts(params, i)
    if packed is None:
        return x + moe(params, cfg, i, rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps),
                       tp, tree_lens)
    m = p + "mlp."
    shape = x.shape
    out = moe_block(x.reshape(-1, shape[-1]), params[p + "post_attention_layernorm.weight"], params[m + "gate.weight"],
                    params[m + "gate.e_score_correction_bias"].float(), packed, _shared_gate_up(params, m),
                    params[m + "shared_experts.down_proj.weight"], eps=cfg.rms_norm_eps, top_k=cfg.num_experts_per_tok,
                    n_group=cfg.n_group, topk_group=cfg.topk_group, norm_topk_prob=bool(cfg.norm_topk_prob),
                    scaling=cfg.routed_scaling_factor, expert_offset=_expert_offset(params, cfg, i, packed, tp),
                    tree_lens=tree_lens, rows_per_request=None if tree_lens is None else shape[1],
                    add_residual=not dist.active(tp) or tp.rank == 0)
    return dist.all_reduce_(tp, out).view(shape)


def _fold_norm(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` times an RMSNorm weight ``g [K]`` by column, in float32, rounded once to ``w``'s dtype."""
    return (w.float() * g.float()).to(w.dtype)


def _qkv_a(params, p: str, g: torch.Tensor):
    """``(weight [q_lora_rank + latent_dim, H], bias or None)``: the ``q_a_proj`` and ``kv_a_proj_with_mqa`` rows of
    attention prefix ``p`` with the input RMSNorm weight ``g`` folded in (``QKV_A_KEY``; built here when the params
    were not passed through :func:`to_kernel_layout_`)."""
    w = params.get(p + "qkv_a_proj.weight")
    if w is not None:
        return w, params.get(p + "qkv_a_proj.bias")
    w = _fold_norm(torch.cat([params[p + "q_a_proj.weight"], params[p + "kv_a_proj_with_mqa.weight"]]), g)
    b = params.get(p + "q_a_proj.bias")
    return w, None if b is None else torch.cat([b, params[p + "kv_a_proj_with_mqa.bias"]])


def _q_b(params, p: str) -> torch.Tensor:
    """``q_b_proj``'s weight of attention prefix ``p`` times ``q_a_layernorm``'s weight by column (``Q_B_KEY``; built
    here when the params were not passed through :func:`to_kernel_layout_`)."""
    w = params.get(p + "q_b_normed_proj.weight")
    return w if w is not None else _fold_norm(params[p + "q_b_proj.weight"], params[p + "q_a_layernorm.weight"])


def _mla_projections(params, cfg, i, x):
    """``(q [M, H, qk_head_dim], a [M, latent_dim])`` of the rows of ``x [B, S, hidden]`` (the residual stream: the
    layer's input RMSNorm is applied here): the query projection and the latent projection (``c_kv`` then ``k_pe``,
    before their norm and rotation). With ``q_lora_rank`` the input norm and the q_a / kv_a projection are one
    :func:`tritree.kernels.linear`, the q_a norm and the q_b projection another (the norms' weights folded into the
    projections', :func:`_qkv_a`, :func:`_q_b`)."""
    p = layer_prefix(i) + "self_attn."
    B, S, Hd = x.shape
    x2 = x.reshape(B * S, Hd)
    g = params[layer_prefix(i) + "input_layernorm.weight"]
    if cfg.q_lora_rank is None:
        h = rms_norm(x2, g, cfg.rms_norm_eps)
        q = linear(h, params[p + "q_proj.weight"])
        a = linear(h, params[p + "kv_a_proj_with_mqa.weight"], params.get(p + "kv_a_proj_with_mqa.bias"))
    else:
        w, b = _qkv_a(params, p, g)
        qa = fused_linear(x2, w.to(x.dtype), None if b is None else b.to(x.dtype), rms_eps=cfg.rms_norm_eps)
        cq, a = qa.split([cfg.q_lora_rank, cfg.latent_dim], dim=-1)
        q = fused_linear(cq, _q_b(params, p).to(x.dtype), rms_eps=cfg.qk_latent_eps)
    return q.view(B * S, cfg.heads, cfg.qk_head_dim), a


def _mla_inputs(params, cfg, i, x, rope):
    """Query halves and the cached latent of tokens ``x [B, S, hidden]`` (the residual stream), composed of PyTorch
    ops after :func:`_mla_projections`; ``rope``: their :func:`rope_cos_sin` tables ``([B, S, rope], [B, S,
    rope])``."""
    p = layer_prefix(i) + "self_attn."
    B, S, _ = x.shape
    q, a = _mla_projections(params, cfg, i, x)
    q_nope, q_pe = q.view(B, S, cfg.heads, cfg.qk_head_dim).split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
    c_kv, k_pe = a.view(B, S, -1).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
    c_kv = rms_norm(c_kv, params[p + "kv_a_layernorm.weight"], cfg.qk_latent_eps)
    cos, sin = rope
    q_pe = apply_rope(q_pe, cos[:, :, None], sin[:, :, None])
    k_pe = apply_rope(k_pe, cos, sin)
    return q_nope, q_pe, torch.cat([c_kv, k_pe], dim=-1)


def _kv_b(params, cfg, i):
    """``W_UK [H, nope, kv_lora]`` and ``W_UV [H, v, kv_lora]`` views of kv_b_proj."""
    w = params[layer_prefix(i) + "self_attn.kv_b_proj.weight"]
    w = w.view(cfg.heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return w[:, :cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim:]


def _o_bias(params, i, o):
    """``o + o_proj.bias`` when the checkpoint has one: after the all-reduce, so it is added once."""
    b = params.get(layer_prefix(i) + "self_attn.o_proj.bias")
    return o if b is None else o + b.to(o.dtype)


def attention_prefill(params, cfg, i, x, rope, tp=None):
    """Naive MLA with causal attention over the prompt (its input RMSNorm included: ``x`` is the residual stream);
    returns (out, latents [B, S, 576]). ``rope``: the tokens' :func:`rope_cos_sin` tables. Under ``tp`` the local
    heads' ``o_proj`` partial sums are all-reduced; the latents are the full (replicated) ones."""
    B, S, _ = x.shape
    q_nope, q_pe, latent = _mla_inputs(params, cfg, i, x, rope)
    w_uk, w_uv = _kv_b(params, cfg, i)
    c_kv, k_pe = latent.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
    k_nope = torch.einsum("bsc,hnc->bshn", c_kv, w_uk.to(x.dtype))
    v = torch.einsum("bsc,hvc->bshv", c_kv, w_uv.to(x.dtype))
    k = torch.cat([k_nope, k_pe[:, :, None].expand(-1, -1, cfg.heads, -1)], dim=-1)
    q = torch.cat([q_nope, q_pe], dim=-1)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=cfg.softmax_scale).transpose(1, 2)
    o = linear(o.reshape(B, S, -1), params[layer_prefix(i) + "self_attn.o_proj.weight"])
    return _o_bias(params, i, dist.all_reduce_(tp, o)), latent


def attention_verify(params, cfg, i, x, rope, cache, tree_mask, tree_lens, layer_kv, tp=None):
    """The attention half of a verify layer on the residual stream ``x [B, T, hidden]``: returns ``x + attn(x)``.
    Absorbed MLA over the paged cache with the tree mask (:func:`tritree.kernels.verify_mla`), its input RMSNorm
    included; writes the tree latents. ``rope``: the nodes' :func:`rope_cos_sin` tables. Five launches besides
    ``verify_mla`` (the module docstring). Under ``tp``: the local heads; rank 0 adds the residual to its ``o_proj``
    partial sum, then the all-reduce."""
    B, T, Hd = x.shape
    M = B * T
    p = layer_prefix(i) + "self_attn."
    q, a = _mla_projections(params, cfg, i, x)
    w_uk, w_uv = _kv_b(params, cfg, i)
    cos, sin = (t.reshape(M, -1) for t in rope)
    q = mla_query_(q, a, w_uk.to(x.dtype), params[p + "kv_a_layernorm.weight"].to(x.dtype), cos, sin, layer_kv,
                   cache["page_table"], cache["kv_lens"], tree_lens, rows_per_request=T, eps=cfg.qk_latent_eps)
    o_lat = verify_mla(q.view(B, T, cfg.heads, -1), layer_kv, cache["page_table"], cache["kv_lens"], tree_mask,
                       sm_scale=cfg.softmax_scale, tree_lens=tree_lens, d_rope=cfg.qk_rope_head_dim)
    o = mla_output(o_lat.view(M, cfg.heads, cfg.kv_lora_rank), w_uv.to(x.dtype))  # W_UV after attention
    x2 = x.reshape(M, Hd)
    o = fused_linear(o, params[p + "o_proj.weight"].to(x.dtype),
                     residual=x2 if not dist.active(tp) or tp.rank == 0 else None)
    return _o_bias(params, i, dist.all_reduce_(tp, o)).view(B, T, Hd)


def _layers(cfg, params):
    return [i for i in range(cfg.num_hidden_layers) if layer_prefix(i) + "input_layernorm.weight" in params]


def _check_tp(cfg, tp):
    if dist.active(tp) and cfg.heads * tp.world != cfg.num_attention_heads:
        raise ValueError(f"cfg computes {cfg.heads} of {cfg.num_attention_heads} heads, but the tensor-parallel "
                         f"world is {tp.world}: pass the rank's config (tritree.model.parallel.shard_config)")


def _embed(params, cfg, tokens, tp):
    return dist.embed(tp, params["model.embed_tokens.weight"], tokens, cfg.vocab_size)


def _logits(params, cfg, x, tp):
    h = rms_norm(x, params["model.norm.weight"], cfg.rms_norm_eps)
    return dist.lm_logits(tp, h, params["lm_head.weight"], cfg.vocab_size)


def prefill(params, cfg: KimiK2Config, tokens: torch.Tensor, cache: dict | None = None, taps=(), tp=None,
            last_only: bool = False):
    """Prompt forward: ``tokens [B, S]`` at positions ``0..S-1``.

    ``cache`` (optional): ``{"kv": [layers, num_pages, P, 576], "page_table", "kv_lens"}``; every layer's
    latents are written at ``kv_lens + i`` and the returned cache has ``kv_lens + S``.
    Returns ``(logits [B, S, V] float32, taps [B, S, len(taps), hidden], cache)``; ``taps`` are outputs of
    the given layers (HF ``hidden_states[id + 1]``). Under ``tp`` the logits are this rank's vocabulary
    shard ``[B, S, Vs]`` (:func:`tritree.dist.gather_vocab` gives all ``V``); the rest is replicated.
    ``last_only``: logits of the last position only, ``[B, 1, V]`` (or ``[B, 1, Vs]``): the next token is
    all a generation needs, and ``[S, V]`` float32 is gigabytes at long context (3.8 GB a rank at 46k)."""
    _check_tp(cfg, tp)
    B, S = tokens.shape
    x = _embed(params, cfg, tokens, tp)
    rope = rope_cos_sin(cfg, torch.arange(S, device=tokens.device).expand(B, S), x.dtype)
    tapped = {}
    for n, i in enumerate(_layers(cfg, params)):
        a, latent = attention_prefill(params, cfg, i, x, rope, tp)
        if cache is not None:
            kv_write_(cache["kv"][n], cache["page_table"], cache["kv_lens"], latent.to(cache["kv"].dtype).contiguous())
        x = x + a
        x = ffn(params, cfg, i, x, tp)
        if i in taps:
            tapped[i] = x
    logits = _logits(params, cfg, x[:, -1:] if last_only else x, tp)
    tap_out = torch.stack([tapped[t] for t in taps], dim=2) if taps else x.new_zeros(B, S, 0, x.shape[-1])
    if cache is not None:
        cache = {**cache, "kv_lens": cache["kv_lens"] + S}
    return logits, tap_out, cache


def verify(params, cfg: KimiK2Config, tokens: torch.Tensor, depth: torch.Tensor, tree_mask: torch.Tensor,
           cache: dict, tree_lens: torch.Tensor | None = None, taps=(), tp=None):
    """Tree verify: node tokens ``[B, T]`` at positions ``kv_lens + depth``, absorbed MLA with
    :func:`verify_mla` over the paged cache (the tree latents are written at ``kv_lens + i``; the cache
    lengths are not advanced: commit does that). Rows ``i >= tree_lens[b]`` are padding: no KV written,
    no attention, no routed expert read; their logits and taps are meaningless. Returns
    ``(logits [B, T, V] float32, taps)``; under
    ``tp`` the logits are this rank's vocabulary shard ``[B, T, Vs]``."""
    _check_tp(cfg, tp)
    B, T = tokens.shape
    x = _embed(params, cfg, tokens, tp)
    rope = rope_cos_sin(cfg, cache["kv_lens"][:, None].to(torch.int64) + depth.to(torch.int64), x.dtype)
    tapped = {}
    for n, i in enumerate(_layers(cfg, params)):
        x = attention_verify(params, cfg, i, x, rope, cache, tree_mask, tree_lens, cache["kv"][n], tp)
        x = ffn(params, cfg, i, x, tp, tree_lens)
        if i in taps:
            tapped[i] = x
    logits = _logits(params, cfg, x, tp)
    tap_out = torch.stack([tapped[t] for t in taps], dim=2) if taps else x.new_zeros(B, T, 0, x.shape[-1])
    return logits, tap_out
