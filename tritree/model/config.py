"""Model configurations: Kimi K2.x (DeepSeek-V3 architecture) and DFlash drafts from Hugging Face configs,
with presets, and the table of what the loaders do with every config key (:data:`TARGET_CONFIG_KEYS`,
:data:`DRAFT_CONFIG_KEYS`, :data:`ROPE_CONFIG_KEYS`; the README shows the same tables)."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, NamedTuple


def read_hf_config(path_or_dict) -> dict:
    """A HF ``config.json`` as a dict: a file, a checkpoint directory or a dict (copied)."""
    if isinstance(path_or_dict, (str, os.PathLike)):
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            return json.load(f)
    return dict(path_or_dict)


# --------------------------------------------------------------------------------------------------
# What the loaders do with each config key
# --------------------------------------------------------------------------------------------------

class ConfigKey(NamedTuple):
    """How ``from_hf`` treats one key of a checkpoint's ``config.json``.

    ``handling``: ``"implemented"`` (computed as transformers / dflash compute it), ``"ignored"`` (no
    effect on inference) or ``"refused unless"`` (a value other than what ``note`` names raises
    ``ValueError`` at load). ``ok(value, config) -> bool`` tests a value; a failing value is refused."""

    handling: str
    note: str = ""
    ok: Callable | None = None


IMPLEMENTED, IGNORED, REFUSED = "implemented", "ignored", "refused unless"


def _impl(note="", ok=None):
    return ConfigKey(IMPLEMENTED, note, ok)


def _ign(note):
    return ConfigKey(IGNORED, note)


def _only(note, ok):
    return ConfigKey(REFUSED, note, ok)


def _keys(names, rule):
    return {k: rule for k in names}


_COMMON_KEYS = {
    **_keys(("transformers_version", "architectures", "model_type", "_name_or_path", "auto_map", "dtype",
             "torch_dtype", "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
             "is_encoder_decoder", "id2label", "label2id", "problem_type"), _ign("metadata")),
    **_keys(("use_cache", "pad_token_id", "bos_token_id", "eos_token_id"),
            _ign("generation settings (the engine's own arguments)")),
    **_keys(("initializer_range", "attention_dropout"), _ign("training only")),
    "hidden_act": _only("silu", lambda v, c: v == "silu"),
    "partial_rotary_factor": _only("1 (rope over the whole rope head dim)", lambda v, c: v in (None, 1, 1.0)),
    "rope_theta": _impl(),
    **_keys(("rope_scaling", "rope_parameters"), _impl("the rope_scaling.* keys below (rope_scaling wins)")),
    "rms_norm_eps": _impl(),
    "max_position_embeddings": _impl("YaRN's factor and original length when the rope parameters omit them"),
}

# Keys of ``rope_scaling`` / ``rope_parameters`` (target and draft alike).
ROPE_CONFIG_KEYS: dict[str, ConfigKey] = {
    **_keys(("rope_scaling.rope_type", "rope_scaling.type"),
            _only("default or yarn (deepseek_yarn is read as yarn); rope_type wins",
                  lambda v, c: v in ("default", "yarn", "deepseek_yarn"))),
    "rope_scaling.rope_theta": _impl("wins over the top-level rope_theta"),
    "rope_scaling.factor": _impl("absent: max_position_embeddings / original_max_position_embeddings"),
    "rope_scaling.original_max_position_embeddings": _impl("absent: max_position_embeddings"),
    **_keys(("rope_scaling.beta_fast", "rope_scaling.beta_slow", "rope_scaling.truncate"), _impl()),
    **_keys(("rope_scaling.mscale", "rope_scaling.mscale_all_dim"),
            _impl("cos/sin amplitude mscale(factor, mscale) / mscale(factor, mscale_all_dim); the target's "
                  "softmax scale times mscale(factor, mscale_all_dim)^2")),
    "rope_scaling.attention_factor": _impl("cos/sin amplitude"),
    "rope_scaling.partial_rotary_factor": _only("1", lambda v, c: v in (None, 1, 1.0)),
    **_keys(("rope_scaling.short_factor", "rope_scaling.long_factor", "rope_scaling.low_freq_factor",
             "rope_scaling.high_freq_factor", "rope_scaling.mrope_section"),
            _ign("parameters of rope types tritree refuses")),
}


def _quant_ok(q, c) -> bool:
    """The quantisation schemes the loader dequantises (weights only; activations stay unquantised)."""
    if not q:
        return True
    method = q.get("quant_method")
    if method == "fp8":
        return q.get("fmt", "e4m3") == "e4m3" and list(q.get("weight_block_size") or [128, 128]) == [128, 128]
    if method == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            w = group.get("weights") or {}
            if (w.get("num_bits"), w.get("type"), w.get("symmetric"), w.get("group_size"),
                    w.get("strategy", "group")) != (4, "int", True, 32, "group"):
                return False
        return q.get("format", "pack-quantized") == "pack-quantized"
    return False


def _heads_ok(v, c) -> bool:
    return v is None or v == c.get("num_attention_heads", _TARGET_DEFAULTS["num_attention_heads"])


# HF DeepseekV3Config's defaults: a key the checkpoint omits means what it means to transformers.
_TARGET_DEFAULTS = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_attention_heads=128, n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
    q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
    num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=4096,
    rms_norm_eps=1e-6, tie_word_embeddings=False, rope_interleave=True, attention_bias=False)

TARGET_CONFIG_KEYS: dict[str, ConfigKey] = {
    **_COMMON_KEYS,
    "text_config": _impl("K2.5 / K2.6 nesting: the text model's keys, tensor prefix language_model. (the outer "
                         "keys belong to the vision model and are not read, except quantization_config)"),
    **_keys(("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "kv_lora_rank",
             "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "num_experts_per_tok", "first_k_dense_replace",
             "norm_topk_prob", "tie_word_embeddings"), _impl()),
    "num_local_experts": _impl("alias of n_routed_experts"),
    **_keys(("n_group", "topk_group"), _impl("group-limited routing (the best 2 scores of a group rank it)")),
    "q_lora_rank": _impl("null: a full-rank q_proj"),
    "num_key_value_heads": _only("null or num_attention_heads (MLA's one latent KV)", _heads_ok),
    "rope_interleave": _impl("true: the checkpoint's rope rows are interleaved pairs, permuted to halves at "
                             "load; false: already halves"),
    "attention_bias": _impl("biases of q_a_proj (q_proj), kv_a_proj_with_mqa and o_proj"),
    **_keys(("output_router_logits", "aux_loss_alpha", "seq_aux"), _ign("training only")),
    "pretraining_tp": _ign("transformers' DeepSeek-V3 does not read it"),
    "ep_size": _ign("a deployment setting (tritree shards by its own tp)"),
    **_keys(("num_nextn_predict_layers", "num_mtp_layers"),
            _ign("the multi-token-prediction layers are not loaded; the logits do not depend on them")),
    **_keys(("qk_head_dim", "head_dim"), _ign("derived (qk_nope + qk_rope; qk_rope), as transformers does")),
    "moe_layer_freq": _only("1 (every layer from first_k_dense_replace on is MoE)", lambda v, c: v == 1),
    "topk_method": _only("noaux_tc", lambda v, c: v == "noaux_tc"),
    "scoring_func": _only("sigmoid", lambda v, c: v == "sigmoid"),
    "quantization_config": _only("fp8 (e4m3, 128x128 weight blocks) or compressed-tensors pack-quantized "
                                 "(symmetric INT4 weights, groups of 32)", _quant_ok),
    "qk_latent_eps": _only("1e-6 (tritree's own key: transformers' q_a / kv_a norm eps)", lambda v, c: v == 1e-6),
    "weight_prefix": _only('"" (a runtime setting: an override)', lambda v, c: v == ""),
    "num_local_heads": _only("null (a runtime setting: an override)", lambda v, c: v is None),
    "first_local_head": _only("0 (a runtime setting: an override)", lambda v, c: v == 0),
}


def _check_keys(raw: dict, table: dict, what: str, strict: bool, prefix: str = "") -> None:
    """Refuses a value ``table`` refuses (``ValueError`` naming the key, the value and what is
    supported); unknown keys warn (``strict``: refused too)."""
    unknown = []
    for k, v in raw.items():
        rule = table.get(prefix + k)
        if rule is None:
            unknown.append(prefix + k)
        elif rule.ok is not None and not rule.ok(v, raw):
            raise ValueError(f"{what} config key {prefix + k!r} = {v!r} is not supported; tritree supports {rule.note}")
    if unknown:
        msg = (f"{what} config keys unknown to tritree: {unknown}; they are not read, so the model is wrong if "
               f"they change the computation (README, 'Config keys')")
        if strict:
            raise ValueError(msg)
        warnings.warn(msg, stacklevel=3)


def _rope_from_hf(raw: dict, what: str, strict: bool, max_pos: int) -> tuple[dict | None, float]:
    """``(rope_scaling, rope_theta)`` as transformers reads them: ``rope_scaling`` (old name) or
    ``rope_parameters``; ``None`` for the default rope."""
    rs = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    _check_keys(rs, ROPE_CONFIG_KEYS, what, strict, prefix="rope_scaling.")
    theta = float(rs.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return None, theta
    orig = rs.get("original_max_position_embeddings") or max_pos
    factor = rs.get("factor")
    out = {"type": kind, "factor": float(factor if factor is not None else max_pos / orig),
           "original_max_position_embeddings": orig}
    out.update({k: rs[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                                   "truncate") if k in rs})
    return out, theta


@dataclass(frozen=True)
class KimiK2Config:
    """DeepSeek-V3-architecture target (Kimi K2 / K2.5 / K2.6). Field names follow the HF config.

    ``num_local_heads`` is the heads this process computes (TP rank view, e.g. 8 of 64 at TP8);
    ``first_local_head`` the first of them. ``qk_latent_eps`` is the eps of ``q_a_layernorm`` and
    ``kv_a_layernorm``: transformers and DeepSeek's reference use 1e-6 there whatever ``rms_norm_eps``
    says, and so does tritree (parity with transformers is what the tests check).
    """

    vocab_size: int = 163840
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 61
    first_k_dense_replace: int = 1
    num_attention_heads: int = 64
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    n_routed_experts: int = 384
    num_experts_per_tok: int = 8
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 2.827
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-5
    qk_latent_eps: float = 1e-6
    rope_theta: float = 50000.0
    rope_scaling: dict | None = field(default_factory=lambda: {
        "type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
    max_position_embeddings: int = 262144
    tie_word_embeddings: bool = False
    rope_interleave: bool = True
    attention_bias: bool = False
    weight_prefix: str = ""  # "language_model." for K2.5 / K2.6 multimodal checkpoints
    num_local_heads: int | None = None
    first_local_head: int = 0

    def __post_init__(self):
        E, G = self.n_routed_experts, self.n_group
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be positive or None, got {self.q_lora_rank}")
        for k in ("kv_lora_rank", "qk_rope_head_dim"):  # the widths verify_mla's kernels tile
            v = getattr(self, k)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{k} = {v} is not supported: the verify kernels need a power of two >= 16")
        if E > 0 and self.num_hidden_layers > self.first_k_dense_replace:
            if not 0 < self.num_experts_per_tok <= E:
                raise ValueError(f"num_experts_per_tok = {self.num_experts_per_tok} must be in [1, n_routed_experts = {E}]")
            if G < 1 or E % G or not 1 <= self.topk_group <= G:
                raise ValueError(f"n_group = {G} must divide n_routed_experts = {E} and topk_group = "
                                 f"{self.topk_group} lie in [1, n_group]")
            if G > 1 and E // G < 2:
                raise ValueError(f"n_group = {G} leaves {E // G} expert per group; group-limited routing ranks a "
                                 f"group by its best 2 scores")
            if self.num_experts_per_tok > self.topk_group * (E // G):
                raise ValueError(f"num_experts_per_tok = {self.num_experts_per_tok} exceeds the experts of the "
                                 f"topk_group = {self.topk_group} selected groups")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def heads(self) -> int:
        return self.num_local_heads or self.num_attention_heads

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and self.n_routed_experts > 0

    @property
    def mscale(self) -> float:
        rs = self.rope_scaling or {}
        factor = float(rs.get("factor", 1.0))
        m_all = float(rs.get("mscale_all_dim", 0.0) or 0.0)
        if factor <= 1.0 or not m_all or rs.get("type", rs.get("rope_type")) not in ("yarn", "deepseek_yarn"):
            return 1.0
        return 0.1 * m_all * math.log(factor) + 1.0

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5 * mscale ** 2`` (192, not 576, in the absorbed form too)."""
        return self.qk_head_dim ** -0.5 * self.mscale ** 2

    @property
    def rope_amplitude(self) -> float:
        """The cos/sin amplitude (:func:`yarn_amplitude`; 1.0 for K2.x, whose mscale = mscale_all_dim)."""
        return yarn_amplitude(self.rope_scaling)

    @classmethod
    def from_hf(cls, path_or_dict, *, strict: bool = False, **overrides) -> "KimiK2Config":
        """From a HF ``config.json`` (file, directory or dict); K2.5/K2.6's ``text_config`` nesting is
        unwrapped and sets ``weight_prefix = "language_model."``. Every key is read as
        :data:`TARGET_CONFIG_KEYS` says; a key the config omits takes transformers' ``DeepseekV3Config``
        default. Raises ``ValueError`` naming a refused key and value; unknown keys warn (``strict``:
        raise). ``overrides`` replace fields after that."""
        raw = read_hf_config(path_or_dict)
        prefix = ""
        if isinstance(raw.get("text_config"), dict):
            outer_quant = raw.get("quantization_config")
            raw, prefix = dict(raw["text_config"]), "language_model."
            if outer_quant is not None:
                raw.setdefault("quantization_config", outer_quant)
        _check_keys(raw, TARGET_CONFIG_KEYS, "target", strict)
        if "n_routed_experts" not in raw and "num_local_experts" in raw:
            raw["n_routed_experts"] = raw["num_local_experts"]
        kw = {k: raw.get(k, d) for k, d in _TARGET_DEFAULTS.items()}
        for k in ("n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace", "v_head_dim"):
            if kw[k] is None:  # transformers' types allow null here, its model does not run with it
                raise ValueError(f"target config key {k!r} = None is not supported; tritree needs an integer")
        # transformers tests these for truth: null is false
        kw.update(norm_topk_prob=bool(kw["norm_topk_prob"]), rope_interleave=bool(kw["rope_interleave"]),
                  attention_bias=bool(kw["attention_bias"]), tie_word_embeddings=bool(kw["tie_word_embeddings"]))
        rs, theta = _rope_from_hf(raw, "target", strict, kw["max_position_embeddings"])
        kw.update(rope_scaling=rs, rope_theta=theta, weight_prefix=prefix)
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "KimiK2Config":
        return replace(self, **changes)


def kimi_k26(**overrides) -> KimiK2Config:
    """Kimi K2.6 text model (real values; docs/SPEC.md section 2). ``num_hidden_layers`` can be reduced to
    load a slice."""
    return KimiK2Config(**{"weight_prefix": "language_model.", **overrides})


def kimi_tiny(**overrides) -> KimiK2Config:
    """A tiny config of the same architecture (YaRN on, layer 0 dense, 8 sigmoid-routed experts)."""
    base = dict(vocab_size=97, hidden_size=48, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=8,
                qk_rope_head_dim=16, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                n_group=1, topk_group=1, routed_scaling_factor=2.5, rms_norm_eps=1e-5, rope_theta=10000.0,
                rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
                max_position_embeddings=512)
    base.update(overrides)
    return KimiK2Config(**base)


def yarn_amplitude(rope_scaling: dict | None) -> float:
    """The cos/sin amplitude transformers gives a YaRN rope: ``attention_factor`` if set, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set, else
    ``0.1 ln(factor) + 1``; 1.0 without YaRN."""
    rs = rope_scaling or {}
    if rs.get("type", rs.get("rope_type")) not in ("yarn", "deepseek_yarn"):
        return 1.0
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    factor = float(rs["factor"])

    def ms(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rs.get("mscale") and rs.get("mscale_all_dim"):
        return ms(factor, float(rs["mscale"])) / ms(factor, float(rs["mscale_all_dim"]))
    return ms(factor)


# Qwen3Config's defaults (the draft's config class in dflash) and dflash's.
_DRAFT_DEFAULTS = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6, attention_bias=False)

# The DFlash keys: under dflash_config or at the top level (dflash_config wins), as dflash reads them.
_DFLASH_KEYS = {
    "target_layer_ids": _impl("absent: spread over num_target_layers as dflash spreads them"),
    "num_target_layers": _impl("only for target_layer_ids' default"),
    "mask_token_id": _impl("required"),
    "block_size": _impl("absent: 16, as dflash"),
    **_keys(("input_embedding_scale", "output_multiplier", "final_logit_softcapping"), _impl()),
    **_keys(("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"),
            _only("absent (DFlash2 drafts: convolutions and a candidate selector)", lambda v, c: v is None)),
}

DRAFT_CONFIG_KEYS: dict[str, ConfigKey] = {
    **_COMMON_KEYS,
    **_keys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"), _impl()),
    "num_key_value_heads": _impl("null: num_attention_heads"),
    "head_dim": _impl("absent: 128, Qwen3Config's default"),
    "attention_bias": _impl("biases of q_proj, k_proj, v_proj and o_proj"),
    "tie_word_embeddings": _ign("the draft has no embedding or lm_head of its own; it uses the target's"),
    **_keys(("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"),
            _impl("per-layer windows as Qwen3Config derives them (sliding_window is dropped unless "
                  "use_sliding_window)")),
    "is_causal": _only("false, or absent with no sliding layer: dflash attends non-causally within the block "
                       "only then", None),
    "dflash_config": _impl("holds the keys below"),
    **_DFLASH_KEYS,
}


def _spread_layers(num_target_layers: int, num_draft_layers: int) -> tuple:
    """dflash's default taps: one middle layer, or ``num_draft_layers`` spread evenly over
    ``[1, num_target_layers - 3]`` (rounded half to even, as Python rounds)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    lo, hi = 1, num_target_layers - 3
    return tuple(round(lo + i * (hi - lo) / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash block-diffusion draft (docs/SPEC.md section 3): Qwen3 decoder layers fed with the target's
    hidden-state taps, using the target's embedding and lm_head.

    ``windows``: per-layer sliding window (``None`` = the whole context); a key at position p is
    visible to the block query at position q iff ``|q - p| < window``. ``rope_amplitude`` multiplies
    cos and sin (K2.6-DFlash: 1.0; legacy vLLM/SGLang ran K2.5-DFlash with 1.41589; a config value,
    see docs/SPEC.md). Field names follow the HF config; the DFlash ones may sit under ``dflash_config``.
    """

    vocab_size: int = 163840
    hidden_size: int = 7168
    intermediate_size: int = 18432
    num_hidden_layers: int = 6
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 50000.0
    rope_scaling: dict | None = field(default_factory=lambda: {
        "type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0})
    rope_amplitude: float = 1.0
    target_layer_ids: tuple = (1, 12, 24, 35, 47, 58)
    mask_token_id: int = 163838
    block_size: int = 8
    windows: tuple = (None,) * 6
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    attention_bias: bool = False
    max_position_embeddings: int = 262144
    # A runtime setting, not a checkpoint key: the tensor-parallel world whose one rank this config's attention
    # heads, MLP and taps projection are (:func:`tritree.model.parallel.shard_draft_config`); 1: the whole draft.
    tp_world: int = 1

    def __post_init__(self):
        if isinstance(self.tp_world, bool) or not isinstance(self.tp_world, int) or self.tp_world < 1:
            raise ValueError(f"tp_world must be an int >= 1, got {self.tp_world!r}")
        if len(self.windows) != self.num_hidden_layers:
            raise ValueError(f"windows must give one entry per layer ({self.num_hidden_layers}), got {self.windows}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if not 16 <= self.head_dim <= 256 or self.head_dim & (self.head_dim - 1):
            raise ValueError(f"head_dim = {self.head_dim} is not supported: draft_attention needs a power of two "
                             "in [16, 256]")

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5

    @classmethod
    def from_hf(cls, path_or_dict, *, strict: bool = False, **overrides) -> "DFlashConfig":
        """From a draft's HF ``config.json`` (file, directory or dict), every key read as
        :data:`DRAFT_CONFIG_KEYS` says (a key the config omits takes Qwen3Config's / dflash's default).
        The amplitude is what transformers computes from the rope parameters unless ``rope_amplitude`` is
        overridden. Raises ``ValueError`` naming a refused key and value; unknown keys warn (``strict``:
        raise)."""
        raw = read_hf_config(path_or_dict)
        _check_keys(raw, DRAFT_CONFIG_KEYS, "draft", strict)
        dflash = dict(raw.get("dflash_config") or {})
        _check_keys(dflash, _DFLASH_KEYS, "draft", strict, prefix="")
        kw = {k: raw.get(k, d) for k, d in _DRAFT_DEFAULTS.items()}
        if kw["num_key_value_heads"] is None:
            kw["num_key_value_heads"] = kw["num_attention_heads"]
        kw["attention_bias"] = bool(kw["attention_bias"])
        n = kw["num_hidden_layers"]

        def value(k, default=None):
            return dflash.get(k, raw.get(k, default))

        # Qwen3Config: the window only with use_sliding_window; absent layer_types from max_window_layers
        win = raw.get("sliding_window", 4096) if raw.get("use_sliding_window", False) else None
        types = raw.get("layer_types")
        if types is None:
            first = raw.get("max_window_layers", 28)
            types = ["sliding_attention" if win is not None and i >= first else "full_attention" for i in range(n)]
        if len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
            raise ValueError(f"draft config key 'layer_types' = {types!r} is not supported; tritree supports one "
                             f"of full_attention / sliding_attention per layer ({n})")
        causal = raw.get("is_causal")
        if causal or (causal is None and "sliding_attention" in types):
            raise ValueError(f"draft config key 'is_causal' = {causal!r} with layer_types {types} makes causal "
                             f"layers; tritree's DFlash blocks are non-causal (is_causal: false, or absent with "
                             f"no sliding layer)")
        ids = value("target_layer_ids")
        if ids is None:
            if value("num_target_layers") is None:
                raise ValueError("draft config has neither target_layer_ids nor num_target_layers")
            ids = _spread_layers(int(value("num_target_layers")), n)
        if value("mask_token_id") is None:
            raise ValueError("draft config has no mask_token_id (dflash_config.mask_token_id)")
        softcap = value("final_logit_softcapping")
        rs, theta = _rope_from_hf(raw, "draft", strict, kw["max_position_embeddings"])
        kw.update(target_layer_ids=tuple(int(i) for i in ids), mask_token_id=int(value("mask_token_id")),
                  block_size=int(value("block_size", 16)),
                  input_embedding_scale=float(value("input_embedding_scale", 1.0)),
                  output_multiplier=float(value("output_multiplier", 1.0)),
                  final_logit_softcapping=float(softcap) if softcap is not None and float(softcap) > 0 else None,
                  windows=tuple(int(win) if t == "sliding_attention" and win is not None else None for t in types),
                  rope_scaling=rs, rope_theta=theta, rope_amplitude=yarn_amplitude(rs))
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "DFlashConfig":
        return replace(self, **changes)


def kimi_k26_dflash(**overrides) -> DFlashConfig:
    """z-lab Kimi-K2.6-DFlash (docs/SPEC.md section 3): 6 layers, 64/8 heads of 128, block 8, amplitude 1.0."""
    return DFlashConfig(**overrides)


def dflash_tiny(target: KimiK2Config | None = None, **overrides) -> DFlashConfig:
    """A tiny draft for :func:`kimi_tiny` (same hidden size and vocabulary; taps of layers 0 and 2)."""
    target = target or kimi_tiny()
    base = dict(vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                rope_theta=10000.0, rope_scaling={"type": "yarn", "factor": 8.0,
                                                  "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                                  "beta_slow": 1.0},
                target_layer_ids=(0, target.num_hidden_layers - 1), mask_token_id=target.vocab_size - 1,
                block_size=4, windows=(None, None), max_position_embeddings=512)
    base.update(overrides)
    if "num_hidden_layers" in overrides and "windows" not in overrides:
        base["windows"] = (None,) * base["num_hidden_layers"]
    return DFlashConfig(**base)
