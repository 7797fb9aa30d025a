"""DDTree construction from the draft's per-depth distributions, and tree acceptance by the target.

``build_tree``: top-K per depth with the log-softmax fused (two passes over the draft logits, many
programs per row: a lower bound of the K-th logit, then the candidates above it and an exact selection
among them), then DDTree's best-first search in a Triton kernel (one program per request, which also
writes the padding and the ancestor bitmask). Candidates are (depth, rank, parent); popping the best
creates a node and pushes its next sibling (same parent, rank + 1, score ``s - lp[d, r] + lp[d, r+1]``)
and its first child (depth + 1, rank 0, score ``s + lp[d+1, 0]``). Scores are fp32 with exactly
these operations, so the kernel and the reference agree bit for bit given the same log-probabilities
(bit-equal in the interpreter; a GPU's ``exp`` moves the log-softmax's normaliser by about an ulp).

Deterministic ties: within a depth, tokens are ranked by log-probability, then by lower token id; among
candidates of equal score, the one pushed first is popped first (the initial candidate, then for each
pop its sibling before its child). A candidate of score -inf (a token of probability 0) is never
created.

``accept_tree``: the target's pick at every node (argmax with the lowest id on ties at temperature 0,
else a Gumbel-max sample from the temperature / top-k / top-p filtered distribution with a
counter-based Philox stream keyed by (seed, step, request, node)), then the walk from the root into the
child whose token equals the pick, on the GPU, no host sync.

``tree_mask_from_parents``: the ancestor bitmask and depth of any batch of trees given by parents (the
``tree_mask`` that :func:`tritree.verify_mla` reads), by pointer doubling in PyTorch.
"""

from __future__ import annotations

import heapq
import math
import os
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, StreamScratch, eager, signature
from .configs import num_sms


class Tree(NamedTuple):
    """A batch of draft trees, static shapes ``T = budget + 1`` (node 0 = root, parents first)."""

    tokens: torch.Tensor     # [B, T] int32 (padding 0)
    parents: torch.Tensor    # [B, T] int32 (root and padding -1)
    depth: torch.Tensor      # [B, T] int32 (root and padding 0)
    scores: torch.Tensor     # [B, T] float32 log-probability of the path (root 0, padding -inf)
    tree_lens: torch.Tensor  # [B] int32 valid nodes, root included
    tree_mask: torch.Tensor  # [B, T, ceil(T/32)] int32 ancestor bits


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------------------------------
# Tree mask
# --------------------------------------------------------------------------------------------------

def _bit_words(T: int, device) -> torch.Tensor:
    """[T, W] int32: row i has only bit i set (bit j%32 of word j//32)."""
    W = (T + 31) // 32
    idx = torch.arange(T, device=device)
    words = torch.zeros(T, W, dtype=torch.int64, device=device)
    words[idx, idx // 32] = torch.bitwise_left_shift(torch.ones_like(idx), idx % 32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement for bit 31
    return words.to(torch.int32)


def tree_mask_from_parents(parents: torch.Tensor, tree_lens: torch.Tensor | None = None):
    """Ancestor bitmask and depth of each node of a batch of trees.

    Args:
        parents: ``[B, T]`` int32/int64, ``parents[b, 0] = -1`` (root), ``parents[b, i] < i``.
        tree_lens: ``[B]`` valid nodes per request (default: all ``T``). Rows ``i >= tree_lens[b]``
            are padding.

    Returns:
        ``(tree_mask, depth)``: ``tree_mask: [B, T, ceil(T/32)] int32`` with bit ``j % 32`` of word
        ``j // 32`` in row ``i`` set iff node ``j`` is node ``i`` or one of its ancestors;
        ``depth: [B, T] int32`` (root 0). Padding rows are all zero.

    Pointer doubling: ``ceil(log2 T)`` rounds of gathers, no host sync, any device. A parent index
    that is not in ``[0, i)`` is treated as "no parent" (``TRITREE_DEBUG=1`` or CPU inputs raise).
    """
    V.check_tensor("parents", parents, ndim=2, dtypes=(torch.int32, torch.int64), last_contiguous=False)
    B, T = parents.shape
    device = parents.device
    if T < 1:
        raise ValueError(f"parents must have at least one node per request, got shape {tuple(parents.shape)}")
    idx = torch.arange(T, device=device)
    if tree_lens is None:
        valid = torch.ones(B, T, dtype=torch.bool, device=device)
    else:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
        if tree_lens.shape[0] != B:
            raise ValueError(f"tree_lens must have shape [B] = [{B}], got {tuple(tree_lens.shape)}")
        valid = idx[None, :] < tree_lens[:, None]
    par = parents.to(torch.int64)
    if V.values_checkable(parents):
        ok = (par[:, 0] == -1) & ((par[:, 1:] >= 0) & (par[:, 1:] < idx[None, 1:]) | ~valid[:, 1:]).all(1)
        if not bool(ok.all()):
            b = int(torch.nonzero(~ok)[0, 0])
            raise ValueError(f"parents[{b}] is not a tree in parents-first order (need parents[b, 0] = -1 and "
                             f"0 <= parents[b, i] < i): {par[b].tolist()}")
    ptr = torch.where(valid & (par >= 0) & (par < idx[None, :]), par, -1)
    mask = _bit_words(T, device).unsqueeze(0).expand(B, T, -1).clone()
    depth = (ptr >= 0).to(torch.int32)
    W = mask.shape[-1]
    for _ in range(math.ceil(math.log2(T)) if T > 1 else 0):
        has = ptr >= 0
        g = ptr.clamp(min=0)
        mask = mask | torch.where(has[..., None], torch.gather(mask, 1, g[..., None].expand(B, T, W)), 0)
        depth = depth + torch.where(has, torch.gather(depth, 1, g), 0)
        ptr = torch.where(has, torch.gather(ptr, 1, g), -1)
    mask = torch.where(valid[..., None], mask, 0)
    depth = torch.where(valid, depth, 0)
    return mask.contiguous(), depth.to(torch.int32)


# --------------------------------------------------------------------------------------------------
# Log-softmax and top-K per depth with the deterministic tie rule
# --------------------------------------------------------------------------------------------------
#
# The log-probabilities are ``lp = (x - m) - c`` in float32 with ``m`` the row maximum and
# ``c = log(S * 2^-SB)`` (float64, rounded to float32), where ``S = sum_v floor(exp(x_v - m) * 2^SB)``
# is an int64 fixed-point sum (``SB = 62 - ceil(log2 V)``: no overflow, absolute error below
# ``V 2^-SB`` <= 2^-26 for V <= 2^18, relative to ``S >= 1``). An integer sum does not depend on the order
# of the additions, so the multi-program kernels, the interpreter and the reference agree bit for bit
# wherever their ``exp`` agree (the GPU's ``exp`` differs in the last bits, which moves ``c`` by at most
# about one float32 ulp).


def _sum_bits(Vv: int) -> int:
    return 62 - max(0, (Vv - 1).bit_length())


def log_softmax_reference(logits: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax over the last axis, computed as the kernels do (see above), on the CPU."""
    x = np.ascontiguousarray(logits.detach().float().cpu().numpy())
    sb = _sum_bits(x.shape[-1])
    bits = x.view(np.int32)
    key = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    kmax = key.max(-1, keepdims=True)  # the maximum by the order keys (+0.0 above -0.0)
    m = np.ascontiguousarray(np.where(kmax < 0, kmax ^ 0x7FFFFFFF, kmax).astype(np.int32)).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = x - m
        q = (np.exp(y) * np.float32(2.0 ** sb)).astype(np.int64)
        s = q.sum(-1, keepdims=True)
        c = np.log(s.astype(np.float64) * 2.0 ** -sb).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(y - c))


def _order_keys(lp: torch.Tensor) -> torch.Tensor:
    """int64 keys in the total order of the tie rule: larger key = larger lp, then lower token id."""
    Vv = lp.shape[-1]
    bits = lp.contiguous().view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # monotonic in the float
    ids = torch.arange(Vv, device=lp.device, dtype=torch.int64)
    return (ordered << 32) | (Vv - 1 - ids)


def topk_per_depth(draft_logits: torch.Tensor, k: int, *, kernel: bool = False):
    """``(lp [B, D, k] float32, ids [B, D, k] int32)``: the k most likely tokens per depth, sorted by
    log-probability (descending), ties by lower token id. With ``kernel``, the fused GPU path
    (:func:`_topk_device`, log-softmax included); else the reference: :func:`log_softmax_reference`
    and ``torch.topk`` of :func:`_order_keys` on the CPU."""
    if kernel:
        return _topk_device(draft_logits, k)
    lp = log_softmax_reference(draft_logits)
    top = torch.topk(_order_keys(lp), k, dim=-1, sorted=True).indices
    return torch.gather(lp, -1, top), top.to(torch.int32)


@triton.jit
def _okey(x):
    """float32 -> int32 key, monotonic (larger float, larger key; -0.0 just below +0.0)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _ofloat(k):
    """Inverse of :func:`_okey`."""
    return tl.where(k < 0, k ^ 0x7FFFFFFF, k).to(tl.float32, bitcast=True)


@triton.jit
def _row_ptr(X, r, D, stride_xb, stride_xd):
    b = r // D
    return X + b.to(tl.int64) * stride_xb + (r - b * D).to(tl.int64) * stride_xd


@triton.jit
def _topk_bound_kernel(X, Part, State, Arrive, V, D, stride_xb, stride_xd, stride_xv, n_blocks, bpc, C1, K, cmax,
                       G: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr, WAYS: tl.constexpr):
    """Pass 1 over the logits of row ``r`` (a (request, depth) pair), chunk ``c`` (``bpc`` blocks of
    ``RB x G``): the maximum of every residue class ``v mod G`` (as order keys). The last program of
    the row (arrival counter) combines the chunks: the row maximum ``m``, and ``L`` = the K-th largest
    class maximum, a lower bound of the K-th largest logit (K distinct tokens reach it). It stores
    ``m`` and a threshold ``y_thr`` on ``y = x - m`` a little below ``L - m``, such that every token whose
    log-probability can equal or exceed that of ``L`` has ``y >= y_thr`` (the log-probabilities are
    ``fl(y - c)`` with ``0 <= c <= cmax``: rounding merges ``y`` only within an ulp of the result)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    row = _row_ptr(X, r, D, stride_xb, stride_xd)
    gi = tl.arange(0, G)
    ri = tl.arange(0, RB)
    acc = tl.full([G], -2147483648, tl.int32)
    for blk in range(c * bpc, tl.minimum(c * bpc + bpc, n_blocks)):
        v = blk * (RB * G) + ri[:, None] * G + gi[None, :]
        ok = v < V
        x = tl.load(row + v.to(tl.int64) * stride_xv, mask=ok, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.max(tl.where(ok, _okey(x), -2147483648), 0))
    tl.store(Part + (r * C1 + c).to(tl.int64) * G + gi, acc)
    tl.debug_barrier()
    if tl.atomic_add(Arrive + r, 1, sem="acq_rel") == C1 - 1:  # the last chunk of the row to finish
        ci = tl.arange(0, CB)
        gmax = tl.full([G], -2147483648, tl.int32)
        for c0 in range(0, C1, CB):
            cc = c0 + ci
            p = tl.load(Part + (r * C1 + cc[:, None]).to(tl.int64) * G + gi[None, :], mask=cc[:, None] < C1,
                        other=-2147483648, cache_modifier=".cg")
            gmax = tl.maximum(gmax, tl.max(p, 0))
        u = gmax.to(tl.int64) + 2147483648  # unsigned order keys, 0 = empty class
        lo = tl.min(u, 0)  # count(u >= lo) = G >= K
        hi = tl.max(u, 0)
        lo = _kth_largest(u, K, lo, hi, WAYS)
        m = _ofloat((hi - 2147483648).to(tl.int32))
        y_l = _ofloat((lo - 2147483648).to(tl.int32)) - m
        y_thr = y_l - (tl.abs(y_l) + cmax) * 9.5367431640625e-07  # 2^-20 relative: 8 ulps and more
        tl.store(State + 2 * r, m)
        tl.store(State + 2 * r + 1, y_thr)


@triton.jit
def _kth_largest(u, K, lo, hi, WAYS: tl.constexpr):
    """The largest ``t`` in ``[lo, hi]`` with ``count(u >= t) >= K`` (given ``count(u >= lo) >= K``):
    ``WAYS``-way bisection, one [n, WAYS] count per step."""
    j = tl.arange(0, WAYS).to(tl.int64)
    while lo < hi:
        step = (hi - lo + WAYS) // WAYS
        t = lo + j * step
        cnt = tl.sum((u[:, None] >= t[None, :]).to(tl.int32), 0)
        best = tl.max(tl.where((cnt >= K) & (t <= hi), j, 0), 0)
        lo = lo + best * step
        hi = tl.minimum(hi, lo + step - 1)
    return lo


@triton.jit
def _row_count_ge(row, V, stride_xv, m, cl, t, FB: tl.constexpr):
    """``[16]`` counts of log-probability keys (unsigned) >= ``t[j]`` over a whole row."""
    cnt = tl.zeros([16], tl.int32)
    for v0 in range(0, V, FB):
        v = v0 + tl.arange(0, FB)
        ok = v < V
        x = tl.load(row + v.to(tl.int64) * stride_xv, mask=ok, other=0.0).to(tl.float32)
        u = _okey((x - m) - cl).to(tl.int64) + 2147483648
        cnt += tl.sum(((u[:, None] >= t[None, :]) & ok[:, None]).to(tl.int32), 0)
    return cnt


@triton.jit
def _topk_fallback(row, Cand, V, stride_xv, m, cl, y_thr, K, FB: tl.constexpr, FB2: tl.constexpr):
    """Exact top-K of a whole row by one program, for when the candidates overflowed (massive ties at
    the threshold): the K-th largest log-probability key by sixteen-way bisection (a pass over the row
    per step, from a narrow range), then one pass in token order that keeps all greater keys and the
    lowest ids among the equal ones. Writes K token ids to ``Cand``."""
    j = tl.arange(0, 16).to(tl.int64)
    lo = _okey(y_thr - cl).to(tl.int64) + 2147483648  # every lp >= lp(L) has a key >= lo: count >= K
    hi = _okey(0.0 - cl).to(tl.int64) + 2147483648  # the maximum log-probability
    while lo < hi:
        step = (hi - lo + 16) // 16
        t = lo + j * step
        cnt = _row_count_ge(row, V, stride_xv, m, cl, t, FB)
        best = tl.max(tl.where((cnt >= K) & (t <= hi), j, 0), 0)
        lo = lo + best * step
        hi = tl.minimum(hi, lo + step - 1)
    n_gt = 0
    for v0 in range(0, V, FB2):
        v = v0 + tl.arange(0, FB2)
        x = tl.load(row + v.to(tl.int64) * stride_xv, mask=v < V, other=0.0).to(tl.float32)
        n_gt += tl.sum(((v < V) & (_okey((x - m) - cl).to(tl.int64) + 2147483648 > lo)).to(tl.int32), 0)
    need = K - n_gt
    n_eq = 0
    n_sel = 0
    for v0 in range(0, V, FB2):
        v = v0 + tl.arange(0, FB2)
        ok = v < V
        x = tl.load(row + v.to(tl.int64) * stride_xv, mask=ok, other=0.0).to(tl.float32)
        u = _okey((x - m) - cl).to(tl.int64) + 2147483648
        eq = ok & (u == lo)
        sel = (ok & (u > lo)) | (eq & (n_eq + tl.cumsum(eq.to(tl.int32), 0) <= need))
        pos = n_sel + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(Cand + pos, v, mask=sel & (pos < K))
        n_eq += tl.sum(eq.to(tl.int32), 0)
        n_sel += tl.sum(sel.to(tl.int32), 0)


@triton.jit
def _topk_select_kernel(X, State, Spart, Cnt, Arrive, Cand, KeyBuf, OutLP, OutIds,
                        V, D, stride_xb, stride_xd, stride_xv, n_blocks, bpc, C2, K, CAP, scale, inv_scale,
                        BLOCK: tl.constexpr, CP: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr,
                        FB: tl.constexpr):
    """Pass 2 over row ``r``, chunk ``c``: the fixed-point partial sum of ``exp(x - m)`` and the
    candidates ``y = x - m >= y_thr`` (token ids appended to the row's list through an atomic counter;
    a superset of the top K, a little over K of them on real data). The last program of the row takes
    the normaliser ``c``, computes the candidates' order keys (log-probability, then lower id), ranks
    each by counting the greater keys and writes the top K in order. If more than ``CAP`` candidates
    came (massive ties at the threshold), it selects the row's top K exactly by itself first
    (:func:`_topk_fallback`)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    row = _row_ptr(X, r, D, stride_xb, stride_xd)
    m = tl.load(State + 2 * r)
    y_thr = tl.load(State + 2 * r + 1)
    cand_row = Cand + r.to(tl.int64) * CAP
    s_acc = tl.zeros([BLOCK], tl.int64)
    for blk in range(c * bpc, tl.minimum(c * bpc + bpc, n_blocks)):
        v = blk * BLOCK + tl.arange(0, BLOCK)
        ok = v < V
        x = tl.load(row + v.to(tl.int64) * stride_xv, mask=ok, other=0.0).to(tl.float32)
        y = x - m
        s_acc += (tl.exp(tl.where(ok, y, float("-inf"))) * scale).to(tl.int64)
        cand = ok & (y >= y_thr)
        n_loc = tl.sum(cand.to(tl.int32), 0)
        if n_loc > 0:
            pos = tl.atomic_add(Cnt + r, n_loc) + tl.cumsum(cand.to(tl.int32), 0) - 1
            tl.store(cand_row + pos, v, mask=cand & (pos < CAP))
    tl.store(Spart + r * C2 + c, tl.sum(s_acc, 0))
    tl.debug_barrier()
    if tl.atomic_add(Arrive + r, 1, sem="acq_rel") == C2 - 1:  # the last chunk of the row to finish
        ci = tl.arange(0, CP)
        s = tl.sum(tl.load(Spart + r * C2 + ci, mask=ci < C2, other=0, cache_modifier=".cg"), 0)
        cl = tl.log(s.to(tl.float64) * inv_scale).to(tl.float32)
        n = tl.atomic_add(Cnt + r, 0)
        if (n > CAP) | (n < K):  # (fewer than K only for a row without a finite logit)
            _topk_fallback(row, cand_row, V, stride_xv, m, cl, y_thr, K, FB, BLOCK)
            n = K
            tl.debug_barrier()
        key_row = KeyBuf + r.to(tl.int64) * CAP
        for j0 in range(0, n, BJ):
            jj = j0 + tl.arange(0, BJ)
            ok = jj < n
            ids = tl.minimum(tl.maximum(tl.load(cand_row + jj, mask=ok, other=0, cache_modifier=".cg"), 0), V - 1)
            x = tl.load(row + ids.to(tl.int64) * stride_xv, mask=ok, other=0.0).to(tl.float32)
            key = (_okey((x - m) - cl).to(tl.int64) << 32) | (V - 1 - ids).to(tl.int64)
            tl.store(key_row + jj, key, mask=ok)
        tl.debug_barrier()
        out = r.to(tl.int64) * K
        for i0 in range(0, n, BI):
            ii = i0 + tl.arange(0, BI)
            ki = tl.load(key_row + ii, mask=ii < n, other=-9223372036854775808)
            rank = tl.zeros([BI], tl.int32)
            for j0 in range(0, n, BJ):
                jj = j0 + tl.arange(0, BJ)
                kj = tl.load(key_row + jj, mask=jj < n, other=-9223372036854775808)
                rank += tl.sum((kj[None, :] > ki[:, None]).to(tl.int32), 1)
            sel = (ii < n) & (rank < K)
            tl.store(OutLP + out + rank, _ofloat((ki >> 32).to(tl.int32)), mask=sel)
            tl.store(OutIds + out + rank, (V - 1) - (ki & 0xFFFFFFFF).to(tl.int32), mask=sel)


class _TopkPlan(NamedTuple):
    G: int
    block1: int
    bpc1: int
    c1: int
    block2: int
    bpc2: int
    c2: int
    cap: int


def _topk_plan(R: int, Vv: int, k: int, device, *, block1=None, block2=None, ctas=None, cap=None) -> _TopkPlan:
    """Static launch shapes of the top-k passes (keyword overrides for tests)."""
    G = min(4096, triton.next_power_of_2(max(16, 4 * k)))  # residue classes: >= K, ~4K for a tight bound
    if G < k:
        G = triton.next_power_of_2(k)
    target = ctas if ctas is not None else 4 * num_sms(device)  # programs per pass, all rows together
    block1 = block1 or max(G, min(4096, triton.next_power_of_2(Vv)))
    block1 = max(block1, G)
    n1 = triton.cdiv(Vv, block1)
    c1 = max(1, min(n1, triton.cdiv(target, R), max(1, 65536 // G)))  # the last program reads c1 x G maxima
    bpc1 = triton.cdiv(n1, c1)
    block2 = block2 or max(16, min(2048, triton.next_power_of_2(Vv)))
    n2 = triton.cdiv(Vv, block2)
    c2 = max(1, min(n2, triton.cdiv(target, R)))
    bpc2 = triton.cdiv(n2, c2)
    return _TopkPlan(G, block1, bpc1, triton.cdiv(n1, bpc1), block2, bpc2, triton.cdiv(n2, bpc2),
                     cap if cap is not None else max(1024, 4 * k))


class _TopkLaunch:
    """The two top-k passes for ``[B, D, V]`` logits of given strides, k and plan, kernels bound once; ``run``
    takes the scratch (``scratch()``: counters, partial maxima, state, candidates, keys) and the outputs."""

    def __init__(self, B: int, D: int, Vv: int, strides: tuple, k: int, device, **plan_overrides):
        if not 1 <= k <= Vv:
            raise ValueError(f"k must be in [1, V] = [1, {Vv}], got {k}")
        p = _topk_plan(B * D, Vv, k, device, **plan_overrides)
        if p.cap < k:
            raise ValueError(f"cap must be >= k, got {p.cap} < {k}")
        self.p, self.B, self.D, self.k, self.device = p, B, D, k, device
        R = B * D
        sb = _sum_bits(Vv)
        self._bound = KernelLauncher(_topk_bound_kernel, dict(
            G=p.G, RB=p.block1 // p.G, CB=max(1, min(triton.next_power_of_2(p.c1), 8192 // p.G)),
            WAYS=max(2, min(16, 8192 // p.G))), num_warps=4)
        self._bound_grid = (R, p.c1, 1)
        self._bound_ints = (Vv, D, *strides, triton.cdiv(Vv, p.block1), p.bpc1, p.c1, k, math.log(Vv) + 1.0)
        self._select = KernelLauncher(_topk_select_kernel, dict(BLOCK=p.block2, CP=triton.next_power_of_2(p.c2),
                                                                BI=64, BJ=64, FB=256), num_warps=4)
        self._select_grid = (R, p.c2, 1)
        self._select_ints = (Vv, D, *strides, triton.cdiv(Vv, p.block2), p.bpc2, p.c2, k, p.cap, 2.0 ** sb, 2.0 ** -sb)

    def scratch(self):
        R, p, dev = self.B * self.D, self.p, self.device
        counters = torch.empty(3, R, dtype=torch.int32, device=dev)  # arrivals of pass 1, of pass 2, candidates
        return (counters, counters[0], counters[1], counters[2],
                torch.empty(R, p.c1, p.G, dtype=torch.int32, device=dev),
                torch.empty(R, 2, dtype=torch.float32, device=dev),
                torch.empty(R, p.c2, dtype=torch.int64, device=dev),
                torch.empty(R, p.cap, dtype=torch.int32, device=dev),
                torch.empty(R, p.cap, dtype=torch.int64, device=dev),
                torch.empty(self.B, self.D, self.k, dtype=torch.float32, device=dev),
                torch.empty(self.B, self.D, self.k, dtype=torch.int32, device=dev))

    def run(self, draft_logits, scratch):
        counters, arrive1, arrive2, n_cand, part, state, spart, cand, keybuf, lp, ids = scratch
        counters.zero_()
        self._bound(self._bound_grid, draft_logits, part, state, arrive1, *self._bound_ints)
        self._select(self._select_grid, draft_logits, state, spart, n_cand, arrive2, cand, keybuf, lp, ids,
                     *self._select_ints)
        return lp, ids


def _topk_device(draft_logits: torch.Tensor, k: int, **plan_overrides):
    """GPU (or interpreter) top-k of :func:`topk_per_depth`: a memset and two passes over the logits,
    no host sync, static shapes (CUDA-graph capturable)."""
    B, D, Vv = draft_logits.shape
    launch = _TopkLaunch(B, D, Vv, draft_logits.stride(), k, draft_logits.device, **plan_overrides)
    return launch.run(draft_logits, launch.scratch())


# --------------------------------------------------------------------------------------------------
# Best-first search
# --------------------------------------------------------------------------------------------------

@triton.jit
def _pick_max(k1, p1, k2, p2):
    pick = k1 > k2
    return tl.where(pick, k1, k2), tl.where(pick, p1, p2)


@triton.jit
def _ddtree_kernel(LP, IDS, RootTokens, Tokens, Parents, Depth, Scores, Ranks, TreeLens, Mask, D, K, budget, T, W,
                   NS: tl.constexpr, PF: tl.constexpr, BN: tl.constexpr, WP: tl.constexpr):
    """Best-first search of request ``b`` over its top-K table ``LP [D, K]`` (sorted rows).

    The frontier holds at most one candidate per parent (a created node, or the root): its next child.
    Slot ``p < NS`` (nodes ``0 .. budget - 1``: the last node's children are never popped) keeps
    ``key = ordered(score) << 32 | (65535 - push order) << 16 | p`` and the candidate's
    ``rank << 8 | depth``; one max-reduction of (key, payload) pops the best candidate with the tie
    rule (equal scores: the earlier push). Popping (p, d, r) creates node n, then slot p takes the
    next sibling (rank r + 1) and slot n the first child. The table is pulled into L1 first, so the
    three look-ups of a pop hit L1. After the search: the tokens (one gather), padding, and the
    ancestor bitmask (at most D steps up from every node)."""
    b = tl.program_id(0)
    lp_row = LP + b.to(tl.int64) * D * K
    out = b.to(tl.int64) * T
    # Pull the table into L1 (the sum keeps the loads alive; lp has no NaN, so the store never runs).
    chk = tl.zeros([PF], tl.float32)
    for f0 in range(0, D * K, PF):
        f = f0 + tl.arange(0, PF)
        chk += tl.load(lp_row + f, mask=f < D * K, other=0.0)
    if tl.sum(chk, 0) != tl.sum(chk, 0):
        tl.store(TreeLens + b, -1)
    slot = tl.arange(0, NS)
    EMPTY: tl.constexpr = -9223372036854775808
    s0 = tl.load(lp_row)
    k0 = (_okey(s0 + 0.0).to(tl.int64) << 32) | 4294901760  # push 0, slot 0
    f_key = tl.where(slot == 0, tl.where(s0 > float("-inf"), k0, EMPTY), EMPTY)
    f_pay = tl.where(slot == 0, 1, 0)  # rank 0, depth 1
    n_push = 1
    n_nodes = 0
    kmax, pay = tl.reduce((f_key, f_pay), 0, _pick_max)
    while (n_nodes < budget) & (kmax != EMPTY):
        p = (kmax & 0xFFFF).to(tl.int32)
        s = _ofloat((kmax >> 32).to(tl.int32))
        d = pay & 255
        r = pay >> 8
        n_nodes += 1
        node = n_nodes
        at = out + node
        tl.store(Parents + at, p)
        tl.store(Depth + at, d)
        tl.store(Scores + at, s)
        tl.store(Ranks + at, r)
        has_sib = r + 1 < K
        has_child = d < D
        lp_d = lp_row + (d - 1) * K
        lp_r = tl.load(lp_d + r)
        lp_r1 = tl.load(lp_d + r + 1, mask=has_sib, other=float("-inf"))
        lp_c = tl.load(lp_d + K, mask=has_child, other=float("-inf"))
        sc = (s - lp_r) + lp_r1  # next sibling (same parent p), as the reference computes it
        ks = (_okey(sc + 0.0).to(tl.int64) << 32) | ((65535 - n_push).to(tl.int64) << 16) | p.to(tl.int64)
        n_push += has_sib.to(tl.int32)
        cc = s + lp_c  # first child (parent: the new node)
        kc = (_okey(cc + 0.0).to(tl.int64) << 32) | ((65535 - n_push).to(tl.int64) << 16) | node.to(tl.int64)
        n_push += has_child.to(tl.int32)
        f_key = tl.where(slot == p, tl.where(sc > float("-inf"), ks, EMPTY),
                         tl.where(slot == node, tl.where(cc > float("-inf"), kc, EMPTY), f_key))
        f_pay = tl.where(slot == p, ((r + 1) << 8) | d, tl.where(slot == node, d + 1, f_pay))
        kmax, pay = tl.reduce((f_key, f_pay), 0, _pick_max)
    tl.store(TreeLens + b, n_nodes + 1)
    tl.debug_barrier()  # the loop's stores, visible to every thread of the program
    root_tok = tl.load(RootTokens + b).to(tl.int32)
    wi = tl.arange(0, WP)
    for i0 in range(0, T, BN):
        i = i0 + tl.arange(0, BN)
        in_t = i < T
        valid = in_t & (i <= n_nodes)
        node_ok = valid & (i >= 1)
        d = tl.load(Depth + out + i, mask=node_ok, other=1)
        rk = tl.load(Ranks + out + i, mask=node_ok, other=0)
        tok = tl.load(IDS + b.to(tl.int64) * D * K + (d - 1) * K + rk, mask=node_ok, other=0)
        tl.store(Tokens + out + i, tl.where(i == 0, root_tok, tok), mask=in_t)
        fill = in_t & ~node_ok  # root and padding
        tl.store(Parents + out + i, tl.full([BN], -1, tl.int32), mask=fill)
        tl.store(Depth + out + i, tl.zeros([BN], tl.int32), mask=fill)
        tl.store(Scores + out + i, tl.where(i == 0, 0.0, float("-inf")), mask=fill)
        cur = tl.where(valid, i, -1)
        bits = tl.zeros([BN, WP], tl.int32)
        for _ in range(D + 1):
            live = cur >= 0
            bit = tl.full([BN], 1, tl.int32) << (cur & 31)
            bits |= tl.where(live[:, None] & (wi[None, :] == (cur >> 5)[:, None]), bit[:, None], 0)
            up = live & (cur > 0)
            cur = tl.where(up, tl.load(Parents + out + cur, mask=up, other=-1), -1)
        tl.store(Mask + (out + i)[:, None] * W + wi[None, :], bits, mask=in_t[:, None] & (wi[None, :] < W))


def build_tree_reference(draft_logits, budget: int, root_tokens):
    """Plain heap implementation of DDTree (the specification), float32 scores with the same
    operations as the kernel. Returns a :class:`Tree` on the CPU."""
    B, D, Vv = draft_logits.shape
    K = min(budget, Vv)
    lp_t, ids_t = topk_per_depth(draft_logits.cpu(), K)
    lp, ids = lp_t.numpy(), ids_t.numpy()
    T = budget + 1
    tokens = np.zeros((B, T), np.int32)
    parents = np.full((B, T), -1, np.int32)
    depth = np.zeros((B, T), np.int32)
    scores = np.full((B, T), -np.inf, np.float32)
    lens = np.zeros(B, np.int32)
    f32 = np.float32
    for b in range(B):
        tokens[b, 0] = int(root_tokens[b])
        scores[b, 0] = 0.0
        heap = [(-f32(lp[b, 0, 0]), 0, 1, 0, 0)] if lp[b, 0, 0] > -np.inf else []  # (-score, push, depth, rank, parent)
        pushes, n = 1, 0
        while heap and n < budget:
            neg, _, d, r, par = heapq.heappop(heap)
            s = f32(-neg)
            n += 1
            tokens[b, n], parents[b, n], depth[b, n], scores[b, n] = ids[b, d - 1, r], par, d, s
            if r + 1 < K:  # next sibling
                sc = f32(s - lp[b, d - 1, r]) + lp[b, d - 1, r + 1]
                if sc > -np.inf:  # a token of probability 0 is never a node
                    heapq.heappush(heap, (-sc, pushes, d, r + 1, par))
                pushes += 1
            if d < D:  # first child
                cc = s + lp[b, d, 0]
                if cc > -np.inf:
                    heapq.heappush(heap, (-cc, pushes, d + 1, 0, n))
                pushes += 1
        lens[b] = n + 1
    tl_ = torch.from_numpy(lens)
    par_t = torch.from_numpy(parents)
    mask, dep = tree_mask_from_parents(par_t, tl_)
    return Tree(torch.from_numpy(tokens), par_t, dep, torch.from_numpy(scores), tl_, mask)


class _SearchLaunch:
    """The best-first search kernel over a ``[B, D, K]`` top-k table (rows sorted) for ``budget``, bound once."""

    def __init__(self, B: int, D: int, K: int, budget: int, device):
        self.B, self.T, self.device = B, budget + 1, device
        T = budget + 1
        self.W = W = (T + 31) // 32
        ns = max(32, triton.next_power_of_2(budget))  # slots: the root and nodes 1 .. budget - 1
        warps = max(1, min(4, ns // 512))
        wp = triton.next_power_of_2(W)
        bn = max(1, min(triton.next_power_of_2(T), 16 * 32 * warps // wp))
        self._ints = (D, K, budget, T, W)
        self._launch = KernelLauncher(_ddtree_kernel, dict(NS=ns, PF=1024, BN=bn, WP=wp), num_warps=warps)

    def run(self, lp, ids, root_tokens, ranks=None) -> Tree:
        B, T, dev = self.B, self.T, self.device
        tokens = torch.empty(B, T, dtype=torch.int32, device=dev)
        parents = torch.empty(B, T, dtype=torch.int32, device=dev)
        depth = torch.empty(B, T, dtype=torch.int32, device=dev)
        scores = torch.empty(B, T, dtype=torch.float32, device=dev)
        tree_lens = torch.empty(B, dtype=torch.int32, device=dev)
        mask = torch.empty(B, T, self.W, dtype=torch.int32, device=dev)
        if ranks is None:
            ranks = torch.empty(B, T, dtype=torch.int32, device=dev)
        self._launch((B, 1, 1), lp, ids, root_tokens, tokens, parents, depth, scores, ranks, tree_lens, mask, *self._ints)
        return Tree(tokens, parents, depth, scores, tree_lens, mask)


def _search_device(lp: torch.Tensor, ids: torch.Tensor, root_tokens: torch.Tensor, budget: int) -> Tree:
    """The best-first search kernel over a top-k table (``lp``, ``ids``: ``[B, D, K]``, rows sorted)."""
    B, D, K = lp.shape
    return _SearchLaunch(B, D, K, budget, lp.device).run(lp.contiguous(), ids.contiguous(), root_tokens)


def _validate_build(draft_logits, budget, root_tokens):
    V.check_tensor("draft_logits", draft_logits, ndim=3, dtypes=(torch.float32, torch.float16, torch.bfloat16),
                   last_contiguous=False)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")
    B, D, Vv = draft_logits.shape
    if D < 1 or Vv < 1:
        raise ValueError(f"draft_logits must have D >= 1 depths and V >= 1 tokens, got {tuple(draft_logits.shape)}")
    if D > 255 or budget > 32000:
        raise ValueError(f"build_tree supports D <= 255 and budget <= 32000, got D={D}, budget={budget}")
    V.check_tensor("root_tokens", root_tokens, ndim=1, dtypes=(torch.int32, torch.int64), device=draft_logits.device)
    V.check_shape("root_tokens", root_tokens, (B,), "[B]")


class _BuildTreePlan:
    """build_tree for one static signature (logits' and roots' layouts, budget): validated, the top-k and
    search kernels bound once, their scratch one set per CUDA stream (a fresh set inside a graph capture)."""

    def __init__(self, draft_logits, budget, root_tokens):
        _validate_build(draft_logits, budget, root_tokens)
        self.budget = budget
        dev = draft_logits.device
        self.reference = dev.type != "cuda" and not _interpreting()
        if self.reference:
            return
        B, D, Vv = draft_logits.shape
        K = min(budget, Vv)
        self._topk = _TopkLaunch(B, D, Vv, draft_logits.stride(), K, dev)
        self._search = _SearchLaunch(B, D, K, budget, dev)
        self._scratch = StreamScratch(lambda: (self._topk.scratch(),
                                               torch.empty(B, budget + 1, dtype=torch.int32, device=dev)))

    def run(self, draft_logits, root_tokens) -> Tree:
        if V.checks_values(draft_logits.device) and bool(torch.isnan(draft_logits).any()):
            raise ValueError("draft_logits contains NaN")
        if self.reference:
            t = build_tree_reference(draft_logits, self.budget, root_tokens)
            return Tree(*(x.to(draft_logits.device) for x in t))
        topk_scratch, ranks = self._scratch.get(draft_logits.device)
        lp, ids = self._topk.run(draft_logits, topk_scratch)
        return self._search.run(lp, ids, root_tokens, ranks)


_BUILD_PLANS = PlanCache("build_tree", _BuildTreePlan)


def build_tree(draft_logits: torch.Tensor, budget: int, root_tokens: torch.Tensor) -> Tree:
    """DDTree: the ``budget`` most likely nodes of the product-of-marginals lattice, parents first.

    Args:
        draft_logits: ``[B, D, V]`` draft logits for depths 1..D (float; log-softmax taken here).
        budget: nodes besides the root (>= 1); ``T = budget + 1``.
        root_tokens: ``[B]`` int token of the root (the last accepted / bonus token).
    Returns a :class:`Tree` (static shapes; fewer nodes than the budget only when fewer are
    reachable: ``sum_d K^d`` with ``K = min(budget, V)``, or when tokens have probability 0: a
    candidate of score -inf is never created). No host sync: three kernels and a memset. Eager calls run
    a plan cached per static signature.
    """
    if eager():
        try:
            key = (signature(draft_logits, root_tokens), budget)
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable budget: validation says which
            _validate_build(draft_logits, budget, root_tokens)
            raise
        return _BUILD_PLANS.get(key, draft_logits, budget, root_tokens).run(draft_logits, root_tokens)
    _validate_build(draft_logits, budget, root_tokens)
    if draft_logits.device.type != "cuda" and not _interpreting():
        t = build_tree_reference(draft_logits, budget, root_tokens)
        return Tree(*(x.to(draft_logits.device) for x in t))
    return Tree(*_build_tree_op(draft_logits, budget, root_tokens))


# Opaque to torch.compile (as the KV and MoE ops): the kernels hand work between programs through
# counters and scratch buffers that Inductor's analysis of user kernels cannot follow; compiled
# decode steps gave out-of-range token ids without this (measured on the H200).
@torch.library.custom_op("tritree::build_tree", mutates_args=())
def _build_tree_op(draft_logits: torch.Tensor, budget: int, root_tokens: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    lp, ids = topk_per_depth(draft_logits, min(budget, draft_logits.shape[-1]), kernel=True)
    return tuple(_search_device(lp, ids, root_tokens, budget))


@_build_tree_op.register_fake
def _(draft_logits, budget, root_tokens):
    B, T = draft_logits.shape[0], budget + 1
    new = draft_logits.new_empty
    i32 = torch.int32
    return (new(B, T, dtype=i32), new(B, T, dtype=i32), new(B, T, dtype=i32), new(B, T, dtype=torch.float32),
            new(B, dtype=i32), new(B, T, (T + 31) // 32, dtype=i32))


# --------------------------------------------------------------------------------------------------
# Acceptance
# --------------------------------------------------------------------------------------------------

@triton.jit
def _gumbel_pick_kernel(Logits, Thresh, PartVal, PartIdx, stride_r, R, V, chunk, n_chunks, inv_temp, seed, StepPtr, T,
                        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per row (request b, node i) and chunk of the vocabulary: the max over the chunk's v of
    logits/temp + Gumbel(u(seed, step, b, i, v)) among tokens with logit >= Thresh[row], and its
    lowest index; the partials are reduced across chunks afterwards (first max = lowest id)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1)
    r_ok = rows < R
    b = rows // T
    i = rows % T
    base = Logits + rows.to(tl.int64)[:, None] * stride_r
    thresh = tl.load(Thresh + rows, mask=r_ok, other=0.0)
    best_val = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_R], dtype=tl.int32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, V)
    step = tl.load(StepPtr)  # from memory: a captured graph replays with the current step
    for v0 in range(lo, hi, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        ok = r_ok[:, None] & (v < hi)[None, :]
        x = tl.load(base + v[None, :], mask=ok, other=float("-inf")).to(tl.float32)
        # Philox counter: (seed, step) pick the key, (request, node, token) the counter
        u = tl.rand(seed + step * 1000003, (b * T + i)[:, None].to(tl.int64) * V + v[None, :])
        u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
        g = -tl.log(-tl.log(u))
        score = tl.where(ok & (x >= thresh[:, None]), x * inv_temp + g, float("-inf"))
        m = tl.max(score, 1)
        idx = tl.min(tl.where(score == m[:, None], v[None, :], V), 1)
        take = m > best_val
        best_idx = tl.where(take, idx, best_idx)
        best_val = tl.where(take, m, best_val)
    tl.store(PartVal + rows * n_chunks + c, best_val, mask=r_ok)
    tl.store(PartIdx + rows * n_chunks + c, best_idx, mask=r_ok)


@triton.jit
def _walk_kernel(Tokens, Parents, TreeLens, Picks, AcceptIdx, AcceptLen, Bonus, stride_b, T,
                 BLOCK_T: tl.constexpr):
    b = tl.program_id(0)
    row = b.to(tl.int64) * stride_b
    node = tl.arange(0, BLOCK_T)
    n = tl.load(TreeLens + b)
    valid = (node < T) & (node < n)
    tok = tl.load(Tokens + row + node, mask=valid, other=-1)
    par = tl.load(Parents + row + node, mask=valid, other=-2)
    tl.store(AcceptIdx + row + node, -1, mask=node < T)
    cur = 0
    length = 0
    if n > 0:
        tl.store(AcceptIdx + row, 0)
        length = 1
        going = 1
        while going > 0:
            pick = tl.load(Picks + row + cur)
            match = valid & (par == cur) & (tok == pick)
            nxt = tl.min(tl.where(match, node, BLOCK_T), 0)
            going = (nxt < BLOCK_T).to(tl.int32)
            if going > 0:
                tl.store(AcceptIdx + row + length, nxt)
                length += 1
                cur = nxt
        tl.store(Bonus + b, tl.load(Picks + row + cur))
    else:
        tl.store(Bonus + b, -1)
    tl.store(AcceptLen + b, length)


def _filter_threshold(logits2d: torch.Tensor, temperature: float, top_k, top_p) -> torch.Tensor:
    """Per row, the smallest logit kept by top-k / top-p (ties at the threshold are kept)."""
    R, Vv = logits2d.shape
    thresh = torch.full((R,), float("-inf"), device=logits2d.device, dtype=torch.float32)
    if top_k is not None and top_k < Vv:
        thresh = torch.maximum(thresh, torch.topk(logits2d.float(), top_k, dim=-1).values[:, -1])
    if top_p is not None and top_p < 1.0:
        srt = torch.sort(logits2d.float(), dim=-1, descending=True).values
        masked = torch.where(srt >= thresh[:, None], srt, float("-inf"))
        probs = torch.softmax(masked / temperature, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        keep = before < top_p
        last = keep.sum(dim=-1).clamp(min=1) - 1
        thresh = torch.maximum(thresh, torch.gather(srt, 1, last[:, None])[:, 0])
    return thresh


def target_picks(target_logits, *, temperature=0.0, top_k=None, top_p=None, seed=0, step=0):
    """``[B, T]`` int32 token the target picks at every node (see module docstring)."""
    B, T, Vv = target_logits.shape
    if temperature == 0.0:
        return torch.argmax(target_logits, dim=-1).to(torch.int32)  # first maximum: lowest id on ties
    logits2d = target_logits.reshape(B * T, Vv)
    thresh = _filter_threshold(logits2d, temperature, top_k, top_p)
    if target_logits.device.type != "cuda" and not _interpreting():  # CPU path: torch's own generator
        g = torch.Generator().manual_seed((int(seed) * 1000003 + int(step)) & 0x7FFFFFFFFFFF)  # int(tensor) on the CPU
        u = torch.rand(logits2d.shape, generator=g).clamp(1e-20, 1 - 1e-7)
        score = torch.where(logits2d.float() >= thresh[:, None], logits2d.float() / temperature - torch.log(-torch.log(u)),
                            float("-inf"))
        return torch.argmax(score, dim=-1).to(torch.int32).view(B, T)
    if logits2d.stride(1) != 1:
        logits2d = logits2d.contiguous()
    R = B * T
    if isinstance(step, torch.Tensor):
        V.check_tensor("step", step, dtypes=(torch.int64,), device=target_logits.device)
        if step.numel() != 1:
            raise ValueError(f"step must be an int or a one-element int64 tensor, got shape {tuple(step.shape)}")
        step_t = step.reshape(1)
    else:
        step_t = torch.full((1,), int(step), dtype=torch.int64, device=target_logits.device)  # no host copy: capturable
    block_v = min(4096, triton.next_power_of_2(Vv))
    block_r = max(1, min(64, 4096 // block_v))
    row_blocks = triton.cdiv(R, block_r)
    # Split the vocabulary too, so that a few rows still fill the GPU (~4 programs per SM).
    n_chunks = max(1, min(triton.cdiv(Vv, block_v), triton.cdiv(4 * num_sms(target_logits.device), row_blocks)))
    chunk = triton.cdiv(triton.cdiv(Vv, n_chunks), block_v) * block_v
    n_chunks = triton.cdiv(Vv, chunk)
    part_val = torch.empty(R, n_chunks, dtype=torch.float32, device=target_logits.device)
    part_idx = torch.empty(R, n_chunks, dtype=torch.int32, device=target_logits.device)
    _gumbel_pick_kernel[(row_blocks, n_chunks)](
        logits2d, thresh, part_val, part_idx, logits2d.stride(0), R, Vv, chunk, n_chunks, 1.0 / temperature,
        int(seed) & 0x7FFFFFFF, step_t, T, BLOCK_R=block_r, BLOCK_V=block_v, num_warps=4)
    best = torch.argmax(part_val, dim=1, keepdim=True)  # first max: the lowest chunk, so the lowest id
    return torch.gather(part_idx, 1, best).view(B, T)


def accept_tree_reference(tokens, parents, tree_lens, picks):
    """Python walk over given picks: ``(accept_idx [B, T], accept_len [B], bonus [B])``."""
    B, T = tokens.shape
    idx = torch.full((B, T), -1, dtype=torch.int32)
    lens = torch.zeros(B, dtype=torch.int32)
    bonus = torch.full((B,), -1, dtype=torch.int32)
    for b in range(B):
        n = int(tree_lens[b])
        if n == 0:
            continue
        path, cur = [0], 0
        while True:
            nxt = [c for c in range(n) if int(parents[b, c]) == cur and int(tokens[b, c]) == int(picks[b, cur])]
            if not nxt:
                break
            cur = min(nxt)
            path.append(cur)
        idx[b, :len(path)] = torch.tensor(path, dtype=torch.int32)
        lens[b] = len(path)
        bonus[b] = int(picks[b, cur])
    return idx, lens, bonus


def accept_tree(tokens, parents, tree_lens, target_logits, *, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, seed: int = 0, step: int = 0):
    """Walks a tree with the target's choices.

    Args:
        tokens, parents: ``[B, T]`` int32 (a :class:`Tree`'s); tree_lens: ``[B]`` int32.
        target_logits: ``[B, T, V]`` from the verify pass (row i: the target's distribution after node i).
        temperature: 0 = greedy (argmax, lowest id on ties); > 0 samples (Gumbel-max) from
            ``softmax(logits / temperature)`` restricted to the top-k tokens and the top-p nucleus.
        seed, step: key the counter-based RNG (with request and node): reproducible, graph-capturable.
            ``step`` may be a one-element int64 tensor on the device (read by the kernel, so a captured
            graph advances it without recapture).
    Returns ``(accept_idx [B, T] int32 (root first, -1 padded), accept_len [B], bonus [B], picks [B, T])``.
    Eager calls run a plan cached per static signature.
    """
    if not eager():  # traced by torch.compile: the kernel launched as Dynamo traces launches
        _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        picks = target_picks(target_logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
        B, T = tokens.shape
        dev = tokens.device
        if dev.type != "cuda" and not _interpreting():
            return (*accept_tree_reference(tokens, parents, tree_lens, picks), picks)
        accept_idx = torch.empty(B, T, dtype=torch.int32, device=dev)
        accept_len = torch.empty(B, dtype=torch.int32, device=dev)
        bonus = torch.empty(B, dtype=torch.int32, device=dev)
        _walk_kernel[(B,)](tokens, parents, tree_lens, picks, accept_idx, accept_len, bonus, tokens.stride(0), T,
                           BLOCK_T=triton.next_power_of_2(T), num_warps=4)
        return accept_idx, accept_len, bonus, picks
    try:
        key = (signature(tokens, parents, tree_lens, target_logits), temperature, top_k, top_p)
        plan = _ACCEPT_PLANS.get(key, tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
    except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
        _AcceptPlan(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        raise
    return plan.run(tokens, parents, tree_lens, target_logits, seed, step)


def _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p):
    V.check_tensor("tokens", tokens, ndim=2, dtypes=(torch.int32,))
    dev = tokens.device
    B, T = tokens.shape
    V.check_tensor("parents", parents, ndim=2, dtypes=(torch.int32,), device=dev)
    V.check_shape("parents", parents, (B, T), "[B, T]")
    V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    V.check_tensor("target_logits", target_logits, ndim=3, dtypes=(torch.float32, torch.float16, torch.bfloat16),
                   device=dev, last_contiguous=False)
    if target_logits.shape[:2] != (B, T):
        raise ValueError(f"target_logits must have shape [B, T, V] = [{B}, {T}, V], got {tuple(target_logits.shape)}")
    if not (temperature >= 0.0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def _check_accept_values(parents, tree_lens, target_logits):
    T = parents.shape[1]
    idx = torch.arange(T)
    par = parents.cpu().to(torch.int64)
    valid = idx[None, :] < tree_lens.cpu()[:, None]
    ok = (par[:, 0] == -1) | ~valid[:, 0]
    ok &= ((par[:, 1:] >= 0) & (par[:, 1:] < idx[None, 1:]) | ~valid[:, 1:]).all(1)
    if not bool(ok.all()):
        b = int(torch.nonzero(~ok)[0, 0])
        raise ValueError(f"parents[{b}] is not a tree in parents-first order: {par[b].tolist()}")
    if bool(torch.isnan(target_logits).any()):
        raise ValueError("target_logits contains NaN")


class _AcceptPlan:
    """accept_tree for one static signature and sampling rule: validated, the walk kernel bound once."""

    def __init__(self, tokens, parents, tree_lens, target_logits, temperature, top_k, top_p):
        _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.B, self.T = tokens.shape
        self.device = tokens.device
        self.reference = self.device.type != "cuda" and not _interpreting()
        self._walk = KernelLauncher(_walk_kernel, dict(BLOCK_T=triton.next_power_of_2(self.T)), num_warps=4)
        self._ints = (tokens.stride(0), self.T)

    def run(self, tokens, parents, tree_lens, target_logits, seed, step):
        if V.checks_values(self.device):
            _check_accept_values(parents, tree_lens, target_logits)
        picks = target_picks(target_logits, seed=seed, step=step, **self.sampling)
        if self.reference:
            idx_, len_, bonus = accept_tree_reference(tokens, parents, tree_lens, picks)
            return idx_, len_, bonus, picks
        B, T, dev = self.B, self.T, self.device
        accept_idx = torch.empty(B, T, dtype=torch.int32, device=dev)
        accept_len = torch.empty(B, dtype=torch.int32, device=dev)
        bonus = torch.empty(B, dtype=torch.int32, device=dev)
        self._walk((B, 1, 1), tokens, parents, tree_lens, picks, accept_idx, accept_len, bonus, *self._ints)
        return accept_idx, accept_len, bonus, picks


_ACCEPT_PLANS = PlanCache("accept_tree", _AcceptPlan)
