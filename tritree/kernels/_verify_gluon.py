"""Hopper (sm_90) Gluon version of the tree-masked MLA verify attention (``_verify_mla_kernel``).

Same semantics, split-KV chunking and output / partial format as the Triton kernel; the caller runs
``_splitkv.combine_splits`` when there are several splits. What Triton cannot express, and this
kernel does (FA3-style, one CTA of 8 warps = 2 warpgroups per 64 rows):

* Q (64 x 576) sits in shared memory for the whole program; the KV pool is read by TMA into a ring
  of two 64 x 576 slots (128-byte swizzle), tile j+1 in flight while j computes. The pool is one
  ``[num_pages * P, 576]`` matrix; a tile is a page-local row range (P % 64 == 0, chunks start on
  page boundaries). Page ids are fetched one tile ahead of the TMA that needs them. ``TMA3D`` (the
  default): a tile is 2 copies, not 9 (the compiler puts a CTA barrier before each): the latent part
  as one box ``[8, 64, 64]`` of the pool viewed as ``[9 column blocks, rows, 64]`` (strides
  ``[64, 576, 1]``), which lands as the 8 contiguous 64-wide column blocks of the swizzled
  ``[64, 512]`` slot, plus the rope box (a 9-block box is refused: box dims must be powers of two).
  The launcher falls back to 9 boxes if the driver refuses the descriptor.
* Scores: ``S = Q_lat K_lat^T + Q_pe K_pe^T`` (m64 n64, k512 + k64; shared-memory shapes must be
  powers of two, so latent and rope parts are separate buffers) in an MMA layout with warps
  ``[4, 2]``: each warpgroup computes its own 32 keys (no duplicated score work, unlike Triton's
  ``[8, 1]`` for a dot that feeds a dot). Row max and row sum cross the warpgroups (reductions
  through shared memory); an element-wise running sum would cost 16 registers the overlap lacks.
* P (bf16) goes to a 64 x 64 shared buffer that is the A operand of ``O += P @ V`` (m64 n512 k64,
  warps ``[4, 2]``: each warpgroup owns 256 output columns, 128 fp32 registers per thread). V is the
  latent part of the same slot: each tile is read once. (P as a register operand costs 16 more
  registers per thread, and the buffer is free anyway by the time the next P is written.)
* ``OVERLAP``: the wgmmas are asynchronous; per tile: issue ``QK_{j+1}``, issue ``PV_j``, wait for
  QK only, run tile j+1's softmax on the CUDA cores while ``PV_j`` runs, then wait for PV. With two
  slots, tile j+2's copy can only start once ``PV_j`` is done and ``QK_{j+2}`` is issued right after:
  the copy is exposed unless L2 serves it fast. The plain schedule issues it at the same point but
  consumes it a whole tile later. (Three slots would fix this but do not fit in shared memory.)
* The masked tail (the last partial prefix tile and the tree keys, 1-3 tiles) is copied with masked
  cp.async (rows past ``end`` zero-filled: a key past the request may hold NaN, and 0 * NaN would
  reach O; no data passes through the registers that hold O), then the same compute with the tree
  mask applied to S as -inf (3 mask words per row cover a tile).

* ``SEESAW`` (FlashMLA-style tile pairs): the two slots are rows 0..63 / 64..127 of one
  ``[128, 576]`` pair buffer, so the scores of a pair are one m64 n128 wgmma with warps ``[4, 2]``:
  warpgroup w computes all 64 keys of tile w (n64 each, instead of n32 over one tile, which was
  shared-memory bound). It streams per 64-channel column block (one mbarrier per block covering
  both slots), so it starts as soon as block 0 has landed. Row max / sum cross the warpgroups (the
  exchange); P (64 x 128 bf16) is written over the pair's rope rows (dead once the scores are done:
  a ``[128, 64]`` swizzled buffer is byte for byte the two column blocks of a ``[64, 128]`` one);
  then ``O += P_0 V_0`` and ``O += P_1 V_1`` (each warpgroup its 256 columns) as two async wgmmas:
  slot 0 is refilled as soon as ``P_0 V_0`` is done, under ``P_1 V_1``, slot 1 after it. An odd
  leftover full tile and the masked tail take the one-tile tail path in rows 0..63.

* ``GATHER`` (derived: ``PAGE_SIZE < 64``, any power of two 1..32; token-granular pools as SGLang keeps
  tree KV): a tile spans several pages, so full tiles are not TMA boxes but cp.async row gathers
  (``_gather_tile``: the masked tail's copy without the mask; row r of the tile at key n is
  ``page_table[b, (n + r) // P] * stride_kvp + ((n + r) % P) * stride_kvs``, 16-byte vectors), into the
  same ring. Page ids (one int32 per row, clamped like the Triton kernel) are fetched one tile (pair)
  ahead. Plain: one cp.async group per tile, one group committed per iteration (empty ones too), so
  ``wait_group(1)`` = "tile j landed" while tile j+1's copies fly. SEESAW: 9 groups per slot (one per
  column block); the scores stream per block with ``wait_group(8 - c)`` + fence + CTA barrier
  (``_qk_streamed_gather``) instead of the mbarriers. Chunks are tile-aligned
  (``cdiv(cdiv(n_keys, splits), 64) * 64``: the Triton kernel's non-hoisted rule). No overlapped schedule
  (the launcher runs the plain one) and no descriptor is read (one is still passed).

Shared memory: Q 73,728 + 2 slots 147,456 + P 8,192 = 229,376 bytes (+ barriers and reduction
scratch) of the 232,448 an H200 CTA may use: one CTA per SM.

Above 64 rows (P % 64 == 0) and above 16 rows for smaller pages, ``verify_mla`` runs the SEESAW's
warp-specialised form instead (``_verify_gluon_ws.py``: a producer partition issues
the copies or gathers the rows, ``O += P V`` by column halves), which shares this file's helpers.

Targets triton 3.6 Gluon (the H200 machine); the names that changed by 3.9 (TMA load, cp.async,
CTA barrier) are resolved at import so the file compiles with both.
"""

from __future__ import annotations

import os

import torch
import triton

from ._splitkv import LOG2E, merge_pdl

GLUON_AVAILABLE = False
_IMPORT_ERROR: Exception | None = None
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # triton 3.6: tma.async_copy_global_to_shared / async_copy_shared_to_global,
    # async_copy.async_copy_global_to_shared, gl.thread_barrier; 3.9: tma.async_load / async_store,
    # async_copy.async_load, gl.barrier (the old names raise there).
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # Shared-memory reinterpretation is ``_reinterpret`` on 3.6 and ``reinterpret`` on 3.9: the kernel
    # calls ``_reinterpret``; on 3.9 that name is added as an alias of the same builtin.
    if not hasattr(gl.shared_memory_descriptor, "_reinterpret"):
        gl.shared_memory_descriptor._reinterpret = gl.shared_memory_descriptor.reinterpret
    GLUON_AVAILABLE = True
except Exception as e:  # pragma: no cover - depends on the installed triton
    _IMPORT_ERROR = e

BLOCK_M = 64
BLOCK_N = 64
D_LAT = 512
D_PE = 64
D_QK = D_LAT + D_PE
NUM_WARPS = 8
# Page sizes below one tile: full tiles are cp.async row gathers (the kernel's GATHER path), not TMA.
GATHER_PAGE_SIZES = (1, 2, 4, 8, 16, 32)
SMEM_LIMIT_SM90 = 232_448


def _kv_smem_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


if GLUON_AVAILABLE:

    @gluon.jit
    def _issue_tile(kv_desc, lat_smem, pe_smem, bars, slot, row, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
        """TMA of one 64 x 576 KV tile (rows ``row .. row+63`` of the pool) into ``slot``: 9 boxes of
        64 x 64 (a 128-byte swizzled box is at most 64 bf16 wide)."""
        bar = bars.index(slot)
        dst = lat_smem.index(slot)
        mbarrier.expect(bar, (D_LAT + 64) * BLOCK_N * 2)
        for c in gl.static_range(D_LAT // 64):
            _tma_load(kv_desc, [row, c * 64], bar, dst.slice(c * 64, 64, dim=1))
        _tma_load(kv_desc, [row, D_LAT], bar, pe_smem.index(slot))

    @gluon.jit
    def _issue_tile3(kv_desc, kv_desc3, lat3, pe_smem, bars, slot, row, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
        """TMA of one 64 x 576 KV tile into ``slot`` with two copies: the latent part as ONE 3-D box
        ``[8 column blocks, 64 rows, 64 cols]`` of the pool viewed as ``[9, rows, 64]`` (strides
        ``[64, 576, 1]``), which lands as the 8 contiguous 64-wide column blocks of a 128-byte swizzled
        ``[64, 512]`` tile; the rope part as one 64 x 64 box of the 2-D view."""
        bar = bars.index(slot)
        mbarrier.expect(bar, (D_LAT + 64) * BLOCK_N * 2)
        _tma_load(kv_desc3, [0, row, 0], bar, lat3.index(slot))
        _tma_load(kv_desc, [row, D_LAT], bar, pe_smem.index(slot))

    @gluon.jit
    def _issue_pair_tile(kv_desc, lat_smem, pe_smem, cbars, half: gl.constexpr, row, D_LAT: gl.constexpr,
                         BLOCK_N: gl.constexpr):
        """SEESAW: TMA of one 64-key tile into rows ``64 half .. 64 half + 63`` of the pair buffers
        (``[128, 512]`` / ``[128, 64]``): 9 boxes of 64 x 64 (the rows of one tile are not contiguous
        in a 128-row swizzled buffer, so no single 3-D box). Column block c (c = 8: rope) completes
        on ``cbars[c]``, which counts both slots' boxes: slot 0's issue arms it for both (one arrival,
        16 KB), so the phase only completes once slot 1's box has landed too."""
        if half == 0:
            for c in gl.static_range(D_LAT // 64 + 1):
                mbarrier.expect(cbars[c], 2 * BLOCK_N * 64 * 2)
        for c in gl.static_range(D_LAT // 64):
            dst = lat_smem.slice(half * BLOCK_N, BLOCK_N, dim=0).slice(c * 64, 64, dim=1)
            _tma_load(kv_desc, [row, c * 64], cbars[c], dst)
        _tma_load(kv_desc, [row, D_LAT], cbars[D_LAT // 64], pe_smem.slice(half * BLOCK_N, BLOCK_N, dim=0))

    @gluon.jit
    def _prefetch_tile_l2(KV, row, stride_kvs, num_rows, thread_mask=-1):
        """Asks the L2 for the 64 pool rows from ``row`` (one bulk prefetch) a pair ahead of their TMA
        copies, so that a slot's refill, which the next scores wait for, is an L2 hit. Issued by the
        threads whose ``%tid.x & thread_mask`` is 0: thread 0 by default; 127 for a warp-specialised
        partition that does not hold thread 0 (the first thread of each of its warpgroups). Only for
        pools whose rows are contiguous (``stride_kvs`` = 576) and within the pool."""
        if (stride_kvs == 576) & (row + 64 <= num_rows):
            addr = KV + row.to(gl.int64) * 576
            gl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; and.b32 t, t, $2; setp.eq.u32 p, t, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], 73728; mov.u32 $0, 0; }",
                "=r,l,r", [addr, thread_mask], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _wait_prior_grid(any_int):
        """Programmatic dependent launch: wait until the grids this one depends on have completed and their
        writes are visible (``griddepcontrol.wait``; returns at once for a launch without ``launch_pdl``).
        Before any global read of anything a prior kernel may write. ``any_int``: a scalar for the asm's
        operand list."""
        gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [any_int],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _launch_dependents(any_int):
        """Programmatic dependent launch: the next grid (the split merge, launched with ``launch_pdl``)
        may be placed now; it waits for this grid's writes itself. A no-op for other launches.
        ``any_int``: a scalar for the asm's operand list."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [any_int],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _now(any_int):
        """``%globaltimer_lo`` (ns, wraps every 4.3 s): one stamp of ``TIMELINE``. ``any_int``: a
        scalar for the asm's operand list."""
        return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r,r", [any_int], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _clock(any_int):
        """``%clock`` (SM cycles, low 32 bits): ``TIMELINE=2``'s clock stamps."""
        return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [any_int], dtype=gl.int32, is_pure=False,
                                         pack=1)

    @gluon.jit
    def _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, t4,
                        BLOCK_M: gl.constexpr):
        """``TIMELINE`` (bench only, wrong lse): the program's five stamps over its first five lse slots."""
        _cta_barrier()  # after every thread's own lse store
        base = Lse + b.to(gl.int64) * stride_lb + pid_s * stride_ls + (pid_m * BLOCK_M) * stride_lh
        gl.store(base, t0.to(gl.float32, bitcast=True))
        gl.store(base + stride_lh, t1.to(gl.float32, bitcast=True))
        gl.store(base + 2 * stride_lh, t2.to(gl.float32, bitcast=True))
        gl.store(base + 3 * stride_lh, t3.to(gl.float32, bitcast=True))
        gl.store(base + 4 * stride_lh, t4.to(gl.float32, bitcast=True))

    @gluon.jit
    def _new_bar():
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        return bar

    @gluon.jit
    def _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, phase, s_zero, D_LAT: gl.constexpr,
                     TRANSPOSED: gl.constexpr = False):
        """SEESAW scores ``[Q K_0^T | Q K_1^T]`` (m64 n128: warpgroup w computes tile w's 64 keys), one
        async wgmma per 64-channel column block, each issued as soon as that block of both slots has
        landed: the QK streams behind the refill instead of waiting for all of it. ``TRANSPOSED``: the
        scores' transpose ``K Q^T`` (m128, N = Q's rows; the ws kernel's narrow row block)."""
        gl.static_assert(D_LAT // 64 >= 1)
        s = s_zero
        for c in gl.static_range(D_LAT // 64 + 1):
            mbarrier.wait(cbars[c], phase)
            if c < D_LAT // 64:
                q_c = q_lat.slice(c * 64, 64, dim=1)
                k_c = k_lat.slice(c * 64, 64, dim=1)
            else:  # the rope block
                q_c = q_pe
                k_c = k_pe
            if TRANSPOSED:
                s = warpgroup_mma(k_c, q_c.permute([1, 0]), s, use_acc=c > 0, is_async=True)
            else:
                s = warpgroup_mma(q_c, k_c.permute([1, 0]), s, use_acc=c > 0, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=[s])

    @gluon.jit
    def _page_row(PageTable, page_base, n, max_pages, num_pages, PAGE_SIZE: gl.constexpr):
        """Pool row of key ``n`` (page id clamped into the pool, as the Triton kernel does)."""
        col = gl.minimum(n // PAGE_SIZE, max_pages - 1)
        page = gl.load(PageTable + page_base + col)
        page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
        return page * PAGE_SIZE + n % PAGE_SIZE

    @gluon.jit
    def _softmax(s, m_i, l_i, sm_scale_log2e, KEYS_AXIS: gl.constexpr = 1):
        """Online softmax of one tile of scores (already masked with -inf where invisible). The row
        max and sum cross the two warpgroups (a reduction through shared memory). ``KEYS_AXIS`` = 0:
        transposed scores (a row's keys down its column)."""
        s = s * sm_scale_log2e
        m_new = gl.maximum(m_i, gl.max(s, KEYS_AXIS))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - gl.expand_dims(m_safe, KEYS_AXIS))
        l_i = l_i * alpha + gl.sum(p, KEYS_AXIS)
        return p.to(gl.bfloat16), alpha, m_new, l_i

    @gluon.jit
    def _tail_mask(s, n, end, kv_len, tree_len, row_ok, t, mask_base, stride_mt, s_layout: gl.constexpr,
                   BLOCK_N: gl.constexpr):
        """-inf where key ``n + c`` is past ``end`` or is a tree key whose ancestor bit is clear. A tile's
        ``BLOCK_N`` tree keys span at most ``BLOCK_N / 32 + 1`` mask words: that many row-vector loads,
        not one pointer per score."""
        words = _tail_mask_words(n, kv_len, tree_len, row_ok, t, mask_base, stride_mt, BLOCK_N)
        return _tail_mask_apply(s, words, n, end, kv_len, row_ok, s_layout, BLOCK_N)

    @gluon.jit
    def _tail_mask_words(n, kv_len, tree_len, row_ok, t, mask_base, stride_mt, BLOCK_N: gl.constexpr):
        """The tree-mask words ``_tail_mask`` needs for keys ``n .. n+63``: ``BLOCK_N / 32 + 1`` row vectors,
        loaded (and not yet used: a caller can issue them ahead of the tile's copy and scores)."""
        w0 = gl.maximum(n - kv_len, 0) // 32
        row_ptr = mask_base + t * stride_mt + w0
        words = (gl.load(row_ptr, mask=row_ok & (w0 * 32 < tree_len), other=0),)
        for k in gl.static_range(1, BLOCK_N // 32 + 1):
            words = words + (gl.load(row_ptr + k, mask=row_ok & ((w0 + k) * 32 < tree_len), other=0),)
        return words

    @gluon.jit
    def _tail_mask_apply(s, words, n, end, kv_len, row_ok, s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
        """``_tail_mask`` with its words loaded (``_tail_mask_words``)."""
        keys = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        k_ok = keys < end
        j = gl.maximum(keys - kv_len, 0)
        w0 = gl.maximum(n - kv_len, 0) // 32
        jw = gl.expand_dims(j // 32 - w0, 0)
        word = gl.expand_dims(words[0], 1)
        for k in gl.static_range(1, BLOCK_N // 32 + 1):
            word = gl.where(jw == k, gl.expand_dims(words[k], 1), word)
        bit = (word >> gl.expand_dims(j % 32, 0)) & 1
        in_tree = gl.expand_dims((keys >= kv_len) & k_ok, 0)
        visible = (gl.expand_dims((keys < kv_len) & k_ok, 0) | (in_tree & (bit != 0))) & gl.expand_dims(row_ok, 1)
        return gl.where(visible, s, float("-inf"))

    @gluon.jit
    def _load_tail_tile(KV, PageTable, page_base, n, end, max_pages, num_pages, stride_kvp, stride_kvs, dst_blocks,
                        blk0, dst_pe, ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr,
                        BLOCK_N: gl.constexpr):
        """Keys ``n .. n+63`` into a slot by masked cp.async (rows past ``end`` zero-filled: no data
        passes through registers, which hold O here). ``dst_blocks``: the slot's latent part as
        ``[8 column blocks, >= 64 rows, 64]`` (rows 0..63 written); a runtime loop over the blocks keeps
        one block's pointers live at a time (an unrolled one spilled them on triton 3.6)."""
        keys = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        k_ok = keys < end
        col = gl.minimum(keys // PAGE_SIZE, max_pages - 1)
        page = gl.load(PageTable + page_base + col, mask=k_ok, other=0)
        page = gl.minimum(gl.maximum(page, 0), num_pages - 1).to(gl.int64)
        tok = KV + gl.expand_dims(page * stride_kvp + (keys % PAGE_SIZE).to(gl.int64) * stride_kvs, 1)
        d = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
        ok = gl.expand_dims(k_ok, 1)
        ok = ok & (d >= 0)  # full [64, 64] mask
        for c in range(D_LAT // 64):
            _cp_async(dst_blocks.index(blk0 + c).slice(0, BLOCK_N, dim=0), tok + (c * 64 + d), mask=ok)
        _cp_async(dst_pe, tok + (D_LAT + d), mask=ok)
        async_copy.commit_group()
        async_copy.wait_group(0)

    @gluon.jit
    def _qk(q_lat, q_pe, k_lat, k_pe, s_zero, IS_ASYNC: gl.constexpr):
        """``S = Q_lat K_lat^T + Q_pe K_pe^T`` (m64 n64, K = 512 + 64), operands in shared memory."""
        s = warpgroup_mma(q_lat, k_lat.permute([1, 0]), s_zero, use_acc=False, is_async=IS_ASYNC)
        return warpgroup_mma(q_pe, k_pe.permute([1, 0]), s, is_async=IS_ASYNC)

    @gluon.jit
    def _publish_p(p, alpha, o, p_smem, o_layout: gl.constexpr):
        """P (bf16) into the shared buffer that is the A operand of ``O += P @ V``; O rescaled.
        The caller has ensured that no wgmma still reads ``p_smem`` from the previous tile."""
        p_smem.store(p)
        fence_async_shared()  # generic-proxy writes before the wgmma (async proxy) reads them
        _cta_barrier()  # both warpgroups' halves of P written
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
        return o * gl.expand_dims(alpha_o, 1)

    @gluon.jit
    def _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE: gl.constexpr):
        """``_page_row`` with the batch's page-table row as one pointer (one live value, not two)."""
        col = gl.minimum(n // PAGE_SIZE, max_pages - 1)
        page = gl.load(pt + col)
        page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
        return page * PAGE_SIZE + n % PAGE_SIZE

    @gluon.jit
    def _gather_pages(pt, n, max_pages, num_pages, ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      BLOCK_N: gl.constexpr):
        """GATHER: page ids of keys ``n .. n+63`` (one int32 per row of the copy layout: 2 registers),
        fetched one tile (pair) ahead of the copies; column and page clamped like the Triton kernel."""
        keys = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        col = gl.minimum(keys // PAGE_SIZE, max_pages - 1)
        page = gl.load(pt + col)
        return gl.minimum(gl.maximum(page, 0), num_pages - 1)

    @gluon.jit
    def _gather_tile(KV, page, stride_kvp, stride_kvs, dst_blocks, blk0, row0: gl.constexpr, dst_pe,
                     ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr,
                     GROUP_PER_BLOCK: gl.constexpr):
        """GATHER: one full tile (keys ``n .. n+63``, ``n`` a multiple of 64, ``page`` from
        ``_gather_pages``) by unmasked cp.async row gathers (16-byte vectors) into rows ``row0 .. row0+63``
        of ``dst_blocks`` (``[column blocks, rows, 64]``, blocks ``blk0 .. blk0+7``) and ``dst_pe``: the
        masked tail's copy without the mask. Commits one cp.async group per tile, or one per 64-channel
        column block (``GROUP_PER_BLOCK``: 9 groups, so the consumer can stream per block)."""
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        tok = KV + gl.expand_dims(page.to(gl.int64) * stride_kvp + (r % PAGE_SIZE).to(gl.int64) * stride_kvs, 1)
        d = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
        for c in range(D_LAT // 64):
            _cp_async(dst_blocks.index(blk0 + c).slice(row0, BLOCK_N, dim=0), tok + (c * 64 + d))
            if GROUP_PER_BLOCK:
                async_copy.commit_group()
        _cp_async(dst_pe, tok + (D_LAT + d))
        async_copy.commit_group()

    @gluon.jit
    def _qk_streamed_gather(q_lat, q_pe, k_lat, k_pe, s_zero, D_LAT: gl.constexpr):
        """``_qk_streamed`` for cp.async-gathered pairs: slot 0 then slot 1 were committed as 9 groups
        each (one per column block), so column block c of both slots has landed once at most ``8 - c``
        groups are outstanding; each thread waits for its own copies, then a fence and a CTA barrier
        make everyone's visible to the wgmma (async proxy)."""
        NB: gl.constexpr = D_LAT // 64
        async_copy.wait_group(NB)
        fence_async_shared()
        _cta_barrier()
        s = warpgroup_mma(q_lat.slice(0, 64, dim=1), k_lat.slice(0, 64, dim=1).permute([1, 0]), s_zero,
                          use_acc=False, is_async=True)
        for c in gl.static_range(1, NB):
            async_copy.wait_group(NB - c)
            fence_async_shared()
            _cta_barrier()
            s = warpgroup_mma(q_lat.slice(c * 64, 64, dim=1), k_lat.slice(c * 64, 64, dim=1).permute([1, 0]), s,
                              is_async=True)
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
        s = warpgroup_mma(q_pe, k_pe.permute([1, 0]), s, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=[s])

    @gluon.jit
    def _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout: gl.constexpr,
                BLOCK_M: gl.constexpr, D_LAT: gl.constexpr, ZERO_PAD: gl.constexpr = False):
        """Issues the cp.async copies of the row block's queries into ``q_lat`` / ``q_pe`` (the caller
        commits and waits): all ten column blocks in flight at once. Loads through registers were
        issued one block ahead of their stores (triton 3.6 puts a CTA barrier between stores into one
        buffer), nine latencies in a row before the first score. Rows past the tree or past T*H are
        zero-filled (``ZERO_PAD``, predicated copies) or copy the request's first row (finite either
        way; such rows are never attended from or stored nonzero). ``ZERO_PAD`` because a row block
        with few real rows (T=17,H=8 or T=65,H=8: the last holds 8) otherwise sends every padding
        row's copies to the same 1,152 bytes (see ``Q_ZERO_PAD``)."""
        rows_ld = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
        t_ld = rows_ld // H
        h_ld = rows_ld % H
        ok_ld = (rows_ld < T * H) & (t_ld < tree_len)
        t_ld = gl.where(ok_ld, t_ld, 0)  # (clamping the indices, not the offset, keeps the strides' alignment)
        h_ld = gl.where(ok_ld, h_ld, 0)
        q_rows = gl.expand_dims(Q + b.to(gl.int64) * stride_qb + (t_ld * stride_qt + h_ld * stride_qh).to(gl.int64), 1)
        d_ld = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
        if ZERO_PAD:
            row_ok = gl.expand_dims(ok_ld, 1)
            for c in gl.static_range(D_LAT // 64):
                _cp_async(q_lat.slice(c * 64, 64, dim=1), q_rows + (c * 64 + d_ld), mask=row_ok)
            _cp_async(q_pe, q_rows + (D_LAT + d_ld), mask=row_ok)
        else:
            for c in gl.static_range(D_LAT // 64):
                _cp_async(q_lat.slice(c * 64, 64, dim=1), q_rows + (c * 64 + d_ld))
            _cp_async(q_pe, q_rows + (D_LAT + d_ld))

    @gluon.jit
    def _masked_tail(o, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV, PageTable, TreeMask,
                     b, pid_m, tail_start, end, kv_len, tree_len, T, H, stride_ptb, max_pages, num_pages, stride_kvp,
                     stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout: gl.constexpr, o_layout: gl.constexpr,
                     ld_layout: gl.constexpr, SEESAW: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Keys ``tail_start .. end`` (the prefix remainder and the tree keys), one masked tile at a time
        by pointer loads into slot 0 (the slots alternate; SEESAW: rows 0..63 of the pair buffers).
        Returns ``(o, m_i, l_i)``; the scores' row statistics in ``SliceLayout(1, s_layout)``."""
        s_zero, t, row_ok, mask_base = _tail_rows(TreeMask, b, pid_m, T, H, tree_len, stride_mb, s_layout, BLOCK_M,
                                                  BLOCK_N)
        for n in range(tail_start, end, BLOCK_N):
            p, alpha, m_i, l_i, tail_lat = _tail_tile_p(
                n, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, KV, PageTable, b, tail_start, end,
                kv_len, tree_len, row_ok, t, mask_base, stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs,
                stride_mt, sm_scale_log2e, s_zero, s_layout, ld_layout, SEESAW, PAGE_SIZE, D_LAT, BLOCK_N)
            o = _publish_p(p, alpha, o, p_smem, o_layout)
            o = warpgroup_mma(p_smem, tail_lat, o)
            _cta_barrier()
        return o, m_i, l_i

    @gluon.jit
    def _tail_rows(TreeMask, b, pid_m, T, H, tree_len, stride_mb, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr):
        """What every tile of the masked tail needs of its rows: ``(s_zero, t, row_ok, mask_base)``."""
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        t = rows // H
        row_ok = (rows < T * H) & (t < tree_len)
        return s_zero, t, row_ok, TreeMask + b.to(gl.int64) * stride_mb

    @gluon.jit
    def _tail_tile_p(n, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, KV, PageTable, b, tail_start, end,
                     kv_len, tree_len, row_ok, t, mask_base, stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs,
                     stride_mt, sm_scale_log2e, s_zero, s_layout: gl.constexpr, ld_layout: gl.constexpr,
                     SEESAW: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr,
                     EARLY_MASK: gl.constexpr = False):
        """One tile of the masked tail up to its P: keys ``n .. n+63`` copied (masked) into the tail slot,
        scores, mask, softmax. Returns ``(p, alpha, m_i, l_i, tail_lat)``; the caller publishes P and
        adds ``P V`` (V = ``tail_lat``). ``EARLY_MASK``: the tree-mask words are loaded before the tile's
        copy is issued, so that their latency passes under the copy's instead of after the scores."""
        # The tail's buffers are picked by a runtime index (the two slots alternate; SEESAW: rows
        # 0..63 via an index that is 0 at run time): wgmma descriptors of a loop-invariant buffer
        # are hoisted out of the loop by triton 3.6 and spilled there.
        if SEESAW:
            ts = (n < 0).to(gl.int32)
        else:
            ts = ((n - tail_start) // BLOCK_N) % 2
        tail_lat = tail_lat_v.index(ts).slice(0, BLOCK_N, dim=0)
        tail_pe = tail_pe_v.index(ts).slice(0, BLOCK_N, dim=0)
        if EARLY_MASK:
            words = _tail_mask_words(n, kv_len, tree_len, row_ok, t, mask_base, stride_mt, BLOCK_N)
        _load_tail_tile(KV, PageTable, b.to(gl.int64) * stride_ptb, n, end, max_pages, num_pages,
                        stride_kvp, stride_kvs, tail_blocks, ts * (D_LAT // 64), tail_pe, ld_layout, PAGE_SIZE,
                        D_LAT, BLOCK_N)
        fence_async_shared()
        _cta_barrier()
        s = _qk(q_lat, q_pe, tail_lat, tail_pe, s_zero, False)
        if EARLY_MASK:
            s = _tail_mask_apply(s, words, n, end, kv_len, row_ok, s_layout, BLOCK_N)
        else:
            s = _tail_mask(s, n, end, kv_len, tree_len, row_ok, t, mask_base, stride_mt, s_layout, BLOCK_N)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
        return p, alpha, m_i, l_i, tail_lat

    @gluon.jit
    def _row_scale(l_i, pid_m, T, H, tree_len, row_layout: gl.constexpr, BLOCK_M: gl.constexpr):
        """Per row of a row block (``row_layout``, a slice layout): ``(rows, row_in, has, l_safe, inv)``:
        the packed row index, whether it exists (< T*H), whether it has a query with a visible key, the
        softmax sum made safe to divide by, and the output scale (1 / l, or 0 for padding / empty rows)."""
        l_i = gl.convert_layout(l_i, row_layout)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        row_in = rows < T * H
        has = (l_i > 0.0) & row_in & (rows // H < tree_len)
        l_safe = gl.where(has, l_i, 1.0)
        inv = gl.where(has, 1.0 / l_safe, 0.0)
        return rows, row_in, has, l_safe, inv

    @gluon.jit
    def _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, o_layout: gl.constexpr, SINGLE_SPLIT: gl.constexpr,
                 BLOCK_M: gl.constexpr, D_OUT: gl.constexpr, COL0: gl.constexpr = 0, STORE_LSE: gl.constexpr = True,
                 COALESCED: gl.constexpr = False, WARPS: gl.constexpr = 8, PRESCALED: gl.constexpr = False):
        """``_splitkv.store_rows`` semantics: ``out``/``lse`` (natural log) with one split, else the
        split's partial rows (in the destination's dtype) and log2 lse; padding rows are zeros / -inf.
        ``o`` (``[BLOCK_M, D_OUT]``) is output columns ``COL0 .. COL0 + D_OUT``; ``STORE_LSE``: also the lse.
        ``COALESCED``: ``o`` re-laid out through shared memory first (``WARPS`` warps), so that a warp's
        store covers 512 contiguous bytes of one row instead of 32-byte pieces of eight rows.
        ``PRESCALED``: ``o`` already carries the rows' scale (``_row_scale``'s ``inv``) and the cast: stored
        as it is."""
        if COALESCED:
            st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                                       warps_per_cta=[WARPS, 1], order=[1, 0])
            o = gl.convert_layout(o, st_layout)
        else:
            st_layout: gl.constexpr = o_layout
        row_o_layout: gl.constexpr = gl.SliceLayout(1, st_layout)
        rows_o, row_in, has, l_safe, inv = _row_scale(l_i, pid_m, T, H, tree_len, row_o_layout, BLOCK_M)
        m_o = gl.convert_layout(m_i, row_o_layout)
        t_o = rows_o // H
        h_o = rows_o % H
        if not PRESCALED:
            o = o * gl.expand_dims(inv, 1)
        lse2 = gl.where(has, m_o + gl.log2(l_safe), float("-inf"))
        d = gl.expand_dims(COL0 + gl.arange(0, D_OUT, layout=gl.SliceLayout(0, st_layout)), 0)
        if SINGLE_SPLIT:
            o_row = b.to(gl.int64) * stride_ob + (t_o * stride_ot + h_o * stride_oh).to(gl.int64)
            gl.store(Out + gl.expand_dims(o_row, 1) + d, o.to(Out.dtype.element_ty), mask=gl.expand_dims(row_in, 1))
            if STORE_LSE:
                gl.store(Lse + b.to(gl.int64) * stride_lb + t_o * stride_lt + h_o * stride_lh,
                         lse2 * 0.6931471805599453, mask=row_in)
        else:
            # Partials in the destination's dtype (fp32 or a narrower one such as bf16); lse stays fp32.
            o_row = b.to(gl.int64) * stride_ob + pid_s.to(gl.int64) * stride_os + rows_o.to(gl.int64) * stride_oh
            gl.store(Out + gl.expand_dims(o_row, 1) + d, o.to(Out.dtype.element_ty), mask=gl.expand_dims(row_in, 1))
            if STORE_LSE:
                gl.store(Lse + b.to(gl.int64) * stride_lb + pid_s * stride_ls + rows_o * stride_lh, lse2, mask=row_in)

    @gluon.jit
    def _verify_gluon_kernel(
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
        OVERLAP: gl.constexpr,
        SEESAW: gl.constexpr = False,
        TMA3D: gl.constexpr = True,
        L2_PREFETCH: gl.constexpr = True,
        BLOCK_M: gl.constexpr = 64,
        BLOCK_N: gl.constexpr = 64,
        D_LAT: gl.constexpr = 512,
        D_PE: gl.constexpr = 64,
        PDL: gl.constexpr = False,
        TIMELINE: gl.constexpr = False,
        PAIR_CHUNKS: gl.constexpr = False,
        Q_FIRST: gl.constexpr = False,
        COALESCED_STORE: gl.constexpr = False,
        Q_ZERO_PAD: gl.constexpr = False,
    ):
        gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
        gl.static_assert(BLOCK_M == BLOCK_N, "SEESAW keeps P (BLOCK_M x 2 BLOCK_N) in the rope buffers")
        # GATHER (PAGE_SIZE < 64, token-granular pools): full tiles by cp.async row gathers, not TMA.
        GATHER: gl.constexpr = PAGE_SIZE < BLOCK_N
        gl.static_assert(GATHER or PAGE_SIZE % BLOCK_N == 0, "page size: a power of two < 64 or a multiple of 64")
        gl.static_assert(not (GATHER and OVERLAP), "the overlapped schedule is TMA-only")
        gl.static_assert(not (GATHER and TMA3D), "GATHER uses no TMA descriptor")
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        # SEESAW scores of a tile pair: warpgroup w computes all 64 keys of tile w (m64 n64 k576 each).
        s2_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                            instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, D_LAT // 2, 16])
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[8, 1], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        smem3_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
        if SEESAW:
            row_s_layout: gl.constexpr = gl.SliceLayout(1, s2_layout)
        else:
            row_s_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        pid_m = gl.program_id(0)
        pid_s = gl.program_id(1)
        b = gl.program_id(2)
        if TIMELINE:  # bench only: stamps at start, Q landed, prefix done, tail done, stored (see bench/timeline.py)
            t0 = _now(pid_s)
        if PDL:  # the merge may be placed now (one wave of programs: all of them have started)
            _launch_dependents(pid_s)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        n_keys = kv_len + tree_len
        if GATHER:
            # Pages no longer align chunks: tile-aligned chunks (the Triton kernel's non-hoisted rule).
            chunk = gl.cdiv(gl.cdiv(n_keys, num_splits), BLOCK_N) * BLOCK_N
        else:
            chunk = gl.cdiv(gl.cdiv(n_keys, num_splits), PAGE_SIZE) * PAGE_SIZE
        if PAIR_CHUNKS:
            # SEESAW: whole pairs per chunk, so no chunk but the last has an odd tile for the unpipelined
            # tail path, and the last chunk, which holds the masked tree keys, is the shortest.
            chunk = gl.cdiv(chunk, 2 * BLOCK_N) * (2 * BLOCK_N)
        start = pid_s * chunk
        end = gl.minimum(start + chunk, n_keys)
        full_end = start + (gl.maximum(gl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N
        n_full = (full_end - start) // BLOCK_N
        pt = PageTable + b.to(gl.int64) * stride_ptb

        # ---- shared memory (shapes must be powers of two: latent and rope parts apart) -----------
        q_lat = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_LAT], smem_layout)
        q_pe = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_PE], smem_layout)
        if SEESAW:
            # One pair of tiles: rows 0..63 = slot 0 (even tile), 64..127 = slot 1 (odd tile).
            k_lat = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_LAT], smem_layout)
            k_pe = gl.allocate_shared_memory(gl.bfloat16, [PAIR_N, D_PE], smem_layout)
            # P of the pair (64 x 128 bf16) overwrites the dead rope rows: a [128, 64] 128B-swizzled
            # buffer is, byte for byte, the two 64-wide column blocks of a [64, 128] one (block c =
            # rows 64c..64c+63), i.e. P_0 over slot 0's rope and P_1 over slot 1's.
            p2_smem = k_pe._reinterpret(gl.bfloat16, [BLOCK_M, PAIR_N], smem_layout)
            lat3 = k_lat  # unused
            # One barrier per 64-channel column block (8 latent + rope) of the pair, each its own
            # allocation: arming them back to back then needs no CTA barrier in between (the
            # compiler orders mbarrier operations on one allocation with a bar.sync).
            cbars = (_new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(), _new_bar(),
                     _new_bar())
            gl.static_assert(D_LAT // 64 + 1 == 9)
        else:
            if TMA3D:
                lat3 = gl.allocate_shared_memory(gl.bfloat16, [2, D_LAT // 64, BLOCK_N, 64], smem3_layout)
                k_lat = lat3._reinterpret(gl.bfloat16, [2, BLOCK_N, D_LAT], smem_layout)
            else:
                k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_LAT], smem_layout)
                lat3 = k_lat  # unused
            k_pe = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_PE], smem_layout)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], smem_layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        fence_async_shared()
        _cta_barrier()

        if Q_FIRST:  # Q's copies ahead of the first tiles' instead of queued behind them
            _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M,
                    D_LAT, Q_ZERO_PAD)
            async_copy.commit_group()
        # The first tiles in flight before Q is loaded; page rows are fetched one tile (pair) ahead.
        if GATHER:
            # Full tiles as cp.async groups (no mbarriers): plain = one group per tile, one committed
            # per iteration (empty ones included) so that ``wait_group(1)`` always means "tile j landed";
            # SEESAW = 9 groups per slot (one per column block), streamed by ``_qk_streamed_gather``.
            if SEESAW:
                g_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, PAIR_N, 64], smem_layout)
                n_pairs = n_full // 2
                if n_pairs > 0:
                    pg = _gather_pages(pt, start, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
                    _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, 0, 0, k_pe.slice(0, BLOCK_N, dim=0),
                                 ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, True)
                    pg = _gather_pages(pt, start + BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
                    _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, 0, BLOCK_N,
                                 k_pe.slice(BLOCK_N, BLOCK_N, dim=0), ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, True)
                next_pg = _gather_pages(pt, start + 2 * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
                next_pg1 = _gather_pages(pt, start + 3 * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE,
                                         BLOCK_N)
            else:
                g_blocks = k_lat._reinterpret(gl.bfloat16, [2 * (D_LAT // 64), BLOCK_N, 64], smem_layout)
                if n_full > 0:
                    pg = _gather_pages(pt, start, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
                    _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, 0, 0, k_pe.index(0), ld_layout,
                                 PAGE_SIZE, D_LAT, BLOCK_N, False)
                else:
                    async_copy.commit_group()
                if n_full > 1:
                    pg = _gather_pages(pt, start + BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
                    _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, D_LAT // 64, 0, k_pe.index(1), ld_layout,
                                 PAGE_SIZE, D_LAT, BLOCK_N, False)
                else:
                    async_copy.commit_group()
                next_pg = _gather_pages(pt, start + 2 * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
        elif SEESAW:
            row0 = _page_row_p(pt, start, max_pages, num_pages, PAGE_SIZE)
            row1 = _page_row_p(pt, start + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            n_pairs = n_full // 2
            fence_async_shared()
            _cta_barrier()
            if n_pairs > 0:
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 0, row0, D_LAT, BLOCK_N)
                _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 1, row1, D_LAT, BLOCK_N)
            next_row = _page_row_p(pt, start + 2 * BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            next_row1 = _page_row_p(pt, start + 3 * BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            if L2_PREFETCH:
                if n_pairs > 1:
                    _prefetch_tile_l2(KV, next_row, stride_kvs, num_pages * PAGE_SIZE)
                    _prefetch_tile_l2(KV, next_row1, stride_kvs, num_pages * PAGE_SIZE)
        else:
            row0 = _page_row_p(pt, start, max_pages, num_pages, PAGE_SIZE)
            row1 = _page_row_p(pt, start + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            if TMA3D:
                if n_full > 0:
                    _issue_tile3(kv_desc, kv_desc3, lat3, k_pe, bars, 0, row0, D_LAT, BLOCK_N)
                if n_full > 1:
                    _issue_tile3(kv_desc, kv_desc3, lat3, k_pe, bars, 1, row1, D_LAT, BLOCK_N)
            else:
                if n_full > 0:
                    _issue_tile(kv_desc, k_lat, k_pe, bars, 0, row0, D_LAT, BLOCK_N)
                if n_full > 1:
                    _issue_tile(kv_desc, k_lat, k_pe, bars, 1, row1, D_LAT, BLOCK_N)
            next_row = _page_row_p(pt, start + 2 * BLOCK_N, max_pages, num_pages, PAGE_SIZE)

        # ---- Q: row copies (rows are (t, h) pairs, not one strided matrix) ----------------------
        if not Q_FIRST:
            _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M,
                    D_LAT, Q_ZERO_PAD)
            async_copy.commit_group()
        # Also completes any KV row gathers committed before (GATHER); later groups count from here.
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s_layout)
        o = gl.zeros([BLOCK_M, D_LAT], gl.float32, layout=o_layout)
        if TIMELINE:
            t1 = _now(pid_s)

        if SEESAW:
            s2_zero = gl.zeros([BLOCK_M, PAIR_N], gl.float32, layout=s2_layout)
            # ---- committed prefix: pairs of full tiles, no mask ----------------------------------
            for i in range(n_pairs):
                if GATHER:
                    s = _qk_streamed_gather(q_lat, q_pe, k_lat, k_pe, s2_zero, D_LAT)
                else:
                    s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, i & 1, s2_zero, D_LAT)
                # Row max / sum cross the warpgroups (shared-memory reduction + barrier): after it,
                # every warpgroup's QK is complete and the rope rows are dead.
                p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                o = _publish_p(p, alpha, o, p2_smem, o_layout)
                # O[:, 256w:256w+256] += P_0 V_0[:, ...] (slot 0), then + P_1 V_1[:, ...] (slot 1), async:
                # slot 0 is refilled while P_1 V_1 runs.
                o = warpgroup_mma(p2_smem.slice(0, BLOCK_N, dim=1), k_lat.slice(0, BLOCK_N, dim=0), o,
                                  is_async=True)
                o = warpgroup_mma(p2_smem.slice(BLOCK_N, BLOCK_N, dim=1), k_lat.slice(BLOCK_N, BLOCK_N, dim=0), o,
                                  is_async=True)
                o = warpgroup_mma_wait(num_outstanding=1, deps=[o])
                _cta_barrier()  # both warpgroups are done with slot 0 (its V and P_0)
                if i + 1 < n_pairs:
                    if GATHER:
                        _gather_tile(KV, next_pg, stride_kvp, stride_kvs, g_blocks, 0, 0,
                                     k_pe.slice(0, BLOCK_N, dim=0), ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, True)
                    else:
                        _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 0, next_row, D_LAT, BLOCK_N)
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _cta_barrier()  # ... and with slot 1
                if i + 1 < n_pairs:
                    if GATHER:
                        _gather_tile(KV, next_pg1, stride_kvp, stride_kvs, g_blocks, 0, BLOCK_N,
                                     k_pe.slice(BLOCK_N, BLOCK_N, dim=0), ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, True)
                    else:
                        _issue_pair_tile(kv_desc, k_lat, k_pe, cbars, 1, next_row1, D_LAT, BLOCK_N)
                if GATHER:
                    next_pg = _gather_pages(pt, start + (2 * i + 4) * BLOCK_N, max_pages, num_pages, ld_layout,
                                            PAGE_SIZE, BLOCK_N)
                    next_pg1 = _gather_pages(pt, start + (2 * i + 5) * BLOCK_N, max_pages, num_pages, ld_layout,
                                             PAGE_SIZE, BLOCK_N)
                else:
                    next_row = _page_row_p(pt, start + (2 * i + 4) * BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                    next_row1 = _page_row_p(pt, start + (2 * i + 5) * BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                    if L2_PREFETCH:
                        if i + 2 < n_pairs:
                            _prefetch_tile_l2(KV, next_row, stride_kvs, num_pages * PAGE_SIZE)
                            _prefetch_tile_l2(KV, next_row1, stride_kvs, num_pages * PAGE_SIZE)
            for c in gl.static_range(D_LAT // 64 + 1):
                mbarrier.invalidate(cbars[c])

            # The masked tail (an odd leftover full tile, the prefix remainder, the tree keys) takes the
            # one-tile path below, in rows 0..63 of the pair buffers.
            m_i = gl.convert_layout(m_i, gl.SliceLayout(1, s_layout))
            l_i = gl.convert_layout(l_i, gl.SliceLayout(1, s_layout))
            tail_start = start + n_pairs * PAIR_N
            tail_lat_v = k_lat._reinterpret(gl.bfloat16, [1, PAIR_N, D_LAT], smem_layout)
            tail_pe_v = k_pe._reinterpret(gl.bfloat16, [1, PAIR_N, D_PE], smem_layout)
            tail_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, PAIR_N, 64], smem_layout)
        else:
            s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
            # ---- committed prefix: full tiles, no mask -------------------------------------------
            if OVERLAP:
                if n_full > 0:
                    mbarrier.wait(bars.index(0), 0)
                    s = _qk(q_lat, q_pe, k_lat.index(0), k_pe.index(0), s_zero, False)
                    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                    for j in range(n_full - 1):
                        slot = j % 2
                        nslot = 1 - slot
                        # P_j out of registers, O rescaled (no PV in flight, nobody reads p_smem).
                        o = _publish_p(p, alpha, o, p_smem, o_layout)
                        # QK_{j+1}, then PV_j, all asynchronous.
                        mbarrier.wait(bars.index(nslot), ((j + 1) // 2) & 1)
                        s_tok = _qk(q_lat, q_pe, k_lat.index(nslot), k_pe.index(nslot), s_zero, True)
                        o_tok = warpgroup_mma(p_smem, k_lat.index(slot), o, is_async=True)
                        # Only PV_j stays in flight: tile j+1's softmax runs under it.
                        s = warpgroup_mma_wait(num_outstanding=1, deps=[s_tok])
                        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                        o = warpgroup_mma_wait(num_outstanding=0, deps=[o_tok])
                        _cta_barrier()  # every warpgroup is done with slot j and with p_smem
                        if j + 2 < n_full:
                            if TMA3D:
                                _issue_tile3(kv_desc, kv_desc3, lat3, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
                            else:
                                _issue_tile(kv_desc, k_lat, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
                        next_row = _page_row_p(pt, start + (j + 3) * BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                    # PV of the last full tile.
                    o = _publish_p(p, alpha, o, p_smem, o_layout)
                    o = warpgroup_mma(p_smem, k_lat.index((n_full - 1) % 2), o)
                    _cta_barrier()
            elif GATHER:
                for j in range(n_full):
                    slot = j % 2
                    # Groups committed so far: tiles 0 .. j+1 (one each, maybe empty): tile j has landed
                    # once at most one is outstanding; then everyone's copies are made visible.
                    async_copy.wait_group(1)
                    fence_async_shared()
                    _cta_barrier()
                    s = _qk(q_lat, q_pe, k_lat.index(slot), k_pe.index(slot), s_zero, False)
                    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                    o = _publish_p(p, alpha, o, p_smem, o_layout)
                    o = warpgroup_mma(p_smem, k_lat.index(slot), o)
                    _cta_barrier()  # p_smem and the slot are free again: tile j+2 goes there
                    if j + 2 < n_full:
                        _gather_tile(KV, next_pg, stride_kvp, stride_kvs, g_blocks, slot * (D_LAT // 64), 0,
                                     k_pe.index(slot), ld_layout, PAGE_SIZE, D_LAT, BLOCK_N, False)
                    else:
                        async_copy.commit_group()
                    next_pg = _gather_pages(pt, start + (j + 3) * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE,
                                            BLOCK_N)
            else:
                for j in range(n_full):
                    slot = j % 2
                    mbarrier.wait(bars.index(slot), (j // 2) & 1)
                    s = _qk(q_lat, q_pe, k_lat.index(slot), k_pe.index(slot), s_zero, False)
                    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
                    o = _publish_p(p, alpha, o, p_smem, o_layout)
                    o = warpgroup_mma(p_smem, k_lat.index(slot), o)
                    _cta_barrier()  # p_smem and the slot are free again: tile j+2 goes there
                    if j + 2 < n_full:
                        if TMA3D:
                            _issue_tile3(kv_desc, kv_desc3, lat3, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
                        else:
                            _issue_tile(kv_desc, k_lat, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
                    next_row = _page_row_p(pt, start + (j + 3) * BLOCK_N, max_pages, num_pages, PAGE_SIZE)

            tail_start = full_end
            tail_lat_v = k_lat
            tail_pe_v = k_pe
            # Slot 0's 8 column blocks (blocks 0..7 of the ring) as a batch of [64, 64] buffers.
            tail_blocks = k_lat._reinterpret(gl.bfloat16, [2 * (D_LAT // 64), BLOCK_N, 64], smem_layout)

        # ---- masked tail: prefix remainder and tree keys (pointer loads into slot 0) -------------
        if TIMELINE:
            t2 = _now(pid_s)
        o, m_i, l_i = _masked_tail(o, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV, PageTable,
                                   TreeMask, b, pid_m, tail_start, end, kv_len, tree_len, T, H, stride_ptb, max_pages,
                                   num_pages, stride_kvp, stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout,
                                   o_layout, ld_layout, SEESAW, PAGE_SIZE, D_LAT, BLOCK_M, BLOCK_N)

        mbarrier.invalidate(bars.index(0))
        mbarrier.invalidate(bars.index(1))
        if TIMELINE:
            t3 = _now(pid_s)

        _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh, stride_os,
                 stride_lb, stride_lt, stride_lh, stride_ls, o_layout, SINGLE_SPLIT, BLOCK_M, D_LAT,
                 COALESCED=COALESCED_STORE, WARPS=8)
        if TIMELINE:
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, _now(pid_s), BLOCK_M)


def _check(q, kv, num_splits):
    if not GLUON_AVAILABLE:
        raise RuntimeError(f"triton.experimental.gluon is not available: {_IMPORT_ERROR!r}")
    num_pages, P, D = kv.shape
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise TypeError("the Gluon verify kernel takes bf16 q and kv")
    if q.shape[-1] != D_QK or D != D_QK:
        raise ValueError(f"the Gluon verify kernel needs 576 channels (512 + 64), got q {tuple(q.shape)}, "
                         f"kv {tuple(kv.shape)}")
    if P % BLOCK_N and P not in GATHER_PAGE_SIZES:
        raise ValueError(f"the Gluon verify kernel needs a page size that is a multiple of {BLOCK_N} or one of "
                         f"{GATHER_PAGE_SIZES}, got {P}")
    if P % BLOCK_N:  # gather path: rows addressed as page * stride(0) + slot * stride(1), 16-byte vectors
        if kv.stride(2) != 1 or (kv.stride(0) * 2) % 16 or (kv.stride(1) * 2) % 16 or kv.data_ptr() % 16:
            raise ValueError("the Gluon verify kernel needs 16-byte aligned pool rows (channel stride 1)")
    elif kv.stride(2) != 1 or kv.stride(0) != P * kv.stride(1) or (kv.stride(1) * 2) % 16 or kv.data_ptr() % 16:
        raise ValueError("the Gluon verify kernel reads the pool as one [pages * P, 576] row-major matrix "
                         "(16-byte aligned rows)")
    if num_pages * P >= 2**31:
        raise ValueError("pool rows must be addressable with int32")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")


def _kv_smem3_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)


def kv_descriptor(kv: torch.Tensor, block_rows: int = BLOCK_N):
    """Host TMA descriptor of the pool viewed as ``[num_pages * P, 576]``, boxes of ``block_rows`` x 64 (64;
    the ws kernel's ``WIDE_COPIES``: 128, both tiles of a pair where they are consecutive rows)."""
    num_pages, P, D = kv.shape
    if P % BLOCK_N:  # gather path: never read; slot 0 of each page keeps the view inside the storage
        flat = kv.as_strided((num_pages, D), (kv.stride(0), 1))
        return TensorDescriptor(flat, [num_pages, D], [kv.stride(0), 1], [BLOCK_N, 64], _kv_smem_layout())
    flat = kv.as_strided((num_pages * P, D), (kv.stride(1), 1))
    return TensorDescriptor(flat, [num_pages * P, D], [kv.stride(1), 1], [block_rows, 64], _kv_smem_layout())


def kv_descriptor_pages(kv: torch.Tensor):
    """Host TMA descriptor of the pool as it is stored, ``[num_pages, P, 576]``, boxes ``[1, 64, 64]`` (P a
    multiple of 64): a box whose slot coordinate runs below 0 or past P lands zeros there (the ws kernel's
    ``MASKED_PAIRS``)."""
    num_pages, P, D = kv.shape
    return TensorDescriptor(kv, [num_pages, P, D], [kv.stride(0), kv.stride(1), 1], [1, BLOCK_N, 64],
                            _kv_smem3_layout())


def kv_descriptor3(kv: torch.Tensor):
    """Host TMA descriptor of the pool viewed as ``[9 column blocks, num_pages * P rows, 64]`` (strides
    ``[64, row stride, 1]`` elements), box ``[8, 64, 64]``: one copy moves a tile's whole latent part
    as 8 contiguous 64 x 64 swizzled blocks (a box of 9 is refused: box dims must be powers of two)."""
    num_pages, P, D = kv.shape
    flat = kv.as_strided((num_pages * P, D), (kv.stride(1), 1))
    return TensorDescriptor(flat, [D // 64, num_pages * P, 64], [64, kv.stride(1), 1], [D_LAT // 64, BLOCK_N, 64],
                            _kv_smem3_layout())


# Set to False (here or by the first failing launch) to fall back to 9 boxes of 64 x 64 per tile.
USE_TMA3D = True
# SEESAW over TMA: bulk L2 prefetch of each pair one pair ahead of its copies (a bench switch). Measured
# (session 5, calls C and D): seesaw T=64,H=8 114.6 -> 110.3 us, T=16,H=64 212.3 -> 207.9; slower in
# the plain schedule (T=8,H=8 28.4 -> 29.9) and for row gathers (T=16,H=64, P=1: 233.4 -> 245.9), so
# only there.
L2_PREFETCH = True
# SEESAW: split chunks in whole tile pairs (``PAIR_CHUNKS``), instead of whole pages only. At T=64,H=8,
# L=46000 (16 splits) page chunks are 45 tiles: every program ran 22 pairs and one odd tile on the
# unpipelined tail path (4.2 us, twice a tile in the loop), and the last one 21 pairs and 3 tail tiles
# (13 us), the longest (bench/timeline.py, session 10 call H). Pair chunks: 23 pairs, no tail but the
# last chunk's, which is short. ``TRITREE_PAIR_CHUNKS=0`` restores page chunks (bench comparisons).
PAIR_CHUNKS = os.environ.get("TRITREE_PAIR_CHUNKS", "1") == "1"
# Q's copies issued before the first tiles' in the plain schedule (``Q_FIRST``, on; ``TRITREE_Q_FIRST=0``
# turns it off) and in the seesaw (``Q_FIRST_SEESAW``, off; ``TRITREE_Q_FIRST_SEESAW=1``). Issued after
# them, Q lands 4-6 us into the program (bench/timeline.py, session 10 call H: behind 27 MB of first
# tiles requested at once at T=8,H=8), and the first scores wait for it. Session 11 call A: plain
# T=8,H=8 36.2 -> 35.0 us (Q lands at 2.2 us, not 5.2); seesaw T=64,H=8 111.9 -> 111.5 but
# T=64,H=64 744.0 -> 780.6, so the seesaw keeps Q after the first tiles.
Q_FIRST = os.environ.get("TRITREE_Q_FIRST", "1") == "1"
Q_FIRST_SEESAW = os.environ.get("TRITREE_Q_FIRST_SEESAW", "0") == "1"
# The output / partial rows re-laid out through shared memory before their store (``COALESCED_STORE``,
# off here; ``TRITREE_COALESCED_STORE=1`` turns it on for every Gluon kernel): from the MMA layout a
# warp's store writes 32-byte pieces of eight rows; re-laid out, 512 contiguous bytes of one row. The
# store takes 3-4 us of every program (bench/timeline.py) and halving its bytes (bf16 partials, in
# 16-byte pieces) doubled it (session 11 call C: T=8,H=8 3.6 -> 7.0 us). Re-laid out (call D), the
# store itself took longer here (T=8,H=8 3.7 -> 4.7 us, the conversion through shared memory) and
# the plain and seesaw schedules tied or lost (T=8,H=8 35.0 -> 35.3 us, T=64,H=8 112.5 -> 112.9); the
# warp-specialised kernel keeps it where it won (``_verify_gluon_ws.COALESCED_STORE_PREFETCH``).
COALESCED_STORE = os.environ.get("TRITREE_COALESCED_STORE", "0") == "1"
# The plain schedule over TMA (what verify_mla runs up to 64 packed rows at P % 64 == 0): split partials in
# bf16, re-laid out before their store (both on together; ``TRITREE_PARTIALS_16BIT_PLAIN=0``: fp32 from
# the MMA layout). T=8,H=8, L=46000, P=64, us, fp32 -> bf16 + staged store: session 12 call B 35.4 ->
# 34.6; session 13 call E 35.5 -> 34.2 and 35.0 -> 33.9 (with a merge variant since dropped, which
# alone measured 35.8 / 36.0); bf16 from the MMA layout lost (35.1 -> 39.2, session 12).
PARTIALS_16BIT_PLAIN = os.environ.get("TRITREE_PARTIALS_16BIT_PLAIN", "1") == "1"
# Q's padding rows (past T*H or the tree) zero-filled by predicated copies (``_load_q``'s ``ZERO_PAD``)
# in every Gluon kernel, instead of copies of the request's first row (``TRITREE_Q_ZERO_PAD=0``). With
# the copies, Q landed at 2.9-3.4 us (median program) at T=65,H=8, whose ninth row block has 8 real rows
# and 56 padding rows, and at 3.0 at T=17,H=8, against 1.5 at T=64,H=8 (bench/timeline.py); zero-filled,
# at 1.5 everywhere (session 14 call A). Graph-timed (calls B-D, L=46000, P=64, 9 rounds in one process
# each): T=17,H=8 (the engine's default budget 16) ~1.0 us faster in 9 of 9 (47.8-50.2 against 48.8-50.4),
# but T=65,H=8 ~1.0 us slower in 9 of 9 (109.4-111.5 against 108.9-110.6; padding rows copying the
# request's real rows in turn were slower still, 110.3-112.0: commit 59d989e); kept for the default budget.
Q_ZERO_PAD = os.environ.get("TRITREE_Q_ZERO_PAD", "1") == "1"


def plain_partials_narrow(page_size: int) -> bool:
    """Whether the plain schedule over pages of ``page_size`` writes 16-bit split partials (re-laid out)."""
    return PARTIALS_16BIT_PLAIN and page_size % BLOCK_N == 0


def launch_verify_gluon(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                        sm_scale, num_splits, overlap=True, seesaw=False, timeline=False):
    """Launches the main kernel with ``_launch_verify``'s conventions (``dst_o, dst_l, o_strides,
    l_strides`` from ``_splitkv.split_destinations``; ``dst_o`` may be fp32 or a narrower float type:
    partials are cast on store, ``dst_l`` is fp32). With ``num_splits > 1`` the caller merges the
    partials with ``_splitkv.combine_splits``. ``seesaw``: the tile-pair schedule (``overlap`` ignored).
    ``timeline`` (bench only, several splits; wrong lse): each program's five ``%globaltimer`` stamps
    over its first five lse partial slots (``bench/timeline.py``).
    Page sizes below 64 (``kv.shape[1]`` in ``GATHER_PAGE_SIZES``) take the cp.async gather path, which
    has no overlapped schedule: ``overlap`` is ignored there (plain schedule) and no 3-D descriptor is used.
    Returns the compiled kernel (``n_regs``, ``n_spills``, ``metadata.shared``)."""
    global USE_TMA3D
    _check(q, kv, num_splits)
    B, T, H, _ = q.shape
    M = T * H
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    grid = (triton.cdiv(M, BLOCK_M), int(num_splits), B)
    gather = kv.shape[1] % BLOCK_N != 0
    if gather:
        overlap = False
    # The gather path reads no descriptor; one is still passed (the signature is the same for all paths).
    desc = kv_descriptor(kv)
    # 16-bit split partials over TMA (``PARTIALS_16BIT_PLAIN``): the plain schedule re-lays them out
    narrow16 = int(num_splits) > 1 and dst_o.element_size() == 2 and not gather

    def go(tma3d):
        return _verify_gluon_kernel[grid](
            q, kv, desc, kv_descriptor3(kv) if tma3d else desc, page_table, kv_lens, tree_mask, tree_lens,
            dst_o, dst_l,
            float(sm_scale) * LOG2E,
            q.stride(0), q.stride(1), q.stride(2),
            kv.stride(0), kv.stride(1),
            page_table.stride(0), page_table.shape[1], kv.shape[0],
            tree_mask.stride(0), tree_mask.stride(1),
            *o_strides,
            *l_strides,
            T, H, int(num_splits),
            PAGE_SIZE=kv.shape[1], SINGLE_SPLIT=int(num_splits) == 1, OVERLAP=bool(overlap) and not seesaw,
            SEESAW=bool(seesaw), TMA3D=bool(tma3d) and not seesaw and not gather, L2_PREFETCH=L2_PREFETCH,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_LAT=D_LAT, D_PE=D_PE, TIMELINE=bool(timeline),
            PAIR_CHUNKS=PAIR_CHUNKS and bool(seesaw), Q_FIRST=Q_FIRST_SEESAW if seesaw else Q_FIRST,
            COALESCED_STORE=COALESCED_STORE or (narrow16 and not seesaw and not overlap), Q_ZERO_PAD=Q_ZERO_PAD,
            num_warps=NUM_WARPS, **({"PDL": True} if merge_pdl(int(num_splits), q.device) else {}),
        )

    if USE_TMA3D and not seesaw and not gather:
        try:
            return go(True)
        except Exception as e:  # noqa: BLE001 - descriptor refused by the host API / driver
            import warnings

            warnings.warn(f"3-D TMA descriptor refused ({type(e).__name__}: {e}); using 9 boxes per tile")
            USE_TMA3D = False
    return go(False)


def verify_gluon(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, num_splits=1, overlap=True,
                 seesaw=False, out=None, lse=None):
    """Convenience wrapper: ``(out, lse)`` like ``verify_mla(..., return_lse=True)`` (no validation
    beyond the kernel's own requirements)."""
    from ._splitkv import combine_splits, split_destinations

    B, T, H, _ = q.shape
    if out is None:
        out = torch.empty(B, T, H, D_LAT, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H)
    launch_verify_gluon(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                        sm_scale, num_splits, overlap=overlap, seesaw=seesaw)
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse)
    return out, lse


# --------------------------------------------------------------------------------------------------
# AOT compile check (CPU machine, sm_90 target)
# --------------------------------------------------------------------------------------------------

def compile_for_sm90(num_splits: int, overlap: bool, page_size: int = 64, seesaw: bool = False, tma3d: bool = True,
                     partial_dtype: str | None = None, pdl: bool = False, timeline: bool = False,
                     q_first: bool | None = None, coalesced_store: bool | None = None):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _verify_gluon_kernel
    layout = _kv_smem_layout()
    gather = page_size % BLOCK_N != 0
    tma3d = tma3d and not seesaw and not gather
    overlap = overlap and not gather
    if q_first is None:  # as launched
        q_first = Q_FIRST_SEESAW if seesaw else Q_FIRST
    plain = not seesaw and not overlap
    if partial_dtype is None:  # as verify_mla launches it
        partial_dtype = "bf16" if plain and plain_partials_narrow(page_size) else "fp32"
    if coalesced_store is None:  # as launched
        coalesced_store = COALESCED_STORE or (num_splits > 1 and partial_dtype != "fp32" and plain and not gather)
    desc3 = (f"tensordesc<bf16[{D_LAT // 64},{BLOCK_N},64],{_kv_smem3_layout()!r}>" if tma3d
             else f"tensordesc<bf16[{BLOCK_N},64],{layout!r}>")
    sig = {
        "Q": "*bf16", "KV": "*bf16", "kv_desc": f"tensordesc<bf16[{BLOCK_N},64],{layout!r}>", "kv_desc3": desc3,
        "PageTable": "*i32", "KvLens": "*i32", "TreeMask": "*i32", "TreeLens": "*i32",
        "Out": "*bf16" if num_splits == 1 else f"*{partial_dtype}", "Lse": "*fp32", "sm_scale_log2e": "fp32",
    }
    ints = ["stride_qb", "stride_qt", "stride_qh", "stride_kvp", "stride_kvs", "stride_ptb", "max_pages",
            "num_pages", "stride_mb", "stride_mt", "stride_ob", "stride_ot", "stride_oh", "stride_os",
            "stride_lb", "stride_lt", "stride_lh", "stride_ls", "T", "H", "num_splits"]
    sig.update({n: "i32" for n in ints})
    constexprs = {"PAGE_SIZE": page_size, "SINGLE_SPLIT": num_splits == 1, "OVERLAP": overlap and not seesaw,
                  "SEESAW": seesaw, "TMA3D": tma3d, "L2_PREFETCH": L2_PREFETCH, "BLOCK_M": BLOCK_M,
                  "BLOCK_N": BLOCK_N, "D_LAT": D_LAT, "D_PE": D_PE, "PDL": pdl, "TIMELINE": timeline,
                  "PAIR_CHUNKS": PAIR_CHUNKS and seesaw, "Q_FIRST": q_first,
                  "COALESCED_STORE": coalesced_store, "Q_ZERO_PAD": Q_ZERO_PAD}
    for k in constexprs:
        sig[k] = "constexpr"
    names = fn.arg_names
    divisible = ("Q", "KV", "PageTable", "KvLens", "TreeMask", "TreeLens", "Out", "Lse", "stride_qb", "stride_qt",
                 "stride_qh", "stride_kvp", "stride_kvs", "stride_ob", "stride_ot", "stride_oh", "stride_os")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})


VARIANTS = {"plain": dict(overlap=False, seesaw=False), "overlap": dict(overlap=True, seesaw=False),
            "seesaw": dict(overlap=False, seesaw=True)}


def _main():
    from .aot import resource_usage

    if not GLUON_AVAILABLE:
        raise SystemExit(f"gluon unavailable: {_IMPORT_ERROR!r}")
    ok = True
    for name, kw in VARIANTS.items():
        for splits in (1, 2):
            # P = 1, 16: the cp.async gather path (plain and seesaw; overlap is TMA-only).
            for P in (64, 128) if name == "overlap" else (64, 128, 1, 16):
                try:
                    k = compile_for_sm90(splits, kw["overlap"], P, seesaw=kw["seesaw"])
                except Exception as e:  # noqa: BLE001
                    print(f"_verify_gluon_kernel sm_90 {name:8s} splits={'1' if splits == 1 else 'N'} P={P:3d} "
                          f"COMPILE FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
                    ok = False
                    continue
                use = resource_usage(k.asm["cubin"])
                spill = use.get("LOCAL", 0) + use.get("STACK", 0)
                shared = int(k.metadata.shared)
                # Spills are reported, not fatal (ptxas spills a few loop-invariant scalars under O).
                good = shared <= SMEM_LIMIT_SM90
                ok &= good
                status = "ok" if good and spill == 0 else ("ok (spills)" if good else "FAIL")
                print(f"_verify_gluon_kernel sm_90 {name:8s} splits={'1' if splits == 1 else 'N'} P={P:3d} "
                      f"shared {shared:7d}/{SMEM_LIMIT_SM90} regs {use.get('REG', 0):3d} spill {spill:5d}  {status}",
                      flush=True)
    for name in ("plain", "seesaw"):  # programmatic dependent launch of the merge (TRITREE_MERGE_PDL)
        k = compile_for_sm90(2, False, 64, seesaw=name == "seesaw", pdl=True)
        has = "griddepcontrol.launch_dependents" in k.asm["ptx"]
        ok &= has and int(k.metadata.shared) <= SMEM_LIMIT_SM90
        print(f"_verify_gluon_kernel sm_90 {name:8s} splits=N P= 64 PDL: launch_dependents "
              f"{'in' if has else 'MISSING from'} the PTX, shared {int(k.metadata.shared)}", flush=True)
    for name in ("plain", "seesaw"):  # Q's copies first (TRITREE_Q_FIRST / _SEESAW) against after
        base = compile_for_sm90(2, False, 64, seesaw=name == "seesaw", q_first=False)
        k = compile_for_sm90(2, False, 64, seesaw=name == "seesaw", q_first=True)
        use, base_use = resource_usage(k.asm["cubin"]), resource_usage(base.asm["cubin"])
        spill = use.get("LOCAL", 0) + use.get("STACK", 0)
        base_spill = base_use.get("LOCAL", 0) + base_use.get("STACK", 0)
        ok &= int(k.metadata.shared) <= SMEM_LIMIT_SM90
        print(f"_verify_gluon_kernel sm_90 {name:8s} splits=N P= 64 Q first: shared {int(k.metadata.shared)} "
              f"(Q after: {int(base.metadata.shared)}), spill {spill} (Q after: {base_spill})", flush=True)
    for name in ("plain", "seesaw"):  # the output rows re-laid out before their store (TRITREE_COALESCED_STORE)
        k = compile_for_sm90(2, False, 64, seesaw=name == "seesaw", coalesced_store=True)
        use = resource_usage(k.asm["cubin"])
        ok &= int(k.metadata.shared) <= SMEM_LIMIT_SM90
        print(f"_verify_gluon_kernel sm_90 {name:8s} splits=N P= 64 coalesced store: shared {int(k.metadata.shared)}, "
              f"spill {use.get('LOCAL', 0) + use.get('STACK', 0)}", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    _main()
