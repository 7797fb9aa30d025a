"""Triton kernels, one module per op family (a package when it has several kernels: ``verify``, ``moe``):
reference + kernel(s) + launcher + configs."""

from ._launch import clear_plan_caches, plan_cache_info
from ._validate import set_debug
from .accept import accept_picks, accept_tree, accept_tree_reference
from .configs import AttnConfig, arch_of
from .draft_attention import DraftAttentionPlan, draft_attention, draft_attention_reference
from .embed import embed_rows, embed_rows_reference
from .head_rope import head_norm_rope, head_norm_rope_reference
from .kv_cache import kv_commit_, kv_commit_reference, kv_gather, kv_gather_reference, kv_write_, kv_write_reference
from .kv_pool import PagePool, PoolExhausted, defrag_, page_table_from_token_table, token_table_from_page_table
from .linear import LinearPlan, linear, linear_reference, plan_linear
from .mla_decode import mla_output, mla_output_reference, mla_query_, mla_query_reference
from .moe import (
                  Int4Experts,
                  Int4MoePlan,
                  MoeBlockPlan,
                  RoutePlan,
                  kernel_layout,
                  moe_block,
                  moe_block_reference,
                  moe_int4_reference,
                  moe_route,
                  moe_route_reference,
                  plan_int4_moe,
                  plan_moe_block,
                  plan_moe_route,
                  routed_experts_int4,
)
from .tree import Tree, build_tree, build_tree_reference, expected_accept, tree_mask_from_parents
from .verify import VerifyPlan, plan_launch, verify_mla, verify_mla_reference

__all__ = ["AttnConfig", "arch_of", "tree_mask_from_parents", "verify_mla", "verify_mla_reference", "PagePool",
           "PoolExhausted", "defrag_", "kv_commit_", "kv_commit_reference", "kv_gather", "kv_gather_reference",
           "kv_write_", "kv_write_reference", "page_table_from_token_table", "token_table_from_page_table",
           "Tree", "accept_tree", "accept_picks", "draft_attention", "draft_attention_reference", "accept_tree_reference", "build_tree",
           "build_tree_reference", "expected_accept", "VerifyPlan", "DraftAttentionPlan", "plan_launch", "plan_cache_info",
           "clear_plan_caches", "set_debug", "Int4Experts", "Int4MoePlan", "moe_int4_reference", "plan_int4_moe",
           "routed_experts_int4", "kernel_layout", "RoutePlan", "moe_route", "moe_route_reference", "plan_moe_route",
           "MoeBlockPlan", "moe_block", "moe_block_reference", "plan_moe_block", "LinearPlan", "linear",
           "linear_reference", "plan_linear", "mla_query_", "mla_query_reference", "mla_output",
           "mla_output_reference", "head_norm_rope", "head_norm_rope_reference", "embed_rows",
           "embed_rows_reference"]
