"""Routed-expert SwiGLU (grouped by expert) without a host sync, so a MoE layer can be captured in a
CUDA graph.

The token x expert assignments are sorted by expert and each expert's run is cut into blocks of
``BLOCK_M`` rows (a static upper bound of ``cdiv(N k, BLOCK_M) + E`` blocks; the block -> expert map is
computed on the device). Kernel 1: ``h = silu(x W_gate^T) * (x W_up^T)`` per block; kernel 2:
``out[token] += weight * (h W_down^T)`` with fp32 atomics. Plain Triton dots over dense expert weights:
the fused W4A16 version is future work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._launch import interpreting, uses_kernel


def moe_reference(x, topk_idx, topk_w, w_gate, w_up, w_down):
    """Loop over experts (the specification). ``x [N, H]``, ``topk_idx/topk_w [N, k]``,
    ``w_gate/w_up [E, I, H]``, ``w_down [E, H, I]`` -> ``[N, H]`` in x's dtype. Assignments to ids
    outside ``[0, E)`` are skipped (expert parallelism: another rank's experts)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w_gate.shape[0]):
        tok, slot = torch.nonzero(topk_idx == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok].float()
        h = F.silu(xe @ w_gate[e].float().t()) * (xe @ w_up[e].float().t())
        out.index_add_(0, tok, (h @ w_down[e].float().t()) * topk_w[tok, slot, None].float())
    return out.to(x.dtype)


@triton.jit
def _block_rows(BlockExpert, BlockStart, BlockEnd, SortedTok, b, BLOCK_M: tl.constexpr, E):
    e = tl.load(BlockExpert + b)
    start = tl.load(BlockStart + b)
    end = tl.load(BlockEnd + b)
    r = start + tl.arange(0, BLOCK_M)
    ok = (r < end) & ((r * 0 + e) < E)  # e < E as a tensor (E may be specialised to a constant)
    tok = tl.load(SortedTok + r, mask=ok, other=0)
    return tl.minimum(e, E - 1).to(tl.int64), r, ok, tok


@triton.jit
def _gate_up_kernel(X, Wg, Wu, Hbuf, BlockExpert, BlockStart, BlockEnd, SortedTok, E, Hd, I,
                    stride_x, stride_we, stride_wi, stride_h,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                    IEEE: tl.constexpr = False):
    b = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e, r, ok, tok = _block_rows(BlockExpert, BlockStart, BlockEnd, SortedTok, b, BLOCK_M, E)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, Hd, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xa = tl.load(X + tok.to(tl.int64)[:, None] * stride_x + k[None, :], mask=ok[:, None] & (k < Hd)[None, :], other=0.0)
        wmask = (n < I)[None, :] & (k < Hd)[:, None]
        wg = tl.load(Wg + e * stride_we + n[None, :] * stride_wi + k[:, None], mask=wmask, other=0.0)
        wu = tl.load(Wu + e * stride_we + n[None, :] * stride_wi + k[:, None], mask=wmask, other=0.0)
        if UPCAST:
            xa, wg, wu = xa.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        if IEEE:  # fp32 stays fp32: tf32 rounding turns 1e-7 differences upstream into 1e-3 ones
            acc_g = tl.dot(xa, wg, acc_g, input_precision="ieee")
            acc_u = tl.dot(xa, wu, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(xa, wg, acc_g)
            acc_u = tl.dot(xa, wu, acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(Hbuf + r.to(tl.int64)[:, None] * stride_h + n[None, :], h.to(Hbuf.dtype.element_ty),
             mask=ok[:, None] & (n < I)[None, :])


@triton.jit
def _down_kernel(Hbuf, Wd, Out, SortedW, BlockExpert, BlockStart, BlockEnd, SortedTok, E, Hd, I,
                 stride_h, stride_we, stride_wo, stride_o,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                 IEEE: tl.constexpr = False):
    b = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e, r, ok, tok = _block_rows(BlockExpert, BlockStart, BlockEnd, SortedTok, b, BLOCK_M, E)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        ha = tl.load(Hbuf + r.to(tl.int64)[:, None] * stride_h + k[None, :], mask=ok[:, None] & (k < I)[None, :], other=0.0)
        wd = tl.load(Wd + e * stride_we + n[None, :] * stride_wo + k[:, None], mask=(n < Hd)[None, :] & (k < I)[:, None],
                     other=0.0)
        if UPCAST:
            ha, wd = ha.to(tl.float32), wd.to(tl.float32)
        if IEEE:
            acc = tl.dot(ha, wd, acc, input_precision="ieee")
        else:
            acc = tl.dot(ha, wd, acc)
    w = tl.load(SortedW + r, mask=ok, other=0.0)
    tl.atomic_add(Out + tok.to(tl.int64)[:, None] * stride_o + n[None, :], acc * w[:, None],
                  mask=ok[:, None] & (n < Hd)[None, :])


# 8 warps: with 4, the gate/up kernel's two 64x64 weight tiles of addresses need 255 registers and
# spill on sm_120 under triton 3.6 (tests/kernels/test_aot_audit.py); with 8 it needs ~128.
MOE_LAUNCH = dict(block_m=16, block_n=64, block_k=64, num_warps=8)


def routed_experts(x, topk_idx, topk_w, w_gate, w_up, w_down, *, block_m: int = MOE_LAUNCH["block_m"],
                   block_n: int = MOE_LAUNCH["block_n"], block_k: int = MOE_LAUNCH["block_k"],
                   num_warps: int = MOE_LAUNCH["num_warps"]):
    """Grouped routed-expert SwiGLU, no host sync (see module). Shapes as :func:`moe_reference`.

    On a GPU this is the opaque op ``tritree::routed_experts`` for torch.compile: traced into, Inductor
    dropped the down kernel's atomic accumulation into its zero-initialised output (seen on the H200:
    the compiled model lost its routed experts), so the launch stays out of its sight."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, topk_w, w_gate, w_up, w_down))
    if needs_grad or not uses_kernel(x.device):  # the kernels have no backward
        return moe_reference(x, topk_idx, topk_w, w_gate, w_up, w_down)
    if x.device.type == "cuda":
        return _routed_experts_op(x, topk_idx, topk_w, w_gate, w_up, w_down, block_m, block_n, block_k, num_warps)
    return _routed_experts_launch(x, topk_idx, topk_w, w_gate, w_up, w_down, block_m, block_n, block_k, num_warps)


@torch.library.custom_op("tritree::routed_experts", mutates_args=())
def _routed_experts_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, w_gate: torch.Tensor,
                       w_up: torch.Tensor, w_down: torch.Tensor, block_m: int, block_n: int, block_k: int,
                       num_warps: int) -> torch.Tensor:
    return _routed_experts_launch(x, topk_idx, topk_w, w_gate, w_up, w_down, block_m, block_n, block_k, num_warps)


@_routed_experts_op.register_fake
def _(x, topk_idx, topk_w, w_gate, w_up, w_down, block_m, block_n, block_k, num_warps):
    return x.new_empty(x.shape)


def _routed_experts_launch(x, topk_idx, topk_w, w_gate, w_up, w_down, block_m, block_n, block_k, num_warps):
    N, Hd = x.shape
    E, I, _ = w_gate.shape
    k = topk_idx.shape[1]
    flat = topk_idx.reshape(-1).to(torch.int64)
    # Ids outside [0, E) (experts of other expert-parallel ranks) go to a bucket E that no block reads.
    flat = torch.where((flat >= 0) & (flat < E), flat, E)
    order = torch.argsort(flat, stable=True)
    sorted_tok = (order // k).to(torch.int32)
    sorted_w = topk_w.reshape(-1)[order].float().contiguous()
    counts = torch.zeros(E + 1, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))[:E]  # bincount syncs
    seg_end = torch.cumsum(counts, 0)
    seg_start = seg_end - counts
    blocks = (counts + block_m - 1) // block_m
    cum_blocks = torch.cumsum(blocks, 0)
    nb = triton.cdiv(N * k, block_m) + E  # static upper bound
    bidx = torch.arange(nb, device=x.device)
    block_expert = torch.searchsorted(cum_blocks, bidx, right=True)  # E for unused blocks
    e_c = block_expert.clamp(max=E - 1)
    first_block = cum_blocks[e_c] - blocks[e_c]
    block_start = (seg_start[e_c] + (bidx - first_block) * block_m).to(torch.int32)
    block_end = seg_end[e_c].to(torch.int32)
    block_expert = block_expert.to(torch.int32)
    hbuf = torch.empty(N * k, I, dtype=x.dtype, device=x.device)
    out = torch.zeros(N, Hd, dtype=torch.float32, device=x.device)
    upcast = interpreting() and x.dtype == torch.bfloat16
    ieee = x.dtype == torch.float32
    xc = x.contiguous()
    _gate_up_kernel[(nb, triton.cdiv(I, block_n))](
        xc, w_gate, w_up, hbuf, block_expert, block_start, block_end, sorted_tok, E, Hd, I,
        xc.stride(0), w_gate.stride(0), w_gate.stride(1), hbuf.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, IEEE=ieee, num_warps=num_warps)
    _down_kernel[(nb, triton.cdiv(Hd, block_n))](
        hbuf, w_down, out, sorted_w, block_expert, block_start, block_end, sorted_tok, E, Hd, I,
        hbuf.stride(0), w_down.stride(0), w_down.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, IEEE=ieee, num_warps=num_warps)
    return out.to(x.dtype) if x.dtype != torch.float32 else out
