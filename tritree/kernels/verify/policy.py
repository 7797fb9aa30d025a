"""The verify family's launch policy: the per-architecture config tables and :func:`plan_launch`, the one place
that decides which kernel (route) a call runs, with which tiles, split count and partials.

Pure Python on static facts (shapes, dtypes, the device, layout predicates), made once per plan.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from .._launch import uses_kernel
from .._splitkv import balanced_num_splits, choose_num_splits
from ..configs import AttnConfig, arch_of, lookup, num_sms
from . import gluon_launch as GL
from .abi import D_QK, GLUON_KERNELS, KERNELS
from .reference import KV_FP8

# Rows bucket -> config. A launch with M = T*H packed rows takes the first bucket >= M (else the
# largest). Entries are the measured choices (bench/RESULTS.md, verify attention); sm_120 ones are bounded
# by its 101,376 B of shared memory (576-wide bf16 K tiles: 32x32 is the largest that fits, docs/SPEC.md section 6).
VERIFY_MLA_CONFIGS: dict[str, dict[int, AttnConfig]] = {
    "sm_90": {
        16: AttnConfig(16, 64, 4, 2),
        # Pools with P >= BLOCK_N, 64x64 tiles in two warpgroups that split the score tile. On Hopper with
        # bf16 the Gluon kernels serve; elsewhere (fp16, other GPUs, triton without Gluon) the Triton
        # kernel with TMA tiles and the same split. One program per SM with the split count rounded down to
        # whole waves: fewer splits, fewer partials to write and merge than at two or four programs an SM
        # (10-15% faster at T=64,H=8, T=16,H=64 and T=65,H=8). The plain schedule up to 64 rows.
        64: AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon"),
        # Above 64 rows: the warp-specialised kernel (its producer prefetches the next tile pair into the L2;
        # 5-7% faster than the plain schedule's tile-pair form at T=64,H=8, T=8,H=64 and T=16,H=8).
        1 << 30: AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws"),
    },
    # Pools with pages smaller than those tiles (P=1: token-granular trees). On Hopper with bf16 the
    # warp-specialised kernel whose producer partition gathers the rows (cp.async by column halves, one page
    # id per row), one program per SM: 5-15% faster than a gather in the consumers. The Triton kernel, which
    # still serves fp16 and other GPUs with these tiles, is 1.4-1.9x slower.
    "sm_90:small_pages": {
        16: AttnConfig(16, 64, 4, 2),
        1 << 30: AttnConfig(64, 64, 8, 2, split_scores=True, kernel="gluon-ws"),
    },
    # fp8 (e4m3) pools with P >= BLOCK_N: the Triton kernel (tiles converted to bf16 in registers), three
    # stages (half-size tiles leave the shared memory for them; 9-13% faster than two); four stages do not
    # fit (258,072 B).
    "sm_90:fp8": {
        16: AttnConfig(16, 64, 4, 2),
        1 << 30: AttnConfig(64, 64, 8, 3, tma=True, split_scores=True),
    },
    # sm_120, bf16 pools: per page size, the faster kernel in emulation (an H100 under DISABLE_MMA_V3=1
    # TRITREE_ARCH=sm_120, L = 46k, B = 1: bench/RESULTS.md, "sm_120"). Pages of 64+ keys: the Triton kernel,
    # 16x64 tiles, 4 warps (98,304 B, no spill), 1.13-1.34x faster there than the Gluon mma.sync kernel at
    # T = 8, 17, 65 (H = 8) and T = 16 (H = 64); 16x64 is what the 576-wide K tiles leave of the 101,376 B.
    "sm_120": {
        1 << 30: AttnConfig(16, 64, 4, 2),
    },
    # Smaller pages: the Gluon mma.sync kernel (``gluon_mma``: queries in registers, 32 x 32 tiles, 8 warps, a
    # two-slot ring of KV tiles by row gathers; 98,304 B), 1.09-1.13x faster than the Triton kernel at P = 1 at
    # the same shapes. Its tiles serve the Triton kernel where the Gluon one does not (fp16, unaligned
    # rows, a triton without Gluon): one page id per row spills 16x64x4x2, 32x32x8x2 compiles without a spill.
    "sm_120:small_pages": {
        1 << 30: AttnConfig(32, 32, 8, 2, kernel="gluon-mma"),
    },
    # fp8 (e4m3) pools on sm_120: the same Gluon kernel over 1-byte tiles (61,440 B), its fragments widened to
    # bf16. Where it does not serve, the Triton kernel with these tiles: with fp8 tiles 16x64x4x2 spills
    # (converting them to bf16 takes registers); 32x32x8x2 (75,904 B, 248-254 registers, no spill at P = 1,
    # 16, 64), emulated 12-18% faster than 16x64x8x2 and 1.6-1.8x faster than 16x32x8x2.
    "sm_120:fp8": {
        1 << 30: AttnConfig(32, 32, 8, 2, kernel="gluon-mma"),
    },
    "sm_80": {
        16: AttnConfig(16, 32, 4, 2),
        1 << 30: AttnConfig(32, 64, 8, 2),
    },
    # fp32 queries and pools (the Triton kernel, IEEE dots): 4-byte Q and K tiles staged in shared memory take
    # twice the bytes of the tables above (64x64 tiles: 311,552 B; 16x64: 192,576 B, spilling). 16x32 tiles
    # in 8 warps: 114,752 B, no spill on sm_90; sm_120: 16x16 in 8 warps, 2 stages (75,840 B; no spill with triton
    # 3.9, 24-32 B with 3.6 at 64-key pages, where every 16x16 form spills).
    "sm_90:fp32": {
        1 << 30: AttnConfig(16, 32, 8, 2),
    },
    "sm_120:fp32": {
        1 << 30: AttnConfig(16, 16, 8, 2),
    },
    # fp32 queries over fp8 pools on sm_120: converting the 1-byte tiles takes registers; 16x16 in 4 warps, one
    # stage (73,728 B) is the form without a spill (8 warps, or two stages, spill 1.8-6.5 KB).
    "sm_120:fp32:fp8": {
        1 << 30: AttnConfig(16, 16, 4, 1),
    },
    "sm_80:fp32": {
        1 << 30: AttnConfig(16, 32, 8, 2),
    },
    # Triton interpreter: large tiles mean fewer (slow) interpreted operations.
    "cpu": {
        1 << 30: AttnConfig(32, 32, 4, 1),
    },
}


class VerifyLaunch(NamedTuple):
    """What every :func:`verify_mla` call of one static signature runs (:func:`plan_launch`)."""

    route: str                        # "reference" (CPU), "triton", "gluon" (plain Hopper schedule), "gluon-ws"
    #                                   (warp-specialised Hopper schedule) or "gluon-mma" (sm_120's mma.sync kernel)
    config: AttnConfig
    num_splits: int
    partials_dtype: torch.dtype       # dtype of the split partials (unused with one split)
    tma: bool                         # Triton route: KV tiles by tensor descriptors


def plan_launch(*, device: torch.device, q_dtype, kv_dtype, batch: int, T: int, H: int, head_dim: int,
                page_size: int, max_pages: int, gluon_layout: bool, tma_layout: bool,
                config: AttnConfig | None = None, num_splits: int | None = None,
                gather_layout: bool | None = None) -> VerifyLaunch:
    """The launch policy of :func:`verify_mla`, from static facts only.

    1. CPU tensors outside Triton's interpreter: the float reference.
    2. The config: ``config`` or the architecture's table (``VERIFY_MLA_CONFIGS``) by packed rows
       ``M = T * H``: on Hopper the plain Gluon schedule up to 64 rows and the warp-specialised one above,
       the fp8 and small-page tables where they apply; on sm_120 the Triton kernel for bf16 pools of pages of
       64+ keys and the Gluon ``mma.sync`` kernel (``"gluon-mma"``) for smaller pages and fp8 pools; Triton
       tiles on sm_80; fp32 queries: the ``"<arch>:fp32"`` tables' Triton tiles (``"<arch>:fp32:fp8"`` over fp8
       pools where there is one), whatever the pool's pages.
    3. A Gluon config runs its Gluon kernel where that kernel serves the call: bf16 q and pool (the
       ``mma.sync`` kernel: also fp8 pools), 576 channels, Gluon importable, a GPU the kernel runs on (the
       Hopper kernels: sm_90; ``"gluon-mma"``: sm_120, and sm_90 with the same instructions), q rows and pool
       rows 16-byte aligned (``gluon_layout``: pools of P % 64 == 0 as one matrix for the Hopper kernels' TMA
       tiles; ``gather_layout``, default ``gluon_layout``: rows alone, for the row gathers of ``"gluon-mma"``).
       Anything else (fp8 pools elsewhere, fp16, other GPUs, unaligned views) runs the Triton kernel
       with the config's tiles, by tensor descriptors where the pool is one contiguous matrix (``tma_layout``).
    4. Splits: enough (row block, split) programs for one wave of the SMs in whole waves (one resident
       program an SM), no chunk shorter than 4 tiles of the page table's capacity. The ``mma.sync`` kernel's
       32-row blocks fill waves less evenly: its count balances waves against chunk length
       (``_splitkv.balanced_num_splits``). Warp-specialised launches whose last row block holds at most 16
       real rows run that block narrow; it counts as 0.75 of a block, so the full blocks get the SMs it
       leaves (``gluon_launch.choose_narrow_num_splits``).
    5. Split partials in q's dtype where the Gluon kernel stages and stores them 16-bit (half the bytes
       the split programs write and the merge reads); fp32 otherwise.
    """
    M = T * H
    if not uses_kernel(device):
        cfg = config or AttnConfig(32, 32, 4, 1)
        return VerifyLaunch("reference", cfg, 1, torch.float32, False)
    kv_fp8 = kv_dtype == KV_FP8
    cfg = config or lookup(VERIFY_MLA_CONFIGS, arch_of(device), M, page_size=page_size, kv_fp8=kv_fp8,
                           fp32=q_dtype == torch.float32)
    if cfg.kernel not in KERNELS:
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
    (``gluon_launch.narrow_rows``): the full blocks share the SMs the narrow block leaves. ``None``
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


def launch_of(q, kv, page_table, config, num_splits) -> VerifyLaunch:
    """:func:`plan_launch` for these inputs (their layout facts read from their strides and data pointers)."""
    B, T, H, D = q.shape
    return plan_launch(device=q.device, q_dtype=q.dtype, kv_dtype=kv.dtype, batch=B, T=T, H=H, head_dim=D,
                       page_size=kv.shape[1], max_pages=page_table.shape[1], gluon_layout=_gluon_layout(q, kv),
                       tma_layout=_tma_layout(kv), config=config, num_splits=num_splits,
                       gather_layout=_gather_layout(q, kv))
