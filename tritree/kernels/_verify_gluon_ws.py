"""EXPERIMENTAL warp-specialized variant of the Hopper Gluon SEESAW verify kernel (TMA path only).

Same math, masking, tail, store and output / partial format as ``_verify_gluon_kernel`` with
``SEESAW=True`` and ``PAGE_SIZE % 64 == 0`` (see ``_verify_gluon.py`` for the schedule of a pair);
only who issues the copies and how slots are handed back differ. NEVER RUN ON A GPU: compile-only
(sm_90, triton 3.6 and 3.9) so far; see "Unverified" below before trusting it.

Why: in the SEESAW main loop the 8 compute warps issue the TMA copies themselves, and triton 3.6's
membar pass puts a CTA barrier between any two TMA writes into one allocation (18 ``BAR.SYNC`` per
pair), plus CTA barriers to release the slots; slot 1's refill starts only after ``P_1 V_1``.

Partitions (``gl.warp_specialize``; 12 warps per CTA):

* default partition (the kernel's 8 warps = 2 consumer warpgroups, ``setmaxnreg`` raises their
  registers): Q load (cp.async), the pair loop (streamed scores, softmax with the cross-warpgroup
  exchange, P over the rope rows, ``O += P_0 V_0``, ``O += P_1 V_1``), the masked one-tile tail
  (cp.async into rows 0..63) and the store. It never issues a TMA copy.
* worker partition ``_ws_producer`` (``PRODUCER_WARPS`` = 4 warps, ``PRODUCER_REGS`` registers):
  page-table lookups, the 9 + 9 TMA boxes of every pair (``_issue_pair_tile``) and the bulk L2
  prefetch one pair ahead. It computes nothing else and exits after issuing the last pair.

Barriers (all ``count=1``, each its own allocation, initialised before the fork):

* ``cbars[c]``, c = 0..8 (8 latent column blocks + rope): as in SEESAW. Pair i completes phase i of
  every ``cbars[c]``: the producer's slot-0 issue arms it (``expect`` = 1 arrival + 2 x 8 KB), slot 0's
  and slot 1's box of block c complete the bytes. Consumers wait with parity ``i & 1``
  (``_qk_streamed``). The producer cannot arm phase i+1 before the consumers are past every wait of
  phase i (it waits for ``empty0`` of pair i first, see below), so a parity wait never aliases.
* ``empty0`` / ``empty1`` (slot 0 = k_lat / k_pe rows 0..63 = ``V_0`` and ``P_0``; slot 1 = rows
  64..127): pair i (i + 1 < n_pairs) completes phase i of each. Consumer, per pair:
  ``wgmma_wait(1)`` (own ``P_0 V_0`` done) -> partition barrier (both warpgroups' ``P_0 V_0`` done:
  ``mbarrier.arrive`` is issued by one thread, thread 0) -> ``arrive(empty0)``; ``wgmma_wait(0)`` ->
  partition barrier -> ``arrive(empty1)``. Producer, before refilling slot s for pair j >= 1:
  ``wait(empty_s, (j - 1) & 1)``. Pair 0 is issued without a wait (slots start empty). The consumer
  cannot complete phase i+1 before the producer has issued pair i+1 (it needs its data), so the
  producer's parity wait never aliases either. No arrival for the last pair (arrivals == waits).
* The consumers' ``gl.thread_barrier`` / ``gl.barrier`` inside the default partition (and the parent
  region's, which only the default warps execute): compiled to ``bar.sync 0, 256`` (SASS
  ``BAR.SYNC 0x0, 0x100``), so the softmax exchange and ``_publish_p`` stay partition-local; the
  membar-inserted barriers between the producer's TMA issues are ``bar.sync 2, 128`` (its own warps).
  Barrier 1 (all 384 threads) is the region's fork / join only. On triton 3.9 the lowering of
  ``mbarrier.arrive`` itself puts a ``bar.sync 0, 256`` before the one-thread arrive, so the explicit
  one is redundant there (two back-to-back barriers); on 3.6 it is the only one.
* Captures: the producer gets ``start`` and ``n_pairs`` through the warp-specialize capture area
  (shared memory that the consumers' reduction scratch reuses: the workers read it before the fork's
  second barrier, so that is ordered); everything else it recomputes from kernel parameters.

Tail / exit: the tail writes rows 0..63 with cp.async after the pair loop. Every TMA copy the producer
ever issues belongs to some pair < n_pairs, and the consumers wait for all of them (``cbars``) before
that pair's scores, so by the tail no copy is in flight and the producer has nothing left to write
(it may still be finishing its last page lookup / L2 prefetch, which touch no shared memory).
n_pairs = 0: the producer issues nothing, the consumers skip the loop (tail only). n_pairs = 1: pair 0
only, no waits on ``empty``, no arrivals. The barriers are not invalidated (nothing reuses them).

Shared memory (as SEESAW, minus the plain schedule's two unused slot barriers; offsets from the triton
3.6 PTX): Q 64 x 512 + 64 x 64 (73,728 B), pair buffer k_lat 128 x 512 + k_pe 128 x 64 (147,456 B; P
64 x 128 bf16 over k_pe), tail P 64 x 64 (8,192 B) = 229,376 B; then the softmax reduction scratch /
capture area (229,376..229,887), the 11 mbarriers (9 ``cbars``, ``empty0``, ``empty1``: 229,888..230,055)
and the 4 worker-state bytes: 230,060 B of the 232,448.

Registers: 12 warps, so the launch gives 168 per thread; ``setmaxnreg`` makes it 24 for the producer
(it uses ~22) and 240 for the consumers (SEESAW had 255). On triton 3.6 the consumers spill more than
SEESAW (408 vs 120 bytes, mostly in the masked tail; ~11 local loads per pair in the pair loop, 3 of
them wgmma descriptors); the tail / store scalars are recomputed after the loop to keep them from being
live across it. Triton 3.9: no spills.

Checked in the compiled PTX / SASS (3.6 and 3.9), not on a GPU: ``expect`` is predicated on
``(tid & 127) == 0`` and the TMA issue on ``elect.sync`` and ``(tid & 127) < 32`` (a thread of the
producer's first warp); ``mbarrier.arrive`` on thread 0 (a consumer); the consumer barriers are
256-thread named barriers; no CTA-wide barrier inside the pair loop.

Unverified (never ran): results, hangs, and the barrier / parity reasoning above; that thread 0's
arrive after the partition barrier (wgmma_wait in both warpgroups first) releases the slot safely for the
other warpgroup's wgmma reads (the usual FA3 practice, but with a CTA barrier in between here); the
L2 prefetch's ``(tid.x & 127) == 0`` (meant to fire in thread 256, the producer's first); performance
(the consumers still run ~9 partition barriers per pair: the softmax exchange, ``_publish_p``, the two
releases).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch
import triton

from ._verify_gluon import (BLOCK_M, BLOCK_N, D_LAT, D_PE, GLUON_AVAILABLE, LOG2E, NUM_WARPS, SMEM_LIMIT_SM90, _check,
                            _IMPORT_ERROR, _kv_smem_layout, kv_descriptor)

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from ._verify_gluon import (_cta_barrier, _issue_pair_blocks, _issue_pair_tile, _load_q, _load_tail_tile,
                                _masked_tail, _masked_tail_halves, _new_bar, _page_row_p, _prefetch_tile_l2,
                                _publish_p, _qk, _qk_streamed, _softmax, _store_o, _tail_mask)

# Producer partition: warps and the register count it asks for (setmaxnreg); the consumers get the rest.
PRODUCER_WARPS = 4
PRODUCER_REGS = 24
# SPLIT kernel (``_verify_gluon_ss_kernel``): warpgroup 1's registers (warpgroup 0, the default
# partition, gets what is left of the 64K).
CONSUMER_REGS = 240

if GLUON_AVAILABLE:

    @gluon.jit
    def _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE: gl.constexpr):
        """Keys ``[start, end)`` of split ``pid_s`` (page-aligned chunks, as ``_verify_gluon_kernel``)."""
        n_keys = kv_len + tree_len
        chunk = gl.cdiv(gl.cdiv(n_keys, num_splits), PAGE_SIZE) * PAGE_SIZE
        start = pid_s * chunk
        end = gl.minimum(start + chunk, n_keys)
        return start, end

    @gluon.jit
    def _ws_producer(kv_desc, KV, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, stride_kvs, max_pages,
                     num_pages, PAGE_SIZE: gl.constexpr, L2_PREFETCH: gl.constexpr, D_LAT: gl.constexpr,
                     BLOCK_N: gl.constexpr, COLSPLIT: gl.constexpr = False):
        """Worker partition: all TMA copies of the pair loop. Pair j's slot s is refilled once the
        consumers released pair j-1's slot s (``empty_s`` phase j-1). ``COLSPLIT``: ``empty0`` / ``empty1``
        release the latent column blocks 0..3 / 4..7 and the rope of both slots instead."""
        if COLSPLIT:
            for j in range(n_pairs):
                n = start + 2 * j * BLOCK_N
                row0 = _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE)
                row1 = _page_row_p(pt, n + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                if j > 0:
                    if L2_PREFETCH:
                        _prefetch_tile_l2(KV, row0, stride_kvs, num_pages * PAGE_SIZE, 127)
                        _prefetch_tile_l2(KV, row1, stride_kvs, num_pages * PAGE_SIZE, 127)
                    mbarrier.wait(empty0, (j - 1) & 1)
                _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, 0, D_LAT // 128, D_LAT, BLOCK_N)
                if j > 0:
                    mbarrier.wait(empty1, (j - 1) & 1)
                _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, D_LAT // 128, D_LAT // 64 + 1, D_LAT,
                                   BLOCK_N)
        else:
            if n_pairs > 0:
                row0 = _page_row_p(pt, start, max_pages, num_pages, PAGE_SIZE)
                row1 = _page_row_p(pt, start + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 0, row0, D_LAT, BLOCK_N)
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 1, row1, D_LAT, BLOCK_N)
            for j in range(1, n_pairs):
                n = start + 2 * j * BLOCK_N
                row0 = _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE)
                row1 = _page_row_p(pt, n + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                if L2_PREFETCH:
                    # One pair ahead of its copies, as SEESAW (which prefetches pair j when it issues j-1).
                    _prefetch_tile_l2(KV, row0, stride_kvs, num_pages * PAGE_SIZE, 127)
                    _prefetch_tile_l2(KV, row1, stride_kvs, num_pages * PAGE_SIZE, 127)
                ph = (j - 1) & 1
                mbarrier.wait(empty0, ph)
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 0, row0, D_LAT, BLOCK_N)
                mbarrier.wait(empty1, ph)
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 1, row1, D_LAT, BLOCK_N)

    @gluon.jit
    def _ws_consumer(Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                     stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages, num_pages,
                     stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                     T, H, KvLens, TreeLens, num_splits, stride_mb, n_pairs,
                     q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1,
                     PAGE_SIZE: gl.constexpr, SINGLE_SPLIT: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, D_LAT: gl.constexpr, D_PE: gl.constexpr, PROBE: gl.constexpr,
                     COLSPLIT: gl.constexpr):
        """Default partition (8 warps): everything of the SEESAW TMA path but the copy issue. ``PROBE``
        (a bench-only time decomposition, wrong results): 1 = the pair loop only waits for the copies and
        releases the slots (the copy stream alone); 2 = scores and ``P V`` without the softmax (P = the
        scores, cast); 3 = scores only.

        ``COLSPLIT``: ``O`` as two column halves (``oa`` = columns 0..255, ``ob`` = 256..511; each warpgroup
        128 columns of each), and ``O += P V`` of a pair as two wgmmas by columns (m64 n256 k128 over both
        tiles) instead of by tiles: the first releases the latent column blocks 0..3 of both slots
        (``empty0``), the second blocks 4..7 and the rope rows (P). The next pair's scores stream in the
        same column order, so they start on blocks 0..3 while 4..7 still load (by tiles, slot 1 was
        released last and every column block of the next scores waited for it)."""
        if COLSPLIT:
            gl.static_assert(PROBE == 0, "probes: the by-tiles loop only")
        HALF: gl.constexpr = D_LAT // 2
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        s2_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                            instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, D_LAT // 2, 16])
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[8, 1], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        row_s_layout: gl.constexpr = gl.SliceLayout(1, s2_layout)
        p2_smem = k_pe._reinterpret(gl.bfloat16, [BLOCK_M, PAIR_N], smem_layout)
        # Only ``n_pairs`` comes from the parent: what the tail and the store need is recomputed after
        # the pair loop (program ids, kernel parameters, two reloaded scalars), so that it is not live
        # (spilled) across the loop, which has 240 registers here (SEESAW had 255).
        pid_m = gl.program_id(0)
        b = gl.program_id(2)
        tree_len = gl.load(TreeLens + b)

        # ---- Q: row copies (as _verify_gluon_kernel), while the producer issues pair 0 --------------
        _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M, D_LAT)
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s_layout)
        oh_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                            instr_shape=[16, D_LAT // 4, 16])
        if COLSPLIT:
            oa = gl.zeros([BLOCK_M, HALF], gl.float32, layout=oh_layout)
            ob = gl.zeros([BLOCK_M, HALF], gl.float32, layout=oh_layout)
        else:
            o = gl.zeros([BLOCK_M, D_LAT], gl.float32, layout=o_layout)

        s2_zero = gl.zeros([BLOCK_M, PAIR_N], gl.float32, layout=s2_layout)
        # ---- committed prefix: pairs of full tiles, no mask --------------------------------------
        for i in range(n_pairs):
            if COLSPLIT:
                s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, i & 1, s2_zero, D_LAT)
                p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                oa = _publish_p(p, alpha, oa, p2_smem, oh_layout)
                ob = ob * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, oh_layout)), 1)
                oa = warpgroup_mma(p2_smem, k_lat.slice(0, HALF, dim=1), oa, is_async=True)
                ob = warpgroup_mma(p2_smem, k_lat.slice(HALF, HALF, dim=1), ob, is_async=True)
                more = i + 1 < n_pairs
                oa = warpgroup_mma_wait(num_outstanding=1, deps=[oa])
                _cta_barrier()  # both warpgroups are done with column blocks 0..3 of both slots ...
                mbarrier.arrive(empty0, pred=more)
                ob = warpgroup_mma_wait(num_outstanding=0, deps=[ob])
                _cta_barrier()  # ... and with blocks 4..7 and the rope rows (P)
                mbarrier.arrive(empty1, pred=more)
            elif PROBE == 1:
                for c in gl.static_range(D_LAT // 64 + 1):
                    mbarrier.wait(cbars[c], i & 1)
            else:
                s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, i & 1, s2_zero, D_LAT)
                if PROBE == 3:
                    l_i += gl.sum(s, 1)
                else:
                    if PROBE == 2:
                        p = s.to(gl.bfloat16)
                        alpha = l_i
                    else:
                        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                    o = _publish_p(p, alpha, o, p2_smem, o_layout)
                    o = warpgroup_mma(p2_smem.slice(0, BLOCK_N, dim=1), k_lat.slice(0, BLOCK_N, dim=0), o,
                                      is_async=True)
                    o = warpgroup_mma(p2_smem.slice(BLOCK_N, BLOCK_N, dim=1), k_lat.slice(BLOCK_N, BLOCK_N, dim=0),
                                      o, is_async=True)
            if not COLSPLIT:
                more = i + 1 < n_pairs
                o = warpgroup_mma_wait(num_outstanding=1, deps=[o])
                _cta_barrier()  # (partition barrier) both warpgroups are done with slot 0 (V_0, P_0) ...
                mbarrier.arrive(empty0, pred=more)  # ... thread 0 hands it to the producer
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _cta_barrier()  # ... and with slot 1
                mbarrier.arrive(empty1, pred=more)

        # ---- masked tail (one tile at a time, rows 0..63 of the pair buffers) ----------------------
        m_i = gl.convert_layout(m_i, gl.SliceLayout(1, s_layout))
        l_i = gl.convert_layout(l_i, gl.SliceLayout(1, s_layout))
        pid_m = gl.program_id(0)
        pid_s = gl.program_id(1)
        b = gl.program_id(2)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE)
        tail_start = start + n_pairs * PAIR_N
        tail_lat_v = k_lat._reinterpret(gl.bfloat16, [1, PAIR_N, D_LAT], smem_layout)
        tail_pe_v = k_pe._reinterpret(gl.bfloat16, [1, PAIR_N, D_PE], smem_layout)
        tail_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, PAIR_N, 64], smem_layout)
        if COLSPLIT:
            oa, ob, m_i, l_i = _masked_tail_halves(oa, ob, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks,
                                                   p_smem, KV, PageTable, TreeMask, b, pid_m, tail_start, end, kv_len,
                                                   tree_len, T, H, stride_ptb, max_pages, num_pages, stride_kvp,
                                                   stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout,
                                                   oh_layout, ld_layout, PAGE_SIZE, D_LAT, BLOCK_M, BLOCK_N)
        else:
            o, m_i, l_i = _masked_tail(o, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV,
                                       PageTable, TreeMask, b, pid_m, tail_start, end, kv_len, tree_len, T, H,
                                       stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs, stride_mb, stride_mt,
                                       sm_scale_log2e, s_layout, o_layout, ld_layout, True, PAGE_SIZE, D_LAT, BLOCK_M,
                                       BLOCK_N)

        # ---- store (as _verify_gluon_kernel) --------------------------------------------------------
        if COLSPLIT:
            _store_o(oa, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                     stride_os, stride_lb, stride_lt, stride_lh, stride_ls, oh_layout, SINGLE_SPLIT, BLOCK_M, HALF)
            _store_o(ob, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                     stride_os, stride_lb, stride_lt, stride_lh, stride_ls, oh_layout, SINGLE_SPLIT, BLOCK_M, HALF,
                     HALF, False)
        else:
            _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                     stride_os, stride_lb, stride_lt, stride_lh, stride_ls, o_layout, SINGLE_SPLIT, BLOCK_M, D_LAT)

    @gluon.jit
    def _verify_gluon_ws_kernel(
        Q, KV, kv_desc, kv_desc3, PageTable, KvLens, TreeMask, TreeLens,
        Out, Lse,
        sm_scale_log2e,
        stride_qb, stride_qt, stride_qh,
        stride_kvp, stride_kvs,
        stride_ptb, max_pages, num_pages,
        stride_mb, stride_mt,
        stride_ob, stride_ot, stride_oh,
        stride_os,
        stride_lb, stride_lt, stride_lh,
        stride_ls,
        T, H, num_splits,
        PAGE_SIZE: gl.constexpr,
        SINGLE_SPLIT: gl.constexpr,
        L2_PREFETCH: gl.constexpr = True,
        PRODUCER_WARPS: gl.constexpr = 4,
        PRODUCER_REGS: gl.constexpr = 24,
        BLOCK_M: gl.constexpr = 64,
        BLOCK_N: gl.constexpr = 64,
        D_LAT: gl.constexpr = 512,
        D_PE: gl.constexpr = 64,
        PROBE: gl.constexpr = 0,
        COLSPLIT: gl.constexpr = False,
    ):
        """``_verify_gluon_kernel`` (SEESAW, TMA) with a producer partition; ``kv_desc3`` is unused
        (kept so that the positional arguments are the same). ``PROBE``: see ``_ws_consumer``."""
        gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
        gl.static_assert(BLOCK_M == BLOCK_N, "P (BLOCK_M x 2 BLOCK_N) lives in the rope buffers")
        gl.static_assert(PAGE_SIZE % BLOCK_N == 0, "TMA path only: page size a multiple of 64")
        gl.static_assert(D_LAT // 64 + 1 == 9)
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        pid_s = gl.program_id(1)
        b = gl.program_id(2)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE)
        full_end = start + (gl.maximum(gl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N
        n_full = (full_end - start) // BLOCK_N
        n_pairs = n_full // 2
        pt = PageTable + b.to(gl.int64) * stride_ptb

        q_lat = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_LAT], smem_layout)
        q_pe = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_PE], smem_layout)
        k_lat = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_LAT], smem_layout)
        k_pe = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_PE], smem_layout)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], smem_layout)
        cbars = (_new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(),
                 _new_bar())
        empty0 = _new_bar()
        empty1 = _new_bar()
        fence_async_shared()
        _cta_barrier()

        gl.warp_specialize(
            [
                (_ws_consumer, (Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                                stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages,
                                num_pages, stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb,
                                stride_lt, stride_lh, stride_ls,
                                T, H, KvLens, TreeLens, num_splits, stride_mb, n_pairs,
                                q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1,
                                PAGE_SIZE, SINGLE_SPLIT, BLOCK_M, BLOCK_N, D_LAT, D_PE, PROBE, COLSPLIT)),
                (_ws_producer, (kv_desc, KV, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, stride_kvs,
                                max_pages, num_pages, PAGE_SIZE, L2_PREFETCH, D_LAT, BLOCK_N, COLSPLIT)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )


    # ---------------------------------------------------------------------------------------------------
    # SPLIT: the two warpgroups as partitions of their own (FlashMLA's seesaw proper)
    # ---------------------------------------------------------------------------------------------------

    @gluon.jit
    def _ss_producer(kv_desc, KV, k_lat, k_pe, sbars0, sbars1, empty0, empty1, pt, start, n_pairs, stride_kvs,
                     max_pages, num_pages, PAGE_SIZE: gl.constexpr, L2_PREFETCH: gl.constexpr, D_LAT: gl.constexpr,
                     BLOCK_N: gl.constexpr):
        """Worker partition: the TMA copies of every pair, each slot on its own barriers (``sbars0`` /
        ``sbars1``), refilled once both warpgroups released it (``empty_s``, count 2)."""
        for j in range(n_pairs):
            n = start + 2 * j * BLOCK_N
            row0 = _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE)
            row1 = _page_row_p(pt, n + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            if j > 0:
                if L2_PREFETCH:
                    _prefetch_tile_l2(KV, row0, stride_kvs, num_pages * PAGE_SIZE, 127)
                    _prefetch_tile_l2(KV, row1, stride_kvs, num_pages * PAGE_SIZE, 127)
                mbarrier.wait(empty0, (j - 1) & 1)
            _issue_pair_tile(kv_desc, k_lat, k_pe, sbars0, 0, row0, D_LAT, BLOCK_N, True)
            if j > 0:
                mbarrier.wait(empty1, (j - 1) & 1)
            _issue_pair_tile(kv_desc, k_lat, k_pe, sbars1, 1, row1, D_LAT, BLOCK_N, True)

    @gluon.jit
    def _ss_release(bar):
        """Both of this warpgroup's wgmma waits are behind a partition barrier; then one thread arrives."""
        _cta_barrier()
        mbarrier.arrive(bar)

    @gluon.jit
    def _ss_warpgroup(Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                      stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages, num_pages,
                      stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                      stride_ls, T, H, KvLens, TreeLens, num_splits, stride_mb, n_pairs,
                      q_lat, q_pe, k_lat, k_pe, sbars, empty0, empty1, p0_ready, p1_ready, q_bar, fin_bar,
                      m_a_smem, m_b_smem, l0_smem, l1_smem,
                      W: gl.constexpr, PAGE_SIZE: gl.constexpr, SINGLE_SPLIT: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_LAT: gl.constexpr, D_PE: gl.constexpr):
        """Warpgroup ``W`` (a 4-warp partition): the scores of slot ``W`` of every pair, output columns
        ``256 W .. 256 W + 255`` of all 128 keys. Pair i, slots K_0 / K_1, running max m:

        * WG0: ``S_0 = Q K_0^T``; ``m_a = max(m, rowmax S_0)``, ``P_0`` over slot 0's rope rows, ``m_a``
          to shared memory, arrive ``p0_ready``; ``O_L = O_L e^(m - m_a) + P_0 V_0[:, :256]`` (async);
          wait ``p1_ready`` (``m_b``, ``P_1``); ``O_L = O_L e^(m_a - m_b) + P_1 V_1[:, :256]``.
        * WG1: ``S_1 = Q K_1^T``; wait ``p0_ready``; ``O_R = O_R e^(m - m_a) + P_0 V_0[:, 256:]`` (async)
          and, under it, ``m_b = max(m_a, rowmax S_1)``, ``P_1`` over slot 1's rope rows, ``m_b`` out,
          arrive ``p1_ready``; ``O_R = O_R e^(m_a - m_b) + P_1 V_1[:, 256:]``.

        So one warpgroup's softmax runs under the other's wgmmas. Each keeps its own row sum (WG0 of
        the P_0, WG1 of the P_1, both relative to the common m); they are added at the end. A slot is
        released (``empty_s``) by each warpgroup once its last wgmma reading it is done.

        The masked tail: each warpgroup copies the same tile into its own slot (rows 64 W ..), computes
        the same scores and softmax (bitwise equal in both: same instructions, same data), P over its
        slot's rope rows, its own 256 columns of ``P V``; only WG0 counts the tail's row sums."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D_LAT // 2, 16])
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[4, 1], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
        HALF: gl.constexpr = D_LAT // 2
        # Slot s = rows 64 s .. 64 s + 63 (a row slice: a 128B-swizzled [128, 512] buffer is stored as 8
        # column blocks of 128 rows, so slot 1 is not its second half). The rope buffer is one column
        # block: there slot s is the s-th half ([2, 64, 64]), later P_s ([64, 64] bf16).
        lat_v = k_lat._reinterpret(gl.bfloat16, [1, 2 * BLOCK_N, D_LAT], smem_layout)
        pe_v = k_pe._reinterpret(gl.bfloat16, [2, BLOCK_N, D_PE], smem_layout)
        q_lat_v = q_lat._reinterpret(gl.bfloat16, [1, BLOCK_M, D_LAT], smem_layout)
        q_pe_v = q_pe._reinterpret(gl.bfloat16, [1, BLOCK_M, D_PE], smem_layout)

        pid_m = gl.program_id(0)
        b = gl.program_id(2)
        if W == 0:
            tree_len = gl.load(TreeLens + b)
            _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M,
                    D_LAT)
            async_copy.commit_group()
            async_copy.wait_group(0)
            fence_async_shared()
            _ss_release(q_bar)
        else:
            mbarrier.wait(q_bar, 0)

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
        o = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

        # ---- committed prefix: pairs of full tiles, no mask -----------------------------------------
        for i in range(n_pairs):
            ph = i & 1
            # Buffers by a runtime index (0 at run time): descriptors of loop-invariant buffers are hoisted
            # out of the loop by triton 3.6 and spilled (~76 local loads per pair); these are recomputed.
            z = (i < 0).to(gl.int32)
            lat0 = lat_v.index(z).slice(0, BLOCK_N, dim=0)
            lat1 = lat_v.index(z).slice(BLOCK_N, BLOCK_N, dim=0)
            pe0 = pe_v.index(z)
            pe1 = pe_v.index(z + 1)
            q_lat_i = q_lat_v.index(z)
            q_pe_i = q_pe_v.index(z)
            if W == 0:
                s = _qk_streamed(q_lat_i, q_pe_i, lat0, pe0, sbars, ph, s_zero, D_LAT)
                p, alpha, m_a, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                pe0.store(p)
                m_a_smem.store(m_a)
                fence_async_shared()  # P_0 is read by both warpgroups' wgmmas (async proxy)
                _ss_release(p0_ready)
                o = o * gl.expand_dims(gl.convert_layout(alpha, row_o_layout), 1)
                o = warpgroup_mma(pe0, lat0.slice(0, HALF, dim=1), o, is_async=True)
                mbarrier.wait(p1_ready, ph)
                m_b = m_b_smem.load(row_layout)
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _ss_release(empty0)
                beta = gl.exp2(m_a - m_b)
                l_i = l_i * beta
                o = o * gl.expand_dims(gl.convert_layout(beta, row_o_layout), 1)
                o = warpgroup_mma(pe1, lat1.slice(0, HALF, dim=1), o, is_async=True)
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _ss_release(empty1)
                m_i = m_b
            else:
                s = _qk_streamed(q_lat_i, q_pe_i, lat1, pe1, sbars, ph, s_zero, D_LAT)
                mbarrier.wait(p0_ready, ph)
                m_a = m_a_smem.load(row_layout)
                alpha = gl.exp2(m_i - m_a)  # m_a is finite in the prefix (no masked keys)
                o = o * gl.expand_dims(gl.convert_layout(alpha, row_o_layout), 1)
                o = warpgroup_mma(pe0, lat0.slice(HALF, HALF, dim=1), o, is_async=True)
                p, beta, m_b, l_i = _softmax(s, m_a, l_i * alpha, sm_scale_log2e)
                pe1.store(p)
                m_b_smem.store(m_b)
                fence_async_shared()
                _ss_release(p1_ready)
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _ss_release(empty0)
                o = o * gl.expand_dims(gl.convert_layout(beta, row_o_layout), 1)
                o = warpgroup_mma(pe1, lat1.slice(HALF, HALF, dim=1), o, is_async=True)
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _ss_release(empty1)
                m_i = m_b

        # ---- masked tail: each warpgroup in its own slot, once the other is done with it ------------
        if n_pairs > 0:
            if W == 0:
                mbarrier.wait(empty0, (n_pairs - 1) & 1)
            else:
                mbarrier.wait(empty1, (n_pairs - 1) & 1)
        pid_s = gl.program_id(1)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE)
        tail_start = start + n_pairs * 2 * BLOCK_N
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        t = rows // H
        row_ok = (rows < T * H) & (t < tree_len)
        mask_base = TreeMask + b.to(gl.int64) * stride_mb
        tail_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, 2 * BLOCK_N, 64], smem_layout)
        tail_lat_v = k_lat._reinterpret(gl.bfloat16, [1, 2 * BLOCK_N, D_LAT], smem_layout)
        tail_pe_v = k_pe._reinterpret(gl.bfloat16, [2, BLOCK_N, D_PE], smem_layout)
        for n in range(tail_start, end, BLOCK_N):
            # The slot by a runtime index equal to W (see _masked_tail: hoisted constant descriptors spill).
            ts = (n < 0).to(gl.int32)
            tail_lat = tail_lat_v.index(ts).slice(W * BLOCK_N, BLOCK_N, dim=0)
            tail_pe = tail_pe_v.index(ts + W)
            _load_tail_tile(KV, PageTable, b.to(gl.int64) * stride_ptb, n, end, max_pages, num_pages, stride_kvp,
                            stride_kvs, tail_blocks, 0, tail_pe, ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, W * BLOCK_N)
            fence_async_shared()
            _cta_barrier()
            s = _qk(q_lat, q_pe, tail_lat, tail_pe, s_zero, False)
            s = _tail_mask(s, n, end, kv_len, tree_len, row_ok, t, mask_base, stride_mt, s_layout, BLOCK_N)
            p, alpha, m_i, l_new = _softmax(s, m_i, l_i, sm_scale_log2e)
            if W == 0:
                l_i = l_new
            else:
                l_i = l_i * alpha
            tail_pe.store(p)
            fence_async_shared()
            _cta_barrier()
            o = o * gl.expand_dims(gl.convert_layout(alpha, row_o_layout), 1)
            o = warpgroup_mma(tail_pe, tail_lat.slice(W * HALF, HALF, dim=1), o)
            _cta_barrier()

        # ---- row sums of both warpgroups, then each stores its columns ------------------------------
        if W == 0:
            l0_smem.store(l_i)
        else:
            l1_smem.store(l_i)
        _ss_release(fin_bar)
        mbarrier.wait(fin_bar, 0)
        if W == 0:
            l_i = l_i + l1_smem.load(row_layout)
        else:
            l_i = l_i + l0_smem.load(row_layout)
        _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, o_layout, SINGLE_SPLIT, BLOCK_M, HALF, W * HALF, W == 0)

    @gluon.jit
    def _verify_gluon_ss_kernel(
        Q, KV, kv_desc, kv_desc3, PageTable, KvLens, TreeMask, TreeLens,
        Out, Lse,
        sm_scale_log2e,
        stride_qb, stride_qt, stride_qh,
        stride_kvp, stride_kvs,
        stride_ptb, max_pages, num_pages,
        stride_mb, stride_mt,
        stride_ob, stride_ot, stride_oh,
        stride_os,
        stride_lb, stride_lt, stride_lh,
        stride_ls,
        T, H, num_splits,
        PAGE_SIZE: gl.constexpr,
        SINGLE_SPLIT: gl.constexpr,
        L2_PREFETCH: gl.constexpr = True,
        PRODUCER_WARPS: gl.constexpr = 4,
        PRODUCER_REGS: gl.constexpr = 24,
        CONSUMER_REGS: gl.constexpr = 240,
        BLOCK_M: gl.constexpr = 64,
        BLOCK_N: gl.constexpr = 64,
        D_LAT: gl.constexpr = 512,
        D_PE: gl.constexpr = 64,
    ):
        """The seesaw with each warpgroup a partition of its own (``_ss_warpgroup``; the kernel's 4 warps
        are warpgroup 0) and the copies in a producer partition (``_ss_producer``)."""
        gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
        gl.static_assert(BLOCK_M == BLOCK_N, "P_w (BLOCK_M x BLOCK_N) lives in slot w's rope rows")
        gl.static_assert(PAGE_SIZE % BLOCK_N == 0, "TMA path only: page size a multiple of 64")
        gl.static_assert(D_LAT // 64 + 1 == 9)
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

        pid_s = gl.program_id(1)
        b = gl.program_id(2)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE)
        full_end = start + (gl.maximum(gl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N
        n_pairs = (full_end - start) // BLOCK_N // 2
        pt = PageTable + b.to(gl.int64) * stride_ptb

        q_lat = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_LAT], smem_layout)
        q_pe = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_PE], smem_layout)
        k_lat = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_LAT], smem_layout)
        k_pe = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_PE], smem_layout)
        m_a_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec_layout)  # the max after S_0 (WG0)
        m_b_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec_layout)  # ... after S_1 (WG1)
        l0_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec_layout)  # each warpgroup's row sums
        l1_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec_layout)
        sbars0 = (_new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(),
                  _new_bar())
        sbars1 = (_new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(),
                  _new_bar())
        empty0 = _new_bar(2)
        empty1 = _new_bar(2)
        p0_ready = _new_bar()
        p1_ready = _new_bar()
        q_bar = _new_bar()
        fin_bar = _new_bar(2)
        fence_async_shared()
        _cta_barrier()

        gl.warp_specialize(
            [
                (_ss_warpgroup, (Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                                 stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages,
                                 num_pages, stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb,
                                 stride_lt, stride_lh, stride_ls, T, H, KvLens, TreeLens, num_splits, stride_mb,
                                 n_pairs, q_lat, q_pe, k_lat, k_pe, sbars0, empty0, empty1, p0_ready, p1_ready,
                                 q_bar, fin_bar, m_a_smem, m_b_smem, l0_smem, l1_smem,
                                 0, PAGE_SIZE, SINGLE_SPLIT, BLOCK_M, BLOCK_N, D_LAT, D_PE)),
                (_ss_warpgroup, (Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                                 stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages,
                                 num_pages, stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb,
                                 stride_lt, stride_lh, stride_ls, T, H, KvLens, TreeLens, num_splits, stride_mb,
                                 n_pairs, q_lat, q_pe, k_lat, k_pe, sbars1, empty0, empty1, p0_ready, p1_ready,
                                 q_bar, fin_bar, m_a_smem, m_b_smem, l0_smem, l1_smem,
                                 1, PAGE_SIZE, SINGLE_SPLIT, BLOCK_M, BLOCK_N, D_LAT, D_PE)),
                (_ss_producer, (kv_desc, KV, k_lat, k_pe, sbars0, sbars1, empty0, empty1, pt, start, n_pairs,
                                stride_kvs, max_pages, num_pages, PAGE_SIZE, L2_PREFETCH, D_LAT, BLOCK_N)),
            ],
            [4, PRODUCER_WARPS],
            [CONSUMER_REGS, PRODUCER_REGS],
        )


L2_PREFETCH = True


def launch_verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                           sm_scale, num_splits, split: bool = False, probe: int = 0, colsplit: bool = False):
    """``launch_verify_gluon(..., seesaw=True)`` with the warp-specialized kernel (page sizes that are a
    multiple of 64 only); ``split``: each warpgroup a partition of its own (``_verify_gluon_ss_kernel``).
    Returns the compiled kernel."""
    _check(q, kv, num_splits)
    if kv.shape[1] % BLOCK_N:
        raise ValueError(f"the warp-specialized Gluon verify kernel needs a page size that is a multiple of {BLOCK_N}, "
                         f"got {kv.shape[1]}")
    B, T, H, _ = q.shape
    M = T * H
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    grid = (triton.cdiv(M, BLOCK_M), int(num_splits), B)
    desc = kv_descriptor(kv)
    kernel, extra = _kernel_and_options(split)
    if probe:
        extra["PROBE"] = int(probe)
    if colsplit:
        extra["COLSPLIT"] = True
    return kernel[grid](
        q, kv, desc, desc, page_table, kv_lens, tree_mask, tree_lens,
        dst_o, dst_l,
        float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        kv.stride(0), kv.stride(1),
        page_table.stride(0), page_table.shape[1], kv.shape[0],
        tree_mask.stride(0), tree_mask.stride(1),
        *o_strides,
        *l_strides,
        T, H, int(num_splits),
        PAGE_SIZE=kv.shape[1], SINGLE_SPLIT=int(num_splits) == 1, L2_PREFETCH=L2_PREFETCH,
        PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_LAT=D_LAT, D_PE=D_PE, **extra,
    )


def _kernel_and_options(split: bool):
    """The kernel and its launch-only options: the split kernel's 4 warps are warpgroup 0 (warpgroup 1
    and the producer are worker partitions), the other's 8 are both consumer warpgroups."""
    if split:
        return _verify_gluon_ss_kernel, {"CONSUMER_REGS": CONSUMER_REGS, "num_warps": 4}
    return _verify_gluon_ws_kernel, {"num_warps": NUM_WARPS}


def verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, num_splits=1, out=None,
                    lse=None, split=False):
    """``verify_gluon(..., seesaw=True)`` with the warp-specialized kernel: ``(out, lse)``."""
    from ._splitkv import combine_splits, split_destinations

    B, T, H, _ = q.shape
    if out is None:
        out = torch.empty(B, T, H, D_LAT, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H)
    launch_verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                           sm_scale, num_splits, split)
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse)
    return out, lse


# --------------------------------------------------------------------------------------------------
# AOT compile check (CPU machine, sm_90 target)
# --------------------------------------------------------------------------------------------------

def compile_for_sm90_ws(num_splits: int, page_size: int = 64, partial_dtype: str = "fp32",
                        producer_regs: int = PRODUCER_REGS, split: bool = False):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    if page_size % BLOCK_N:
        raise ValueError(f"page size must be a multiple of {BLOCK_N}, got {page_size}")
    fn, options = _kernel_and_options(split)
    constexpr_extra = {k: v for k, v in options.items() if k != "num_warps"}
    layout = _kv_smem_layout()
    desc = f"tensordesc<bf16[{BLOCK_N},64],{layout!r}>"
    sig = {
        "Q": "*bf16", "KV": "*bf16", "kv_desc": desc, "kv_desc3": desc,
        "PageTable": "*i32", "KvLens": "*i32", "TreeMask": "*i32", "TreeLens": "*i32",
        "Out": "*bf16" if num_splits == 1 else f"*{partial_dtype}", "Lse": "*fp32", "sm_scale_log2e": "fp32",
    }
    ints = ["stride_qb", "stride_qt", "stride_qh", "stride_kvp", "stride_kvs", "stride_ptb", "max_pages",
            "num_pages", "stride_mb", "stride_mt", "stride_ob", "stride_ot", "stride_oh", "stride_os",
            "stride_lb", "stride_lt", "stride_lh", "stride_ls", "T", "H", "num_splits"]
    sig.update({n: "i32" for n in ints})
    constexprs = {"PAGE_SIZE": page_size, "SINGLE_SPLIT": num_splits == 1, "L2_PREFETCH": L2_PREFETCH,
                  "PRODUCER_WARPS": PRODUCER_WARPS, "PRODUCER_REGS": producer_regs, "BLOCK_M": BLOCK_M,
                  "BLOCK_N": BLOCK_N, "D_LAT": D_LAT, "D_PE": D_PE, **constexpr_extra}
    if not split:
        constexprs = {"PROBE": 0, "COLSPLIT": False, **constexprs}
    for k in constexprs:
        sig[k] = "constexpr"
    names = fn.arg_names
    divisible = ("Q", "KV", "PageTable", "KvLens", "TreeMask", "TreeLens", "Out", "Lse", "stride_qb", "stride_qt",
                 "stride_qh", "stride_kvp", "stride_kvs", "stride_ob", "stride_ot", "stride_oh", "stride_os")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": options["num_warps"]})


def _nvdisasm():
    import triton as _t

    cands = [os.path.join(os.path.dirname(_t.__file__), "backends", "nvidia", "bin", "nvdisasm"),
             "/tmp/tri36/triton/backends/nvidia/bin/nvdisasm"]
    for c in cands:
        if os.path.exists(c):
            return c
    return None


def sass_counts(cubin: bytes) -> dict[str, int] | None:
    """Barrier / TMA instruction counts of the SASS (``None`` without nvdisasm). ``BAR.SYNC cta``: no
    thread count (all the CTA's threads; in the warp-specialized kernel these are barrier 1, the
    region's fork / join); ``BAR.SYNC named``: with a thread count (one partition), of which 256
    threads (the consumers) and 128 (the producer)."""
    tool = _nvdisasm()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        text = subprocess.run([tool, "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    ins = [ln.split("*/")[-1] if "*/" in ln else ln for ln in text.splitlines()]
    bar_sync = [s for s in ins if re.search(r"\bBAR\.SYNC", s)]
    named = [s for s in bar_sync if re.search(r"BAR\.SYNC[.\w]*\s+\S+\s*,\s*\S+", s)]
    n256 = sum(bool(re.search(r",\s*0x100\b", x)) for x in named)
    n128 = sum(bool(re.search(r",\s*0x80\b", x)) for x in named)
    return {
        "BAR.SYNC": len(bar_sync),
        "BAR.SYNC cta": len(bar_sync) - len(named),
        "BAR.SYNC named": len(named),
        "(256 thr)": n256,
        "(128 thr)": n128,
        "BAR.ARV": sum(bool(re.search(r"\bBAR\.ARV", s)) for s in ins),
        "UTMALDG": sum(bool(re.search(r"\bUTMALDG", s)) for s in ins),
        "SETMAXREG": sum(bool(re.search(r"SETMAXREG", s)) for s in ins),
        # the register counts setmaxnreg asks for (producer / consumers); cuobjdump's REG is the launch's
        "maxnreg": "/".join(str(int(v, 16)) for v in sorted(
            set(re.findall(r"SETMAXREG\.\S+\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)", text)), key=lambda v: int(v, 16))) or "-",
        "_text": text,
    }


def _fmt_counts(c):
    if c is None:
        return "(no nvdisasm)"
    return " ".join(f"{k}={v}" for k, v in c.items() if not k.startswith("_"))


def _main():
    from .aot import resource_usage

    if not GLUON_AVAILABLE:
        raise SystemExit(f"gluon unavailable: {_IMPORT_ERROR!r}")
    compare = "--compare" in sys.argv
    dump = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--dump=")), None)
    ok = True
    print(f"triton {triton.__version__}", flush=True)
    for split, splits, P in [(sp, n, P) for sp in (False, True) for n in (1, 2) for P in (64, 128)]:
        if True:
            name = "_verify_gluon_ss_kernel" if split else "_verify_gluon_ws_kernel"
            tag = f"splits={'1' if splits == 1 else 'N'} P={P:3d}"
            try:
                k = compile_for_sm90_ws(splits, P, split=split)
            except Exception as e:  # noqa: BLE001
                print(f"{name} sm_90 {tag} COMPILE FAILED: {type(e).__name__}: {str(e)[:3000]}",
                      flush=True)
                ok = False
                continue
            use = resource_usage(k.asm["cubin"])
            spill = use.get("LOCAL", 0) + use.get("STACK", 0)
            shared = int(k.metadata.shared)
            good = shared <= SMEM_LIMIT_SM90
            ok &= good
            counts = sass_counts(k.asm["cubin"])
            if dump and counts is not None:
                os.makedirs(dump, exist_ok=True)
                base = os.path.join(dump, f"{'ss' if split else 'ws'}_s{splits}_p{P}")
                with open(base + ".sass", "w") as f:
                    f.write(counts["_text"])
                with open(base + ".ptx", "w") as f:
                    f.write(k.asm["ptx"])
                with open(base + ".ttgir", "w") as f:
                    f.write(k.asm["ttgir"])
            status = "ok" if good and spill == 0 else ("ok (spills)" if good else "FAIL")
            print(f"{name} sm_90 {tag} shared {shared:7d}/{SMEM_LIMIT_SM90} "
                  f"regs {use.get('REG', 0):3d} spill {spill:5d}  {status}  {_fmt_counts(counts)}", flush=True)
            if compare and not split:
                from ._verify_gluon import compile_for_sm90

                r = compile_for_sm90(splits, False, P, seesaw=True)
                ruse = resource_usage(r.asm["cubin"])
                rc = sass_counts(r.asm["cubin"])
                if dump and rc is not None:
                    with open(os.path.join(dump, f"seesaw_s{splits}_p{P}.sass"), "w") as f:
                        f.write(rc["_text"])
                print(f"  reference seesaw      {tag} shared {int(r.metadata.shared):7d} regs {ruse.get('REG', 0):3d} "
                      f"spill {ruse.get('LOCAL', 0) + ruse.get('STACK', 0):5d}  {_fmt_counts(rc)}", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    _main()
