"""``tritree.kernels.verify_mla``: the verify attention's public names; the family lives in
:mod:`tritree.kernels.verify` (ABI, policy, launcher, kernels)."""

from .verify import (
    D_LATENT,
    D_QK,
    D_ROPE,
    GLUON_KERNELS,
    KV_FP8,
    VERIFY_MLA_CONFIGS,
    VerifyLaunch,
    VerifyPlan,
    plan_launch,
    verify_mla,
    verify_mla_reference,
)

__all__ = ["D_LATENT", "D_QK", "D_ROPE", "GLUON_KERNELS", "KV_FP8", "VERIFY_MLA_CONFIGS", "VerifyLaunch",
           "VerifyPlan", "plan_launch", "verify_mla", "verify_mla_reference"]
