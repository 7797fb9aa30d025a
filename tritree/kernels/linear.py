"""The skinny linear of decode shapes in one launch: ``linear`` (``out = rms?(x) @ weight^T + bias + residual``).

Semantics (:func:`linear_reference`, the specification), rows ``x [M, K]``, ``weight [N, K]``:

- ``xn = x`` or, with ``rms_eps``, the rows RMS-normalised: ``x / sqrt(mean(x^2) + rms_eps)`` (fp32), times an
  RMSNorm's weight ``norm_weight [K]`` when given. A weight used only here is better folded into ``weight``'s
  columns once by the caller (``rmsnorm(x, g) W^T = rms(x) (W diag(g))^T``: the operands multiplied as they are in
  memory); ``norm_weight`` serves weights that other products read unnormalised;
- ``out = xn @ weight^T`` summed in fp32, ``+ bias [N]``, ``+ residual [M, N]``, written in ``x``'s dtype.

At decode ``M`` is a few rows and the op is a weight stream. One launch of :func:`_linear_kernel`, grid
``(row blocks, column tiles, K splits)``:

1. each program multiplies a ``[BLOCK_N, BLOCK_K]`` weight tile (the MMA's M side: the tensor cores' wide
   dimension goes to the weights) by its rows' ``[BLOCK_M, BLOCK_K]`` activations over its slice of K, in a
   pipelined loop (``num_stages``); with the norm, the rows' sums of squares over the slice are kept beside it: the
   norm's ``1 / rms`` is a per-row factor applied after the sum;
2. with one split the program writes the tile; else it stores its fp32 partial (and partial sums of squares) to a
   workspace, and the last program of the tile to arrive (an arrival counter per tile, ``atomic_add`` acq_rel
   after a CTA barrier) adds the partials in split order (deterministic), applies the epilogue and resets the
   counter to 0.

The plan (:func:`plan_linear`) picks the tile by ``M`` and splits K until ``programs_per_sm`` programs an SM stream
the weight. Past the rows of the architecture's table (:func:`row_bound`: 32 on sm_90, where cuBLAS is as fast
at 33-64 rows and faster beyond; 96 with the row norm, where the composed ops add a launch; bench/RESULTS.md
"Skinny linear") the op runs the composed PyTorch ops.

Arrival counters: :func:`tritree.kernels._launch.arrival_counters` (left at 0; concurrent calls on different streams
of one device are not supported). No host sync: CUDA-graph capturable once warm. Under Triton's interpreter the
programs run in turn and the CPU tests run the same code path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _validate as V
from ._launch import (
    KernelLauncher,
    PlanCache,
    StreamScratch,
    arrival_counters,
    eager,
    interpreting,
    scalars,
    signature,
    uses_kernel,
)
from .configs import arch_of, arch_table, lookup, num_sms

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUM_REGISTERS = 64  # fp32 registers a thread of a tile's reducer fills with partial tiles in flight


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

ACTS = (None, "silu_mul")


def linear_reference(x, weight, bias=None, *, rms_eps=None, norm_weight=None, act=None, residual=None,
                     dtype=torch.float64):
    """:func:`linear`'s semantics in ``dtype`` (float64 in tests), returned in ``x``'s dtype."""
    xf = x.to(dtype)
    if rms_eps is not None:
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + rms_eps)
    if norm_weight is not None:
        xf = xf * norm_weight.to(dtype)
    y = xf @ weight.to(dtype).t()
    if bias is not None:
        y = y + bias.to(dtype)
    if act == "silu_mul":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = y + residual.to(dtype)
    return y.to(x.dtype)


def _composed(x, weight, bias, rms_eps, norm_weight, residual, out, glu=False):
    """The op as PyTorch ops in ``x``'s dtype (CPU, autograd, and rows past :func:`row_bound`): ``F.rms_norm`` and
    ``F.linear`` (cuBLAS on a GPU)."""
    g = None if norm_weight is None else norm_weight.to(x.dtype)
    xn = x if rms_eps is None else F.rms_norm(x, (x.shape[-1],), g, rms_eps)
    y = F.linear(xn, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    if glu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = y + residual
    if out is None:
        return y
    out.copy_(y)
    return out


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _weight_rows(pn, N, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """``(weight rows of column tile pn [BLOCK_N], their mask)``; with ``GLU`` its first half are gate rows
    ``pn BLOCK_N / 2 + i`` and its second half the up rows ``N`` further (``W [2N, K]``)."""
    i = tl.arange(0, BLOCK_N)
    if GLU:
        j = pn * (BLOCK_N // 2) + i % (BLOCK_N // 2)
        return j + (i // (BLOCK_N // 2)) * N, j < N
    return pn * BLOCK_N + i, pn * BLOCK_N + i < N


@triton.jit
def _epilogue(acc, ss, rows, wrows, wrow_ok, pn, M, N, K, eps, Bias, Res, Out, stride_r, stride_o,
              HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GLU: tl.constexpr):
    """A finished ``[BLOCK_N, BLOCK_M]`` tile of weight rows ``wrows`` (fp32 sums, ``ss``: the rows' sums of
    squares) to ``Out``; with ``GLU``, ``silu(gate half) * up half``: ``BLOCK_N / 2`` output columns."""
    BLOCK_N: tl.constexpr = acc.shape[0]
    BLOCK_M: tl.constexpr = acc.shape[1]
    if HAS_NORM:
        acc = acc * tl.rsqrt(ss / K + eps)[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + wrows, mask=wrow_ok, other=0.0).to(tl.float32)[:, None]
    if GLU:
        gate, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N // 2, BLOCK_M]), (1, 2, 0)))
        acc = gate * tl.sigmoid(gate) * up
        cols = pn * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    else:
        cols = wrows
    ok = (cols < N)[:, None] & (rows < M)[None, :]
    r64 = rows.to(tl.int64)[None, :]
    if HAS_RES:
        acc += tl.load(Res + r64 * stride_r + cols[:, None], mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + r64 * stride_o + cols[:, None], acc.to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _linear_kernel(X, W, Bias, Res, Out, Part, SumSq, Count, NormW, M, N, K, stride_x, stride_w, stride_r, stride_o,
                   k_split, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, SUM_UNROLL: tl.constexpr, HAS_NW: tl.constexpr,
                   GLU: tl.constexpr):
    """Grid ``(row blocks, column tiles, SPLIT_K)``; see the module. ``X [M, K]``, ``W [N, K]``, ``Res`` and ``Out
    [M, N]`` by row strides (last dimension contiguous); ``Bias [N]``; ``Part [SPLIT_K, M, N]`` and
    ``SumSq [SPLIT_K, column tiles, M]`` fp32 (``SPLIT_K > 1``); ``Count``: int32 counters at 0, one a tile.
    ``k_split``: columns of K a split (whole ``BLOCK_K`` tiles). ``DOT_F32``: an IEEE fp32 dot (fp32 inputs, and
    the interpreter). ``HAS_NW``: the rows times ``NormW [K]`` by column (after their sums of squares). ``GLU``:
    ``W [2N, K]`` (gate rows, then up rows), ``Out [M, N] = silu(gate) * up`` (``Bias [2N]``, ``Part [SPLIT_K, M,
    2N]``)."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    ks = tl.program_id(2)
    n_pn = tl.num_programs(1)
    rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols, col_ok = _weight_rows(pn, N, BLOCK_N, GLU)  # the tile's weight rows
    row_ok = rows < M
    kk = tl.arange(0, BLOCK_K)
    lo = ks * k_split
    hi = tl.minimum(K, lo + k_split)
    px = X + rows.to(tl.int64)[:, None] * stride_x + (lo + kk)[None, :]
    pw = W + cols.to(tl.int64)[:, None] * stride_w + (lo + kk)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ss2 = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # squares by column, summed over K tiles, then reduced
    if HAS_NORM:
        # The rows' sums of squares from loads of their own, one tile ahead in registers (the operand is multiplied
        # as loaded; the norm's 1 / rms, a factor of the row, comes after the sum). Read from the MMA's operand
        # tile, that tile had two consumers, the MMA's shared-memory operand and these register loads, and Triton
        # 3.6 then pipelined it in one buffer fewer than the weight tile on sm_90: the next tiles' copies overwrote
        # x under the asynchronous wgmma still reading it. The pipeliner leaves loads that feed no dot in place, so
        # the next tile is loaded here by hand, its latency under this tile's MMA (".cg": a load the compiler does
        # not merge with the operand's). Squares are summed by column and reduced once after the loop. (Two tiles
        # ahead, triton 3.6 stops pipelining the operands: tests/kernels/test_aot_audit.py checks the buffers.)
        xs_1 = tl.load(px, mask=row_ok[:, None] & ((lo + kk) < hi)[None, :], other=0.0, cache_modifier=".cg")
    for k0 in range(lo, hi, BLOCK_K):
        if EVEN_K:
            xt = tl.load(px, mask=row_ok[:, None], other=0.0)
            wt = tl.load(pw, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + kk) < hi
            xt = tl.load(px, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(pw, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_NORM:
            xs = xs_1.to(tl.float32)
            nxt = (k0 + BLOCK_K + kk) < hi
            xs_1 = tl.load(px + BLOCK_K, mask=row_ok[:, None] & nxt[None, :], other=0.0, cache_modifier=".cg")
            ss2 += xs * xs
        if HAS_NW:  # the norm's weight by column
            kc = k0 + kk
            g = tl.load(NormW + kc, mask=kc < hi, other=0.0).to(tl.float32)
            xt = (xt.to(tl.float32) * g[None, :]).to(xt.dtype)
        if DOT_F32:
            acc = tl.dot(wt.to(tl.float32), tl.trans(xt.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt, tl.trans(xt), acc)
        px += BLOCK_K
        pw += BLOCK_K
    ss = tl.sum(ss2, 1)
    if SPLIT_K == 1:
        _epilogue(acc, ss, rows, cols, col_ok, pn, M, N, K, eps, Bias, Res, Out, stride_r, stride_o, HAS_NORM,
                  HAS_BIAS, HAS_RES, GLU)
    else:
        NW = 2 * N if GLU else N  # weight rows
        MN = tl.cast(M, tl.int64) * NW
        r64 = rows.to(tl.int64)[None, :]
        ok = col_ok[:, None] & row_ok[None, :]
        part = Part + r64 * NW + cols[:, None]
        tl.store(part + ks.to(tl.int64) * MN, acc, mask=ok)
        sq = SumSq + pn * M + rows
        if HAS_NORM:
            tl.store(sq + ks * n_pn * M, ss, mask=row_ok)
        tl.debug_barrier()  # every thread's partials stored before the arrival is released
        count = Count + pm * n_pn + pn
        if tl.atomic_add(count, 1, sem="acq_rel") == SPLIT_K - 1:  # the tile's last split: the sums in split order
            tot = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            sst = tl.zeros([BLOCK_M], dtype=tl.float32)
            for s0 in range(0, SPLIT_K, SUM_UNROLL):  # SUM_UNROLL loads in flight, added in split order
                for u in tl.static_range(SUM_UNROLL):
                    s = s0 + u
                    live = (tl.zeros([1], tl.int32) + s) < SPLIT_K  # a tensor: the interpreter masks with tensors
                    tot += tl.load(part + s * MN, mask=ok & live[None, :], other=0.0, cache_modifier=".cg")
                    if HAS_NORM:
                        sst += tl.load(sq + s * n_pn * M, mask=row_ok & live, other=0.0, cache_modifier=".cg")
            _epilogue(tot, sst, rows, cols, col_ok, pn, M, N, K, eps, Bias, Res, Out, stride_r, stride_o, HAS_NORM,
                      HAS_BIAS, HAS_RES, GLU)
            tl.store(count, 0)  # for the next launch


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LinearConfig:
    """Launch configuration of :func:`_linear_kernel`.

    block_m / block_n / block_k: rows, weight rows (output columns) and K columns of a program's tile (each >= 16).
    num_warps / num_stages: as in ``triton.Config``.
    programs_per_sm: the K split aims at this many programs an SM when the tiles are fewer.
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2


# Row bucket -> config: a launch of M rows takes the first bucket >= M; past the largest bucket the composed ops
# run. The weight tile [BLOCK_N, BLOCK_K] is the MMA's wide side; BLOCK_M covers the rows. sm_90, measured on an
# H100 (bench/RESULTS.md, "Skinny linear"): blocks of 16 rows (two row blocks at 17-32 rows) and a K split for one
# program an SM were the fastest of twelve configs at 1 and 17 rows; beyond 32 rows cuBLAS wins. Calls with the
# row norm (``rms_eps``) look in ``"<arch>:norm"`` where there is one: there the composed ops launch an RMSNorm
# before cuBLAS, and blocks of 32 rows beat both up to 65 rows (the same section). sm_120 and sm_80 (not
# measured) the same rows and columns; on sm_120 in 8 warps and K tiles of 64 (with 4 warps, or K tiles of 128
# and every epilogue, triton 3.9's builds keep an 8-32 byte stack). Bounded by the ahead-of-time audit
# (tests/kernels/test_aot_audit.py: sm_120 101,376 B of shared memory, no spills; triton 3.6 and 3.9).
LINEAR_CONFIGS: dict[str, dict[int, LinearConfig]] = {
    "sm_90": {32: LinearConfig(16, 64, 128, 4, 4, programs_per_sm=1)},
    "sm_90:norm": {32: LinearConfig(16, 64, 128, 4, 4, programs_per_sm=1),
                   96: LinearConfig(32, 64, 128, 4, 4, programs_per_sm=1)},
    "sm_120": {32: LinearConfig(16, 64, 64, 8, 4, programs_per_sm=1)},
    "sm_120:norm": {32: LinearConfig(16, 64, 64, 8, 4, programs_per_sm=1),
                    96: LinearConfig(32, 64, 64, 8, 4, programs_per_sm=1)},
    "sm_80": {32: LinearConfig(16, 64, 128, 4, 3, programs_per_sm=1)},
    # Interpreter: few, large programs; a few splits (num_sms() is 4 there) so the tests exercise the reduction.
    "cpu": {256: LinearConfig(32, 32, 32, 4, 1)},
}

MAX_SPLIT_K = 64


@dataclass(frozen=True)
class LinearPlan:
    """Everything a launch needs, from static shapes only (graph-capturable).

    kernel: whether the Triton kernel runs (else the composed ops: rows past :func:`row_bound`, fp32 rows on a GPU);
    row_blocks, col_tiles, split_k: the grid; k_split: K columns a split (whole K tiles; no split is empty).
    """

    kernel: bool
    config: LinearConfig
    row_blocks: int
    col_tiles: int
    split_k: int
    k_split: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.row_blocks, self.col_tiles, self.split_k)

    @property
    def counters(self) -> int:
        return self.row_blocks * self.col_tiles

    def as_ints(self) -> list[int]:
        """The plan as the op's ``int[]`` argument (:meth:`from_ints` inverts it)."""
        c = self.config
        return [int(self.kernel), c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages, c.programs_per_sm,
                self.row_blocks, self.col_tiles, self.split_k, self.k_split]

    @classmethod
    def from_ints(cls, v) -> "LinearPlan":
        v = [int(a) for a in v]
        return cls(bool(v[0]), LinearConfig(*v[1:7]), *v[7:11])


def table_key(arch: str, norm: bool = False) -> str:
    """The key of ``LINEAR_CONFIGS`` a call reads: ``"<arch>:norm"`` for calls with the row norm where the
    architecture has that table, else ``arch``."""
    return f"{arch}:norm" if norm and f"{arch}:norm" in LINEAR_CONFIGS else arch


def row_bound(arch: str, norm: bool = False) -> int:
    """The most rows the kernel serves on ``arch`` (its table's largest bucket; ``norm``: calls with the row norm);
    more run the composed ops."""
    arch_table(LINEAR_CONFIGS, arch)
    return max(LINEAR_CONFIGS[table_key(arch, norm)])


def config_for(arch: str, M: int, norm: bool = False) -> LinearConfig:
    """The table's config for ``M`` rows (the largest bucket's past it; :func:`tritree.kernels.configs.lookup`)."""
    return lookup(LINEAR_CONFIGS, table_key(arch, norm), M)


@functools.lru_cache(maxsize=1024)
def plan_linear(M: int, N: int, K: int, dtype: torch.dtype, arch: str, sms: int,
                config: LinearConfig | None = None, norm: bool = False) -> LinearPlan:
    """The launch plan of one shape: the kernel for 16-bit rows up to :func:`row_bound` (``norm``: a call with the
    row norm, whose table may reach further; fp32 rows under the interpreter, for tests), else the composed ops;
    the config by rows, the grid, and a K split that brings the programs up to ``programs_per_sm x sms`` when the
    tiles are fewer (each split whole K tiles, none empty). ``config`` replaces the table's (and the row bound)."""
    cfg = config if config is not None else config_for(arch, M, norm)
    row_blocks = max(1, -(-M // cfg.block_m))
    col_tiles = max(1, -(-N // cfg.block_n))
    k_tiles = max(1, -(-K // cfg.block_k))
    programs = row_blocks * col_tiles
    target = cfg.programs_per_sm * sms
    split = 1 if programs >= target else max(1, min(MAX_SPLIT_K, k_tiles, -(-target // programs)))
    per = -(-k_tiles // split)
    split = -(-k_tiles // per)
    kernel = (M <= row_bound(arch, norm) or config is not None) and (dtype != torch.float32 or arch == "cpu")
    return LinearPlan(kernel, cfg, row_blocks, col_tiles, split, per * cfg.block_k)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _validate(x, weight, bias, rms_eps, residual, out, plan, norm_weight=None, act=None) -> None:
    V.check_tensor("x", x, ndim=2, dtypes=DTYPES)
    dev = x.device
    V.check_tensor("weight", weight, ndim=2, dtypes=(x.dtype,), device=dev)
    M, K = x.shape
    N = weight.shape[0]
    if K < 1:
        raise ValueError(f"x must have K >= 1 columns, got shape {tuple(x.shape)}")
    if N < 1 or weight.shape[1] != K:
        raise ValueError(f"weight must have shape [N, K] with N >= 1 and K = {K} (x's last dimension), got "
                         f"{tuple(weight.shape)}")
    for name, t in (("x", x), ("weight", weight)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")
    if bias is not None:
        V.check_tensor("bias", bias, ndim=1, dtypes=(x.dtype, torch.float32), device=dev)
        V.check_shape("bias", bias, (N,), "[N] (weight's rows)")
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if act == "silu_mul":
        if N % 2:
            raise ValueError(f"act='silu_mul' needs weight's rows to be gate rows then as many up rows (an even "
                             f"count), got {N}")
        N //= 2
    if rms_eps is not None:
        V.check_float("rms_eps", rms_eps, lo=0.0)
    if norm_weight is not None:
        if rms_eps is None:
            raise ValueError("norm_weight needs rms_eps (it is the weight of the rows' RMSNorm)")
        V.check_tensor("norm_weight", norm_weight, ndim=1, dtypes=(x.dtype, torch.float32), device=dev)
        V.check_shape("norm_weight", norm_weight, (K,), "[K]")
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            V.check_tensor(name, t, ndim=2, dtypes=(x.dtype,), device=dev)
            V.check_shape(name, t, (M, N), "[M, N] (N: weight's rows, half of them with act='silu_mul')")
            if t.stride(1) != 1:
                raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")
    if (out is not None and not torch.compiler.is_compiling()  # traced: no data pointers
            and any(out.data_ptr() == t.data_ptr() for t in (x, weight) if t.numel())):
        raise ValueError("out must not alias x or weight")
    if plan is not None:
        if not isinstance(plan, LinearPlan):
            raise TypeError(f"plan must be a LinearPlan, got {type(plan).__name__}")
        c = plan.config
        ok = (plan.row_blocks * c.block_m >= M and plan.col_tiles * c.block_n >= weight.shape[0] and plan.split_k >= 1
              and plan.split_k * plan.k_split >= K and plan.k_split % c.block_k == 0
              and min(c.block_m, c.block_n, c.block_k) >= 16)
        if not ok:
            raise ValueError(f"plan does not cover M = {M}, N = {N}, K = {K} in whole tiles of at least 16: {plan}")


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def sum_unroll(config: LinearConfig) -> int:
    """Partial tiles a tile's reducer loads at once: ``SUM_REGISTERS`` a thread (1 to 8)."""
    per_thread = config.block_m * config.block_n // (32 * config.num_warps)
    return max(1, min(8, SUM_REGISTERS // max(1, per_thread)))


def _constexprs(plan: LinearPlan, K, dtype, has_norm, has_bias, has_res, has_nw=False, glu=False):
    c = plan.config
    return dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=plan.split_k, HAS_NORM=has_norm,
                HAS_BIAS=has_bias, HAS_RES=has_res, DOT_F32=interpreting() or dtype == torch.float32,
                EVEN_K=K % c.block_k == 0, SUM_UNROLL=sum_unroll(c), HAS_NW=has_nw, GLU=glu)


def _workspace(plan: LinearPlan, M: int, N: int, device, norm: bool):
    """``(partials [split_k, M, N], sums of squares [split_k, column tiles, M])`` fp32, uninitialised (the
    partials one element when unused)."""
    split = plan.split_k > 1
    part = torch.empty(plan.split_k if split else 1, M if split else 1, N if split else 1, dtype=torch.float32,
                       device=device)
    ss = torch.empty(plan.split_k, plan.col_tiles, M if split and norm else 1, dtype=torch.float32, device=device)
    return part, ss


def _launch(x, weight, bias, rms_eps, residual, out, plan: LinearPlan, launcher=None, scratch=None, norm_weight=None,
            glu=False):
    """One launch of :func:`_linear_kernel` into ``out`` (a fresh ``[M, N]`` when None), which it returns."""
    M, K = x.shape
    N = weight.shape[0]  # weight rows (the workspaces'); the output's columns are half of them with glu
    if out is None:
        out = torch.empty(M, N // 2 if glu else N, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    part, ss = scratch if scratch is not None else _workspace(plan, M, N, x.device, rms_eps is not None)
    count = arrival_counters(x.device, plan.counters)
    args = (x, weight, bias if bias is not None else x,
            residual if residual is not None else out, out, part, ss, count,
            norm_weight if norm_weight is not None else x, M, N // 2 if glu else N, K, x.stride(0), weight.stride(0),
            residual.stride(0) if residual is not None else out.stride(0), out.stride(0), plan.k_split,
            float(rms_eps or 0.0))
    if launcher is not None:
        launcher(plan.grid, *args)
    else:
        c = plan.config
        _linear_kernel[plan.grid](*args, **_constexprs(plan, K, x.dtype, rms_eps is not None, bias is not None,
                                                       residual is not None, norm_weight is not None, glu),
                                  num_warps=c.num_warps, num_stages=c.num_stages)
    return out


class _LinearPlanLaunch:
    """linear for one static signature: validated, planned, kernel bound once (its workspaces one set per CUDA
    stream, a fresh set inside a graph capture)."""

    def __init__(self, x, weight, bias, rms_eps, norm_weight, act, residual, out, plan):
        _validate(x, weight, bias, rms_eps, residual, out, plan, norm_weight, act)
        dev = self.device = x.device
        M, K = x.shape
        N = weight.shape[0]
        self.rms_eps = rms_eps
        self.glu = act == "silu_mul"
        self.plan = plan if plan is not None else (
            plan_linear(M, N, K, x.dtype, arch_of(dev), num_sms(dev), norm=rms_eps is not None)
            if uses_kernel(dev) else None)
        self.kernel = self.plan is not None and self.plan.kernel
        if not self.kernel:
            return
        p = self.plan
        c = p.config
        norm = rms_eps is not None
        self._launcher = KernelLauncher(
            _linear_kernel, _constexprs(p, K, x.dtype, norm, bias is not None, residual is not None,
                                        norm_weight is not None, self.glu),
            num_warps=c.num_warps, num_stages=c.num_stages)
        self._scratch = StreamScratch(lambda: _workspace(p, M, N, dev, norm))

    def run(self, x, weight, bias, norm_weight, residual, out):
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias, norm_weight, residual))
        if not self.kernel or needs_grad:  # the kernel has no backward
            return _composed(x, weight, bias, self.rms_eps, norm_weight, residual, out, self.glu)
        return _launch(x, weight, bias, self.rms_eps, residual, out, self.plan, launcher=self._launcher,
                       scratch=self._scratch.get(self.device) if x.shape[0] else None, norm_weight=norm_weight,
                       glu=self.glu)


_LINEAR_PLANS = PlanCache("linear", _LinearPlanLaunch, maxsize=256)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, rms_eps: float | None = None,
           norm_weight: torch.Tensor | None = None, act: str | None = None, residual: torch.Tensor | None = None,
           out: torch.Tensor | None = None, plan: LinearPlan | None = None) -> torch.Tensor:
    """``act(rms?(x) @ weight^T + bias) + residual`` for decode row counts, in one launch.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32 rows (any row stride, last dimension contiguous).
        weight: ``[N, K]`` in ``x``'s dtype (any row stride, last dimension contiguous).
        bias: optional ``[N]`` in ``x``'s dtype or fp32.
        rms_eps: when given, the rows are RMS-normalised over K (``x / sqrt(mean(x^2) + rms_eps)``) before the
            product. An RMSNorm's weight ``g`` goes into ``weight``'s columns (``weight * g``, once, at load):
            ``rmsnorm(x, g) @ W^T == rms(x) @ (W * g)^T``, or, where other products read ``weight`` unnormalised,
            in ``norm_weight``.
        norm_weight: optional ``[K]`` in ``x``'s dtype or fp32 (with ``rms_eps``): the normalised rows times it.
        act: None, or ``"silu_mul"``: ``weight [2N, K]`` holds gate rows then up rows (``bias [2N]`` likewise) and
            the output is ``silu(gate) * up``, ``[M, N]`` (a SwiGLU's first half in one launch).
        residual: optional ``[M, N]`` in ``x``'s dtype (last dimension contiguous), added to the product.
        out: optional ``[M, N]`` destination in ``x``'s dtype (any row stride, last dimension contiguous: a
            slice of a wider buffer), not aliasing ``x`` or ``weight``; it may be ``residual`` (added in place).
        plan: a :class:`LinearPlan` replacing :func:`plan_linear`'s (tests, tuning).

    Returns ``out`` (or a new ``[M, N]`` tensor): sums in fp32, written once in ``x``'s dtype. Semantics
    :func:`linear_reference`'s.

    On CUDA (and under ``TRITON_INTERPRET=1``) one launch of the Triton kernel for ``M <= row_bound(arch)`` (32 on
    sm_90 and sm_120; 96 there with ``rms_eps``), no host sync (CUDA-graph capturable once warm); more rows, fp32 rows on a GPU, other devices
    and calls that need gradients run the composed PyTorch ops (``F.rms_norm`` rounds the normalised rows to
    ``x``'s dtype before the product; the kernel applies ``1 / rms`` to the fp32 sums). Eager calls run a plan
    cached per static signature; under torch.compile the ops ``tritree::linear`` / ``tritree::linear_out``.
    Concurrent calls on different CUDA streams of one device are not supported (shared arrival counters).
    """
    if eager():
        try:
            key = (signature(x, weight, bias, norm_weight, residual, out), scalars(rms_eps, act), plan,
                   out is not None and residual is not None and out.data_ptr() == residual.data_ptr())
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
            _validate(x, weight, bias, rms_eps, residual, out, plan, norm_weight, act)
            raise
        return _LINEAR_PLANS.get(key, x, weight, bias, rms_eps, norm_weight, act, residual, out, plan).run(
            x, weight, bias, norm_weight, residual, out)
    _validate(x, weight, bias, rms_eps, residual, out, plan, norm_weight, act)
    M, K = x.shape
    N = weight.shape[0]
    glu = act == "silu_mul"
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (x, weight, bias, norm_weight, residual))
    if plan is None and uses_kernel(x.device):  # a pure function of ints: traced through uncached
        plan = plan_linear.__wrapped__(M, N, K, x.dtype, arch_of(x.device), num_sms(x.device))
    if needs_grad or plan is None or not plan.kernel:
        return _composed(x, weight, bias, rms_eps, norm_weight, residual, out, glu)
    eps = None if rms_eps is None else float(rms_eps)
    if out is None:
        return _linear_op(x, weight, bias, norm_weight, residual, plan.as_ints(), eps, glu)
    _linear_out_op(x, weight, bias, norm_weight, residual, out, plan.as_ints(), eps, glu)
    return out


# Opaque to torch.compile: programs hand work to each other through counters and workspaces.
@torch.library.custom_op("tritree::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
               residual: torch.Tensor | None, plan: list[int], rms_eps: float | None, glu: bool) -> torch.Tensor:
    return _launch(x, weight, bias, rms_eps, residual, None, LinearPlan.from_ints(plan), norm_weight=norm_weight,
                   glu=glu)


@_linear_op.register_fake
def _(x, weight, bias, norm_weight, residual, plan, rms_eps, glu):
    return x.new_empty(x.shape[0], weight.shape[0] // 2 if glu else weight.shape[0])


@torch.library.custom_op("tritree::linear_out", mutates_args=("out",))
def _linear_out_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                   residual: torch.Tensor | None, out: torch.Tensor, plan: list[int], rms_eps: float | None,
                   glu: bool) -> None:
    _launch(x, weight, bias, rms_eps, residual, out, LinearPlan.from_ints(plan), norm_weight=norm_weight, glu=glu)
