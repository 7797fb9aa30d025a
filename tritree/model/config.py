"""Model configurations: Kimi K2.x (DeepSeek-V3 architecture) from Hugging Face configs, with presets."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace


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
        if isinstance(path_or_dict, (str, os.PathLike)):
            path = os.fspath(path_or_dict)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path) as f:
                raw = json.load(f)
        else:
            raw = dict(path_or_dict)
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
    """Kimi K2.6 text model (real values; SPEC.md section 2). ``num_hidden_layers`` can be reduced to
    load a slice."""
    return KimiK2Config(weight_prefix="language_model.", **overrides)


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
