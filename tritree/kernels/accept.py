"""Tree acceptance by the target: ``accept_tree`` and ``accept_picks``.

``accept_tree``: the target's pick at every node (argmax with the lowest id on ties at temperature 0, else a
Gumbel-max sample from the temperature / top-k / top-p filtered distribution with a counter-based Philox stream
keyed by (seed, step, request, node)), then the walk from the root into the child whose token equals the pick,
on the GPU, no host sync. ``accept_picks``: the walk alone, over picks made elsewhere (under tensor parallelism,
from the vocabulary shards).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, StreamScratch, eager, scalars, signature, uses_kernel
from .configs import num_sms

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
def _walk_tree(Tokens, Parents, TreeLens, AcceptIdx, AcceptLen, Bonus, b, pick, stride_tb, stride_pb, T,
               BLOCK_T: tl.constexpr):
    """Request ``b``'s walk from the root into the child whose token is its node's pick (``pick``: the
    request's ``[BLOCK_T]`` int32 picks, in registers). ``Tokens`` / ``Parents`` rows by their own strides
    (views of wider buffers); ``AcceptIdx`` contiguous ``[B, T]``."""
    b64 = b.to(tl.int64)
    row = b64 * T
    node = tl.arange(0, BLOCK_T)
    n = tl.load(TreeLens + b)
    valid = (node < T) & (node < n)
    tok = tl.load(Tokens + b64 * stride_tb + node, mask=valid, other=-1)
    par = tl.load(Parents + b64 * stride_pb + node, mask=valid, other=-2)
    tl.store(AcceptIdx + row + node, -1, mask=node < T)
    cur = 0
    length = 0
    if n > 0:
        tl.debug_barrier()  # the -1 fill before the path's stores
        tl.store(AcceptIdx + row, 0)
        length = 1
        going = 1
        while going > 0:
            at = tl.sum(tl.where(node == cur, pick, 0), 0)
            # children come after their parent: a table that is not a tree (unchecked) cannot loop forever
            match = valid & (par == cur) & (tok == at) & (node > cur)
            nxt = tl.min(tl.where(match, node, BLOCK_T), 0)
            going = (nxt < BLOCK_T).to(tl.int32)
            if going > 0:
                tl.store(AcceptIdx + row + length, nxt)
                length += 1
                cur = nxt
        tl.store(Bonus + b, tl.sum(tl.where(node == cur, pick, 0), 0))
    else:
        tl.store(Bonus + b, -1)
    tl.store(AcceptLen + b, length)


@triton.jit
def _walk_kernel(Tokens, Parents, TreeLens, Picks, AcceptIdx, AcceptLen, Bonus, stride_tb, stride_pb, stride_kb, T,
                 BLOCK_T: tl.constexpr):
    """One program per request: :func:`_walk_tree` over ``Picks`` (int32 ``[B, T]``, rows by ``stride_kb``)."""
    b = tl.program_id(0)
    node = tl.arange(0, BLOCK_T)
    pick = tl.load(Picks + b.to(tl.int64) * stride_kb + node, mask=node < T, other=0)
    _walk_tree(Tokens, Parents, TreeLens, AcceptIdx, AcceptLen, Bonus, b, pick, stride_tb, stride_pb, T, BLOCK_T)


@triton.jit
def _greedy_accept_kernel(Logits, Tokens, Parents, TreeLens, PartVal, PartIdx, Arrive, Picks, AcceptIdx, AcceptLen,
                          Bonus, stride_lb, stride_lt, stride_lv, stride_tb, stride_pb, T, V, chunk, n_chunks, arrivals,
                          BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr):
    """Greedy acceptance in one launch, grid ``(B, row blocks, vocabulary chunks)``: each program the first
    maximum (lowest id on ties) of its rows' logits over its chunk, into the partials; the last program of
    request ``b`` to arrive (``Arrive[b]`` counts ``arrivals`` programs, and is left 0 for the next call)
    reduces the chunks in order (the lowest id wins ties), stores the picks and walks the tree
    (:func:`_walk_tree`). ``Logits`` by its three strides; the outputs contiguous."""
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(2)
    r_ok = rows < T
    base = Logits + b64 * stride_lb + rows.to(tl.int64)[:, None] * stride_lt
    lo = c * chunk
    hi = tl.minimum(lo + chunk, V)
    best_val = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_R], dtype=tl.int32) + lo  # a chunk of -inf: its first id, as torch's argmax
    for v0 in range(lo, hi, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        ok = r_ok[:, None] & (v < hi)[None, :]
        x = tl.load(base + v.to(tl.int64)[None, :] * stride_lv, mask=ok, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 1)
        idx = tl.min(tl.where(ok & (x == m[:, None]), v[None, :], V), 1)
        take = m > best_val
        best_idx = tl.where(take, idx, best_idx)
        best_val = tl.where(take, m, best_val)
    part = (b64 * T + rows) * n_chunks + c
    tl.store(PartVal + part, best_val, mask=r_ok)
    tl.store(PartIdx + part, tl.minimum(best_idx, V - 1), mask=r_ok)  # NaN rows (unchecked): still an id
    tl.debug_barrier()
    if tl.atomic_add(Arrive + b, 1, sem="acq_rel") == arrivals - 1:  # the request's last program to finish
        node = tl.arange(0, BLOCK_T)
        in_t = node < T
        row = b64 * T
        pv = tl.full([BLOCK_T], float("-inf"), tl.float32)
        pick = tl.zeros([BLOCK_T], dtype=tl.int32)
        for cc in range(0, n_chunks):
            val = tl.load(PartVal + (row + node) * n_chunks + cc, mask=in_t, other=float("-inf"), cache_modifier=".cg")
            ids = tl.load(PartIdx + (row + node) * n_chunks + cc, mask=in_t, other=0, cache_modifier=".cg")
            take = (val > pv) | (cc == 0)  # chunks in order: a tie keeps the lower chunk's (lower) id
            pick = tl.where(take, ids, pick)
            pv = tl.where(take, val, pv)
        tl.store(Picks + row + node, pick, mask=in_t)
        tl.store(Arrive + b, 0)  # every program of the request has arrived: zero for the next call
        _walk_tree(Tokens, Parents, TreeLens, AcceptIdx, AcceptLen, Bonus, b, pick, stride_tb, stride_pb, T, BLOCK_T)


def greedy_accept_layout(B: int, T: int, V: int, sms: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_R, BLOCK_V, row_blocks, chunk, n_chunks)`` of the greedy launch: tiles of at most 4096 logits,
    and the vocabulary split so that ~4 programs an SM read it (a few rows still fill the GPU)."""
    block_v = min(4096, triton.next_power_of_2(V))
    block_r = max(1, min(64, triton.next_power_of_2(T), 4096 // block_v))
    row_blocks = triton.cdiv(T, block_r)
    n_chunks = max(1, min(triton.cdiv(V, block_v), triton.cdiv(4 * sms, B * row_blocks)))
    chunk = triton.cdiv(triton.cdiv(V, n_chunks), block_v) * block_v
    return block_r, block_v, row_blocks, chunk, triton.cdiv(V, chunk)


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
    if not uses_kernel(target_logits.device):  # CPU path: torch's own generator
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
    No host sync. Eager calls run a plan cached per static signature (greedy: one kernel launch).
    """
    if not eager():  # traced by torch.compile: the kernel launched as Dynamo traces launches
        _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        _check_rng(seed, step)
        picks = target_picks(target_logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, step=step)
        B, T = tokens.shape
        dev = tokens.device
        if not uses_kernel(dev):
            return (*accept_tree_reference(tokens, parents, tree_lens, picks), picks)
        accept_idx = torch.empty(B, T, dtype=torch.int32, device=dev)
        accept_len = torch.empty(B, dtype=torch.int32, device=dev)
        bonus = torch.empty(B, dtype=torch.int32, device=dev)
        picks = picks.contiguous()
        _walk_kernel[(B,)](tokens, parents, tree_lens, picks, accept_idx, accept_len, bonus,
                           tokens.stride(0), parents.stride(0), T, T, BLOCK_T=triton.next_power_of_2(T), num_warps=4)
        return accept_idx, accept_len, bonus, picks
    try:
        key = (signature(tokens, parents, tree_lens, target_logits), scalars(temperature, top_k, top_p))
        plan = _ACCEPT_PLANS.get(key, tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
    except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
        _AcceptPlan(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        raise
    return plan.run(tokens, parents, tree_lens, target_logits, seed, step)


def _validate_tree(tokens, parents, tree_lens) -> tuple[int, int]:
    """The tree's tensors (types, shapes, one device); returns ``(B, T)``."""
    V.check_tensor("tokens", tokens, ndim=2, dtypes=(torch.int32,))
    dev = tokens.device
    B, T = tokens.shape
    V.check_tensor("parents", parents, ndim=2, dtypes=(torch.int32,), device=dev)
    V.check_shape("parents", parents, (B, T), "[B, T]")
    V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    return B, T


def _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p):
    B, T = _validate_tree(tokens, parents, tree_lens)
    dev = tokens.device
    V.check_tensor("target_logits", target_logits, ndim=3, dtypes=(torch.float32, torch.float16, torch.bfloat16),
                   device=dev, last_contiguous=False)
    if target_logits.shape[:2] != (B, T) or target_logits.shape[2] < 1:
        raise ValueError(f"target_logits must have shape [B, T, V] = [{B}, {T}, V] with V >= 1, got "
                         f"{tuple(target_logits.shape)}")
    V.check_float("temperature", temperature, lo=0.0)
    if top_k is not None:
        V.check_int("top_k", top_k, 1)
    if top_p is not None:
        V.check_float("top_p", top_p, lo=0.0, hi=1.0, lo_open=True)


def _check_rng(seed, step):
    V.check_int("seed", seed)
    if not isinstance(step, torch.Tensor):
        V.check_int("step", step)


def _check_accept_values(parents, tree_lens, target_logits):
    _check_tree_values(parents, tree_lens)
    if bool(torch.isnan(target_logits).any()):
        raise ValueError("target_logits contains NaN")


def _check_tree_values(parents, tree_lens):
    T = parents.shape[1]
    V.check_value_range("tree_lens", tree_lens, 0, T, f" (T = {T} nodes)")
    idx = torch.arange(T)
    par = parents.cpu().to(torch.int64)
    valid = idx[None, :] < tree_lens.cpu()[:, None]
    ok = (par[:, 0] == -1) | ~valid[:, 0]
    ok &= ((par[:, 1:] >= 0) & (par[:, 1:] < idx[None, 1:]) | ~valid[:, 1:]).all(1)
    if not bool(ok.all()):
        b = int(torch.nonzero(~ok)[0, 0])
        raise ValueError(f"parents[{b}] is not a tree in parents-first order: {par[b].tolist()}")


class _AcceptPlan:
    """accept_tree for one static signature and sampling rule: validated, kernels bound once. Greedy: one
    launch (:func:`_greedy_accept_kernel`; its partials and arrival counters one set per CUDA stream, a fresh
    set inside a graph capture); sampling: the Gumbel picks, then the walk."""

    def __init__(self, tokens, parents, tree_lens, target_logits, temperature, top_k, top_p):
        _validate_accept(tokens, parents, tree_lens, target_logits, temperature, top_k, top_p)
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.B, self.T = tokens.shape
        self.device = tokens.device
        self.reference = not uses_kernel(self.device)
        self.greedy = temperature == 0.0
        B, T, Vv = target_logits.shape
        if self.greedy:
            block_r, block_v, row_blocks, chunk, n_chunks = greedy_accept_layout(B, T, Vv, num_sms(self.device))
            self._grid = (B, row_blocks, n_chunks)
            self._ints = (*target_logits.stride(), tokens.stride(0), parents.stride(0), T, Vv, chunk, n_chunks,
                          row_blocks * n_chunks)
            self._greedy = KernelLauncher(_greedy_accept_kernel, dict(BLOCK_R=block_r, BLOCK_V=block_v,
                                                                      BLOCK_T=triton.next_power_of_2(T)), num_warps=4)
            dev = self.device
            self._scratch = StreamScratch(lambda: (torch.empty(B * T * n_chunks, dtype=torch.float32, device=dev),
                                                   torch.empty(B * T * n_chunks, dtype=torch.int32, device=dev),
                                                   torch.zeros(B, dtype=torch.int32, device=dev)))
        else:
            self._walk = KernelLauncher(_walk_kernel, dict(BLOCK_T=triton.next_power_of_2(T)), num_warps=4)
            self._ints = (tokens.stride(0), parents.stride(0), T, T)

    def run(self, tokens, parents, tree_lens, target_logits, seed, step):
        if V.checks_values(self.device):
            _check_accept_values(parents, tree_lens, target_logits)
        _check_rng(seed, step)
        if self.reference:
            picks = target_picks(target_logits, seed=seed, step=step, **self.sampling)
            idx_, len_, bonus = accept_tree_reference(tokens, parents, tree_lens, picks)
            return idx_, len_, bonus, picks
        B, T, dev = self.B, self.T, self.device
        accept_idx = torch.empty(B, T, dtype=torch.int32, device=dev)
        accept_len = torch.empty(B, dtype=torch.int32, device=dev)
        bonus = torch.empty(B, dtype=torch.int32, device=dev)
        if self.greedy:
            picks = torch.empty(B, T, dtype=torch.int32, device=dev)
            if B and T:
                part_val, part_idx, arrive = self._scratch.get(dev)
                self._greedy(self._grid, target_logits, tokens, parents, tree_lens, part_val, part_idx, arrive, picks,
                             accept_idx, accept_len, bonus, *self._ints)
            return accept_idx, accept_len, bonus, picks
        picks = target_picks(target_logits, seed=seed, step=step, **self.sampling).contiguous()
        self._walk((B, 1, 1), tokens, parents, tree_lens, picks, accept_idx, accept_len, bonus, *self._ints)
        return accept_idx, accept_len, bonus, picks


_ACCEPT_PLANS = PlanCache("accept_tree", _AcceptPlan)


# --------------------------------------------------------------------------------------------------
# The walk over given picks
# --------------------------------------------------------------------------------------------------

def accept_picks(tokens, parents, tree_lens, picks):
    """The walk of :func:`accept_tree` over picks made elsewhere: from the root into the child whose token equals
    its node's pick (the lowest-index such child), while one exists.

    Args:
        tokens, parents: ``[B, T]`` int32 (a :class:`Tree`'s); tree_lens: ``[B]`` int32 (nodes past it are
            ignored; 0: nothing accepted, bonus -1).
        picks: ``[B, T]`` int32, the token the target picks after each node (e.g. :func:`tritree.dist.greedy_picks`
            of vocabulary-sharded logits); rows may be strided.
    Returns ``(accept_idx [B, T] int32 (root first, -1 padded), accept_len [B] int32, bonus [B] int32)``: the
    same as :func:`accept_tree` given logits whose picks these are. One launch, no host sync; eager calls run a
    plan cached per static signature.
    """
    if not eager():  # traced by torch.compile: the kernel launched as Dynamo traces launches
        _validate_walk(tokens, parents, tree_lens, picks)
        B, T = tokens.shape
        dev = tokens.device
        if not uses_kernel(dev):
            return accept_tree_reference(tokens, parents, tree_lens, picks)
        outs = _walk_outputs(B, T, dev)
        if B and T:
            _walk_kernel[(B,)](tokens, parents, tree_lens, picks, *outs, tokens.stride(0), parents.stride(0),
                               picks.stride(0), T, BLOCK_T=triton.next_power_of_2(T), num_warps=4)
        return outs
    try:
        plan = _WALK_PLANS.get(signature(tokens, parents, tree_lens, picks), tokens, parents, tree_lens, picks)
    except (AttributeError, TypeError):  # not tensors: validation says which
        _WalkPlan(tokens, parents, tree_lens, picks)
        raise
    return plan.run(tokens, parents, tree_lens, picks)


def _validate_walk(tokens, parents, tree_lens, picks):
    B, T = _validate_tree(tokens, parents, tree_lens)
    V.check_tensor("picks", picks, ndim=2, dtypes=(torch.int32,), device=tokens.device)
    V.check_shape("picks", picks, (B, T), "[B, T]")


def _walk_outputs(B, T, dev):
    return (torch.empty(B, T, dtype=torch.int32, device=dev), torch.empty(B, dtype=torch.int32, device=dev),
            torch.empty(B, dtype=torch.int32, device=dev))


class _WalkPlan:
    """accept_picks for one static signature: validated, the walk kernel bound once (one program a request)."""

    def __init__(self, tokens, parents, tree_lens, picks):
        _validate_walk(tokens, parents, tree_lens, picks)
        self.B, self.T = tokens.shape
        self.device = tokens.device
        self.reference = not uses_kernel(self.device)
        self._walk = KernelLauncher(_walk_kernel, dict(BLOCK_T=triton.next_power_of_2(max(self.T, 1))), num_warps=4)
        self._ints = (tokens.stride(0), parents.stride(0), picks.stride(0), self.T)

    def run(self, tokens, parents, tree_lens, picks):
        if V.checks_values(self.device):
            _check_tree_values(parents, tree_lens)
        if self.reference:
            return accept_tree_reference(tokens, parents, tree_lens, picks)
        outs = _walk_outputs(self.B, self.T, self.device)
        if self.B and self.T:
            self._walk((self.B, 1, 1), tokens, parents, tree_lens, picks, *outs, *self._ints)
        return outs


_WALK_PLANS = PlanCache("accept_picks", _WalkPlan)
