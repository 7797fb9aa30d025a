"""DDTree construction from the draft's per-depth distributions (acceptance by the target: ``accept.py``).

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

``tree_mask_from_parents``: the ancestor bitmask and depth of any batch of trees given by parents (the
``tree_mask`` that :func:`tritree.verify_mla` reads), by pointer doubling in PyTorch.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, StreamScratch, eager, scalars, signature, uses_kernel
from .configs import num_sms


class Tree(NamedTuple):
    """A batch of draft trees, static shapes ``T = budget + 1`` (node 0 = root, parents first)."""

    tokens: torch.Tensor     # [B, T] int32 (padding 0)
    parents: torch.Tensor    # [B, T] int32 (root and padding -1)
    depth: torch.Tensor      # [B, T] int32 (root and padding 0)
    scores: torch.Tensor     # [B, T] float32 log-probability of the path (root 0, padding -inf)
    tree_lens: torch.Tensor  # [B] int32 valid nodes, root included
    tree_mask: torch.Tensor  # [B, T, ceil(T/32)] int32 ancestor bits


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
        if tree_lens is not None:
            V.check_value_range("tree_lens", tree_lens, 0, T, f" (T = {T} nodes)")
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
        tl.store(Arrive + r, 0)  # every chunk has arrived: zero for the next call


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
    (:func:`_topk_fallback`). Both passes zero their counters once every program of the row has used
    them: the counters are zeroed once, when the scratch is made, and every call leaves them zero."""
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
        tl.store(Cnt + r, 0)  # every chunk has arrived (and appended): zero for the next call
        tl.store(Arrive + r, 0)
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
        counters = torch.zeros(3, R, dtype=torch.int32, device=dev)  # arrivals of pass 1, of pass 2, candidates
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


def expected_accept(scores: torch.Tensor) -> torch.Tensor:
    """DDTree's objective for every best-first prefix of a batch of trees.

    Args:
        scores: ``[B, T]`` float32, a :class:`Tree`'s ``scores`` (log-probability of each node's path under
            the draft's product of marginals; root 0, padding -inf), nodes in best-first order.
    Returns:
        ``[B, T]`` float32, ``out[b, k] = sum_{i=1..k} exp(scores[b, i])``: the expected number of accepted
        nodes besides the root when only the first ``k + 1`` nodes (root included) are verified. A node is
        accepted iff its whole path matches the target, which under the draft's marginals has probability
        ``exp(score)``, so the expected accepted length is the sum over nodes (DDTree's surrogate).
        ``out[:, 0] = 0``; padding adds 0, so the curve is flat past ``tree_lens - 1``. Best-first order
        pops scores in non-increasing order, so every row is concave in ``k``.

    Two elementwise ops and a cumsum on the device: no host sync, static shapes (graph-capturable).
    """
    V.check_tensor("scores", scores, ndim=2, dtypes=(torch.float32,), last_contiguous=False)
    p = torch.exp(scores)
    p[:, :1] = 0.0  # the root is the last accepted token, not a guess
    return torch.cumsum(p, dim=1)


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
        self.reference = not uses_kernel(dev)
        if self.reference:
            return
        B, D, Vv = draft_logits.shape
        K = min(budget, Vv)
        self._topk = _TopkLaunch(B, D, Vv, draft_logits.stride(), K, dev)
        self._search = _SearchLaunch(B, D, K, budget, dev)
        self._scratch = StreamScratch(lambda: (self._topk.scratch(),
                                               torch.empty(B, budget + 1, dtype=torch.int32, device=dev)))

    def run(self, draft_logits, root_tokens) -> Tree:
        if V.checks_values(draft_logits.device):
            if bool(torch.isnan(draft_logits).any()):
                raise ValueError("draft_logits contains NaN")
            V.check_value_range("root_tokens", root_tokens, 0, draft_logits.shape[-1] - 1,
                                " (a token id of the draft's vocabulary)")
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
    candidate of score -inf is never created). No host sync: three kernels (traced by torch.compile, also a
    memset of the counters). Eager calls run a plan cached per static signature.
    """
    if eager():
        try:
            key = (signature(draft_logits, root_tokens), scalars(budget))
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable budget: validation says which
            _validate_build(draft_logits, budget, root_tokens)
            raise
        return _BUILD_PLANS.get(key, draft_logits, budget, root_tokens).run(draft_logits, root_tokens)
    _validate_build(draft_logits, budget, root_tokens)
    if not uses_kernel(draft_logits.device):
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
