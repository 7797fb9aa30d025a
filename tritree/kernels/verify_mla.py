"""Tree-masked MLA verify attention over a paged latent KV cache, and the tree mask it reads.

MLA in absorbed form is MQA with a single KV head: key = the cached 576 values (512 latent ++ 64
rope), value = the first 512 of them. The kernel packs (tree tokens x heads) into the rows of the
matrix multiply so each KV tile, loaded once, serves every head and every tree node as key and as
value; the keys are split across programs (``_splitkv``) so one request fills the GPU. The committed
prefix is visible to every node, so the tree bitmask is read only in the tiles that hold tree keys
(the last ``ceil(T / BLOCK_N) + 1`` tiles of a request): a single pass with a masked tail.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._splitkv import (LOG2E, attend_tile, choose_num_splits, combine_splits, page_group, page_of,
                       split_destinations, store_rows)
from .configs import VERIFY_MLA_CONFIGS, AttnConfig, arch_of, lookup, num_sms

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE


# --------------------------------------------------------------------------------------------------
# Reference (the specification; float64 in the tests, the CPU path outside the interpreter)
# --------------------------------------------------------------------------------------------------

def _tree_visible(tree_mask: torch.Tensor, T: int) -> torch.Tensor:
    """[..., T, W] int32 words -> [..., T, T] bool."""
    j = torch.arange(T, device=tree_mask.device)
    words = tree_mask[..., j // 32].to(torch.int64)
    return ((words >> (j % 32)) & 1).bool()


def verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, return_lse=False,
                         d_rope: int = D_ROPE, kv_scale: float | None = None):
    """Plain PyTorch verify attention with the semantics of :func:`verify_mla`.

    Computes in ``promote(q.dtype, float32)`` (float64 inputs give a float64 result) and returns
    that dtype. Reads the host copies of the lengths: a specification, not a fast path. ``kv_scale``:
    an fp8 pool's per-tensor scale (the keys and values are ``kv * kv_scale``).
    """
    B, T, H, _ = q.shape
    P = kv.shape[1]
    cdt = torch.promote_types(q.dtype, torch.float32)
    d_lat = q.shape[-1] - d_rope
    out = torch.zeros(B, T, H, d_lat, dtype=cdt, device=q.device)
    lse = torch.full((B, T, H), float("-inf"), dtype=cdt, device=q.device)
    kv_lens_l = kv_lens.tolist()
    tree_lens_l = [T] * B if tree_lens is None else tree_lens.tolist()
    vis_tree = _tree_visible(tree_mask, T)
    for b in range(B):
        L, n = int(kv_lens_l[b]), int(tree_lens_l[b])
        if n == 0:
            continue
        pos = torch.arange(L + n, device=q.device)
        keys = kv[page_table[b, pos // P].long(), pos % P].to(cdt)  # [L+n, 576]
        if kv_scale is not None:
            keys = keys * kv_scale
        visible = torch.ones(n, L + n, dtype=torch.bool, device=q.device)
        visible[:, L:] = vis_tree[b, :n, :n]
        scores = torch.einsum("thd,sd->ths", q[b, :n].to(cdt), keys) * sm_scale
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None])
        out[b, :n] = torch.einsum("ths,sd->thd", probs, keys[:, :d_lat])
        lse[b, :n] = row_lse
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _load_kv_tile(KV, PageTable, s, page_base, stride_kvp, stride_kvs, max_pages, num_pages,
                  PAGE_SIZE: tl.constexpr, D_LAT: tl.constexpr, D_PE: tl.constexpr, s_ok,
                  SCALAR_PAGE: tl.constexpr = False):
    """Rows ``s`` of a request's paged latent cache: ([BN, 512], [BN, 64]). Page-table columns and
    page ids are clamped into range so a bad layout can never read outside the pool (it is
    reported by the launcher's checks instead). ``SCALAR_PAGE``: the tile lies in one page (tiles
    start at multiples of BLOCK_N <= P), so one page id is read instead of one per row."""
    if SCALAR_PAGE:
        first = tl.min(s, 0)
        col = tl.minimum(first // PAGE_SIZE, max_pages - 1)
        page = tl.load(PageTable + page_base + col)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        tok = page * stride_kvp + (s % PAGE_SIZE).to(tl.int64) * stride_kvs
    else:
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
    SCALAR_PAGE: tl.constexpr,
    TMA: tl.constexpr = False,
    HOIST_PAGES: tl.constexpr = False,
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
    kv_len = tl.load(KvLens + b)
    tree_len = tl.load(TreeLens + b)
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

    # HOIST_PAGES (P >= BLOCK_N, one page per tile): chunks start on page boundaries, so the tiles
    # of a group of PAGE_GROUP pages take their page ids from one vector load before the group.
    if HOIST_PAGES:
        chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), PAGE_SIZE) * PAGE_SIZE
    else:
        chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), BLOCK_N) * BLOCK_N
    start = pid_s * chunk
    end = tl.minimum(start + chunk, n_keys)
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
    if HOIST_PAGES:
        for g in range(start, full_end, PAGE_GROUP * PAGE_SIZE):
            pages = page_group(PageTable, page_base, g, max_pages, num_pages, PAGE_SIZE, PAGE_GROUP)
            for n in range(g, tl.minimum(g + PAGE_GROUP * PAGE_SIZE, full_end), BLOCK_N):
                page = page_of(pages, g, n, PAGE_SIZE, PAGE_GROUP)
                if TMA:  # full tiles only: TMA reads whole rows, and rows past a request may hold NaN
                    row = page * PAGE_SIZE + n % PAGE_SIZE
                    k_lat = lat_desc.load([row, 0])
                    k_pe = pe_desc.load([row, 0])
                else:
                    tok = page.to(tl.int64) * stride_kvp + ((n % PAGE_SIZE) + offs_n).to(tl.int64) * stride_kvs
                    k_lat = tl.load(KV + tok[:, None] + tl.arange(0, D_LAT)[None, :])
                    k_pe = tl.load(KV + tok[:, None] + D_LAT + tl.arange(0, D_PE)[None, :])
                m_i, l_i, acc = _qk_pv_step(q_lat, q_pe, k_lat, k_pe, all_rows, m_i, l_i, acc, sm_scale_log2e,
                                            False, UPCAST, IEEE, SPLIT_SCORES)
    else:
        for n in range(start, full_end, BLOCK_N):
            s = n + offs_n
            k_lat, k_pe = _load_kv_tile(KV, PageTable, s, page_base, stride_kvp, stride_kvs, max_pages, num_pages,
                                        PAGE_SIZE, D_LAT, D_PE, s < full_end, SCALAR_PAGE)
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
                                    PAGE_SIZE, D_LAT, D_PE, s_ok, SCALAR_PAGE)
        m_i, l_i, acc = _qk_pv_step(q_lat, q_pe, k_lat, k_pe, visible, m_i, l_i, acc, sm_scale_log2e,
                                    True, UPCAST, IEEE, SPLIT_SCORES)

    if V_SCALED:  # fp8 pools: the values' per-tensor scale (the keys' is in sm_scale_log2e)
        acc = acc * v_scale
    store_rows(Out, Lse, acc, m_i, l_i, row_ok, rows < T * H, b, pid_s, t, h, rows,
               stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
               SINGLE_SPLIT, D_LAT)


# --------------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------------

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_ALLOCATOR_SET = False


def _scratch_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_usable(kv: torch.Tensor, cfg: AttnConfig) -> bool:
    """TMA tiles need P >= BLOCK_N (a tile within one page), the pool addressable as one
    ``[pages * P, D]`` row-major matrix with 16-byte aligned rows, and row indices within int32.
    (Alignment from the storage offset: torch's allocations start 256-byte aligned, and fake
    tensors under torch.compile have no data pointer.)"""
    num_pages, P, D = kv.shape
    return (cfg.tma and P >= cfg.block_n and kv.stride(2) == 1 and kv.stride(0) == P * kv.stride(1)
            and (kv.stride(1) * kv.element_size()) % 16 == 0 and (kv.storage_offset() * kv.element_size()) % 16 == 0
            and num_pages * P < 2**31 and (kv.is_cuda or _interpreting()))


def _ensure_scratch_allocator() -> None:
    # Device-side tensor descriptors live in a small global scratch buffer that Triton asks for at
    # launch; torch's caching allocator serves it (also during CUDA-graph capture).
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(_scratch_allocator)
        _ALLOCATOR_SET = True


GLUON_KERNELS = ("gluon", "gluon-overlap", "gluon-seesaw", "gluon-ws", "gluon-ws-noprefetch")


def _gluon_usable(q, kv, cfg: AttnConfig) -> bool:
    """The Gluon kernels serve bf16 Kimi-shaped (512 + 64) calls on Hopper: P % 64 == 0 pools by TMA
    (the pool addressable as one matrix), smaller pages by row gathers (16-byte aligned rows);
    anything else (fp8 pools included) takes the Triton kernel."""
    if (cfg.kernel not in GLUON_KERNELS or not q.is_cuda or q.dtype != torch.bfloat16 or kv.dtype != q.dtype
            or q.shape[-1] != D_QK):
        return False
    from . import _verify_gluon
    P = kv.shape[1]
    if P % 64 == 0:
        layout_ok = _tma_usable(kv, AttnConfig(64, 64, 8, 1, tma=True))
    else:
        layout_ok = (kv.stride(2) == 1 and (kv.stride(0) * 2) % 16 == 0 and (kv.stride(1) * 2) % 16 == 0
                     and (kv.storage_offset() * 2) % 16 == 0)
    # Q rows arrive by 16-byte cp.async copies.
    q_ok = q.stride(3) == 1 and all((q.stride(i) * 2) % 16 == 0 for i in range(3)) and q.data_ptr() % 16 == 0
    return (_verify_gluon.GLUON_AVAILABLE and layout_ok and q_ok
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def _launch_verify(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, cfg: AttnConfig,
                   num_splits, launch=None, kv_scale: float = 1.0):
    B, T, H, _ = q.shape
    if launch is None and _gluon_usable(q, kv, cfg):  # eager only: the Gluon ops are opaque to torch.compile
        from ._verify_gluon_ws import launch_verify_gluon_ws, partials_narrow_for

        narrow = partials_narrow_for(cfg.kernel, kv.shape[1])
        dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H, narrow)
        args = (q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, o_strides, l_strides, sm_scale,
                num_splits)
        if cfg.kernel.startswith("gluon-ws"):  # TMA tiles, or row gathers by its producer on pages below a tile
            launch_verify_gluon_ws(*args, l2_prefetch=cfg.kernel != "gluon-ws-noprefetch")
        else:
            from ._verify_gluon import launch_verify_gluon
            launch_verify_gluon(*args, overlap=cfg.kernel == "gluon-overlap",
                                **({"seesaw": True} if cfg.kernel == "gluon-seesaw" else {}))
        if num_splits > 1:
            combine_splits(dst_o, dst_l, out, lse)
        return
    tma = _tma_usable(kv, cfg)
    scalar = cfg.scalar_page and kv.shape[1] >= cfg.block_n
    if tma and not _interpreting():
        _ensure_scratch_allocator()
    M = T * H
    d_lat = out.shape[-1]
    row_blocks = triton.cdiv(M, cfg.block_m)
    upcast = _interpreting() and q.dtype == torch.bfloat16
    kernel = _verify_mla_kernel if launch is None else launch(_verify_mla_kernel)
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, M)
    kernel[(row_blocks, num_splits, B)](
        q, kv, page_table, kv_lens, tree_mask, tree_lens,
        dst_o, dst_l,
        sm_scale * kv_scale * LOG2E, kv_scale,
        q.stride(0), q.stride(1), q.stride(2),
        kv.stride(0), kv.stride(1),
        page_table.stride(0), page_table.shape[1], kv.shape[0],
        tree_mask.stride(0), tree_mask.stride(1),
        *o_strides,
        *l_strides,
        T, H, num_splits,
        PAGE_SIZE=kv.shape[1], SINGLE_SPLIT=num_splits == 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        UPCAST=upcast, IEEE=q.dtype == torch.float32,
        SCALAR_PAGE=scalar, TMA=tma, HOIST_PAGES=tma or (cfg.hoist_pages and scalar), PAGE_GROUP=16,
        # The tail is one or two tiles: with split scores its copy buffers would not fit next to the
        # prefix loop's, so it runs unpipelined there (elsewhere as the kernel's loops).
        SPLIT_SCORES=cfg.split_scores, TAIL_STAGES=1 if cfg.split_scores else cfg.num_stages, D_LAT=d_lat, D_PE=q.shape[-1] - d_lat,
        V_SCALED=kv.dtype != q.dtype,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse, launch=launch)


@torch.library.triton_op("tritree::verify_mla", mutates_args=())
def _verify_mla_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                   tree_mask: torch.Tensor, tree_lens: torch.Tensor, sm_scale: float, block_m: int, block_n: int,
                   num_warps: int, num_stages: int, scalar_page: bool, num_splits: int,
                   d_rope: int = 64, tma: bool = False, hoist_pages: bool = False,
                   split_scores: bool = False, kv_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, D = q.shape
    out = torch.empty(B, T, H, D - d_rope, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    _launch_verify(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale,
                   AttnConfig.concrete(block_m, block_n, num_warps, num_stages, scalar_page=scalar_page, tma=tma,
                                       hoist_pages=hoist_pages, split_scores=split_scores),
                   int(num_splits),
                   launch=torch.library.wrap_triton, kv_scale=kv_scale)
    return out, lse


@torch.library.triton_op("tritree::verify_mla_out", mutates_args=("out", "lse"))
def _verify_mla_out_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                       tree_mask: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       sm_scale: float, block_m: int, block_n: int, num_warps: int, num_stages: int,
                       scalar_page: bool, num_splits: int, tma: bool = False, hoist_pages: bool = False,
                       split_scores: bool = False, kv_scale: float = 1.0) -> None:
    _launch_verify(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale,
                   AttnConfig.concrete(block_m, block_n, num_warps, num_stages, scalar_page=scalar_page, tma=tma,
                                       hoist_pages=hoist_pages, split_scores=split_scores),
                   int(num_splits),
                   launch=torch.library.wrap_triton, kv_scale=kv_scale)


@torch.library.custom_op("tritree::verify_mla_gluon", mutates_args=("out", "lse"))
def _verify_mla_gluon_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                         tree_mask: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                         sm_scale: float, block_m: int, block_n: int, num_warps: int, num_stages: int,
                         scalar_page: bool, num_splits: int, tma: bool, hoist_pages: bool, split_scores: bool,
                         kernel: str) -> None:
    """Configs with a Gluon ``kernel``: an opaque op (torch.compile cannot trace Gluon launches),
    writing ``out``/``lse`` in place; falls back to the Triton kernel where Gluon cannot serve."""
    _launch_verify(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale,
                   AttnConfig(block_m, block_n, num_warps, num_stages, scalar_page=scalar_page, tma=tma,
                              hoist_pages=hoist_pages, split_scores=split_scores, kernel=kernel),
                   num_splits)


@_verify_mla_gluon_op.register_fake
def _(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, block_m, block_n, num_warps, num_stages,
      scalar_page, num_splits, tma, hoist_pages, split_scores, kernel):
    return None


KV_FP8 = torch.float8_e4m3fn


def _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope=D_ROPE, kv_scale=None):
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    dev = q.device
    B, T, H, D = q.shape
    d_lat = D - d_rope
    if d_lat < 16 or d_rope < 16 or d_lat & (d_lat - 1) or d_rope & (d_rope - 1):
        raise ValueError(f"q must have shape [B, T, H, latent + d_rope] with both powers of two >= 16 "
                         f"(Kimi: 512 + 64 = {D_QK}); got {tuple(q.shape)} with d_rope = {d_rope}")
    if T < 1 or H < 1:
        raise ValueError(f"q must have T >= 1 tree tokens and H >= 1 heads, got shape {tuple(q.shape)}")
    V.check_tensor("kv", kv, ndim=3, dtypes=V.ATTN_DTYPES + (KV_FP8,), device=dev)
    if kv.dtype != q.dtype and kv.dtype != KV_FP8:
        raise TypeError(f"kv must have the dtype of q ({q.dtype}) or be a float8_e4m3fn pool, got {kv.dtype}")
    if kv_scale is not None:
        if kv.dtype != KV_FP8:
            raise ValueError(f"kv_scale is the dequantisation scale of a float8_e4m3fn pool; kv is {kv.dtype}")
        if not isinstance(kv_scale, (int, float)) or not math.isfinite(kv_scale) or kv_scale <= 0:
            raise ValueError(f"kv_scale must be a positive finite float, got {kv_scale!r}")
    if kv.dtype == KV_FP8 and kv.is_cuda and torch.cuda.get_device_capability(kv.device) < (8, 9):
        raise TypeError("float8_e4m3fn pools need a GPU of compute capability 8.9 or newer (Ada, Hopper, "
                        f"Blackwell); this one is {torch.cuda.get_device_capability(kv.device)}")
    num_pages, P, Dk = kv.shape
    if Dk != D:
        raise ValueError(f"kv must have shape [num_pages, P, {D}] (the last dim of q), got {tuple(kv.shape)}")
    if P < 1 or P > 128 or P & (P - 1):
        raise ValueError(f"kv page size P = kv.shape[1] must be a power of two in [1, 128], got {P}")
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    if page_table.shape[0] != B:
        raise ValueError(f"page_table must have shape [B, max_pages] with B = {B}, got {tuple(page_table.shape)}")
    if page_table.shape[1] * P < T:
        raise ValueError(f"page_table capacity {page_table.shape[1]} pages x {P} = {page_table.shape[1] * P} "
                         f"tokens cannot hold T = {T} tree tokens")
    V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("kv_lens", kv_lens, (B,), "[B]")
    W = (T + 31) // 32
    V.check_tensor("tree_mask", tree_mask, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_shape("tree_mask", tree_mask, (B, T, W), "[B, T, ceil(T/32)]")
    if tree_lens is not None:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
        V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
        raise ValueError(f"sm_scale must be a positive finite float, got {sm_scale!r}")
    if V.values_checkable(kv_lens, page_table):
        tl_ = torch.full((B,), T) if tree_lens is None else tree_lens
        if tree_lens is not None:
            tc = tree_lens.detach().cpu()
            if ((tc < 0) | (tc > T)).any():
                raise ValueError(f"tree_lens must be in [0, T = {T}], got {tc.tolist()}")
        V.check_paged_lengths(page_table, num_pages, P, kv_lens, tl_)


_FULL_TREE_LENS: dict = {}


def _narrow_num_splits(cfg: AttnConfig, rows: int, split_args: dict) -> int | None:
    """The split count for a launch of the warp-specialised Gluon kernel whose last row block runs narrow
    (``_verify_gluon_ws.narrow_rows``): the full blocks share the SMs the narrow block leaves. ``None``
    where that does not apply. Pure Python on static shapes (traced by torch.compile)."""
    if not cfg.kernel.startswith("gluon-ws"):
        return None
    from ._verify_gluon_ws import choose_narrow_num_splits, narrow_rows

    return choose_narrow_num_splits(**split_args) if narrow_rows(rows) else None


def _full_tree_lens(B: int, T: int, device: torch.device) -> torch.Tensor:
    """``[B]`` int32 of T's (``tree_lens=None``), cached per (device, B, T) so that eager calls, and
    graphs captured after one, launch no fill kernel (a graph node of its own, ~1 us). Read-only. Under
    torch.compile, or first met inside a capture (where the fill runs only at replay), a fresh fill."""
    if torch.compiler.is_compiling():
        return torch.full((B,), T, dtype=torch.int32, device=device)
    key = (device, B, T)
    t = _FULL_TREE_LENS.get(key)
    if t is None:
        t = torch.full((B,), T, dtype=torch.int32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return t
        _FULL_TREE_LENS[key] = t  # never evicted: captured graphs may hold its address
    return t


def verify_mla(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, return_lse=False,
               out=None, lse=None, config: AttnConfig | None = None, num_splits: int | None = None,
               d_rope: int = D_ROPE, kv_scale: float | None = None):
    """Tree-masked MLA verify attention over a paged latent KV cache (absorbed form, one KV head).

    Args:
        q: ``[B, T, H, 576]`` absorbed queries (512 latent ++ 64 rope), bf16 / fp16 / fp32.
        kv: ``[num_pages, P, 576]`` one layer's latent pool, q's dtype or ``torch.float8_e4m3fn`` (with
            ``kv_scale``); P a power of two in [1, 128].
        page_table: ``[B, max_pages]`` int32; position s of request b is ``kv[page_table[b, s // P], s % P]``.
        kv_lens: ``[B]`` int32 committed tokens before the tree. The tree's own KV is already written
            at positions ``kv_lens[b] + i``, i = 0..T-1, in node order.
        tree_mask: ``[B, T, ceil(T/32)]`` int32 ancestor bits (:func:`tree_mask_from_parents`).
        sm_scale: softmax scale (Kimi K2.x: ``192**-0.5 * mscale**2``, not ``576**-0.5``).
        tree_lens: ``[B]`` int32 valid nodes per request; rows ``i >= tree_lens[b]`` are padding.
        return_lse: also return ``lse: [B, T, H]`` float32 natural-log log-sum-exp of the scores.
        out, lse: optional preallocated outputs (``[B, T, H, 512]`` q's dtype, ``[B, T, H]`` float32),
            written in place (static buffers for CUDA graphs); both or neither.
        config, num_splits: override the per-architecture launch config and the split count. On
            Hopper with bf16 the table's configs run the Gluon kernels (``kernels/_verify_gluon.py``
            and its warp-specialised form ``kernels/_verify_gluon_ws.py``; TMA tiles for P % 64 == 0,
            row gathers for smaller pages); ``AttnConfig(..., kernel="triton")`` forces Triton.
        d_rope: rope channels at the end of q and kv (Kimi: 64, latent 512); small models use other
            powers of two >= 16.
        kv_scale: for a ``float8_e4m3fn`` pool, its per-tensor dequantisation scale (keys and values
            are ``kv * kv_scale``; default 1.0); must be None for other pools. fp8 pools run the
            Triton kernel (tiles converted to q's dtype in registers; the scale folded into the score
            scale and applied to O once), also on Hopper. Rows enter such a pool quantised with the
            same scale: ``kv_write_(kv, ..., (latent / kv_scale).to(torch.float8_e4m3fn))``.

    Returns:
        ``out: [B, T, H, 512]`` in q's dtype (and ``lse``). Row (b, i, h) attends to all ``kv_lens[b]``
        committed tokens and to tree nodes ``j < tree_lens[b]`` whose bit is set in
        ``tree_mask[b, i]``; softmax in fp32. Padding rows are zeros (lse ``-inf``).

    Checks: shapes, dtypes, devices and strides always; lengths against the page table's capacity and
    page ids in use against the pool when the inputs are on the CPU or ``TRITREE_DEBUG=1`` (these need
    the values on the host). Without them, out-of-range page ids are clamped into the pool in the kernel
    (no fault, wrong rows). CUDA-graph capturable; traced by torch.compile as ``tritree::verify_mla``.
    """
    _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope, kv_scale)
    if kv.dtype == KV_FP8 and kv_scale is None:
        kv_scale = 1.0
    B, T, H, D = q.shape
    d_lat = D - d_rope
    if (out is None) != (lse is None):
        raise ValueError("out and lse must be given together (or neither)")
    if out is not None:
        V.check_tensor("out", out, ndim=4, dtypes=(q.dtype,), device=q.device)
        V.check_shape("out", out, (B, T, H, d_lat), "[B, T, H, latent]")
        V.check_tensor("lse", lse, ndim=3, dtypes=(torch.float32,), device=q.device, last_contiguous=False)
        V.check_shape("lse", lse, (B, T, H), "[B, T, H]")
    if q.device.type == "cpu" and not _interpreting():
        ref_out, ref_lse = verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, sm_scale=sm_scale,
                                                tree_lens=tree_lens, return_lse=True, d_rope=d_rope,
                                                kv_scale=kv_scale)
        if out is None:
            out, lse = ref_out.to(q.dtype), ref_lse.to(torch.float32)
        else:
            out.copy_(ref_out)
            lse.copy_(ref_lse)
        return (out, lse) if return_lse else out
    if tree_lens is None:
        tree_lens = _full_tree_lens(B, T, q.device)
    cfg = config or lookup(VERIFY_MLA_CONFIGS, arch_of(q.device), T * H, page_size=kv.shape[1],
                               kv_fp8=kv.dtype == KV_FP8)
    if num_splits is None:
        split_args = dict(batch=B, row_blocks=triton.cdiv(T * H, cfg.block_m),
                          max_keys=page_table.shape[1] * kv.shape[1], block_n=cfg.block_n, sms=num_sms(q.device))
        # Static properties only (torch.compile traces this; _gluon_usable reads storage offsets).
        if q.device.type == "cuda" and q.dtype == kv.dtype == torch.bfloat16 and kv_scale is None:
            num_splits = _narrow_num_splits(cfg, T * H, split_args)
        if num_splits is None:
            num_splits = choose_num_splits(**split_args, programs_per_sm=cfg.programs_per_sm, whole_waves=True)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    launch_args = (float(sm_scale), cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, bool(cfg.scalar_page),
                   int(num_splits))
    if cfg.kernel not in ("triton",) + GLUON_KERNELS:
        raise ValueError(f"config.kernel must be 'triton' or one of {GLUON_KERNELS}, got {cfg.kernel!r}")
    fp8 = {} if kv_scale is None else {"kv_scale": float(kv_scale)}
    if cfg.kernel != "triton" and not fp8:  # fp8 pools: the Triton kernel with the config's tiles
        if out is None:
            out = torch.empty(B, T, H, d_lat, dtype=q.dtype, device=q.device)
            lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        _verify_mla_gluon_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, *launch_args,
                             bool(cfg.tma), bool(cfg.hoist_pages), bool(cfg.split_scores), cfg.kernel)
        return (out, lse) if return_lse else out
    if out is None:
        out, lse = _verify_mla_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, *launch_args, d_rope=d_rope,
                                  tma=bool(cfg.tma), hoist_pages=bool(cfg.hoist_pages),
                                  split_scores=bool(cfg.split_scores), **fp8)
    else:
        _verify_mla_out_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, *launch_args, tma=bool(cfg.tma),
                           hoist_pages=bool(cfg.hoist_pages), split_scores=bool(cfg.split_scores), **fp8)
    return (out, lse) if return_lse else out
