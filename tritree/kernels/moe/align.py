"""Routing align of the grouped-expert kernels (``int4_triton``'s Triton kernels and ``int4_mma``'s Gluon
ones): token x expert assignments sorted by expert and cut into blocks, in one launch, without a host sync."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import interpreting


def min_blocks(assignments: int, E: int, block_m: int) -> int:
    """Blocks enough for any routing: every used expert adds at most one part-filled block."""
    return -(-assignments // block_m) + max(1, min(E, assignments))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _align_kernel(Idx, SortedIdx, BlockExpert, BlockStart, BlockEnd, Used, Scratch, A, E, num_blocks,
                  BLOCK_M: tl.constexpr, NB: tl.constexpr, CHUNK_A: tl.constexpr, CHUNK_B: tl.constexpr):
    """One program (see :func:`align_routing`). ``Scratch [4 NB + num_blocks]`` int32: cursors, then the cumulative
    blocks, first rows and ends of the experts, then a mark a block. Buckets: ``[0, E)`` the local experts, ``E``
    another rank's, ``NB - 1`` (> E) the lanes past ``A``. ``Used [1]``: the blocks that own rows."""
    bins = tl.arange(0, NB)
    counts = tl.zeros([NB], dtype=tl.int32)
    for a0 in range(0, A, CHUNK_A):
        a = a0 + tl.arange(0, CHUNK_A)
        raw = tl.load(Idx + a, mask=a < A, other=0)
        key = tl.where(a < A, tl.where((raw >= 0) & (raw < E), raw, E), NB - 1).to(tl.int32)
        counts += tl.histogram(key, NB)
    ends = tl.cumsum(counts, 0)
    tl.store(Scratch + bins, ends - counts)  # the cursor of every bucket at its first sorted row
    local = tl.where(bins < E, counts, 0)
    blocks = (local + BLOCK_M - 1) // BLOCK_M
    cum_blocks = tl.cumsum(blocks, 0)
    used = tl.sum(blocks, 0)
    tl.store(Used, used)
    tl.store(Scratch + NB + bins, cum_blocks - blocks)
    tl.store(Scratch + 2 * NB + bins, ends - counts)
    tl.store(Scratch + 3 * NB + bins, ends)
    Marks = Scratch + 4 * NB
    for b0 in range(0, num_blocks, CHUNK_B):
        b = b0 + tl.arange(0, CHUNK_B)
        tl.store(Marks + b, tl.full([CHUNK_B], -1, tl.int32), mask=b < num_blocks)
    tl.debug_barrier()
    # Each expert with rows marks its first block; a block's expert is the last mark at or before it.
    first = cum_blocks - blocks
    tl.store(Marks + first, bins, mask=(blocks > 0) & (first < num_blocks))
    # Sorted by expert: each assignment takes the next row of its bucket (order within a bucket is free:
    # every row's result is computed on its own).
    for a0 in range(0, A, CHUNK_A):
        a = a0 + tl.arange(0, CHUNK_A)
        raw = tl.load(Idx + a, mask=a < A, other=0)
        key = tl.where((raw >= 0) & (raw < E), raw, E).to(tl.int32)
        pos = tl.atomic_add(Scratch + key, 1, mask=a < A, sem="relaxed")
        tl.store(SortedIdx + pos, a, mask=a < A)
    tl.debug_barrier()
    last = -1  # the last mark of the chunks before
    for b0 in range(0, num_blocks, CHUNK_B):
        b = b0 + tl.arange(0, CHUNK_B)
        marks = tl.load(Marks + b, mask=b < num_blocks, other=-1)
        run = tl.maximum(tl.associative_scan(marks, 0, _max_combine), last)
        last = tl.max(run, 0)
        e = tl.where(b < used, run, E)
        e_c = tl.minimum(tl.maximum(e, 0), E - 1)
        first_block = tl.load(Scratch + NB + e_c)
        start = tl.load(Scratch + 2 * NB + e_c) + (b - first_block) * BLOCK_M
        tl.store(BlockExpert + b, e, mask=b < num_blocks)
        tl.store(BlockStart + b, start, mask=b < num_blocks)
        tl.store(BlockEnd + b, tl.load(Scratch + 3 * NB + e_c), mask=b < num_blocks)


def align_routing(topk_idx: torch.Tensor, E: int, block_m: int, num_blocks: int):
    """Token x expert assignments sorted by expert and cut into blocks, on the device in one launch (no host
    sync).

    ``topk_idx [N, k]`` int32/int64 -> ``(sorted_idx [N k] int32`` assignment ids ``t k + j`` grouped by
    expert in expert order (ids outside ``[0, E)`` last, in no block; the order inside a group is not
    specified), ``block_expert, block_start, block_end [num_blocks] int32, used [1] int32)``: block ``b`` owns
    sorted rows ``[block_start, min(block_start + block_m, block_end))`` of expert ``block_expert``; the first
    ``used`` blocks own rows, those past them have ``block_expert == E``. ``num_blocks`` must be at least
    :func:`min_blocks`."""
    flat = topk_idx.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    A, dev = flat.numel(), flat.device
    nb = triton.next_power_of_2(E + 2)
    sorted_idx = torch.empty(A, dtype=torch.int32, device=dev)
    meta = torch.empty(3 * num_blocks + 1, dtype=torch.int32, device=dev)
    expert, start, end, used = meta[:num_blocks], meta[num_blocks:2 * num_blocks], meta[2 * num_blocks:-1], meta[-1:]
    scratch = torch.empty(4 * nb + num_blocks, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](flat, sorted_idx, expert, start, end, used, scratch, A, E, num_blocks,
                        BLOCK_M=block_m, NB=nb, CHUNK_A=1024 if not interpreting() else 256,
                        CHUNK_B=min(1024, triton.next_power_of_2(num_blocks)), num_warps=8 if not interpreting() else 1)
    return sorted_idx, expert, start, end, used
