"""The Gluon verify kernels' launch rules: grid, constexprs, options and TMA descriptors of a launch.

``plan_verify_gluon`` turns the static facts of a call (kernel name, B, T, H, P, split count, SMs, whether
the device takes programmatic dependent launch, the partials' dtype, whether the 3-D descriptor is taken)
into a frozen ``GluonLaunch``: pure Python, cacheable. ``descriptors_for`` builds its TMA descriptors. The
launcher (``launcher.VerifyPlan``) is the one caller that launches them; which kernel a call runs is
``policy.plan_launch``'s decision.

Which kernel a shape runs (``verify_mla``'s tables: ``kernel="gluon"`` up to 64 packed rows M = T * H at
P % 64 == 0, ``kernel="gluon-ws"`` above; pages below 64 take ``"gluon-ws"`` above 16 rows):

* ``"gluon"`` (``gluon_plain``): grid ``(cdiv(M, 64), splits, B)``. P % 64 == 0: TMA tiles, each
  tile 2 copies (``TMA3D``, a 3-D latent box) unless the driver refuses that descriptor (then 9 boxes, for
  the rest of the process: the launcher passes ``tma3d=False`` from then on); several splits write bf16
  partials re-laid out before their store (``COALESCED_STORE``; fp32 partials from the MMA layout measured
  slower). P < 64: row gathers, fp32 partials.
* ``"gluon-mma"`` (``gluon_mma``, sm_120's ``mma.sync`` kernel, also run on Hopper): grid
  ``(cdiv(M, 32), splits, B)``, 8 warps, row gathers by ``cp.async`` for every page size (16-byte aligned
  rows), bf16 or fp8 (e4m3) pools, fp32 partials.
* ``"gluon-ws"`` (``gluon_ws``, its producer partition in ``gluon_ws_producer``): 16-bit partials
  (the output's dtype) always.
  - Narrow block rule: with at least ``NARROW_MIN_BLOCKS`` row blocks, a last block of at most 8 / 16 real
    rows runs narrow (``NARROW_ROWS``); its split count is what the full blocks' programs leave of the SMs
    (``narrow_splits_for``), and the full blocks' count comes from ``choose_narrow_num_splits``, which
    counts the narrow block as ``NARROW_COST`` of one. The grid is then 1-D over programs:
    ``((row_blocks - 1) * splits + narrow_splits, 1, B)``.
  - Masked pairs rule (over TMA): with a narrow block or rows that fill the last block, the full blocks'
    masked tiles (more than one a split) run as pairs of the producer's stream ahead of the full pairs
    (``MASKED_PAIRS``; the paged-view descriptor). Not where the last block is part-filled and not narrow
    (T=17,H=8), where it measured slower.
  - Wide copies rule (over TMA): under the same condition, a pair's adjacent tiles as one 128-row box a
    column block (``WIDE_COPIES``; the 128-row descriptor).
  - Split PDL rule: under the same condition (pages of any size), on a device with programmatic dependent
    launch (``_splitkv.pdl_capable``), the kernel is launched with ``launch_pdl`` and waits in
    ``griddepcontrol.wait`` before its first global read (``WAIT_PRIOR``); the kernel before it signals its
    dependents at its start.
  - TMA store rule: several splits (the launcher's contiguous ``[B, splits, rows, 512]`` 16-bit partials):
    the partial rows by TMA boxes (``TMA_STORE``; the partials descriptor); one split (the output, any
    strides): staged through the pair buffers and stored by the threads.
  - ptxas options (over TMA): ``-O1`` for launches with a narrow block, and for those without one that copy
    wide (both measured faster than the default -O3, whose schedule of the pair loop has local
    accesses); the default elsewhere and for row gathers. ``-O1`` schedules a narrow launch's narrow pair
    loop differently from one ptxas run to the next (measured with ptxas 12.8 and 13.0).
  - Producer registers: 24, or 40 for row gathers (``setmaxnreg``).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from .abi import D_LATENT as D_LAT
from .abi import D_ROPE as D_PE
from .abi import GLUON_KERNELS as KERNELS

GLUON_AVAILABLE = False
_IMPORT_ERROR: Exception | None = None
try:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .gluon_mma import BLOCK_M as MMA_BLOCK_M
    from .gluon_mma import BLOCK_N as MMA_BLOCK_N
    from .gluon_mma import _verify_gluon_mma_kernel
    from .gluon_plain import _verify_gluon_kernel
    from .gluon_ws import _verify_gluon_ws_kernel

    GLUON_AVAILABLE = True
except Exception as e:  # pragma: no cover - depends on the installed triton
    _IMPORT_ERROR = e

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 8
PRODUCER_WARPS = 4
PRODUCER_REGS = 24
GATHER_PRODUCER_REGS = 40  # row addresses for 4 rows x 2 tiles per thread
# Page sizes below one tile: full tiles are cp.async row gathers, not TMA.
GATHER_PAGE_SIZES = (1, 2, 4, 8, 16, 32)
SMEM_LIMIT_SM90 = 232_448
# The GPUs (compute capability majors) each kernel runs on: the Hopper kernels use wgmma and 227 KB of shared
# memory; the mma.sync kernel runs on sm_120 and, with the same instructions, on Hopper.
KERNEL_MAJORS = {"gluon": (9,), "gluon-ws": (9,), "gluon-mma": (9, 12)}
# Narrow block rule: at least this many row blocks (with two full blocks, more splits shorten their chunks
# less than the page and pair rounding costs: T=17,H=8 measured slower), and a narrow program's time per key
# over a 64-row block's for the split choice (an estimate: the tiles still pass through shared memory).
NARROW_MIN_BLOCKS = 5
NARROW_COST = 0.75
PTXAS_FAST = "-O1"


def _kv_smem_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


def _kv_smem3_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)


# ---- static rules (pure Python) ----------------------------------------------------------------

def narrow_rows(rows: int) -> int:
    """``NARROW_ROWS`` of a ws launch over ``rows`` packed rows: 8 or 16 where the last of at least
    ``NARROW_MIN_BLOCKS`` row blocks holds at most that many real rows, else 0."""
    if triton.cdiv(rows, BLOCK_M) < NARROW_MIN_BLOCKS:
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


def partials_narrow_for(kernel: str, page_size: int) -> bool | None:
    """``split_destinations``' ``narrow`` for ``kernel`` over pages of ``page_size``: True where it writes
    16-bit partials (the ws kernel; the plain one over TMA), else None (fp32)."""
    if kernel == "gluon":
        return True if page_size % BLOCK_N == 0 else None
    return True if kernel == "gluon-ws" else None


def runs_on(kernel: str, major: int) -> bool:
    """Whether ``kernel`` runs on a GPU of compute capability major ``major``."""
    return major in KERNEL_MAJORS.get(kernel, ())


def _full_or_narrow(rows: int, narrow: int) -> bool:
    """The masked pairs / wide copies / split PDL condition: a narrow block, or rows that fill the last."""
    return narrow > 0 or rows % BLOCK_M == 0


@dataclasses.dataclass(frozen=True)
class GluonLaunch:
    """One launch of a Gluon verify kernel, from static facts only (``plan_verify_gluon``)."""
    kernel: str                 # "gluon", "gluon-ws" or "gluon-mma"
    grid: tuple[int, int, int]
    num_splits: int
    narrow_splits: int          # the ws kernel's narrow block's split count (= num_splits without one)
    constexprs: tuple           # (name, value) pairs, as passed to the kernel
    launch_pdl: bool
    ptx_options: str | None
    wide_desc: bool             # the pool in 128-row boxes (WIDE_COPIES)
    pages_desc: bool            # the pool's paged view (MASKED_PAIRS)
    partials_desc: bool         # the partials by TMA (TMA_STORE)
    tma3d: bool                 # the plain kernel's 3-D latent box
    partials_16bit: bool

    @property
    def fn(self):
        return {"gluon-ws": _verify_gluon_ws_kernel, "gluon-mma": _verify_gluon_mma_kernel}.get(
            self.kernel, _verify_gluon_kernel)

    def options(self) -> dict:
        opts = {"num_warps": NUM_WARPS}
        if self.launch_pdl:
            opts["launch_pdl"] = True
        if self.ptx_options:
            opts["ptx_options"] = self.ptx_options
        return opts


def plan_verify_gluon(*, kernel: str, batch: int, T: int, H: int, page_size: int, num_splits: int, num_sms: int,
                      pdl_capable: bool, partials_dtype: torch.dtype | None = None, timeline: int = 0,
                      tma3d: bool = True) -> GluonLaunch:
    """The launch of ``kernel`` (``"gluon"`` / ``"gluon-ws"`` / ``"gluon-mma"``) for ``batch`` requests of ``T``
    tree tokens x ``H`` heads over pages of ``page_size`` with ``num_splits`` splits (see the module docstring).
    ``partials_dtype``: the split partials' dtype (with one split, the output's: bf16); the partials are the
    launcher's contiguous ``[B, splits, rows, 512]`` tensor. ``timeline``: the bench stamps
    (``bench/timeline.py``; wrong lse). ``tma3d``: the plain kernel may copy a tile's latent part as one 3-D box
    (False once a driver refused that descriptor)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    num_splits = int(num_splits)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if partials_dtype is None or num_splits == 1:
        partials_dtype = torch.bfloat16 if (num_splits == 1 or partials_narrow_for(kernel, page_size)) else torch.float32
    p16 = partials_dtype in (torch.bfloat16, torch.float16)
    M = T * H
    common = dict(PAGE_SIZE=page_size, SINGLE_SPLIT=num_splits == 1)
    if kernel == "gluon-mma":
        cx = dict(common, BLOCK_M=MMA_BLOCK_M, BLOCK_N=MMA_BLOCK_N, D_LAT=D_LAT, D_PE=D_PE)
        return GluonLaunch(kernel, (triton.cdiv(M, MMA_BLOCK_M), num_splits, batch), num_splits, num_splits,
                           tuple(cx.items()), False, None, False, False, False, False, p16)
    gather = page_size % BLOCK_N != 0
    row_blocks = triton.cdiv(M, BLOCK_M)
    grid = (row_blocks, num_splits, batch)
    if kernel == "gluon":
        tma3d = tma3d and not gather
        cx = dict(common, TMA3D=tma3d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_LAT=D_LAT, D_PE=D_PE,
                  TIMELINE=bool(timeline), COALESCED_STORE=num_splits > 1 and p16 and not gather)
        return GluonLaunch(kernel, grid, num_splits, num_splits, tuple(cx.items()), False, None, False, False, False,
                           tma3d, p16)
    if not p16:
        raise TypeError("the warp-specialised Gluon verify kernel writes 16-bit rows: bf16 / fp16 partials")
    nrows = narrow_rows(M)
    narrow_splits = narrow_splits_for(num_splits, batch, row_blocks, num_sms) if nrows else num_splits
    if nrows:  # the full blocks' programs, then the narrow block's (``_program``)
        grid = ((row_blocks - 1) * num_splits + narrow_splits, 1, batch)
    full = _full_or_narrow(M, nrows)
    wide = full and not gather
    masked = full and not gather
    split_pdl = full and pdl_capable
    by_tma = num_splits > 1
    ptx = None if gather else PTXAS_FAST if (nrows or wide) else None
    cx = dict(common, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=GATHER_PRODUCER_REGS if gather else PRODUCER_REGS,
              BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, D_LAT=D_LAT, D_PE=D_PE, TIMELINE=int(timeline), NARROW_ROWS=nrows,
              WIDE_COPIES=wide, MASKED_PAIRS=masked, WAIT_PRIOR=split_pdl, TMA_STORE=by_tma)
    return GluonLaunch(kernel, grid, num_splits, narrow_splits, tuple(cx.items()), split_pdl, ptx, wide, masked, by_tma,
                       False, True)


# ---- descriptors ---------------------------------------------------------------------------

def kv_descriptor(kv: torch.Tensor, block_rows: int = BLOCK_N):
    """Host TMA descriptor of the pool viewed as ``[num_pages * P, 576]``, boxes of ``block_rows`` x 64 (64;
    the ws kernel's wide copies: 128). Pages below a tile: never read, slot 0 of each page keeps the view
    inside the storage."""
    num_pages, P, D = kv.shape
    if P % BLOCK_N:
        flat = kv.as_strided((num_pages, D), (kv.stride(0), 1))
        return TensorDescriptor(flat, [num_pages, D], [kv.stride(0), 1], [BLOCK_N, 64], _kv_smem_layout())
    flat = kv.as_strided((num_pages * P, D), (kv.stride(1), 1))
    return TensorDescriptor(flat, [num_pages * P, D], [kv.stride(1), 1], [block_rows, 64], _kv_smem_layout())


def kv_descriptor_pages(kv: torch.Tensor):
    """Host TMA descriptor of the pool as it is stored, ``[num_pages, P, 576]``, boxes ``[1, 64, 64]`` (P a
    multiple of 64): a box whose slot coordinate runs below 0 or past P lands zeros there (masked pairs)."""
    num_pages, P, D = kv.shape
    return TensorDescriptor(kv, [num_pages, P, D], [kv.stride(0), kv.stride(1), 1], [1, BLOCK_N, 64],
                            _kv_smem3_layout())


def kv_descriptor3(kv: torch.Tensor):
    """Host TMA descriptor of the pool viewed as ``[9 column blocks, num_pages * P rows, 64]`` (strides
    ``[64, row stride, 1]`` elements), box ``[8, 64, 64]``: one copy moves a tile's whole latent part
    as 8 contiguous 64 x 64 swizzled blocks (a box of 9 is refused: box dims must be powers of two)."""
    num_pages, P, D = kv.shape
    flat = kv.as_strided((num_pages * P, D), (kv.stride(1), 1))
    return TensorDescriptor(flat, [D // 64, num_pages * P, 64], [64, kv.stride(1), 1], [D_LAT // 64, BLOCK_N, 64],
                            _kv_smem3_layout())


def partials_descriptor(dst_o: torch.Tensor):
    """Host TMA descriptor of the split partials ``[B, splits, rows, 512]`` (16-bit, contiguous) viewed as
    ``[B * splits, rows, 512]``, boxes ``[1, 64, 64]``: a row block's box past ``rows`` is clipped."""
    B, S, M, D = dst_o.shape
    return TensorDescriptor(dst_o, [B * S, M, D], [M * D, D, 1], [1, BLOCK_M, 64], _kv_smem3_layout())


def descriptors_for(launch: GluonLaunch, kv: torch.Tensor, dst_o: torch.Tensor | None = None) -> tuple:
    """The TMA descriptors ``launch`` passes, in its argument order (the plain kernel: ``(kv_desc, kv_desc3)``;
    the ws kernel: ``(kv_desc, kv_desc3, kv_desc_pages, out_desc)``; an unused slot holds ``kv_desc``; the
    mma.sync kernel: none). They depend on ``kv``'s pointer, shape and strides (and ``dst_o``'s, for the
    partials descriptor): a caller may keep them while those are unchanged."""
    if launch.kernel == "gluon-mma":
        return ()
    desc = kv_descriptor(kv)
    if launch.kernel == "gluon":
        return desc, kv_descriptor3(kv) if launch.tma3d else desc
    if launch.partials_desc and dst_o is None:
        raise ValueError("this launch stores its partials by TMA: pass dst_o")
    return (desc, kv_descriptor(kv, 2 * BLOCK_N) if launch.wide_desc else desc,
            kv_descriptor_pages(kv) if launch.pages_desc else desc,
            partials_descriptor(dst_o) if launch.partials_desc else desc)
