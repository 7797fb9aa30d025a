"""The MoE router of DeepSeek-V3 / Kimi K2 ("noaux_tc" sigmoid routing) in one kernel launch: ``moe_route``.

Semantics (:func:`moe_route_reference`, the specification): ``logits = x @ weight^T`` (fp32 sums),
``scores = sigmoid(logits)``, ``choice = scores + bias`` (``e_score_correction_bias``, selection only); with
``n_group > 1`` each group of ``E / n_group`` consecutive experts scores the sum of its two highest choices and
only the ``topk_group`` best groups stay (ties: lower group id); the ``top_k`` experts of highest choice (ties:
lower id), in descending order; their weights are the scores (not the choices), divided by their sum + 1e-20
when ``norm_topk_prob``, times ``scaling``; ids minus ``expert_offset`` (expert parallelism); padding rows of a
tree batch get id -1 and weight 0.

One launch (:func:`_route_kernel`), grid ``(row blocks, expert tiles, K splits)``:

1. every program sums its ``[BLOCK_T rows, BLOCK_E experts]`` tile of logits over its slice of the hidden
   dimension with ``tl.dot`` (the weight is streamed once in the checkpoint's dtype; at decode a few rows leave
   only ``E / BLOCK_E`` tiles, so the hidden dimension is split to give every SM a program or two);
2. split K: the fp32 partials go to a workspace ``[splits, N, E]`` by plain stores; the last program of a tile
   to arrive (an arrival counter per tile, ``atomic_add`` acq_rel after a CTA barrier) adds them in split
   order (deterministic) and stores the tile's logits (to ``logits_out`` when given, else a workspace);
3. selection by ``top_k`` rounds of a max over packed ``(order-preserving choice bits, lowest id)`` int64 keys
   (one reduction a round gives the value and the lowest id among equals). With one group (Kimi K2.6) every
   tile's reducer first keeps its rows' best ``top_k`` keys among its experts (the candidates, in parallel over
   the tiles); the last tile of a row block to arrive (a counter per row block) picks from the row's candidates
   (``tiles x top_k`` keys, not ``E``). With groups (``n_group > 1``) a group's score needs all its choices, so
   that program reads every logit of its rows: sigmoid, bias, the group limit, the rounds. Then the weights
   (the picked scores), normalisation, scaling, offset and padding; the program resets its counters to 0 (so do
   the tile reducers).

The arrival counters are one int32 buffer per device (:func:`tritree.kernels._launch.arrival_counters`), allocated zeroed outside any CUDA-graph
capture and never freed (captured graphs keep its address); every launch leaves the counters it used at 0.
Launches on one stream are ordered, so eager calls and graph replays may interleave freely; **concurrent calls
on different streams of one device are not supported** (they would share counters). The partials, logits and
candidates workspaces need no zeroing (every element read was written in the same launch).

No host sync: CUDA-graph capturable once warm. Under Triton's interpreter the programs run one after another
(the last one of a tile or row block is the one that selects), so the CPU tests run the same code path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _validate as V
from .._launch import (
    KernelLauncher,
    PlanCache,
    StreamScratch,
    arrival_counters,
    eager,
    interpreting,
    scalars,
    signature,
    uses_kernel,
)
from ..configs import arch_of, lookup, num_sms

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NORM_EPS = 1e-20  # added to the sum of the selected weights (DeepSeek-V3's, transformers')


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def moe_route_reference(x, weight, bias=None, *, top_k, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0,
                        expert_offset=0, tree_lens=None, rows_per_request=None, logits_out=None,
                        dtype=torch.float64):
    """The specification of :func:`moe_route`, in plain PyTorch computed in ``dtype``; selection by stable
    descending sorts (equal values: lower id first), for groups and experts. Returns ``(topk_idx [N, top_k]
    int32, topk_w [N, top_k] float32)``; ``logits_out`` (``[N, E]``) receives the logits."""
    logits = x.to(dtype) @ weight.to(dtype).t()
    if logits_out is not None:
        logits_out.copy_(logits.detach())
    N, E = logits.shape
    scores = torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias.to(dtype)
    if n_group > 1:
        gs = E // n_group
        top2 = torch.sort(choice.view(N, n_group, gs), dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
        kept = torch.sort(top2, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        keep = torch.zeros(N, n_group, dtype=torch.bool, device=x.device).scatter_(1, kept, True)
        choice = choice.masked_fill(~keep.repeat_interleave(gs, 1), float("-inf"))
    idx = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = scores.gather(1, idx)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + NORM_EPS)
    w = (w * scaling).float()
    idx = (idx - expert_offset).to(torch.int32)
    if tree_lens is not None:
        T = rows_per_request
        rows = torch.arange(N, device=x.device)
        pad = (rows % T) >= tree_lens.to(x.device, torch.int64).repeat_interleave(T)
        idx = torch.where(pad[:, None], -1, idx)
        w = torch.where(pad[:, None], 0.0, w)
    return idx, w


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _select_rows(Logits, Bias, TreeLens, Idx, Wt, rows, N, E, stride_l, T, expert_offset, scaling,
                 TOP_K: tl.constexpr, K_PAD: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
                 G_PAD: tl.constexpr, GS_PAD: tl.constexpr, SEL_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_LENS: tl.constexpr, NORM: tl.constexpr):
    """The routing of ``SEL_ROWS`` rows (``rows``; those >= N masked) from their fp32 logits, with groups
    (``N_GROUP > 1``: a group's score needs all its choices, so every lane is read here). Lanes: group ``g``
    (of ``G_PAD``), position ``j`` (of ``GS_PAD``) in the group, expert ``g GS + j``; lanes past the groups or the
    group size are no expert."""
    L: tl.constexpr = G_PAD * GS_PAD
    GS = E // N_GROUP
    lane = tl.arange(0, L)
    grp = lane // GS_PAD
    pos = lane % GS_PAD
    eid = grp * GS + pos
    valid = (grp < N_GROUP) & (pos < GS)
    row_ok = rows < N
    r64 = rows.to(tl.int64)
    ok = row_ok[:, None] & valid[None, :]
    lg = tl.load(Logits + r64[:, None] * stride_l + eid[None, :], mask=ok, other=0.0, cache_modifier=".cg")
    choice = tl.sigmoid(lg)
    if HAS_BIAS:
        choice += tl.load(Bias + eid, mask=valid, other=0.0)[None, :]
    choice = tl.where(ok, choice, float("-inf"))
    # Group scores: the two highest choices of each group (the first maximum's lane excluded once).
    c3 = tl.reshape(choice, [SEL_ROWS, G_PAD, GS_PAD])
    j3 = tl.arange(0, GS_PAD)[None, None, :]
    m1 = tl.max(c3, 2)
    j1 = tl.min(tl.where(c3 == m1[:, :, None], j3, GS_PAD), 2)
    m2 = tl.max(tl.where(j3 == j1[:, :, None], float("-inf"), c3), 2)
    gscore = m1 + m2
    g2 = tl.arange(0, G_PAD)[None, :]
    gscore = tl.where(g2 < N_GROUP, gscore, float("-inf"))
    keep = tl.zeros([SEL_ROWS, G_PAD], dtype=tl.int1)
    for _ in range(TOPK_GROUP):  # the best remaining group, the lowest id among equals
        avail = tl.where(keep, float("-inf"), gscore)
        gm = tl.max(avail, 1)
        gsel = tl.min(tl.where((avail == gm[:, None]) & (keep == 0), g2, G_PAD), 1)
        keep = keep | (g2 == gsel[:, None])
    keep_lane = tl.reshape(tl.broadcast_to(keep[:, :, None], [SEL_ROWS, G_PAD, GS_PAD]), [SEL_ROWS, L])
    choice = tl.where(keep_lane, choice, float("-inf"))
    # Keys: the choice's bits in an order-preserving signed form above, L - 1 - lane below: one max is the
    # highest choice and, among equal choices, the lowest lane (= the lowest expert id).
    bits = choice.to(tl.int32, bitcast=True)
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (bits.to(tl.int64) << 32) | (L - 1 - lane)[None, :].to(tl.int64)
    lowest = tl.full([SEL_ROWS, L], -9223372036854775808, tl.int64)
    key = tl.where(ok, key, lowest)  # no expert: below every expert (even a choice of -inf)
    kcol = tl.arange(0, K_PAD)[None, :]
    sel = tl.zeros([SEL_ROWS, K_PAD], dtype=tl.int32)
    for j in range(TOP_K):
        kmax = tl.max(key, 1)
        pick = (L - 1) - kmax.to(tl.int32)  # the low word: the lane
        key = tl.where(key == kmax[:, None], lowest, key)
        sel = tl.where(kcol == j, pick[:, None], sel)
    e_sel = tl.minimum((sel // GS_PAD) * GS + sel % GS_PAD, E - 1)
    _write_routes(Logits, TreeLens, Idx, Wt, rows, e_sel, N, stride_l, T, expert_offset, scaling, TOP_K, K_PAD,
                  HAS_LENS, NORM)


@triton.jit
def _write_routes(Logits, TreeLens, Idx, Wt, rows, e_sel, N, stride_l, T, expert_offset, scaling, TOP_K: tl.constexpr,
                  K_PAD: tl.constexpr, HAS_LENS: tl.constexpr, NORM: tl.constexpr):
    """The outputs of ``rows`` from their picks ``e_sel [rows, K_PAD]`` (global expert ids, the first ``TOP_K``
    columns real): weights from the logits, normalisation, scaling, the offset and padding rows."""
    kcol = tl.arange(0, K_PAD)[None, :]
    row_ok = rows < N
    r64 = rows.to(tl.int64)
    out_ok = row_ok[:, None] & (kcol < TOP_K)
    # The weights: the scores at the picks (the same fp32 logits, the same sigmoid).
    w = tl.sigmoid(tl.load(Logits + r64[:, None] * stride_l + e_sel, mask=out_ok, other=0.0, cache_modifier=".cg"))
    w = tl.where(out_ok, w, 0.0)
    if NORM:
        w = w / (tl.sum(w, 1)[:, None] + 1e-20)
    w = w * scaling
    e_out = e_sel - expert_offset
    if HAS_LENS:
        n_lens = tl.load(TreeLens + rows // T, mask=row_ok, other=0)
        pad = (rows % T) >= n_lens
        e_out = tl.where(pad[:, None], -1, e_out)
        w = tl.where(pad[:, None], 0.0, w)
    dst = r64[:, None] * TOP_K + kcol
    tl.store(Idx + dst, e_out, mask=out_ok)
    tl.store(Wt + dst, w, mask=out_ok)


_LOWEST = tl.constexpr(-9223372036854775808)  # below every key: no expert


@triton.jit
def _tile_candidates(lg, rows, experts, row_ok, e_ok, Bias, Cand, et, N_CAND, HAS_BIAS: tl.constexpr,
                     C_T: tl.constexpr):
    """A tile's candidates (one group): the keys of each row's ``C_T`` best experts among the tile's, stored at
    ``Cand[row, et C_T + j]`` (``_LOWEST`` past the tile's experts). The ``TOP_K`` best of a row are among the
    union of its tiles' candidates, so the row block's selection reads ``C_T`` keys a tile, not ``E`` logits.
    A key: the choice's bits (``sigmoid + bias``) in an order-preserving signed form above, ``2^31 - 1 - expert``
    below: one max is the highest choice and, among equal choices, the lowest expert id."""
    BLOCK_T: tl.constexpr = lg.shape[0]
    choice = tl.sigmoid(lg)
    if HAS_BIAS:
        choice += tl.load(Bias + experts, mask=e_ok, other=0.0)[None, :]
    bits = choice.to(tl.int32, bitcast=True)
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (bits.to(tl.int64) << 32) | (0x7FFFFFFF - experts)[None, :].to(tl.int64)
    key = tl.where(row_ok[:, None] & e_ok[None, :], key, _LOWEST)
    ccol = tl.arange(0, C_T)[None, :]
    cand = tl.full([BLOCK_T, C_T], _LOWEST, tl.int64)
    for j in tl.static_range(C_T):
        kmax = tl.max(key, 1)
        key = tl.where(key == kmax[:, None], _LOWEST, key)
        cand = tl.where(ccol == j, kmax[:, None], cand)
    tl.store(Cand + rows.to(tl.int64)[:, None] * N_CAND + et * C_T + ccol, cand, mask=row_ok[:, None])


@triton.jit
def _merge_rows(Cand, Logits, TreeLens, Idx, Wt, rows, N, N_CAND, stride_l, T, expert_offset, scaling,
                TOP_K: tl.constexpr, K_PAD: tl.constexpr, C_PAD: tl.constexpr, HAS_LENS: tl.constexpr,
                NORM: tl.constexpr):
    """The routing of ``rows`` (one group) from their tiles' candidate keys: ``TOP_K`` max rounds over
    ``N_CAND`` keys a row (padded to ``C_PAD``)."""
    SEL_ROWS: tl.constexpr = rows.shape[0]
    row_ok = rows < N
    c = tl.arange(0, C_PAD)[None, :]
    key = tl.load(Cand + rows.to(tl.int64)[:, None] * N_CAND + c, mask=row_ok[:, None] & (c < N_CAND),
                  other=_LOWEST, cache_modifier=".cg")
    kcol = tl.arange(0, K_PAD)[None, :]
    e_sel = tl.zeros([SEL_ROWS, K_PAD], dtype=tl.int32)
    for j in range(TOP_K):
        kmax = tl.max(key, 1)
        key = tl.where(key == kmax[:, None], _LOWEST, key)
        e_sel = tl.where(kcol == j, 0x7FFFFFFF - (kmax & 0x7FFFFFFF).to(tl.int32)[:, None], e_sel)
    _write_routes(Logits, TreeLens, Idx, Wt, rows, e_sel, N, stride_l, T, expert_offset, scaling, TOP_K, K_PAD,
                  HAS_LENS, NORM)


@triton.jit
def _route_kernel(X, W, Bias, TreeLens, Part, Logits, Cand, Count, Idx, Wt,
                  N, H, E, stride_x, stride_w, stride_l, k_split, n_cand, T, expert_offset, scaling,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  ONE_TILE: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr, N_GROUP: tl.constexpr,
                  TOPK_GROUP: tl.constexpr, G_PAD: tl.constexpr, GS_PAD: tl.constexpr, SEL_ROWS: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_LENS: tl.constexpr, NORM: tl.constexpr, DOT_F32: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_E: tl.constexpr, SUM_UNROLL: tl.constexpr, C_T: tl.constexpr,
                  C_PAD: tl.constexpr):
    """Grid ``(row blocks, expert tiles, SPLIT_K)``; see the module. ``X [N, H]`` and ``W [E, H]`` by row strides;
    ``Part [SPLIT_K, N, E]`` fp32 (``SPLIT_K > 1``); ``Logits [N, E]`` fp32 by ``stride_l``; ``Count``: int32
    counters at 0, ``row blocks x expert tiles`` for the tiles then ``row blocks`` for the row blocks;
    ``Idx/Wt [N, TOP_K]`` contiguous. ``k_split``: columns of H per split (whole ``BLOCK_K`` tiles).
    One group: ``Cand [N, n_cand]`` int64, ``C_T`` candidates a tile (``n_cand = tiles x C_T``, padded to
    ``C_PAD`` by the selection).
    ``ONE_TILE``: one expert tile (the row block's program selects without a counter). ``DOT_F32``: the tiles
    converted to fp32 for an IEEE fp32 dot (fp32 or mixed inputs, and the interpreter)."""
    rb = tl.program_id(0)
    et = tl.program_id(1)
    ks = tl.program_id(2)
    n_rb = tl.num_programs(0)
    n_et = tl.num_programs(1)
    rows = rb * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = et * BLOCK_E + tl.arange(0, BLOCK_E)
    row_ok = rows < N
    e_ok = experts < E
    kk = tl.arange(0, BLOCK_K)
    lo = ks * k_split
    hi = tl.minimum(H, lo + k_split)
    px = X + rows.to(tl.int64)[:, None] * stride_x + (lo + kk)[None, :]
    pw = W + experts.to(tl.int64)[:, None] * stride_w + (lo + kk)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        if EVEN_K:
            xt = tl.load(px, mask=row_ok[:, None], other=0.0)
            if EVEN_E:
                wt = tl.load(pw)
            else:
                wt = tl.load(pw, mask=e_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + kk) < hi
            xt = tl.load(px, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(pw, mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_F32:
            acc = tl.dot(xt.to(tl.float32), tl.trans(wt.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, tl.trans(wt), acc)
        px += BLOCK_K
        pw += BLOCK_K
    tile_ok = row_ok[:, None] & e_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    lg_ptr = Logits + r64 * stride_l + experts[None, :]
    tile_done = True
    if SPLIT_K == 1:
        tl.store(lg_ptr, acc, mask=tile_ok)
        if N_GROUP == 1:
            _tile_candidates(acc, rows, experts, row_ok, e_ok, Bias, Cand, et, n_cand, HAS_BIAS, C_T)
    else:
        NE = tl.cast(N, tl.int64) * E
        tl.store(Part + ks.to(tl.int64) * NE + r64 * E + experts[None, :], acc, mask=tile_ok)
        tl.debug_barrier()  # every thread's partials stored before the arrival is released
        tile_count = Count + rb * n_et + et
        tile_done = tl.atomic_add(tile_count, 1, sem="acq_rel") == SPLIT_K - 1
        if tile_done:  # the tile's last split: its partials in split order
            tot = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
            part = Part + r64 * E + experts[None, :]
            for s0 in range(0, SPLIT_K, SUM_UNROLL):  # SUM_UNROLL loads in flight, added in split order
                for u in tl.static_range(SUM_UNROLL):
                    tot += tl.load(part + (s0 + u) * NE, mask=tile_ok & (s0 + u < SPLIT_K), other=0.0,
                                   cache_modifier=".cg")
            tl.store(lg_ptr, tot, mask=tile_ok)
            if N_GROUP == 1:
                _tile_candidates(tot, rows, experts, row_ok, e_ok, Bias, Cand, et, n_cand, HAS_BIAS, C_T)
            tl.store(tile_count, 0)  # for the next launch
    if tile_done:
        tl.debug_barrier()  # the tile's logits and candidates stored (by every thread) before the row block's arrival
        last = True
        if not ONE_TILE:
            block_count = Count + n_rb * n_et + rb
            last = tl.atomic_add(block_count, 1, sem="acq_rel") == n_et - 1
            if last:
                tl.store(block_count, 0)
        if last:  # every tile of the row block is in Logits (and Cand): route its rows, SEL_ROWS a pass (unrolled:
            # a runtime loop over the passes spills on sm_120 with fp32 inputs and groups, triton 3.6 and 3.9)
            for r0 in tl.static_range(0, BLOCK_T, SEL_ROWS):
                if rb * BLOCK_T + r0 < N:
                    sel = rb * BLOCK_T + r0 + tl.arange(0, SEL_ROWS)
                    if N_GROUP == 1:
                        _merge_rows(Cand, Logits, TreeLens, Idx, Wt, sel, N, n_cand, stride_l, T, expert_offset,
                                    scaling, TOP_K, K_PAD, C_PAD, HAS_LENS, NORM)
                    else:
                        _select_rows(Logits, Bias, TreeLens, Idx, Wt, sel, N, E, stride_l, T, expert_offset, scaling,
                                     TOP_K, K_PAD, N_GROUP, TOPK_GROUP, G_PAD, GS_PAD, SEL_ROWS, HAS_BIAS, HAS_LENS,
                                     NORM)


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RouterConfig:
    """Launch configuration of :func:`_route_kernel`.

    block_t / block_e / block_k: rows, experts and hidden columns of a program's tile (each >= 16: ``tl.dot``).
    num_warps / num_stages: as in ``triton.Config``.
    sel_lanes: rows x padded experts routed at once by the selecting program (its int64 keys: registers).
    programs_per_sm: the K split aims at this many programs an SM when the tiles are fewer.
    """

    block_t: int
    block_e: int
    block_k: int
    num_warps: int
    num_stages: int
    sel_lanes: int = 4096
    programs_per_sm: int = 2


# Row bucket -> config: a launch of N rows takes the first bucket >= N (else the largest). Bounded by the
# ahead-of-time audit (tests/kernels/test_aot_audit.py): sm_120 101,376 B of shared memory and no spills, bf16 and
# fp32 inputs, one group or 8 of them. Decode: rows in blocks of 16, because a row block's selection runs in one
# program, SEL_ROWS rows a pass, after its last tile: more row blocks select in parallel (bench/RESULTS.md, "MoE
# router"); 32-expert tiles for one row block, 64 for several (fewer tiles a block), K splits so that ~2 programs an
# SM stream the weight, one an SM for one or two row blocks on sm_90 (fewer partials for each tile's last split to
# add; measured there only). Many rows: larger tiles, no split. 8 warps: the selecting program routes sel_lanes / E_pad
# rows a pass (8 at E = 384) with 16 int64 keys a thread; with 4 warps the same passes need ~168 registers and spill
# a little on sm_120 (2048 lanes, 4 rows a pass, would double the passes); 8192 lanes need up to 254 registers.
ROUTER_CONFIGS: dict[str, dict[int, RouterConfig]] = {
    "sm_90": {
        16: RouterConfig(16, 32, 128, 8, 4, programs_per_sm=1),
        32: RouterConfig(16, 64, 128, 8, 4, programs_per_sm=1),
        256: RouterConfig(16, 64, 128, 8, 4),
        1 << 30: RouterConfig(64, 64, 64, 8, 3),
    },
    "sm_120": {
        16: RouterConfig(16, 32, 128, 8, 3),
        256: RouterConfig(16, 64, 128, 8, 3),
        1 << 30: RouterConfig(64, 64, 64, 8, 2),
    },
    "sm_80": {
        16: RouterConfig(16, 32, 128, 8, 3),
        256: RouterConfig(16, 64, 128, 8, 3),
        1 << 30: RouterConfig(64, 64, 64, 8, 3),
    },
    # Interpreter: few, large programs (each interpreted operation costs the same at any tile size); two
    # programs a "SM" (num_sms() is 4 there), so small expert counts still take the split-K path.
    "cpu": {
        1 << 30: RouterConfig(32, 32, 64, 4, 1, sel_lanes=1 << 14, programs_per_sm=2),
    },
}

MAX_SPLIT_K = 64
SUM_UNROLL = 8  # partial tiles a tile's reducer loads at once


@dataclass(frozen=True)
class RoutePlan:
    """Everything a launch needs, from static shapes only (graph-capturable).

    row_blocks, expert_tiles, split_k: the grid; k_split: hidden columns per split (whole K tiles; no split is
    empty); sel_rows: rows routed at once by a row block's selecting program.
    """

    config: RouterConfig
    row_blocks: int
    expert_tiles: int
    split_k: int
    k_split: int
    sel_rows: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.row_blocks, self.expert_tiles, self.split_k)

    @property
    def counters(self) -> int:
        """Arrival counters a launch uses: one a tile, then one a row block."""
        return self.row_blocks * (self.expert_tiles + 1)

    def as_ints(self) -> list[int]:
        """The plan as the op's ``int[]`` argument (:meth:`from_ints` inverts it)."""
        c = self.config
        return [c.block_t, c.block_e, c.block_k, c.num_warps, c.num_stages, c.sel_lanes, c.programs_per_sm,
                self.row_blocks, self.expert_tiles, self.split_k, self.k_split, self.sel_rows]

    @classmethod
    def from_ints(cls, v) -> "RoutePlan":
        v = [int(a) for a in v]
        return cls(RouterConfig(*v[:7]), *v[7:12])


def _lanes(E: int, n_group: int) -> int:
    """Lanes of the grouped selection: groups and group sizes each padded to a power of two."""
    return triton.next_power_of_2(n_group) * triton.next_power_of_2(E // n_group)


def _candidates(top_k: int, block_e: int, expert_tiles: int) -> tuple[int, int]:
    """One group: ``(candidates a tile, all candidates of a row)``: a tile keeps its best ``top_k`` (a power of two,
    at most its experts)."""
    c_t = min(triton.next_power_of_2(top_k), block_e)
    return c_t, c_t * expert_tiles


def _sel_lanes(E: int, top_k: int, n_group: int, block_e: int, expert_tiles: int) -> int:
    """Lanes a row of the selection takes: its candidates (one group) or all its experts (groups)."""
    if n_group == 1:
        return triton.next_power_of_2(_candidates(top_k, block_e, expert_tiles)[1])
    return _lanes(E, n_group)


def config_for(arch: str, N: int) -> RouterConfig:
    """The table's config for ``N`` rows (:func:`tritree.kernels.configs.lookup`)."""
    return lookup(ROUTER_CONFIGS, arch, N)


@functools.lru_cache(maxsize=1024)
def plan_moe_route(N: int, H: int, E: int, x_dtype: torch.dtype, w_dtype: torch.dtype, top_k: int, n_group: int,
                   topk_group: int, arch: str, sms: int, config: RouterConfig | None = None) -> RoutePlan:
    """The launch plan of one shape, computed once: the config (by rows), the grid, and a K split that brings
    the programs up to ``programs_per_sm x sms`` when the tiles are fewer (each split whole K tiles, none
    empty). ``config`` replaces the table's. The dtypes and routing options are part of the key (the kernel
    specialises on them)."""
    cfg = config if config is not None else config_for(arch, N)
    row_blocks = max(1, -(-N // cfg.block_t))
    expert_tiles = -(-E // cfg.block_e)
    k_tiles = max(1, -(-H // cfg.block_k))
    programs = row_blocks * expert_tiles
    target = cfg.programs_per_sm * sms
    split = 1 if programs >= target else max(1, min(MAX_SPLIT_K, k_tiles, -(-target // programs)))
    per = -(-k_tiles // split)  # K tiles per split
    split = -(-k_tiles // per)  # no empty split
    sel_rows = max(1, min(cfg.block_t, cfg.sel_lanes // _sel_lanes(E, top_k, n_group, cfg.block_e, expert_tiles)))
    sel_rows = 1 << (sel_rows.bit_length() - 1)  # a power of two (and so divides block_t)
    return RoutePlan(cfg, row_blocks, expert_tiles, split, per * cfg.block_k, sel_rows)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _validate(x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
              rows_per_request, logits_out, plan, names=("x", "weight", "bias")) -> None:
    """``names``: what the messages call x, weight and bias (an op that takes them under other names)."""
    xn, wn, bn = names
    V.check_tensor(xn, x, ndim=2, dtypes=DTYPES)
    dev = x.device
    V.check_tensor(wn, weight, ndim=2, dtypes=DTYPES, device=dev)
    N, H = x.shape
    E = weight.shape[0]
    if H < 1:
        raise ValueError(f"{xn} must have a hidden size >= 1, got shape {tuple(x.shape)}")
    if E < 1 or weight.shape[1] != H:
        raise ValueError(f"{wn} must have shape [E, H] with E >= 1 and H = {H} ({xn}'s last dimension), got "
                         f"{tuple(weight.shape)}")
    if bias is not None:
        V.check_tensor(bn, bias, ndim=1, dtypes=(torch.float32,), device=dev)
        V.check_shape(bn, bias, (E,), "[E]")
    # E is weight's row count: the messages that depend on it name weight too.
    top_k = V.check_int("top_k", top_k, 1)
    if top_k > E:
        raise ValueError(f"top_k = {top_k} exceeds the E = {E} experts of {wn} {tuple(weight.shape)}")
    n_group = V.check_int("n_group", n_group, 1)
    if E % n_group:
        raise ValueError(f"n_group = {n_group} must divide the number of experts E = {E} ({wn}'s rows)")
    if n_group > 1 and E // n_group < 2:
        raise ValueError(f"n_group = {n_group} leaves groups of {E // n_group} expert of {wn}'s E = {E}; a group "
                         f"scores its top 2, so groups need at least 2 experts")
    topk_group = V.check_int("topk_group", topk_group, 1, n_group)
    if top_k > topk_group * (E // n_group):
        raise ValueError(f"top_k = {top_k} exceeds the {topk_group * (E // n_group)} experts of topk_group = "
                         f"{topk_group} groups of {E // n_group} ({wn}'s E = {E})")
    if not isinstance(norm_topk_prob, bool):
        raise TypeError(f"norm_topk_prob must be a bool, got {type(norm_topk_prob).__name__}")
    V.check_float("scaling", scaling)
    V.check_int("expert_offset", expert_offset, -(2**31) + E, 2**31 - 1)
    if (tree_lens is None) != (rows_per_request is None):
        raise ValueError("tree_lens and rows_per_request must be given together (padding rows of a tree batch), "
                         f"got tree_lens={'None' if tree_lens is None else 'a tensor'}, "
                         f"rows_per_request={rows_per_request!r}")
    if tree_lens is not None:
        T = V.check_int("rows_per_request", rows_per_request, 1)
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=dev)
        if N != tree_lens.shape[0] * T:
            raise ValueError(f"{xn} must have N = B * rows_per_request = {tree_lens.shape[0]} * {T} = "
                             f"{tree_lens.shape[0] * T} rows (B from tree_lens), got {N}")
    if logits_out is not None:
        V.check_tensor("logits_out", logits_out, ndim=2, dtypes=(torch.float32,), device=dev)
        V.check_shape("logits_out", logits_out, (N, E), "[N, E]")
    if plan is not None:
        if not isinstance(plan, RoutePlan):
            raise TypeError(f"plan must be a RoutePlan, got {type(plan).__name__}")
        c = plan.config
        ok = (plan.row_blocks * c.block_t >= N and plan.expert_tiles * c.block_e >= E
              and plan.split_k * plan.k_split >= H and plan.k_split % c.block_k == 0 and plan.sel_rows >= 1
              and c.block_t % plan.sel_rows == 0 and min(c.block_t, c.block_e, c.block_k) >= 16)
        if not ok:
            raise ValueError(f"plan does not cover N = {N}, E = {E}, H = {H} in whole tiles of at least 16: {plan}")


# --------------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------------

def _dot_f32(x_dtype, w_dtype) -> bool:
    return interpreting() or x_dtype != w_dtype or x_dtype == torch.float32


def _constexprs(plan: RoutePlan, N, H, E, x_dtype, w_dtype, top_k, n_group, topk_group, norm, has_bias, has_lens):
    c = plan.config
    c_t, n_cand = _candidates(top_k, c.block_e, plan.expert_tiles)
    return dict(BLOCK_T=c.block_t, BLOCK_E=c.block_e, BLOCK_K=c.block_k, SPLIT_K=plan.split_k,
                ONE_TILE=plan.expert_tiles == 1, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), N_GROUP=n_group,
                TOPK_GROUP=topk_group, G_PAD=triton.next_power_of_2(n_group),
                GS_PAD=triton.next_power_of_2(E // n_group), SEL_ROWS=plan.sel_rows, HAS_BIAS=has_bias,
                HAS_LENS=has_lens, NORM=norm, DOT_F32=_dot_f32(x_dtype, w_dtype),
                EVEN_K=H % c.block_k == 0,  # then every split is whole K tiles (k_split is)
                EVEN_E=E % c.block_e == 0, SUM_UNROLL=SUM_UNROLL, C_T=c_t,
                C_PAD=triton.next_power_of_2(n_cand))


def _workspace(plan: RoutePlan, N: int, E: int, top_k: int, n_group: int, device, logits: bool):
    """``(partials [split_k, N, E] fp32 or None, logits [N, E] fp32 or None, candidates [N, n_cand] int64 or
    None)``, uninitialised."""
    part = torch.empty(plan.split_k, N, E, dtype=torch.float32, device=device) if plan.split_k > 1 else None
    lg = torch.empty(N, E, dtype=torch.float32, device=device) if logits else None
    n_cand = _candidates(top_k, plan.config.block_e, plan.expert_tiles)[1]
    cand = torch.empty(N, n_cand, dtype=torch.int64, device=device) if n_group == 1 else None
    return part, lg, cand


def _launch(x, weight, bias, tree_lens, logits_out, plan: RoutePlan, top_k, n_group, topk_group, norm, scaling,
            expert_offset, rows_per_request, launcher=None, scratch=None):
    """One launch of :func:`_route_kernel` (``launcher``: a bound :class:`KernelLauncher`, else through the JIT;
    ``scratch``: the workspaces, else fresh ones). Returns ``(topk_idx, topk_w)``."""
    N, H = x.shape
    E = weight.shape[0]
    dev = x.device
    idx = torch.empty(N, top_k, dtype=torch.int32, device=dev)
    w = torch.empty(N, top_k, dtype=torch.float32, device=dev)
    if N == 0:
        return idx, w
    part, lg, cand = (scratch if scratch is not None
                      else _workspace(plan, N, E, top_k, n_group, dev, logits_out is None))
    logits = logits_out if logits_out is not None else lg
    count = arrival_counters(dev, plan.counters)
    args = (x, weight, bias if bias is not None else logits, tree_lens if tree_lens is not None else count,
            part if part is not None else logits, logits, cand if cand is not None else count, count, idx, w,
            N, H, E, x.stride(0), weight.stride(0), logits.stride(0), plan.k_split,
            _candidates(top_k, plan.config.block_e, plan.expert_tiles)[1],
            rows_per_request if rows_per_request is not None else 1, expert_offset, float(scaling))
    if launcher is not None:
        launcher(plan.grid, *args)
    else:
        c = plan.config
        _route_kernel[plan.grid](*args, **_constexprs(plan, N, H, E, x.dtype, weight.dtype, top_k, n_group, topk_group,
                                                      norm, bias is not None, tree_lens is not None),
                                 num_warps=c.num_warps, num_stages=c.num_stages)
    return idx, w


class _RoutePlanLaunch:
    """moe_route for one static signature and option set: validated, planned, kernel bound once (its
    workspaces one set per CUDA stream, a fresh set inside a graph capture)."""

    def __init__(self, x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
                 rows_per_request, logits_out, plan):
        _validate(x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
                  rows_per_request, logits_out, plan)
        self.opts = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                         scaling=scaling, expert_offset=expert_offset, rows_per_request=rows_per_request)
        dev = self.device = x.device
        N, H = x.shape
        E = weight.shape[0]
        self.reference = not uses_kernel(dev)
        if self.reference:
            return
        self.plan = plan if plan is not None else plan_moe_route(N, H, E, x.dtype, weight.dtype, top_k, n_group,
                                                                 topk_group, arch_of(dev), num_sms(dev))
        c = self.plan.config
        self._launcher = KernelLauncher(
            _route_kernel, _constexprs(self.plan, N, H, E, x.dtype, weight.dtype, top_k, n_group, topk_group,
                                       norm_topk_prob, bias is not None, tree_lens is not None),
            num_warps=c.num_warps, num_stages=c.num_stages)
        need_logits = logits_out is None
        p = self.plan
        self._scratch = StreamScratch(lambda: _workspace(p, N, E, top_k, n_group, dev, need_logits))

    def run(self, x, weight, bias, tree_lens, logits_out):
        o = self.opts
        if tree_lens is not None and V.checks_values(self.device):
            T = o["rows_per_request"]
            V.check_value_range("tree_lens", tree_lens, 0, T, f" (rows_per_request = {T})")
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad))
        if self.reference or needs_grad:  # the kernel has no backward
            return moe_route_reference(x, weight, bias, tree_lens=tree_lens, logits_out=logits_out,
                                       dtype=torch.float32, **o)
        return _launch(x, weight, bias, tree_lens, logits_out, self.plan, o["top_k"], o["n_group"], o["topk_group"],
                       o["norm_topk_prob"], o["scaling"], o["expert_offset"], o["rows_per_request"],
                       launcher=self._launcher, scratch=self._scratch.get(self.device) if x.shape[0] else None)


_ROUTE_PLANS = PlanCache("moe_route", _RoutePlanLaunch)


def moe_route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, top_k: int,
              n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True, scaling: float = 1.0,
              expert_offset: int = 0, tree_lens: torch.Tensor | None = None, rows_per_request: int | None = None,
              logits_out: torch.Tensor | None = None, plan: RoutePlan | None = None):
    """DeepSeek-V3 / Kimi K2 MoE routing (sigmoid scores, ``noaux_tc`` selection) in one kernel launch.

    Args:
        x: ``[N, H]`` bf16/fp16/fp32 hidden states (any row stride, last dimension contiguous).
        weight: ``[E, H]`` bf16/fp16/fp32 router weight (``mlp.gate.weight``) in its own dtype (not upcast in
            memory); ``logits = x @ weight^T`` summed in fp32.
        bias: ``[E]`` fp32 ``e_score_correction_bias`` (added to the scores for selection only) or None.
        top_k: experts per row, in ``[1, E]``. n_group / topk_group: groups of ``E / n_group`` consecutive
            experts (at least 2), each scored by the sum of its two highest choices; only the ``topk_group``
            best groups' experts may be picked (ties: lower group id). ``top_k <= topk_group * E / n_group``.
        norm_topk_prob: divide the picked scores by their sum + 1e-20. scaling: then multiply by this
            (``routed_scaling_factor``).
        expert_offset: subtracted from the ids (expert parallelism: ids outside ``[0, local E)`` are another
            rank's; the expert kernels skip them).
        tree_lens, rows_per_request: ``[B]`` int32 and ``T`` with ``N = B * T`` (given together): row ``n`` is
            padding iff ``n % T >= tree_lens[n // T]``; padding rows get id -1 and weight 0.
        logits_out: optional ``[N, E]`` fp32 (any row stride) that receives the logits.
        plan: a :class:`RoutePlan` replacing :func:`plan_moe_route`'s (tests, tuning).

    Returns ``(topk_idx [N, top_k] int32, topk_w [N, top_k] float32)``: per row the picked experts in
    descending choice (``scores + bias``; equal choices: lower id first) and their weights ``sigmoid(logit)``
    (normalised, scaled). Semantics exactly :func:`moe_route_reference`'s.

    On CUDA (and under ``TRITON_INTERPRET=1``) one kernel launch, no host sync (CUDA-graph capturable once warm);
    other devices run the reference in float32, as do calls that need gradients. Eager calls run a plan cached
    per static signature; under torch.compile the op ``tritree::moe_route`` (opaque, with a fake impl).
    Concurrent calls on different CUDA streams of one device are not supported (shared arrival counters).
    """
    if eager():
        try:
            key = (signature(x, weight, bias, tree_lens, logits_out),
                   scalars(top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, rows_per_request), plan)
            hash(key)
        except (AttributeError, TypeError):  # not tensors / unhashable options: validation says which
            _validate(x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
                      rows_per_request, logits_out, plan)
            raise
        return _ROUTE_PLANS.get(key, x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling,
                                expert_offset, tree_lens, rows_per_request, logits_out, plan).run(
            x, weight, bias, tree_lens, logits_out)
    _validate(x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, scaling, expert_offset, tree_lens,
              rows_per_request, logits_out, plan)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if needs_grad or not uses_kernel(x.device):
        return moe_route_reference(x, weight, bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                                   norm_topk_prob=norm_topk_prob, scaling=scaling, expert_offset=expert_offset,
                                   tree_lens=tree_lens, rows_per_request=rows_per_request, logits_out=logits_out,
                                   dtype=torch.float32)
    N, H = x.shape
    E = weight.shape[0]
    if plan is None:  # a pure function of ints: traced through uncached
        plan = plan_moe_route.__wrapped__(N, H, E, x.dtype, weight.dtype, top_k, n_group, topk_group,
                                          arch_of(x.device), num_sms(x.device))
    args = (x, weight, bias, tree_lens, logits_out, plan.as_ints(), top_k, n_group, topk_group, norm_topk_prob,
            float(scaling), expert_offset, rows_per_request if rows_per_request is not None else 0)
    return _moe_route_op(*args)


# Opaque to torch.compile (as the MoE and tree ops): programs hand work to each other through counters and
# workspaces that Inductor's analysis of user kernels cannot follow.
@torch.library.custom_op("tritree::moe_route", mutates_args=("logits_out",))
def _moe_route_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tree_lens: torch.Tensor | None,
                  logits_out: torch.Tensor | None, plan: list[int], top_k: int, n_group: int, topk_group: int,
                  norm_topk_prob: bool, scaling: float, expert_offset: int,
                  rows_per_request: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, weight, bias, tree_lens, logits_out, RoutePlan.from_ints(plan), top_k, n_group, topk_group,
                   norm_topk_prob, scaling, expert_offset, rows_per_request if tree_lens is not None else None)


@_moe_route_op.register_fake
def _(x, weight, bias, tree_lens, logits_out, plan, top_k, n_group, topk_group, norm_topk_prob, scaling,
      expert_offset, rows_per_request):
    N = x.shape[0]
    return x.new_empty(N, top_k, dtype=torch.int32), x.new_empty(N, top_k, dtype=torch.float32)
