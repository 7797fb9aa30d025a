"""How a Kimi K2 (DeepSeek-V3) target is sharded over a tensor-parallel group (docs/SPEC.md section 2).

Rank ``r`` of ``w`` holds:

- attention: query heads ``[r H/w, (r+1) H/w)``: the rows of ``q_b_proj`` (or ``q_proj``) and
  ``kv_b_proj`` of those heads (column-parallel) and the matching input columns of ``o_proj``
  (row-parallel, all-reduce after; its bias, if any, added once after it); ``q_a_proj``,
  ``kv_a_proj_with_mqa`` (with their biases) and the norms are replicated, so every rank computes and
  holds the full latent cache;
- routed experts ``[r E/w, (r+1) E/w)`` (expert-parallel; the router is replicated and every rank routes
  every token, running only its own experts; dense or INT4 alike: both stack experts on dim 0), the shared expert and the dense layers' MLP split along
  the intermediate dimension; one all-reduce combines each MLP;
- rows ``[r Vs, (r+1) Vs)`` of ``embed_tokens`` and ``lm_head``, ``Vs = ceil(V / w)``, zero-padded
  (:mod:`tritree.dist`).

The config a rank uses is the global one with ``num_local_heads = H/w``, ``first_local_head = r H/w``
(:func:`shard_config`); the local expert, intermediate and vocabulary sizes follow from the parameter
shapes.

The DFlash draft is sharded the same way (:func:`shard_draft_params`): rank ``r`` holds query heads
``[r Hq/w, (r+1) Hq/w)`` (rows of ``q_proj``, input columns of ``o_proj``; an all-reduce after ``o_proj``, its
bias added once after it), the KV heads those query heads read (``Hkv/w`` of them, or the one KV head of its
query heads' group, replicated, when ``Hkv < w``; the draft's KV cache holds only those), the MLP's intermediate
rows ``[r I/w, (r+1) I/w)`` (an all-reduce after ``down_proj``), and input columns ``[r K/w, (r+1) K/w)`` of the
taps projection ``fc`` (``K = n_taps x hidden``; an all-reduce before ``hidden_norm``); the norms are
replicated. Its config is the global one with the rank's head, KV-head and intermediate counts and
``tp_world = w`` (:func:`shard_draft_config`).
"""

from __future__ import annotations

import torch

from ..dist import TPGroup, active, vocab_shard
from .config import DFlashConfig, KimiK2Config
from .dflash import param_shapes as draft_param_shapes
from .kimi_k2 import param_shapes


def shard_config(cfg: KimiK2Config, tp: TPGroup | None) -> KimiK2Config:
    """The rank's view of ``cfg`` (its heads); ``cfg`` unchanged for one process. Raises ``ValueError``
    when a sharded dimension is not divisible by the world size."""
    if not active(tp):
        return cfg
    w = tp.world
    need = [("num_attention_heads", cfg.num_attention_heads)]
    if cfg.n_routed_experts > 0 and cfg.num_hidden_layers > cfg.first_k_dense_replace:
        need += [("n_routed_experts", cfg.n_routed_experts),
                 ("moe_intermediate_size * n_shared_experts", cfg.moe_intermediate_size * cfg.n_shared_experts)]
    if cfg.first_k_dense_replace > 0 or cfg.n_routed_experts == 0:
        need.append(("intermediate_size", cfg.intermediate_size))
    for what, n in need:
        if n % w:
            raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel world size {w}")
    heads = cfg.num_attention_heads // w
    local = cfg.with_(num_local_heads=heads, first_local_head=tp.rank * heads)
    if cfg.num_local_heads is not None and (cfg.num_local_heads, cfg.first_local_head) != (
            local.num_local_heads, local.first_local_head):
        raise ValueError(f"cfg already selects heads {cfg.first_local_head}..+{cfg.num_local_heads}, but rank "
                         f"{tp.rank} of {w} holds {local.first_local_head}..+{heads}")
    return local


def shard_slice(name: str, cfg: KimiK2Config, tp: TPGroup | None, full_shape) -> tuple | None:
    """``(dim, start, stop, padded)`` of parameter ``name`` (full shape ``full_shape``) this rank keeps,
    or ``None`` when it keeps all of it. ``cfg`` is the rank's view (:func:`shard_config`); its head
    selection applies even without a group (a single-process view of one rank's heads)."""
    H0, H = cfg.first_local_head, cfg.heads
    if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
        if H == cfg.num_attention_heads:
            return None
        per = cfg.qk_head_dim
        return 0, H0 * per, (H0 + H) * per, H * per
    if name.endswith("self_attn.kv_b_proj.weight"):
        if H == cfg.num_attention_heads:
            return None
        per = cfg.qk_nope_head_dim + cfg.v_head_dim
        return 0, H0 * per, (H0 + H) * per, H * per
    if name.endswith("self_attn.o_proj.weight"):
        if H == cfg.num_attention_heads:
            return None
        per = cfg.v_head_dim
        return 1, H0 * per, (H0 + H) * per, H * per
    if not active(tp):
        return None
    w, r = tp.world, tp.rank
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        start, rows, per = vocab_shard(cfg.vocab_size, tp)
        return 0, start, start + rows, per
    if ".mlp." not in name or ".mlp.gate." in name:  # norms, latent projections, router: replicated
        return None
    # routed experts (stacked [E, ...]), the shared expert and dense MLPs: dim 0 of gate/up, and of the
    # stacked experts; dim 1 of the 2-D down projections
    dim = 1 if name.endswith("down_proj.weight") and ".mlp.experts." not in name else 0
    per = full_shape[dim] // w
    return dim, r * per, (r + 1) * per, per


def local_param_shapes(cfg: KimiK2Config, tp: TPGroup | None, experts: str = "dense") -> dict[str, tuple]:
    """Every parameter's shape on this rank (``cfg`` global or the rank's view); ``experts``: the routed
    experts' layout (:func:`tritree.model.kimi_k2.param_shapes`; either splits on the expert dimension)."""
    local = shard_config(cfg.with_(num_local_heads=None, first_local_head=0), tp) if active(tp) else cfg
    out = {}
    for name, shape in param_shapes(local.with_(num_local_heads=None), experts).items():
        s = shard_slice(name, local, tp, shape)
        if s is not None:
            shape = tuple(s[3] if d == s[0] else n for d, n in enumerate(shape))
        out[name] = tuple(shape)
    return out


def take_slice(t: torch.Tensor, s: tuple | None) -> torch.Tensor:
    """``t``'s slice ``s`` (:func:`shard_slice`), zero-padded to ``padded`` along ``dim``; a copy."""
    if s is None:
        return t
    dim, start, stop, padded = s
    part = t.narrow(dim, start, stop - start)
    if stop - start == padded:
        return part.clone()
    shape = list(t.shape)
    shape[dim] = padded
    out = t.new_zeros(shape)
    out.narrow(dim, 0, stop - start).copy_(part)
    return out


def shard_params(params: dict, cfg: KimiK2Config, tp: TPGroup | None) -> tuple[dict, KimiK2Config]:
    """This rank's parameters from a full (all heads, all experts) parameter dict, and its config.
    For random or in-memory models; checkpoints load shard-aware with ``load_params(..., tp=tp)``."""
    if cfg.num_local_heads not in (None, cfg.num_attention_heads):
        raise ValueError("shard_params takes the full parameters (cfg.num_local_heads must be None)")
    local = shard_config(cfg, tp)
    full = param_shapes(cfg.with_(num_local_heads=None))
    out = {}
    for name, t in params.items():
        s = shard_slice(name, local, tp, full.get(name, tuple(t.shape)))
        out[name] = take_slice(t, s)
    if cfg.tie_word_embeddings and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out, local


# --------------------------------------------------------------------------------------------------
# The DFlash draft
# --------------------------------------------------------------------------------------------------

def shard_draft_config(cfg: DFlashConfig, tp: TPGroup | None) -> DFlashConfig:
    """The rank's view of the global draft config ``cfg``: its query heads, KV heads and MLP rows and
    ``tp_world``; ``cfg`` for one process. Raises ``ValueError`` when the world does not divide the query heads,
    the MLP, the taps projection's input, or the KV heads (or, with fewer KV heads than ranks, is not a multiple
    of them)."""
    if not active(tp):
        return cfg
    if cfg.tp_world != 1:
        raise ValueError(f"shard_draft_config takes the global draft config, got one of tp_world = {cfg.tp_world}")
    w, Hq, Hkv = tp.world, cfg.num_attention_heads, cfg.num_key_value_heads
    for what, n in (("the draft's num_attention_heads", Hq), ("the draft's intermediate_size", cfg.intermediate_size),
                    ("the draft's taps width (n_taps x hidden_size)", cfg.n_taps * cfg.hidden_size)):
        if n % w:
            raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel world size {w}")
    if (Hkv % w) if Hkv >= w else (w % Hkv):
        raise ValueError(f"the draft's num_key_value_heads = {Hkv} must be divisible by the tensor-parallel world "
                         f"size {w}, or divide it (each rank then holds its query heads' one KV head)")
    return cfg.with_(num_attention_heads=Hq // w, num_key_value_heads=max(1, Hkv // w),
                     intermediate_size=cfg.intermediate_size // w, tp_world=w)


def draft_shard_slice(name: str, cfg: DFlashConfig, tp: TPGroup | None, full_shape) -> tuple | None:
    """``(dim, start, stop, padded)`` of draft parameter ``name`` (full shape ``full_shape``, ``cfg`` global) this
    rank keeps, or ``None`` when it keeps all of it (:func:`shard_slice`'s convention)."""
    if not active(tp):
        return None
    w, r, D = tp.world, tp.rank, cfg.head_dim
    hq = cfg.num_attention_heads // w
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return 0, r * hq * D, (r + 1) * hq * D, hq * D
    if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                      "self_attn.v_proj.bias")):
        hkv = max(1, cfg.num_key_value_heads // w)
        first = r * hq // (cfg.num_attention_heads // cfg.num_key_value_heads)  # the KV head of the rank's 1st head
        return 0, first * D, (first + hkv) * D, hkv * D
    if name.endswith("self_attn.o_proj.weight"):
        return 1, r * hq * D, (r + 1) * hq * D, hq * D
    if name == "fc.weight" or name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")):
        dim = 0 if name.endswith(("gate_proj.weight", "up_proj.weight")) else 1
        per = full_shape[dim] // w
        return dim, r * per, (r + 1) * per, per
    return None  # norms, o_proj's bias: replicated


def local_draft_shapes(cfg: DFlashConfig, tp: TPGroup | None) -> dict[str, tuple]:
    """Every draft parameter's shape on this rank (``cfg`` global)."""
    out = {}
    for name, shape in draft_param_shapes(cfg).items():
        s = draft_shard_slice(name, cfg, tp, shape)
        if s is not None:
            shape = tuple(s[3] if d == s[0] else n for d, n in enumerate(shape))
        out[name] = tuple(shape)
    return out


def shard_draft_params(params: dict, cfg: DFlashConfig, tp: TPGroup | None) -> tuple[dict, DFlashConfig]:
    """This rank's draft parameters from the whole draft's, and its config (:func:`shard_draft_config`); the
    whole draft and ``cfg`` for one process. Checkpoints load shard-aware with ``load_dflash_params(..., tp=tp)``."""
    local = shard_draft_config(cfg, tp)
    if local is cfg:
        return params, cfg
    full = draft_param_shapes(cfg)
    return {k: take_slice(t, draft_shard_slice(k, cfg, tp, full.get(k, tuple(t.shape)))) for k, t in params.items()}, local
