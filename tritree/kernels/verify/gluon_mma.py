"""The sm_120 (RTX PRO 6000 Blackwell) Gluon verify kernel, ``kernel="gluon-mma"``: ``mma.sync`` only and at
most 101,376 B of shared memory a block (host side in ``gluon_launch``). ``verify_mla`` runs it for
bf16 pools on sm_120 and, under ``TRITREE_ARCH=sm_120``, on the H200, where the same ``mma.sync`` m16n8k16
instructions run.

Same semantics, split-KV chunking and output / partial format as the Triton kernel
(``triton_kernel._verify_mla_kernel``); with several splits the caller merges the partials
(``_splitkv.combine_splits``).

Why this shape. The 576-wide MLA head does not fit sm_120's shared memory the Hopper way: a 64-row Q tile
is 73,728 B and a 32-key KV tile 36,864 B. Here the queries live in registers and the shared memory holds a
two-slot ring of KV tiles. A CTA of 8 warps owns ``BLOCK_M = 32`` packed (token, head) rows; its warps form
a ``[4, 2]`` grid: warp ``(c, r)`` holds rows ``16 r .. 16 r + 15`` and channel slice ``c`` (latent columns
``128 c .. 128 c + 127``, rope columns ``16 c .. 16 c + 15``). Both products are batched over the four
slices with one ``mma.sync`` layout (``[slice, rows, keys or columns]``):

* scores: warp ``(c, r)`` computes its rows' partial scores over its 144 channels (36 registers of Q a
  thread; no query value is held twice); the four slices' partials are summed through shared memory, which
  gives every warp of a row group its 16 rows' whole scores;
* the online softmax runs inside each warp (a row's keys are in one warp: shuffles only);
* ``O += P V``: warp ``(c, r)`` owns output columns ``128 c .. 128 c + 127`` of its rows (64 fp32
  registers a thread). V is the latent part of the same KV slot, already laid out by slice: each tile is
  read once from memory, as key and as value. P reaches the A operand through a small shared buffer.

The KV slots are laid out by slice, ``[4, BLOCK_N, 128]`` latent and ``[4, BLOCK_N, 16]`` rope (rows
swizzled for ``ldmatrix``), filled by ``cp.async`` row gathers (16-byte vectors; any page size): the tile
after next is in flight while a tile computes. The masked tail (the prefix remainder and the tree keys)
goes through the same ring with predicated copies (keys past ``end`` zero-filled: a key past the request
may hold NaN) and the tree's ancestor bits.

fp8 (e4m3) pools: the same schedule over 1-byte tiles (half the shared memory and copies), each fragment
widened to bf16 as it leaves shared memory; the per-tensor scale is folded into the score scale and applied
to O once, as in the Triton kernel.

Shared memory at ``BLOCK_N = 32``: KV 2 x 36,864 B, the score partials 16,384 B, P 8,192 B: 98,304 B (fp8
pools: 61,440 B).
"""

from __future__ import annotations

from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .._gluon_common import (
    _cp_async,
    _cta_barrier,
    _row_scale,
    _softmax,
    _tail_mask_apply,
    _tail_mask_words,
    async_copy,
    gl,
    gluon,
)
from .._splitkv import split_chunk

BLOCK_M = 32
BLOCK_N = 32


@gluon.jit
def _gather(KV, pt, n, end, col0, max_pages, num_pages, stride_kvp, stride_kvs, dst, ld: gl.constexpr,
            W: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """``cp.async`` of keys ``n .. n + BLOCK_N - 1``, columns ``col0 + W c .. col0 + W c + W - 1`` into
    ``dst[c]`` (``[4, BLOCK_N, W]``; ``ld`` its copy layout, vectors of up to 16 bytes); keys at or past ``end`` are
    zero-filled and read no page id. Page-table column and page id are clamped into range, as in the Triton
    kernel."""
    keys = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, ld)))
    col = gl.minimum(keys // PAGE_SIZE, max_pages - 1)
    page = gl.load(pt + col, mask=keys < end, other=0)
    page = gl.minimum(gl.maximum(page, 0), num_pages - 1).to(gl.int64)
    row = page * stride_kvp + (keys % PAGE_SIZE).to(gl.int64) * stride_kvs
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, ld))), 1), 2)
    j3 = gl.expand_dims(gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, ld))), 0), 1)
    ptr = KV + gl.expand_dims(gl.expand_dims(row, 0), 2) + (col0 + c3 * W + j3)
    ok = gl.expand_dims(gl.expand_dims(keys < end, 0), 2) & (c3 >= 0) & (j3 >= 0)
    _cp_async(dst, ptr, mask=ok)


@gluon.jit
def _issue(j, n_tiles, start, end, KV, pt, max_pages, num_pages, stride_kvp, stride_kvs, lat_ring, pe_ring,
           lat_ld: gl.constexpr, pe_ld: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr,
           BLOCK_N: gl.constexpr):
    """Tile ``j`` of the chunk into slot ``j % 2`` (keys past ``end`` zero-filled; nothing past the chunk),
    committed as one ``cp.async`` group (empty past the chunk: the group count stays one a tile)."""
    slot = j % 2
    n = start + j * BLOCK_N
    if j < n_tiles:
        _gather(KV, pt, n, end, 0, max_pages, num_pages, stride_kvp, stride_kvs, lat_ring.index(slot), lat_ld,
                D_LAT // 4, PAGE_SIZE, BLOCK_N)
        _gather(KV, pt, n, end, D_LAT, max_pages, num_pages, stride_kvp, stride_kvs, pe_ring.index(slot), pe_ld,
                16, PAGE_SIZE, BLOCK_N)
    async_copy.commit_group()


@gluon.jit
def _scores(q_lo, q_hi, q_pe, lat, pe, red, red_slices, mma: gl.constexpr, b_op: gl.constexpr, s_layout: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HW: gl.constexpr):
    """``S = Q_lat K_lat^T + Q_pe K_pe^T`` of one slot: each slice warp's partial over its channels (the latent
    slice in two halves of 64 columns, so that fewer K fragments are live at once), summed across the slices
    through ``red`` (``[4, BLOCK_M, BLOCK_N]`` fp32; ``red_slices`` the same bytes, sliceable).
    ``[BLOCK_M, BLOCK_N]`` in ``s_layout``, whole in every warp of a row group."""
    s_zero3 = gl.zeros([4, BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    part = mma_v2(q_lo, lat.slice(0, HW, dim=2).permute([0, 2, 1]).load(b_op).to(gl.bfloat16), s_zero3)
    part = mma_v2(q_hi, lat.slice(HW, HW, dim=2).permute([0, 2, 1]).load(b_op).to(gl.bfloat16), part)
    part = mma_v2(q_pe, pe.permute([0, 2, 1]).load(b_op).to(gl.bfloat16), part)
    red.store(part)
    _cta_barrier()
    s = red_slices.index(0).load(s_layout)
    s += red_slices.index(1).load(s_layout)
    s += red_slices.index(2).load(s_layout)
    s += red_slices.index(3).load(s_layout)
    return s


@gluon.jit
def _pv(p, alpha, o_lo, o_hi, lat, p_smem, a_op: gl.constexpr, b_op: gl.constexpr, mma: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HW: gl.constexpr):
    """``O = O alpha + P V`` in two halves of 64 columns (V: the slot's latent part, slice ``c`` for the warps of
    slice ``c``). P goes to the A operand through ``p_smem`` (``[4, BLOCK_M, BLOCK_N]``: each slice warp stores
    and reloads its own copy)."""
    p3, _ = gl.broadcast(gl.expand_dims(p, 0), gl.zeros([4, BLOCK_M, BLOCK_N], gl.bfloat16, layout=mma))
    p_smem.store(p3)
    _cta_barrier()
    pa = p_smem.load(a_op)
    row_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, mma))
    a3 = gl.expand_dims(gl.expand_dims(gl.convert_layout(alpha, row_l), 0), 2)
    o_lo = mma_v2(pa, lat.slice(0, HW, dim=2).load(b_op).to(gl.bfloat16), o_lo * a3)
    o_hi = mma_v2(pa, lat.slice(HW, HW, dim=2).load(b_op).to(gl.bfloat16), o_hi * a3)
    return o_lo, o_hi


@gluon.jit
def _verify_gluon_mma_kernel(
    Q, KV, PageTable, KvLens, TreeMask, TreeLens,
    Out, Lse,
    sm_scale_log2e,
    v_scale,
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
    BLOCK_M: gl.constexpr = 32,
    BLOCK_N: gl.constexpr = 32,
    D_LAT: gl.constexpr = 512,
    D_PE: gl.constexpr = 64,
):
    """``sm_scale_log2e``: the softmax scale times log2(e), and for an fp8 (e4m3) pool times its ``kv_scale``;
    ``v_scale``: an fp8 pool's ``kv_scale`` (applied to O once), else unused. fp8 tiles are widened to bf16 as
    their fragments leave shared memory."""
    gl.static_assert(BLOCK_M == 32, "8 warps: 4 channel slices x 2 row groups of 16")
    gl.static_assert(BLOCK_N == 32, "the copy layouts cover 32-key tiles")
    gl.static_assert(D_LAT == 512 and D_PE == 64, "4 slices of 128 latent + 16 rope columns")
    KV_T: gl.constexpr = KV.dtype.element_ty
    FP8: gl.constexpr = KV_T == gl.float8e4nv
    VEC: gl.constexpr = 16 if FP8 else 8  # elements in 16 bytes
    SL: gl.constexpr = 4
    LW: gl.constexpr = D_LAT // SL
    PW: gl.constexpr = D_PE // SL
    HW: gl.constexpr = LW // 2
    # k_width: elements a thread holds in a row of an operand fragment; 4 where fp8 fragments are widened.
    KW: gl.constexpr = 4 if FP8 else 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[SL, 2, 1], instr_shape=[1, 16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    s_l: gl.constexpr = gl.SliceLayout(0, mma)  # [BLOCK_M, BLOCK_N] scores, whole in each slice warp
    row_l: gl.constexpr = gl.SliceLayout(1, s_l)
    # Copy layouts: 16-byte vectors for the latent (8 warps along the keys: a few page ids a thread), one vector
    # a thread for the rope's [4, 32, 16] (8 bytes of fp8).
    if FP8:
        lat_ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[1, 4, 8],
                                                warps_per_cta=[1, 8, 1], order=[2, 1, 0])
        lat_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=2, max_phase=4, order=[2, 1, 0])
        pe_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=8, max_phase=1, order=[2, 1, 0])
    else:
        lat_ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 2, 16],
                                                warps_per_cta=[1, 8, 1], order=[2, 1, 0])
        lat_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[2, 1, 0])
        pe_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0])
    pe_ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 16, 2],
                                           warps_per_cta=[SL, 2, 1], order=[2, 1, 0])
    # The partials stored as [4, BLOCK_M, BLOCK_N] and read one slice at a time through a view whose layout is
    # the same 2-D swizzle a slice (a layout of the view's rank or one less is what a slice index takes).
    red_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[2, 1, 0])
    red_sl2: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])
    p_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=2, max_phase=4, order=[2, 1, 0])

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b = gl.program_id(2)
    # Pool and query rows are 16-byte aligned (the policy's layout check): strides of whole 16-byte vectors, written
    # so that the compiler can prove it for the 16-byte cp.async and the paired query loads.
    stride_kvp = (stride_kvp // VEC) * VEC
    stride_kvs = (stride_kvs // VEC) * VEC
    stride_qb = (stride_qb // 8) * 8
    stride_qt = (stride_qt // 8) * 8
    stride_qh = (stride_qh // 8) * 8
    kv_len = gl.maximum(gl.load(KvLens + b), 0)  # unchecked lengths kept in range
    tree_len = gl.minimum(gl.maximum(gl.load(TreeLens + b), 0), T)
    n_keys = kv_len + tree_len
    start, end = split_chunk(n_keys, pid_s, num_splits, BLOCK_N)
    full_end = start + (gl.maximum(gl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N
    n_full = (full_end - start) // BLOCK_N
    n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    pt = PageTable + b.to(gl.int64) * stride_ptb

    lat_ring = gl.allocate_shared_memory(KV_T, [2, SL, BLOCK_N, LW], lat_sl)
    pe_ring = gl.allocate_shared_memory(KV_T, [2, SL, BLOCK_N, PW], pe_sl)
    red = gl.allocate_shared_memory(gl.float32, [SL, BLOCK_M, BLOCK_N], red_sl)
    red_slices = red._reinterpret(gl.float32, [SL, BLOCK_M, BLOCK_N], red_sl2)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [SL, BLOCK_M, BLOCK_N], p_sl)

    # The first two tiles in flight before the queries are read.
    _issue(0, n_tiles, start, end, KV, pt, max_pages, num_pages, stride_kvp, stride_kvs, lat_ring, pe_ring,
           lat_ld, pe_ld, PAGE_SIZE, D_LAT, BLOCK_N)
    _issue(1, n_tiles, start, end, KV, pt, max_pages, num_pages, stride_kvp, stride_kvs, lat_ring, pe_ring,
           lat_ld, pe_ld, PAGE_SIZE, D_LAT, BLOCK_N)

    # Queries straight into the A-operand registers: [slice, row, column] (rows past the tree read nothing).
    a_row_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, a_op))
    rows_a = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=a_row_l)
    t_a = rows_a // H
    ok_a = (rows_a < T * H) & (t_a < tree_len)
    q_row = (b.to(gl.int64) * stride_qb + (gl.where(ok_a, t_a, 0) * stride_qt
                                          + gl.where(ok_a, rows_a % H, 0) * stride_qh).to(gl.int64))
    q_row3 = gl.expand_dims(gl.expand_dims(q_row, 0), 2)
    ok3 = gl.expand_dims(gl.expand_dims(ok_a, 0), 2)
    c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, SL, layout=gl.SliceLayout(1, gl.SliceLayout(2, a_op))), 1), 2)
    jl = gl.expand_dims(gl.expand_dims(gl.arange(0, HW, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_op))), 0), 1)
    q_lo = gl.load(Q + q_row3 + (c3 * LW + jl), mask=ok3 & (c3 >= 0) & (jl >= 0), other=0.0)
    q_hi = gl.load(Q + q_row3 + (c3 * LW + HW + jl), mask=ok3 & (c3 >= 0) & (jl >= 0), other=0.0)
    jp = gl.expand_dims(gl.expand_dims(gl.arange(0, PW, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_op))), 0), 1)
    q_pe = gl.load(Q + D_LAT + q_row3 + (c3 * PW + jp), mask=ok3 & (c3 >= 0) & (jp >= 0), other=0.0)

    o_lo = gl.zeros([SL, BLOCK_M, HW], gl.float32, layout=mma)
    o_hi = gl.zeros([SL, BLOCK_M, HW], gl.float32, layout=mma)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_l)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_l)

    # ---- the chunk's tiles: the committed prefix's full tiles unmasked, then the masked tail (the prefix
    # remainder and the tree keys) in the same loop (one loop keeps fewer values live across loops).
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_l)
    t = rows // H
    row_ok = (rows < T * H) & (t < tree_len)
    mask_base = TreeMask + b.to(gl.int64) * stride_mb
    for j in range(n_tiles):
        slot = j % 2
        n = start + j * BLOCK_N
        async_copy.wait_group(1)  # groups so far: tiles 0 .. j+1, one each: tile j has landed
        _cta_barrier()
        lat = lat_ring.index(slot)
        s = _scores(q_lo, q_hi, q_pe, lat, pe_ring.index(slot), red, red_slices, mma, b_op, s_l, BLOCK_M, BLOCK_N, HW)
        if j >= n_full:
            words = _tail_mask_words(n, kv_len, tree_len, row_ok, t, mask_base, stride_mt, BLOCK_N)
            s = _tail_mask_apply(s, words, n, end, kv_len, row_ok, s_l, BLOCK_N)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, sm_scale_log2e)
        o_lo, o_hi = _pv(p, alpha, o_lo, o_hi, lat, p_smem, a_op, b_op, mma, BLOCK_M, BLOCK_N, HW)
        _cta_barrier()  # every warp is done with the slot: tile j+2 goes there
        _issue(j + 2, n_tiles, start, end, KV, pt, max_pages, num_pages, stride_kvp, stride_kvs, lat_ring, pe_ring,
               lat_ld, pe_ld, PAGE_SIZE, D_LAT, BLOCK_N)
    async_copy.wait_group(0)

    # ---- rows out: _splitkv.store_rows semantics ---------------------------------------------------
    o_row_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, mma))
    rows_o, row_in, has, l_safe, inv = _row_scale(l_i, pid_m, T, H, tree_len, o_row_l, BLOCK_M)
    m_o = gl.convert_layout(m_i, o_row_l)
    lse2 = gl.where(has, m_o + gl.log2(l_safe), float("-inf"))
    if FP8:  # the values' per-tensor scale (the keys' is in sm_scale_log2e)
        inv = inv * v_scale
    inv3 = gl.expand_dims(gl.expand_dims(inv, 0), 2)
    t_o = rows_o // H
    h_o = rows_o % H
    c3o = gl.expand_dims(gl.expand_dims(gl.arange(0, SL, layout=gl.SliceLayout(1, gl.SliceLayout(2, mma))), 1), 2)
    jo = gl.expand_dims(gl.expand_dims(gl.arange(0, HW, layout=gl.SliceLayout(0, gl.SliceLayout(1, mma))), 0), 1)
    cols = c3o * LW + jo
    in3 = gl.expand_dims(gl.expand_dims(row_in, 0), 2) & (c3o >= 0) & (jo >= 0)
    if SINGLE_SPLIT:
        o_row = b.to(gl.int64) * stride_ob + (t_o * stride_ot + h_o * stride_oh).to(gl.int64)
        lse_ptr = Lse + b.to(gl.int64) * stride_lb + t_o * stride_lt + h_o * stride_lh
        lse_out = lse2 * 0.6931471805599453
    else:
        o_row = b.to(gl.int64) * stride_ob + pid_s.to(gl.int64) * stride_os + rows_o.to(gl.int64) * stride_oh
        lse_ptr = Lse + b.to(gl.int64) * stride_lb + pid_s * stride_ls + rows_o * stride_lh
        lse_out = lse2
    o_ptr = Out + gl.expand_dims(gl.expand_dims(o_row, 0), 2) + cols
    gl.store(o_ptr, (o_lo * inv3).to(Out.dtype.element_ty), mask=in3)
    gl.store(o_ptr + HW, (o_hi * inv3).to(Out.dtype.element_ty), mask=in3)
    gl.store(lse_ptr, lse_out, mask=row_in)
