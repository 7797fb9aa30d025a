"""The absorbed MLA steps around verify attention at decode, one launch each: ``mla_query_`` and ``mla_output``.

Semantics (:func:`mla_query_reference`, :func:`mla_output_reference`: the specification), ``M = B T`` rows, ``H``
heads, ``C = kv_lora_rank``, ``R`` rope channels (halves layout, the tables of ``tritree.model.layers.cos_sin``):

- ``mla_query_(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens)``: from the rows'
  query projection ``q [M, H, nope + R]`` and latent projection ``latent [M, C + R]``,

  * ``out[m, h, :C] = q_nope[m, h] @ w_uk[h]`` (``w_uk [H, nope, C]``: ``kv_b_proj``'s key rows, absorbed into
    the query), ``out[m, h, C:] = rope(q_pe[m, h])``;
  * the row's cache latent ``[rmsnorm(c_kv) * norm_weight, rope(k_pe)]`` written into the paged pool ``kv`` at
    position ``kv_lens[b] + t`` of request ``b = m // T`` (``t = m % T``) for ``t < tree_lens[b]``: what
    :func:`tritree.kernels.kv_write_` does with the latents (padding rows write nothing);

- ``mla_output(o, w_uv)``: ``out[m, h V + v] = o[m, h] . w_uv[h, v]`` (``o [M, H, C]`` the attention's latent
  output, ``w_uv [H, V, C]``: ``kv_b_proj``'s value rows), the input of ``o_proj``.

Products summed in fp32, RMSNorm and RoPE in fp32, each output rounded once (to ``q``'s / ``o``'s dtype, the
latent to the pool's). One kernel (:func:`_mla_kernel`), grid 1-D: ``heads x column tiles x row blocks`` programs
of the per-head product (``mla_query_``'s also rotate their head's ``q_pe`` in the first column tile), then, for
``mla_query_``, the latent programs (``ROWS_L`` rows each). At decode each weight is ~1 MB, read once a row block.

No host sync: CUDA-graph capturable. The KV write signals dependents at its start as ``kv_write_`` does (the verify
kernel after it may be placed early and waits for the write itself). Under Triton's interpreter the programs run in
turn: the CPU tests run the same code path; other CPU calls run the reference in the inputs' dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, eager, full_lengths, interpreting, signature, uses_kernel
from .configs import arch_of, lookup
from .kv_cache import _pool, _row_offsets, kv_write_reference, write_signals

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def _rope_reference(x, cos, sin):
    """``x * cos + roll(x, R / 2) * sin`` (``sin``'s first half negated: the halves layout)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin


def mla_query_reference(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens=None, *,
                        rows_per_request, eps, dtype=torch.float64):
    """:func:`mla_query_`'s semantics computed in ``dtype``: returns ``out [M, H, C + R]`` in ``q``'s dtype and
    writes the latents into ``kv`` (its dtype) as :func:`tritree.kernels.kv_write_reference` does."""
    M, H, D = q.shape
    C = w_uk.shape[2]
    R = cos.shape[-1]
    qf = q.to(dtype)
    q_lat = torch.einsum("mhn,hnc->mhc", qf[..., :D - R], w_uk.to(dtype))
    q_pe = _rope_reference(qf[..., D - R:], cos.to(dtype)[:, None], sin.to(dtype)[:, None])
    out = torch.cat([q_lat, q_pe], dim=-1).to(q.dtype)
    lf = latent.to(dtype)
    c_kv = lf[:, :C]
    c_kv = c_kv * torch.rsqrt(c_kv.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    k_pe = _rope_reference(lf[:, C:], cos.to(dtype), sin.to(dtype))
    new = torch.cat([c_kv, k_pe], dim=-1).to(kv.dtype).view(M // rows_per_request, rows_per_request, C + R)
    kv_write_reference(kv, page_table, kv_lens, new, tree_lens)
    return out


def mla_output_reference(o, w_uv, *, dtype=torch.float64):
    """:func:`mla_output`'s semantics computed in ``dtype``, returned ``[M, H V]`` in ``o``'s dtype."""
    M, H = o.shape[:2]
    return torch.einsum("mhc,hvc->mhv", o.to(dtype), w_uv.to(dtype)).reshape(M, H * w_uv.shape[1]).to(o.dtype)


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _rope_rows(P, stride_p, rows, ok, Cos, Sin, stride_c, R: tl.constexpr):
    """fp32 ``rope(x)`` of ``R`` channels at ``P + row stride_p`` for ``rows`` (``ok``: loaded), ``[rows, R]``."""
    d = tl.arange(0, R)
    r64 = rows.to(tl.int64)[:, None]
    m = ok[:, None]
    x = tl.load(P + r64 * stride_p + d[None, :], mask=m, other=0.0).to(tl.float32)
    xr = tl.load(P + r64 * stride_p + ((d + R // 2) % R)[None, :], mask=m, other=0.0).to(tl.float32)
    c = tl.load(Cos + r64 * stride_c + d[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.load(Sin + r64 * stride_c + d[None, :], mask=m, other=0.0).to(tl.float32)
    return x * c + xr * s


@triton.jit
def _mla_kernel(X, W, Out, Lat, NormW, Cos, Sin, KV, PageTable, KvLens, TreeLens,
                M, K, N, H, stride_xm, stride_xh, stride_wh, stride_wk, stride_wn, stride_om, stride_oh,
                stride_lm, stride_c, stride_kp, stride_ks, stride_ptb, max_pages, num_pages, T, col_tiles,
                row_blocks, eps,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QUERY: tl.constexpr,
                R: tl.constexpr, C_PAD: tl.constexpr, ROWS_L: tl.constexpr, PAGE_SIZE: tl.constexpr,
                DOT_F32: tl.constexpr, SIGNAL: tl.constexpr):
    """Grid ``(heads x col_tiles x row_blocks [+ latent programs],)``; see the module. ``X [M, H, *]`` by
    ``stride_xm / stride_xh`` (its first ``K`` channels multiplied; with ``QUERY`` the ``R`` after them rotated);
    ``W``: element ``(h, k, n)`` at ``h stride_wh + k stride_wk + n stride_wn``; ``Out [M, H, *]`` by
    ``stride_om / stride_oh`` (``N`` product columns, then with ``QUERY`` the ``R`` rotated ones). ``QUERY``:
    ``Lat [M, N + R]`` by ``stride_lm``, ``NormW [N]``, ``Cos / Sin [M, R]`` by ``stride_c``, the pool ``KV`` by
    ``stride_kp / stride_ks`` with its page table, lengths and ``T`` rows a request."""
    if SIGNAL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    n_gemm = H * col_tiles * row_blocks
    if pid < n_gemm:
        _product_tile(X, W, Out, Cos, Sin, pid, M, K, N, stride_xm, stride_xh, stride_wh, stride_wk, stride_wn,
                      stride_om, stride_oh, stride_c, col_tiles, row_blocks, BLOCK_M, BLOCK_N, BLOCK_K, QUERY, R,
                      DOT_F32)
    else:
        if QUERY:
            _latent_rows(Lat, NormW, Cos, Sin, KV, PageTable, KvLens, TreeLens, pid - n_gemm, M, N, stride_lm,
                         stride_c, stride_kp, stride_ks, stride_ptb, max_pages, num_pages, T, eps, R, C_PAD, ROWS_L,
                         PAGE_SIZE)


@triton.jit
def _product_tile(X, W, Out, Cos, Sin, pid, M, K, N, stride_xm, stride_xh, stride_wh, stride_wk, stride_wn, stride_om,
                  stride_oh, stride_c, col_tiles, row_blocks, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, QUERY: tl.constexpr, R: tl.constexpr, DOT_F32: tl.constexpr):
    """Product program ``pid``: a ``[BLOCK_M, BLOCK_N]`` tile of one head's product (with ``QUERY``, the first
    column tile also rotates the head's ``q_pe``)."""
    rb = pid % row_blocks
    ct = (pid // row_blocks) % col_tiles
    h = pid // (row_blocks * col_tiles)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = ct * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    r64 = rows.to(tl.int64)
    px = X + r64[:, None] * stride_xm + h * stride_xh + kk[None, :]
    pw = W + h * stride_wh + kk[:, None] * stride_wk + cols[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + kk) < K
        xt = tl.load(px, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(pw, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if DOT_F32:
            acc = tl.dot(xt.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, wt, acc)
        px += BLOCK_K
        pw += BLOCK_K * stride_wk
    po = Out + r64[:, None] * stride_om + h * stride_oh
    tl.store(po + cols[None, :], acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if QUERY:
        if ct == 0:  # the head's q_pe, rotated, after its N product columns
            pe = _rope_rows(X + h * stride_xh + K, stride_xm, rows, row_ok, Cos, Sin, stride_c, R)
            tl.store(po + N + tl.arange(0, R)[None, :], pe.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _latent_rows(Lat, NormW, Cos, Sin, KV, PageTable, KvLens, TreeLens, lp, M, N, stride_lm, stride_c, stride_kp,
                 stride_ks, stride_ptb, max_pages, num_pages, T, eps, R: tl.constexpr, C_PAD: tl.constexpr,
                 ROWS_L: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Latent program ``lp``: ``ROWS_L`` rows' RMSNorm and ``k_pe`` rotation, written into the paged pool (real
    rows only)."""
    rows = lp * ROWS_L + tl.arange(0, ROWS_L)
    row_ok = rows < M
    b = tl.where(row_ok, rows // T, 0)
    t = rows % T
    ok = row_ok & (t < tl.load(TreeLens + b, mask=row_ok, other=0))
    c = tl.arange(0, C_PAD)
    c_ok = c < N
    r64 = rows.to(tl.int64)
    ckv = tl.load(Lat + r64[:, None] * stride_lm + c[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
    ckv = ckv.to(tl.float32)
    inv = tl.rsqrt(tl.sum(ckv * ckv, 1) / N + eps)
    g = tl.load(NormW + c, mask=c_ok, other=0.0).to(tl.float32)
    ckv = ckv * inv[:, None] * g[None, :]
    kpe = _rope_rows(Lat + N, stride_lm, rows, ok, Cos, Sin, stride_c, R)
    pos = tl.load(KvLens + b, mask=row_ok, other=0) + t
    dst = _row_offsets(PageTable, b.to(tl.int64) * stride_ptb, pos, ok, max_pages, num_pages, stride_kp, stride_ks,
                       PAGE_SIZE)
    pk = KV + dst[:, None]
    tl.store(pk + c[None, :], ckv.to(KV.dtype.element_ty), mask=ok[:, None] & c_ok[None, :])
    tl.store(pk + N + tl.arange(0, R)[None, :], kpe.to(KV.dtype.element_ty), mask=ok[:, None])


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MlaConfig:
    """Launch configuration of :func:`_mla_kernel`: ``block_m`` rows, ``block_n`` output columns and ``block_k``
    reduced channels a product program (each >= 16, powers of two); ``num_warps``; ``rows_l`` rows a latent
    program."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    rows_l: int = 4


# Row bucket -> config: a launch of M rows takes the first bucket >= M (else the largest). At decode one row block
# covers the tree's rows, so each head's weight (~128 KB) is read once; 32-column tiles give H x C / 32 programs
# (128 for mla_query_ at 8 heads, 32 for mla_output). Bounded by the ahead-of-time audit (sm_120: 101,376 B of
# shared memory, no spills).
MLA_CONFIGS: dict[str, dict[int, MlaConfig]] = {
    "sm_90": {32: MlaConfig(32, 32, 64, 4), 1 << 30: MlaConfig(64, 32, 64, 4)},
    "sm_120": {32: MlaConfig(32, 32, 64, 4), 1 << 30: MlaConfig(64, 32, 64, 4)},
    "sm_80": {32: MlaConfig(32, 32, 64, 4), 1 << 30: MlaConfig(64, 32, 64, 4)},
    # Interpreter: few, large programs (each interpreted operation costs the same at any tile size).
    "cpu": {1 << 30: MlaConfig(32, 64, 64, 4, rows_l=16)},
}


@dataclass(frozen=True)
class MlaPlan:
    """A launch: the config and the grid's parts (``heads x col_tiles x row_blocks`` product programs, then
    ``latent_programs``)."""

    config: MlaConfig
    col_tiles: int
    row_blocks: int
    latent_programs: int

    def grid(self, heads: int) -> tuple[int, int, int]:
        return (heads * self.col_tiles * self.row_blocks + self.latent_programs, 1, 1)

    def as_ints(self) -> list[int]:
        c = self.config
        return [c.block_m, c.block_n, c.block_k, c.num_warps, c.rows_l, self.col_tiles, self.row_blocks,
                self.latent_programs]

    @classmethod
    def from_ints(cls, v) -> "MlaPlan":
        v = [int(a) for a in v]
        return cls(MlaConfig(*v[:5]), *v[5:8])


def config_for(arch: str, M: int) -> MlaConfig:
    """The table's config for ``M`` rows (:func:`tritree.kernels.configs.lookup`)."""
    return lookup(MLA_CONFIGS, arch, M)


@functools.lru_cache(maxsize=256)
def plan_mla(M: int, N: int, arch: str, query: bool) -> MlaPlan:
    """The plan of ``M`` rows and ``N`` product columns a head (``query``: with the latent programs)."""
    cfg = config_for(arch, M)
    return MlaPlan(cfg, -(-N // cfg.block_n), max(1, -(-M // cfg.block_m)), -(-M // cfg.rows_l) if query else 0)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _validate_query(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, T, eps, out):
    V.check_tensor("q", q, ndim=3, dtypes=DTYPES)
    dev = q.device
    M, H, D = q.shape
    V.check_tensor("w_uk", w_uk, ndim=3, dtypes=DTYPES, device=dev, last_contiguous=False)
    if w_uk.shape[0] != H or w_uk.shape[1] >= D:
        raise ValueError(f"w_uk must have shape [H, nope, C] with H = {H} (q's heads) and nope < {D} (q's channels), "
                         f"got {tuple(w_uk.shape)}")
    nope, C = w_uk.shape[1], w_uk.shape[2]
    R = D - nope
    if R < 2 or R % 2 or R & (R - 1):
        raise ValueError(f"q's rope channels (q's {D} minus w_uk's nope = {nope}) must be an even power of two, "
                         f"got {R}")
    V.check_tensor("latent", latent, ndim=2, dtypes=DTYPES, device=dev)
    V.check_shape("latent", latent, (M, C + R), "[M, C + R]")
    V.check_tensor("norm_weight", norm_weight, ndim=1, dtypes=DTYPES, device=dev)
    V.check_shape("norm_weight", norm_weight, (C,), "[C]")
    for name, t in (("cos", cos), ("sin", sin)):
        V.check_tensor(name, t, ndim=2, dtypes=DTYPES, device=dev)
        V.check_shape(name, t, (M, R), "[M, R]")
    pool = _pool(kv, False)
    if pool.token_shape != (C + R,):
        raise ValueError(f"kv must have tokens of C + R = {C + R} channels, got token shape {pool.token_shape}")
    if kv.stride(-1) != 1:
        raise ValueError(f"kv must be contiguous in its last dimension, got strides {tuple(kv.stride())}")
    T = V.check_int("rows_per_request", T, 1)
    if M % T:
        raise ValueError(f"q's M = {M} rows must be a multiple of rows_per_request = {T}")
    B = M // T
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("page_table", page_table, (B, page_table.shape[1]), "[B, max_pages] (B = M / rows_per_request)")
    V.check_shape("kv_lens", kv_lens, (B,), "[B] (B = M / rows_per_request)")
    if tree_lens is not None:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
        V.check_shape("tree_lens", tree_lens, (B,), "[B] (B = M / rows_per_request)")
    V.check_float("eps", eps, lo=0.0)
    if out is not None:
        V.check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=dev)
        V.check_shape("out", out, (M, H, C + R), "[M, H, C + R]")
    return pool, B, C, R


def _validate_output(o, w_uv, out):
    V.check_tensor("o", o, ndim=3, dtypes=DTYPES)
    M, H, C = o.shape
    V.check_tensor("w_uv", w_uv, ndim=3, dtypes=DTYPES, device=o.device, last_contiguous=False)
    if w_uv.shape[0] != H or w_uv.shape[2] != C:
        raise ValueError(f"w_uv must have shape [H, V, C] with H = {H} and C = {C} (o's), got {tuple(w_uv.shape)}")
    if out is not None:
        V.check_tensor("out", out, ndim=2, dtypes=(o.dtype,), device=o.device)
        V.check_shape("out", out, (M, H * w_uv.shape[1]), "[M, H V]")


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def _constexprs(plan: MlaPlan, dtype, query: bool, R: int, C: int, page_size: int, signal: bool) -> dict:
    c = plan.config
    return dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, QUERY=query, R=R,
                C_PAD=triton.next_power_of_2(C), ROWS_L=c.rows_l, PAGE_SIZE=page_size,
                DOT_F32=interpreting() or dtype == torch.float32, SIGNAL=signal)


def _query_args(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, T, eps, out, plan):
    M, H, _ = q.shape
    nope, C = w_uk.shape[1], w_uk.shape[2]
    pool = _pool(kv, False)
    return (q, w_uk, out, latent, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
            M, nope, C, H, q.stride(0), q.stride(1), w_uk.stride(0), w_uk.stride(1), w_uk.stride(2),
            out.stride(0), out.stride(1), latent.stride(0), cos.stride(0), kv.stride(-3), kv.stride(-2),
            page_table.stride(0), page_table.shape[1], pool.num_pages, T, plan.col_tiles, plan.row_blocks,
            float(eps))


def _output_args(o, w_uv, out, plan):
    M, H, C = o.shape
    Vd = w_uv.shape[1]
    # W_UV as the product's [k = C, n = V] operand: element (h, c, v) at h s0 + c s2 + v s1.
    return (o, w_uv, out, o, o, o, o, o, o, o, o,
            M, C, Vd, H, o.stride(0), o.stride(1), w_uv.stride(0), w_uv.stride(2), w_uv.stride(1),
            out.stride(0), Vd, 0, 0, 0, 0, 0, 1, 1, 1, plan.col_tiles, plan.row_blocks, 0.0)


def _launch_kernel(args, plan, H, constexprs, launcher=None):
    """One launch of :func:`_mla_kernel` for either op (``args``: :func:`_query_args` or :func:`_output_args`),
    through a bound ``launcher`` or else the JIT with ``constexprs``."""
    if launcher is not None:
        launcher(plan.grid(H), *args)
    else:
        _mla_kernel[plan.grid(H)](*args, **constexprs, num_warps=plan.config.num_warps)


class _QueryPlan:
    """mla_query_ for one static signature: validated, planned, kernel bound once."""

    def __init__(self, q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, T, eps, out):
        pool, self.B, C, R = _validate_query(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens,
                                             tree_lens, T, eps, out)
        self.geometry = (pool.num_pages, pool.page_size)
        self.T, self.eps = T, eps
        self.kernel = uses_kernel(q.device)
        if not self.kernel:
            return
        M, H, _ = q.shape
        self.plan = plan_mla(M, C, arch_of(q.device), True)
        self.H = H
        self._launcher = KernelLauncher(_mla_kernel, _constexprs(self.plan, q.dtype, True, R, C, pool.page_size,
                                                                 write_signals(q.device)),
                                        num_warps=self.plan.config.num_warps)

    def run(self, q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, out):
        M, H, _ = q.shape
        if out is None:
            out = torch.empty(M, H, w_uk.shape[2] + cos.shape[1], dtype=q.dtype, device=q.device)
        if V.checks_values(q.device):
            _check_values(self.geometry, page_table, kv_lens, tree_lens, self.B, self.T)
        if not self.kernel:
            out.copy_(mla_query_reference(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
                                          rows_per_request=self.T, eps=self.eps, dtype=_ref_dtype(q)))
            return out
        if M == 0:
            return out
        if tree_lens is None:
            tree_lens = full_lengths(self.B, self.T, q.device)
        _launch_kernel(_query_args(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, self.T,
                                  self.eps, out, self.plan), self.plan, H, None, self._launcher)
        return out


def _ref_dtype(t: torch.Tensor) -> torch.dtype:
    """The CPU path's compute dtype: float32 for 16-bit inputs, else the inputs' own."""
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def _check_values(geometry, page_table, kv_lens, tree_lens, B, T):
    num_pages, page_size = geometry
    if tree_lens is not None:
        V.check_value_range("tree_lens", tree_lens, 0, T, f" (rows_per_request = {T})")
    n = torch.full((B,), T) if tree_lens is None else tree_lens.cpu()
    V.check_paged_lengths(page_table, num_pages, page_size, kv_lens, n)


class _OutputPlan:
    """mla_output for one static signature."""

    def __init__(self, o, w_uv, out):
        _validate_output(o, w_uv, out)
        self.kernel = uses_kernel(o.device)
        if not self.kernel:
            return
        M, H, C = o.shape
        self.plan = plan_mla(M, w_uv.shape[1], arch_of(o.device), False)
        self._launcher = KernelLauncher(_mla_kernel, _constexprs(self.plan, o.dtype, False, 2, C, 1, False),
                                        num_warps=self.plan.config.num_warps)

    def run(self, o, w_uv, out):
        M, H, _ = o.shape
        if out is None:
            out = torch.empty(M, H * w_uv.shape[1], dtype=o.dtype, device=o.device)
        if not self.kernel:
            out.copy_(mla_output_reference(o, w_uv, dtype=_ref_dtype(o)))
            return out
        if M:
            _launch_kernel(_output_args(o, w_uv, out, self.plan), self.plan, H, None, self._launcher)
        return out


_QUERY_PLANS = PlanCache("mla_query_", _QueryPlan)
_OUTPUT_PLANS = PlanCache("mla_output", _OutputPlan)


def mla_query_(q: torch.Tensor, latent: torch.Tensor, w_uk: torch.Tensor, norm_weight: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
               tree_lens: torch.Tensor | None = None, *, rows_per_request: int, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The absorbed query of verify attention and the rows' cache latents, in one launch (writes ``kv``).

    Args:
        q: ``[M, H, nope + R]`` bf16/fp16/fp32 query projection rows (``q_b_proj``'s output; any M and H strides).
        latent: ``[M, C + R]`` the latent projection rows (``kv_a_proj_with_mqa``'s output: ``c_kv`` then
            ``k_pe``; any row stride), q's dtype family.
        w_uk: ``[H, nope, C]`` ``kv_b_proj``'s key rows of the local heads (any strides).
        norm_weight: ``[C]`` ``kv_a_layernorm``'s weight. eps: its epsilon.
        cos, sin: ``[M, R]`` the rows' RoPE tables (halves layout, ``sin``'s first half negated).
        kv: ``[num_pages, P, C + R]`` the layer's latent pool (any page and slot strides), any KV dtype.
        page_table: ``[B, max_pages]`` int32, kv_lens: ``[B]`` int32, tree_lens: ``[B]`` int32 or None (all rows
            real), with ``M = B rows_per_request``: row ``m`` is request ``m // T``'s node ``m % T``.
        out: optional ``[M, H, C + R]`` destination in q's dtype.

    Returns ``out`` (or a new tensor): ``[q_nope @ w_uk, rope(q_pe)]`` per head, the query of
    :func:`tritree.kernels.verify_mla`. Writes ``[rmsnorm(c_kv) * norm_weight, rope(k_pe)]`` (cast to kv's dtype)
    at position ``kv_lens[b] + t`` for ``t < tree_lens[b]`` (:func:`tritree.kernels.kv_write_`'s semantics).
    Semantics :func:`mla_query_reference`'s; one kernel launch on CUDA (and under ``TRITON_INTERPRET=1``), no host
    sync; other devices run the reference in float32."""
    if eager():
        try:
            key = (signature(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, out),
                   (type(rows_per_request), rows_per_request), (type(eps), eps))
            hash(key)
        except (AttributeError, TypeError):
            _validate_query(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
                            rows_per_request, eps, out)
            raise
        return _QUERY_PLANS.get(key, q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
                                rows_per_request, eps, out).run(q, latent, w_uk, norm_weight, cos, sin, kv, page_table,
                                                                kv_lens, tree_lens, out)
    _validate_query(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, rows_per_request, eps,
                    out)
    M, H, _ = q.shape
    if out is None:
        out = q.new_empty(M, H, w_uk.shape[2] + cos.shape[1])
    if not uses_kernel(q.device):
        out.copy_(mla_query_reference(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
                                      rows_per_request=rows_per_request, eps=eps, dtype=_ref_dtype(q)))
        return out
    if tree_lens is None:
        tree_lens = full_lengths(M // rows_per_request, rows_per_request, q.device)
    plan = plan_mla.__wrapped__(M, w_uk.shape[2], arch_of(q.device), True)
    _mla_query_op(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens, out, plan.as_ints(),
                  rows_per_request, float(eps))
    return out


def mla_output(o: torch.Tensor, w_uv: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The attention's latent output through ``kv_b_proj``'s value rows, per head, in one launch.

    Args:
        o: ``[M, H, C]`` bf16/fp16/fp32 (any M and H strides; :func:`tritree.kernels.verify_mla`'s output).
        w_uv: ``[H, V, C]`` the local heads' value rows (any strides).
        out: optional ``[M, H V]`` destination in o's dtype (any row stride).

    Returns ``out`` (or a new tensor): ``out[m, h V + v] = o[m, h] . w_uv[h, v]`` (fp32 sums), ``o_proj``'s input.
    One kernel launch on CUDA (and under ``TRITON_INTERPRET=1``), no host sync; other devices run the reference
    in float32."""
    if eager():
        try:
            key = signature(o, w_uv, out)
        except AttributeError:
            _validate_output(o, w_uv, out)
            raise
        return _OUTPUT_PLANS.get(key, o, w_uv, out).run(o, w_uv, out)
    _validate_output(o, w_uv, out)
    M, H, _ = o.shape
    if not uses_kernel(o.device):
        return mla_output_reference(o, w_uv, dtype=_ref_dtype(o))
    plan = plan_mla.__wrapped__(M, w_uv.shape[1], arch_of(o.device), False)
    if out is None:
        return _mla_output_op(o, w_uv, plan.as_ints())
    out.copy_(_mla_output_op(o, w_uv, plan.as_ints()))
    return out


# Opaque to torch.compile: the query op writes the pool through a page table.
@torch.library.custom_op("tritree::mla_query_", mutates_args=("kv", "out"))
def _mla_query_op(q: torch.Tensor, latent: torch.Tensor, w_uk: torch.Tensor, norm_weight: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor,
                  kv_lens: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, plan: list[int],
                  rows_per_request: int, eps: float) -> None:
    p = MlaPlan.from_ints(plan)
    if q.shape[0] == 0:
        return
    cx = _constexprs(p, q.dtype, True, cos.shape[1], w_uk.shape[2], _pool(kv, False).page_size,
                     write_signals(q.device))
    _launch_kernel(_query_args(q, latent, w_uk, norm_weight, cos, sin, kv, page_table, kv_lens, tree_lens,
                              rows_per_request, eps, out, p), p, q.shape[1], cx)


@torch.library.custom_op("tritree::mla_output", mutates_args=())
def _mla_output_op(o: torch.Tensor, w_uv: torch.Tensor, plan: list[int]) -> torch.Tensor:
    p = MlaPlan.from_ints(plan)
    M, H, C = o.shape
    out = o.new_empty(M, H * w_uv.shape[1])
    if M:
        _launch_kernel(_output_args(o, w_uv, out, p), p, H, _constexprs(p, o.dtype, False, 2, C, 1, False))
    return out


@_mla_output_op.register_fake
def _(o, w_uv, plan):
    return o.new_empty(o.shape[0], o.shape[1] * w_uv.shape[1])
