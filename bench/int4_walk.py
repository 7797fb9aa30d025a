"""The routed INT4 layer's weight reads without its arithmetic: a ceiling for the W4A16 kernels' access pattern.

``make_walk`` reads every touched local expert's packed words and scales with the tiles of a plan's
two kernels (gate_up: ``[BN, BK/8]`` words and ``[BN, BK/32]`` scales per K step over the ``2I`` rows of
``w13``; down: the same over the ``H`` rows of ``w2``), over the kernels' grid (the same routing align and
block -> expert map: an expert is read once per block of rows it owns, blocks past the last used one exit),
the kernels' own tile pointers stepped by a tile, and only folds what it reads into one word a
program. No dequantisation, no MMA, no split-K. Timed beside ``routed_experts_int4`` over the same routing, it splits
the kernels' distance from the copy bandwidth into what the access pattern costs (this walk) and what
everything else the kernels do a K step costs (the rest). ``bench/moe_sweep.py --variant walk`` runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritree.kernels.moe.align import align_routing
from tritree.kernels.moe.int4 import GROUP, Int4Experts
from tritree.kernels.moe.int4_triton import Int4MoePlan, _tile_pointers


@triton.jit
def _walk_kernel(Wp, Ws, BlockExpert, Out, E, KW, stride_pe, stride_pn, stride_se, stride_sn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid ``(blocks, rows / BLOCK_N)``, as the kernels': program ``(b, t)`` reads expert
    ``BlockExpert[b]``'s rows ``[t BN, (t + 1) BN)``, all ``KW`` words of each, a ``BLOCK_K``-column tile a
    step; blocks past the last used one (``BlockExpert[b] == E``) exit."""
    b = tl.program_id(0)
    e = tl.load(BlockExpert + b)
    if e < E:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        pw, ps = _tile_pointers(Wp, Ws, e.to(tl.int64), n, 0, stride_pe, stride_pn, stride_se, stride_sn, BLOCK_K)
        acc_w = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.int32)
        acc_s = tl.zeros([BLOCK_N, BLOCK_K // 32], dtype=tl.int32)
        for _c in range(0, KW, BLOCK_K // 8):
            acc_w ^= tl.load(pw)
            acc_s ^= tl.load(ps).to(tl.int16, bitcast=True).to(tl.int32)
            pw += BLOCK_K // 8
            ps += BLOCK_K // 32
        fold = tl.sum(tl.sum(acc_w, 1), 0) + tl.sum(tl.sum(acc_s, 1), 0)
        tl.store(Out + b * tl.num_programs(1) + tl.program_id(1), fold)


def walk(packed: torch.Tensor, scale: torch.Tensor, block_expert: torch.Tensor, tiles, sink: torch.Tensor) -> None:
    """One kernel's walk: ``packed [E, rows, K/8]`` int32 and ``scale [E, rows, K/32]`` bf16 read in
    ``tiles = (BN, BK, warps, stages)`` for each block of ``block_expert [blocks] int32`` (expert ids, ``E``
    past the last used block); program ``(b, t)`` stores its fold at ``sink[b rows / BN + t]`` (blocks of
    expert ``E`` store nothing)."""
    E, rows, KW = packed.shape
    bn, bk, warps, stages = tiles
    if rows % bn or (KW * 8) % bk or bk % GROUP:
        raise ValueError(f"the walk needs whole tiles: {rows} rows by BN {bn}, {KW * 8} columns by BK {bk}")
    grid = (block_expert.numel(), rows // bn)
    _walk_kernel[grid](packed, scale, block_expert, sink, E, KW, packed.stride(0), packed.stride(1),
                       scale.stride(0), scale.stride(1), BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)


def make_walk(experts: Int4Experts, plan: Int4MoePlan):
    """``fn(x, topk_idx, topk_w, out)``: the routing align of ``plan`` (the kernels' own), then the walk of
    the blocks' experts with ``plan``'s tiles (ids outside ``[0, E)`` skipped; no split-K); ``x``, ``topk_w``
    and ``out`` are not used. No host sync (capturable)."""
    E, H, I = experts.num_experts, experts.hidden, experts.intermediate
    sink = torch.zeros(plan.num_blocks * max(2 * I, H), dtype=torch.int32, device=experts.w13_packed.device)

    def fn(x, topk_idx, topk_w, out):
        _, block_expert, _, _, _ = align_routing(topk_idx, E, plan.block_m, plan.num_blocks)
        walk(experts.w13_packed, experts.w13_scale, block_expert, plan.config.gate_up, sink)
        walk(experts.w2_packed, experts.w2_scale, block_expert, plan.config.down, sink)
    return fn
