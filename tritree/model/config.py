"""Model configurations: Kimi K2.x (DeepSeek-V3 architecture) from Hugging Face configs, with presets."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace


def read_hf_config(path_or_dict) -> dict:
    """A HF ``config.json`` as a dict: a file, a checkpoint directory or a dict (copied)."""
    if isinstance(path_or_dict, (str, os.PathLike)):
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            return json.load(f)
    return dict(path_or_dict)


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
    q_lora_rank: int = 1536
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
    weight_prefix: str = ""  # "language_model." for K2.5 / K2.6 multimodal checkpoints
    num_local_heads: int | None = None
    first_local_head: int = 0

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

    @classmethod
    def from_hf(cls, path_or_dict, **overrides) -> "KimiK2Config":
        """From a HF ``config.json`` (file, directory or dict); K2.5/K2.6's ``text_config`` nesting is
        unwrapped and sets ``weight_prefix = "language_model."``."""
        raw = read_hf_config(path_or_dict)
        prefix = ""
        if "text_config" in raw and isinstance(raw["text_config"], dict):
            raw, prefix = dict(raw["text_config"]), "language_model."
        rs = raw.get("rope_scaling") or raw.get("rope_parameters")
        if rs is not None:
            rs = dict(rs)
            if "rope_type" in rs and "type" not in rs:
                rs["type"] = rs["rope_type"]
            if rs.get("type") in (None, "default"):
                rs = None
        theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", cls.rope_theta))
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in raw.items() if k in names and k not in ("rope_scaling", "rope_theta")}
        if "n_routed_experts" not in raw and "num_local_experts" in raw:
            kw["n_routed_experts"] = raw["num_local_experts"]
        kw.update(rope_scaling=rs, rope_theta=float(theta), weight_prefix=prefix)
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
    max_position_embeddings: int = 262144

    def __post_init__(self):
        if len(self.windows) != self.num_hidden_layers:
            raise ValueError(f"windows must give one entry per layer ({self.num_hidden_layers}), got {self.windows}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5

    @classmethod
    def from_hf(cls, path_or_dict, **overrides) -> "DFlashConfig":
        """From a draft's HF ``config.json`` (file, directory or dict). The amplitude is what
        transformers computes from the rope parameters unless ``rope_amplitude`` is overridden."""
        raw = read_hf_config(path_or_dict)
        if raw.get("attention_bias"):
            raise ValueError("DFlash drafts with attention biases are not supported")
        dflash = dict(raw.get("dflash_config") or {})
        rs = raw.get("rope_scaling") or raw.get("rope_parameters")
        theta = raw.get("rope_theta", (rs or {}).get("rope_theta", cls.rope_theta))
        if rs is not None:
            rs = {k: v for k, v in dict(rs).items() if k != "rope_theta"}
            if "rope_type" in rs and "type" not in rs:
                rs["type"] = rs["rope_type"]
            if rs.get("type") in (None, "default"):
                rs = None
            elif rs.get("type") not in ("yarn", "deepseek_yarn"):
                raise ValueError(f"unsupported draft rope type {rs.get('type')!r} (tritree: default or YaRN)")
        n = int(raw["num_hidden_layers"])
        types = raw.get("layer_types") or ["full_attention"] * n
        win = raw.get("sliding_window")
        sliding = [t == "sliding_attention" for t in types]
        if any(sliding) and raw.get("is_causal", None) is not False:
            raise ValueError("sliding-window DFlash layers must be non-causal (is_causal: false); the causal "
                             "variant of the reference is not supported")
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in raw.items() if k in names and k not in ("rope_scaling", "rope_theta", "windows")}
        for k in ("target_layer_ids", "mask_token_id", "block_size", "input_embedding_scale", "output_multiplier"):
            v = dflash.get(k, raw.get(k))
            if v is not None:
                kw[k] = v
        if "head_dim" not in raw:
            kw["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
        kw.update(target_layer_ids=tuple(kw.get("target_layer_ids", cls.target_layer_ids)),
                  windows=tuple(int(win) if s and win else None for s in sliding),
                  rope_scaling=rs, rope_theta=float(theta), rope_amplitude=yarn_amplitude(rs))
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
