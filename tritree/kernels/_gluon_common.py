"""Gluon pieces shared by the two Hopper verify kernels (``verify.gluon_plain`` and ``verify.gluon_ws``):
the version-resolved Gluon names and the ``@gluon.jit`` helpers both schedules call (Q and tail copies,
scores, online softmax, tree mask, store, timeline stamps).

Importing this module needs ``triton.experimental.gluon`` (triton 3.6 to 3.9); ``verify.gluon_launch``
imports the kernels behind one guard and reports ``GLUON_AVAILABLE``.

The names that changed between triton 3.6 and 3.9 are resolved here: 3.6 has
``tma.async_copy_global_to_shared`` / ``async_copy_shared_to_global``,
``async_copy.async_copy_global_to_shared`` and ``gl.thread_barrier``; 3.9 has ``tma.async_load`` /
``async_store``, ``async_copy.async_load`` and ``gl.barrier`` (the old names raise there). Shared-memory
reinterpretation is ``_reinterpret`` on 3.6 and ``reinterpret`` on 3.9: the kernels call ``_reinterpret``,
added on 3.9 as an alias of the same builtin.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
if not hasattr(gl.shared_memory_descriptor, "_reinterpret"):
    gl.shared_memory_descriptor._reinterpret = gl.shared_memory_descriptor.reinterpret

__all__ = ["gluon", "gl", "async_copy", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma",
           "warpgroup_mma_wait", "_tma_load", "_tma_store", "_cp_async", "_cta_barrier"]


@gluon.jit
def _now(any_int):
    """``%globaltimer_lo`` (ns, wraps every 4.3 s): one stamp of ``TIMELINE``. ``any_int``: a
    scalar for the asm's operand list."""
    return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r,r", [any_int], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _clock(any_int):
    """``%clock`` (SM cycles, low 32 bits): the ws kernel's ``TIMELINE=2`` clock stamps."""
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
def _load_q(Q, q_lat, q_pe, b, pid_m, T, H, tree_len, stride_qb, stride_qt, stride_qh, ld_layout: gl.constexpr,
            BLOCK_M: gl.constexpr, D_LAT: gl.constexpr):
    """Issues the cp.async copies of the row block's queries into ``q_lat`` / ``q_pe`` (the caller
    commits and waits): all ten column blocks in flight at once (loads through registers would put a
    CTA barrier between the stores into one buffer, nine latencies in a row before the first score).
    Rows past the tree or past T*H are zero-filled by predicated copies (never attended from, stored as
    zeros): a row block with few real rows (T=17,H=8 or T=65,H=8: the last holds 8) would otherwise
    send every padding row's copies to the same 1,152 bytes."""
    rows_ld = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
    t_ld = rows_ld // H
    h_ld = rows_ld % H
    ok_ld = (rows_ld < T * H) & (t_ld < tree_len)
    t_ld = gl.where(ok_ld, t_ld, 0)  # (clamping the indices, not the offset, keeps the strides' alignment)
    h_ld = gl.where(ok_ld, h_ld, 0)
    q_rows = gl.expand_dims(Q + b.to(gl.int64) * stride_qb + (t_ld * stride_qt + h_ld * stride_qh).to(gl.int64), 1)
    d_ld = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout)), 0)
    row_ok = gl.expand_dims(ok_ld, 1)
    for c in gl.static_range(D_LAT // 64):
        _cp_async(q_lat.slice(c * 64, 64, dim=1), q_rows + (c * 64 + d_ld), mask=row_ok)
    _cp_async(q_pe, q_rows + (D_LAT + d_ld), mask=row_ok)


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
                 PAIR_BUFFERS: gl.constexpr, PAGE_SIZE: gl.constexpr, D_LAT: gl.constexpr, BLOCK_N: gl.constexpr,
                 EARLY_MASK: gl.constexpr = False):
    """One tile of the masked tail up to its P: keys ``n .. n+63`` copied (masked) into the tail slot,
    scores, mask, softmax. Returns ``(p, alpha, m_i, l_i, tail_lat)``; the caller publishes P and
    adds ``P V`` (V = ``tail_lat``). ``PAIR_BUFFERS``: the tail slot is rows 0..63 of the ws kernel's
    pair buffers, else the plain kernel's two slots alternate. ``EARLY_MASK``: the tree-mask words are loaded before the tile's
    copy is issued, so that their latency passes under the copy's instead of after the scores."""
    # The tail's buffers are picked by a runtime index (the plain kernel's two slots alternate; in the
    # pair buffers, ``PAIR_BUFFERS``, rows 0..63 via an index that is 0 at run time): wgmma descriptors of
    # a loop-invariant buffer are hoisted out of the loop by triton 3.6 and spilled there.
    if PAIR_BUFFERS:
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

