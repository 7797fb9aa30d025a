"""The MoE layer of a decode step: router, routed experts (bf16 and INT4) and the fused block.

The package, one role a module:

* ``router``: ``moe_route`` (router GEMM, sigmoid, correction bias, grouped top-k, normalisation, scaling, the
  expert-parallel offset: one launch), its reference, configs and plan;
* ``align``: the routing align shared by the grouped-expert kernels (assignments sorted by expert and cut into
  blocks, one launch, no host sync);
* ``dense``: ``routed_experts``, grouped SwiGLU over bf16 / fp16 experts;
* ``int4``: ``Int4Experts`` (the INT4 checkpoint layout, quantisation, sharding, the layout each GPU streams),
  the reference and ``routed_experts_int4``, the one entry point of the INT4 kernels and their
  ``torch.library`` ops;
* ``int4_triton``: the Triton W4A16 kernels over the checkpoint layout (the interpreter, other GPUs), their
  configs and plan;
* ``int4_mma``: the Gluon ``mma.sync`` W4A16 kernels over the repacked layout (sm_90, sm_120), with the shared
  expert's programs, their plan and launch;
* ``block``: ``moe_block``, the post-attention norm through the residual add in five launches.
"""

from .block import MoeBlockPlan, moe_block, moe_block_reference, plan_moe_block
from .dense import moe_reference, routed_experts
from .int4 import Int4Experts, kernel_layout, moe_int4_reference, routed_experts_int4
from .int4_triton import Int4MoePlan, plan_int4_moe
from .router import RoutePlan, moe_route, moe_route_reference, plan_moe_route

__all__ = ["Int4Experts", "Int4MoePlan", "MoeBlockPlan", "RoutePlan", "kernel_layout", "moe_block",
           "moe_block_reference", "moe_int4_reference", "moe_reference", "moe_route", "moe_route_reference",
           "plan_int4_moe", "plan_moe_block", "plan_moe_route", "routed_experts", "routed_experts_int4"]
