"""Token rows from a vocabulary shard, one launch: ``embed_rows``.

Semantics (:func:`embed_rows_reference`, the specification): for ``table [R, H]`` holding the rows of token ids
``start .. start + rows - 1`` (``rows <= R``; the rest of the table, if any, is padding) and integer ``tokens
[...]``, ``out[..., :] = table[token - start] * scale`` where ``start <= token < start + rows``, zeros elsewhere.
Under vocabulary parallelism (:func:`tritree.dist.embed`) every rank looks up the tokens it holds and an
all-reduce adds the ranks' rows, exactly one rank contributing each; one process holds the whole table
(``start = 0``). ``scale`` is the DFlash draft's input embedding scale (1.0: a plain lookup).

One kernel (:func:`_embed_kernel`): a program copies ``BLOCK`` columns of one token's row (zeros for a token the
shard does not hold), times ``scale`` in float32, rounded once to the table's dtype. It replaces the composed
lookup's masks (the offset, two compares and their and, the clamp, the gather and the select: 8 launches) and the
scale's multiply. No host sync: CUDA-graph capturable. Calls that need gradients (training), and CPU calls without
Triton's interpreter, run the reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, eager, scalars, signature, uses_kernel
from .configs import arch_of, lookup

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOKEN_DTYPES = (torch.int32, torch.int64)


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def embed_rows_reference(table: torch.Tensor, tokens: torch.Tensor, start: int = 0, rows: int | None = None,
                         scale: float = 1.0) -> torch.Tensor:
    """The specification (module docstring) in PyTorch ops: ``[..., H]`` in the table's dtype (differentiable in
    ``table``)."""
    rows = table.shape[0] if rows is None else rows
    if table.shape[0] == 0:
        return table.new_zeros(*tokens.shape, table.shape[1])
    local = tokens.to(torch.int64) - start
    mine = (local >= 0) & (local < rows)
    x = torch.where(mine[..., None], table[local.clamp(0, table.shape[0] - 1)], 0)
    return x if scale == 1.0 else x * scale


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _embed_kernel(Table, Tokens, Out, start, rows, H, stride_t, stride_k, stride_o, scale, BLOCK: tl.constexpr,
                  SCALE: tl.constexpr):
    """Grid ``(M, cdiv(H, BLOCK))``: columns ``BLOCK j ..`` of token ``m``'s row. ``Table [R, H]`` and ``Out [M, H]``
    by their row strides (columns contiguous); ``Tokens [M]`` by its stride."""
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    local = tl.load(Tokens + m.to(tl.int64) * stride_k).to(tl.int64) - start
    mine = (local >= 0) & (local < rows)
    x = tl.load(Table + tl.where(mine, local, 0) * stride_t + cols, mask=cols < tl.where(mine, H, 0), other=0.0)
    if SCALE:
        x = x.to(tl.float32) * scale
    tl.store(Out + m.to(tl.int64) * stride_o + cols, x.to(Out.dtype.element_ty), mask=cols < H)


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbedConfig:
    """Launch configuration of :func:`_embed_kernel`: ``block`` columns a program, ``num_warps``."""

    block: int
    num_warps: int


# A row of 7,168 columns (K2.x) in 4 programs of 2,048 (16-byte loads of bf16 by 4 warps).
EMBED_CONFIGS: dict[str, dict[int, EmbedConfig]] = {
    "sm_90": {1 << 30: EmbedConfig(2048, 4)},
    "sm_120": {1 << 30: EmbedConfig(2048, 4)},
    "sm_80": {1 << 30: EmbedConfig(2048, 4)},
    "cpu": {1 << 30: EmbedConfig(4096, 4)},
}


@dataclass(frozen=True)
class EmbedPlan:
    config: EmbedConfig
    block: int


@functools.lru_cache(maxsize=256)
def plan_embed(M: int, H: int, arch: str) -> EmbedPlan:
    """``BLOCK`` columns a program: the config's, at most the row's (a power of two)."""
    cfg = lookup(EMBED_CONFIGS, arch, M)
    return EmbedPlan(cfg, min(cfg.block, triton.next_power_of_2(max(H, 1))))


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def _validate(table, tokens, start, rows, scale, out) -> None:
    V.check_tensor("table", table, ndim=2, dtypes=DTYPES)
    V.check_tensor("tokens", tokens, dtypes=TOKEN_DTYPES, device=table.device, last_contiguous=False)
    V.check_int("start", start, 0)
    if rows is not None:
        V.check_int("rows", rows, 0)
        if rows > table.shape[0]:
            raise ValueError(f"rows must be at most the table's {table.shape[0]} rows, got {rows}")
    V.check_float("scale", scale)
    if out is not None:
        V.check_tensor("out", out, dtypes=(table.dtype,), device=table.device)
        V.check_shape("out", out, (*tokens.shape, table.shape[1]), "[*tokens.shape, H]")
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {tuple(out.stride())}")


class _EmbedPlanLaunch:
    """embed_rows for one static signature: validated, planned, kernel bound once."""

    def __init__(self, table, tokens, start, rows, scale, out):
        _validate(table, tokens, start, rows, scale, out)
        self.start, self.rows, self.scale = int(start), table.shape[0] if rows is None else int(rows), float(scale)
        self.kernel = uses_kernel(table.device)
        if not self.kernel:
            return
        M, H = tokens.numel(), table.shape[1]
        self.plan = p = plan_embed(M, H, arch_of(table.device))
        self.grid = (M, triton.cdiv(H, p.block), 1)
        self._launcher = KernelLauncher(_embed_kernel, dict(BLOCK=p.block, SCALE=self.scale != 1.0),
                                        num_warps=p.config.num_warps)

    def run(self, table, tokens, out):
        if not self.kernel or (torch.is_grad_enabled() and table.requires_grad):  # the kernel has no backward
            ref = embed_rows_reference(table, tokens, self.start, self.rows, self.scale)
            return ref if out is None else out.copy_(ref)
        H = table.shape[1]
        if out is None:
            out = torch.empty(*tokens.shape, H, dtype=table.dtype, device=table.device)
        if tokens.numel() and H:
            flat = tokens.reshape(-1)  # a view where the dimensions merge (its stride fixed by the signature)
            self._launcher(self.grid, table, flat, out, self.start, self.rows, H, table.stride(0), flat.stride(0), H,
                           self.scale)
        return out


_PLANS = PlanCache("embed_rows", _EmbedPlanLaunch)


def embed_rows(table: torch.Tensor, tokens: torch.Tensor, *, start: int = 0, rows: int | None = None,
               scale: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of ``tokens`` from a table of token ids ``start .. start + rows - 1``, zeros for the others, times
    ``scale``, in one launch (module docstring).

    Args:
        table: ``[R, H]`` bf16/fp16/fp32 (any row stride, columns contiguous): the rows of ids ``start ..``.
        tokens: ``[...]`` int32/int64 token ids (any shape; flattened, a copy where the dimensions do not merge).
        start: the id of the table's first row (a vocabulary shard's offset). rows: the table's real rows
            (default ``R``: rows past it, e.g. a last shard's padding, are never read).
        scale: a factor of every row (float32 arithmetic, one rounding).
        out: optional contiguous ``[..., H]`` destination in the table's dtype.

    Returns ``out`` (or a new tensor) ``[*tokens.shape, H]`` in the table's dtype. Calls that need gradients, and CPU
    calls without Triton's interpreter, run the reference (differentiable). Eager calls run a plan cached per static
    signature (also under CUDA-graph capture); under torch.compile the op ``tritree::embed_rows``."""
    if eager():
        try:
            key = (signature(table, tokens, out), scalars(start, rows, scale))
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
            _validate(table, tokens, start, rows, scale, out)
            raise
        return _PLANS.get(key, table, tokens, start, rows, scale, out).run(table, tokens, out)
    _validate(table, tokens, start, rows, scale, out)
    rows = table.shape[0] if rows is None else rows
    if not uses_kernel(table.device) or (torch.is_grad_enabled() and table.requires_grad):
        res = embed_rows_reference(table, tokens, start, rows, scale)
    else:
        res = _embed_op(table, tokens, int(start), int(rows), float(scale))
    return res if out is None else out.copy_(res)


@torch.library.custom_op("tritree::embed_rows", mutates_args=())
def _embed_op(table: torch.Tensor, tokens: torch.Tensor, start: int, rows: int, scale: float) -> torch.Tensor:
    return embed_rows(table, tokens, start=start, rows=rows, scale=scale)  # the cached plans


@_embed_op.register_fake
def _(table, tokens, start, rows, scale):
    return table.new_empty(*tokens.shape, table.shape[1])
