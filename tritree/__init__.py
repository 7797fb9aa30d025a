"""tritree: Triton kernels for tree speculative decoding on MLA models."""
from .kernels import tree_mask_from_parents, verify_mla, verify_mla_reference
