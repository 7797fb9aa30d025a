"""DDTree construction from the draft's per-depth distributions, and tree acceptance by the target.

``build_tree``: top-K per depth (one pass over the draft logits), then DDTree's best-first search in a
Triton kernel (one program per request). Candidates are (depth, rank, parent); popping the best
creates a node and pushes its next sibling (same parent, rank + 1, score ``s - lp[d, r] + lp[d, r+1]``)
and its first child (depth + 1, rank 0, score ``s + lp[d+1, 0]``). Scores are fp32 with exactly
these operations, so the kernel and the reference agree bit for bit.

Deterministic ties: within a depth, tokens are ranked by log-probability, then by lower token id; among
candidates of equal score, the one pushed first is popped first (the initial candidate, then for each
pop its sibling before its child).

``accept_tree``: the target's pick at every node (argmax with the lowest id on ties at temperature 0,
else a Gumbel-max sample from the temperature / top-k / top-p filtered distribution with a
counter-based Philox stream keyed by (seed, step, request, node)), then the walk from the root into the
child whose token equals the pick, on the GPU, no host sync.
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
from .configs import num_sms
from .verify_mla import tree_mask_from_parents


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
# Top-K per depth with the deterministic tie rule
# --------------------------------------------------------------------------------------------------

def _order_keys(lp: torch.Tensor) -> torch.Tensor:
    """int64 keys in the total order of the tie rule: larger key = larger lp, then lower token id."""
    Vv = lp.shape[-1]
    bits = lp.contiguous().view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # monotonic in the float
    ids = torch.arange(Vv, device=lp.device, dtype=torch.int64)
    return (ordered << _id_bits(Vv)) | (Vv - 1 - ids)


def _id_bits(Vv: int) -> int:
    return max(1, (Vv - 1).bit_length())


def topk_per_depth(draft_logits: torch.Tensor, k: int, *, kernel: bool = False):
    """``(lp [B, D, k] float32, ids [B, D, k] int32)``: the k most likely tokens per depth, sorted by
    log-probability (descending), ties by lower token id. One log-softmax, then a top-k over V: with
    ``kernel`` the chunked sort of :func:`_topk_keys` (build_tree's GPU path), else ``torch.topk`` of
    the same keys (the reference)."""
    lp = torch.log_softmax(draft_logits.float(), dim=-1)
    if kernel:
        top = _topk_keys(lp, k)
    else:
        top = torch.topk(_order_keys(lp), k, dim=-1, sorted=True).indices
    return torch.gather(lp, -1, top), top.to(torch.int32)


@triton.jit
def _chunk_topk_kernel(In, Out, n, stride_in, stride_out, Vv, id_bits,
                       FROM_LP: tl.constexpr, CH: tl.constexpr, KP: tl.constexpr):
    """One round of the top-k: chunk ``c`` of row ``r`` (``CH`` entries: log-probabilities when
    ``FROM_LP``, else keys of an earlier round) is sorted by key and its best ``KP`` keys written."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    j = c * CH + tl.arange(0, CH)
    ok = j < n
    if FROM_LP:
        x = tl.load(In + r.to(tl.int64) * stride_in + j, mask=ok, other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        key = (ordered << id_bits) | (Vv - 1 - j).to(tl.int64)
    else:
        key = tl.load(In + r.to(tl.int64) * stride_in + j, mask=ok, other=0)
    key = tl.where(ok, key, -9223372036854775808)
    key = tl.sort(key, descending=True)
    pos = tl.arange(0, CH)
    tl.store(Out + r.to(tl.int64) * stride_out + c * KP + pos, key, mask=pos < KP)


def _topk_keys(lp: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[..., k]`` (int64) of the k largest keys per row of ``lp [..., V]``, best first.

    Rounds of :func:`_chunk_topk_kernel`: each keeps the best ``KP = next_pow2(k)`` of every chunk of
    ``CH >= 2 KP`` entries, so the candidates shrink by ``CH / KP`` per round until one chunk holds
    them. Exact (a row's top k lies within the union of its chunks' top k) and a few launches, where
    ``torch.topk`` needs one radix pass per 2 bits of a 64-bit key."""
    shape = lp.shape
    Vv = shape[-1]
    rows = lp.reshape(-1, Vv)
    R = rows.shape[0]
    KP = triton.next_power_of_2(k)
    cur, n, from_lp = rows, Vv, True
    while True:
        CH = max(KP, min(max(2048, 2 * KP), triton.next_power_of_2(n)))
        chunks = triton.cdiv(n, CH)
        out = torch.empty(R, chunks * KP, dtype=torch.int64, device=lp.device)
        _chunk_topk_kernel[(R, chunks)](cur, out, n, cur.stride(0), out.stride(0), Vv, _id_bits(Vv),
                                        FROM_LP=from_lp, CH=CH, KP=KP, num_warps=4 if CH <= 2048 else 8)
        cur, n, from_lp = out, chunks * KP, False
        if chunks == 1:
            break
    ids = (Vv - 1) - (cur[:, :k] & ((1 << _id_bits(Vv)) - 1))
    return ids.reshape(*shape[:-1], k)


# --------------------------------------------------------------------------------------------------
# Best-first search
# --------------------------------------------------------------------------------------------------

@triton.jit
def _ddtree_kernel(LP, IDS, RootTokens, Tokens, Parents, Depth, Scores, Ranks, TreeLens,
                   stride_lb, stride_ld, stride_tb, D, K, budget,
                   FRONT: tl.constexpr, BLOCK_T: tl.constexpr):
    """Best-first search of one request. The frontier is ``FRONT`` slots in push order; a slot's key
    packs (score, push order) so one max-reduction pops the best candidate with the tie rule, and one
    more fetches its (depth, rank, parent). Run on one warp, the reductions are shuffles only."""
    b = tl.program_id(0)
    lp_row = LP + b.to(tl.int64) * stride_lb
    out = b.to(tl.int64) * stride_tb
    slot = tl.arange(0, FRONT)
    EMPTY: tl.constexpr = -9223372036854775808
    # key = ordered(score) << 32 | (FRONT - 1 - slot): larger score first, then the earlier push
    s0 = tl.load(lp_row)
    b0 = s0.to(tl.int32, bitcast=True)
    k0 = (tl.where(b0 < 0, b0 ^ 0x7FFFFFFF, b0).to(tl.int64) << 32) | (FRONT - 1)
    f_key = tl.where(slot == 0, tl.where(s0 > float("-inf"), k0, EMPTY), EMPTY)
    f_info = tl.where(slot == 0, 1 << 48, 0).to(tl.int64)  # depth << 48 | rank << 24 | parent
    n_push = 1
    n_nodes = 0
    tl.store(Tokens + out, tl.load(RootTokens + b))
    tl.store(Parents + out, -1)
    tl.store(Depth + out, 0)
    tl.store(Scores + out, 0.0)
    for _ in range(budget):
        kmax = tl.max(f_key, 0)
        if kmax != EMPTY:
            hi = kmax >> 32
            best = FRONT - 1 - (kmax - (hi << 32)).to(tl.int32)
            sb = hi.to(tl.int32)
            s = tl.where(sb < 0, sb ^ 0x7FFFFFFF, sb).to(tl.float32, bitcast=True)
            hit = slot == best
            info = tl.sum(tl.where(hit, f_info, 0), 0)
            d = (info >> 48).to(tl.int32)
            r = ((info >> 24) - ((info >> 48) << 24)).to(tl.int32)
            par = (info - ((info >> 24) << 24)).to(tl.int32)
            f_key = tl.where(hit, EMPTY, f_key)
            n_nodes += 1
            node = n_nodes
            at = out + node
            tl.store(Parents + at, par)
            tl.store(Depth + at, d)
            tl.store(Scores + at, s)
            tl.store(Ranks + at, r)
            has_sib = r + 1 < K
            has_child = d < D
            # independent loads, issued together
            lp_r = tl.load(lp_row + (d - 1) * stride_ld + r)
            lp_r1 = tl.load(lp_row + (d - 1) * stride_ld + r + 1, mask=has_sib, other=float("-inf"))
            lp_c = tl.load(lp_row + d * stride_ld, mask=has_child, other=float("-inf"))
            if has_sib:  # next sibling
                sc = (s - lp_r) + lp_r1
                bs = sc.to(tl.int32, bitcast=True)
                ks = (tl.where(bs < 0, bs ^ 0x7FFFFFFF, bs).to(tl.int64) << 32) | (FRONT - 1 - n_push)
                new = slot == n_push
                f_key = tl.where(new, tl.where(sc > float("-inf"), ks, EMPTY), f_key)
                f_info = tl.where(new, (d.to(tl.int64) << 48) | ((r + 1).to(tl.int64) << 24) | par, f_info)
                n_push += 1
            if has_child:  # first child
                cc = s + lp_c
                bc = cc.to(tl.int32, bitcast=True)
                kc = (tl.where(bc < 0, bc ^ 0x7FFFFFFF, bc).to(tl.int64) << 32) | (FRONT - 1 - n_push)
                new = slot == n_push
                f_key = tl.where(new, tl.where(cc > float("-inf"), kc, EMPTY), f_key)
                f_info = tl.where(new, ((d + 1).to(tl.int64) << 48) | node, f_info)
                n_push += 1
    tl.store(TreeLens + b, n_nodes + 1)
    # Tokens after the search, in one vectorised gather (no dependent load inside the loop).
    i = 1 + tl.arange(0, BLOCK_T)
    ok = i <= n_nodes
    d = tl.load(Depth + out + i, mask=ok, other=1)
    r = tl.load(Ranks + out + i, mask=ok, other=0)
    tok = tl.load(IDS + b.to(tl.int64) * stride_lb + (d - 1) * stride_ld + r, mask=ok, other=0)
    tl.store(Tokens + out + i, tok, mask=ok)


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
        heap = [(-f32(lp[b, 0, 0]), 0, 1, 0, 0)]  # (-score, push order, depth, rank, parent)
        pushes, n = 1, 0
        while heap and n < budget:
            neg, _, d, r, par = heapq.heappop(heap)
            s = f32(-neg)
            n += 1
            tokens[b, n], parents[b, n], depth[b, n], scores[b, n] = ids[b, d - 1, r], par, d, s
            if r + 1 < K:
                heapq.heappush(heap, (-(f32(s - lp[b, d - 1, r]) + lp[b, d - 1, r + 1]), pushes, d, r + 1, par))
                pushes += 1
            if d < D:
                heapq.heappush(heap, (-(s + lp[b, d, 0]), pushes, d + 1, 0, n))
                pushes += 1
        lens[b] = n + 1
    tl_ = torch.from_numpy(lens)
    par_t = torch.from_numpy(parents)
    mask, dep = tree_mask_from_parents(par_t, tl_)
    return Tree(torch.from_numpy(tokens), par_t, dep, torch.from_numpy(scores), tl_, mask)


def build_tree(draft_logits: torch.Tensor, budget: int, root_tokens: torch.Tensor) -> Tree:
    """DDTree: the ``budget`` most likely nodes of the product-of-marginals lattice, parents first.

    Args:
        draft_logits: ``[B, D, V]`` draft logits for depths 1..D (float; log-softmax taken here).
        budget: nodes besides the root (>= 1); ``T = budget + 1``.
        root_tokens: ``[B]`` int token of the root (the last accepted / bonus token).
    Returns a :class:`Tree` (static shapes; fewer nodes than the budget only when fewer are
    reachable: ``sum_d K^d`` with ``K = min(budget, V)``). No host sync.
    """
    V.check_tensor("draft_logits", draft_logits, ndim=3, dtypes=(torch.float32, torch.float16, torch.bfloat16),
                   last_contiguous=False)
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")
    B, D, Vv = draft_logits.shape
    if D < 1 or Vv < 1:
        raise ValueError(f"draft_logits must have D >= 1 depths and V >= 1 tokens, got {tuple(draft_logits.shape)}")
    V.check_tensor("root_tokens", root_tokens, ndim=1, dtypes=(torch.int32, torch.int64), device=draft_logits.device)
    V.check_shape("root_tokens", root_tokens, (B,), "[B]")
    if V.values_checkable(draft_logits) and bool(torch.isnan(draft_logits).any()):
        raise ValueError("draft_logits contains NaN")
    dev = draft_logits.device
    if dev.type != "cuda" and not _interpreting():
        t = build_tree_reference(draft_logits, budget, root_tokens)
        return Tree(*(x.to(dev) for x in t))
    K = min(budget, Vv)
    lp, ids = topk_per_depth(draft_logits, K, kernel=True)
    T = budget + 1
    tokens = torch.zeros(B, T, dtype=torch.int32, device=dev)
    parents = torch.full((B, T), -1, dtype=torch.int32, device=dev)
    depth = torch.zeros(B, T, dtype=torch.int32, device=dev)
    scores = torch.full((B, T), float("-inf"), dtype=torch.float32, device=dev)
    tree_lens = torch.empty(B, dtype=torch.int32, device=dev)
    ranks = torch.empty(B, T, dtype=torch.int32, device=dev)
    front = triton.next_power_of_2(2 * budget + 2)
    _ddtree_kernel[(B,)](lp, ids, root_tokens, tokens, parents, depth, scores, ranks, tree_lens,
                         lp.stride(0), lp.stride(1), tokens.stride(0), D, K, budget,
                         FRONT=front, BLOCK_T=triton.next_power_of_2(budget),
                         num_warps=1 if front <= 1024 else 4)
    mask, depth2 = tree_mask_from_parents(parents, tree_lens)
    return Tree(tokens, parents, depth2, scores, tree_lens, mask)


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
    """
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
    if V.values_checkable(parents, tree_lens, target_logits):
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
    picks = target_picks(target_logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
    if dev.type != "cuda" and not _interpreting():
        idx_, len_, bonus = accept_tree_reference(tokens, parents, tree_lens, picks)
        return idx_, len_, bonus, picks
    accept_idx = torch.empty(B, T, dtype=torch.int32, device=dev)
    accept_len = torch.empty(B, dtype=torch.int32, device=dev)
    bonus = torch.empty(B, dtype=torch.int32, device=dev)
    _walk_kernel[(B,)](tokens, parents, tree_lens, picks, accept_idx, accept_len, bonus, tokens.stride(0), T,
                       BLOCK_T=triton.next_power_of_2(T), num_warps=4)
    return accept_idx, accept_len, bonus, picks
