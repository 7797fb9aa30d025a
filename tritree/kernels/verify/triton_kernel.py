"""The Triton verify kernel: every call the Gluon kernels do not serve (fp16 / fp32, fp8 pools on Hopper, other
GPUs, unaligned rows, triton without Gluon, up to 16 packed rows on Hopper) and the interpreter's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import interpreting
from .._splitkv import attend_tile, page_group, page_of, split_chunk, store_rows


@triton.jit
def _load_kv_tile(KV, PageTable, s, page_base, stride_kvp, stride_kvs, max_pages, num_pages,
                  PAGE_SIZE: tl.constexpr, D_LAT: tl.constexpr, D_PE: tl.constexpr, s_ok):
    """Rows ``s`` of a request's paged latent cache: ([BN, 512], [BN, 64]). Page-table columns and
    page ids are clamped into range so a bad layout can never read outside the pool (it is
    reported by the launcher's checks instead)."""
    col = tl.minimum(s // PAGE_SIZE, max_pages - 1)
    page = tl.load(PageTable + page_base + col)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    tok = page * stride_kvp + (s % PAGE_SIZE) * stride_kvs
    k_lat = tl.load(KV + tok[:, None] + tl.arange(0, D_LAT)[None, :], mask=s_ok[:, None], other=0.0)
    k_pe = tl.load(KV + tok[:, None] + D_LAT + tl.arange(0, D_PE)[None, :], mask=s_ok[:, None], other=0.0)
    return k_lat, k_pe


@triton.jit
def _qk_pv_step(q_lat, q_pe, k_lat, k_pe, qk_extra_mask, m_i, l_i, acc, sm_scale_log2e,
                MASKED: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, SPLIT_SCORES: tl.constexpr = False):
    # fp8 pools: the tile in q's dtype (exact: every e4m3 value is a bf16 / fp16 / fp32 value; the
    # per-tensor scale is folded into the score scale and applied to O once). No-op otherwise.
    k_lat = k_lat.to(q_lat.dtype)
    k_pe = k_pe.to(q_pe.dtype)
    if UPCAST:  # interpreter: its bf16 dot is wrong, so compute bf16 tiles in fp32
        k_lat = k_lat.to(tl.float32)
        k_pe = k_pe.to(tl.float32)
    if IEEE:
        qk = tl.dot(q_lat, tl.trans(k_lat), input_precision="ieee")
        qk = tl.dot(q_pe, tl.trans(k_pe), qk, input_precision="ieee")
    elif SPLIT_SCORES:
        # Two dots scaled, then summed: neither feeds the other (Triton folds `dot + x` into a chained
        # dot, which would put all warps on M again; see attend_tile).
        qk = (tl.dot(q_lat, tl.trans(k_lat)) * sm_scale_log2e + tl.dot(q_pe, tl.trans(k_pe)) * sm_scale_log2e)
        return attend_tile(qk, k_lat, qk_extra_mask, m_i, l_i, acc, sm_scale_log2e, MASKED, IEEE, True, True)
    else:
        qk = tl.dot(q_lat, tl.trans(k_lat))
        qk = tl.dot(q_pe, tl.trans(k_pe), qk)
    # The latent tile is the value too: MLA's absorbed form reads each KV tile once.
    return attend_tile(qk, k_lat, qk_extra_mask, m_i, l_i, acc, sm_scale_log2e, MASKED, IEEE)


@triton.jit
def _verify_mla_kernel(
    Q, KV, PageTable, KvLens, TreeMask, TreeLens,
    Out, Lse,
    sm_scale_log2e,
    v_scale,
    stride_qb, stride_qt, stride_qh,
    stride_kvp, stride_kvs,
    stride_ptb, max_pages, num_pages,
    stride_mb, stride_mt,
    stride_ob, stride_ot, stride_oh,   # Out: final [B,T,H,512] (1 split) or partial [B,S,T*H,512]
    stride_os,
    stride_lb, stride_lt, stride_lh,   # Lse: final [B,T,H] or partial [B,S,T*H]
    stride_ls,
    T, H, num_splits,
    PAGE_SIZE: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr = False,
    PAGE_GROUP: tl.constexpr = 16,
    SPLIT_SCORES: tl.constexpr = False,
    TAIL_STAGES: tl.constexpr = 1,
    D_LAT: tl.constexpr = 512,
    D_PE: tl.constexpr = 64,
    V_SCALED: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2)
    # lengths no check has seen (GPU inputs without TRITREE_DEBUG) kept in range: any result, no stray access
    kv_len = tl.maximum(tl.load(KvLens + b), 0)
    tree_len = tl.minimum(tl.maximum(tl.load(TreeLens + b), 0), T)
    n_keys = kv_len + tree_len

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // H
    h = rows % H
    row_ok = (rows < T * H) & (t < tree_len)
    q_ptr = Q + b.to(tl.int64) * stride_qb + (t * stride_qt + h * stride_qh)[:, None]
    q_lat = tl.load(q_ptr + tl.arange(0, D_LAT)[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_ptr + D_LAT + tl.arange(0, D_PE)[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    # TMA (P >= BLOCK_N, one page per tile): chunks start on page boundaries, so the tiles of a group
    # of PAGE_GROUP pages take their page ids from one vector load before the group.
    if TMA:
        start, end = split_chunk(n_keys, pid_s, num_splits, PAGE_SIZE)
    else:
        start, end = split_chunk(n_keys, pid_s, num_splits, BLOCK_N)
    full_end = start + (tl.maximum(tl.minimum(end, kv_len) - start, 0) // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_LAT], dtype=tl.float32)
    page_base = b.to(tl.int64) * stride_ptb
    offs_n = tl.arange(0, BLOCK_N)
    all_rows = tl.full([BLOCK_M, BLOCK_N], 1, tl.int1)
    if TMA:  # the pool as a [pages * P, 576] matrix; P >= BLOCK_N, so a tile never crosses a page
        lat_desc = tl.make_tensor_descriptor(KV, shape=[num_pages * PAGE_SIZE, D_LAT + D_PE], strides=[stride_kvs, 1],
                                             block_shape=[BLOCK_N, D_LAT])
        pe_desc = tl.make_tensor_descriptor(KV + D_LAT, shape=[num_pages * PAGE_SIZE, D_PE], strides=[stride_kvs, 1],
                                            block_shape=[BLOCK_N, D_PE])

    # Committed prefix: every key visible to every row, no mask.
    if TMA:
        for g in range(start, full_end, PAGE_GROUP * PAGE_SIZE):
            pages = page_group(PageTable, page_base, g, max_pages, num_pages, PAGE_SIZE, PAGE_GROUP)
            for n in range(g, tl.minimum(g + PAGE_GROUP * PAGE_SIZE, full_end), BLOCK_N):
                page = page_of(pages, g, n, PAGE_SIZE, PAGE_GROUP)
                # full tiles only: TMA reads whole rows, and rows past a request may hold NaN
                row = page * PAGE_SIZE + n % PAGE_SIZE
                k_lat = lat_desc.load([row, 0])
                k_pe = pe_desc.load([row, 0])
                m_i, l_i, acc = _qk_pv_step(q_lat, q_pe, k_lat, k_pe, all_rows, m_i, l_i, acc, sm_scale_log2e,
                                            False, UPCAST, IEEE, SPLIT_SCORES)
    else:
        for n in range(start, full_end, BLOCK_N):
            s = n + offs_n
            k_lat, k_pe = _load_kv_tile(KV, PageTable, s, page_base, stride_kvp, stride_kvs, max_pages, num_pages,
                                        PAGE_SIZE, D_LAT, D_PE, s < full_end)
            m_i, l_i, acc = _qk_pv_step(q_lat, q_pe, k_lat, k_pe, all_rows, m_i, l_i, acc, sm_scale_log2e,
                                        False, UPCAST, IEEE, SPLIT_SCORES)

    # Tail: the prefix remainder and the tree keys, where the ancestor bits apply.
    mask_row = TreeMask + b.to(tl.int64) * stride_mb + t[:, None] * stride_mt
    for n in tl.range(full_end, end, BLOCK_N, num_stages=TAIL_STAGES):
        s = n + offs_n
        s_ok = s < end
        j = tl.maximum(s - kv_len, 0)
        in_tree = (s >= kv_len) & s_ok
        words = tl.load(mask_row + (j // 32)[None, :], mask=row_ok[:, None] & in_tree[None, :], other=0)
        bit = (words >> (j % 32)[None, :]) & 1
        visible = (((s < kv_len) & s_ok)[None, :] | (bit != 0)) & row_ok[:, None]
        k_lat, k_pe = _load_kv_tile(KV, PageTable, s, page_base, stride_kvp, stride_kvs, max_pages, num_pages,
                                    PAGE_SIZE, D_LAT, D_PE, s_ok)
        m_i, l_i, acc = _qk_pv_step(q_lat, q_pe, k_lat, k_pe, visible, m_i, l_i, acc, sm_scale_log2e,
                                    True, UPCAST, IEEE, SPLIT_SCORES)

    if V_SCALED:  # fp8 pools: the values' per-tensor scale (the keys' is in sm_scale_log2e)
        acc = acc * v_scale
    store_rows(Out, Lse, acc, m_i, l_i, row_ok, rows < T * H, b, pid_s, t, h, rows,
               stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
               SINGLE_SPLIT, D_LAT)



_ALLOCATOR_SET = False


def _scratch_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_scratch_allocator() -> None:
    # Device-side tensor descriptors live in a small global scratch buffer that Triton asks for at
    # launch; torch's caching allocator serves it (also during CUDA-graph capture).
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(_scratch_allocator)
        _ALLOCATOR_SET = True


def launch_config(cfg, *, num_splits: int, tma: bool, batch: int, T: int, H: int, d_lat: int, d_pe: int, q_dtype,
                  kv_dtype, page_size: int):
    """``(grid, constexprs, options)`` of the Triton kernel with ``cfg``'s tiles (an ``AttnConfig``), for the
    launcher and the ahead-of-time audit. ``tma``: KV tiles by tensor descriptors (the launcher sets up their
    scratch allocator, ``ensure_scratch_allocator``)."""
    grid = (triton.cdiv(T * H, cfg.block_m), num_splits, batch)
    constexprs = dict(
        PAGE_SIZE=page_size, SINGLE_SPLIT=num_splits == 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        UPCAST=interpreting() and q_dtype == torch.bfloat16, IEEE=q_dtype == torch.float32, TMA=tma,
        PAGE_GROUP=16, SPLIT_SCORES=cfg.split_scores,
        # The tail is one or two tiles: with split scores its copy buffers would not fit next to the
        # prefix loop's, so it runs unpipelined there (elsewhere as the kernel's loops).
        TAIL_STAGES=1 if cfg.split_scores else cfg.num_stages, D_LAT=d_lat, D_PE=d_pe, V_SCALED=kv_dtype != q_dtype)
    return grid, constexprs, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
