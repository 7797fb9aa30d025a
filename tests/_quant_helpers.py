"""Quantising small tensors by hand for loader tests (the inverse of tritree.kernels.quant)."""

import torch


def quantize_int4(w: torch.Tensor, group: int = 32):
    """-> (weight_packed [out, in/8] int32, weight_scale [out, in/group] bf16, dequantised fp32)."""
    out, cols = w.shape
    scale = (w.abs().view(out, cols // group, group).amax(-1) / 7).clamp_min(1e-8).to(torch.bfloat16)
    s = scale.float().repeat_interleave(group, 1)
    nib = (torch.round(w / s) + 8).clamp(0, 15).to(torch.int64)
    words = torch.zeros(out, cols // 8, dtype=torch.int64)
    for j in range(8):
        words |= nib[:, j::8] << (4 * j)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words, scale, (nib.float() - 8) * s


def quantize_fp8_blocks(w: torch.Tensor, block: int = 128):
    """-> (weight float8_e4m3fn, weight_scale_inv [ceil(out/128), ceil(in/128)] fp32, dequantised fp32)."""
    out, cols = w.shape
    rb, cb = -(-out // block), -(-cols // block)
    scale_inv = torch.empty(rb, cb)
    for r in range(rb):
        for c in range(cb):
            blk = w[r * block:(r + 1) * block, c * block:(c + 1) * block]
            scale_inv[r, c] = (blk.abs().max() / 448.0).clamp_min(1e-8)
    s = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out, :cols]
    w8 = (w / s).to(torch.float8_e4m3fn)
    return w8, scale_inv, w8.float() * s
