"""Triton kernels, one file per op family: reference + kernel(s) + launcher + configs."""

from .configs import AttnConfig, arch_of
from .verify_mla import tree_mask_from_parents, verify_mla, verify_mla_reference

__all__ = ["AttnConfig", "arch_of", "tree_mask_from_parents", "verify_mla", "verify_mla_reference"]
