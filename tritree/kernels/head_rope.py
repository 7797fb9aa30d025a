"""Per-head RMSNorm and rotary embedding of attention heads, one launch: ``head_norm_rope``.

Semantics (:func:`head_norm_rope_reference`, the specification): for ``x [..., H, D]`` (``D`` even), ``positions
[...]`` (integers, the leading dimensions of ``x``) and the rope's inverse frequencies ``inv_freq [D / 2]`` (float32),

- ``y = x / sqrt(mean(x^2 over D) + eps) * norm_weight`` per head (the head's RMSNorm, ``norm_weight [D]`` for every
  head or ``[H, D]`` one row a head; skipped when ``norm_weight`` is None);
- ``out = y * cos + rot(y) * sin`` in the halves layout (channel ``i`` pairs with ``i + D / 2``: ``rot(y) = [-y2,
  y1]``), ``cos / sin`` of the angle ``float32(float32(position) * inv_freq[i mod D / 2])`` times ``amplitude``:
  what :func:`tritree.model.layers.rms_norm`, :func:`~tritree.model.layers.cos_sin` and
  :func:`~tritree.model.layers.apply_rope` compose, the angle rounded to float32 as theirs is.

One kernel (:func:`_head_rope_kernel`): a program for ``BLOCK_H`` heads of one row, the norm and the rotation in
float32 (the cosine and sine by :func:`_cos_sin`, within ~2e-7 of those of the float32 angle at positions below
2^20), the output rounded once to ``x``'s dtype. It replaces the norm, the rope tables (cos, sin, their casts
and concatenations) and the rotation: about ten launches a call in the composed form. No host sync: CUDA-graph
capturable. On the CPU (without Triton's interpreter) the reference runs in float32 for 16-bit inputs.
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
POSITION_DTYPES = (torch.int32, torch.int64)


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def head_norm_rope_reference(x: torch.Tensor, norm_weight: torch.Tensor | None, positions: torch.Tensor,
                             inv_freq: torch.Tensor, eps: float, amplitude: float = 1.0,
                             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The specification (module docstring), computed in ``dtype`` (the angle in float32 first); returns
    ``[..., H, D]`` in ``dtype``."""
    y = x.to(dtype)
    if norm_weight is not None:  # [D] or [H, D]: broadcast over the heads, or one row a head
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    ang = (positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)).to(dtype)  # [..., D / 2]
    c, s = ang.cos() * amplitude, ang.sin() * amplitude
    cos, sin = torch.cat([c, c], -1)[..., None, :], torch.cat([-s, s], -1)[..., None, :]
    return y * cos + torch.roll(y, y.shape[-1] // 2, dims=-1) * sin


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _cos_sin(ang):
    """``(cos, sin)`` of float32 angles: the angle less ``k pi / 2`` (``k`` the nearest quadrant count) by three
    fused multiply-adds of a three-part ``pi / 2`` (Cody and Waite; each step rounds once, the remainder is within
    ~1e-7 of the exact one for any angle a position reaches), then Cephes' float32 polynomials on ``[-pi / 4, pi / 4]``
    (about one ulp) and the quadrant's signs. No libdevice call: its ``sinf`` / ``cosf`` keep the large-argument
    reduction (angles past 105,615) in a local array, which some ptxas versions leave in local memory."""
    k = tl.floor(ang * 0.6366197723675814 + 0.5)
    r = tl.fma(k, -1.5707963705062866, ang)
    r = tl.fma(k, 4.371138828673793e-08, r)
    r = tl.fma(k, 1.7151244994428829e-15, r)
    z = r * r
    sn = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4))
    cs = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5))
    q = k.to(tl.int32) & 3
    sin = tl.where(q == 0, sn, tl.where(q == 1, cs, tl.where(q == 2, -sn, -cs)))
    cos = tl.where(q == 0, cs, tl.where(q == 1, -sn, tl.where(q == 2, -cs, sn)))
    return cos, sin


@triton.jit
def _head_rope_kernel(X, Out, NormW, Pos, InvFreq, H, D, stride_xm, stride_xh, stride_om, stride_oh, stride_wh, eps,
                      amplitude, BLOCK_H: tl.constexpr, D_PAD: tl.constexpr, HAS_NORM: tl.constexpr):
    """Grid ``(M, cdiv(H, BLOCK_H))``: heads ``BLOCK_H j ..`` of row ``m``. ``X / Out [M, H, D]`` by their row and
    head strides (channels contiguous; ``Out`` may be ``X``: a program stores only the heads it loaded);
    ``NormW`` a head's row at ``h * stride_wh`` (0: one ``[D]`` for all); ``Pos [M]``; ``InvFreq [D / 2]`` float32."""
    m = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, D_PAD)
    half = D // 2
    d_ok = d < D
    dr = tl.where(d < half, d + half, d - half)  # the channel each one pairs with
    ok = (h < H)[:, None] & d_ok[None, :]
    m64 = m.to(tl.int64)
    px = X + m64 * stride_xm + h[:, None] * stride_xh
    x = tl.load(px + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(px + dr[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
        pw = NormW + h[:, None] * stride_wh
        x = x * rstd * tl.load(pw + d[None, :], mask=ok, other=0.0).to(tl.float32)
        xr = xr * rstd * tl.load(pw + dr[None, :], mask=ok, other=0.0).to(tl.float32)
    ang = tl.load(Pos + m).to(tl.float32) * tl.load(InvFreq + d % half, mask=d_ok, other=0.0)
    c, s = _cos_sin(ang)
    c = c * amplitude
    s = tl.where(d < half, -s, s) * amplitude
    out = x * c[None, :] + xr * s[None, :]
    tl.store(Out + m64 * stride_om + h[:, None] * stride_oh + d[None, :], out.to(Out.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadRopeConfig:
    """Launch configuration of :func:`_head_rope_kernel`: at most ``values`` channels of heads a program (heads
    ``values / D``, a power of two), ``num_warps``."""

    values: int
    num_warps: int


# Heads of one row a program, up to 2,048 values (16 heads of 128): the draft's 64 heads of a row in 4 programs.
HEAD_ROPE_CONFIGS: dict[str, dict[int, HeadRopeConfig]] = {
    "sm_90": {1 << 30: HeadRopeConfig(2048, 4)},
    "sm_120": {1 << 30: HeadRopeConfig(2048, 4)},
    "sm_80": {1 << 30: HeadRopeConfig(2048, 4)},
    "cpu": {1 << 30: HeadRopeConfig(4096, 4)},
}


@dataclass(frozen=True)
class HeadRopePlan:
    config: HeadRopeConfig
    block_h: int
    d_pad: int


@functools.lru_cache(maxsize=256)
def plan_head_rope(M: int, H: int, D: int, arch: str) -> HeadRopePlan:
    """``BLOCK_H`` heads a program: the config's values over the padded head size, at most the heads."""
    cfg = lookup(HEAD_ROPE_CONFIGS, arch, M)
    d_pad = triton.next_power_of_2(D)
    return HeadRopePlan(cfg, max(1, min(triton.next_power_of_2(H), cfg.values // d_pad)), d_pad)


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def _validate(x, norm_weight, positions, inv_freq, eps, amplitude, out) -> None:
    V.check_tensor("x", x, dtypes=DTYPES)
    if x.ndim < 3:
        raise ValueError(f"x must have shape [..., H, D] with at least one leading dimension, got {tuple(x.shape)}")
    H, D = x.shape[-2:]
    if D < 2 or D % 2:
        raise ValueError(f"x: the head size D must be even and >= 2, got {D}")
    dev = x.device
    lead = tuple(x.shape[:-2])
    V.check_tensor("positions", positions, dtypes=POSITION_DTYPES, device=dev)
    V.check_shape("positions", positions, lead, "x's leading dimensions")
    V.check_tensor("inv_freq", inv_freq, ndim=1, dtypes=(torch.float32,), device=dev)
    V.check_shape("inv_freq", inv_freq, (D // 2,), "[D / 2]")
    if norm_weight is not None:
        V.check_tensor("norm_weight", norm_weight, dtypes=DTYPES, device=dev)
        if tuple(norm_weight.shape) not in ((D,), (H, D)) or norm_weight.stride(-1) != 1:
            raise ValueError(f"norm_weight must have shape [D] = [{D}] or [H, D] = [{H}, {D}] with contiguous "
                             f"channels, got {tuple(norm_weight.shape)} (strides {tuple(norm_weight.stride())})")
    V.check_float("eps", eps, lo=0.0)
    V.check_float("amplitude", amplitude)
    if out is not None:
        V.check_tensor("out", out, dtypes=(x.dtype,), device=dev)
        V.check_shape("out", out, tuple(x.shape), "x's shape")
        if _rows(out) is None:
            raise ValueError(f"out must have contiguous channels and leading dimensions that merge into one row "
                             f"stride (x itself, a view of heads of a wider tensor, or a new tensor), got strides "
                             f"{tuple(out.stride())}")


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """``t [..., H, D]`` as ``[M, H, D]`` without a copy (its leading dimensions merged), or None where they do not
    merge or the channels are not contiguous."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return None
    try:
        return t.view(-1, *t.shape[-2:])
    except RuntimeError:
        return None


class _HeadRopePlanLaunch:
    """head_norm_rope for one static signature: validated, planned, kernel bound once."""

    def __init__(self, x, norm_weight, positions, inv_freq, eps, amplitude, out):
        _validate(x, norm_weight, positions, inv_freq, eps, amplitude, out)
        self.eps, self.amplitude = float(eps), float(amplitude)
        self.kernel = uses_kernel(x.device)
        if not self.kernel:
            return
        M = positions.numel()
        H, D = x.shape[-2:]
        self.plan = p = plan_head_rope(M, H, D, arch_of(x.device))
        self.grid = (M, triton.cdiv(H, p.block_h), 1)
        self._launcher = KernelLauncher(_head_rope_kernel, dict(BLOCK_H=p.block_h, D_PAD=p.d_pad,
                                                                HAS_NORM=norm_weight is not None),
                                        num_warps=p.config.num_warps)

    def run(self, x, norm_weight, positions, inv_freq, out):
        needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, norm_weight))
        if not self.kernel or needs_grad:  # the kernel has no backward
            ref = head_norm_rope_reference(x, norm_weight, positions, inv_freq, self.eps, self.amplitude,
                                           dtype=torch.float32).to(x.dtype)
            return ref if out is None else out.copy_(ref)
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if positions.numel():
            H, D = x.shape[-2:]
            xr, orows = x.reshape(-1, H, D), _rows(out)
            w_h = norm_weight.stride(0) if norm_weight is not None and norm_weight.dim() == 2 else 0
            self._launcher(self.grid, xr, orows, norm_weight if norm_weight is not None else inv_freq,
                           positions.reshape(-1), inv_freq, H, D, xr.stride(0), xr.stride(1), orows.stride(0),
                           orows.stride(1), w_h, self.eps, self.amplitude)
        return out


_PLANS = PlanCache("head_norm_rope", _HeadRopePlanLaunch)


def head_norm_rope(x: torch.Tensor, norm_weight: torch.Tensor | None, positions: torch.Tensor, inv_freq: torch.Tensor,
                   *, eps: float = 1e-6, amplitude: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head RMSNorm then half-rotary RoPE at integer positions, in one launch (module docstring).

    Args:
        x: ``[..., H, D]`` bf16/fp16/fp32, ``D`` even, channels contiguous (the leading dimensions are flattened:
            a copy where they do not collapse).
        norm_weight: ``[D]`` the heads' RMSNorm weight, or ``[H, D]`` one a head (any float dtype, channels
            contiguous), or None for the rotation alone.
        positions: ``[...]`` int32/int64, x's leading dimensions: each row's absolute position.
        inv_freq: ``[D / 2]`` float32 (:func:`tritree.model.layers.yarn_inv_freq`).
        eps: the norm's epsilon; amplitude: the tables' factor (YaRN's attention scaling).
        out: optional destination of x's shape and dtype, channels contiguous, leading dimensions merging into one
            row stride (a new tensor, a view of heads of a wider tensor, or ``x`` itself: in place).

    Returns ``out`` (or a new tensor) in x's dtype. Calls that need gradients, and CPU calls without Triton's
    interpreter, run the reference in float32 (differentiable). Eager calls run a plan cached per static signature (also under
    CUDA-graph capture); under torch.compile the op ``tritree::head_norm_rope``."""
    if eager():
        try:
            key = (signature(x, norm_weight, positions, inv_freq, out), scalars(eps, amplitude))
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
            _validate(x, norm_weight, positions, inv_freq, eps, amplitude, out)
            raise
        return _PLANS.get(key, x, norm_weight, positions, inv_freq, eps, amplitude, out).run(
            x, norm_weight, positions, inv_freq, out)
    _validate(x, norm_weight, positions, inv_freq, eps, amplitude, out)
    if not uses_kernel(x.device) or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, norm_weight))):
        res = head_norm_rope_reference(x, norm_weight, positions, inv_freq, eps, amplitude,
                                       dtype=torch.float32).to(x.dtype)
        return res if out is None else out.copy_(res)
    res = _head_rope_op(x, norm_weight, positions, inv_freq, float(eps), float(amplitude))
    return res if out is None else out.copy_(res)


@torch.library.custom_op("tritree::head_norm_rope", mutates_args=())
def _head_rope_op(x: torch.Tensor, norm_weight: torch.Tensor | None, positions: torch.Tensor, inv_freq: torch.Tensor,
                  eps: float, amplitude: float) -> torch.Tensor:
    return head_norm_rope(x, norm_weight, positions, inv_freq, eps=eps, amplitude=amplitude)  # the cached plans


@_head_rope_op.register_fake
def _(x, norm_weight, positions, inv_freq, eps, amplitude):
    return torch.empty_like(x, memory_format=torch.contiguous_format)
