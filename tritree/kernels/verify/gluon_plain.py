"""The plain Hopper (sm_90) Gluon verify kernel: what ``verify_mla`` runs for bf16 pools up to 64 packed rows
(``kernel="gluon"``; host side in ``gluon_launch``).

Same semantics, split-KV chunking and output / partial format as the Triton kernel
(``triton_kernel._verify_mla_kernel``); with several splits the caller merges the partials
(``_splitkv.combine_splits``). One CTA of 8 warps = 2 warpgroups per 64 rows:

* Q (64 x 576) sits in shared memory for the whole program; its cp.async copies are issued before the first
  tiles', so that they are not queued behind them. The KV pool is read by TMA into a ring of two 64 x 576
  slots (128-byte swizzle), tile j+1 in flight while j computes. The pool is one ``[num_pages * P, 576]``
  matrix; a tile is a page-local row range (P % 64 == 0, chunks start on page boundaries). Page ids are
  fetched one tile ahead of the TMA that needs them. ``TMA3D``: a tile is 2 copies, not 9 (the compiler
  puts a CTA barrier before each): the latent part as one box ``[8, 64, 64]`` of the pool viewed as
  ``[9 column blocks, rows, 64]`` (strides ``[64, 576, 1]``), which lands as the 8 contiguous 64-wide
  column blocks of the swizzled ``[64, 512]`` slot, plus the rope box (a 9-block box is refused: box dims
  must be powers of two). Without ``TMA3D`` (the launcher's fallback where the driver refuses the 3-D
  descriptor) 9 boxes of 64 x 64.
* Scores: ``S = Q_lat K_lat^T + Q_pe K_pe^T`` (m64 n64, k512 + k64; shared-memory shapes must be
  powers of two, so latent and rope parts are separate buffers) in an MMA layout with warps
  ``[4, 2]``: each warpgroup computes its own 32 keys. Row max and row sum cross the warpgroups
  (reductions through shared memory).
* P (bf16) goes to a 64 x 64 shared buffer that is the A operand of ``O += P @ V`` (m64 n512 k64,
  warps ``[4, 2]``: each warpgroup owns 256 output columns, 128 fp32 registers per thread). V is the
  latent part of the same slot: each tile is read once.
* The masked tail (the last partial prefix tile and the tree keys, 1-3 tiles) is copied with masked
  cp.async (rows past ``end`` zero-filled: a key past the request may hold NaN, and 0 * NaN would
  reach O; no data passes through the registers that hold O), then the same compute with the tree
  mask applied to S as -inf.
* ``GATHER`` (derived: ``PAGE_SIZE < 64``, any power of two 1..32): a tile spans several pages, so full
  tiles are cp.async row gathers (``_gather_tile``: row r of the tile at key n is
  ``page_table[b, (n + r) // P] * stride_kvp + ((n + r) % P) * stride_kvs``, 16-byte vectors) into the
  same ring, one cp.async group per tile and one committed per iteration (empty ones too), so
  ``wait_group(1)`` = "tile j landed" while tile j+1's copies fly. Chunks are tile-aligned. No descriptor
  is read (one is still passed).
* ``COALESCED_STORE`` (16-bit split partials over TMA): the partial rows re-laid out through shared memory
  before their store, 512 contiguous bytes of one row a warp instead of 32-byte pieces of eight rows.

Shared memory: Q 73,728 + 2 slots 147,456 + P 8,192 = 229,376 bytes (+ barriers and reduction
scratch) of the 232,448 an H200 CTA may use: one CTA per SM.
"""

from __future__ import annotations

from .._gluon_common import (
    _cp_async,
    _cta_barrier,
    _gather_pages,
    _load_q,
    _now,
    _page_row_p,
    _publish_p,
    _qk,
    _softmax,
    _store_o,
    _store_timeline,
    _tail_rows,
    _tail_tile_p,
    _tma_load,
    async_copy,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    warpgroup_mma,
)
from .._splitkv import split_chunk


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
def _gather_tile(KV, page, stride_kvp, stride_kvs, dst_blocks, blk0, row0: gl.constexpr, dst_pe,
                 ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
    """GATHER: one full tile (keys ``n .. n+63``, ``n`` a multiple of 64, ``page`` from
    ``_gather_pages``) by unmasked cp.async row gathers (16-byte vectors) into rows ``row0 .. row0+63``
    of ``dst_blocks`` (``[column blocks, rows, 64]``, blocks ``blk0 .. blk0+7``) and ``dst_pe``: the
    masked tail's copy without the mask, committed as one cp.async group."""
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
    tok = KV + gl.expand_dims(page.to(gl.int64) * stride_kvp + (r % PAGE_SIZE).to(gl.int64) * stride_kvs, 1)
    d = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
    for c in range(D_LAT // 64):
        _cp_async(dst_blocks.index(blk0 + c).slice(row0, BLOCK_N, dim=0), tok + (c * 64 + d))
    _cp_async(dst_pe, tok + (D_LAT + d))
    async_copy.commit_group()


@gluon.jit
def _masked_tail(o, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV, PageTable, TreeMask,
                 b, pid_m, tail_start, end, kv_len, tree_len, T, H, stride_ptb, max_pages, num_pages, stride_kvp,
                 stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout: gl.constexpr, o_layout: gl.constexpr,
                 ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Keys ``tail_start .. end`` (the prefix remainder and the tree keys), one masked tile at a time
    by masked cp.async into the two slots in turn. Returns ``(o, m_i, l_i)``; the scores' row statistics
    in ``SliceLayout(1, s_layout)``."""
    s_zero, t, row_ok, mask_base = _tail_rows(TreeMask, b, pid_m, T, H, tree_len, stride_mb, s_layout, BLOCK_M,
                                              BLOCK_N)
    for n in range(tail_start, end, BLOCK_N):
        p, alpha, m_i, l_i, tail_lat = _tail_tile_p(
            n, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, KV, PageTable, b, tail_start, end,
            kv_len, tree_len, row_ok, t, mask_base, stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs,
            stride_mt, sm_scale_log2e, s_zero, s_layout, ld_layout, False, PAGE_SIZE, D_LAT, BLOCK_N)
        o = _publish_p(p, alpha, o, p_smem, o_layout)
        o = warpgroup_mma(p_smem, tail_lat, o)
        _cta_barrier()
    return o, m_i, l_i


@gluon.jit
def _full_tile(q_lat, q_pe, k_lat, k_pe, s_zero, p_smem, o, m_i, l_i, sm_scale_log2e, o_layout: gl.constexpr):
    """One committed tile (no mask) in its ring slot ``k_lat``/``k_pe``: scores, online softmax, P through
    ``p_smem``, ``O += P V``; ``(o, m_i, l_i)``, the slot and ``p_smem`` free again when it returns."""
    s = _qk(q_lat, q_pe, k_lat, k_pe, s_zero, False)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
    o = _publish_p(p, alpha, o, p_smem, o_layout)
    o = warpgroup_mma(p_smem, k_lat, o)
    _cta_barrier()
    return o, m_i, l_i


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
    TMA3D: gl.constexpr = True,
    BLOCK_M: gl.constexpr = 64,
    BLOCK_N: gl.constexpr = 64,
    D_LAT: gl.constexpr = 512,
    D_PE: gl.constexpr = 64,
    TIMELINE: gl.constexpr = False,
    COALESCED_STORE: gl.constexpr = False,
):
    """``kv_desc``: the pool in 64 x 64 boxes (``kv_descriptor``); ``kv_desc3``: with ``TMA3D`` the
    ``[8, 64, 64]`` latent boxes (``kv_descriptor3``), else ``kv_desc`` again (unused). ``TIMELINE`` (bench
    only, several splits; wrong lse): five ``%globaltimer`` stamps (start, Q landed, prefix done, tail done,
    stored) over the program's first five lse partial slots (``bench/timeline.py``)."""
    gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
    gl.static_assert(BLOCK_M == BLOCK_N)
    GATHER: gl.constexpr = PAGE_SIZE < BLOCK_N
    gl.static_assert(GATHER or PAGE_SIZE % BLOCK_N == 0, "page size: a power of two < 64 or a multiple of 64")
    gl.static_assert(not (GATHER and TMA3D), "GATHER uses no TMA descriptor")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, D_LAT // 2, 16])
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[8, 1], order=[1, 0])
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    smem3_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    row_s_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b = gl.program_id(2)
    if TIMELINE:
        t0 = _now(pid_s)
    kv_len = gl.maximum(gl.load(KvLens + b), 0)  # unchecked lengths kept in range
    tree_len = gl.minimum(gl.maximum(gl.load(TreeLens + b), 0), T)
    n_keys = kv_len + tree_len
    if GATHER:  # pages no longer align chunks: tile-aligned ones
        start, end = split_chunk(n_keys, pid_s, num_splits, BLOCK_N)
    else:
        start, end = split_chunk(n_keys, pid_s, num_splits, PAGE_SIZE)
    full_end = start + (gl.maximum(gl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N
    n_full = (full_end - start) // BLOCK_N
    pt = PageTable + b.to(gl.int64) * stride_ptb

    # ---- shared memory (shapes must be powers of two: latent and rope parts apart) -----------
    q_lat = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_LAT], smem_layout)
    q_pe = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D_PE], smem_layout)
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

    # ---- Q: row copies (rows are (t, h) pairs, not one strided matrix), ahead of the first tiles' ---
    _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M, D_LAT)
    async_copy.commit_group()
    # The first two tiles in flight; page rows are fetched one tile ahead.
    if GATHER:
        g_blocks = k_lat._reinterpret(gl.bfloat16, [2 * (D_LAT // 64), BLOCK_N, 64], smem_layout)
        if n_full > 0:
            pg = _gather_pages(pt, start, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
            _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, 0, 0, k_pe.index(0), ld_layout,
                         PAGE_SIZE, D_LAT, BLOCK_N)
        else:
            async_copy.commit_group()
        if n_full > 1:
            pg = _gather_pages(pt, start + BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
            _gather_tile(KV, pg, stride_kvp, stride_kvs, g_blocks, D_LAT // 64, 0, k_pe.index(1), ld_layout,
                         PAGE_SIZE, D_LAT, BLOCK_N)
        else:
            async_copy.commit_group()
        next_pg = _gather_pages(pt, start + 2 * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
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

    # Q landed (and, GATHER, the first tiles' gathers: later groups count from here).
    async_copy.wait_group(0)
    fence_async_shared()
    _cta_barrier()

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s_layout)
    o = gl.zeros([BLOCK_M, D_LAT], gl.float32, layout=o_layout)
    if TIMELINE:
        t1 = _now(pid_s)

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    # ---- committed prefix: full tiles, no mask -----------------------------------------------
    if GATHER:
        for j in range(n_full):
            slot = j % 2
            # Groups committed so far: tiles 0 .. j+1 (one each, maybe empty): tile j has landed
            # once at most one is outstanding; then everyone's copies are made visible.
            async_copy.wait_group(1)
            fence_async_shared()
            _cta_barrier()
            o, m_i, l_i = _full_tile(q_lat, q_pe, k_lat.index(slot), k_pe.index(slot), s_zero, p_smem, o, m_i, l_i,
                                     sm_scale_log2e, o_layout)  # p_smem and the slot are free: tile j+2 goes there
            if j + 2 < n_full:
                _gather_tile(KV, next_pg, stride_kvp, stride_kvs, g_blocks, slot * (D_LAT // 64), 0,
                             k_pe.index(slot), ld_layout, PAGE_SIZE, D_LAT, BLOCK_N)
            else:
                async_copy.commit_group()
            next_pg = _gather_pages(pt, start + (j + 3) * BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE,
                                    BLOCK_N)
    else:
        for j in range(n_full):
            slot = j % 2
            mbarrier.wait(bars.index(slot), (j // 2) & 1)
            o, m_i, l_i = _full_tile(q_lat, q_pe, k_lat.index(slot), k_pe.index(slot), s_zero, p_smem, o, m_i, l_i,
                                     sm_scale_log2e, o_layout)  # p_smem and the slot are free: tile j+2 goes there
            if j + 2 < n_full:
                if TMA3D:
                    _issue_tile3(kv_desc, kv_desc3, lat3, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
                else:
                    _issue_tile(kv_desc, k_lat, k_pe, bars, slot, next_row, D_LAT, BLOCK_N)
            next_row = _page_row_p(pt, start + (j + 3) * BLOCK_N, max_pages, num_pages, PAGE_SIZE)

    # Slot 0's 8 column blocks (blocks 0..7 of the ring) as a batch of [64, 64] buffers.
    tail_blocks = k_lat._reinterpret(gl.bfloat16, [2 * (D_LAT // 64), BLOCK_N, 64], smem_layout)

    # ---- masked tail: prefix remainder and tree keys -------------------------------------------
    if TIMELINE:
        t2 = _now(pid_s)
    o, m_i, l_i = _masked_tail(o, m_i, l_i, q_lat, q_pe, k_lat, k_pe, tail_blocks, p_smem, KV, PageTable,
                               TreeMask, b, pid_m, full_end, end, kv_len, tree_len, T, H, stride_ptb, max_pages,
                               num_pages, stride_kvp, stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout,
                               o_layout, ld_layout, PAGE_SIZE, D_LAT, BLOCK_M, BLOCK_N)

    mbarrier.invalidate(bars.index(0))
    mbarrier.invalidate(bars.index(1))
    if TIMELINE:
        t3 = _now(pid_s)

    _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh, stride_os,
             stride_lb, stride_lt, stride_lh, stride_ls, o_layout, SINGLE_SPLIT, BLOCK_M, D_LAT,
             COALESCED=COALESCED_STORE, WARPS=8)
    if TIMELINE:
        _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, _now(pid_s), BLOCK_M)
