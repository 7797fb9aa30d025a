"""The DFlash block-diffusion draft as pure functions over a parameter dict (docs/SPEC.md section 3).

Parameters are keyed by the z-lab checkpoint names (``fc.weight``, ``hidden_norm.weight``,
``norm.weight``, ``layers.i.self_attn.q_proj.weight`` ...); the draft has no embedding or lm_head of
its own and takes the target's. :func:`to_kernel_layout_` (the Engine and ``bench decode`` call it once after
loading) concatenates each layer's q, k and v rows (``QKV_KEY``, ``QKV_BIAS_KEY``), its q and k norms one row a head
(``QK_NORM_KEY``) and its gate and up rows (``GATE_UP_KEY``); the functions take either form.

The draft cache holds every draft layer's context keys and values in one stacked pool
``kv: [layers, num_pages, P, 2, Hkv, D]`` (index 0 = K, 1 = V) with a page table and lengths, so one
:func:`~tritree.kv_write_` stores a token's K and V for every layer. Context K/V are computed once per
committed token (:func:`materialize_context_`); the block's own K/V are recomputed every round and
never cached.

Tensor parallelism: with a rank's shard (:func:`tritree.model.parallel.shard_draft_params`; ``cfg.tp_world``
ranks, the config's heads and MLP the rank's) the functions take the group ``tp`` and all-reduce after the taps
projection, after ``o_proj`` and after the MLP; the cache then holds the rank's KV heads. A whole draft
(``cfg.tp_world == 1``) runs replicated on every rank.
"""

from __future__ import annotations

import torch

from .. import dist
from ..kernels import draft_attention, head_norm_rope, kv_write_
from ..kernels.linear import linear as fused_linear
from .config import DFlashConfig
from .layers import inv_freq_kept, linear, random_params, rms_norm


def layer_prefix(i: int) -> str:
    return f"layers.{i}."


# A layer's gate and up rows in one tensor ``[2 I, hidden]`` after :func:`to_kernel_layout_` (one launch of
# :func:`tritree.kernels.linear` computes ``silu(gate) * up`` with the norm in it), replacing ``mlp.gate_proj.weight``
# and ``mlp.up_proj.weight``.
GATE_UP_KEY = "mlp.gate_up_proj.weight"
# A layer's q, k and v rows in one tensor ``[(Hq + 2 Hkv) D, hidden]`` (and their biases ``[(Hq + 2 Hkv) D]``) after
# :func:`to_kernel_layout_`, replacing ``self_attn.{q,k,v}_proj.{weight,bias}``: the block's q, k and v in one launch,
# the context's k and v from the k | v rows (a view) in one launch a layer.
QKV_KEY = "self_attn.qkv_proj.weight"
QKV_BIAS_KEY = "self_attn.qkv_proj.bias"
# A layer's q_norm weight once for each of its Hq heads, then its k_norm weight once for each of its Hkv heads,
# ``[Hq + Hkv, D]`` after :func:`to_kernel_layout_`, replacing ``self_attn.{q,k}_norm.weight``: the block's q and k
# heads normalised and rotated in one launch.
QK_NORM_KEY = "self_attn.qk_norm.weight"


def to_kernel_layout_(params: dict) -> dict:
    """Every layer's ``mlp.gate_proj`` and ``mlp.up_proj`` rows concatenated into ``GATE_UP_KEY``, its q, k and v
    projections into ``QKV_KEY`` (and ``QKV_BIAS_KEY``), its q and k norms into ``QK_NORM_KEY`` (in place, no second
    copy kept); after loading (and sharding: the heads are the rank's), before the first forward. Idempotent; the
    functions take either form."""
    for k in [k for k in params if k.endswith(".mlp.gate_proj.weight")]:
        p = k[:-len("gate_proj.weight")]
        params[p + "gate_up_proj.weight"] = torch.cat([params.pop(k), params.pop(p + "up_proj.weight")])
    for k in [k for k in params if k.endswith(".self_attn.q_proj.weight")]:
        p = k[:-len("self_attn.q_proj.weight")]
        norm = _qk_norm(params, p)
        params[p + QKV_KEY], bias = _qkv(params, p)
        if bias is not None:
            params[p + QKV_BIAS_KEY] = bias
        for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias",
                     "q_norm.weight", "k_norm.weight"):
            params.pop(p + "self_attn." + name, None)
        params[p + QK_NORM_KEY] = norm
    return params


def _qkv(params, p: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer prefix ``p``'s ``[q; k; v]`` rows and biases (None without biases), concatenated here when the params
    were not passed through :func:`to_kernel_layout_`."""
    w = params.get(p + QKV_KEY)
    if w is not None:
        return w, params.get(p + QKV_BIAS_KEY)
    a = p + "self_attn."
    w = torch.cat([params[a + n + "_proj.weight"] for n in "qkv"])
    b = params.get(a + "q_proj.bias")
    return w, None if b is None else torch.cat([params[a + n + "_proj.bias"] for n in "qkv"])


def _qk_norm(params, p: str) -> torch.Tensor:
    """Layer prefix ``p``'s per-head norm weights ``[Hq + Hkv, D]`` (``QK_NORM_KEY``; built here from ``q_norm``,
    ``k_norm`` and the projections' row counts when the params were not passed through :func:`to_kernel_layout_`)."""
    w = params.get(p + QK_NORM_KEY)
    if w is not None:
        return w
    a = p + "self_attn."
    qn, kn = params[a + "q_norm.weight"], params[a + "k_norm.weight"]
    D = qn.shape[0]
    hq, hkv = params[a + "q_proj.weight"].shape[0] // D, params[a + "k_proj.weight"].shape[0] // D
    return torch.cat([qn.expand(hq, D), kn.expand(hkv, D)])


def _gate_up(params, p: str) -> torch.Tensor:
    """Layer prefix ``p``'s ``[gate; up]`` rows (concatenated here when the params were not passed through
    :func:`to_kernel_layout_`)."""
    w = params.get(p + GATE_UP_KEY)
    if w is None:
        w = torch.cat([params[p + "mlp.gate_proj.weight"], params[p + "mlp.up_proj.weight"]])
    return w


def param_shapes(cfg: DFlashConfig) -> dict[str, tuple]:
    Hd, D = cfg.hidden_size, cfg.head_dim
    s = {"fc.weight": (Hd, cfg.n_taps * Hd), "hidden_norm.weight": (Hd,), "norm.weight": (Hd,)}
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        s.update({
            p + "input_layernorm.weight": (Hd,), p + "post_attention_layernorm.weight": (Hd,),
            p + "self_attn.q_proj.weight": (cfg.num_attention_heads * D, Hd),
            p + "self_attn.k_proj.weight": (cfg.num_key_value_heads * D, Hd),
            p + "self_attn.v_proj.weight": (cfg.num_key_value_heads * D, Hd),
            p + "self_attn.o_proj.weight": (Hd, cfg.num_attention_heads * D),
            p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, Hd), p + "mlp.up_proj.weight": (cfg.intermediate_size, Hd),
            p + "mlp.down_proj.weight": (Hd, cfg.intermediate_size),
        })
        if cfg.attention_bias:
            s.update({p + "self_attn.q_proj.bias": (cfg.num_attention_heads * D,),
                      p + "self_attn.k_proj.bias": (cfg.num_key_value_heads * D,),
                      p + "self_attn.v_proj.bias": (cfg.num_key_value_heads * D,), p + "self_attn.o_proj.bias": (Hd,)})
    return s


def init_params(cfg: DFlashConfig, seed: int = 0, dtype=torch.float32, device="cpu") -> dict:
    """Random draft parameters."""
    return random_params(param_shapes(cfg), seed, dtype, device)


def new_cache(cfg: DFlashConfig, num_pages: int, page_size: int, page_table: torch.Tensor, kv_lens: torch.Tensor,
              dtype=torch.float32) -> dict:
    """An empty draft cache ``{"kv": [layers, num_pages, P, 2, Hkv, D], "page_table", "kv_lens"}``
    on the device of ``page_table``."""
    kv = torch.zeros(cfg.num_hidden_layers, num_pages, page_size, 2, cfg.num_key_value_heads, cfg.head_dim,
                     dtype=dtype, device=page_table.device)
    return {"kv": kv, "page_table": page_table, "kv_lens": kv_lens}


def _norm_rope(cfg: DFlashConfig, x, norm_weight, positions, inv_freq):
    """The heads ``x [B, n, heads, D]`` RMS-normalised (``norm_weight``) and rotated at ``positions [B, n]`` with the
    rope's ``inv_freq`` (:func:`tritree.model.layers.inv_freq_kept`), one launch (:func:`tritree.kernels.head_norm_rope`)."""
    return head_norm_rope(x, norm_weight, positions, inv_freq, eps=cfg.rms_norm_eps, amplitude=cfg.rope_amplitude)


def _sharded(cfg: DFlashConfig, tp) -> bool:
    """Whether ``cfg`` is one rank's shard of group ``tp`` (partial sums to all-reduce), checked against it."""
    if cfg.tp_world == 1:
        return False
    if not dist.active(tp) or tp.world != cfg.tp_world:
        raise ValueError(f"the draft is one rank's shard of {cfg.tp_world} (cfg.tp_world) and needs that group "
                         f"as tp, got {'no group' if not dist.active(tp) else f'a group of {tp.world}'}")
    return True


def _reduced_linear(x, w, b, cfg, tp):
    """``x w^T + b`` where ``w`` holds this rank's input columns under tensor parallelism: the partial products
    all-reduced, the (replicated) bias added once after."""
    if not _sharded(cfg, tp):
        return linear(x, w, b)
    y = dist.all_reduce_(tp, linear(x, w))
    return y if b is None else y + b.to(y.dtype)


def _normed_linear(x2, w, b, g, eps, act=None):
    """``act(rmsnorm(x2, g) w^T + b)`` in one :func:`tritree.kernels.linear` (the norm's weight given to the op: ``w``
    is also read unnormalised elsewhere, e.g. the k | v rows of ``QKV_KEY`` by :func:`context_kv`)."""
    return fused_linear(x2, w.to(x2.dtype), None if b is None else b.to(x2.dtype), rms_eps=eps,
                        norm_weight=g.to(x2.dtype), act=act)


def _residual_linear(x2, w, b, residual, cfg: DFlashConfig, tp):
    """``residual + x2 w^T + b`` in one :func:`tritree.kernels.linear`; under tensor parallelism (``w`` holds this
    rank's input columns) rank 0 adds the residual to its partial product, the all-reduce sums them and the
    (replicated) bias is added once after."""
    w = w.to(x2.dtype)
    if not _sharded(cfg, tp):
        return fused_linear(x2, w, None if b is None else b.to(x2.dtype), residual=residual)
    y = dist.all_reduce_(tp, fused_linear(x2, w, residual=residual if tp.rank == 0 else None))
    return y if b is None else y + b.to(y.dtype)


def context_features(params, cfg: DFlashConfig, taps: torch.Tensor, tp=None) -> torch.Tensor:
    """``hidden_norm(fc(concat taps))``: ``taps [B, n, n_taps, hidden]`` -> ``[B, n, hidden]`` (a rank's shard of
    ``fc`` reads its columns of the taps, one all-reduce)."""
    B, n = taps.shape[:2]
    x = taps.reshape(B, n, -1)
    if _sharded(cfg, tp):
        k = params["fc.weight"].shape[1]
        x = x.narrow(-1, tp.rank * k, k)
    return rms_norm(_reduced_linear(x, params["fc.weight"], None, cfg, tp), params["hidden_norm.weight"],
                    cfg.rms_norm_eps)


def context_kv(params, cfg: DFlashConfig, ctx: torch.Tensor, positions: torch.Tensor) -> list:
    """Every layer's context ``(k, v)``, each ``[B, n, Hkv, D]``: ``k = rope(k_norm(k_proj ctx))`` at
    ``positions [B, n]``, ``v = v_proj ctx`` (a view). Per layer one GEMM of the k | v rows of its ``QKV_KEY`` (a
    view of the weight) and one :func:`tritree.kernels.head_norm_rope`: stacking every layer's rows would copy
    them."""
    B, n = ctx.shape[:2]
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    inv = inv_freq_kept(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, positions.device)
    x2 = ctx.reshape(B * n, -1)
    out = []
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        w, b = _qkv(params, p)
        kv = fused_linear(x2, w[Hq * D:].to(x2.dtype), None if b is None else b[Hq * D:].to(x2.dtype))
        kv = kv.view(B, n, 2, Hkv, D)
        out.append((_norm_rope(cfg, kv[:, :, 0], _qk_norm(params, p)[Hq:], positions, inv), kv[:, :, 1]))
    return out


def materialize_context_(params, cfg: DFlashConfig, taps: torch.Tensor, positions: torch.Tensor, draft_cache: dict,
                         counts: torch.Tensor | None = None, tp=None) -> dict:
    """Writes the context K/V of newly committed tokens into the draft cache, every layer at once.

    Args:
        taps: ``[B, n, n_taps, hidden]`` target hidden states (outputs of ``cfg.target_layer_ids``) of
            the new tokens, in order.
        positions: ``[B, n]`` their absolute positions (RoPE); they are stored at cache positions
            ``kv_lens[b] + i``, so ``positions[b, i] = kv_lens[b] + i`` for a position-indexed cache.
        draft_cache: ``{"kv", "page_table", "kv_lens"}`` (:func:`new_cache`); ``kv`` is updated in place.
        counts: ``[B]`` int32 new tokens per request (rows ``i >= counts[b]`` are ignored); default n.
        tp: the group of a sharded draft (module docstring).

    Returns the cache with ``kv_lens + counts``.
    """
    B, n = taps.shape[:2]
    kv = draft_cache["kv"]
    ctx = context_features(params, cfg, taps.to(kv.dtype), tp)
    L, Hkv, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    # one copy, every layer's K and V stacked as [B, n, layers, 2, Hkv, D]; kv_write_ reads it as [layers, B, n, 2,
    # Hkv, D] through its strides (a token's K and V of a layer one run, as the pool's rows)
    flat = torch.stack([t for kv_i in context_kv(params, cfg, ctx, positions) for t in kv_i], dim=2)
    new = flat.view(B, n, L, 2, Hkv, D).permute(2, 0, 1, 3, 4, 5).to(kv.dtype)
    kv_write_(kv, draft_cache["page_table"], draft_cache["kv_lens"], new, counts, stacked=True)
    added = counts if counts is not None else torch.full_like(draft_cache["kv_lens"], n)
    return {**draft_cache, "kv_lens": draft_cache["kv_lens"] + added}


def block_hidden(params, cfg: DFlashConfig, x: torch.Tensor, positions: torch.Tensor, draft_cache: dict | None,
                 attend=None, tp=None) -> torch.Tensor:
    """The draft's layers over block inputs ``x [B, S, hidden]`` at ``positions [B, S]`` attending to
    the cached context (``kv_lens`` tokens) and the whole block; returns ``norm(hidden) [B, S, hidden]``.

    ``attend(layer, q, k_blk, v_blk) -> [B, S, Hq, D]`` replaces the paged attention (training uses a
    dense, differentiable one). ``tp``: the group of a sharded draft (its heads and MLP rows; module docstring)."""
    B, S, _ = x.shape
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if attend is None:
        kv = draft_cache["kv"]

        def attend(i, q, k, v):
            return draft_attention(q, kv[i, :, :, 0], kv[i, :, :, 1], draft_cache["page_table"],
                                   draft_cache["kv_lens"], k.to(kv.dtype), v.to(kv.dtype), sm_scale=cfg.softmax_scale,
                                   window=cfg.windows[i])
    eps = cfg.rms_norm_eps
    inv = inv_freq_kept(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, positions.device)
    x2 = x.reshape(B * S, -1)
    for i in range(cfg.num_hidden_layers):
        # Per layer: q, k and v in one launch with the input norm in it (kernels.linear), the per-head q and k norms
        # and rotations in one, attention, o_proj with the residual add, gate|up with the post-attention norm and
        # SiLU-and-mul in one launch, down with the residual add.
        p = layer_prefix(i)
        a = p + "self_attn."
        w, b = _qkv(params, p)
        qkv = _normed_linear(x2, w, b, params[p + "input_layernorm.weight"], eps).view(B, S, Hq + 2 * Hkv, D)
        qk = _norm_rope(cfg, qkv[:, :, :Hq + Hkv], _qk_norm(params, p), positions, inv)
        q, k, v = qk[:, :, :Hq], qk[:, :, Hq:], qkv[:, :, Hq + Hkv:]
        o = attend(i, q, k, v)
        x2 = _residual_linear(o.reshape(B * S, Hq * D), params[a + "o_proj.weight"], params.get(a + "o_proj.bias"),
                              x2, cfg, tp)
        g = params[p + "post_attention_layernorm.weight"]
        h = _normed_linear(x2, _gate_up(params, p), None, g, eps, act="silu_mul")
        x2 = _residual_linear(h, params[p + "mlp.down_proj.weight"], None, x2, cfg, tp)
    x = x2.view(B, S, -1)
    return rms_norm(x, params["norm.weight"], cfg.rms_norm_eps)


def draft(params, cfg: DFlashConfig, embed: torch.Tensor, lm_head: torch.Tensor, anchor: torch.Tensor,
          start: torch.Tensor, draft_cache: dict, tp=None) -> torch.Tensor:
    """One draft round: block ``[anchor, MASK x (S-1)]`` at positions ``start .. start + S - 1``.

    Args:
        embed, lm_head: the target's ``[V, hidden]`` embedding and output head.
        anchor: ``[B]`` the last committed (bonus) token; start: ``[B]`` its position, which is the
            draft cache's ``kv_lens`` (every earlier token's context K/V is cached).
        draft_cache: as for :func:`materialize_context_` (read only).
        tp: a :class:`tritree.dist.TPGroup` when ``embed`` and ``lm_head`` are the rank's vocabulary shards: a
            vocabulary-parallel lookup, and the logits all-gathered; and the group of a sharded draft
            (``cfg.tp_world > 1``: the module docstring).

    Returns ``draft_logits [B, S-1, V]`` float32 for depths 1..S-1 (the input of :func:`tritree.build_tree`),
    soft-capped to ``(-c, c)`` by ``c tanh(logits / c)`` when ``cfg.final_logit_softcapping = c``.
    """
    B = anchor.shape[0]
    S = cfg.block_size
    tokens = torch.full((B, S), cfg.mask_token_id, dtype=torch.long, device=anchor.device)
    tokens[:, 0] = anchor
    x = dist.embed(tp, embed, tokens, cfg.vocab_size, cfg.input_embedding_scale)
    x = x.to(draft_cache["kv"].dtype)
    positions = start.to(torch.long)[:, None] + torch.arange(S, device=anchor.device)
    h = block_hidden(params, cfg, x, positions, draft_cache, tp=tp)
    logits = dist.lm_logits(tp, h[:, 1:], lm_head, cfg.vocab_size, cfg.output_multiplier)
    # every rank builds the same tree from the full draft distribution (B (S-1) V floats, small)
    logits = dist.gather_vocab(tp, logits, cfg.vocab_size)
    cap = cfg.final_logit_softcapping
    if cap:  # after the gather: a shard's -inf padding columns must not become -cap
        logits = torch.tanh(logits / cap) * cap
    return logits
