"""The warp-specialised Hopper (sm_90) Gluon verify kernel: what ``verify_mla`` runs for bf16 pools above 64
packed rows at P % 64 == 0 and above 16 rows for pages below 64 (``kernel="gluon-ws"``; host side in
``gluon_launch``, whose docstring says which launch a shape gets).

Same math, masking, tail and output / partial format as the plain kernel (``gluon_plain``), over
tile pairs: a ``[128, 576]`` pair buffer (rows 0..63 = the even tile, 64..127 = the odd one) whose scores
are one m64 n128 wgmma with warps ``[4, 2]`` (warpgroup w computes tile w's 64 keys), streamed per
64-channel column block (``_qk_streamed``: one mbarrier per block covering both slots). P (64 x 128 bf16)
is written over the pair's rope rows, dead once the scores are done (a ``[128, 64]`` swizzled buffer is
byte for byte the two column blocks of a ``[64, 128]`` one). The copies are issued by a producer
partition, and ``O += P V`` runs by column halves: ``O[:, :256] += P V[:, :256]`` then ``O[:, 256:] +=
P V[:, 256:]``, each m64 n256 k128 over both tiles, so column blocks 0..3 of both slots are released
after the first and refilled under the second; the next scores stream in the same column order and
start on blocks 0..3 while 4..7 and the rope still load. The output rows are 16 bits (the output itself,
or bf16 split partials).

Partitions (``gl.warp_specialize``; 12 warps per CTA):

* default partition (the kernel's 8 warps = 2 consumer warpgroups, 240 registers by ``setmaxnreg``): Q load
  (cp.async), the pair loop (streamed scores; the softmax with one exchange of row maxima between the
  warpgroups, ``_softmax_xwg``; P over the rope rows; ``O += P V`` as two accumulators ``oa`` / ``ob`` of
  64 registers each), the masked tiles (``MASKED_PAIRS``: full row blocks' masked tiles as masked pairs of
  the producer's stream ahead of the full pairs, ``_pair_mask``; else the one-tile tail, cp.async into rows
  0..63, each tile's tree-mask words loaded before its copy) and the store (16-bit rows scaled and cast,
  re-laid out through the pair buffers; bf16 split partials by TMA boxes, ``TMA_STORE``). It never issues a
  TMA copy.
* worker partition ``_ws_producer`` (4 warps, 24 registers; 40 when it gathers rows, the consumers then get
  232; in ``gluon_ws_producer`` with the grid / key geometry, the release barriers and the tile
  placement that both partitions use): page-table lookups, the TMA boxes of every pair and the bulk L2 prefetch one pair ahead; for pages
  below a tile, cp.async row gathers of each column block of both tiles, one group per block: as each group
  lands it fences (generic -> async proxy), syncs its 128 threads and arrives once on the block's barrier
  (count 1, no bytes), so the consumers wait exactly as for TMA. It exits after issuing the last pair.

Barriers (``count=1``, each its own allocation, initialised before the fork):

* ``cbars[c]``, c = 0..8 (8 latent column blocks + rope): pair i completes phase i of every ``cbars[c]``
  once block c of both slots has landed (armed for 16 KB by the producer). Consumers wait with parity
  ``i & 1``. The producer cannot arm phase i+1 before the consumers have released what that block
  overwrites, so a parity wait never aliases.
* releases: hardware barriers ``RELEASE_BAR0`` (latent blocks 0..3 of both slots) / ``RELEASE_BAR1`` (blocks
  4..7 and the rope rows), 384 threads: every consumer thread ``bar.arrive``s after its own warpgroup's
  ``wgmma_wait`` (no partition barrier), the producer's 128 threads ``bar.sync`` before the refill. No
  release after the last pair; with ``MASKED_PAIRS`` the full blocks' consumers release every pair and the
  producer takes the last one's before it exits. After the loop one partition barrier (the tail reuses
  the buffers).
* The consumers' CTA barriers compile to ``bar.sync 0, 256`` (partition local); the membar barriers between
  the producer's TMA issues are ``bar.sync 2, 128``; barrier 1 (all 384 threads) is the fork / join only.

Narrow last row block (``NARROW_ROWS`` = 8 or 16 real rows): that block's consumers run ``_narrow_pairs``
(the rows as the MMAs' N: ``S^T = K Q^T``, ``O^T += V^T P^T``) over the same producer stream, then lay the
state back out as rows for the masked tail and the store. The grid's first axis then lists the full
blocks' programs and the narrow block's (``_program``), which has its own split count and writes its
surplus partial slots empty.

``WIDE_COPIES``: a pair's two tiles as one 128-row box per column block where they are consecutive pool
rows (one page of 128 or more, or two adjacent pages): 9 copies a pair instead of 18.

Tail / exit: every TMA copy belongs to some pair and the consumers wait for all of them before that pair's
scores, so by the tail no copy is in flight. n_pairs = 0: the producer issues nothing, the consumers run
the tail only.

Shared memory: Q 73,728 + pair buffer 147,456 (P over the rope rows) + tail P 8,192 + the warpgroups'
exchange of row maxima 512 + reduction scratch + 11 mbarriers = 230,540 B of the 232,448.
"""

from __future__ import annotations

from .._gluon_common import (
    _clock,
    _cta_barrier,
    _load_q,
    _now,
    _publish_p,
    _row_scale,
    _softmax,
    _store_o,
    _store_timeline,
    _tail_rows,
    _tail_tile_p,
    _tma_store,
    async_copy,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from .gluon_ws_producer import (
    RELEASE_BAR0,
    RELEASE_BAR1,
    _chunk_bounds,
    _program,
    _release,
    _tail_extent,
    _tile_shift,
    _ws_producer,
)


@gluon.jit
def _wait_prior_grid(any_int):
    """Programmatic dependent launch: wait until the grids this one depends on have completed and their
    writes are visible (``griddepcontrol.wait``; returns at once for a launch without ``launch_pdl``).
    Before any global read of anything a prior kernel may write. ``any_int``: a scalar for the asm's
    operand list."""
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [any_int],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _new_bar():
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return bar


@gluon.jit
def _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, phase, s_zero, D_LAT: gl.constexpr,
                 TRANSPOSED: gl.constexpr = False):
    """A pair's scores ``[Q K_0^T | Q K_1^T]`` (m64 n128: warpgroup w computes tile w's 64 keys), one
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
                        BLOCK_N: gl.constexpr):
    """Keys ``tail_start .. end``, one masked tile at a time by the consumers' own cp.async copies into rows
    0..63 of the pair buffers, with O as two column halves ``oa`` / ``ob``. Each tile's tree-mask words are
    loaded before its copy is issued (``_tail_tile_p``'s ``EARLY_MASK``), their latency under the copy's
    instead of after the scores. Returns ``(oa, ob, m_i, l_i)``."""
    HALF: gl.constexpr = D_LAT // 2
    s_zero, t, row_ok, mask_base = _tail_rows(TreeMask, b, pid_m, T, H, tree_len, stride_mb, s_layout, BLOCK_M,
                                              BLOCK_N)
    for n in range(tail_start, end, BLOCK_N):
        p, alpha, m_i, l_i, tail_lat = _tail_tile_p(
            n, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks, KV, PageTable, b, tail_start, end,
            kv_len, tree_len, row_ok, t, mask_base, stride_ptb, max_pages, num_pages, stride_kvp, stride_kvs,
            stride_mt, sm_scale_log2e, s_zero, s_layout, ld_layout, True, PAGE_SIZE, D_LAT, BLOCK_N, True)
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
def _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, more, sm_scale_log2e, xbuf, s3_layout: gl.constexpr,
                   both_layout: gl.constexpr, oh_layout: gl.constexpr, D_LAT: gl.constexpr):
    """One pair of ``_colsplit_pairs`` from its scores ``s``: softmax (``_softmax_xwg``; ``l``: the row sums
    per warpgroup), P, ``O += P V`` by column halves, the two releases. Returns ``(oa, ob, m_i, l)``."""
    HALF: gl.constexpr = D_LAT // 2
    p, alpha, m_i, l = _softmax_xwg(s, m_i, l, sm_scale_log2e, xbuf, s3_layout, both_layout)
    oa = _publish_p(p, alpha, oa, p2_smem, oh_layout)
    ob = ob * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, oh_layout)), 1)
    oa = warpgroup_mma(p2_smem, k_lat.slice(0, HALF, dim=1), oa, is_async=True)
    ob = warpgroup_mma(p2_smem, k_lat.slice(HALF, HALF, dim=1), ob, is_async=True)
    oa = warpgroup_mma_wait(num_outstanding=1, deps=[oa])
    _release(RELEASE_BAR0, more)  # column blocks 0..3 of both slots read ...
    ob = warpgroup_mma_wait(num_outstanding=0, deps=[ob])
    _release(RELEASE_BAR1, more)  # ... and blocks 4..7 and the rope rows (P)
    return oa, ob, m_i, l


@gluon.jit
def _masked_pair_steps(oa, ob, m_i, l, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, n_pairs, s2_zero, sm_scale_log2e,
                       xbuf, s3_layout: gl.constexpr, both_layout: gl.constexpr, oh_layout: gl.constexpr,
                       D_LAT: gl.constexpr, tail_args, NARROW_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """``_colsplit_pairs``' masked pairs (``MASKED_PAIRS``): the split's keys from the end of its ``n_pairs``
    full pairs to its end, as the first pairs of the producer's stream, each released. Returns ``(oa, ob,
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
        s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, k & 1, s2_zero, D_LAT)
        s = _pair_mask(s, vis, s4_layout)
        oa, ob, m_i, l = _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, k >= 0, sm_scale_log2e, xbuf, s3_layout,
                                        both_layout, oh_layout, D_LAT)
    return oa, ob, m_i, l, n_masked


@gluon.jit
def _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, n_pairs, s2_zero, sm_scale_log2e,
                    oh_layout: gl.constexpr, D_LAT: gl.constexpr, xbuf, tail_args, MASKED: gl.constexpr,
                    NARROW_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """The pair loop of a 64-row block (see ``_ws_consumer``). Returns ``(oa, ob, m_i, l_i)``. The softmax
    by ``_softmax_xwg`` (``xbuf``: its exchange buffer). ``MASKED`` (``MASKED_PAIRS``): first the split's
    masked tiles as pairs from the producer's stream (``_pair_mask``), then the full pairs, every pair
    released (the producer takes the last release too); ``tail_args``: ``(KvLens, TreeLens, TreeMask, T, H,
    num_splits, narrow_splits, stride_mb, stride_mt)``, kernel parameters."""
    # s3_layout: the accumulator layout of the scores (NVMMA v3, warps [4, 2], n64 a warpgroup) as linear
    # bases, viewed as [64 rows, 2 warpgroups, 64 keys]; checked by assert_trivial
    s3_layout: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0], [0, 0, 8], [0, 0, 16], [0, 0, 32]],
        lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0], [0, 1, 0]], block_bases=[], shape=[64, 2, 64])
    both_layout: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[8, 0], [0, 1]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0], [0, 0]], block_bases=[], shape=[64, 2])
    w_layout: gl.constexpr = gl.SliceLayout(2, s3_layout)
    # l_i (this block's sum so far) as warpgroup 0's part
    first = gl.expand_dims(gl.arange(0, 2, layout=gl.SliceLayout(0, w_layout)), 0) == 0
    l_in = gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, w_layout), assert_trivial=True), 1)
    l = gl.where(first, l_in, 0.0)
    first = 0  # pairs of the stream ahead of the full ones: the masked ones
    if MASKED:
        oa, ob, m_i, l, first = _masked_pair_steps(oa, ob, m_i, l, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, n_pairs,
                                                   s2_zero, sm_scale_log2e, xbuf, s3_layout, both_layout, oh_layout,
                                                   D_LAT, tail_args, NARROW_ROWS, PAGE_SIZE)
    for i in range(first, first + n_pairs):
        s = _qk_streamed(q_lat, q_pe, k_lat, k_pe, cbars, i & 1, s2_zero, D_LAT)
        if MASKED:
            more = i >= 0
        else:
            more = i + 1 < n_pairs
        oa, ob, m_i, l = _colsplit_step(oa, ob, m_i, l, s, k_lat, p2_smem, more, sm_scale_log2e, xbuf, s3_layout,
                                        both_layout, oh_layout, D_LAT)
    _cta_barrier()  # both warpgroups' last wgmmas done before the tail refills the buffers
    l_i = gl.convert_layout(gl.sum(l, 1), l_i.type.layout)
    return oa, ob, m_i, l_i


@gluon.jit
def _narrow_pairs(q_lat, q_pe, k_lat, k_pe, p_smem, cbars, n_pairs, sm_scale_log2e, oh_layout: gl.constexpr,
                  row_s_layout: gl.constexpr, NR: gl.constexpr, D_LAT: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr):
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
        _release(RELEASE_BAR0, more)  # column blocks 0..3 of both slots read ...
        ob_t = warpgroup_mma_wait(num_outstanding=0, deps=[ob_t])
        _release(RELEASE_BAR1, more)  # ... blocks 4..7 (and the rope rows, read by the scores)
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
                 q_lat, q_pe, k_lat, k_pe, p_smem, cbars, xbuf, out_desc,
                 PAGE_SIZE: gl.constexpr, SINGLE_SPLIT: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, D_LAT: gl.constexpr, D_PE: gl.constexpr, TIMELINE: gl.constexpr,
                 NARROW_ROWS: gl.constexpr, MASKED_PAIRS: gl.constexpr, TMA_STORE: gl.constexpr):
    """Default partition (8 warps): Q, the pair loop, the masked tail and the store; it never issues a TMA
    copy. ``O`` is two column halves (``oa`` = columns 0..255, ``ob`` = 256..511; each warpgroup 128 columns
    of each), and ``O += P V`` of a pair is two wgmmas by columns (m64 n256 k128 over both tiles): the first
    releases the latent column blocks 0..3 of both slots, the second blocks 4..7 and the rope rows (P). The
    next pair's scores stream in the same column order, so they start on blocks 0..3 while 4..7 still load.

    ``TIMELINE`` (bench only): five stamps taken by this partition (as the plain kernel's); 2: the timer at
    the start, the SM clock (``%clock``) at the start twice, the SM clock at the end and the timer at the
    end."""
    HALF: gl.constexpr = D_LAT // 2
    PAIR_N: gl.constexpr = 2 * BLOCK_N
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    s2_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, BLOCK_N, 16])
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[8, 1], order=[1, 0])
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    row_s_layout: gl.constexpr = gl.SliceLayout(1, s2_layout)
    p2_smem = k_pe._reinterpret(gl.bfloat16, [BLOCK_M, PAIR_N], smem_layout)
    # Only ``n_pairs`` comes from the parent: what the tail and the store need is recomputed after the pair
    # loop (program ids, kernel parameters, two reloaded scalars), so that it is not live (spilled) across
    # the loop, which has 240 registers here.
    pid_m, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
    b = gl.program_id(2)
    if TIMELINE:
        t0 = _now(b)
        if TIMELINE == 2:
            c0 = _clock(b)
    tree_len = gl.minimum(gl.maximum(gl.load(TreeLens + b), 0), T)

    # ---- Q: row copies (as the plain kernel's), while the producer issues the first pair ----------
    _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout, BLOCK_M, D_LAT)
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
    oa = gl.zeros([BLOCK_M, HALF], gl.float32, layout=oh_layout)
    ob = gl.zeros([BLOCK_M, HALF], gl.float32, layout=oh_layout)

    s2_zero = gl.zeros([BLOCK_M, PAIR_N], gl.float32, layout=s2_layout)
    tail_args = (KvLens, TreeLens, TreeMask, T, H, num_splits, narrow_splits, stride_mb, stride_mt)
    # ---- committed prefix: pairs of full tiles, no mask (with MASKED_PAIRS, the masked pairs first) -----
    if NARROW_ROWS > 0:
        if narrow:  # the last row block: NARROW_ROWS real rows
            oa, ob, m_i, l_i = _narrow_pairs(q_lat, q_pe, k_lat, k_pe, p_smem, cbars, n_pairs, sm_scale_log2e,
                                             oh_layout, row_s_layout, NARROW_ROWS, D_LAT, BLOCK_M, BLOCK_N)
        else:
            oa, ob, m_i, l_i = _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, n_pairs,
                                               s2_zero, sm_scale_log2e, oh_layout, D_LAT, xbuf, tail_args,
                                               MASKED_PAIRS, NARROW_ROWS, PAGE_SIZE)
    else:
        oa, ob, m_i, l_i = _colsplit_pairs(oa, ob, m_i, l_i, q_lat, q_pe, k_lat, k_pe, p2_smem, cbars, n_pairs,
                                           s2_zero, sm_scale_log2e, oh_layout, D_LAT, xbuf, tail_args, MASKED_PAIRS,
                                           NARROW_ROWS, PAGE_SIZE)

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
    oa, ob, m_i, l_i = _masked_tail_halves(oa, ob, m_i, l_i, q_lat, q_pe, tail_lat_v, tail_pe_v, tail_blocks,
                                           p_smem, KV, PageTable, TreeMask, b, pid_m, tail_start, end, kv_len,
                                           tree_len, T, H, stride_ptb, max_pages, num_pages, stride_kvp,
                                           stride_kvs, stride_mb, stride_mt, sm_scale_log2e, s_layout,
                                           oh_layout, ld_layout, PAGE_SIZE, D_LAT, BLOCK_M, BLOCK_N)

    # ---- store: 16-bit rows (the output, or bf16 split partials) --------------------------------
    if TIMELINE:
        t3 = _now(b)
    st_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                               warps_per_cta=[8, 1], order=[1, 0])
    if TMA_STORE:
        # Partial rows scaled and cast into rows 0..63 of the pair buffers (as the copies left them:
        # 64-column blocks, 128-byte swizzle), then one TMA box per column block ([1, 64, 64] of the
        # partials viewed as [B * splits, rows, 512]: the rows past the last clipped by the copy).
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
    else:
        # Re-laid out through the pair buffers (free now: the producer has no copy left and the tail's are
        # consumed; convert_layout's own scratch would not fit beside them), scaled by 1 / l and cast
        # first: 64 KB through shared memory, not 128; a warp's store then covers 512 contiguous bytes of
        # one row instead of 32-byte pieces of eight rows.
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
    PRODUCER_WARPS: gl.constexpr = 4,
    PRODUCER_REGS: gl.constexpr = 24,
    BLOCK_M: gl.constexpr = 64,
    BLOCK_N: gl.constexpr = 64,
    D_LAT: gl.constexpr = 512,
    D_PE: gl.constexpr = 64,
    TIMELINE: gl.constexpr = 0,
    NARROW_ROWS: gl.constexpr = 0,
    WIDE_COPIES: gl.constexpr = False,
    MASKED_PAIRS: gl.constexpr = False,
    WAIT_PRIOR: gl.constexpr = False,
    TMA_STORE: gl.constexpr = False,
):
    """``Out``: 16-bit rows (the output, or bf16 split partials). ``kv_desc``: the pool in 64-row boxes;
    ``kv_desc3``: with ``WIDE_COPIES`` the pool in 128-row boxes, ``kv_desc_pages``: with ``MASKED_PAIRS``
    the paged view, ``out_desc``: with ``TMA_STORE`` the partials' descriptor; each else ``kv_desc`` again
    (unused; the positional arguments stay the same). ``WAIT_PRIOR``: launched by programmatic dependent
    launch, waits for the prior grids before its first global read. See the module docstring."""
    gl.static_assert(D_PE == 64, "one 64-wide box of rope channels")
    gl.static_assert(BLOCK_M == BLOCK_N, "P (BLOCK_M x 2 BLOCK_N) lives in the rope buffers")
    # TMA tiles (P % 64 == 0), or row gathers by the producer (pages below a tile).
    gl.static_assert((PAGE_SIZE % BLOCK_N == 0) | (PAGE_SIZE < BLOCK_N), "page size: < 64 or a multiple of 64")
    gl.static_assert(D_LAT // 64 + 1 == 9)
    PAIR_N: gl.constexpr = 2 * BLOCK_N
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_m, pid_s, splits, narrow = _program(T, H, num_splits, narrow_splits, NARROW_ROWS, BLOCK_M)
    b = gl.program_id(2)
    if WAIT_PRIOR:
        _wait_prior_grid(b)
    kv_len = gl.maximum(gl.load(KvLens + b), 0)  # unchecked lengths kept in range
    tree_len = gl.minimum(gl.maximum(gl.load(TreeLens + b), 0), T)
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
    # Two more mbarriers, initialised and never waited on (the releases go by hardware barriers): they keep
    # the shared-memory layout, and so the compiled kernel, as measured (bench/RESULTS.md).
    _new_bar()
    _new_bar()
    # the consumers' exchange of row maxima (_softmax_xwg)
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
                            q_lat, q_pe, k_lat, k_pe, p_smem, cbars, xbuf, out_desc,
                            PAGE_SIZE, SINGLE_SPLIT, BLOCK_M, BLOCK_N, D_LAT, D_PE, TIMELINE, NARROW_ROWS,
                            MASKED_PAIRS, TMA_STORE)),
            (_ws_producer, (kv_desc, KV, k_lat, k_pe, cbars, pt, start, n_pairs, stride_kvp, stride_kvs, max_pages,
                            num_pages, PAGE_SIZE, D_LAT, BLOCK_N, kv_desc3, WIDE_COPIES, kv_desc_pages,
                            (KvLens, TreeLens, T, H, num_splits, narrow_splits), MASKED_PAIRS, NARROW_ROWS,
                            BLOCK_M)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )
