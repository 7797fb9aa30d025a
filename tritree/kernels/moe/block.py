"""The MoE block of a decode layer: post-attention RMSNorm, router, INT4 routed experts, shared expert and the
residual add, in five launches.

``moe_block(residual, ...) = residual + routed(xn) + shared(xn)`` with ``xn = rms_norm(residual)``. On an sm_90 /
sm_120 GPU with experts in the ``"mma"`` layout (:func:`tritree.kernels.kernel_layout`) and decode row counts:

1. ``_block_norm_kernel``: ``xn`` (natural order, for the router, and :func:`int4_mma.mma_order` for the
   experts), the fp32 output accumulator set to the residual;
2. the router (:func:`tritree.kernels.moe_route`'s kernel);
3. the routing align (:func:`tritree.kernels.moe.align.align_routing`);
4. gate_up: the shared expert over every token (its bf16/fp16 weights ``[gate; up]`` concatenated,
   ``[2 Is, H]``) and, as a second class of programs in the same grid, one wave of programs that take the routed
   experts' work in chunks from a queue (they end together whatever the routing; ``int4_mma.CHUNK_PAIRS``);
5. down: both classes again, summed by atomics into the accumulator (a routed program streams several output
   column tiles when the experts are narrow: ``Int4MmaPlan.down_cols``); the last program of each column group
   to arrive writes the new hidden state in the residual's dtype (the blocks that own no rows exit without
   arriving: the align counts those that do).

A shared expert too large for its programs' row-block re-reads (:data:`SHARED_REREAD_BYTES`: a whole K2.6 shared
expert on one GPU; the tensor-parallel slice of a rank stays in the grids) runs instead as two cuBLAS GEMMs with
SiLU-and-mul between, added to the accumulator before step 3.

Elsewhere (the CPU, experts in the checkpoint layout, float32 activations, prefill row counts, shared sizes
that are not multiples of 128) the same semantics run as the composition of the ops (norm, :func:`moe_route`,
:func:`routed_experts_int4`, two ``F.linear``). The arrival counters and the fp32 workspace of partial sums
are :func:`tritree.kernels._launch.arrival_counters` and :func:`~tritree.kernels._launch.zeroed_workspace` (one
buffer each per device, left zeroed by every launch): concurrent calls on different CUDA streams of one device are
not supported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import _validate as V
from .._launch import zeroed_workspace
from ..configs import arch_of, num_sms
from . import router as R
from .int4 import Int4Experts, moe_int4_reference, routed_experts_int4
from .router import RoutePlan, moe_route, moe_route_reference, plan_moe_route

# Row counts up to this run the fused launches (decode, verify, draft); more rows (prefill) the composition,
# whose shared expert is a cuBLAS GEMM: the fused shared-expert programs hold no weight tile in shared memory
# and re-read it for every block of rows.
MAX_FUSED_ROWS = 256


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def _norm(residual, norm_weight, eps):
    """``rms_norm(residual) * norm_weight`` in the residual's dtype: a weight of that dtype applied before the one
    rounding (as the kernel), another dtype after (``tritree.model.layers.rms_norm``)."""
    H = residual.shape[-1]
    if norm_weight.dtype == residual.dtype:
        return F.rms_norm(residual, (H,), norm_weight, eps)
    return (norm_weight * F.rms_norm(residual, (H,), eps=eps)).to(residual.dtype)


def moe_block_reference(residual, norm_weight, router_weight, router_bias, experts: Int4Experts, shared_gate_up,
                        shared_down, *, eps, top_k, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0,
                        expert_offset=0, tree_lens=None, rows_per_request=None, add_residual=True,
                        dtype=torch.float64) -> torch.Tensor:
    """The specification, returned in ``dtype``: ``xn`` = the RMSNorm rounded to the residual's dtype (computed
    in float32); the routing :func:`moe_route_reference` on ``xn`` in float32; the routed experts
    (:func:`moe_int4_reference`; W4A16: on ``xn`` in bf16 when the residual is float32), the shared expert ``silu(xn Wg^T) * (xn Wu^T) Wd^T`` and the residual in
    ``dtype``."""
    xn = _norm(residual.float(), norm_weight.float(), eps).to(residual.dtype)
    idx, w = moe_route_reference(xn, router_weight, router_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                                 norm_topk_prob=norm_topk_prob, scaling=scaling, expert_offset=expert_offset,
                                 tree_lens=tree_lens, rows_per_request=rows_per_request, dtype=torch.float32)
    xa = xn if xn.dtype in (torch.bfloat16, torch.float16) else xn.to(torch.bfloat16)  # W4A16: 16-bit activations
    out = moe_int4_reference(xa, idx, w, experts, dtype)
    Is = shared_down.shape[1]
    x = xn.to(dtype)
    gu = shared_gate_up.to(dtype)
    out = out + (F.silu(x @ gu[:Is].t()) * (x @ gu[Is:].t())) @ shared_down.to(dtype).t()
    return out + residual.to(dtype) if add_residual else out


# --------------------------------------------------------------------------------------------------
# The norm kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _block_norm_kernel(Res, NormW, Xn, Xm, Acc, H, eps, stride_r, stride_n, stride_m, stride_a,
                       RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
    """Grid ``(N,)``. Program ``r``: ``xn = Res[r] / rms(Res[r]) * NormW`` (fp32, one rounding) into ``Xn[r]`` and,
    in :func:`int4_mma.mma_order`, ``Xm[r]``; ``Acc[r]`` (fp32) = ``Res[r]`` (``RESIDUAL``) or 0."""
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK_H)
    ok = c < H
    r64 = r.to(tl.int64)
    x = tl.load(Res + r64 * stride_r + c, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
    y = (x * rstd * tl.load(NormW + c, mask=ok, other=0.0).to(tl.float32)).to(Xn.dtype.element_ty)
    tl.store(Xn + r64 * stride_n + c, y, mask=ok)
    t = c % 128
    tl.store(Xm + r64 * stride_m + c - t + 32 * ((t // 2) % 4) + 4 * (t // 16) + 2 * ((t // 8) % 2) + t % 2, y,
             mask=ok)
    if RESIDUAL:
        tl.store(Acc + r64 * stride_a + c, x, mask=ok)
    else:
        tl.store(Acc + r64 * stride_a + c, tl.zeros([BLOCK_H], tl.float32), mask=ok)


# --------------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------------

# The shared expert's programs run each block of rows against their weight rows, re-read from L2 after the first
# block: up to this many bytes of re-reads (the shared weights times the row blocks) it runs in the expert
# kernels' grids; above (a whole shared expert on one GPU, many rows) as cuBLAS GEMMs added to the accumulator.
SHARED_REREAD_BYTES = 128 << 20


@dataclass(frozen=True)
class MoeBlockPlan:
    """One shape's fused launches, from static shapes only.

    route: the router's :class:`tritree.kernels.RoutePlan`; experts: the ``Int4MmaPlan`` of the routed experts
    (``int4_mma.plan_int4_mma``), whose block size the shared expert's programs share; shared_splits: the
    shared expert's gate_up and down K splits (``int4_mma.plan_shared_splits``)."""

    route: RoutePlan
    experts: object
    shared_splits: tuple[int, int]

    def as_ints(self) -> list[int]:
        return self.route.as_ints() + self.experts.as_ints() + list(self.shared_splits)

    @classmethod
    def from_ints(cls, v) -> "MoeBlockPlan":
        from .int4_mma import Int4MmaPlan

        v = [int(a) for a in v]
        return cls(RoutePlan.from_ints(v[:12]), Int4MmaPlan.from_ints(v[12:17]), (v[17], v[18]))


@functools.lru_cache(maxsize=1024)
def plan_moe_block(N: int, H: int, router_experts: int, E: int, I: int, I_shared: int, dtype: torch.dtype,
                   router_dtype: torch.dtype, top_k: int, n_group: int, topk_group: int, arch: str,
                   sms: int) -> MoeBlockPlan:
    """The router's plan (:func:`plan_moe_route` over all ``router_experts``), the experts' (``plan_int4_mma``:
    ``E`` local experts of intermediate size ``I``) and the shared expert's split (intermediate ``I_shared``)
    for ``N`` rows."""
    from .int4_mma import plan_int4_mma, plan_shared_splits

    experts = plan_int4_mma(N, top_k, E, H, I, sms, router_experts)
    in_grid = -(-N // experts.block_m) * 3 * I_shared * H * 2 <= SHARED_REREAD_BYTES
    return MoeBlockPlan(plan_moe_route(N, H, router_experts, dtype, router_dtype, top_k, n_group, topk_group, arch,
                                       sms),
                        experts, plan_shared_splits(H, I_shared, sms) if in_grid else (0, 0))


# --------------------------------------------------------------------------------------------------
# Validation, dispatch, launch
# --------------------------------------------------------------------------------------------------

def _validate(residual, norm_weight, router_weight, router_bias, experts, shared_gate_up, shared_down, eps, top_k,
              n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens, rows_per_request, add_residual,
              out, plan):
    V.check_tensor("residual", residual, ndim=2, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    dev = residual.device
    N, H = residual.shape
    V.check_tensor("norm_weight", norm_weight, ndim=1, dtypes=(torch.bfloat16, torch.float16, torch.float32),
                   device=dev)
    V.check_shape("norm_weight", norm_weight, (H,), "[H]")
    if not isinstance(experts, Int4Experts):
        raise TypeError(f"experts must be an Int4Experts, got {type(experts).__name__}")
    if experts.hidden != H:
        raise ValueError(f"experts have hidden size {experts.hidden}, residual {tuple(residual.shape)} has {H}")
    if experts.w13_packed.device != dev:
        raise ValueError(f"experts must be on {dev} (residual's device), got {experts.w13_packed.device}")
    for name, t in (("shared_gate_up", shared_gate_up), ("shared_down", shared_down)):
        V.check_tensor(name, t, ndim=2, dtypes=(torch.bfloat16, torch.float16, torch.float32), device=dev)
    Is = shared_down.shape[1] if shared_down.ndim == 2 else 0
    if Is < 1:
        raise ValueError(f"shared_down must have shape [H, Is] with Is >= 1, got {tuple(shared_down.shape)}")
    V.check_shape("shared_down", shared_down, (H, Is), "[H, Is]")
    V.check_shape("shared_gate_up", shared_gate_up, (2 * Is, H), "[2 Is, H] (gate rows, then up rows)")
    V.check_float("eps", eps, lo=0.0)
    if not isinstance(add_residual, bool):
        raise TypeError(f"add_residual must be a bool, got {type(add_residual).__name__} {add_residual!r}")
    if out is not None:
        V.check_tensor("out", out, dtypes=(residual.dtype,), device=dev)
        V.check_shape("out", out, (N, H), "[N, H]")
    if plan is not None and not isinstance(plan, MoeBlockPlan):
        raise TypeError(f"plan must be a MoeBlockPlan, got {type(plan).__name__}")
    R._validate(residual, router_weight, router_bias, top_k, n_group, topk_group, norm_topk_prob, scaling,
                expert_offset, tree_lens, rows_per_request, None, None,
                names=("residual", "router_weight", "router_bias"))


def fused_ok(residual, experts: Int4Experts, shared_gate_up, shared_down) -> bool:
    """Whether :func:`moe_block` runs its fused launches for these operands (see the module)."""
    from . import int4_mma as M

    dt = residual.dtype
    return (residual.device.type == "cuda" and experts.layout == "mma" and dt in (torch.bfloat16, torch.float16)
            and residual.shape[0] <= MAX_FUSED_ROWS and M.shape_ok(experts.hidden, experts.intermediate)
            and shared_gate_up.dtype == dt and shared_down.dtype == dt and shared_down.shape[1] % 128 == 0
            and shared_gate_up.is_contiguous() and shared_down.is_contiguous() and residual.stride(1) == 1)


def moe_block(residual: torch.Tensor, norm_weight: torch.Tensor, router_weight: torch.Tensor,
              router_bias: torch.Tensor | None, experts: Int4Experts, shared_gate_up: torch.Tensor,
              shared_down: torch.Tensor, *, eps: float, top_k: int, n_group: int = 1, topk_group: int = 1,
              norm_topk_prob: bool = True, scaling: float = 1.0, expert_offset: int = 0,
              tree_lens: torch.Tensor | None = None, rows_per_request: int | None = None, add_residual: bool = True,
              out: torch.Tensor | None = None, plan: MoeBlockPlan | None = None) -> torch.Tensor:
    """A DeepSeek-V3 / Kimi K2 MoE block with INT4 routed experts: ``residual + routed(xn) + shared(xn)``,
    ``xn = rms_norm(residual) * norm_weight`` (see module).

    Args:
        residual: ``[N, H]`` bf16/fp16/fp32 hidden states before the post-attention norm (last dim contiguous).
        norm_weight: ``[H]`` the post-attention RMSNorm weight; eps: its epsilon.
        router_weight, router_bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
            rows_per_request: the router's (:func:`tritree.kernels.moe_route`): ``router_weight [E, H]`` over all
            experts, ids outside ``[0, experts.num_experts)`` after the offset are another rank's; padding rows
            route to no expert.
        experts: the rank's routed experts (:class:`tritree.kernels.Int4Experts`, either layout).
        shared_gate_up: ``[2 Is, H]`` the shared expert's gate rows then up rows; shared_down: ``[H, Is]`` (the
            rank's slice under tensor parallelism).
        add_residual: False returns the MoE output alone (tensor-parallel ranks other than the one that adds the
            residual before the all-reduce).
        out: optional ``[N, H]`` of the residual's dtype to write (not the residual itself).
        plan: a :class:`MoeBlockPlan` replacing :func:`plan_moe_block`'s.

    Returns ``[N, H]`` in the residual's dtype. No host sync (CUDA-graph capturable once warm). The fused path
    runs as the op ``tritree::moe_block`` (opaque to torch.compile, with a fake impl)."""
    _validate(residual, norm_weight, router_weight, router_bias, experts, shared_gate_up, shared_down, eps, top_k,
              n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens, rows_per_request, add_residual,
              out, plan)
    if out is not None and out.numel() and out.data_ptr() == residual.data_ptr():
        raise ValueError("out must not be residual (the norm reads it while the block writes)")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (residual, norm_weight, router_weight,
                                                                            shared_gate_up, shared_down))
    if needs_grad or not fused_ok(residual, experts, shared_gate_up, shared_down):
        res = _composed(residual, norm_weight, router_weight, router_bias, experts, shared_gate_up, shared_down, eps,
                        top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens, rows_per_request,
                        add_residual)
        return res if out is None else out.copy_(res)
    N, H = residual.shape
    if plan is None:
        planner = plan_moe_block.__wrapped__ if torch.compiler.is_compiling() else plan_moe_block
        plan = planner(N, H, router_weight.shape[0], experts.num_experts, experts.intermediate,
                       shared_down.shape[1], residual.dtype, router_weight.dtype, top_k, n_group, topk_group, arch_of(residual.device),
                       num_sms(residual.device))
    else:
        from . import int4_mma as M

        M.check_plan(plan.experts, H, experts.intermediate, N * top_k, experts.num_experts)
        for split, K in zip(plan.shared_splits, (H, shared_down.shape[1])) if plan.shared_splits != (0, 0) else ():
            if split < 1 or (K // M.KT) % split:
                raise ValueError(f"plan.shared_splits = {plan.shared_splits}: each must divide the K tiles of "
                                 f"{M.KT} columns of the shared expert's gate_up ({H // M.KT}) and down "
                                 f"({shared_down.shape[1] // M.KT})")
    if out is None:
        out = torch.empty_like(residual)
    if N:
        _moe_block_op(residual, norm_weight, router_weight, router_bias, tree_lens, experts.w13_packed,
                      experts.w13_scale, experts.w2_packed, experts.w2_scale, shared_gate_up, shared_down, out,
                      plan.as_ints(), float(eps), top_k, n_group, topk_group, bool(norm_topk_prob), float(scaling),
                      expert_offset, rows_per_request if rows_per_request is not None else 0, bool(add_residual))
    return out


def _composed(residual, norm_weight, router_weight, router_bias, experts, shared_gate_up, shared_down, eps, top_k,
              n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens, rows_per_request, add_residual):
    """The block as the composition of the ops (the CPU, the checkpoint layout, prefill rows ...)."""
    xn = _norm(residual, norm_weight, eps)
    idx, w = moe_route(xn, router_weight, router_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                       norm_topk_prob=norm_topk_prob, scaling=scaling, expert_offset=expert_offset, tree_lens=tree_lens,
                       rows_per_request=rows_per_request)
    xa = xn if xn.dtype in (torch.bfloat16, torch.float16) else xn.to(torch.bfloat16)  # W4A16: 16-bit activations
    y = routed_experts_int4(xa, idx, w, experts, global_experts=router_weight.shape[0]).to(xn.dtype)
    Is = shared_down.shape[1]
    gu = F.linear(xn, shared_gate_up.to(xn.dtype))
    y = y + F.linear(F.silu(gu[:, :Is]) * gu[:, Is:], shared_down.to(xn.dtype))
    return residual + y if add_residual else y


# Opaque to torch.compile (as the MoE, router and tree ops): programs hand work to each other through counters
# and workspaces that Inductor's analysis of user kernels cannot follow.
@torch.library.custom_op("tritree::moe_block", mutates_args=("out",))
def _moe_block_op(residual: torch.Tensor, norm_weight: torch.Tensor, router_weight: torch.Tensor,
                  router_bias: torch.Tensor | None, tree_lens: torch.Tensor | None, w13_packed: torch.Tensor,
                  w13_scale: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor,
                  shared_gate_up: torch.Tensor, shared_down: torch.Tensor, out: torch.Tensor, plan: list[int],
                  eps: float, top_k: int, n_group: int, topk_group: int, norm_topk_prob: bool, scaling: float,
                  expert_offset: int, rows_per_request: int, add_residual: bool) -> None:
    _launch(residual, norm_weight, router_weight, router_bias, tree_lens, w13_packed, w13_scale, w2_packed, w2_scale,
            shared_gate_up, shared_down, out, MoeBlockPlan.from_ints(plan), eps, top_k, n_group, topk_group,
            norm_topk_prob, scaling, expert_offset, rows_per_request if tree_lens is not None else None, add_residual)


@_moe_block_op.register_fake
def _(residual, norm_weight, router_weight, router_bias, tree_lens, w13_packed, w13_scale, w2_packed, w2_scale,
      shared_gate_up, shared_down, out, plan, eps, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset,
      rows_per_request, add_residual):
    return None


def _launch(residual, norm_weight, router_weight, router_bias, tree_lens, w13, s13, w2, s2, shared_gate_up,
            shared_down, out, plan: MoeBlockPlan, eps, top_k, n_group, topk_group, norm, scaling, expert_offset,
            rows_per_request, add_residual) -> None:
    from . import int4_mma as M

    N, H = residual.shape
    dev = residual.device
    I, Is = w13.shape[1] // 2, shared_down.shape[1]
    xn = torch.empty_like(residual)
    xm = torch.empty_like(residual)
    acc = torch.empty(N, H, dtype=torch.float32, device=dev)
    # The split gate_up sums (the shared expert's [N, 2 Is], then the routed items' [N k, 2 I]) in the device's
    # zeroed workspace, which the expert kernels leave zeroed.
    n_shared = N * 2 * Is if plan.shared_splits[0] > 1 else 0
    work = zeroed_workspace(dev, n_shared + N * top_k * 2 * I)
    _block_norm_kernel[(N,)](
        residual, norm_weight, xn, xm, acc, H, float(eps), residual.stride(0), xn.stride(0), xm.stride(0),
        acc.stride(0), RESIDUAL=bool(add_residual), BLOCK_H=triton.next_power_of_2(H), num_warps=8)
    idx, w = R._launch(xn, router_weight, router_bias, tree_lens, None, plan.route, top_k, n_group, topk_group, norm,
                       scaling, expert_offset, rows_per_request)
    gs = work[:n_shared].view(N, 2 * Is) if n_shared else None
    gacc = work[n_shared:n_shared + N * top_k * 2 * I].view(N * top_k, 2 * I)
    shared = (shared_gate_up, shared_down, plan.shared_splits, gs)
    if plan.shared_splits == (0, 0):
        gu = F.linear(xn, shared_gate_up)
        acc.add_(F.linear(F.silu(gu[:, :Is]) * gu[:, Is:], shared_down))
        shared = None
    M.run_experts(xm, idx, w, w13, s13, w2, s2, acc, out, plan.experts, gacc, shared)
