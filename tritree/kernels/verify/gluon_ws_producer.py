"""The producer side of the warp-specialised Hopper Gluon verify kernel (``gluon_ws``) and the
protocol both of its partitions share.

* Grid and keys: which row block, split and split count a program has (``_program``: with a narrow last
  row block the grid's first axis lists the full blocks' programs, then the narrow block's), its keys
  (``_chunk_bounds``) and, after the pair loop, its masked pairs' count (``_tail_extent``).
* Releases: the two hardware barriers that hand the pair buffers' halves back from the consumers
  (``_release``: ``bar.arrive``) to the producer (``_acquire``: ``bar.sync``), 384 threads each.
* Tile placement: a tile in which the request's keys end is copied from before its start
  (``_tile_shift``, ``_tile_page_slot``), so that its rows are keys of the request or zeros.
* The worker partition ``_ws_producer`` (4 warps): page-table lookups, the TMA boxes of every pair (two
  64-row boxes a column block, or one 128-row box: ``WIDE_COPIES``; the masked pairs over the paged view:
  ``MASKED_PAIRS``), the bulk L2 prefetch one pair ahead, and for pages below a tile the cp.async row
  gathers, each block's group announced on its barrier as a TMA copy would be.
"""

from __future__ import annotations

from .._gluon_common import (
    _cp_async,
    _cta_barrier,
    _gather_pages,
    _page_row_p,
    _tma_load,
    async_copy,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
)
from .._splitkv import split_chunk

# The hardware barriers (of 16; triton takes 0..2 here) that release the two halves of the pair buffers,
# each completed by the 256 consumer arrivals and the producer's 128 threads.
RELEASE_BAR0 = gl.constexpr(14)
RELEASE_BAR1 = gl.constexpr(15)
RELEASE_THREADS = gl.constexpr((8 + 4) * 32)


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


@gluon.constexpr_function
def _bar_asm(op, bar, count):
    return ("{ .reg .pred p; setp.ne.b32 p, $1, 0; @p bar." + op + " " + str(bar) + ", " + str(count)
            + "; mov.b32 $0, 0; }")


@gluon.jit
def _named_barrier(BAR: gl.constexpr, COUNT: gl.constexpr, pred, SYNC: gl.constexpr):
    """``bar.sync`` (``SYNC``) or ``bar.arrive`` on hardware barrier ``BAR`` for ``COUNT`` threads, by
    every thread of the calling partition where ``pred`` (warp-uniform) holds. Inline asm: triton's
    barrier analysis sees no shared-memory access in it, so it neither needs nor adds a partition barrier."""
    NT: gl.constexpr = gl.num_warps() * 32
    one_each: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    flag = gl.full([NT], 1, gl.int32, layout=one_each) * pred.to(gl.int32)
    gl.inline_asm_elementwise(_bar_asm("sync" if SYNC else "arrive", BAR, COUNT), "=r,r", [flag],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release(BAR: gl.constexpr, more):
    """Consumers: hand the buffers that hardware barrier ``BAR`` guards back to the producer, after this
    thread's own ``warpgroup_mma_wait`` on the wgmmas reading them: each thread ``bar.arrive``s (no wait,
    no partition barrier). ``more``: the producer refills them (not after the last pair)."""
    _named_barrier(BAR, RELEASE_THREADS, more, False)


@gluon.jit
def _acquire(BAR: gl.constexpr, phase):
    """Producer: wait until the consumers released the buffers of ``_release`` (release number ``phase``,
    counted from 0): ``bar.sync`` with their arrivals. A phase cannot be overtaken: a consumer thread
    arrives for pair i+1 only after the copies the producer issued behind its sync for pair i landed."""
    _named_barrier(BAR, RELEASE_THREADS, phase >= 0, True)  # always true, as a tensor predicate


@gluon.jit
def _program(T, H, num_splits, narrow_splits, NARROW_ROWS: gl.constexpr, BLOCK_M: gl.constexpr):
    """``(pid_m, pid_s, splits, narrow)``: this program's row block, split, its row block's split count
    and whether that block is the narrow one.
    With a narrow last row block (``NARROW_ROWS``) the grid's first axis holds the full blocks'
    programs (the row block fastest, as the 2-D grid orders them) and then the narrow block's
    ``narrow_splits``: exactly the programs that have work, none waiting for a second wave."""
    if NARROW_ROWS > 0:
        lin = gl.program_id(0)
        full_blocks = gl.cdiv(T * H, BLOCK_M) - 1
        n_full = full_blocks * num_splits
        narrow = lin >= n_full
        pid_m = gl.where(narrow, full_blocks, lin % full_blocks)
        pid_s = gl.where(narrow, lin - n_full, lin // full_blocks)
        return pid_m, pid_s, gl.where(narrow, narrow_splits, num_splits), narrow
    else:
        return gl.program_id(0), gl.program_id(1), num_splits, False


@gluon.jit
def _chunk_bounds(kv_len, tree_len, pid_s, num_splits, PAGE_SIZE: gl.constexpr):
    """Keys ``[start, end)`` of split ``pid_s`` (``_splitkv.split_chunk``: page-aligned chunks, or
    64-key-aligned ones for pages below a tile)."""
    n_keys = kv_len + tree_len
    if PAGE_SIZE < 64:
        start, end = split_chunk(n_keys, pid_s, num_splits, 64)
    else:
        start, end = split_chunk(n_keys, pid_s, num_splits, PAGE_SIZE)
    return start, end


@gluon.jit
def _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits, n_pairs, NARROW_ROWS: gl.constexpr,
                 BLOCK_M: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """After the pair loop, from kernel parameters (nothing kept live across it): ``(kv_len, tree_len,
    start, end, n_masked)``: this split's keys and its MASKED_PAIRS count (pairs of tiles from the end
    of the full pairs to ``end``, where that is more than one tile; none in the narrow row block: their
    tails stay one tile at a time, ``_masked_tail_halves``)."""
    _, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
    b = gl.program_id(2)
    kv_len = gl.maximum(gl.load(KvLens + b), 0)  # unchecked lengths kept in range
    tree_len = gl.minimum(gl.maximum(gl.load(TreeLens + b), 0), T)
    start, end = _chunk_bounds(kv_len, tree_len, pid_s, splits, PAGE_SIZE)
    rest = end - (start + n_pairs * 2 * BLOCK_N)
    n_masked = gl.where(rest > BLOCK_N, gl.cdiv(rest, 2 * BLOCK_N), 0)
    if NARROW_ROWS > 0:
        n_masked = gl.where(narrow, 0, n_masked)
    return kv_len, tree_len, start, end, n_masked


@gluon.jit
def _tile_shift(n, n_keys, BLOCK_N: gl.constexpr):
    """How far the tile of keys ``n .. n+63`` is copied from before ``n``: ``n + 64 - n_keys`` if the
    request's ``n_keys`` keys end inside it, else 0. Row r of the copy then holds key ``n - shift + r``."""
    return gl.where((n < n_keys) & (n_keys < n + BLOCK_N), n + BLOCK_N - n_keys, 0)


@gluon.jit
def _tile_page_slot(pt, n, n_keys, max_pages, num_pages, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """MASKED_PAIRS: the paged-view coordinates ``(page, slot)`` of the tile of keys ``n .. n+63`` (``n`` a
    multiple of 64), moved back by ``_tile_shift`` where the request's keys end inside it: its 64 rows are
    then keys of the request (or zeros, where the slot goes below 0), never a stale slot past the end."""
    col = gl.minimum(n // PAGE_SIZE, max_pages - 1)
    page = gl.minimum(gl.maximum(gl.load(pt + col), 0), num_pages - 1)
    return page, n % PAGE_SIZE - _tile_shift(n, n_keys, BLOCK_N)


@gluon.jit
def _issue_pair_boxes(kv_desc, k_lat, k_pe, cbars, row0, row1, C0: gl.constexpr, C1: gl.constexpr,
                      D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
    """``_issue_pair_blocks`` by two 64-row boxes a block (one per tile)."""
    for c in gl.static_range(C0, C1):
        mbarrier.expect(cbars[c], 2 * BLOCK_N * 64 * 2)
        if c < D_LAT // 64:
            _tma_load(kv_desc, [row0, c * 64], cbars[c], k_lat.slice(0, BLOCK_N, dim=0).slice(c * 64, 64, dim=1))
            _tma_load(kv_desc, [row1, c * 64], cbars[c],
                      k_lat.slice(BLOCK_N, BLOCK_N, dim=0).slice(c * 64, 64, dim=1))
        else:
            _tma_load(kv_desc, [row0, D_LAT], cbars[c], k_pe.slice(0, BLOCK_N, dim=0))
            _tma_load(kv_desc, [row1, D_LAT], cbars[c], k_pe.slice(BLOCK_N, BLOCK_N, dim=0))


@gluon.jit
def _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, C0: gl.constexpr, C1: gl.constexpr,
                       D_LAT: gl.constexpr, BLOCK_N: gl.constexpr, kv_desc2=None, WIDE: gl.constexpr = False):
    """TMA of column blocks ``C0 .. C1-1`` (block 8 = rope) of both tiles of a pair (rows
    ``row0`` / ``row1`` of the pool into slots 0 / 1), each block's barrier armed for its two boxes.
    ``WIDE``: where the two tiles are consecutive pool rows (``row1 == row0 + 64``: one page of 128 or
    more, or two adjacent pages), each block is one 128-row box of ``kv_desc2``: half the copies."""
    if WIDE:
        if row1 == row0 + BLOCK_N:
            for c in gl.static_range(C0, C1):
                mbarrier.expect(cbars[c], 2 * BLOCK_N * 64 * 2)
                if c < D_LAT // 64:
                    _tma_load(kv_desc2, [row0, c * 64], cbars[c], k_lat.slice(c * 64, 64, dim=1))
                else:
                    _tma_load(kv_desc2, [row0, D_LAT], cbars[c], k_pe)
        else:
            _issue_pair_boxes(kv_desc, k_lat, k_pe, cbars, row0, row1, C0, C1, D_LAT, BLOCK_N)
    else:
        _issue_pair_boxes(kv_desc, k_lat, k_pe, cbars, row0, row1, C0, C1, D_LAT, BLOCK_N)


@gluon.jit
def _issue_pair_pages(kv_desc_pages, k_lat, k_pe, cbars, pg0, sl0, pg1, sl1, C0: gl.constexpr,
                      C1: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
    """``_issue_pair_boxes`` over the pool's paged view ``[pages, P, 576]`` (``kv_descriptor_pages``, box
    ``[1, 64, 64]``): tile w from ``(page, slot)`` = ``(pg_w, sl_w)``, where ``sl_w`` may be negative
    (rows below slot 0 land as zeros) and rows past the page's end too."""
    smem3_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    # [column block c, tile w] of the pair buffer as index 2 c + w (the rank-2 [128, 512] buffer is
    # 8 column blocks of 128 rows, each 64 wide)
    lat3 = k_lat._reinterpret(gl.bfloat16, [2 * (D_LAT // 64), BLOCK_N, 64], smem3_layout)
    pe3 = k_pe._reinterpret(gl.bfloat16, [2, BLOCK_N, 64], smem3_layout)
    for c in gl.static_range(C0, C1):
        mbarrier.expect(cbars[c], 2 * BLOCK_N * 64 * 2)
        if c < D_LAT // 64:
            _tma_load(kv_desc_pages, [pg0, sl0, c * 64], cbars[c], lat3.slice(2 * c, 1, dim=0))
            _tma_load(kv_desc_pages, [pg1, sl1, c * 64], cbars[c], lat3.slice(2 * c + 1, 1, dim=0))
        else:
            _tma_load(kv_desc_pages, [pg0, sl0, D_LAT], cbars[c], pe3.slice(0, 1, dim=0))
            _tma_load(kv_desc_pages, [pg1, sl1, D_LAT], cbars[c], pe3.slice(1, 1, dim=0))


@gluon.jit
def _issue_masked_pairs(kv_desc_pages, k_lat, k_pe, cbars, pt, start, n_pairs, n_masked, n_keys, end, max_pages,
                        num_pages, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
    """Producer, ``MASKED_PAIRS``: the split's ``n_masked`` masked pairs (its keys from the end of its
    ``n_pairs`` full pairs to ``end``) as the first pairs of the stream (their phases), over the paged
    view (``_issue_pair_pages``: a tile in which the keys end copied from before its start,
    ``_tile_page_slot``; a pair's second tile past the end a copy of its first)."""
    for k in range(n_masked):
        j = k
        n = start + 2 * (n_pairs + k) * BLOCK_N
        pg0, sl0 = _tile_page_slot(pt, n, n_keys, max_pages, num_pages, PAGE_SIZE, BLOCK_N)
        pg1, sl1 = _tile_page_slot(pt, n + BLOCK_N, n_keys, max_pages, num_pages, PAGE_SIZE, BLOCK_N)
        past = n + BLOCK_N >= end
        pg1 = gl.where(past, pg0, pg1)
        sl1 = gl.where(past, sl0, sl1)
        if j > 0:
            _acquire(RELEASE_BAR0, j - 1)
        _issue_pair_pages(kv_desc_pages, k_lat, k_pe, cbars, pg0, sl0, pg1, sl1, 0, D_LAT // 128, D_LAT, BLOCK_N)
        if j > 0:
            _acquire(RELEASE_BAR1, j - 1)
        _issue_pair_pages(kv_desc_pages, k_lat, k_pe, cbars, pg0, sl0, pg1, sl1, D_LAT // 128, D_LAT // 64 + 1,
                          D_LAT, BLOCK_N)


@gluon.jit
def _gather_rows(KV, pg0, pg1, stride_kvp, stride_kvs, ld_layout: gl.constexpr, PAGE_SIZE: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Row base pointers of both tiles of a pair (``pg0`` / ``pg1``: ``_gather_pages`` of each) and
    the 64 column offsets of a block, for ``_gather_block``."""
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
    slot_row = (r % PAGE_SIZE).to(gl.int64) * stride_kvs
    tok0 = KV + gl.expand_dims(pg0.to(gl.int64) * stride_kvp + slot_row, 1)
    tok1 = KV + gl.expand_dims(pg1.to(gl.int64) * stride_kvp + slot_row, 1)
    d = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
    return tok0, tok1, d


@gluon.jit
def _gather_block(tok0, tok1, d, g_blocks, k_pe, c: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr):
    """Column block ``c`` (8 = rope) of both tiles of a pair by cp.async row gathers, one group."""
    if c < D_LAT // 64:
        _cp_async(g_blocks.index(c).slice(0, BLOCK_N, dim=0), tok0 + (c * 64 + d))
        _cp_async(g_blocks.index(c).slice(BLOCK_N, BLOCK_N, dim=0), tok1 + (c * 64 + d))
    else:
        _cp_async(k_pe.slice(0, BLOCK_N, dim=0), tok0 + (D_LAT + d))
        _cp_async(k_pe.slice(BLOCK_N, BLOCK_N, dim=0), tok1 + (D_LAT + d))
    async_copy.commit_group()


@gluon.jit
def _gather_landed(cbars, c: gl.constexpr, pending: gl.constexpr):
    """Block ``c``'s group has landed once at most ``pending`` later groups are in flight: a proxy
    fence (the gathers' generic-proxy writes before the consumers' wgmma reads), a partition
    barrier (every producer thread's copies of the block) and one arrival on its barrier (count 1,
    no bytes), so the consumers wait exactly as for TMA."""
    async_copy.wait_group(pending)
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(cbars[c])


@gluon.jit
def _ws_producer(kv_desc, KV, k_lat, k_pe, cbars, pt, start, n_pairs, stride_kvp, stride_kvs, max_pages, num_pages,
                 PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr, kv_desc2, WIDE: gl.constexpr,
                 kv_desc_pages, tail_args, MASKED: gl.constexpr, NARROW_ROWS: gl.constexpr, BLOCK_M: gl.constexpr):
    """Worker partition: every copy of the pair loop. Pair j's latent column blocks 0..3 (both slots) are
    refilled once the consumers released pair j-1's (``RELEASE_BAR0``), blocks 4..7 and the rope rows
    once they released those (``RELEASE_BAR1``). Over TMA (P % 64 == 0) with each pair's bulk L2 prefetch
    one pair ahead of its copies (``_prefetch_tile_l2``); pages below a tile: cp.async row gathers by the
    producer's 128 threads. ``MASKED`` (``MASKED_PAIRS``, over TMA): first the split's masked tiles as pairs
    over the paged view (``_issue_masked_pairs``), then the full pairs, and the consumers' last releases
    are taken (they release every pair). ``tail_args``: ``(KvLens, TreeLens, T, H, num_splits,
    narrow_splits)``, kernel parameters."""
    if PAGE_SIZE < BLOCK_N:
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[gl.num_warps(), 1], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        g_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, 2 * BLOCK_N, 64], smem_layout)
        for j in range(n_pairs):
            n = start + 2 * j * BLOCK_N
            pg0 = _gather_pages(pt, n, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
            pg1 = _gather_pages(pt, n + BLOCK_N, max_pages, num_pages, ld_layout, PAGE_SIZE, BLOCK_N)
            tok0, tok1, d = _gather_rows(KV, pg0, pg1, stride_kvp, stride_kvs, ld_layout, PAGE_SIZE, BLOCK_N)
            if j > 0:
                _acquire(RELEASE_BAR0, j - 1)
            for c in gl.static_range(0, D_LAT // 128):
                _gather_block(tok0, tok1, d, g_blocks, k_pe, c, D_LAT, BLOCK_N)
            # Blocks 4..8 issued as soon as their space is free, each issue followed by the arrival of the
            # block four groups back: neither do the first half's arrivals wait for the second release and
            # the whole second issue, nor the second issue for the first half's landing (that order was
            # 7-10% slower at P = 1, bench/RESULTS.md).
            if j > 0:
                _acquire(RELEASE_BAR1, j - 1)
            for c in gl.static_range(D_LAT // 128, D_LAT // 64 + 1):
                _gather_block(tok0, tok1, d, g_blocks, k_pe, c, D_LAT, BLOCK_N)
                _gather_landed(cbars, c - D_LAT // 128, D_LAT // 128)
            for c in gl.static_range(D_LAT // 128 + 1, D_LAT // 64 + 1):
                _gather_landed(cbars, c, D_LAT // 64 - c)
    else:
        first = 0  # pairs issued ahead of the full ones: the masked ones
        if MASKED:
            KvLens, TreeLens, T, H, num_splits, narrow_splits = tail_args
            kv_len, tree_len, _, end, n_masked = _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits,
                                                              n_pairs, NARROW_ROWS, BLOCK_M, PAGE_SIZE, BLOCK_N)
            _issue_masked_pairs(kv_desc_pages, k_lat, k_pe, cbars, pt, start, n_pairs, n_masked, kv_len + tree_len,
                                end, max_pages, num_pages, PAGE_SIZE, D_LAT, BLOCK_N)
            first = n_masked
        for j in range(n_pairs):
            n = start + 2 * j * BLOCK_N
            row0 = _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE)
            row1 = _page_row_p(pt, n + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
            jj = j + first
            if jj > 0:
                _prefetch_tile_l2(KV, row0, stride_kvs, num_pages * PAGE_SIZE, 127)
                _prefetch_tile_l2(KV, row1, stride_kvs, num_pages * PAGE_SIZE, 127)
                _acquire(RELEASE_BAR0, jj - 1)
            _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, 0, D_LAT // 128, D_LAT, BLOCK_N, kv_desc2,
                               WIDE)
            if jj > 0:
                _acquire(RELEASE_BAR1, jj - 1)
            _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, D_LAT // 128, D_LAT // 64 + 1, D_LAT,
                               BLOCK_N, kv_desc2, WIDE)
        if MASKED:
            n_issued = n_pairs + first
            # the full blocks' consumers release every pair: the last one's releases taken here
            _, _, _, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
            last = n_issued - 1
            if NARROW_ROWS > 0:
                last = gl.where(narrow, -1, last)
            if last >= 0:
                _acquire(RELEASE_BAR0, last)
                _acquire(RELEASE_BAR1, last)
