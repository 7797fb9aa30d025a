"""Warp-specialised Hopper Gluon seesaw verify kernel: what ``verify_mla`` runs on sm_90 for bf16 pools
with P % 64 == 0 above 64 packed rows, and for pages below 64 above 16 rows (row gathers).

Same math, masking, tail, store and output / partial format as ``_verify_gluon_kernel`` with
``SEESAW=True`` (see ``_verify_gluon.py`` for the schedule of a pair); the copies are issued by a
producer partition, and with ``COLSPLIT`` (the default) ``O += P V`` runs by column halves. Over TMA
with the L2 prefetch (what ``verify_mla`` runs at P % 64 == 0) and over row gathers, ``verify_mla`` gives
it bf16 split partials (``PARTIALS_16BIT_WS``, ``PARTIALS_16BIT_GATHER``; of the other schedules only
the plain one over TMA has them too, ``_verify_gluon.PARTIALS_16BIT_PLAIN``), which its staged store
writes coalesced.

Why: in the SEESAW main loop the 8 compute warps issue the TMA copies themselves (triton 3.6 puts a
CTA barrier between any two TMA writes into one allocation: 18 ``BAR.SYNC`` per pair) and a slot can
only be refilled once both warpgroups' wgmmas reading it are done. By tiles (``P_0 V_0`` then
``P_1 V_1``), slot 1 is released last and every column block of the next pair's scores waits for it:
its whole refill is exposed. By column halves (``O[:, :256] += P V[:, :256]`` then ``O[:, 256:] +=
P V[:, 256:]``, each m64 n256 k128 over both tiles), column blocks 0..3 of both slots are released
after the first and refilled under the second; the next scores stream in the same column order, so
they start on blocks 0..3 while 4..7 and the rope (P) still load.

Measured (H200, triton 3.6, L = 46,000, B = 1, P = 64, graph-timed with the split merge, session 6,
``bench/RESULTS.md``): against the seesaw, T=16,H=64 202.8 vs 211.5 us, T=65,H=8 119.7 vs 127.1,
T=128,H=8 207.2 vs 214.3, T=64,H=8 117.5 vs 115.3 (calls D/E differ by ~1%); by tiles (no
COLSPLIT) it is within a few % of the seesaw either way.

Partitions (``gl.warp_specialize``; 12 warps per CTA):

* default partition (the kernel's 8 warps = 2 consumer warpgroups, ``setmaxnreg`` 240 registers): Q
  load (cp.async), the pair loop (streamed scores, softmax with the cross-warpgroup exchange, P over
  the rope rows, ``O += P V``; by column halves the row maxima cross the warpgroups in one exchange,
  ``_softmax_xwg``), the masked tiles (``MASKED_PAIRS``, full row blocks with more than one: as masked pairs
  of the producer's stream, ``_pair_mask``, ahead of the full pairs, ``MASKED_FIRST``; else the one-tile tail,
  cp.async into rows 0..63, ``EARLY_TAIL_MASK``: each tile's tree-mask words loaded before its copy) and the
  store (16-bit split partials by TMA boxes from the pair buffers, ``TMA_STORE``). It
  never issues a TMA copy. COLSPLIT: O is two accumulators ``oa`` / ``ob`` (columns 0..255 / 256..511,
  each warpgroup 128 columns of each, 64 registers each).
* worker partition ``_ws_producer`` (``PRODUCER_WARPS`` = 4 warps, ``PRODUCER_REGS`` = 24 registers):
  page-table lookups, the TMA boxes of every pair and (``L2_PREFETCH``) the bulk L2 prefetch one pair
  ahead. It exits after issuing the last pair. On triton 3.6 the prefetch gave the kernel a 440-byte
  stack frame whose loads sat in the consumers' pair loop (without it the kernel was faster from 65 to
  256 rows, session 7 call D: ``"gluon-ws-noprefetch"``, kept for comparisons); with the coalesced
  store (``COALESCED_STORE_PREFETCH``) the frame is 24 bytes and the prefetch wins at every row count
  measured (session 11 call F).

Barriers (all ``count=1``, each its own allocation, initialised before the fork):

* ``cbars[c]``, c = 0..8 (8 latent column blocks + rope): pair i completes phase i of every
  ``cbars[c]`` once block c of both slots has landed (armed for 16 KB by the producer). Consumers wait
  with parity ``i & 1`` (``_qk_streamed``). The producer cannot arm phase i+1 before the consumers have
  released what that block overwrites (it waits on ``empty*`` first), so a parity wait never aliases.
* ``empty0`` / ``empty1``: by tiles, slot 0 / slot 1; COLSPLIT, latent blocks 0..3 of both slots /
  blocks 4..7 and the rope rows of both slots. Pair i (i + 1 < n_pairs) completes phase i of each:
  consumer ``wgmma_wait`` -> partition barrier (both warpgroups' wgmmas reading it are done) ->
  ``mbarrier.arrive`` (one thread). Producer, before refilling them for pair j >= 1: ``wait(empty*,
  (j - 1) & 1)``. No arrival for the last pair (arrivals == waits); with ``MASKED_PAIRS`` the full blocks'
  consumers release every pair and the producer waits for the last one's releases before it exits.
  ``NAMED_RELEASE`` (by column halves, the default): hardware barriers ``RELEASE_BAR0`` / ``RELEASE_BAR1``
  (14 / 15, 384 threads) instead: every consumer thread ``bar.arrive``s after its own warpgroup's
  ``wgmma_wait`` (no partition barrier), the producer's 128 threads ``bar.sync`` before the refill. A
  phase cannot be overtaken: a consumer thread arrives for pair i+1 only after the copies the producer
  issued behind its sync for pair i have landed. After the loop one partition barrier (the tail reuses the
  buffers).
* The consumers' ``gl.thread_barrier`` / ``gl.barrier`` compile to ``bar.sync 0, 256`` (partition
  local); the membar barriers between the producer's TMA issues are ``bar.sync 2, 128``; barrier 1
  (all 384 threads) is the region's fork / join only.

Launch (``SPLIT_PDL``): by programmatic dependent launch where the rows fill the last block or it is narrow;
each program waits in ``griddepcontrol.wait`` before its first global read, and the kernels before it (the
split merge, the KV write) signal their dependents at their start, so the grid is placed while they run.

Tail / exit: every TMA copy belongs to some pair (< n_pairs, or a masked pair after them) and the
consumers wait for all of them before that pair's scores, so by the tail no copy is in flight. n_pairs = 0: the producer issues
nothing, the consumers run the tail only.

Shared memory: Q 73,728 + pair buffer 147,456 (P 64 x 128 bf16 over the rope rows) + tail P 8,192 +
the warpgroups' exchange of row maxima 512 (``XWG_SOFTMAX``) + reduction scratch / capture area + 11
mbarriers = 230,540 B of the 232,448 (launches with a narrow block; 222,348 without, ahead of time).

Row gathers (pages below a tile, COLSPLIT only): the producer (``GATHER_PRODUCER_REGS`` = 40
registers, the consumers then get 232) copies each column block of both tiles by cp.async row
gathers, one group per block; as each group lands it fences (generic -> async proxy), syncs its 128
threads and arrives once on the block's barrier (count 1, no transaction bytes), so the consumers wait
exactly as for TMA. Blocks 4..8 are issued as soon as ``empty1`` frees them, each followed by the
arrival of the block four groups back. Chunks are 64-key aligned, as in the seesaw's gather path.
Session 7 (call B, P = 1, us): T=64,H=8 120.9 vs the seesaw's gathers 136.1, T=16,H=64 217.4 vs
241.1, T=65,H=8 127.5 vs 146.0, T=16,H=8 52.4 vs 58.0; the fragmented pool is then within 1-7% of
the P = 64 times (``bench/RESULTS.md``).

Narrow last row block (``NARROW_LAST_BLOCK``; at least ``NARROW_MIN_BLOCKS`` row blocks, the last with at
most 16 real rows, e.g. T=65,H=8): that block's consumers run ``_narrow_pairs`` (the rows as the MMAs' N:
``S^T = K Q^T``, ``O^T += V^T P^T``) over the same producer stream, then lay the state back out as rows for
the masked tail and the store. The grid's first axis then lists the full blocks' programs and the narrow
block's (``_program``), which has its own split count and writes its surplus partial slots empty.

``PROBE`` (bench only, wrong results, by tiles): the pair loop with parts left out -- copies alone,
scores + ``P V`` without the softmax, scores alone (``bench/gluon_check.py --probes``). Session 6 at
T=64,H=8: 66.8 / 104.1 / 90.9 us against 121.4 for the whole (merge included in each).

Tried and not kept (session 6): each warpgroup a partition of its own in FlashMLA's order (warpgroup
1's softmax under warpgroup 0's ``P V``): correct, but 188.6 vs 115.3 us at T=64,H=8 -- the max chain
serialises the two softmaxes and slot 0 is released only after warpgroup 1's softmax (commit
``88613c0``); COLSPLIT in the non-specialised seesaw (the consumers issue the copies): 121.8 vs
115.3 us.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch
import triton

from . import _verify_gluon
from ._splitkv import merge_pdl, pdl_capable
from .configs import num_sms
from ._verify_gluon import (BLOCK_M, BLOCK_N, D_LAT, D_PE, GLUON_AVAILABLE, LOG2E, NUM_WARPS, SMEM_LIMIT_SM90, _check,
                            _IMPORT_ERROR, _kv_smem3_layout, _kv_smem_layout, kv_descriptor, kv_descriptor_pages)

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from ._verify_gluon import (_clock, _cta_barrier, _issue_pair_tile, _launch_dependents, _load_q, _masked_tail,
                                _wait_prior_grid,
                                _new_bar, _now, _page_row_p, _prefetch_tile_l2, _publish_p, _qk_streamed, _row_scale,
                                _softmax, _store_o, _store_timeline, _tail_rows, _tail_tile_p, _tma_load, _tma_store,
                                _cp_async,
                                _gather_pages)

# Producer partition: warps and the register count it asks for (setmaxnreg); the consumers get the rest.
PRODUCER_WARPS = 4
PRODUCER_REGS = int(os.environ.get("TRITREE_WS_PRODUCER_REGS", "24"))
# ... when it gathers rows (pages below a tile): row addresses for 4 rows x 2 tiles per thread.
GATHER_PRODUCER_REGS = 40

if GLUON_AVAILABLE:
    # NAMED_RELEASE: the hardware barriers (of 16; triton takes 0..2 here) that release the two halves of
    # the pair buffers, each completed by the 256 consumer arrivals and the producer's 128 threads.
    RELEASE_BAR0 = gl.constexpr(14)
    RELEASE_BAR1 = gl.constexpr(15)
    RELEASE_THREADS = gl.constexpr((NUM_WARPS + PRODUCER_WARPS) * 32)

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
    def _release(empty, BAR: gl.constexpr, more, NAMED: gl.constexpr):
        """Consumers: hand the buffers ``empty`` / hardware barrier ``BAR`` guards back to the producer
        (after this thread's ``warpgroup_mma_wait`` on the wgmmas reading them). ``NAMED``: each thread
        arrives on ``BAR`` (no wait); else a partition barrier (both warpgroups done) and one arrival on
        ``empty``. ``more``: the producer refills them (not after the last pair)."""
        if NAMED:
            _named_barrier(BAR, RELEASE_THREADS, more, False)
        else:
            _cta_barrier()
            mbarrier.arrive(empty, pred=more)

    @gluon.jit
    def _acquire(empty, BAR: gl.constexpr, phase, NAMED: gl.constexpr):
        """Producer: wait until the consumers released the buffers of ``_release`` (release number
        ``phase``, counted from 0; parity for the mbarrier)."""
        if NAMED:
            _named_barrier(BAR, RELEASE_THREADS, phase >= 0, True)  # always true, as a tensor predicate
        else:
            mbarrier.wait(empty, phase & 1)

    @gluon.jit
    def _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, C0: gl.constexpr, C1: gl.constexpr,
                           D_LAT: gl.constexpr, BLOCK_N: gl.constexpr, kv_desc2=None, WIDE: gl.constexpr = False):
        """COLSPLIT: TMA of column blocks ``C0 .. C1-1`` (block 8 = rope) of both tiles of a pair (rows
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
    def _tile_page_slot(pt, n, n_keys, max_pages, num_pages, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
        """MASKED_PAIRS: the paged-view coordinates ``(page, slot)`` of the tile of keys ``n .. n+63`` (``n`` a
        multiple of 64), moved back by ``_tile_shift`` where the request's keys end inside it: its 64 rows are
        then keys of the request (or zeros, where the slot goes below 0), never a stale slot past the end."""
        col = gl.minimum(n // PAGE_SIZE, max_pages - 1)
        page = gl.minimum(gl.maximum(gl.load(pt + col), 0), num_pages - 1)
        return page, n % PAGE_SIZE - _tile_shift(n, n_keys, BLOCK_N)

    @gluon.jit
    def _tile_shift(n, n_keys, BLOCK_N: gl.constexpr):
        """How far the tile of keys ``n .. n+63`` is copied from before ``n``: ``n + 64 - n_keys`` if the
        request's ``n_keys`` keys end inside it, else 0. Row r of the copy then holds key ``n - shift + r``."""
        return gl.where((n < n_keys) & (n_keys < n + BLOCK_N), n + BLOCK_N - n_keys, 0)

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
    def _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits, n_pairs, NARROW_ROWS: gl.constexpr,
                     BLOCK_M: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
        """After the pair loop, from kernel parameters (nothing kept live across it): ``(kv_len, tree_len,
        start, end, n_masked)``: this split's keys and its MASKED_PAIRS count (pairs of tiles from the end
        of the full pairs to ``end``, where that is more than one tile; none in the narrow row block: their
        tails stay one tile at a time, ``_masked_tail_halves``)."""
        _, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
        b = gl.program_id(2)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, splits, PAGE_SIZE)
        rest = end - (start + n_pairs * 2 * BLOCK_N)
        n_masked = gl.where(rest > BLOCK_N, gl.cdiv(rest, 2 * BLOCK_N), 0)
        if NARROW_ROWS > 0:
            n_masked = gl.where(narrow, 0, n_masked)
        return kv_len, tree_len, start, end, n_masked

    @gluon.jit
    def _pair_visible_words(n, n_keys, end, kv_len, tree_len, row_ok, t, mask_base, stride_mt,
                            vw_layout: gl.constexpr, BLOCK_N: gl.constexpr):
        """MASKED_PAIRS: ``[64 rows, 4]`` int32 whose bit b of word q says whether column ``32 q + b`` of a
        pair's scores is visible (tile w = keys ``n + 64 w ..``, copied as ``_tile_page_slot`` places it):
        the key is this split's (not below the tile's start, the copy's shift, nor past ``end``) and is a
        prefix key or a tree key whose ancestor bit is set. Row vectors only: a 32-key window of each row's
        tree-mask bits from two words, and the split's key range, per word."""
        q = gl.arange(0, 4, layout=gl.SliceLayout(0, vw_layout))
        lo = n + (q // 2) * BLOCK_N  # the start of tile q // 2
        k0 = lo - _tile_shift(lo, n_keys, BLOCK_N) + (q % 2) * 32  # the key of column 32 q
        j0 = gl.expand_dims(k0 - kv_len, 0)
        a = j0 >> 5  # (arithmetic: floor also below 0)
        row_ptr = gl.expand_dims(mask_base + t * stride_mt, 1)
        ok = gl.expand_dims(row_ok, 1)
        w_lo = gl.load(row_ptr + a, mask=ok & (a >= 0) & (a * 32 < tree_len), other=0)
        w_hi = gl.load(row_ptr + a + 1, mask=ok & (a >= -1) & ((a + 1) * 32 < tree_len), other=0)
        w_lo = gl.where(a < 0, -1, w_lo)  # prefix keys: visible
        w_hi = gl.where(a < -1, -1, w_hi)
        win = ((w_hi.to(gl.int64) << 32) | (w_lo.to(gl.int64) & 4294967295)) >> (j0 & 31).to(gl.int64)
        one = gl.full([4], 1, gl.int64, layout=gl.SliceLayout(0, vw_layout))
        b_hi = gl.minimum(gl.maximum(end - k0, 0), 32).to(gl.int64)
        b_lo = gl.minimum(gl.maximum(lo - k0, 0).to(gl.int64), b_hi)  # (a tile past the end: none)
        in_split = gl.expand_dims(((one << b_hi) - 1) ^ ((one << b_lo) - 1), 0)
        return gl.where(ok, win & in_split, 0).to(gl.int32)

    @gluon.jit
    def _pair_mask(s, vis, s4_layout: gl.constexpr):
        """-inf in a pair's scores ``s: [64, 128]`` where ``vis`` (``_pair_visible_words``) has the bit clear;
        ``s4_layout``: ``s`` viewed as ``[64, 4 words, 32 bits]``."""
        BM: gl.constexpr = s.shape[0]
        s4 = gl.convert_layout(gl.reshape(s, [BM, 4, 32]), s4_layout, assert_trivial=True)
        b = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(0, s4_layout)))
        bit = (gl.expand_dims(vis, 2) >> gl.expand_dims(gl.expand_dims(b, 0), 0)) & 1
        s4 = gl.where(bit != 0, s4, float("-inf"))
        return gl.convert_layout(gl.reshape(s4, [BM, s.shape[1]]), s.type.layout, assert_trivial=True)

    @gluon.jit
    def _masked_tail_halves(oa, ob, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV, PageTable,
                            TreeMask, b, pid_m, tail_start, end, kv_len, tree_len, T, H, stride_ptb, max_pages,
                            num_pages, stride_kvp, stride_kvs, stride_mb, stride_mt, sm_scale_log2e,
                            s_layout: gl.constexpr, oh_layout: gl.constexpr, ld_layout: gl.constexpr,
                            PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_M: gl.constexpr,
                            BLOCK_N: gl.constexpr, EARLY_MASK: gl.constexpr = False):
        """``_masked_tail`` (SEESAW buffers) with O as two column halves ``oa`` / ``ob`` (COLSPLIT).
        ``EARLY_MASK``: ``_tail_tile_p``'s. Returns ``(oa, ob, m_i, l_i)``."""
        HALF: gl.constexpr = D_LAT // 2
        s_zero, t, row_ok, mask_base = _tail_rows(TreeMask, b, pid_m, T, H, tree_len, stride_mb, s_layout, BLOCK_M,
                                                  BLOCK_N)
        for n in range(tail_start, end, BLOCK_N):
            p, alpha, m_i, l_i, tail_lat = _tail_tile_p(
                n, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, KV, PageTable, b, tail_start, end,
                kv_len, tree_len, row_ok, t, mask_base, stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs,
                stride_mt, sm_scale_log2e, s_zero, s_layout, ld_layout, True, PAGE_SIZE, D_LAT, BLOCK_N, EARLY_MASK)
            oa = _publish_p(p, alpha, oa, p_smem, oh_layout)
            ob = ob * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, oh_layout)), 1)
            oa = warpgroup_mma(p_smem, tail_lat.slice(0, HALF, dim=1), oa)
            ob = warpgroup_mma(p_smem, tail_lat.slice(HALF, HALF, dim=1), ob)
            _cta_barrier()
        return oa, ob, m_i, l_i

    @gluon.jit
    def _softmax_xwg(s, m_i, l_w, sm_scale_log2e, xbuf, s3_layout: gl.constexpr, both_layout: gl.constexpr):
        """``_softmax`` of a pair's scores ``s: [64, 128]`` (warpgroup w holds keys 64 w .. 64 w + 63) with one
        exchange between the warpgroups: each one's row maxima through ``xbuf`` (``[64, 2]`` fp32) and one
        partition barrier, instead of the generic cross-warp reductions (three barriers for the max, two for
        the sum). The row sums stay apart: ``l_w[r, w]`` sums warpgroup w's keys (the same ``alpha`` scales
        both); their total is taken once, after the loop. ``s3_layout``: ``s`` viewed as ``[64, 2, 64]``
        (row, warpgroup, key); ``both_layout``: ``[64, 2]`` with both warpgroups' values in each thread."""
        BM: gl.constexpr = s.shape[0]
        HALF_N: gl.constexpr = s.shape[1] // 2
        # The maxima of the raw scores, then scaled (the scale is positive, and rounding is monotonic: the
        # same value): the exponents below are then one FMA each, with no scaled copy of the scores.
        m_w = gl.max(gl.convert_layout(gl.reshape(s, [BM, 2, HALF_N]), s3_layout, assert_trivial=True), 2)
        m_w = m_w * sm_scale_log2e
        xbuf.store(m_w)
        _cta_barrier()  # both warpgroups' maxima written (the next store is after this pair's P barrier)
        m_cur = gl.convert_layout(gl.max(xbuf.load(both_layout), 1), m_i.type.layout, assert_trivial=True)
        m_new = gl.maximum(m_i, m_cur)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s * sm_scale_log2e - gl.expand_dims(m_safe, 1))
        l_part = gl.sum(gl.convert_layout(gl.reshape(p, [BM, 2, HALF_N]), s3_layout, assert_trivial=True), 2)
        alpha_w = gl.convert_layout(alpha, gl.SliceLayout(1, gl.SliceLayout(2, s3_layout)), assert_trivial=True)
        return p.to(gl.bfloat16), alpha, m_new, l_w * gl.expand_dims(alpha_w, 1) + l_part

    @gluon.jit
    def _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, empty0, empty1, more, sm_scale_log2e, xbuf,
                       s3_layout: gl.constexpr, both_layout: gl.constexpr, oh_layout: gl.constexpr,
                       D_LAT: gl.constexpr, XWG_SOFTMAX: gl.constexpr, NAMED: gl.constexpr):
        """One pair of ``_colsplit_pairs`` from its scores ``s``: softmax, P, ``O += P V`` by column halves,
        the two releases. ``l``: the row sums (``l_w`` with ``XWG_SOFTMAX``). Returns ``(oa, ob, m_i, l)``."""
        HALF: gl.constexpr = D_LAT // 2
        if XWG_SOFTMAX:
            p, alpha, m_i, l = _softmax_xwg(s, m_i, l, sm_scale_log2e, xbuf, s3_layout, both_layout)
        else:
            p, alpha, m_i, l = _softmax(s, m_i, l, sm_scale_log2e)
        oa = _publish_p(p, alpha, oa, p2_smem, oh_layout)
        ob = ob * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, oh_layout)), 1)
        oa = warpgroup_mma(p2_smem, k_lat.slice(0, HALF, dim=1), oa, is_async=True)
        ob = warpgroup_mma(p2_smem, k_lat.slice(HALF, HALF, dim=1), ob, is_async=True)
        oa = warpgroup_mma_wait(num_outstanding=1, deps=[oa])
        _release(empty0, RELEASE_BAR0, more, NAMED)  # column blocks 0..3 of both slots read ...
        ob = warpgroup_mma_wait(num_outstanding=0, deps=[ob])
        _release(empty1, RELEASE_BAR1, more, NAMED)  # ... and blocks 4..7 and the rope rows (P)
        return oa, ob, m_i, l

    @gluon.jit
    def _masked_pair_steps(oa, ob, m_i, l, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, empty0, empty1, n_pairs, first,
                           s2_zero, sm_scale_log2e, xbuf, s3_layout: gl.constexpr, both_layout: gl.constexpr,
                           oh_layout: gl.constexpr, D_LAT: gl.constexpr, XWG_SOFTMAX: gl.constexpr, NAMED: gl.constexpr,
                           tail_args, NARROW_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """``_colsplit_pairs``' masked pairs (``MASKED_PAIRS``): the split's keys from the end of its ``n_pairs``
        full pairs to its end, as pairs ``first ..`` of the producer's stream, each released. Returns ``(oa, ob,
        m_i, l, n_masked)``."""
        BLOCK_M: gl.constexpr = s2_zero.shape[0]
        BLOCK_N: gl.constexpr = s2_zero.shape[1] // 2
        KvLens, TreeLens, TreeMask, T, H, num_splits, narrow_splits, stride_mb, stride_mt = tail_args
        kv_len, tree_len, start, end, n_masked = _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits,
                                                              n_pairs, NARROW_ROWS, BLOCK_M, PAGE_SIZE, BLOCK_N)
        # the scores as [64 rows, 4 words, 32 keys] (s3_layout's bases with the keys' bit 5 and the
        # warpgroup as the word)
        s4_layout: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [8, 0, 0], [0, 0, 8], [0, 0, 16], [0, 1, 0]],
            lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[16, 0, 0], [32, 0, 0], [0, 2, 0]], block_bases=[], shape=[64, 4, 32])
        vw_layout: gl.constexpr = gl.SliceLayout(2, s4_layout)
        pid_m, _, _, _ = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, vw_layout))
        t = rows // H
        row_ok = (rows < T * H) & (t < tree_len)
        mask_base = TreeMask + gl.program_id(2).to(gl.int64) * stride_mb
        for k in range(n_masked):
            vis = _pair_visible_words(start + (n_pairs + k) * 2 * BLOCK_N, kv_len + tree_len, end, kv_len, tree_len,
                                      row_ok, t, mask_base, stride_mt, vw_layout, BLOCK_N)
            s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, (first + k) & 1, s2_zero, D_LAT)
            s = _pair_mask(s, vis, s4_layout)
            oa, ob, m_i, l = _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, empty0, empty1, k >= 0, sm_scale_log2e,
                                            xbuf, s3_layout, both_layout, oh_layout, D_LAT, XWG_SOFTMAX, NAMED)
        return oa, ob, m_i, l, n_masked

    @gluon.jit
    def _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, empty0, empty1, n_pairs, s2_zero,
                        sm_scale_log2e, oh_layout: gl.constexpr, D_LAT: gl.constexpr, xbuf=None,
                        XWG_SOFTMAX: gl.constexpr = False, NAMED: gl.constexpr = False, tail_args=None,
                        MASKED: gl.constexpr = False, NARROW_ROWS: gl.constexpr = 0, PAGE_SIZE: gl.constexpr = 64):
        """The COLSPLIT pair loop of a 64-row block (see ``_ws_consumer``). Returns ``(oa, ob, m_i, l_i)``.
        ``XWG_SOFTMAX``: the softmax by ``_softmax_xwg`` (``xbuf``: its exchange buffer). ``NAMED``: the
        buffers released by ``_release``'s hardware barriers (``NAMED_RELEASE``). ``MASKED``
        (``MASKED_PAIRS``): then the split's masked tiles as pairs from the producer's stream
        (``_pair_mask``), every pair released (the producer takes the last release too); ``tail_args``:
        ``(KvLens, TreeLens, TreeMask, T, H, num_splits, narrow_splits, stride_mb, stride_mt)``, kernel
        parameters."""
        s3_layout: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [8, 0, 0], [0, 0, 8], [0, 0, 16], [0, 0, 32]],
            lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[16, 0, 0], [32, 0, 0], [0, 1, 0]], block_bases=[], shape=[64, 2, 64])
        both_layout: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[8, 0], [0, 1]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0], [0, 0]], block_bases=[], shape=[64, 2])
        if XWG_SOFTMAX:
            # (s3_layout: the accumulator layout of the scores, NVMMA v3, warps [4, 2], n64 a warpgroup, as
            # linear bases, viewed as [64 rows, 2 warpgroups, 64 keys]; checked by assert_trivial)
            w_layout: gl.constexpr = gl.SliceLayout(2, s3_layout)
            # l_i (this block's sum so far) as warpgroup 0's part
            first = gl.expand_dims(gl.arange(0, 2, layout=gl.SliceLayout(0, w_layout)), 0) == 0
            l_in = gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, w_layout), assert_trivial=True), 1)
            l = gl.where(first, l_in, 0.0)
        else:
            l = l_i
        first = 0  # pairs of the stream ahead of the full ones: the masked ones with MASKED == 2
        if MASKED == 2:
            oa, ob, m_i, l, first = _masked_pair_steps(oa, ob, m_i, l, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, empty0,
                                                       empty1, n_pairs, 0, s2_zero, sm_scale_log2e, xbuf, s3_layout,
                                                       both_layout, oh_layout, D_LAT, XWG_SOFTMAX, NAMED, tail_args,
                                                       NARROW_ROWS, PAGE_SIZE)
        for i in range(first, first + n_pairs):
            s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, i & 1, s2_zero, D_LAT)
            if MASKED:
                more = i >= 0
            else:
                more = i + 1 < n_pairs
            oa, ob, m_i, l = _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, empty0, empty1, more, sm_scale_log2e,
                                            xbuf, s3_layout, both_layout, oh_layout, D_LAT, XWG_SOFTMAX, NAMED)
        if MASKED == 1:
            oa, ob, m_i, l, _ = _masked_pair_steps(oa, ob, m_i, l, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, empty0,
                                                   empty1, n_pairs, n_pairs, s2_zero, sm_scale_log2e, xbuf, s3_layout,
                                                   both_layout, oh_layout, D_LAT, XWG_SOFTMAX, NAMED, tail_args,
                                                   NARROW_ROWS, PAGE_SIZE)
        if NAMED:
            _cta_barrier()  # both warpgroups' last wgmmas done before the tail refills the buffers
        if XWG_SOFTMAX:
            l_i = gl.convert_layout(gl.sum(l, 1), l_i.type.layout)
        else:
            l_i = l
        return oa, ob, m_i, l_i

    @gluon.jit
    def _narrow_pairs(q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1, n_pairs, sm_scale_log2e,
                      oh_layout: gl.constexpr, row_s_layout: gl.constexpr, NR: gl.constexpr, D_LAT: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NAMED: gl.constexpr = False):
        """The pair loop of a row block whose real rows are its first ``NR`` (8 or 16), transposed so that
        the rows are the MMAs' N: ``S^T = K Q^T`` (m128 nNR: warpgroup w computes tile w's 64 keys) and
        ``O^T += V^T P^T`` by column halves (m256 nNR k128; V^T straight from the tiles, an MN-major A),
        instead of a 64-row block's MMAs for NR rows. Same copies, barriers and release order as
        ``_colsplit_pairs``; P^T goes through ``p_smem``. Returns the state as ``_colsplit_pairs`` does
        (``oa``, ``ob`` in ``oh_layout``, ``m_i``, ``l_i`` in ``row_s_layout``; rows NR.. zero / -inf),
        re-laid out through the pair buffers (free after the loop: every copy issued has been consumed)."""
        HALF: gl.constexpr = D_LAT // 2
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, NR, 16])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        pt_smem = p_smem._reinterpret(gl.bfloat16, [NR, PAIR_N], smem_layout)
        q_t = q_lat.slice(0, NR, dim=0)
        qpe_t = q_pe.slice(0, NR, dim=0)
        m_t = gl.full([NR], float("-inf"), gl.float32, layout=gl.SliceLayout(0, t_layout))
        l_t = gl.zeros([NR], gl.float32, layout=gl.SliceLayout(0, t_layout))
        oa_t = gl.zeros([HALF, NR], gl.float32, layout=t_layout)
        ob_t = gl.zeros([HALF, NR], gl.float32, layout=t_layout)
        st_zero = gl.zeros([PAIR_N, NR], gl.float32, layout=t_layout)
        for i in range(n_pairs):
            s = _qk_streamed(q_t, qpe_t, k_lat, k_pe, cbars, i & 1, st_zero, D_LAT, True)
            p, alpha, m_t, l_t = _softmax(s, m_t, l_t, sm_scale_log2e, 0)  # down S^T's columns
            pt_smem.store(gl.permute(p, [1, 0]))
            fence_async_shared()
            _cta_barrier()  # both warpgroups' keys of P^T written
            oa_t = oa_t * gl.expand_dims(alpha, 0)
            ob_t = ob_t * gl.expand_dims(alpha, 0)
            oa_t = warpgroup_mma(k_lat.slice(0, HALF, dim=1).permute([1, 0]), pt_smem.permute([1, 0]), oa_t,
                                 is_async=True)
            ob_t = warpgroup_mma(k_lat.slice(HALF, HALF, dim=1).permute([1, 0]), pt_smem.permute([1, 0]), ob_t,
                                 is_async=True)
            more = i + 1 < n_pairs
            oa_t = warpgroup_mma_wait(num_outstanding=1, deps=[oa_t])
            _release(empty0, RELEASE_BAR0, more, NAMED)  # column blocks 0..3 of both slots read ...
            ob_t = warpgroup_mma_wait(num_outstanding=0, deps=[ob_t])
            _release(empty1, RELEASE_BAR1, more, NAMED)  # ... blocks 4..7 (and the rope rows, read by the scores)
        if NAMED:
            _cta_barrier()  # both warpgroups' last wgmmas done before the buffers are reused
        # back to rows: O^T through the dead pair buffers, m and l through p_smem
        stage_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        flat_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        stage = k_lat._reinterpret(gl.float32, [BLOCK_M, D_LAT], stage_layout)
        ml = p_smem._reinterpret(gl.float32, [2 * BLOCK_M], flat_layout)  # m at 0.., l at BLOCK_M..
        stage.slice(0, NR, dim=0).slice(0, HALF, dim=1).store(gl.permute(oa_t, [1, 0]))
        stage.slice(0, NR, dim=0).slice(HALF, HALF, dim=1).store(gl.permute(ob_t, [1, 0]))
        ml.slice(0, NR).store(m_t)
        ml.slice(BLOCK_M, NR).store(l_t)
        _cta_barrier()
        real = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, oh_layout)) < NR, 1)
        oa = gl.where(real, stage.slice(0, HALF, dim=1).load(oh_layout), 0.0)
        ob = gl.where(real, stage.slice(HALF, HALF, dim=1).load(oh_layout), 0.0)
        real_row = gl.arange(0, BLOCK_M, layout=row_s_layout) < NR
        m_i = gl.where(real_row, ml.slice(0, BLOCK_M).load(row_s_layout), float("-inf"))
        l_i = gl.where(real_row, ml.slice(BLOCK_M, BLOCK_M).load(row_s_layout), 0.0)
        _cta_barrier()  # read before the tail's copies reuse the buffers
        return oa, ob, m_i, l_i

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
        """Keys ``[start, end)`` of split ``pid_s`` (as ``_verify_gluon_kernel``: page-aligned chunks, or
        64-key-aligned ones for pages below a tile)."""
        n_keys = kv_len + tree_len
        if PAGE_SIZE < 64:
            chunk = gl.cdiv(gl.cdiv(n_keys, num_splits), 64) * 64
        else:
            chunk = gl.cdiv(gl.cdiv(n_keys, num_splits), PAGE_SIZE) * PAGE_SIZE
        start = pid_s * chunk
        end = gl.minimum(start + chunk, n_keys)
        return start, end

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
    def _issue_masked_pairs(kv_desc_pages, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, first, n_masked,
                            n_keys, end, max_pages, num_pages, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr,
                            BLOCK_N: gl.constexpr, NAMED: gl.constexpr):
        """Producer, ``MASKED_PAIRS``: the split's ``n_masked`` masked pairs (its keys from the end of its
        ``n_pairs`` full pairs to ``end``) as pairs ``first ..`` of the stream (their phases), over the paged
        view (``_issue_pair_pages``: a tile in which the keys end copied from before its start,
        ``_tile_page_slot``; a pair's second tile past the end a copy of its first)."""
        for k in range(n_masked):
            j = first + k
            n = start + 2 * (n_pairs + k) * BLOCK_N
            pg0, sl0 = _tile_page_slot(pt, n, n_keys, max_pages, num_pages, PAGE_SIZE, BLOCK_N)
            pg1, sl1 = _tile_page_slot(pt, n + BLOCK_N, n_keys, max_pages, num_pages, PAGE_SIZE, BLOCK_N)
            past = n + BLOCK_N >= end
            pg1 = gl.where(past, pg0, pg1)
            sl1 = gl.where(past, sl0, sl1)
            if j > 0:
                _acquire(empty0, RELEASE_BAR0, j - 1, NAMED)
            _issue_pair_pages(kv_desc_pages, k_lat, k_pe, cbars, pg0, sl0, pg1, sl1, 0, D_LAT // 128, D_LAT, BLOCK_N)
            if j > 0:
                _acquire(empty1, RELEASE_BAR1, j - 1, NAMED)
            _issue_pair_pages(kv_desc_pages, k_lat, k_pe, cbars, pg0, sl0, pg1, sl1, D_LAT // 128, D_LAT // 64 + 1,
                              D_LAT, BLOCK_N)

    @gluon.jit
    def _ws_producer(kv_desc, KV, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, stride_kvp, stride_kvs,
                     max_pages, num_pages, PAGE_SIZE: gl.constexpr, L2_PREFETCH: gl.constexpr, D_LAT: gl.constexpr,
                     BLOCK_N: gl.constexpr, COLSPLIT: gl.constexpr = False, kv_desc2=None,
                     WIDE: gl.constexpr = False, NAMED: gl.constexpr = False, kv_desc_pages=None, tail_args=None,
                     MASKED: gl.constexpr = False, NARROW_ROWS: gl.constexpr = 0, BLOCK_M: gl.constexpr = 64):
        """Worker partition: all TMA copies of the pair loop. Pair j's slot s is refilled once the
        consumers released pair j-1's slot s (``empty_s`` phase j-1). ``COLSPLIT``: ``empty0`` / ``empty1``
        release the latent column blocks 0..3 / 4..7 and the rope of both slots instead. Pages below a
        tile (GATHER, COLSPLIT only): cp.async row gathers by the producer's 128 threads instead of TMA.
        ``MASKED`` (``MASKED_PAIRS``, over TMA by column halves): then the split's masked tiles as pairs over
        the paged view (``_issue_pair_pages``: where the keys end inside a tile it is copied from before its
        start, ``_tile_page_slot``; a pair's second tile past the end is a copy of its first), and the
        consumers' last releases are taken (they release every pair). ``tail_args``: ``(KvLens, TreeLens, T, H,
        num_splits, narrow_splits)``, kernel parameters."""
        if PAGE_SIZE < BLOCK_N:
            gl.static_assert(COLSPLIT, "row gathers: column halves only")
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
                    _acquire(empty0, RELEASE_BAR0, j - 1, NAMED)
                for c in gl.static_range(0, D_LAT // 128):
                    _gather_block(tok0, tok1, d, g_blocks, k_pe, c, D_LAT, BLOCK_N)
                # Blocks 4..8 issued as soon as their space is free, each issue followed by the arrival
                # of the block four groups back: neither do the first half's arrivals wait for empty1
                # and the whole second issue, nor the second issue for the first half's landing (that
                # order was 7-10% slower at P = 1, session 7, call B).
                if j > 0:
                    _acquire(empty1, RELEASE_BAR1, j - 1, NAMED)
                for c in gl.static_range(D_LAT // 128, D_LAT // 64 + 1):
                    _gather_block(tok0, tok1, d, g_blocks, k_pe, c, D_LAT, BLOCK_N)
                    _gather_landed(cbars, c - D_LAT // 128, D_LAT // 128)
                for c in gl.static_range(D_LAT // 128 + 1, D_LAT // 64 + 1):
                    _gather_landed(cbars, c, D_LAT // 64 - c)
        elif COLSPLIT:
            first = 0  # pairs issued ahead of the full ones: the masked ones with MASKED == 2
            if MASKED:
                KvLens, TreeLens, T, H, num_splits, narrow_splits = tail_args
            if MASKED == 2:
                kv_len, tree_len, _, end, n_masked = _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits,
                                                                  n_pairs, NARROW_ROWS, BLOCK_M, PAGE_SIZE, BLOCK_N)
                _issue_masked_pairs(kv_desc_pages, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, 0, n_masked,
                                    kv_len + tree_len, end, max_pages, num_pages, PAGE_SIZE, D_LAT, BLOCK_N, NAMED)
                first = n_masked
            for j in range(n_pairs):
                n = start + 2 * j * BLOCK_N
                row0 = _page_row_p(pt, n, max_pages, num_pages, PAGE_SIZE)
                row1 = _page_row_p(pt, n + BLOCK_N, max_pages, num_pages, PAGE_SIZE)
                jj = j + first
                if jj > 0:
                    if L2_PREFETCH:
                        _prefetch_tile_l2(KV, row0, stride_kvs, num_pages * PAGE_SIZE, 127)
                        _prefetch_tile_l2(KV, row1, stride_kvs, num_pages * PAGE_SIZE, 127)
                    _acquire(empty0, RELEASE_BAR0, jj - 1, NAMED)
                _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, 0, D_LAT // 128, D_LAT, BLOCK_N, kv_desc2,
                                   WIDE)
                if jj > 0:
                    _acquire(empty1, RELEASE_BAR1, jj - 1, NAMED)
                _issue_pair_blocks(kv_desc, k_lat, k_pe, cbars, row0, row1, D_LAT // 128, D_LAT // 64 + 1, D_LAT,
                                   BLOCK_N, kv_desc2, WIDE)
            if MASKED:
                n_issued = n_pairs + first
                if MASKED == 1:  # (the extent from kernel parameters again: nothing kept live across the loop)
                    kv_len, tree_len, _, end, n_masked = _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits,
                                                                      n_pairs, NARROW_ROWS, BLOCK_M, PAGE_SIZE, BLOCK_N)
                    _issue_masked_pairs(kv_desc_pages, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, n_pairs,
                                        n_masked, kv_len + tree_len, end, max_pages, num_pages, PAGE_SIZE, D_LAT, BLOCK_N,
                                        NAMED)
                    n_issued = n_pairs + n_masked
                # the full blocks' consumers release every pair: the last one's releases taken here
                _, _, _, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
                last = n_issued - 1
                if NARROW_ROWS > 0:
                    last = gl.where(narrow, -1, last)
                if last >= 0:
                    _acquire(empty0, RELEASE_BAR0, last, NAMED)
                    _acquire(empty1, RELEASE_BAR1, last, NAMED)
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
    def _store_lse(m_i, l_i, Lse, b, pid_m, pid_s, T, H, tree_len, stride_lb, stride_lh, stride_ls,
                   BLOCK_M: gl.constexpr):
        """``_store_o``'s partial lse (log2; -inf for padding / empty rows) alone, one row a thread."""
        row_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        rows, row_in, has, l_safe, _ = _row_scale(l_i, pid_m, T, H, tree_len, row_layout, BLOCK_M)
        lse2 = gl.where(has, gl.convert_layout(m_i, row_layout) + gl.log2(l_safe), float("-inf"))
        gl.store(Lse + b.to(gl.int64) * stride_lb + pid_s * stride_ls + rows * stride_lh, lse2, mask=row_in)

    @gluon.jit
    def _ws_consumer(Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                     stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages, num_pages,
                     stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                     T, H, KvLens, TreeLens, num_splits, narrow_splits, stride_mb, n_pairs,
                     q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1, xbuf, out_desc,
                     PAGE_SIZE: gl.constexpr, SINGLE_SPLIT: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, D_LAT: gl.constexpr, D_PE: gl.constexpr, PROBE: gl.constexpr,
                     COLSPLIT: gl.constexpr, TIMELINE: gl.constexpr, COALESCED_STORE: gl.constexpr,
                     Q_ZERO_PAD: gl.constexpr, STAGE_16BIT: gl.constexpr, NARROW_ROWS: gl.constexpr,
                     XWG_SOFTMAX: gl.constexpr, NAMED_RELEASE: gl.constexpr = False,
                     EARLY_TAIL_MASK: gl.constexpr = False, MASKED_PAIRS: gl.constexpr = False,
                     TMA_STORE: gl.constexpr = False):
        """Default partition (8 warps): everything of the SEESAW TMA path but the copy issue. ``PROBE``
        (a bench-only time decomposition, wrong results): 1 = the pair loop only waits for the copies and
        releases the slots (the copy stream alone); 2 = scores and ``P V`` without the softmax (P = the
        scores, cast); 3 = scores only.

        ``COLSPLIT``: ``O`` as two column halves (``oa`` = columns 0..255, ``ob`` = 256..511; each warpgroup
        128 columns of each), and ``O += P V`` of a pair as two wgmmas by columns (m64 n256 k128 over both
        tiles) instead of by tiles: the first releases the latent column blocks 0..3 of both slots
        (``empty0``), the second blocks 4..7 and the rope rows (P). The next pair's scores stream in the
        same column order, so they start on blocks 0..3 while 4..7 still load (by tiles, slot 1 was
        released last and every column block of the next scores waited for it).

        ``TIMELINE`` (bench only): ``_verify_gluon_kernel``'s five stamps, taken by this partition.
        ``COALESCED_STORE``: as ``_verify_gluon_kernel``'s; with ``STAGE_16BIT`` (COLSPLIT, a 16-bit
        ``Out``) the rows are re-laid out already scaled and in ``Out``'s dtype. ``Q_ZERO_PAD``: as
        ``_load_q``'s ``ZERO_PAD``."""
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
        pid_m, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
        b = gl.program_id(2)
        if TIMELINE:
            t0 = _now(b)
            if TIMELINE == 2:  # the SM clock beside the timer (see launch_verify_gluon_ws' timeline)
                c0 = _clock(b)
        tree_len = gl.load(TreeLens + b)

        # ---- Q: row copies (as _verify_gluon_kernel), while the producer issues pair 0 --------------
        _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M, D_LAT,
                Q_ZERO_PAD)
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
        if TIMELINE:
            t1 = _now(b)

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
        tail_args = (KvLens, TreeLens, TreeMask, T, H, num_splits, narrow_splits, stride_mb, stride_mt)
        # ---- committed prefix: pairs of full tiles, no mask --------------------------------------
        if COLSPLIT:
            if NARROW_ROWS > 0:
                if narrow:  # the last row block: NARROW_ROWS real rows
                    oa, ob, m_i, l_i = _narrow_pairs(q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1,
                                                     n_pairs, sm_scale_log2e, oh_layout, row_s_layout, NARROW_ROWS,
                                                     D_LAT, BLOCK_M, BLOCK_N, NAMED_RELEASE)
                else:
                    oa, ob, m_i, l_i = _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars,
                                                       empty0, empty1, n_pairs, s2_zero, sm_scale_log2e, oh_layout,
                                                       D_LAT, xbuf, XWG_SOFTMAX, NAMED_RELEASE, tail_args, MASKED_PAIRS,
                                                       NARROW_ROWS, PAGE_SIZE)
            else:
                oa, ob, m_i, l_i = _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, empty0,
                                                   empty1, n_pairs, s2_zero, sm_scale_log2e, oh_layout, D_LAT, xbuf,
                                                   XWG_SOFTMAX, NAMED_RELEASE, tail_args, MASKED_PAIRS, NARROW_ROWS,
                                                   PAGE_SIZE)
        else:  # by tiles (and the probes)
            for i in range(n_pairs):
                if PROBE == 1:
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
                more = i + 1 < n_pairs
                o = warpgroup_mma_wait(num_outstanding=1, deps=[o])
                _cta_barrier()  # (partition barrier) both warpgroups are done with slot 0 (V_0, P_0) ...
                mbarrier.arrive(empty0, pred=more)  # ... thread 0 hands it to the producer
                o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
                _cta_barrier()  # ... and with slot 1
                mbarrier.arrive(empty1, pred=more)

        # ---- masked tail (one tile at a time, rows 0..63 of the pair buffers) ----------------------
        if TIMELINE:
            t2 = _now(b)
        m_i = gl.convert_layout(m_i, gl.SliceLayout(1, s_layout))
        l_i = gl.convert_layout(l_i, gl.SliceLayout(1, s_layout))
        pid_m, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
        b = gl.program_id(2)
        kv_len, tree_len, start, end, n_masked = _tail_extent(KvLens, TreeLens, T, H, num_splits, narrow_splits,
                                                              n_pairs, NARROW_ROWS, BLOCK_M, PAGE_SIZE, BLOCK_N)
        tail_start = start + n_pairs * PAIR_N
        if MASKED_PAIRS:  # what the masked pairs ran is not the tail's
            tail_start = gl.where(n_masked > 0, end, tail_start)
        tail_lat_v = k_lat._reinterpret(gl.bfloat16, [1, PAIR_N, D_LAT], smem_layout)
        tail_pe_v = k_pe._reinterpret(gl.bfloat16, [1, PAIR_N, D_PE], smem_layout)
        tail_blocks = k_lat._reinterpret(gl.bfloat16, [D_LAT // 64, PAIR_N, 64], smem_layout)
        if COLSPLIT:
            oa, ob, m_i, l_i = _masked_tail_halves(oa, ob, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks,
                                                   p_smem, KV, PageTable, TreeMask, b, pid_m, tail_start, end, kv_len,
                                                   tree_len, T, H, stride_ptb, max_pages, num_pages, stride_kvp,
                                                   stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout,
                                                   oh_layout, ld_layout, PAGE_SIZE, D_LAT, BLOCK_M, BLOCK_N,
                                                   EARLY_TAIL_MASK)
        else:
            o, m_i, l_i = _masked_tail(o, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, p_smem, KV,
                                       PageTable, TreeMask, b, pid_m, tail_start, end, kv_len, tree_len, T, H,
                                       stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs, stride_mb, stride_mt,
                                       sm_scale_log2e, s_layout, o_layout, ld_layout, True, PAGE_SIZE, D_LAT, BLOCK_M,
                                       BLOCK_N)

        # ---- store (as _verify_gluon_kernel) --------------------------------------------------------
        if TIMELINE:
            t3 = _now(b)
        # COALESCED_STORE: re-laid out through the pair buffers (free now: the producer has no copy left
        # and the tail's are consumed), as convert_layout's own scratch would not fit beside them.
        st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                                   warps_per_cta=[8, 1], order=[1, 0])
        stage_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        if COLSPLIT:
            if TMA_STORE:
                # 16-bit partial rows scaled and cast into rows 0..63 of the pair buffers (as the copies left
                # them: 64-column blocks, 128-byte swizzle), then one TMA box per column block ([1, 64, 64] of
                # the partials viewed as [B * splits, rows, 512]: the rows past the last clipped by the copy).
                smem3_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
                _, _, _, _, inv = _row_scale(l_i, pid_m, T, H, tree_len, gl.SliceLayout(1, oh_layout), BLOCK_M)
                rows_v = k_lat.slice(0, BLOCK_M, dim=0)
                rows_v.slice(0, HALF, dim=1).store((oa * gl.expand_dims(inv, 1)).to(Out.dtype.element_ty))
                rows_v.slice(HALF, HALF, dim=1).store((ob * gl.expand_dims(inv, 1)).to(Out.dtype.element_ty))
                fence_async_shared()
                _cta_barrier()
                blocks3 = k_lat._reinterpret(Out.dtype.element_ty, [2 * (D_LAT // 64), BLOCK_N, 64], smem3_layout)
                for c in gl.static_range(D_LAT // 64):
                    _tma_store(out_desc, [b * num_splits + pid_s, pid_m * BLOCK_M, c * 64], blocks3.slice(2 * c, 1, dim=0))
                _store_lse(m_i, l_i, Lse, b, pid_m, pid_s, T, H, tree_len, stride_lb, stride_lh, stride_ls, BLOCK_M)
                tma.store_wait(0)  # the boxes read out before the program's shared memory goes
            elif COALESCED_STORE and STAGE_16BIT:
                # Scaled and cast before the re-layout: half the bytes through shared memory, the same
                # values (o * (1 / l), then the cast, as _store_o does after an fp32 stage).
                st16_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                                             warps_per_cta=[8, 1], order=[1, 0])
                stage16_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
                _, _, _, _, inv = _row_scale(l_i, pid_m, T, H, tree_len, gl.SliceLayout(1, oh_layout), BLOCK_M)
                stage16 = k_lat._reinterpret(Out.dtype.element_ty, [2 * BLOCK_M, HALF], stage16_layout)
                stage16.slice(0, BLOCK_M, dim=0).store((oa * gl.expand_dims(inv, 1)).to(Out.dtype.element_ty))
                stage16.slice(BLOCK_M, BLOCK_M, dim=0).store((ob * gl.expand_dims(inv, 1)).to(Out.dtype.element_ty))
                _cta_barrier()
                _store_o(stage16.slice(0, BLOCK_M, dim=0).load(st16_layout), m_i, l_i, Out, Lse, b, pid_m, pid_s, T,
                         H, tree_len, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                         stride_ls, st16_layout, SINGLE_SPLIT, BLOCK_M, HALF, PRESCALED=True)
                _store_o(stage16.slice(BLOCK_M, BLOCK_M, dim=0).load(st16_layout), m_i, l_i, Out, Lse, b, pid_m, pid_s,
                         T, H, tree_len, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                         stride_ls, st16_layout, SINGLE_SPLIT, BLOCK_M, HALF, HALF, False, PRESCALED=True)
            elif COALESCED_STORE:
                stage = k_lat._reinterpret(gl.float32, [2 * BLOCK_M, HALF], stage_layout)
                stage.slice(0, BLOCK_M, dim=0).store(oa)
                stage.slice(BLOCK_M, BLOCK_M, dim=0).store(ob)
                _cta_barrier()
                _store_o(stage.slice(0, BLOCK_M, dim=0).load(st_layout), m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H,
                         tree_len, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                         stride_ls, st_layout, SINGLE_SPLIT, BLOCK_M, HALF)
                _store_o(stage.slice(BLOCK_M, BLOCK_M, dim=0).load(st_layout), m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H,
                         tree_len, stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh,
                         stride_ls, st_layout, SINGLE_SPLIT, BLOCK_M, HALF, HALF, False)
            else:
                _store_o(oa, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                         stride_os, stride_lb, stride_lt, stride_lh, stride_ls, oh_layout, SINGLE_SPLIT, BLOCK_M, HALF)
                _store_o(ob, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                         stride_os, stride_lb, stride_lt, stride_lh, stride_ls, oh_layout, SINGLE_SPLIT, BLOCK_M, HALF,
                         HALF, False)
        else:
            if COALESCED_STORE:
                stage = k_lat._reinterpret(gl.float32, [BLOCK_M, D_LAT], stage_layout)
                stage.store(o)
                _cta_barrier()
                _store_o(stage.load(st_layout), m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len,
                         stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
                         st_layout, SINGLE_SPLIT, BLOCK_M, D_LAT)
            else:
                _store_o(o, m_i, l_i, Out, Lse, b, pid_m, pid_s, T, H, tree_len, stride_ob, stride_ot, stride_oh,
                         stride_os, stride_lb, stride_lt, stride_lh, stride_ls, o_layout, SINGLE_SPLIT, BLOCK_M, D_LAT)
        if NARROW_ROWS > 0:
            # the narrow block's partial slots past its own splits hold no keys: written empty
            if narrow:
                for slot in range(pid_s + splits, num_splits, splits):
                    zero_o = gl.zeros([BLOCK_M, HALF], gl.float32, layout=st_layout)
                    no_m = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, st_layout))
                    no_l = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, st_layout))
                    _store_o(zero_o, no_m, no_l, Out, Lse, b, pid_m, slot, T, H, tree_len, stride_ob, stride_ot,
                             stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls, st_layout, SINGLE_SPLIT,
                             BLOCK_M, HALF)
                    _store_o(zero_o, no_m, no_l, Out, Lse, b, pid_m, slot, T, H, tree_len, stride_ob, stride_ot,
                             stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls, st_layout, SINGLE_SPLIT,
                             BLOCK_M, HALF, HALF, False)
        if TIMELINE == 2:
            c1 = _clock(b)
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, c0, c0, c1, _now(b), BLOCK_M)
        elif TIMELINE:
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, _now(b), BLOCK_M)

    @gluon.jit
    def _verify_gluon_ws_kernel(
        Q, KV, kv_desc, kv_desc3, kv_desc_pages, out_desc, PageTable, KvLens, TreeMask, TreeLens,
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
        T, H, num_splits, narrow_splits,
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
        PDL: gl.constexpr = 0,
        TIMELINE: gl.constexpr = 0,
        COALESCED_STORE: gl.constexpr = False,
        Q_ZERO_PAD: gl.constexpr = False,
        STAGE_16BIT: gl.constexpr = False,
        NARROW_ROWS: gl.constexpr = 0,
        WIDE_COPIES: gl.constexpr = False,
        XWG_SOFTMAX: gl.constexpr = False,
        NAMED_RELEASE: gl.constexpr = False,
        EARLY_TAIL_MASK: gl.constexpr = False,
        MASKED_PAIRS: gl.constexpr = False,
        WAIT_PRIOR: gl.constexpr = False,
        TMA_STORE: gl.constexpr = False,
    ):
        """``_verify_gluon_kernel`` (SEESAW, TMA) with a producer partition; ``kv_desc3``: with
        ``WIDE_COPIES``, the pool in boxes of 128 rows (``kv_descriptor(kv, 128)``), else unused (kept so that the
        positional arguments are the same); ``kv_desc_pages``: with ``MASKED_PAIRS``, the paged view
        (``kv_descriptor_pages``), else unused. ``PROBE``: see ``_ws_consumer``. ``PDL``: 1 / 2, see ``PDL_AT_END``.
        ``WAIT_PRIOR``: launched by programmatic dependent launch (``SPLIT_PDL``): waits for the prior grids
        before its first global read. ``TMA_STORE``: the 16-bit partial rows stored by TMA through ``out_desc``
        (``partials_descriptor``; else unused)."""
        gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
        gl.static_assert(BLOCK_M == BLOCK_N, "P (BLOCK_M x 2 BLOCK_N) lives in the rope buffers")
        # TMA tiles (P % 64 == 0), or row gathers by the producer (pages below a tile, COLSPLIT only).
        gl.static_assert((PAGE_SIZE % BLOCK_N == 0) | (PAGE_SIZE < BLOCK_N), "page size: < 64 or a multiple of 64")
        gl.static_assert(D_LAT // 64 + 1 == 9)
        PAIR_N: gl.constexpr = 2 * BLOCK_N
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        pid_m, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
        b = gl.program_id(2)
        if WAIT_PRIOR:
            _wait_prior_grid(b)
        if PDL == 1:  # the merge may be placed now (one wave of programs: all of them have started)
            _launch_dependents(pid_s)
        kv_len = gl.load(KvLens + b)
        tree_len = gl.load(TreeLens + b)
        start, end = _chunk_bounds(kv_len, tree_len, pid_s, splits, PAGE_SIZE)
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
        # the consumers' exchange of row maxima (XWG_SOFTMAX)
        xbuf = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 2], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        fence_async_shared()
        _cta_barrier()

        gl.warp_specialize(
            [
                (_ws_consumer, (Q, KV, PageTable, TreeMask, Out, Lse, sm_scale_log2e,
                                stride_qb, stride_qt, stride_qh, stride_kvp, stride_kvs, stride_ptb, max_pages,
                                num_pages, stride_mt, stride_ob, stride_ot, stride_oh, stride_os, stride_lb,
                                stride_lt, stride_lh, stride_ls,
                                T, H, KvLens, TreeLens, num_splits, narrow_splits, stride_mb, n_pairs,
                                q_lat, q_pe, k_lat, k_pe, p_smem, cbars, empty0, empty1, xbuf, out_desc,
                                PAGE_SIZE, SINGLE_SPLIT, BLOCK_M, BLOCK_N, D_LAT, D_PE, PROBE, COLSPLIT, TIMELINE,
                                COALESCED_STORE, Q_ZERO_PAD, STAGE_16BIT, NARROW_ROWS, XWG_SOFTMAX, NAMED_RELEASE,
                                EARLY_TAIL_MASK, MASKED_PAIRS, TMA_STORE)),
                (_ws_producer, (kv_desc, KV, k_lat, k_pe, cbars, empty0, empty1, pt, start, n_pairs, stride_kvp,
                                stride_kvs, max_pages, num_pages, PAGE_SIZE, L2_PREFETCH, D_LAT, BLOCK_N, COLSPLIT,
                                kv_desc3, WIDE_COPIES, NAMED_RELEASE and COLSPLIT, kv_desc_pages,
                                (KvLens, TreeLens, T, H, num_splits, narrow_splits), MASKED_PAIRS, NARROW_ROWS,
                                BLOCK_M)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )
        if PDL == 2:  # after the join: every partial row of this program is stored
            _launch_dependents(gl.program_id(0))


# Default of ``launch_verify_gluon_ws(..., l2_prefetch=None)`` and of the AOT check.
L2_PREFETCH = True
# The output / partial rows re-laid out through the pair buffers before their store
# (``_verify_gluon.COALESCED_STORE``) where it measured faster: over TMA with the L2 prefetch (what
# verify_mla runs above 64 rows since), where it also shrinks triton 3.6's stack frame of this kernel from
# 440 to 24 bytes. Session 11 call D, L=46000, P=64, us: T=65,H=8 117.0 -> 112.9, T=16,H=64 198.3 ->
# 188.4, T=64,H=64 785.9 -> 712.0 (the timeline: the pair loop 5 us shorter, the store 1.5 us longer).
# Elsewhere it lost or tied (without the prefetch T=16,H=8 47.5 -> 48.0, T=17,H=8 53.7 -> 54.6; row
# gathers at P=1 T=8,H=8 37.8 -> 39.1, T=16,H=64 210.1 -> 206.8). ``_verify_gluon.COALESCED_STORE``
# (``TRITREE_COALESCED_STORE=1``) turns it on for every Gluon kernel.
COALESCED_STORE_PREFETCH = os.environ.get("TRITREE_COALESCED_STORE_PREFETCH", "1") == "1"


# Split partials in bf16 for the kernel over TMA with its L2 prefetch (what verify_mla runs above 64 rows
# at P % 64 == 0; ``TRITREE_PARTIALS_16BIT_WS=0`` keeps fp32), whose staged store writes them coalesced
# and whose merge then runs by column warps (``_splitkv.COMBINE_16BIT_BY_COLUMNS``). Session 12 call G,
# L=46000, P=64, us, fp32 -> bf16: T=65,H=8 113.6 -> 112.4, T=64,H=8 106.6 -> 104.0, T=16,H=8 46.2 ->
# 43.2, T=17,H=8 51.4 -> 50.3, T=8,H=64 103.8 -> 102.0, T=16,H=64 189.1 -> 186.9, T=64,H=64 746.4 -> 730.0
# (the plain kernel's T=8,H=8 lost from its MMA layout: 35.1 -> 39.2; re-laid out it gains, session 13:
# ``_verify_gluon.PARTIALS_16BIT_PLAIN``).
PARTIALS_16BIT_WS = os.environ.get("TRITREE_PARTIALS_16BIT_WS", "1") == "1"
# The same two for row gathers (pages below 64), on together: session 13 call B, L=46000, P=1 (permuted),
# us, fp32 / bf16 + staged store / bf16 alone / staged store alone: T=16,H=8 51.2 / 47.7 / 51.0 / 51.0,
# T=8,H=64 117.4 / 113.1 / 119.7 / 116.4, T=64,H=8 118.8 / 116.0 / 119.9 / 118.3, T=16,H=64 212.4 / 211.5 /
# 217.2 / 210.6, T=64,H=64 784.0 / 768.0 / 781.1 / 767.3, T=8,H=8 37.4 / 37.7 / 41.0 / 38.5 (bf16 partials
# need the staged store; at P=64 bf16 had moved T=16,H=8 to 42.8 and its P=1 time to +19%).
PARTIALS_16BIT_GATHER = os.environ.get("TRITREE_PARTIALS_16BIT_GATHER", "1") == "1"
COALESCED_STORE_GATHER = os.environ.get("TRITREE_COALESCED_STORE_GATHER", "1") == "1"
# The staged store (COLSPLIT) of 16-bit rows (bf16 partials, or the output itself with one split): scaled
# by 1 / l and cast in registers before the re-layout, not after it (``_ws_consumer``'s
# ``STAGE_16BIT``): 64 KB through shared memory instead of 128 KB, the same bits.
# ``TRITREE_STAGE_16BIT=0`` stages fp32. Session 14: the store 3.2-3.5 -> 2.0-2.7 us (median program,
# bench/timeline.py, with Q_ZERO_PAD); graph-timed, L=46000, fp32 stage -> 16-bit (calls B, C): T=65,H=8
# 110.8-113.4 -> 109.4-111.5 us (faster in 6 rounds of 6), T=17,H=8 48.8-49.8 -> 47.8-50.2 (5 of 6);
# one pass: T=16,H=8 43.5 -> 41.9, T=64,H=8 104.3 -> 102.3, T=8,H=64 101.7 -> 100.3, T=64,H=64 722.0 ->
# 716.8, P=1 T=8,H=8 37.2 -> 35.9.
STAGE_16BIT = os.environ.get("TRITREE_STAGE_16BIT", "1") == "1"


# The last row block as NARROW_ROWS (8 or 16) real rows, where a launch's last block holds no more (T=17
# or T=65 with H=8: 8 rows after 2 or 8 full blocks): ``_narrow_pairs`` (the rows as the MMAs' N) instead
# of a 64-row block's MMAs, and the block gets its own split count (``narrow_splits_for``): the full blocks
# take more splits (``choose_narrow_num_splits``; T=65,H=8: 8 x 15 programs and 12 narrow ones, not 9 x
# 14). ``TRITREE_NARROW_LAST_BLOCK=0`` keeps a 64-row last block. Session 14 call F (L=46000, P=64, graph-timed
# in one process, variants interleaved): T=65,H=8 108.4-109.9 us against 110.3-112.3 (faster in 6 pairs of
# 6, -2.1%); a narrow program took 0.79 of a full one a tile pair (the timeline). Not kept: chunks in
# whole pairs sized for the keys plus two tiles (the last split also runs the masked tree keys), call H,
# 110.2-112.3 against 110.9-112.0, a tie.
NARROW_LAST_BLOCK = os.environ.get("TRITREE_NARROW_LAST_BLOCK", "1") == "1"
# A narrow program's time per key over a 64-row block's, for the split choice (an estimate: the tiles
# still pass through shared memory, ~0.7-0.8 of a full block's traffic).
NARROW_COST = float(os.environ.get("TRITREE_NARROW_COST", "0.75"))
# ... and only with this many row blocks or more: session 14 call F, T=17,H=8 (3 blocks, 2 x 48 + 36
# programs) 50.0-54.8 us against 48.1-49.7 for three 64-row blocks (2 x 44 + 44): with two full blocks, 4
# more splits shorten their chunks less than the page / pair rounding of ~8-pair chunks costs, and a
# narrow program there took 0.88 of a full one a pair (0.79 at T=65,H=8).
NARROW_MIN_BLOCKS = 5

# A pair's two tiles as one 128-row box per column block where they are consecutive pool rows (one page
# of 128 or more, or two adjacent pages): 9 TMA copies and 9 of the producer's partition barriers a pair
# instead of 18 (``_issue_pair_blocks``' ``WIDE``). Session 17: the kernel is latency-bound (ncu) and the
# producer runs ~100 instructions and a barrier per copy between a slot's release and its refill (~40
# with these copies). Session 17 call H, graph-timed, L=46000, P=64: T=65,H=8 104.4-105.9 us against
# 107.6-108.8 (3 of 3 rounds); ``TRITREE_WS_WIDE_COPIES=0`` (sweep variant ``tritree-ws-boxes64``) turns it
# off. Only in launches with a narrow last row block (compiled -O1, where the consumers' loops come out as
# without it; at -O3 the full-block pair loop went from 2 to 20 local accesses, ahead of time).
WIDE_COPIES = os.environ.get("TRITREE_WS_WIDE_COPIES", "1") == "1"
# ... and in launches without a narrow block whose rows fill their last row block, compiled with
# ``PTXAS_WIDE_FULL`` (-O1: their consumers' pair loop 749 instructions without local accesses, ahead of
# time; at -O3 it has 20). Session 18 call B, graph-timed, L=46000, P=64, two rounds, us (two boxes at -O3 /
# one box at -O3 / one box at -O1): T=8,H=64 101.5 101.5 / 108.2 108.7 / 98.3 99.3; T=16,H=8 41.9 41.7 /
# 45.5 44.9 / 40.0 40.5; T=16,H=64 186.4 186.6 / 195.0 196.1 / 178.3 185.5; T=64,H=8 105.5 103.7 / 110.1
# 108.7 / 101.5 99.7; T=64,H=64 708.3 724.4 / 771.7 771.6 / 699.4 708.5; but T=17,H=8 (136 rows: the last
# of three blocks holds 8) 47.4 48.6 / 54.8 54.8 / 49.1 49.3, as -O1 alone had cost it in session 16: there
# the two boxes at -O3 stay. Sweep variants ``tritree-ws-boxes64-full`` (two boxes everywhere without a
# narrow block), ``tritree-ws-wide-full-O3``.
WIDE_FULL = os.environ.get("TRITREE_WS_WIDE_FULL", "1") == "1"

# The by-column-halves pair loop's softmax with one exchange of row maxima between the two warpgroups (one
# partition barrier) and the row sums kept per warpgroup (``_softmax_xwg``), instead of triton's cross-warp
# reductions (the full blocks' pair loop had 9 partition barriers a pair: 3 for the row max, 2 for the row
# sum, 1 for P, 2 for the slot releases, 1 at the top; now 5, and 727 instructions instead of 742). Session 18
# calls E (graph-timed, L=46000, P=64, us, on / off): T=65,H=8 100.1 / 103.9, 100.9 / 103.7, 101.3 / 103.2;
# T=17,H=8 46.9 / 47.9, 45.8 / 47.7, 46.6 / 49.3; T=8,H=64 94.4 / 98.9; T=16,H=8 38.8 / 40.6; T=16,H=64 172.4 /
# 186.5; T=64,H=8 96.4 / 100.2; T=64,H=64 664.4 / 674.1. Sweep variant ``tritree-ws-xwg-off``.
XWG_SOFTMAX = os.environ.get("TRITREE_WS_XWG_SOFTMAX", "1") == "1"

# The by-column-halves loops' two releases of the pair buffers by hardware barriers (``_release``: each
# consumer thread ``bar.arrive``s after its own warpgroup's wgmma wait, the producer ``bar.sync``s with
# them) instead of a partition barrier and one thread's mbarrier arrival each. Also drops the barrier that
# triton's analysis put at the top of the loop (an mbarrier arrival, or a chain of waits on one mbarrier,
# across the back edge without a barrier between them): 2 partition barriers a pair instead of 5.
# Sweep variant ``tritree-ws-named-off``.
NAMED_RELEASE = os.environ.get("TRITREE_WS_NAMED_RELEASE", "1") == "1"

# The masked tail's tree-mask words loaded before each tile's copy is issued (``_tail_tile_p``'s
# ``EARLY_MASK``; by column halves), their latency under the copy's instead of after the tile's scores: the
# full blocks' last split, the launch's last program at T=65,H=8, spends ~4 us a tail tile against ~1.75 a
# tile in the pair loop. Sweep variant ``tritree-ws-early-mask-off``.
EARLY_TAIL_MASK = os.environ.get("TRITREE_WS_EARLY_TAIL_MASK", "1") == "1"

# The full row blocks' masked tiles (the prefix's last keys and the tree keys) as pairs of the producer's
# stream, after the pair loop, masked (``_pair_mask``), instead of the tail one tile at a time by the
# consumers' own cp.async copies, which nothing overlaps (session 19's timeline at T=65,H=8: the last split's
# two tail tiles took ~8 us against ~3.5 us a pair in the loop, and it finished ~3 us after every other).
# A tile in which the request's keys end is copied from before its start over the paged view (TMA lands
# zeros below slot 0): no stale slot past the end, which may hold anything, is read into P V. Over TMA by
# column halves, full row blocks (the narrow block keeps the tile tail). Sweep variant
# ``tritree-ws-masked-pairs-off``. Only where a split's masked keys span more than one tile: a lone tile
# (T=17,H=8: every split's 17th, a plain one) ran faster as before (session 20 call C, graph-timed: 47.1-48.9
# us against 51.4-52.0 with it as a pair with a copy of itself; the timeline: 4.3 us for the tile, 6.9 for the
# pair). Not in launches whose last row block is part-filled and not narrow (T=17,H=8: three blocks, the last
# with 8 rows): there it stayed slower with that rule too (call D: 49.6 / 49.2 us against 48.1 / 48.0).
MASKED_PAIRS = os.environ.get("TRITREE_WS_MASKED_PAIRS", "1") == "1"
# ... run ahead of the full pairs instead of after them (``MASKED_PAIRS`` = 2 in the kernel): the masked
# pair's copies (not prefetched into the L2, over the paged view, 18 boxes) and its mask words then load
# beside Q at the program's start, and the first full pair is prefetched while it runs. At T=65,H=8 the
# last split (23 full pairs and one masked pair, a masked pair ~6-7 us against ~3.5 for a full one) was
# still the last to finish in two of three timelines (session 21 call A: 91.1 against 89.5 for the next); with
# it first, it ends with the others (call B: 89.3, the others' latest 89.2). Graph-timed, L=46000, P=64
# (session 21 call B, us, three rounds): T=65,H=8 99.0 97.7 97.9 against 98.9 98.7 98.7; with the split kernel by
# PDL 97.5 96.8 97.2 against 97.6 97.9 97.6. ``TRITREE_WS_MASKED_FIRST=0`` (sweep variant
# ``tritree-ws-masked-first-off``) runs them after the full pairs.
MASKED_FIRST = os.environ.get("TRITREE_WS_MASKED_FIRST", "1") == "1"

# With the merge launched by programmatic dependent launch (``_splitkv.MERGE_PDL``, off): signalled after each
# program's partial store instead of at its start. Signalled at the start, the merge's small programs fill
# the SMs of the first programs to finish and then run there crowded (session 16 call E: slower); after
# the store, the merge grid is placed once every program has stored, over every SM, its launch latency
# under the split kernel's end. Sweep variant ``tritree-pdl-end``.
PDL_AT_END = os.environ.get("TRITREE_WS_PDL_AT_END", "0") == "1"

# The split kernel itself launched by programmatic dependent launch (``launch_pdl``): its grid is placed while
# the kernel before it in the stream (in a model's layer the KV write, ``kv_cache.WRITE_SIGNALS``; between
# verify calls the previous call's merge, ``_splitkv.MERGE_SIGNALS``) still runs, and each program waits in
# ``griddepcontrol.wait`` (``WAIT_PRIOR``) before its first global read, instead of the launch itself waiting
# for that kernel's completion. Session 21 (graph-timed, L=46000, P=64, us; bench/RESULTS.md): T=65,H=8
# 96.7-97.4 against 98.0-98.3 (call A; the timeline's gap between calls 5.2 against 6.0), 97.6-97.9 against
# 98.7-98.9 (call B); targets at P=64 ties or faster (call C: T=16,H=64 166.1-166.6 against 168.4-168.6); one
# layer's KV write + verify 100.7-101.1 against 101.3-101.4 (``bench/pdl_layer.py``). Not where the last row
# block is part-filled and not narrow (T=17,H=8: 49.8-50.1 against 46.5-47.4 in calls A-C, every program's
# pair loop ~11% slower in the timeline, not understood; without the merge's signal a tie): ``split_pdl``.
# ``TRITREE_WS_SPLIT_PDL=0`` (sweep variant ``tritree-split-pdl-off``) launches it plainly.
SPLIT_PDL = os.environ.get("TRITREE_WS_SPLIT_PDL", "1") == "1"

# The 16-bit split partials stored by TMA (``TMA_STORE``): the rows scaled and cast into the pair buffers in
# their 64-column swizzled blocks, one bulk copy a block to the partials viewed as ``[B * splits, rows, 512]``
# (``partials_descriptor``), instead of staged, read back in a store layout and stored by every thread: the
# same bits; the timeline's store 2.0 us against 2.7-2.8 at T=65,H=8 (session 21 call C). Graph-timed (call C,
# us, three rounds): T=65,H=8 99.4 100.3 99.7 against 99.8 101.1 99.9; T=17,H=8 46.4 47.3 47.8 against 47.8 48.1
# 47.8; with MASKED_FIRST T=65,H=8 97.8 98.9 98.4. ``TRITREE_WS_TMA_STORE=0`` (sweep variant
# ``tritree-ws-tma-store-off``) stages and stores by threads.
TMA_STORE = os.environ.get("TRITREE_WS_TMA_STORE", "1") == "1"


def tma_store(num_splits: int, colsplit: bool, staged16: bool, dst_o: torch.Tensor) -> bool:
    """Whether a launch stores its split partials by TMA (``TMA_STORE``): several splits, by column halves, 16-bit
    rows staged after scaling, a contiguous ``[B, splits, rows, 512]`` destination."""
    return (TMA_STORE and num_splits > 1 and colsplit and staged16 and dst_o.dim() == 4 and dst_o.is_contiguous()
            and dst_o.shape[-1] == D_LAT)


def partials_descriptor(dst_o: torch.Tensor):
    """Host TMA descriptor of the split partials ``[B, splits, rows, 512]`` (16-bit, contiguous) viewed as
    ``[B * splits, rows, 512]``, boxes ``[1, 64, 64]``: a row block's box past ``rows`` is clipped."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    B, S, M, D = dst_o.shape
    return TensorDescriptor(dst_o, [B * S, M, D], [M * D, D, 1], [1, BLOCK_M, 64], _kv_smem3_layout())


def split_pdl(device: torch.device, rows: int, narrow: int) -> bool:
    """Whether the split kernel of a launch of ``rows`` packed rows (``narrow``: its narrow block's rows, 0
    without one) on ``device`` is launched by programmatic dependent launch (``SPLIT_PDL``): with a narrow
    block or rows that fill the last block, ``_splitkv.pdl_capable``."""
    return SPLIT_PDL and (narrow > 0 or rows % BLOCK_M == 0) and pdl_capable(device)

# ptxas options for this kernel's launches with a narrow last row block / without one (None: triton's
# default, -O3; ``TRITREE_WS_PTXAS_NARROW=`` restores it for the narrow ones). Session 16: the same source
# comes out of ptxas with a different schedule of the pair loop from build to build, and the schedule costs
# 1-3 us at T=65,H=8; -O1 gives the narrow launch's full-block loop 742 instructions without local accesses
# (856 with 4 at -O3). Graph-timed, L=46000 (bench/RESULTS.md, sixteenth session): -O1 for every kernel of
# the process (call I, three rounds) T=65,H=8 106.7-107.3 us against 108.5-109.2, T=17,H=8 50.1-50.6 against
# 48.5-48.8; for this kernel alone (call J, three rounds) narrow launches (T=65,H=8) 107.8-108.5 against
# 109.7-110.8 (and against 108.3-109.5 for the unchanged launch in the next slot), launches without a narrow
# block (T=17,H=8) 49.8-50.4 against 48.6-49.4: -O1 for the narrow launches over TMA only (row gathers,
# pages below 64, were not measured with it and keep the default).
# Session 18 (ahead of time): ptxas 12.8 and 13.0 at -O1 give this kernel's narrow launch a different schedule
# of the narrow block's own pair loop on every run of the same PTX (six runs, six schedules; the full blocks'
# and the producer's loops the same each time); -O2 / -O3 and the launches without a narrow block at -O1 are
# deterministic. So a narrow launch's build is one draw: its narrow programs (not the last to finish at
# T=65,H=8) may run faster or slower from one compile to the next.
PTXAS_NARROW = os.environ.get("TRITREE_WS_PTXAS_NARROW", "-O1") or None
PTXAS_FULL = os.environ.get("TRITREE_WS_PTXAS_FULL") or None
PTXAS_WIDE_FULL = os.environ.get("TRITREE_WS_PTXAS_WIDE_FULL", "-O1") or None


def masked_pairs(rows: int, narrow: int, colsplit: bool, gather: bool) -> bool:
    """Whether a launch of ``rows`` packed rows (``narrow``: its narrow block's rows, 0 without one) runs its
    full blocks' masked tiles as pairs (``MASKED_PAIRS``): over TMA by column halves, with a narrow block or
    rows that fill the last block."""
    return MASKED_PAIRS and bool(colsplit) and not gather and (narrow > 0 or rows % BLOCK_M == 0)


def copies_wide(rows: int, narrow: int, colsplit: bool, gather: bool) -> bool:
    """Whether a launch over ``rows`` packed rows (``narrow``: its ``narrow_rows``) copies a pair's adjacent
    tiles as one box a column block: ``WIDE_COPIES`` with a narrow last row block, ``WIDE_FULL`` without one
    where the rows fill the last block; TMA tiles by column halves only."""
    if not WIDE_COPIES or not colsplit or gather:
        return False
    return bool(narrow) or (WIDE_FULL and rows % BLOCK_M == 0)


def _ptx_options(narrow: bool, gather: bool, wide: bool = False) -> dict:
    """The compile option that gives a TMA launch with (``narrow``) or without a narrow last row block its
    ptxas options (``PTXAS_NARROW``; without one ``PTXAS_WIDE_FULL`` where it copies ``wide``, else
    ``PTXAS_FULL``); empty for triton's default, and for row gathers (pages below 64: not measured with
    other options)."""
    opts = None if gather else PTXAS_NARROW if narrow else PTXAS_WIDE_FULL if wide else PTXAS_FULL
    return {"ptx_options": opts} if opts else {}


def narrow_rows(rows: int) -> int:
    """``NARROW_ROWS`` of a launch over ``rows`` packed rows: 8 or 16 where the last of at least
    ``NARROW_MIN_BLOCKS`` row blocks holds at most that many real rows (and ``NARROW_LAST_BLOCK``), else 0."""
    if not NARROW_LAST_BLOCK or triton.cdiv(rows, BLOCK_M) < NARROW_MIN_BLOCKS:
        return 0
    last = rows - (triton.cdiv(rows, BLOCK_M) - 1) * BLOCK_M
    return 8 if last <= 8 else 16 if last <= 16 else 0


def narrow_splits_for(num_splits: int, batch: int, row_blocks: int, sms: int) -> int:
    """Split count of a narrow last row block: what the SMs left by the full blocks' ``num_splits``
    programs hold, at most ``num_splits`` (whose extra programs of the narrow block get empty chunks)."""
    return max(1, min(num_splits, sms // batch - (row_blocks - 1) * num_splits))


def choose_narrow_num_splits(*, batch: int, row_blocks: int, max_keys: int, block_n: int, sms: int,
                             min_tiles_per_split: int = 4, max_splits: int = 256) -> int:
    """``_splitkv.choose_num_splits`` (whole waves) for a launch whose last row block is narrow: it counts
    ``NARROW_COST`` of a block, so the full blocks share the SMs it leaves."""
    want = max(1, int(sms // (batch * (row_blocks - 1 + NARROW_COST))))
    by_len = max(1, max_keys // (block_n * min_tiles_per_split))
    return int(max(1, min(want, by_len, max_splits)))


def narrow_partials(l2_prefetch: bool, gather: bool) -> bool:
    """Whether the kernel with this producer writes its split partials in the output's 16-bit dtype."""
    return PARTIALS_16BIT_WS and (PARTIALS_16BIT_GATHER if gather else l2_prefetch)


def partials_narrow_for(kernel: str, page_size: int) -> bool | None:
    """``split_destinations``'s ``narrow`` for the Gluon kernel named ``kernel`` (a ``GLUON_KERNELS``
    name) over pages of ``page_size``: True where that kernel writes 16-bit partials (the ws kernel, and
    the plain schedule over TMA: ``_verify_gluon.PARTIALS_16BIT_PLAIN``), else None (the
    ``_splitkv.PARTIALS_16BIT`` default)."""
    if kernel == "gluon":
        return True if _verify_gluon.plain_partials_narrow(page_size) else None
    ws = kernel.startswith("gluon-ws")
    return True if ws and narrow_partials(kernel != "gluon-ws-noprefetch", page_size % BLOCK_N != 0) else None


def coalesced_store(l2_prefetch: bool, gather: bool) -> bool:
    """Whether the kernel with this producer (``l2_prefetch`` over TMA, or row ``gather``) re-lays out
    its output rows before their store."""
    return _verify_gluon.COALESCED_STORE or (COALESCED_STORE_GATHER if gather else COALESCED_STORE_PREFETCH and l2_prefetch)


def launch_verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                           sm_scale, num_splits, colsplit: bool = True, probe: int = 0,
                           l2_prefetch: bool | None = None, timeline: int = 0, narrow: bool = True):
    """``launch_verify_gluon(..., seesaw=True)``'s conventions, the warp-specialised kernel (TMA tiles for
    page sizes that are a multiple of 64, row gathers by the producer below 64). ``colsplit``: ``O +=
    P V`` by column halves (what ``verify_mla`` runs; required for row gathers); off: by tiles, as the
    seesaw. ``probe`` (bench only, wrong results, by tiles): see ``_ws_consumer``. ``l2_prefetch``:
    the producer's L2 prefetch of the next pair over TMA (default: the module's ``L2_PREFETCH``).
    ``timeline``: as ``launch_verify_gluon``'s (bench only); 2: the stamps are the timer at the start, the SM
    clock (``%clock``) at the start twice, the SM clock at the end and the timer at the end. ``narrow``: a
    last row block of at most 16 real rows runs narrow (``narrow_rows``; by column halves only), with
    ``narrow_splits_for`` splits of the ``num_splits`` partial slots (the rest written empty). Launches
    with a narrow block over TMA are compiled with ``PTXAS_NARROW`` (-O1) and copy a pair's adjacent tiles
    as one box a column block (``WIDE_COPIES``; without a narrow block ``WIDE_FULL``: ``copies_wide``). Returns
    the compiled kernel."""
    _check(q, kv, num_splits)
    gather = kv.shape[1] % BLOCK_N != 0
    if gather and not colsplit:
        raise ValueError("the warp-specialised Gluon verify kernel gathers rows (page size < 64) by column halves "
                         "only: pass colsplit=True")
    B, T, H, _ = q.shape
    M = T * H
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    grid = (triton.cdiv(M, BLOCK_M), int(num_splits), B)
    nrows = narrow_rows(M) if narrow and colsplit and not probe else 0
    narrow_splits = narrow_splits_for(int(num_splits), B, grid[0], num_sms(q.device)) if nrows else int(num_splits)
    if nrows:  # the full blocks' programs, then the narrow block's (``_program``)
        grid = ((grid[0] - 1) * int(num_splits) + narrow_splits, 1, B)
    desc = kv_descriptor(kv)
    wide = copies_wide(M, nrows, colsplit, gather)
    desc2 = kv_descriptor(kv, 2 * BLOCK_N) if wide else desc
    masked = masked_pairs(M, nrows, colsplit, gather)
    desc_pages = kv_descriptor_pages(kv) if masked else desc
    if probe and colsplit:
        raise ValueError("the probes time the by-tiles loop: pass colsplit=False")
    l2_prefetch = L2_PREFETCH if l2_prefetch is None else bool(l2_prefetch)
    pdl_split = split_pdl(q.device, M, nrows)
    stage16 = STAGE_16BIT and dst_o.element_size() == 2
    by_tma = tma_store(int(num_splits), bool(colsplit), coalesced_store(l2_prefetch, gather) and stage16, dst_o) \
        and not probe
    out_desc = partials_descriptor(dst_o) if by_tma else desc
    return _verify_gluon_ws_kernel[grid](
        q, kv, desc, desc2, desc_pages, out_desc, page_table, kv_lens, tree_mask, tree_lens,
        dst_o, dst_l,
        float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        kv.stride(0), kv.stride(1),
        page_table.stride(0), page_table.shape[1], kv.shape[0],
        tree_mask.stride(0), tree_mask.stride(1),
        *o_strides,
        *l_strides,
        T, H, int(num_splits), int(narrow_splits),
        PAGE_SIZE=kv.shape[1], SINGLE_SPLIT=int(num_splits) == 1,
        L2_PREFETCH=l2_prefetch,
        PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=GATHER_PRODUCER_REGS if gather else PRODUCER_REGS,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_LAT=D_LAT, D_PE=D_PE, PROBE=int(probe), COLSPLIT=bool(colsplit),
        TIMELINE=int(timeline), COALESCED_STORE=coalesced_store(l2_prefetch, gather),
        Q_ZERO_PAD=_verify_gluon.Q_ZERO_PAD, STAGE_16BIT=stage16, TMA_STORE=by_tma,
        NARROW_ROWS=nrows, WIDE_COPIES=wide, XWG_SOFTMAX=XWG_SOFTMAX and bool(colsplit),
        NAMED_RELEASE=NAMED_RELEASE and bool(colsplit), EARLY_TAIL_MASK=EARLY_TAIL_MASK and bool(colsplit),
        MASKED_PAIRS=(2 if MASKED_FIRST else 1) if masked else 0, WAIT_PRIOR=pdl_split, num_warps=NUM_WARPS,
        **({"PDL": 2 if PDL_AT_END else 1} if merge_pdl(int(num_splits), q.device) else {}),
        **({"launch_pdl": True} if pdl_split else {}),
        **_ptx_options(bool(nrows), gather, wide),
    )


def verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, num_splits=1, out=None,
                    lse=None, colsplit=True):
    """``verify_gluon(..., seesaw=True)`` with the warp-specialised kernel: ``(out, lse)``."""
    from ._splitkv import combine_splits, split_destinations

    B, T, H, _ = q.shape
    if out is None:
        out = torch.empty(B, T, H, D_LAT, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H)
    launch_verify_gluon_ws(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides,
                           sm_scale, num_splits, colsplit)
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse)
    return out, lse


# --------------------------------------------------------------------------------------------------
# AOT compile check (CPU machine, sm_90 target)
# --------------------------------------------------------------------------------------------------

def compile_for_sm90_ws(num_splits: int, page_size: int = 64, partial_dtype: str | None = None,
                        producer_regs: int | None = None, colsplit: bool = True, l2_prefetch: bool | None = None,
                        pdl: int = 0, timeline: bool = False, coalesced: bool | None = None,
                        narrow_rows: int = 0, full_rows: bool = True, wait_prior: bool = False,
                        masked_first: bool | None = None, tma_store_: bool | None = None):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    gather = page_size % BLOCK_N != 0
    if producer_regs is None:
        producer_regs = GATHER_PRODUCER_REGS if gather else PRODUCER_REGS
    l2_prefetch = L2_PREFETCH if l2_prefetch is None else bool(l2_prefetch)
    if coalesced is None:  # as launched
        coalesced = coalesced_store(l2_prefetch, gather)
    if partial_dtype is None:  # as verify_mla launches it
        partial_dtype = "bf16" if narrow_partials(l2_prefetch, gather) else "fp32"
    fn = _verify_gluon_ws_kernel
    stage16 = STAGE_16BIT and (num_splits == 1 or partial_dtype != "fp32")
    by_tma = ((TMA_STORE if tma_store_ is None else tma_store_) and num_splits > 1 and partial_dtype == "bf16"
              and bool(colsplit) and coalesced and stage16)
    layout = _kv_smem_layout()
    desc = f"tensordesc<bf16[{BLOCK_N},64],{layout!r}>"
    # full_rows: the rows fill the last row block (what copies_wide asks of launches without a narrow block)
    wide = copies_wide(BLOCK_M if full_rows else BLOCK_M + 8, narrow_rows, colsplit, gather)
    masked = masked_pairs(BLOCK_M if full_rows else BLOCK_M + 8, narrow_rows, colsplit, gather)
    sig = {
        "Q": "*bf16", "KV": "*bf16", "kv_desc": desc,
        "kv_desc3": f"tensordesc<bf16[{2 * BLOCK_N},64],{layout!r}>" if wide else desc,
        "kv_desc_pages": f"tensordesc<bf16[1,{BLOCK_N},64],{_kv_smem3_layout()!r}>" if masked else desc,
        "out_desc": f"tensordesc<bf16[1,{BLOCK_M},64],{_kv_smem3_layout()!r}>" if by_tma else desc,
        "PageTable": "*i32", "KvLens": "*i32", "TreeMask": "*i32", "TreeLens": "*i32",
        "Out": "*bf16" if num_splits == 1 else f"*{partial_dtype}", "Lse": "*fp32", "sm_scale_log2e": "fp32",
    }
    ints = ["stride_qb", "stride_qt", "stride_qh", "stride_kvp", "stride_kvs", "stride_ptb", "max_pages",
            "num_pages", "stride_mb", "stride_mt", "stride_ob", "stride_ot", "stride_oh", "stride_os",
            "stride_lb", "stride_lt", "stride_lh", "stride_ls", "T", "H", "num_splits", "narrow_splits"]
    sig.update({n: "i32" for n in ints})
    constexprs = {"PAGE_SIZE": page_size, "SINGLE_SPLIT": num_splits == 1,
                  "L2_PREFETCH": l2_prefetch, "NARROW_ROWS": int(narrow_rows),
                  "PRODUCER_WARPS": PRODUCER_WARPS, "PRODUCER_REGS": producer_regs, "BLOCK_M": BLOCK_M,
                  "BLOCK_N": BLOCK_N, "D_LAT": D_LAT, "D_PE": D_PE, "PROBE": 0, "COLSPLIT": bool(colsplit),
                  "PDL": int(pdl), "TIMELINE": timeline,
                  "COALESCED_STORE": coalesced, "Q_ZERO_PAD": _verify_gluon.Q_ZERO_PAD,
                  "STAGE_16BIT": stage16, "TMA_STORE": by_tma,
                  "WIDE_COPIES": wide, "XWG_SOFTMAX": XWG_SOFTMAX and bool(colsplit),
                  "NAMED_RELEASE": NAMED_RELEASE and bool(colsplit),
                  "EARLY_TAIL_MASK": EARLY_TAIL_MASK and bool(colsplit),
                  "MASKED_PAIRS": ((2 if (MASKED_FIRST if masked_first is None else masked_first) else 1) if masked
                                   else 0),
                  "WAIT_PRIOR": bool(wait_prior)}
    for k in constexprs:
        sig[k] = "constexpr"
    names = fn.arg_names
    divisible = ("Q", "KV", "PageTable", "KvLens", "TreeMask", "TreeLens", "Out", "Lse", "stride_qb", "stride_qt",
                 "stride_qh", "stride_kvp", "stride_kvs", "stride_ob", "stride_ot", "stride_oh", "stride_os")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": NUM_WARPS, **_ptx_options(bool(narrow_rows), gather, wide)})


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
    cases = [(cs, n, P, True) for cs in (True, False) for n in (1, 2) for P in (64, 128)]
    cases += [(True, n, P, False) for n in (1, 2) for P in (64, 128)]  # without the L2 prefetch
    cases += [(True, n, P, True) for n in (1, 2) for P in (1, 16)]  # row gathers
    for colsplit, splits, P, l2_prefetch in cases:
        if True:
            name = "_verify_gluon_ws_kernel"
            tag = (f"{'colsplit' if colsplit else 'by-tiles'}{'' if l2_prefetch else '-nopf'} "
                   f"splits={'1' if splits == 1 else 'N'} P={P:3d}")
            try:
                k = compile_for_sm90_ws(splits, P, colsplit=colsplit, l2_prefetch=l2_prefetch)
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
                base = os.path.join(dump, f"ws{'cs' if colsplit else ''}{'' if l2_prefetch else '-nopf'}_s{splits}_p{P}")
                with open(base + ".sass", "w") as f:
                    f.write(counts["_text"])
                with open(base + ".ptx", "w") as f:
                    f.write(k.asm["ptx"])
                with open(base + ".ttgir", "w") as f:
                    f.write(k.asm["ttgir"])
            status = "ok" if good and spill == 0 else ("ok (spills)" if good else "FAIL")
            print(f"{name} sm_90 {tag} shared {shared:7d}/{SMEM_LIMIT_SM90} "
                  f"regs {use.get('REG', 0):3d} spill {spill:5d}  {status}  {_fmt_counts(counts)}", flush=True)
            if compare and not colsplit:
                from ._verify_gluon import compile_for_sm90

                r = compile_for_sm90(splits, False, P, seesaw=True)
                ruse = resource_usage(r.asm["cubin"])
                rc = sass_counts(r.asm["cubin"])
                if dump and rc is not None:
                    with open(os.path.join(dump, f"seesaw_s{splits}_p{P}.sass"), "w") as f:
                        f.write(rc["_text"])
                print(f"  reference seesaw      {tag} shared {int(r.metadata.shared):7d} regs {ruse.get('REG', 0):3d} "
                      f"spill {ruse.get('LOCAL', 0) + ruse.get('STACK', 0):5d}  {_fmt_counts(rc)}", flush=True)
    # no narrow block with the last row block part-filled (T=17,H=8: two boxes a block), then a narrow last
    # row block (8 or 16 rows)
    for splits, P, nrows in ((2, 64, 0), (1, 64, 0), (2, 64, 8), (1, 64, 8), (2, 128, 16), (2, 1, 8)):
        k = compile_for_sm90_ws(splits, P, narrow_rows=nrows, full_rows=bool(nrows))
        use = resource_usage(k.asm["cubin"])
        spill = use.get("LOCAL", 0) + use.get("STACK", 0)
        good = int(k.metadata.shared) <= SMEM_LIMIT_SM90
        ok &= good
        ptxas = _ptx_options(bool(nrows), P % BLOCK_N != 0).get("ptx_options", "default")
        what = f"narrow {nrows:2d} (ptxas {ptxas}) rows:" if nrows else f"last block part-filled (ptxas {ptxas}):"
        print(f"_verify_gluon_ws_kernel sm_90 colsplit splits={'1' if splits == 1 else 'N'} P={P:3d} {what} "
              f"shared {int(k.metadata.shared):7d}/{SMEM_LIMIT_SM90} regs {use.get('REG', 0):3d} spill "
              f"{spill:5d}  {'ok' if good and spill == 0 else ('ok (spills)' if good else 'FAIL')}  "
              f"{_fmt_counts(sass_counts(k.asm['cubin']))}", flush=True)
    for P, l2_prefetch, pdl in ((64, True, 1), (64, False, 1), (1, True, 1), (64, True, 2)):  # PDL merge
        k = compile_for_sm90_ws(2, P, l2_prefetch=l2_prefetch, pdl=pdl)
        use = resource_usage(k.asm["cubin"])
        has = "griddepcontrol.launch_dependents" in k.asm["ptx"]
        ok &= has and int(k.metadata.shared) <= SMEM_LIMIT_SM90
        print(f"_verify_gluon_ws_kernel sm_90 colsplit{'' if l2_prefetch else '-nopf'} splits=N P={P:3d} PDL"
              f"{' after the store' if pdl == 2 else ''}: "
              f"launch_dependents {'in' if has else 'MISSING from'} the PTX, shared {int(k.metadata.shared)} "
              f"regs {use.get('REG', 0)} spill {use.get('LOCAL', 0) + use.get('STACK', 0)}", flush=True)
    for nrows, what, kw in ((8, "MASKED_FIRST", dict(masked_first=True)), (0, "MASKED_FIRST", dict(masked_first=True)),
                            (8, "TMA_STORE", dict(tma_store_=True)), (0, "TMA_STORE", dict(tma_store_=True))):
        k = compile_for_sm90_ws(2, 64, narrow_rows=nrows, full_rows=True, **kw)
        use = resource_usage(k.asm["cubin"])
        spill = use.get("LOCAL", 0) + use.get("STACK", 0)
        good = int(k.metadata.shared) <= SMEM_LIMIT_SM90
        if what == "TMA_STORE":  # the partials leave by bulk tensor copies
            good &= "cp.async.bulk.tensor.3d.global.shared" in k.asm["ptx"]
        ok &= good
        print(f"_verify_gluon_ws_kernel sm_90 colsplit splits=N P= 64 narrow {nrows:2d} {what}: shared "
              f"{int(k.metadata.shared)} regs {use.get('REG', 0)} spill {spill}  {'ok' if good else 'FAIL'}  "
              f"{_fmt_counts(sass_counts(k.asm['cubin']))}", flush=True)
    for nrows in (8, 0):  # SPLIT_PDL: the wait before the first global load
        k = compile_for_sm90_ws(2, 64, narrow_rows=nrows, full_rows=True, wait_prior=True)
        ptx = k.asm["ptx"]
        first_wait, first_load = ptx.find("griddepcontrol.wait"), ptx.find("ld.global")
        good = 0 <= first_wait < first_load and int(k.metadata.shared) <= SMEM_LIMIT_SM90
        ok &= good
        print(f"_verify_gluon_ws_kernel sm_90 colsplit splits=N P= 64 narrow {nrows:2d} WAIT_PRIOR: griddepcontrol.wait "
              f"{'before' if good else 'NOT before'} the first global load, shared {int(k.metadata.shared)}", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    _main()
