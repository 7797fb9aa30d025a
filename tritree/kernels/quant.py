"""Dequantisation of the quantised checkpoint formats of Kimi K2.x (docs/SPEC.md section 2).

- INT4, compressed-tensors ``pack-quantized`` (K2-Thinking, K2.5, K2.6 routed experts): ``weight_packed``
  int32 ``[out, in / 8]``, ``weight_scale`` ``[out, in / 32]``; ``W[o, i] = (nibble - 8) * scale[o, i // 32]``
  with nibble j of an int32 holding input column ``8 c + j``, least significant first (symmetric, group 32).
- FP8 e4m3 with block scales (K2-Instruct): ``weight`` ``[out, in]`` float8_e4m3fn and ``weight_scale_inv``
  float32 ``[ceil(out / 128), ceil(in / 128)]``; ``W[o, i] = w[o, i] * scale_inv[o // 128, i // 128]``.

The kernels decode the raw bits themselves (FP8 is read as uint8), so they also run in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import uses_kernel

# --------------------------------------------------------------------------------------------------
# INT4 pack-quantized
# --------------------------------------------------------------------------------------------------

def dequant_int4_reference(packed: torch.Tensor, scale: torch.Tensor, group: int = 32, dtype=torch.float32):
    out, cols = packed.shape[0], packed.shape[1] * 8
    shifts = torch.arange(8, device=packed.device, dtype=torch.int32) * 4
    nib = (packed[:, :, None] >> shifts) & 0xF  # [out, in/8, 8], column 8c + j
    w = (nib.reshape(out, cols).float() - 8.0) * scale.float().repeat_interleave(group, dim=1)[:, :cols]
    return w.to(dtype)


@triton.jit
def _int4_kernel(Packed, Scale, Out, n_cols, stride_p, stride_s, stride_o, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = col < n_cols
    word = tl.load(Packed + row * stride_p + col // 8, mask=ok, other=0)
    nib = (word >> ((col % 8) * 4)) & 0xF
    s = tl.load(Scale + row * stride_s + col // GROUP, mask=ok, other=0.0).to(tl.float32)
    w = (nib.to(tl.float32) - 8.0) * s
    tl.store(Out + row * stride_o + col, w.to(Out.dtype.element_ty), mask=ok)


def dequant_int4(packed: torch.Tensor, scale: torch.Tensor, *, group: int = 32, dtype=torch.bfloat16,
                 shape: tuple | None = None) -> torch.Tensor:
    """``[out, in]`` weights from compressed-tensors INT4 (``packed: [out, in/8] int32``,
    ``scale: [out, in/group]``); ``shape`` (``weight_shape``) is checked when given."""
    V.check_tensor("weight_packed", packed, ndim=2, dtypes=(torch.int32,))
    V.check_tensor("weight_scale", scale, ndim=2, dtypes=(torch.bfloat16, torch.float16, torch.float32), device=packed.device)
    out_f, cols = packed.shape[0], packed.shape[1] * 8
    if scale.shape != (out_f, -(-cols // group)):
        raise ValueError(f"weight_scale must have shape [out, in/{group}] = {(out_f, -(-cols // group))}, "
                         f"got {tuple(scale.shape)}")
    if shape is not None and tuple(int(x) for x in shape) != (out_f, cols):
        raise ValueError(f"weight_shape {tuple(int(x) for x in shape)} does not match the packed {(out_f, cols)}")
    if not uses_kernel(packed.device):
        return dequant_int4_reference(packed, scale, group, dtype)
    out = torch.empty(out_f, cols, dtype=dtype, device=packed.device)
    block = min(1024, triton.next_power_of_2(cols))
    _int4_kernel[(out_f, triton.cdiv(cols, block))](packed, scale, out, cols, packed.stride(0), scale.stride(0),
                                                     out.stride(0), GROUP=group, BLOCK=block)
    return out


# --------------------------------------------------------------------------------------------------
# FP8 e4m3 with 128 x 128 block scales
# --------------------------------------------------------------------------------------------------

def dequant_fp8_reference(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = 128, dtype=torch.float32):
    w = weight.float()
    s = scale_inv.float().repeat_interleave(block, 0).repeat_interleave(block, 1)[:w.shape[0], :w.shape[1]]
    return (w * s).to(dtype)


@triton.jit
def _fp8_kernel(Bits, ScaleInv, Out, n_cols, stride_w, stride_s, stride_o, BLOCK_SCALE: tl.constexpr,
                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = col < n_cols
    b = tl.load(Bits + row * stride_w + col, mask=ok, other=0).to(tl.int32)
    sign = tl.where((b >> 7) != 0, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = (b & 7).to(tl.float32)
    mag = tl.where(e == 0, m * 0.001953125,  # subnormal: m / 8 * 2^-6
                   (1.0 + m * 0.125) * tl.exp2((e - 7).to(tl.float32)))
    val = tl.where((e == 15) & ((b & 7) == 7), float("nan"), sign * mag)
    s = tl.load(ScaleInv + (row // BLOCK_SCALE) * stride_s + col // BLOCK_SCALE, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + col, (val * s).to(Out.dtype.element_ty), mask=ok)


def dequant_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, *, block: int = 128, dtype=torch.bfloat16):
    """``[out, in]`` weights from FP8 e4m3 ``weight`` and its ``weight_scale_inv`` block scales."""
    V.check_tensor("weight", weight, ndim=2, dtypes=(torch.float8_e4m3fn, torch.uint8))
    V.check_tensor("weight_scale_inv", scale_inv, ndim=2, dtypes=(torch.float32, torch.bfloat16), device=weight.device)
    o, i = weight.shape
    want = (-(-o // block), -(-i // block))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"weight_scale_inv must have shape {want} for {block}x{block} blocks of {tuple(weight.shape)}, "
                         f"got {tuple(scale_inv.shape)}")
    bits = weight.view(torch.uint8)
    if not uses_kernel(weight.device):
        return dequant_fp8_reference(bits.view(torch.float8_e4m3fn), scale_inv, block, dtype)
    out = torch.empty(o, i, dtype=dtype, device=weight.device)
    blk = min(1024, triton.next_power_of_2(i))
    _fp8_kernel[(o, triton.cdiv(i, blk))](bits, scale_inv, out, i, bits.stride(0), scale_inv.stride(0), out.stride(0),
                                          BLOCK_SCALE=block, BLOCK=blk)
    return out
