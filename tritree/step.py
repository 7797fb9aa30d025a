"""The decode step: pure functions of the parameters and an explicit state of static buffers, updated in place.

A decode step (:func:`decode_step_`):

    materialise draft context of last step's accepted tokens -> draft block -> build_tree
    -> target verify (tree KV written, verify attention, logits, taps) -> accept_tree
    -> kv_commit_ on every target layer -> keep the accepted nodes' taps and the emitted tokens

in two parts, :func:`tree_step_` (the draft and the tree, stored in the state) and :func:`verify_step_` (the rest,
over the first ``width`` nodes of the stored tree). No host sync happens inside a part, so on a GPU a step is
captured in a CUDA graph (:func:`capture_step`) and replayed: a fixed tree size as one graph, an auto-sized one
(:class:`AutoStep`) as the tree graph, one host read of the size the device chose, and that size's verify graph.

State (B requests, T = budget + 1 tree tokens):
    tkv [target layers, pages, P, latent]; dkv [draft layers, pages, P, 2, Hkv, D]; page_table [B, max_pages]
    kv_lens [B] committed tokens (target); dlens [B] tokens with draft context; anchor [B] last emitted
    token (position kv_lens); pending [B, T, n_taps, hidden] taps of tokens not yet in the draft cache,
    pending_n [B]; active [B] bool; step [1] int64 (RNG counter); emitted [B, T], n_emitted [B];
    the step's tree (:func:`tree_buffers`): tree_tokens, tree_parents, tree_depth [B, T], tree_mask
    [B, T, ceil(T/32)], tree_lens [B] int32 tree nodes verified (root included), bucket [1] (auto steps).

Tree size (``budget="auto"``, :mod:`tritree.budget`): the tree is built at the largest budget, the size to
verify (one of :func:`tritree.budget.tree_buckets`) is chosen on the device for the most expected tokens per
unit of modelled step time, read by the host, and the step goes on in the verify graph of that size, so that a
smaller tree costs what its size costs.

Tensor parallelism (``tp``, a :class:`tritree.dist.TPGroup`): every rank runs the same step on its
shard of the target and of the draft (:mod:`tritree.model.parallel`; a whole draft, ``dcfg.tp_world == 1``, runs
replicated); the state, the target's latent cache and the trees are replicated and stay identical on every rank,
the draft's K/V cache holds the rank's KV heads. The collectives are inside the step, so on GPUs the step is
still one CUDA graph per rank (two for an auto step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import dist
from .budget import StepCost, auto_tree_lens
from .kernels import build_tree, kv_commit_, tree_mask_from_parents
from .model import dflash
from .model.kimi_k2 import verify


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self):
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")



# --------------------------------------------------------------------------------------------------
# The step: pure functions of params and explicit state
# --------------------------------------------------------------------------------------------------

class PhaseTimer:
    """Per-phase timing with CUDA events (or the host clock on the CPU); free when disabled."""

    def __init__(self, enabled: bool, device):
        self.enabled = enabled
        self.cuda = torch.device(device).type == "cuda"
        self.marks = []

    def mark(self, name):
        if not self.enabled:
            return
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))
        else:
            self.marks.append((name, time.perf_counter()))

    def durations_ms(self) -> dict:
        if not self.marks:
            return {}
        if self.cuda:
            self.marks[-1][1].synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        self.marks = []
        return out


def draft_phase_(tparams, dparams, dcfg, state: dict, width: int, tp=None) -> torch.Tensor:
    """DFlash: last step's accepted target taps (``pending[:, :width]``, ``width`` the tree size last step
    verified at) become draft context (written into ``state["dkv"]``; ``state["dlens"]`` advances), then the
    block after ``anchor`` is drafted. Returns ``draft_logits: [B, block_size - 1, V]``."""
    dev = state["anchor"].device
    dcache = {"kv": state["dkv"], "page_table": state["page_table"], "kv_lens": state["dlens"]}
    pending = state["pending"][:, :width]
    pos = state["dlens"][:, None].to(torch.long) + torch.arange(width, device=dev)
    dcache = dflash.materialize_context_(dparams, dcfg, pending, pos, dcache, counts=state["pending_n"], tp=tp)
    state["dlens"].copy_(dcache["kv_lens"])
    return dflash.draft(dparams, dcfg, tparams["model.embed_tokens.weight"], tparams["lm_head.weight"],
                        state["anchor"], state["dlens"], dcache, tp=tp)


def tree_phase(draft_logits: torch.Tensor | None, anchor: torch.Tensor, budget: int, chain: bool = False):
    """The tree to verify: a DDTree of ``budget`` nodes below ``anchor`` (``chain``: the draft's top
    token at every depth; ``budget = 0``: the root alone). Returns ``(tokens, parents, depth,
    tree_mask, tree_lens, scores)`` with ``T = budget + 1`` nodes per request (``scores``: the DDTree's path
    log-probabilities, None otherwise). Every prefix of a DDTree is the DDTree of a smaller budget: the
    verify, the accept walk and the KV write ignore rows past ``tree_lens``, and a prefix's ancestors all
    lie inside it (parents come first)."""
    B, dev, T = anchor.shape[0], anchor.device, budget + 1
    if budget == 0:
        return (anchor[:, None], torch.full((B, 1), -1, dtype=torch.int32, device=dev),
                torch.zeros(B, 1, dtype=torch.int32, device=dev), torch.ones(B, 1, 1, dtype=torch.int32, device=dev),
                torch.ones(B, dtype=torch.int32, device=dev), None)
    if chain:
        tokens = torch.cat([anchor[:, None], torch.argmax(draft_logits, dim=-1).to(torch.int32)], dim=1)
        parents = (torch.arange(T, device=dev, dtype=torch.int32) - 1)[None].expand(B, -1).contiguous()
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=dev)
        tree_mask, depth = tree_mask_from_parents(parents, tree_lens)
        return tokens, parents, depth, tree_mask, tree_lens, None
    tree = build_tree(draft_logits, budget, anchor)
    return tree.tokens, tree.parents, tree.depth, tree.tree_mask, tree.tree_lens, tree.scores


def accept_phase(tcfg, tokens, parents, tree_lens, logits, active, sampling: SamplingConfig, step, tp=None):
    """The accepted path of every request: ``(idx [B, T], n [B], bonus [B])`` (``n = 0`` for inactive
    requests). Under TP the greedy picks come from the vocabulary shards without gathering logits."""
    idx, n, bonus, _ = dist.accept_tree(tp, tokens, parents, tree_lens, logits, tcfg.vocab_size,
                                        temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                        seed=sampling.seed, step=step)
    return idx, torch.where(active, n, 0), bonus


def commit_phase_(state: dict, idx, n) -> None:
    """The accepted nodes' KV moved onto the committed prefix of every target layer; ``kv_lens`` advances."""
    state["kv_lens"].copy_(kv_commit_(state["tkv"], state["page_table"], state["kv_lens"], idx, n, stacked=True))


def tree_step_(tparams, dparams, dcfg, state: dict, *, budget: int, width: int, chain: bool = False, tp=None,
               sizer=None, timer: PhaseTimer | None = None) -> dict:
    """The first part of a decode step, in place: the draft (reading the ``width`` rows of ``pending`` that
    the last step's verify wrote) and the tree of ``budget`` nodes, stored in ``state``'s tree buffers
    (``tree_tokens``, ``tree_parents``, ``tree_depth``, ``tree_mask``, ``tree_lens``). ``sizer(scores [B, T]
    float32, tree_lens [B] int32) -> (tree_lens [B] int32, bucket [1] int64)`` (DDTree only; device ops,
    :func:`auto_sizer`): the tree size of the step, ``bucket`` into ``state["bucket"]``. Returns ``state``."""
    timer = timer or PhaseTimer(False, state["anchor"].device)
    timer.mark("start")
    draft_logits = None
    if budget > 0:
        draft_logits = draft_phase_(tparams, dparams, dcfg, state, width, tp=tp)
        timer.mark("draft")
    tokens, parents, depth, tree_mask, tree_lens, scores = tree_phase(draft_logits, state["anchor"], budget, chain)
    if sizer is not None and scores is not None:
        tree_lens, bucket = sizer(scores, tree_lens)
        state["bucket"].copy_(bucket)
    T = budget + 1
    state["tree_tokens"][:, :T].copy_(tokens)
    state["tree_parents"][:, :T].copy_(parents)
    state["tree_depth"][:, :T].copy_(depth)
    state["tree_mask"][:, :T, :tree_mask.shape[2]].copy_(tree_mask)
    state["tree_lens"].copy_(tree_lens)
    timer.mark("tree")
    return state


def verify_step_(tparams, tcfg, dcfg, state: dict, *, width: int, sampling: SamplingConfig, draft: bool = True,
                 tp=None, timer: PhaseTimer | None = None) -> dict:
    """The second part of a decode step, in place, over the first ``width`` nodes of the stored trees (every
    ``tree_lens`` at most ``width``): the target's verify, the accept walk, the commit, and the step's
    bookkeeping (emitted tokens, the accepted nodes' taps into ``pending[:, :width]`` when ``draft``, the next
    anchor). Returns ``state``."""
    timer = timer or PhaseTimer(False, state["anchor"].device)
    dev = state["anchor"].device
    active = state["active"]
    tokens, parents, depth = (state[k][:, :width].contiguous() for k in ("tree_tokens", "tree_parents", "tree_depth"))
    tree_mask = state["tree_mask"][:, :width, :-(-width // 32)].contiguous()
    tree_lens = state["tree_lens"]
    tcache = {"kv": state["tkv"], "page_table": state["page_table"], "kv_lens": state["kv_lens"]}
    logits, taps = verify(tparams, tcfg, tokens, depth, tree_mask, tcache, tree_lens,
                          taps=tuple(dcfg.target_layer_ids) if draft else (), tp=tp)
    timer.mark("verify")
    idx, n, bonus = accept_phase(tcfg, tokens, parents, tree_lens, logits, active, sampling, state["step"], tp=tp)
    timer.mark("accept")
    commit_phase_(state, idx, n)
    timer.mark("commit")
    # Emitted: the accepted nodes after the root, then the bonus token.
    j = torch.arange(width, device=dev)[None, :]
    nodes = torch.gather(tokens, 1, torch.clamp(torch.roll(idx, -1, dims=1), min=0).long())
    em = torch.where(j < (n - 1)[:, None], nodes, torch.where(j == (n - 1)[:, None], bonus[:, None], -1))
    state["emitted"][:, :width].copy_(em)
    state["n_emitted"].copy_(n)
    state["anchor"].copy_(torch.where(active, bonus, state["anchor"]))
    if draft:
        sel = torch.clamp(idx, min=0).long()[:, :, None, None].expand(-1, -1, taps.shape[2], taps.shape[3])
        state["pending"][:, :width].copy_(torch.gather(taps, 1, sel).to(state["pending"].dtype))
        state["pending_n"].copy_(n)
    state["step"].add_(1)
    return state


def decode_step_(tparams, tcfg, dparams, dcfg, state: dict, *, budget: int, sampling: SamplingConfig,
                 timer: PhaseTimer | None = None, chain: bool = False, tp=None) -> dict:
    """One speculative decode step of a fixed tree size for every request of ``state`` (see module), in place:
    :func:`tree_step_` and :func:`verify_step_` at ``T = budget + 1``.

    ``budget = 0`` is plain decoding (a root-only tree: one token per step, no draft); ``chain`` is
    DFlash's own chain (the draft's top token at every depth, ``budget = block_size - 1``) instead of
    a DDTree. ``tp``: this rank's group (``tparams``/``tcfg`` are then the rank's shard). Returns ``state``
    (same buffers)."""
    T = budget + 1
    tree_step_(tparams, dparams, dcfg, state, budget=budget, width=T, chain=chain, tp=tp, timer=timer)
    return verify_step_(tparams, tcfg, dcfg, state, width=T, sampling=sampling, draft=budget > 0, tp=tp, timer=timer)


def auto_sizer(state: dict, cost: StepCost):
    """The ``sizer`` of ``budget="auto"``: :func:`tritree.budget.auto_tree_lens` over ``state``'s
    ``active`` and ``kv_lens`` (read when the step runs: graph replays see the current values)."""
    def sizer(scores, tree_lens):
        return auto_tree_lens(scores, tree_lens, state["active"], state["kv_lens"], cost)
    return sizer


def tree_buffers(B: int, T: int, device) -> dict:
    """The state's tree of the step (:func:`tree_step_` writes it, :func:`verify_step_` reads it): ``tree_tokens,
    tree_parents, tree_depth [B, T]`` int32, ``tree_mask [B, T, ceil(T/32)]`` int32, ``tree_lens [B]`` int32 (the
    nodes verified, root included) and ``bucket [1]`` int64 (the index of the auto step's size)."""
    return {"tree_tokens": torch.zeros(B, T, dtype=torch.int32, device=device),
            "tree_parents": torch.full((B, T), -1, dtype=torch.int32, device=device),
            "tree_depth": torch.zeros(B, T, dtype=torch.int32, device=device),
            "tree_mask": torch.zeros(B, T, -(-T // 32), dtype=torch.int32, device=device),
            "tree_lens": torch.ones(B, dtype=torch.int32, device=device),
            "bucket": torch.zeros(1, dtype=torch.int64, device=device)}


MUTABLE = ("kv_lens", "dlens", "anchor", "pending", "pending_n", "step", "emitted", "n_emitted", "tree_tokens",
           "tree_parents", "tree_depth", "tree_mask", "tree_lens", "bucket")


def capture_step(state: dict, fn, pool=None):
    """``fn()`` (a step or a part of one on ``state``) captured in a CUDA graph, after one warm-up call on the
    side stream; both run with every request inactive (committing nothing, so the caches' committed entries
    stay intact) and ``state``'s mutable buffers are restored after each, so the real sequence is not
    advanced. ``pool``: the graph memory pool to share (graphs that never run at the same time). Returns
    ``run`` (a replay), with ``run.graph``."""
    saved = {k: state[k].clone() for k in MUTABLE}
    active = state["active"].clone()

    def quiet(call):
        state["active"].zero_()
        call()
        state["active"].copy_(active)
        for k in MUTABLE:
            state[k].copy_(saved[k])

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: compiles kernels, allocates on the side stream
        quiet(fn)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()

    def captured():
        with torch.cuda.graph(graph, pool=pool):
            fn()
    quiet(captured)

    def run():
        graph.replay()
    run.graph = graph
    return run


class AutoStep:
    """``budget="auto"`` steps on one state: :func:`tree_step_` at the largest budget with ``sizer`` (e.g.
    :func:`auto_sizer`; its bucket indexes ``sizes``, the tree sizes of the step), one host read of the chosen
    size, :func:`verify_step_` at that size. With ``graphs`` each part of each size is captured the first time
    it runs (the tree part by the size the last step verified at: its ``pending`` width), every graph in one
    memory pool (the parts never run at the same time), so a step costs the graphs of its size. ``args``:
    ``(tparams, tcfg, dparams, dcfg)``; ``step_fns``: ``(tree_step_, verify_step_)`` or compiled versions of
    them. Call it to run one step; ``graphs()`` lists the captured graphs; ``last_width``: the size the last
    step verified at."""

    def __init__(self, args, state: dict, budget: int, sampling: SamplingConfig, sizes, sizer, graphs: bool,
                 tp=None, step_fns=None):
        self.args, self.state, self.budget, self.sampling, self.tp = args, state, budget, sampling, tp
        self.tree_fn, self.verify_fn = step_fns or (tree_step_, verify_step_)
        self.sizes = tuple(int(s) for s in sizes)
        self.sizer = sizer
        self.use_graphs = graphs
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self._tree, self._verify = {}, {}
        self.last_width = budget + 1

    def _part(self, cache: dict, key: int, fn):
        if key not in cache:
            cache[key] = capture_step(self.state, fn, self.pool) if self.use_graphs else fn
        return cache[key]

    def tree(self, width: int, timer=None):
        tparams, _, dparams, dcfg = self.args
        return lambda: self.tree_fn(tparams, dparams, dcfg, self.state, budget=self.budget, width=width, tp=self.tp,
                                    sizer=self.sizer, timer=timer)

    def verify(self, width: int, timer=None):
        tparams, tcfg, _, dcfg = self.args
        return lambda: self.verify_fn(tparams, tcfg, dcfg, self.state, width=width, sampling=self.sampling,
                                      tp=self.tp, timer=timer)

    def __call__(self, timer=None):
        w = self.last_width
        (self.tree(w, timer) if timer else self._part(self._tree, w, self.tree(w)))()
        T = self.sizes[int(self.state["bucket"].item())]  # the one host read of the step
        (self.verify(T, timer) if timer else self._part(self._verify, T, self.verify(T)))()
        self.last_width = T

    def graphs(self) -> list:
        return [r.graph for r in (*self._tree.values(), *self._verify.values()) if hasattr(r, "graph")]
