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
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _validate as V
from . import _verify_gluon_launch as GL
from ._launch import (
    KernelLauncher,
    PlanCache,
    StreamScratch,
    eager,
    full_lengths,
    interpreting,
    rebased,
    scalars,
    signature,
    uses_kernel,
)
from ._splitkv import (
    LOG2E,
    MergePlan,
    attend_tile,
    balanced_num_splits,
    choose_num_splits,
    combine_splits,
    page_group,
    page_of,
    pdl_capable,
    split_chunk,
    split_destinations,
    store_rows,
)
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


# --------------------------------------------------------------------------------------------------
# Launch policy: which kernel a call runs, with which tiles and splits, and why
# --------------------------------------------------------------------------------------------------

KV_FP8 = torch.float8_e4m3fn
GLUON_KERNELS = ("gluon", "gluon-ws", "gluon-mma")


class VerifyLaunch(NamedTuple):
    """What every :func:`verify_mla` call of one static signature runs (:func:`plan_launch`)."""

    route: str                        # "reference" (CPU), "triton", "gluon" (plain Hopper schedule), "gluon-ws"
    config: AttnConfig
    num_splits: int
    partials_dtype: torch.dtype       # dtype of the split partials (unused with one split)
    tma: bool                         # Triton route: KV tiles by tensor descriptors


def plan_launch(*, device: torch.device, q_dtype, kv_dtype, batch: int, T: int, H: int, head_dim: int,
                page_size: int, max_pages: int, gluon_layout: bool, tma_layout: bool,
                config: AttnConfig | None = None, num_splits: int | None = None,
                gather_layout: bool | None = None) -> VerifyLaunch:
    """The launch policy of :func:`verify_mla`, from static facts only (torch.compile traces it).

    1. CPU tensors outside Triton's interpreter: the float reference.
    2. The config: ``config`` or the architecture's table (``configs.VERIFY_MLA_CONFIGS``) by packed rows
       ``M = T * H``: on Hopper the plain Gluon schedule up to 64 rows and the warp-specialised one above,
       the fp8 and small-page tables where they apply; on sm_120 the Gluon ``mma.sync`` kernel
       (``"gluon-mma"``) for every shape and page size, bf16 and fp8 pools; Triton tiles on sm_80.
    3. A Gluon config runs its Gluon kernel where that kernel serves the call: bf16 q and pool (the
       ``mma.sync`` kernel: also fp8 pools), 576 channels, Gluon importable, a GPU the kernel runs on (the
       Hopper kernels: sm_90; ``"gluon-mma"``: sm_120, and sm_90 with the same instructions), q rows and pool
       rows 16-byte aligned (``gluon_layout``: pools of P % 64 == 0 as one matrix for the Hopper kernels' TMA
       tiles; ``gather_layout``, default ``gluon_layout``: rows alone, for the row gathers of ``"gluon-mma"``).
       Anything else (fp8 pools elsewhere, fp16 / fp32, other GPUs, unaligned views) runs the Triton kernel
       with the config's tiles, by tensor descriptors where the pool is one contiguous matrix (``tma_layout``).
    4. Splits: enough (row block, split) programs for one wave of the SMs in whole waves (one resident
       program an SM), no chunk shorter than 4 tiles of the page table's capacity. The ``mma.sync`` kernel's
       32-row blocks fill waves less evenly: its count balances waves against chunk length
       (``_splitkv.balanced_num_splits``). Warp-specialised launches whose last row block holds at most 16
       real rows run that block narrow; it counts as 0.75 of a block, so the full blocks get the SMs it
       leaves (``_verify_gluon_launch.choose_narrow_num_splits``).
    5. Split partials in q's dtype where the Gluon kernel stages and stores them 16-bit (half the bytes
       the split programs write and the merge reads); fp32 otherwise.
    """
    M = T * H
    if not uses_kernel(device):
        cfg = config or AttnConfig(32, 32, 4, 1)
        return VerifyLaunch("reference", cfg, 1, torch.float32, False)
    kv_fp8 = kv_dtype == KV_FP8
    cfg = config or lookup(VERIFY_MLA_CONFIGS, arch_of(device), M, page_size=page_size, kv_fp8=kv_fp8)
    if cfg.kernel not in ("triton",) + GLUON_KERNELS:
        raise ValueError(f"config.kernel must be 'triton' or one of {GLUON_KERNELS}, got {cfg.kernel!r}")
    bf16 = q_dtype == kv_dtype == torch.bfloat16
    if cfg.kernel == "gluon-mma":  # the mma.sync kernel also reads fp8 pools
        bf16 = q_dtype == torch.bfloat16 and kv_dtype in (torch.bfloat16, KV_FP8)
    layout_ok = gather_layout if cfg.kernel == "gluon-mma" and gather_layout is not None else gluon_layout
    gluon = (cfg.kernel != "triton" and bf16 and head_dim == D_QK and device.type == "cuda" and layout_ok
             and GL.GLUON_AVAILABLE and GL.runs_on(cfg.kernel, torch.cuda.get_device_capability(device)[0]))
    if num_splits is None:
        split_args = dict(batch=batch, row_blocks=triton.cdiv(M, cfg.block_m), max_keys=max_pages * page_size,
                          block_n=cfg.block_n, sms=num_sms(device))
        if device.type == "cuda" and bf16:
            num_splits = _narrow_num_splits(cfg, M, split_args)
        if num_splits is None and gluon and cfg.kernel == "gluon-mma":
            num_splits = balanced_num_splits(**split_args)
        if num_splits is None:
            num_splits = choose_num_splits(**split_args, programs_per_sm=cfg.programs_per_sm, whole_waves=True)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    route = cfg.kernel if gluon else "triton"
    narrow = gluon and bool(GL.partials_narrow_for(cfg.kernel, page_size))
    partials = q_dtype if narrow and q_dtype in (torch.bfloat16, torch.float16) else torch.float32
    return VerifyLaunch(route, cfg, int(num_splits), partials, tma_layout and cfg.tma and page_size >= cfg.block_n)


def _narrow_num_splits(cfg: AttnConfig, rows: int, split_args: dict) -> int | None:
    """The split count for a launch of the warp-specialised Gluon kernel whose last row block runs narrow
    (``_verify_gluon_launch.narrow_rows``): the full blocks share the SMs the narrow block leaves. ``None``
    where that does not apply. Pure Python on static shapes (traced by torch.compile)."""
    if cfg.kernel != "gluon-ws":
        return None
    return GL.choose_narrow_num_splits(**split_args) if GL.narrow_rows(rows) else None


def _tma_layout(kv: torch.Tensor) -> bool:
    """The pool addressable as one ``[pages * P, D]`` row-major matrix with 16-byte aligned rows and int32 row
    indices (what KV tiles by tensor descriptors need; the storage offset stands for the alignment: torch's
    allocations start 256-byte aligned, and fake tensors under torch.compile have no data pointer)."""
    num_pages, P, D = kv.shape
    return (kv.stride(2) == 1 and kv.stride(0) == P * kv.stride(1) and (kv.stride(1) * kv.element_size()) % 16 == 0
            and (kv.storage_offset() * kv.element_size()) % 16 == 0 and num_pages * P < 2**31
            and uses_kernel(kv.device))


def _gluon_layout(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """The Hopper Gluon kernels' layout needs: pools of P % 64 == 0 as one matrix (TMA tiles), smaller pages by
    row gathers (16-byte aligned rows); q rows by 16-byte copies."""
    kv_ok = _tma_layout(kv) if kv.shape[1] % 64 == 0 else _rows_aligned(kv)
    return kv_ok and _q_rows_aligned(q)


def _gather_layout(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """The row-gathering Gluon kernel's layout needs (``"gluon-mma"``): 16-byte aligned pool and q rows."""
    return _rows_aligned(kv) and _q_rows_aligned(q)


def _rows_aligned(kv: torch.Tensor) -> bool:
    e = kv.element_size()
    return (kv.stride(2) == 1 and (kv.stride(0) * e) % 16 == 0 and (kv.stride(1) * e) % 16 == 0
            and (kv.storage_offset() * e) % 16 == 0)


def _q_rows_aligned(q: torch.Tensor) -> bool:
    return (q.stride(3) == 1 and all((q.stride(i) * 2) % 16 == 0 for i in range(3))
            and (q.storage_offset() * q.element_size()) % 16 == 0)


def _launch_of(q, kv, page_table, config, num_splits, traced: bool = False) -> VerifyLaunch:
    """:func:`plan_launch` for these inputs. ``traced`` (torch.compile): without the layout facts, which read
    storage offsets (the opaque Gluon op and the traced Triton launch read them themselves)."""
    B, T, H, D = q.shape
    return plan_launch(device=q.device, q_dtype=q.dtype, kv_dtype=kv.dtype, batch=B, T=T, H=H, head_dim=D,
                       page_size=kv.shape[1], max_pages=page_table.shape[1],
                       gluon_layout=not traced and _gluon_layout(q, kv), tma_layout=not traced and _tma_layout(kv),
                       config=config, num_splits=num_splits, gather_layout=not traced and _gather_layout(q, kv))


# --------------------------------------------------------------------------------------------------
# Triton kernel launch (shared by the eager plan and the traced op)
# --------------------------------------------------------------------------------------------------

_ALLOCATOR_SET = False


def _scratch_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_scratch_allocator() -> None:
    # Device-side tensor descriptors live in a small global scratch buffer that Triton asks for at
    # launch; torch's caching allocator serves it (also during CUDA-graph capture).
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(_scratch_allocator)
        _ALLOCATOR_SET = True


def _triton_launch(launch: VerifyLaunch, B, T, H, d_lat, d_pe, q_dtype, kv_dtype, page_size):
    """``(grid, constexprs, options)`` of the Triton kernel for a launch."""
    cfg = launch.config
    if launch.tma and not interpreting():
        _ensure_scratch_allocator()
    grid = (triton.cdiv(T * H, cfg.block_m), launch.num_splits, B)
    constexprs = dict(
        PAGE_SIZE=page_size, SINGLE_SPLIT=launch.num_splits == 1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        UPCAST=interpreting() and q_dtype == torch.bfloat16, IEEE=q_dtype == torch.float32, TMA=launch.tma,
        PAGE_GROUP=16, SPLIT_SCORES=cfg.split_scores,
        # The tail is one or two tiles: with split scores its copy buffers would not fit next to the
        # prefix loop's, so it runs unpipelined there (elsewhere as the kernel's loops).
        TAIL_STAGES=1 if cfg.split_scores else cfg.num_stages, D_LAT=d_lat, D_PE=d_pe, V_SCALED=kv_dtype != q_dtype)
    return grid, constexprs, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _triton_int_args(q, kv, page_table, tree_mask, o_strides, l_strides, sm_scale, kv_scale, num_splits):
    """The Triton kernel's arguments after its eight tensors (static for a plan)."""
    B, T, H, _ = q.shape
    return (sm_scale * kv_scale * LOG2E, kv_scale, q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(1),
            page_table.stride(0), page_table.shape[1], kv.shape[0], tree_mask.stride(0), tree_mask.stride(1),
            *o_strides, *l_strides, T, H, num_splits)


def _launch_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, cfg: AttnConfig,
                   num_splits, kv_scale: float = 1.0, launch=torch.library.wrap_triton) -> None:
    """The Triton kernel and merge through ``launch`` (``wrap_triton``: what torch.compile traces)."""
    B, T, H, D = q.shape
    d_lat = out.shape[-1]
    plan = VerifyLaunch("triton", cfg, num_splits, torch.float32, _tma_layout(kv) and cfg.tma
                        and kv.shape[1] >= cfg.block_n)
    grid, constexprs, options = _triton_launch(plan, B, T, H, d_lat, D - d_lat, q.dtype, kv.dtype, kv.shape[1])
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, T * H)
    launch(_verify_mla_kernel)[grid](
        q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l,
        *_triton_int_args(q, kv, page_table, tree_mask, o_strides, l_strides, sm_scale, kv_scale, num_splits),
        **constexprs, **options)
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse, launch=launch)


@torch.library.triton_op("tritree::verify_mla", mutates_args=())
def _verify_mla_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                   tree_mask: torch.Tensor, tree_lens: torch.Tensor, sm_scale: float, block_m: int, block_n: int,
                   num_warps: int, num_stages: int, num_splits: int, d_rope: int = 64, tma: bool = False,
                   split_scores: bool = False, kv_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, D = q.shape
    out = torch.empty(B, T, H, D - d_rope, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    _launch_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale,
                   AttnConfig.concrete(block_m, block_n, num_warps, num_stages, tma=tma, split_scores=split_scores),
                   int(num_splits), kv_scale=kv_scale)
    return out, lse


@torch.library.triton_op("tritree::verify_mla_out", mutates_args=("out", "lse"))
def _verify_mla_out_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                       tree_mask: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       sm_scale: float, block_m: int, block_n: int, num_warps: int, num_stages: int,
                       num_splits: int, tma: bool = False, split_scores: bool = False, kv_scale: float = 1.0) -> None:
    _launch_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale,
                   AttnConfig.concrete(block_m, block_n, num_warps, num_stages, tma=tma, split_scores=split_scores),
                   int(num_splits), kv_scale=kv_scale)


@torch.library.custom_op("tritree::verify_mla_gluon", mutates_args=("out", "lse"))
def _verify_mla_gluon_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                         tree_mask: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                         sm_scale: float, block_m: int, block_n: int, num_warps: int, num_stages: int,
                         num_splits: int, tma: bool, split_scores: bool, kernel: str,
                         kv_scale: float = 1.0) -> None:
    """Configs with a Gluon ``kernel`` under torch.compile: an opaque op (torch.compile cannot trace Gluon
    launches) that runs the eager plan, writing ``out``/``lse`` in place. ``kv_scale``: an fp8 pool's."""
    cfg = AttnConfig(block_m, block_n, num_warps, num_stages, tma=tma, split_scores=split_scores, kernel=kernel)
    _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, cfg, num_splits, D_ROPE,
          kv_scale if kv.dtype == KV_FP8 else None).run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out=out,
                                                          lse=lse)


@_verify_mla_gluon_op.register_fake
def _(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, block_m, block_n, num_warps, num_stages,
      num_splits, tma, split_scores, kernel, kv_scale=1.0):
    return None


def _verify_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, return_lse, out, lse, config,
                   num_splits, d_rope, kv_scale):
    """verify_mla under torch.compile: the registered ops (static shapes only; no plan cache)."""
    _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope, kv_scale, out, lse)
    B, T, H, D = q.shape
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    launch = _launch_of(q, kv, page_table, config, num_splits, traced=True)
    cfg = launch.config
    if launch.route == "reference":
        return verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, sm_scale=sm_scale, tree_lens=tree_lens,
                                    return_lse=return_lse, d_rope=d_rope, kv_scale=kv_scale)
    # The Gluon op decides on data pointers inside (its plan); the traced shapes say whether it may serve.
    gluon_dtypes = (q.dtype == kv.dtype == torch.bfloat16 and kv_scale is None) or (
        cfg.kernel == "gluon-mma" and q.dtype == torch.bfloat16 and kv.dtype == KV_FP8)
    if cfg.kernel != "triton" and gluon_dtypes and D == D_QK and q.device.type == "cuda":
        if out is None:
            out = torch.empty(B, T, H, D - d_rope, dtype=q.dtype, device=q.device)
        if lse is None:
            lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        _verify_mla_gluon_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, float(sm_scale),
                             cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, launch.num_splits,
                             bool(cfg.tma), bool(cfg.split_scores), cfg.kernel,
                             1.0 if kv_scale is None else float(kv_scale))
        return (out, lse) if return_lse else out
    fp8 = {} if kv_scale is None else {"kv_scale": float(kv_scale)}
    args = (float(sm_scale), cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, launch.num_splits)
    if out is None and lse is None:
        out, lse = _verify_mla_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, *args, d_rope=d_rope,
                                  tma=bool(cfg.tma), split_scores=bool(cfg.split_scores), **fp8)
    else:
        if out is None:
            out = torch.empty(B, T, H, D - d_rope, dtype=q.dtype, device=q.device)
        if lse is None:
            lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        _verify_mla_out_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, *args, tma=bool(cfg.tma),
                           split_scores=bool(cfg.split_scores), **fp8)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope=D_ROPE, kv_scale=None, out=None,
              lse=None):
    """Checks of everything a plan depends on (types, shapes, dtypes, devices, strides, scalars)."""
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    dev = q.device
    B, T, H, D = q.shape
    d_lat = D - d_rope
    if not isinstance(d_rope, int) or d_lat < 16 or d_rope < 16 or d_lat & (d_lat - 1) or d_rope & (d_rope - 1):
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
    V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("kv_lens", kv_lens, (B,), "[B]")
    W = (T + 31) // 32
    V.check_tensor("tree_mask", tree_mask, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_shape("tree_mask", tree_mask, (B, T, W), "[B, T, ceil(T/32)]")
    if page_table.shape[1] * P < T:
        raise ValueError(f"page_table capacity {page_table.shape[1]} pages x {P} = {page_table.shape[1] * P} "
                         f"tokens cannot hold T = {T} tree tokens")
    if tree_lens is not None:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
        V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    V.check_float("sm_scale", sm_scale, lo=0.0, lo_open=True)
    if out is not None:
        V.check_tensor("out", out, ndim=4, dtypes=(q.dtype,), device=dev)
        V.check_shape("out", out, (B, T, H, d_lat), "[B, T, H, latent]")
    if lse is not None:
        V.check_tensor("lse", lse, ndim=3, dtypes=(torch.float32,), device=dev, last_contiguous=False)
        V.check_shape("lse", lse, (B, T, H), "[B, T, H]")


def _check_values(kv, page_table, kv_lens, tree_lens, T: int) -> None:
    """Checks that read lengths and page ids on the host (CPU inputs, or ``TRITREE_DEBUG=1``)."""
    B = kv_lens.shape[0]
    if tree_lens is not None:
        tc = tree_lens.detach().cpu()
        if ((tc < 0) | (tc > T)).any():
            raise ValueError(f"tree_lens must be in [0, T = {T}], got {tc.tolist()}")
    V.check_paged_lengths(page_table, kv.shape[0], kv.shape[1], kv_lens,
                          torch.full((B,), T) if tree_lens is None else tree_lens)


# --------------------------------------------------------------------------------------------------
# The plan: decided once per static signature, launched directly
# --------------------------------------------------------------------------------------------------

class VerifyPlan:
    """:func:`verify_mla` for one static signature: validated, its launch decided, its kernels bound.

    ``VerifyPlan(q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, sm_scale, out=None, lse=None,
    config=None, num_splits=None, d_rope=64, kv_scale=None)`` takes example inputs (their values are not
    read); ``plan.run(q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, out=None, lse=None,
    return_lse=False)`` then runs inputs of the same shapes, strides, dtypes and device (a ``ValueError``
    otherwise) with the per-call work only: value checks where they apply, buffers, launches.
    ``plan.launch`` says what runs (:func:`plan_launch`). ``out``/``lse`` given at planning fix the layout of
    the outputs ``run`` may be given; without them ``run`` takes contiguous ones.

    Split partials are the plan's own, one set per CUDA stream, reused by eager calls; a call captured in a
    CUDA graph gets its own set, which the graph's memory pool keeps. Calls through one plan on one stream
    are ordered as launched. :func:`verify_mla` keeps plans in a cache (``plan_cache_info()``).
    """

    def __init__(self, q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, sm_scale, out=None, lse=None,
                 config: AttnConfig | None = None, num_splits: int | None = None, d_rope: int = D_ROPE,
                 kv_scale: float | None = None):
        _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope, kv_scale, out, lse)
        B, T, H, D = q.shape
        self.shape = (B, T, H, D)
        self.d_lat, self.d_rope = D - d_rope, d_rope
        self.sm_scale = float(sm_scale)
        self.kv_scale = kv_scale
        self.device = q.device
        self.dtype = q.dtype
        self.launch = _launch_of(q, kv, page_table, config, num_splits)
        self._kv_fp8 = kv.dtype == KV_FP8
        self._has_tree_lens = tree_lens is not None
        out_sig = None if out is None else (out.shape, out.stride())
        lse_sig = None if lse is None else (lse.shape, lse.stride())
        self.signature = _key(q, kv, page_table, kv_lens, tree_mask, tree_lens)
        self._out_sig, self._lse_sig = out_sig, lse_sig
        out_strides = out.stride() if out is not None else _contiguous_strides((B, T, H, self.d_lat))
        lse_strides = lse.stride() if lse is not None else (T * H, H, 1)
        S = self.launch.num_splits
        M = T * H
        self._merge = None
        if S > 1:
            self._merge = MergePlan(B, S, M, self.d_lat, H, self.launch.partials_dtype, out_strides, lse_strides,
                                    q.device)
            o_strides = (S * M * self.d_lat, 0, self.d_lat, M * self.d_lat)
            l_strides = (S * M, 0, 1, M)
        else:
            o_strides = (*out_strides[:3], 0)
            l_strides = (*lse_strides[:3], 0)
        # (split partials: out, lse; the lse when the caller wants none), one set per stream
        self._scratch = StreamScratch(lambda: (
            torch.empty(B, S, M, self.d_lat, dtype=self.launch.partials_dtype, device=q.device) if S > 1 else None,
            torch.empty(B, S, M, dtype=torch.float32, device=q.device) if S > 1 else None,
            torch.empty(B, T, H, dtype=torch.float32, device=q.device)))
        self._o_strides, self._l_strides = o_strides, l_strides
        route = self.launch.route
        if route == "triton":
            kv_scale_f = 1.0 if kv_scale is None else float(kv_scale)
            grid, constexprs, options = _triton_launch(self.launch, B, T, H, self.d_lat, d_rope, q.dtype, kv.dtype,
                                                       kv.shape[1])
            self._grid = grid
            self._split = KernelLauncher(_verify_mla_kernel, constexprs, **options)
            self._int_args = _triton_int_args(q, kv, page_table, tree_mask, o_strides, l_strides, self.sm_scale,
                                              kv_scale_f, S)
        elif route in GLUON_KERNELS:
            self._plan_gluon(q, kv, page_table, tree_mask, o_strides, l_strides)

    def _plan_gluon(self, q, kv, page_table, tree_mask, o_strides, l_strides):
        B, T, H, _ = self.shape
        g = GL.plan_verify_gluon(kernel=self.launch.route, batch=B, T=T, H=H, page_size=kv.shape[1],
                                 num_splits=self.launch.num_splits, num_sms=num_sms(q.device),
                                 pdl_capable=pdl_capable(q.device), partials_dtype=self.launch.partials_dtype)
        self._gluon = g
        self._grid = g.grid
        narrow = (g.narrow_splits,) if g.kernel == "gluon-ws" else ()
        self._int_args = (*GL.scale_args(g.kernel, self.sm_scale, self.kv_scale), q.stride(0), q.stride(1),
                          q.stride(2), kv.stride(0), kv.stride(1), page_table.stride(0), page_table.shape[1],
                          kv.shape[0], tree_mask.stride(0), tree_mask.stride(1), *o_strides, *l_strides, T, H,
                          g.num_splits, *narrow)
        # Descriptor templates: their shapes and strides are the plan's; each call gives them its pool (and
        # partials) as base, which is all a launch reads of a descriptor's tensor.
        example = torch.empty(B, g.num_splits, T * H, self.d_lat, dtype=self.launch.partials_dtype,
                              device=q.device) if g.partials_desc else None
        templates = [rebased(d, None) for d in GL.descriptors_for(g, kv, example)]  # hold no pool
        self._desc_partials = 3 if g.partials_desc else -1
        self._n_desc = len(templates)
        self._split = KernelLauncher(g.fn, dict(g.constexprs), descriptors=dict(enumerate(templates, start=2)),
                                     **g.options())
        self._gluon_ok = False

    # -- per call ------------------------------------------------------------------------------------

    def run(self, q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, out=None, lse=None,
            return_lse: bool = False):
        """Runs the plan on inputs of its signature; see :func:`verify_mla` for the semantics."""
        if _key(q, kv, page_table, kv_lens, tree_mask, tree_lens) != self.signature:
            raise ValueError("the inputs do not match this plan's shapes, strides, dtypes and device "
                             "(or tree_lens given / not given as at planning)")
        if out is not None and (out.shape, out.stride()) != (self._out_sig or (out.shape, _contiguous_strides(
                out.shape))) or out is not None and (out.dtype != self.dtype or out.device != self.device):
            raise ValueError("out must have the layout, dtype and device the plan was made for")
        if lse is not None and ((lse.shape, lse.stride()) != (self._lse_sig or (lse.shape, _contiguous_strides(
                lse.shape))) or lse.dtype != torch.float32 or lse.device != self.device):
            raise ValueError("lse must have the layout, dtype and device the plan was made for")
        return self._run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse)

    def _run(self, q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse):
        B, T, H, _ = self.shape
        if V.checks_values(self.device):
            _check_values(kv, page_table, kv_lens, tree_lens, T)
        if out is None:
            out = torch.empty(B, T, H, self.d_lat, dtype=self.dtype, device=self.device)
        part_o, part_l, lse_scratch = self._scratch.get(self.device)
        if lse is None:
            lse = torch.empty(B, T, H, dtype=torch.float32, device=self.device) if return_lse else lse_scratch
        route = self.launch.route
        if route == "reference":
            ref_out, ref_lse = verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, sm_scale=self.sm_scale,
                                                    tree_lens=tree_lens, return_lse=True, d_rope=self.d_rope,
                                                    kv_scale=self.kv_scale)
            out.copy_(ref_out)
            lse.copy_(ref_lse)
            return (out, lse) if return_lse else out
        if tree_lens is None:
            tree_lens = full_lengths(B, T, self.device)
        S = self.launch.num_splits
        dst_o, dst_l = (part_o, part_l) if S > 1 else (out, lse)
        if route == "triton":
            self._split(self._grid, q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, *self._int_args)
        else:
            self._run_gluon(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l)
        if S > 1:
            self._merge.run(dst_o, dst_l, out, lse)
        return (out, lse) if return_lse else out

    def _run_gluon(self, q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l):
        descs = (kv,) * self._n_desc if self._desc_partials < 0 else (kv, kv, kv, dst_o)  # the templates' bases
        args = (q, kv, *descs, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, *self._int_args)
        if self._gluon_ok or not self._gluon.tma3d:
            self._split(self._grid, *args)
            return
        try:  # the plain kernel's 3-D latent box: a driver may refuse its descriptor
            self._split(self._grid, *args)
        except Exception as e:  # noqa: BLE001
            import warnings

            warnings.warn(f"3-D TMA descriptor refused ({type(e).__name__}: {e}); using 9 boxes per tile")
            GL.USE_TMA3D = False
            self._plan_gluon(q, kv, page_table, tree_mask, self._o_strides, self._l_strides)
            self._run_gluon(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l)
        self._gluon_ok = True


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _key(q, kv, page_table, kv_lens, tree_mask, tree_lens) -> tuple:
    """A plan's static signature of its inputs: their layouts, and q's and the pool's 16-byte alignment
    (the Gluon kernels need it)."""
    return (signature(q, kv, page_table, kv_lens, tree_mask, tree_lens), q.data_ptr() & 15, kv.data_ptr() & 15)


def _plan_build(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
                kv_scale) -> VerifyPlan:
    return VerifyPlan(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale=sm_scale, out=out, lse=lse,
                      config=config, num_splits=num_splits, d_rope=d_rope, kv_scale=kv_scale)


_PLANS = PlanCache("verify_mla", _plan_build)


def _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
          kv_scale) -> VerifyPlan:
    try:
        key = (_key(q, kv, page_table, kv_lens, tree_mask, tree_lens),
               None if out is None else (out.shape, out.stride(), out.dtype, out.device),
               None if lse is None else (lse.shape, lse.stride(), lse.dtype, lse.device),
               scalars(sm_scale, config, num_splits, d_rope, kv_scale))
        return _PLANS.get(key, q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config,
                          num_splits, d_rope, kv_scale)
    except (AttributeError, TypeError):  # not tensors / unhashable scalars: validation says what is wrong
        return _plan_build(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config,
                           num_splits, d_rope, kv_scale)


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
            written in place (static buffers for CUDA graphs); either may be given alone.
        config, num_splits: override the per-architecture launch config and the split count
            (:func:`plan_launch` says what runs otherwise). ``AttnConfig(..., kernel="triton")`` forces Triton.
        d_rope: rope channels at the end of q and kv (Kimi: 64, latent 512); small models use other
            powers of two >= 16.
        kv_scale: for a ``float8_e4m3fn`` pool, its per-tensor dequantisation scale (keys and values
            are ``kv * kv_scale``; default 1.0); must be None for other pools. fp8 pools run the
            Triton kernel (tiles converted to q's dtype in registers; the scale folded into the score
            scale and applied to O once), also on Hopper; on sm_120, with bf16 queries, the Gluon
            ``mma.sync`` kernel (fragments widened to bf16, the scale applied the same way). Rows enter
            such a pool quantised with the same scale:
            ``kv_write_(kv, ..., (latent / kv_scale).to(torch.float8_e4m3fn))``.

    Returns:
        ``out: [B, T, H, 512]`` in q's dtype (and ``lse``). Row (b, i, h) attends to all ``kv_lens[b]``
        committed tokens and to tree nodes ``j < tree_lens[b]`` whose bit is set in
        ``tree_mask[b, i]``; softmax in fp32. Padding rows are zeros (lse ``-inf``).

    Checks: shapes, dtypes, devices and strides always; lengths against the page table's capacity and
    page ids in use against the pool when the inputs are on the CPU or ``TRITREE_DEBUG=1`` (these need
    the values on the host). Without them, out-of-range page ids are clamped into the pool in the kernel
    (no fault, wrong rows). Eager calls run a :class:`VerifyPlan` cached per static signature (no host
    sync); CUDA-graph capturable; traced by torch.compile as ``tritree::verify_mla``.
    """
    if not eager():
        return _verify_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, return_lse, out, lse,
                              config, num_splits, d_rope, kv_scale)
    plan = _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
                 kv_scale)
    return plan._run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse)
