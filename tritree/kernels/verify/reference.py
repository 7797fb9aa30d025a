"""The specification of verify attention (float64 in the tests, the CPU path outside the interpreter) and the
checks of its inputs."""

from __future__ import annotations

import math

import torch

from .. import _validate as V
from .abi import D_QK, D_ROPE

KV_FP8 = torch.float8_e4m3fn


def _tree_visible(tree_mask: torch.Tensor, T: int) -> torch.Tensor:
    """[..., T, W] int32 words -> [..., T, T] bool."""
    j = torch.arange(T, device=tree_mask.device)
    words = tree_mask[..., j // 32].to(torch.int64)
    return ((words >> (j % 32)) & 1).bool()


def verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, return_lse=False,
                         d_rope: int = D_ROPE, kv_scale: float | None = None):
    """Plain PyTorch verify attention with the semantics of :func:`verify_mla`.

    Computes in ``promote(q.dtype, float32)`` (float64 inputs give a float64 result) and returns
    that dtype. Reads the host copies of the lengths: a specification, not a fast path. ``kv_scale``:
    an fp8 pool's per-tensor scale (the keys and values are ``kv * kv_scale``).
    """
    B, T, H, _ = q.shape
    P = kv.shape[1]
    cdt = torch.promote_types(q.dtype, torch.float32)
    d_lat = q.shape[-1] - d_rope
    out = torch.zeros(B, T, H, d_lat, dtype=cdt, device=q.device)
    lse = torch.full((B, T, H), float("-inf"), dtype=cdt, device=q.device)
    kv_lens_l = kv_lens.tolist()
    tree_lens_l = [T] * B if tree_lens is None else tree_lens.tolist()
    vis_tree = _tree_visible(tree_mask, T)
    for b in range(B):
        L, n = int(kv_lens_l[b]), int(tree_lens_l[b])
        if n == 0:
            continue
        pos = torch.arange(L + n, device=q.device)
        keys = kv[page_table[b, pos // P].long(), pos % P].to(cdt)  # [L+n, 576]
        if kv_scale is not None:
            keys = keys * kv_scale
        visible = torch.ones(n, L + n, dtype=torch.bool, device=q.device)
        visible[:, L:] = vis_tree[b, :n, :n]
        scores = torch.einsum("thd,sd->ths", q[b, :n].to(cdt), keys) * sm_scale
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None])
        out[b, :n] = torch.einsum("ths,sd->thd", probs, keys[:, :d_lat])
        lse[b, :n] = row_lse
    return (out, lse) if return_lse else out



def _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope=D_ROPE, kv_scale=None, out=None,
              lse=None):
    """Checks of everything a plan depends on (types, shapes, dtypes, devices, strides, scalars)."""
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    dev = q.device
    B, T, H, D = q.shape
    d_lat = D - d_rope
    if not isinstance(d_rope, int) or d_lat < 16 or d_rope < 16 or d_lat & (d_lat - 1) or d_rope & (d_rope - 1):
        raise ValueError(f"q must have shape [B, T, H, latent + d_rope] with both powers of two >= 16 "
                         f"(Kimi: 512 + 64 = {D_QK}); got {tuple(q.shape)} with d_rope = {d_rope}")
    if T < 1 or H < 1:
        raise ValueError(f"q must have T >= 1 tree tokens and H >= 1 heads, got shape {tuple(q.shape)}")
    V.check_tensor("kv", kv, ndim=3, dtypes=V.ATTN_DTYPES + (KV_FP8,), device=dev)
    if kv.dtype != q.dtype and kv.dtype != KV_FP8:
        raise TypeError(f"kv must have the dtype of q ({q.dtype}) or be a float8_e4m3fn pool, got {kv.dtype}")
    if kv_scale is not None:
        if kv.dtype != KV_FP8:
            raise ValueError(f"kv_scale is the dequantisation scale of a float8_e4m3fn pool; kv is {kv.dtype}")
        if not isinstance(kv_scale, (int, float)) or not math.isfinite(kv_scale) or kv_scale <= 0:
            raise ValueError(f"kv_scale must be a positive finite float, got {kv_scale!r}")
    if kv.dtype == KV_FP8 and kv.is_cuda and torch.cuda.get_device_capability(kv.device) < (8, 9):
        raise TypeError("float8_e4m3fn pools need a GPU of compute capability 8.9 or newer (Ada, Hopper, "
                        f"Blackwell); this one is {torch.cuda.get_device_capability(kv.device)}")
    num_pages, P, Dk = kv.shape
    if Dk != D:
        raise ValueError(f"kv must have shape [num_pages, P, {D}] (the last dim of q), got {tuple(kv.shape)}")
    if P < 1 or P > 128 or P & (P - 1):
        raise ValueError(f"kv page size P = kv.shape[1] must be a power of two in [1, 128], got {P}")
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    if page_table.shape[0] != B:
        raise ValueError(f"page_table must have shape [B, max_pages] with B = {B}, got {tuple(page_table.shape)}")
    V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("kv_lens", kv_lens, (B,), "[B]")
    W = (T + 31) // 32
    V.check_tensor("tree_mask", tree_mask, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_shape("tree_mask", tree_mask, (B, T, W), "[B, T, ceil(T/32)]")
    if page_table.shape[1] * P < T:
        raise ValueError(f"page_table capacity {page_table.shape[1]} pages x {P} = {page_table.shape[1] * P} "
                         f"tokens cannot hold T = {T} tree tokens")
    if tree_lens is not None:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
        V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    V.check_float("sm_scale", sm_scale, lo=0.0, lo_open=True)
    if out is not None:
        V.check_tensor("out", out, ndim=4, dtypes=(q.dtype,), device=dev)
        V.check_shape("out", out, (B, T, H, d_lat), "[B, T, H, latent]")
    if lse is not None:
        V.check_tensor("lse", lse, ndim=3, dtypes=(torch.float32,), device=dev, last_contiguous=False)
        V.check_shape("lse", lse, (B, T, H), "[B, T, H]")


def _check_values(kv, page_table, kv_lens, tree_lens, T: int) -> None:
    """Checks that read lengths and page ids on the host (CPU inputs, or ``TRITREE_DEBUG=1``)."""
    B = kv_lens.shape[0]
    if tree_lens is not None:
        tc = tree_lens.detach().cpu()
        if ((tc < 0) | (tc > T)).any():
            raise ValueError(f"tree_lens must be in [0, T = {T}], got {tc.tolist()}")
    V.check_paged_lengths(page_table, kv.shape[0], kv.shape[1], kv_lens,
                          torch.full((B,), T) if tree_lens is None else tree_lens)

