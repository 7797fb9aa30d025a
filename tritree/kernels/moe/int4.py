"""Routed experts with INT4 weights kept packed (W4A16): grouped SwiGLU over 4-bit experts, without a host sync.

Layout (:class:`Int4Experts`): the compressed-tensors ``pack-quantized`` checkpoint layout (docs/SPEC.md
section 7), stacked per layer, gate and up concatenated on the output dimension:

- ``w13_packed`` int32 ``[E, 2I, H/8]``: rows ``[0, I)`` gate, ``[I, 2I)`` up; nibble ``j`` of word ``c``
  (least significant first) is input column ``8c + j``, stored as ``q + 8`` with ``q`` in ``[-8, 7]``;
- ``w13_scale`` bf16 ``[E, 2I, H/32]``: one scale a 32-column group; ``W = q * scale`` (no zero point);
- ``w2_packed`` int32 ``[E, H, I/8]`` and ``w2_scale`` bf16 ``[E, H, I/32]``: down, the same way.

0.5 B a weight plus a bf16 scale per 32 weights, as in the checkpoint (no repacking at load).

Kernels: experts in this layout run the Triton kernels of :mod:`tritree.kernels.moe.int4_triton` (the CPU
interpreter, GPUs other than sm_90 / sm_120); on sm_90 and sm_120 the experts are repacked once at load
(``layout="mma"``) for the Gluon ``mma.sync`` kernels of :mod:`tritree.kernels.moe.int4_mma`
(:func:`kernel_layout` says which). :func:`routed_experts_int4` is the one entry point of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import _validate as V
from .._launch import uses_kernel
from ..configs import arch_of, num_sms
from .align import min_blocks
from .int4_triton import Int4MoePlan, plan_int4_moe
from .int4_triton import launch as _launch_triton

GROUP = 32  # input columns per scale (compressed-tensors group size of the K2.x routed experts)
ACT_DTYPES = (torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------------------------------
# Layout: packing, stacking, sharding
# --------------------------------------------------------------------------------------------------

def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``q [..., out, in]`` integers in ``[-8, 7]`` -> ``[..., out, in/8]`` int32, column ``8c + j`` in bits
    ``4j .. 4j+3`` of word ``c``, stored as ``q + 8`` (the compressed-tensors packing)."""
    if q.shape[-1] % 8:
        raise ValueError(f"q's last dimension must be a multiple of 8, got {tuple(q.shape)}")
    u = (q.to(torch.int64) + 8).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    if bool(((u < 0) | (u > 15)).any()):
        raise ValueError("q must be in [-8, 7]")
    words = (u << (4 * torch.arange(8, device=q.device))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: ``[..., out, in/8]`` int32 -> ``[..., out, in]`` int8 in ``[-8, 7]``."""
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    u = (packed[..., None] >> shifts) & 0xF
    return (u - 8).to(torch.int8).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group quantisation as compressed-tensors does it: ``scale = amax / 7.5`` per ``group``
    input columns (rounded to bf16 first), ``q = clamp(round(w / scale), -8, 7)``. ``w [..., out, in]``
    -> ``(packed [..., out, in/8] int32, scale [..., out, in/group] bf16)``."""
    if w.shape[-1] % group:
        raise ValueError(f"w's last dimension ({w.shape[-1]}) must be a multiple of the group size {group}")
    g = w.float().reshape(*w.shape[:-1], w.shape[-1] // group, group)
    scale = (g.abs().amax(-1) / 7.5).clamp_min(1e-10).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).reshape(w.shape)
    return pack_int4(q), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """``[..., out, in]`` weights of ``packed [..., out, in/8]`` and ``scale [..., out, in/32]``."""
    q = unpack_int4(packed).to(torch.float64 if dtype == torch.float64 else torch.float32)
    return (q * scale.to(q.dtype).repeat_interleave(GROUP, dim=-1)).to(dtype)


LAYOUTS = ("checkpoint", "mma")


@dataclass(frozen=True)
class Int4Experts:
    """One layer's routed experts, INT4 (see the module docstring for the layout and shapes).

    ``w13_packed [E, 2I, H/8]`` int32, ``w13_scale [E, 2I, H/32]`` bf16 (gate rows then up rows),
    ``w2_packed [E, H, I/8]`` int32, ``w2_scale [E, H, I/32]`` bf16.

    ``layout``: ``"checkpoint"`` (the compressed-tensors order above) or ``"mma"``: the same shapes and bytes in
    the order the Hopper / sm_120 kernels stream (:func:`tritree.kernels.moe.int4_mma.repack_mma`; a lane's
    ``mma.sync`` fragments contiguous), made once at load by :meth:`to_layout` (:func:`kernel_layout` says which
    one a device runs)."""

    w13_packed: torch.Tensor
    w13_scale: torch.Tensor
    w2_packed: torch.Tensor
    w2_scale: torch.Tensor
    layout: str = "checkpoint"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def to_layout(self, layout: str) -> "Int4Experts":
        """These experts in ``layout`` (a copy; ``self`` when already so)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == self.layout:
            return self
        from . import int4_mma as M

        if layout == "mma":
            if not M.shape_ok(self.hidden, self.intermediate):
                raise ValueError(f"the mma layout needs hidden and intermediate sizes that are multiples of 256, got "
                                 f"H={self.hidden}, I={self.intermediate}")
            convert = M.repack_mma
        else:
            convert = M.unrepack_mma
        return Int4Experts(*convert(self.w13_packed, self.w13_scale), *convert(self.w2_packed, self.w2_scale),
                           layout=layout)

    def to_layout_(self, layout: str) -> "Int4Experts":
        """:meth:`to_layout` in place, one expert at a time (no second copy of the layer): these tensors then
        hold ``layout`` and only the returned object describes them."""
        if layout == self.layout:
            return self
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        for e in range(self.num_experts):
            one = Int4Experts(*(t[e:e + 1] for t in (self.w13_packed, self.w13_scale, self.w2_packed, self.w2_scale)),
                              layout=self.layout).to_layout(layout)
            for dst, src in zip((self.w13_packed, self.w13_scale, self.w2_packed, self.w2_scale),
                                (one.w13_packed, one.w13_scale, one.w2_packed, one.w2_scale)):
                dst[e:e + 1].copy_(src)
        return Int4Experts(self.w13_packed, self.w13_scale, self.w2_packed, self.w2_scale, layout=layout)

    @property
    def num_experts(self) -> int:
        return self.w13_packed.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2_packed.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w13_packed.shape[1] // 2

    @classmethod
    def from_checkpoint(cls, gate_packed, gate_scale, up_packed, up_scale, down_packed, down_scale) -> "Int4Experts":
        """From per-expert checkpoint tensors (lists of ``[I, H/8]``/``[I, H/32]`` gate and up,
        ``[H, I/8]``/``[H, I/32]`` down) or already stacked ``[E, ...]`` ones."""
        def st(ts):
            return ts if isinstance(ts, torch.Tensor) else torch.stack(list(ts))
        gp, gs, upk, us = st(gate_packed), st(gate_scale), st(up_packed), st(up_scale)
        return cls(torch.cat([gp, upk], 1).contiguous(), torch.cat([gs, us], 1).to(torch.bfloat16).contiguous(),
                   st(down_packed).contiguous(), st(down_scale).to(torch.bfloat16).contiguous())

    @classmethod
    def quantize(cls, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> "Int4Experts":
        """From float weights ``w_gate/w_up [E, I, H]``, ``w_down [E, H, I]`` (:func:`quantize_int4`)."""
        (gp, gs), (upk, us), (dp, ds) = (quantize_int4(w) for w in (w_gate, w_up, w_down))
        return cls.from_checkpoint(gp, gs, upk, us, dp, ds)

    def dequantize(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w_gate [E, I, H], w_up [E, I, H], w_down [E, H, I])`` in ``dtype``."""
        if self.layout != "checkpoint":
            return self.to_layout("checkpoint").dequantize(dtype)
        w13 = dequantize_int4(self.w13_packed, self.w13_scale, dtype)
        I = self.intermediate
        return w13[:, :I], w13[:, I:], dequantize_int4(self.w2_packed, self.w2_scale, dtype)

    def shard_tp(self, rank: int, world: int) -> "Int4Experts":
        """Tensor-parallel shard ``rank`` of ``world``: the intermediate dimension I split in equal parts on
        32-column group boundaries (gate/up rows, down's input columns, packed words and scales alike). The
        ranks' outputs sum to the unsharded layer's."""
        I = self.intermediate
        if self.layout != "checkpoint":
            raise ValueError("shard_tp needs the checkpoint layout: shard, then convert (to_layout)")
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world), got rank={rank}, world={world}")
        if I % (world * GROUP):
            raise ValueError(f"the intermediate size {I} must split into {world} parts of whole {GROUP}-column "
                             f"groups")
        s = I // world
        rows = torch.cat([torch.arange(rank * s, (rank + 1) * s), I + torch.arange(rank * s, (rank + 1) * s)])
        rows = rows.to(self.w13_packed.device)
        return Int4Experts(self.w13_packed[:, rows].contiguous(), self.w13_scale[:, rows].contiguous(),
                           self.w2_packed[:, :, rank * s // 8:(rank + 1) * s // 8].contiguous(),
                           self.w2_scale[:, :, rank * s // GROUP:(rank + 1) * s // GROUP].contiguous())

    def shard_ep(self, rank: int, world: int) -> tuple["Int4Experts", int]:
        """Expert-parallel shard: experts ``[rank E/world, (rank + 1) E/world)`` and the first one's id.
        Route with ``topk_idx - first``: ids outside ``[0, E/world)`` are another rank's and are skipped."""
        E = self.num_experts
        if world < 1 or not 0 <= rank < world or E % world:
            raise ValueError(f"{E} experts do not split into {world} equal parts for rank {rank}")
        lo, hi = rank * E // world, (rank + 1) * E // world
        return Int4Experts(self.w13_packed[lo:hi], self.w13_scale[lo:hi], self.w2_packed[lo:hi],
                           self.w2_scale[lo:hi], layout=self.layout), lo


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def moe_int4_reference(x, topk_idx, topk_w, experts: Int4Experts, dtype=torch.float64) -> torch.Tensor:
    """Loop over experts on the dequantised weights, in ``dtype`` (the specification). ``x [N, H]``,
    ``topk_idx/topk_w [N, k]`` -> ``[N, H]`` in ``dtype``; ids outside ``[0, E)`` are skipped."""
    wg, wu, wd = experts.dequantize(dtype)
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for e in range(experts.num_experts):
        tok, slot = torch.nonzero(topk_idx == e, as_tuple=True)
        if tok.numel():
            xe = x[tok].to(dtype)
            h = F.silu(xe @ wg[e].t()) * (xe @ wu[e].t())
            out.index_add_(0, tok, (h @ wd[e].t()) * topk_w[tok, slot, None].to(dtype))
    return out


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def _validate(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale) -> None:
    V.check_tensor("x", x, ndim=2, dtypes=ACT_DTYPES)
    dev = x.device
    V.check_tensor("topk_idx", topk_idx, ndim=2, dtypes=(torch.int32, torch.int64), device=dev)
    V.check_tensor("topk_w", topk_w, ndim=2, dtypes=(torch.float32, torch.bfloat16, torch.float16), device=dev)
    V.check_tensor("w13_packed", w13_packed, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_tensor("w13_scale", w13_scale, ndim=3, dtypes=(torch.bfloat16,), device=dev)
    V.check_tensor("w2_packed", w2_packed, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_tensor("w2_scale", w2_scale, ndim=3, dtypes=(torch.bfloat16,), device=dev)
    N, H = x.shape
    E, I2, _ = w13_packed.shape
    if E < 1:
        raise ValueError(f"w13_packed must hold at least one expert, got shape {tuple(w13_packed.shape)}")
    if H % GROUP:
        raise ValueError(f"x: the hidden size {H} must be a multiple of the group size {GROUP}")
    if I2 % 2 or (I2 // 2) % GROUP:
        raise ValueError(f"w13_packed: 2I = {I2} rows must be gate and up halves of a multiple of {GROUP}")
    I = I2 // 2
    if topk_w.shape != topk_idx.shape or topk_idx.shape[0] != N:
        raise ValueError(f"topk_idx and topk_w must both have shape [N, k] with N = {N}, got "
                         f"{tuple(topk_idx.shape)} and {tuple(topk_w.shape)}")
    V.check_shape("w13_packed", w13_packed, (E, 2 * I, H // 8), "[E, 2I, H/8]")
    V.check_shape("w13_scale", w13_scale, (E, 2 * I, H // GROUP), f"[E, 2I, H/{GROUP}]")
    V.check_shape("w2_packed", w2_packed, (E, H, I // 8), "[E, H, I/8]")
    V.check_shape("w2_scale", w2_scale, (E, H, I // GROUP), f"[E, H, I/{GROUP}]")
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale), ("w2_packed", w2_packed),
                    ("w2_scale", w2_scale)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")


def kernel_layout(device, hidden: int, intermediate: int) -> str:
    """The :class:`Int4Experts` layout the kernels of ``device`` stream: ``"mma"`` on sm_90 and sm_120 GPUs (the
    Gluon ``mma.sync`` kernels of :mod:`tritree.kernels.moe.int4_mma`, when this triton has Gluon and both sizes
    are multiples of 256), else ``"checkpoint"`` (the Triton kernels; the CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] not in (9, 12):
        return "checkpoint"
    try:
        from . import int4_mma as M
    except ImportError:  # a triton without Gluon
        return "checkpoint"
    return "mma" if M.shape_ok(hidden, intermediate) else "checkpoint"


def routed_experts_int4(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, experts: Int4Experts,
                        *, out: torch.Tensor | None = None, plan=None,
                        global_experts: int | None = None) -> torch.Tensor:
    """Grouped routed-expert SwiGLU over INT4 experts (W4A16; see module).

    ``x [N, H]`` bf16/fp16, ``topk_idx [N, k]`` int32/int64 (ids outside ``[0, E)`` skipped: expert
    parallelism), ``topk_w [N, k]`` float -> ``[N, H]`` in x's dtype, written to ``out`` when given.
    Experts in the ``"checkpoint"`` layout run the Triton kernels (``plan``: an :class:`Int4MoePlan` replacing
    :func:`plan_int4_moe`'s), in the ``"mma"`` layout the Gluon ``mma.sync`` kernels (``plan``: an
    ``Int4MmaPlan`` replacing ``plan_int4_mma``'s; GPU only, the reference elsewhere). No host sync:
    CUDA-graph capturable once warm. Runs as the op ``tritree::routed_experts_int4`` or
    ``tritree::routed_experts_int4_mma`` (opaque to torch.compile, with fake impls)."""
    if not isinstance(experts, Int4Experts):
        raise TypeError(f"experts must be an Int4Experts, got {type(experts).__name__}")
    _validate(x, topk_idx, topk_w, experts.w13_packed, experts.w13_scale, experts.w2_packed, experts.w2_scale)
    N, H = x.shape
    k, E, I = topk_idx.shape[1], experts.num_experts, experts.intermediate
    if out is not None:
        V.check_tensor("out", out, dtypes=(x.dtype,), device=x.device)
        V.check_shape("out", out, (N, H), "[N, H]")
    if global_experts is not None:
        global_experts = V.check_int("global_experts", global_experts, E)
    if experts.layout == "mma":
        return _routed_experts_mma(x, topk_idx, topk_w, experts, out, plan, global_experts)
    if plan is None:  # a pure function of ints: traced through uncached under torch.compile
        planner = plan_int4_moe.__wrapped__ if torch.compiler.is_compiling() else plan_int4_moe
        plan = planner(N, k, E, H, I, arch_of(x.device), num_sms(x.device), None, global_experts)
    else:
        _check_block_bound(plan, N * k, E)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or topk_w.requires_grad)
    if needs_grad or not uses_kernel(x.device):  # the kernels have no backward
        return _reference_into(x, topk_idx, topk_w, experts, out)
    if out is None:
        out = torch.empty_like(x)
    _routed_experts_int4_op(x, topk_idx, topk_w, experts.w13_packed, experts.w13_scale, experts.w2_packed,
                            experts.w2_scale, out, plan.as_ints())
    return out


def _check_block_bound(plan, assignments: int, E: int) -> None:
    """A given plan's block bound must hold for any routing of ``assignments`` over ``E`` experts."""
    bound = min_blocks(assignments, E, plan.block_m)
    if plan.num_blocks < bound:
        raise ValueError(f"plan.num_blocks = {plan.num_blocks} is below the bound {bound} of {assignments} "
                         f"assignments in blocks of {plan.block_m}")


def _reference_into(x, topk_idx, topk_w, experts, out):
    """The float32 reference in x's dtype, into ``out`` when given (the CPU path; calls that need gradients)."""
    res = moe_int4_reference(x, topk_idx, topk_w, experts, dtype=torch.float32).to(x.dtype)
    return res if out is None else out.copy_(res)


def _routed_experts_mma(x, topk_idx, topk_w, experts: Int4Experts, out, plan, global_experts):
    from . import int4_mma as M

    N, H = x.shape
    k, E, I = topk_idx.shape[1], experts.num_experts, experts.intermediate
    if not M.shape_ok(H, I):
        raise ValueError(f"experts: the mma layout needs hidden and intermediate sizes that are multiples of 256, got "
                         f"H={H}, I={I}")
    if plan is None:
        planner = M.plan_int4_mma.__wrapped__ if torch.compiler.is_compiling() else M.plan_int4_mma
        plan = planner(N, k, E, H, I, num_sms(x.device), global_experts)
    elif not isinstance(plan, M.Int4MmaPlan):
        raise TypeError(f"plan must be an Int4MmaPlan for mma-layout experts, got {type(plan).__name__}")
    else:
        M.check_plan(plan, H, I, N * k, E)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or topk_w.requires_grad)
    if needs_grad or x.device.type != "cuda":  # Gluon has no interpreter; the kernels have no backward
        return _reference_into(x, topk_idx, topk_w, experts, out)
    if out is None:
        out = torch.empty_like(x)
    _routed_experts_int4_mma_op(x, topk_idx, topk_w, experts.w13_packed, experts.w13_scale, experts.w2_packed,
                                experts.w2_scale, out, plan.as_ints())
    return out


@torch.library.custom_op("tritree::routed_experts_int4_mma", mutates_args=("out",))
def _routed_experts_int4_mma_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                                w13_packed: torch.Tensor, w13_scale: torch.Tensor, w2_packed: torch.Tensor,
                                w2_scale: torch.Tensor, out: torch.Tensor, plan: list[int]) -> None:
    from . import int4_mma as M

    M.launch(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, M.Int4MmaPlan.from_ints(plan))


@_routed_experts_int4_mma_op.register_fake
def _(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, plan):
    return None


@torch.library.custom_op("tritree::routed_experts_int4", mutates_args=("out",))
def _routed_experts_int4_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, w13_packed: torch.Tensor,
                            w13_scale: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor,
                            out: torch.Tensor, plan: list[int]) -> None:
    # Opaque (not traced into): the down kernel accumulates by atomics into a buffer the op zeroes, which
    # Inductor mishandled for the bf16 kernels (moe.py).
    _launch_triton(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, Int4MoePlan.from_ints(plan))


@_routed_experts_int4_op.register_fake
def _(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, plan):
    return None
