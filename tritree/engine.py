"""Speculative decoding: Kimi K2 target + DFlash draft + DDTree, the host-side driver of the decode step.

:class:`Engine` admits requests (pages from a :class:`~tritree.PagePool`), prefills them, runs decode steps
(:mod:`tritree.step`: the whole step on the device, replayed as CUDA graphs on a GPU), streams the emitted tokens,
applies stop tokens and length limits, and retires finished requests: their pages go back to the pool and their
row stays in the batch, inactive on a sink page (so the captured graphs keep their shapes), until the next queued
request takes it (admission: :meth:`Engine.generate`). Under tensor parallelism (``tp``) every rank runs its
engine with its shard and the same calls.
"""

from __future__ import annotations

import operator
import os
import weakref
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from . import dist
from .budget import AnalyticCost, StepCost, tabulate
from .kernels import PagePool, PoolExhausted
from .model import dflash
from .model.kimi_k2 import prefill, to_kernel_layout_
from .step import (
    AutoStep,
    PhaseTimer,
    SamplingConfig,
    auto_sizer,
    capture_step,
    decode_step_,
    tree_buffers,
    tree_step_,
    verify_step_,
)


@dataclass
class Result:
    """One request's outcome, either ``tokens`` (generated, stop token included; ``error`` None,
    ``finish`` "stop" or "length") or ``error`` (why it was refused or failed; ``tokens`` empty,
    ``finish`` None). ``steps``: decode steps it took part in."""

    tokens: list = field(default_factory=list)
    error: str | None = None
    steps: int = 0
    finish: str | None = None  # "stop", "length" or None (error)


# --------------------------------------------------------------------------------------------------
# Host-side driver
# --------------------------------------------------------------------------------------------------

def _profile_env():
    v = os.environ.get("TRITREE_PROFILE", "0")
    return v not in ("", "0", "false", "False"), v == "eager"


# Every engine, so that ``close_all_engines`` (``dist.shutdown_tp``) can free their graphs before the
# process group goes, also those a caller still holds.
_LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()


def close_all_engines() -> None:
    """``close()`` on every live :class:`Engine` (frees their captured CUDA graphs)."""
    for eng in list(_LIVE_ENGINES):
        eng.close()


dist.register_teardown(close_all_engines)  # dist.shutdown_tp frees every engine's graphs first

_REQ = "generate"  # PagePool ids of a call's requests: (_REQ, index of the prompt)


class Engine:
    """Generation with a target/draft pair (parameters as dicts, configs as dataclasses).

    ``page_size``/``num_pages``: the paged caches (target latent and draft K/V share one page table);
    ``pool`` (a :class:`~tritree.PagePool` of ``num_pages``) hands their pages to requests, and the
    caches hold one page more, the sink of batch rows without a request.
    ``graphs``: capture the step in a CUDA graph (default: on a GPU). ``compile``: torch.compile the
    target verify and the draft forward (GPU). ``tp``: a :class:`tritree.dist.TPGroup`; every rank
    constructs its engine with its target shard and calls ``generate`` with the same arguments (the
    results are the same on every rank). ``cost_model``: the step-cost model of ``budget="auto"`` (a
    :class:`tritree.budget.CostTable` of this GPU, e.g. from :func:`tritree.budget.load_cost_file`);
    default the analytic model of these parameters (:class:`tritree.budget.AnalyticCost`).

    ``tree_sizes``: a ``Counter`` of the tree nodes (root excluded) verified per active request and step
    in the last ``generate`` call; :meth:`tree_size_stats` summarises it. ``step_nodes``: per step of that
    call, ``(active requests, their tree nodes in all (root excluded), the tree size the step verified at)``
    (what a batch step's cost depends on).
    """

    def __init__(self, tparams, tcfg, dparams, dcfg, *, page_size: int = 16, num_pages: int = 4096,
                 device=None, dtype=None, graphs: bool | None = None, compile: bool = False, profile_every: int = 20,
                 tp=None, cost_model=None):
        self.tp = tp
        self.device = torch.device(device or tparams["lm_head.weight"].device)
        # INT4 experts in the layout this GPU's kernels stream, converted in place (no second copy); the shared
        # expert's gate|up and each layer's q_a|kv_a rows concatenated (:func:`tritree.model.kimi_k2.to_kernel_layout_`).
        to_kernel_layout_(tparams, self.device)
        dflash.to_kernel_layout_(dparams)  # the draft's q|k|v and gate|up rows concatenated, per-head q and k norms
        self.tparams, self.tcfg, self.dparams, self.dcfg = tparams, tcfg, dparams, dcfg
        self.dtype = dtype or tparams["lm_head.weight"].dtype
        self.page_size, self.num_pages = page_size, num_pages
        self.graphs = (self.device.type == "cuda") if graphs is None else graphs
        self.compile = compile
        self.profile, self.profile_eager = _profile_env()
        self.profile_every = profile_every
        self.phase_stats = defaultdict(list)
        self._graphs = {}
        _LIVE_ENGINES.add(self)
        self._chain = False
        self._auto = False
        self.cost_model = cost_model
        self._step_costs = {}  # (B, budget) -> StepCost: captured graphs read these buffers
        self.tree_sizes = Counter()
        self.step_nodes: list[tuple[int, int, int]] = []
        self.pool = PagePool(num_pages, page_size)
        # One page past the pool's: rows of the batch without a request point there (their trees are
        # still written each step), so a finished request's pages can go to another at once.
        self._sink = num_pages
        self._tkv = torch.zeros(tcfg.num_hidden_layers, num_pages + 1, page_size, tcfg.latent_dim, dtype=self.dtype,
                                device=self.device)
        self._dkv = torch.zeros(dcfg.num_hidden_layers, num_pages + 1, page_size, 2, dcfg.num_key_value_heads,
                                dcfg.head_dim, dtype=self.dtype, device=self.device)
        self.log = print

    # ---- requests ---------------------------------------------------------------------------

    @staticmethod
    def _positions_needed(n_prompt: int, max_new_tokens: int, budget: int) -> int:
        """Cache positions a request reserves: its prompt, its new tokens, one tree of ``budget + 1``
        nodes written past the committed prefix, and 2 spare. Admission and reservation both use this."""
        return n_prompt + max_new_tokens + (budget + 1) + 2

    def _as_prompt(self, prompt) -> tuple[list[int] | None, str | None]:
        """``(token ids, None)`` for a valid prompt, else ``(None, why)``. Valid: a non-empty 1-D sequence
        (list, tuple, integer tensor or array) of integer ids in ``[0, vocab_size)``; bools and floats
        are not ids."""
        vocab = self.tcfg.vocab_size
        if torch.is_tensor(prompt):
            if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
                return None, f"prompt must be a 1-D integer tensor, got shape {tuple(prompt.shape)} {prompt.dtype}"
            prompt = prompt.tolist()
        if isinstance(prompt, str) or not isinstance(prompt, Iterable):
            return None, f"prompt must be a sequence of token ids, got {type(prompt).__name__}"
        ids = []
        for j, t in enumerate(prompt):
            try:
                if isinstance(t, bool) or (torch.is_tensor(t) and t.dtype == torch.bool):
                    raise TypeError
                t = operator.index(t)
            except TypeError:
                return None, f"prompt token {j} is {t!r} ({type(t).__name__}), not an integer token id"
            if not 0 <= t < vocab:
                return None, f"token id {t} is outside the vocabulary [0, {vocab})"
            ids.append(t)
        if not ids:
            return None, "empty prompt"
        return ids, None

    def _check_fit(self, n_prompt: int, max_new_tokens: int, budget: int) -> str | None:
        """Why a request can never run (its reservation exceeds the whole cache or the model), or None."""
        need = self._positions_needed(n_prompt, max_new_tokens, budget)
        cache, model = self.num_pages * self.page_size, self.tcfg.max_position_embeddings
        if need > min(cache, model):
            return (f"prompt of {n_prompt} tokens + {max_new_tokens} new + tree of {budget + 1} needs {need} "
                    f"positions, more than the cache allows ({min(cache, model)}: the pool holds {cache}, the model "
                    f"{model})")
        return None

    def generate(self, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k=None, top_p=None,
                 budget: int | str = 16, seed: int = 0, stop_tokens=(), stream=None, speculative: bool = True,
                 chain: bool = False, max_budget: int = 64) -> list[Result]:
        """Generates for a batch of prompts; returns one :class:`Result` per prompt, in order: its
        ``tokens`` (``error`` None) or its ``error`` (``tokens`` empty). Nothing one request does
        takes down another's result.

        ``budget``: draft-tree nodes per step (>= 1), or ``"auto"``: trees built with ``max_budget`` nodes
        and each step verifies the best-first prefix of each that maximises expected tokens per unit of
        step time under ``self.cost_model`` (:mod:`tritree.budget`; lossless like any tree); the sizes
        chosen are counted in ``self.tree_sizes``. ``chain=True`` uses the DFlash chain instead (the
        budget is then ``block_size - 1``, ``"auto"`` included); ``speculative=False`` decodes plainly
        with the target (one token per step). ``stream(i, new_tokens)`` is called as tokens are accepted. Arguments of the
        whole call (budget, max_new_tokens, sampling, stop tokens) raise ``ValueError`` when invalid.

        Admission, per request in the order given:

        - Refused up front with its own error: a malformed prompt (not a 1-D sequence of integer ids,
          empty, an id outside the vocabulary), or one that can never fit: a request reserves prompt +
          ``max_new_tokens`` + tree (``budget + 1``) + 2 positions, which must fit both the whole pool
          (``num_pages * page_size``) and the model's ``max_position_embeddings``.
        - The others are queued, first come first served: a request starts when the pool's free pages
          (what the running requests of this call, and anything else holding pages of ``self.pool``,
          leave) cover its reservation; a later request never overtakes an earlier one still waiting.
          The decode batch is as wide as the first round admitted; a finished request's row and pages
          go to the next one in the queue.
        - A request that still does not fit when nothing of this call is running (the missing pages
          are held outside the call) is refused with its own error.

        Every page the call took is back in the pool when it returns (or raises). Greedy outputs do
        not depend on the admission order; sampled ones are reproducible for the same call and pool.
        """
        auto = budget == "auto"
        if auto:
            if isinstance(max_budget, bool) or not isinstance(max_budget, int) or max_budget < 1:
                raise ValueError(f"max_budget must be an int >= 1, got {max_budget!r}")
            budget = max_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be an int >= 1 or 'auto', got {budget!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        sampling = SamplingConfig(temperature, top_k, top_p, seed)
        try:
            stop = {operator.index(t) for t in stop_tokens}
        except TypeError:
            raise ValueError(f"stop_tokens must be integer token ids, got {stop_tokens!r}") from None
        if chain:
            budget = self.dcfg.block_size - 1
        eff_budget = budget if speculative else 0
        self._chain = chain and speculative
        self._auto = auto and speculative and not chain
        self.tree_sizes = Counter()
        self.step_nodes = []
        prompts = list(prompts)
        results = [Result() for _ in prompts]
        queue = deque()  # (request index, token ids) waiting for pages, in order
        for i, p in enumerate(prompts):
            ids, err = self._as_prompt(p)
            err = err or self._check_fit(len(ids), max_new_tokens, eff_budget)
            if err:
                results[i].error = err
            else:
                queue.append((i, ids))
        taken = [i for i, _ in queue]
        try:
            if queue:
                self._serve(queue, results, max_new_tokens, eff_budget, sampling, stop, stream)
        finally:
            for i in taken:
                self.pool.release((_REQ, i))
        return results

    def _admit_next(self, queue, results, max_new_tokens, budget, running: bool):
        """The queue's head with its pages reserved, or None when it must wait for running requests'
        pages. A head that does not fit while nothing runs can never fit: it is refused."""
        while queue:
            i, ids = queue[0]
            try:
                self.pool.reserve((_REQ, i), self._positions_needed(len(ids), max_new_tokens, budget))
            except PoolExhausted as e:
                if running:
                    return None
                queue.popleft()
                results[i].error = f"{e}; the other pages are held outside this call"
                continue
            return queue.popleft()
        return None

    def _serve(self, queue, results, max_new_tokens, budget, sampling, stop, stream):
        """Runs every queued request (see :meth:`generate`), filling ``results``. Rows of the batch
        without a request point at the sink page and are inactive."""
        first = []
        while (a := self._admit_next(queue, results, max_new_tokens, budget, running=bool(first))) is not None:
            first.append(a)
        if not first:
            return
        width = -(-max(self._positions_needed(len(ids), max_new_tokens, budget) for ids in
                       [ids for _, ids in first] + [ids for _, ids in queue]) // self.page_size)
        state = self._new_state(len(first), width, budget)
        rows = [None] * len(first)  # request index of every row (None: free)
        ctx = (results, rows, max_new_tokens, budget, sampling, stop, stream)
        for k, (i, _) in enumerate(first):
            rows[k] = i
        self._start(state, [(k, i, ids) for k, (i, ids) in enumerate(first)], *ctx)
        state, run = self._runner(state, budget, sampling)
        steps = 0
        while True:
            while True:  # free rows to the queue's head while pages allow (a start may finish at once)
                starts = []
                for k in [k for k, r in enumerate(rows) if r is None]:
                    a = self._admit_next(queue, results, max_new_tokens, budget,
                                         running=any(r is not None for r in rows))
                    if a is None:
                        break
                    rows[k] = a[0]
                    starts.append((k, *a))
                if not starts:
                    break
                self._start(state, starts, *ctx)
            if all(r is None for r in rows):
                return
            self._set_active(state, [r is not None for r in rows])
            try:
                run()
                n = state["n_emitted"].tolist()
                em = state["emitted"].tolist()
                sizes = state["tree_lens"].tolist()
            except Exception as e:  # not one request's doing: every unfinished request gets the error
                err = f"decode step failed: {type(e).__name__}: {e}"
                for i in [r for r in rows if r is not None] + [i for i, _ in queue]:
                    results[i].tokens, results[i].finish, results[i].error = [], None, err
                return
            live = [k for k, i in enumerate(rows) if i is not None]
            self.step_nodes.append((len(live), sum(sizes[k] - 1 for k in live), run.width()))
            for k, i in enumerate(rows):
                if i is None:
                    continue
                r = results[i]
                r.steps += 1
                self.tree_sizes[sizes[k] - 1] += 1
                new = []
                for t in em[k][:n[k]]:
                    new.append(t)
                    if t in stop:
                        r.finish = "stop"
                        break
                    if len(r.tokens) + len(new) >= max_new_tokens:
                        r.finish = "length"
                        break
                r.tokens.extend(new)
                if stream and new:
                    stream(i, new)
                if r.finish:
                    self._retire(state, rows, k)
            steps += 1
            if self.profile and steps % self.profile_every == 0:
                self.report_phases()

    def _new_state(self, B: int, width: int, budget: int) -> dict:
        """Decode state of ``B`` free rows (see module) over page tables ``[B, width]``."""
        dev, tmax = self.device, budget + 1
        return {
            "tkv": self._tkv, "dkv": self._dkv,
            "page_table": torch.full((B, width), self._sink, dtype=torch.int32, device=dev),
            "kv_lens": torch.zeros(B, dtype=torch.int32, device=dev),
            "dlens": torch.zeros(B, dtype=torch.int32, device=dev),
            "anchor": torch.zeros(B, dtype=torch.int32, device=dev),
            "pending": torch.zeros(B, tmax, self.dcfg.n_taps, self.tcfg.hidden_size, dtype=self.dtype, device=dev),
            "pending_n": torch.zeros(B, dtype=torch.int32, device=dev),
            "active": torch.zeros(B, dtype=torch.bool, device=dev),
            "step": torch.zeros(1, dtype=torch.int64, device=dev),
            "emitted": torch.full((B, tmax), -1, dtype=torch.int32, device=dev),
            "n_emitted": torch.zeros(B, dtype=torch.int32, device=dev),
            **tree_buffers(B, tmax, dev),
        }

    def _prefill_row(self, state, k: int, i: int, ids: list[int], budget: int) -> torch.Tensor:
        """Request ``i`` (pages already reserved) into row ``k``: its page-table row, the target prefill
        (KV + taps), the draft context. Returns the last position's logits ``[1, V]`` (``V``: this
        rank's vocabulary shard under TP)."""
        dev = self.device
        pages = self.pool.pages[(_REQ, i)]
        row = state["page_table"][k]
        row.fill_(self._sink)
        row[:len(pages)] = torch.tensor(pages, dtype=torch.int32, device=dev)
        toks = torch.tensor([ids], dtype=torch.long, device=dev)
        zero = torch.zeros(1, dtype=torch.int32, device=dev)
        cache = {"kv": self._tkv, "page_table": state["page_table"][k:k + 1], "kv_lens": zero}
        logits, taps, _ = prefill(self.tparams, self.tcfg, toks, cache, taps=tuple(self.dcfg.target_layer_ids),
                                  tp=self.tp, last_only=True)  # the next token only: no [S, vocab] logits
        if budget > 0:
            dcache = {"kv": self._dkv, "page_table": state["page_table"][k:k + 1], "kv_lens": zero.clone()}
            pos = torch.arange(len(ids), device=dev)[None]
            dflash.materialize_context_(self.dparams, self.dcfg, taps.to(self.dtype), pos, dcache, tp=self.tp)
        state["kv_lens"][k] = len(ids)
        state["dlens"][k] = len(ids) if budget > 0 else 0
        state["pending_n"][k] = 0
        return logits[:, -1]

    def _start(self, state, starts, results, rows, max_new_tokens, budget, sampling, stop, stream):
        """Prefills ``starts`` (``(row, request, ids)``) and picks their first tokens together, at the
        state's RNG step (then advanced, so that the next decode step draws fresh numbers). A request
        that fails to prefill gets its error; one finished by its first token leaves its row."""
        last, started = None, []
        for k, i, ids in starts:
            try:
                lg = self._prefill_row(state, k, i, ids, budget)
            except Exception as e:  # this request's own failure (e.g. out of memory on a long prompt)
                results[i].error = f"prefill failed: {type(e).__name__}: {e}"
                self._retire(state, rows, k)
                continue
            if last is None:
                last = torch.zeros(len(rows), 1, lg.shape[-1], dtype=lg.dtype, device=self.device)
            last[k, 0] = lg[0]
            started.append((k, i))
        if not started:
            return
        picks = dist.target_picks(self.tp, last, self.tcfg.vocab_size, temperature=sampling.temperature,
                                  top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed,
                                  step=state["step"])[:, 0]
        state["step"].add_(1)
        picks = picks.tolist()
        for k, i in started:
            t = picks[k]
            state["anchor"][k] = t
            results[i].tokens.append(t)
            if stream:
                stream(i, [t])
            if t in stop or max_new_tokens <= 1:
                results[i].finish = "stop" if t in stop else "length"
                self._retire(state, rows, k)

    def _retire(self, state, rows, k: int) -> None:
        """Row ``k``'s request is done: its pages go back to the pool and the row points at the sink
        page (an inactive row's step still writes its tree there), empty."""
        self.pool.release((_REQ, rows[k]))
        rows[k] = None
        state["page_table"][k].fill_(self._sink)
        state["kv_lens"][k] = 0
        state["dlens"][k] = 0
        state["pending_n"][k] = 0
        state["active"][k] = False

    def _set_active(self, state, active):
        state["active"].copy_(torch.tensor(active, dtype=torch.bool), non_blocking=False)

    # ---- running steps ------------------------------------------------------------------------

    def _step_fns(self):
        """``(decode_step_, tree_step_, verify_step_)``, under ``torch.compile`` when ``compile``."""
        if not self.compile:
            return decode_step_, tree_step_, verify_step_
        if not hasattr(self, "_compiled"):
            self._compiled = tuple(torch.compile(f, dynamic=False) for f in (decode_step_, tree_step_, verify_step_))
        return self._compiled

    def _runner(self, state, budget, sampling):
        """``(state, run)``: ``run()`` does one step on ``state``, eagerly, eagerly with phase timing,
        or as CUDA graph replays. Runners are kept per (batch, budget, mode (chain, auto), sampling,
        page-table width): a later call with the same key copies its fresh state into the captured buffers
        and returns those, so only the first call pays for the captures."""
        if self.graphs and not (self.profile and self.profile_eager):
            key = (state["anchor"].shape[0], budget, self._chain, self._auto, sampling.temperature, sampling.top_k,
                   sampling.top_p, sampling.seed, tuple(state["page_table"].shape))
            hit = self._graphs.get(key)
            if hit is not None:
                static, run = hit
                for k, v in state.items():
                    if torch.is_tensor(v) and v is not static[k]:
                        static[k].copy_(v)
                return static, run
            run = self._make_runner(state, budget, sampling)
            self._graphs[key] = (state, run)
            return state, run
        return state, self._make_runner(state, budget, sampling)

    def _make_runner(self, state, budget, sampling):
        """The step of ``state``: ``run()``, with ``run.graphs()`` the CUDA graphs it captured and ``run.width()``
        the tree size the last step verified at."""
        args = (self.tparams, self.tcfg, self.dparams, self.dcfg)
        timed = self.profile and (self.profile_eager or not self.graphs)
        decode_fn, tree_fn, verify_fn = (decode_step_, tree_step_, verify_step_) if timed else self._step_fns()
        replay = None
        if self._auto:  # captures its parts itself
            cost = self._step_cost(state["anchor"].shape[0], budget)
            step = AutoStep(args, state, budget, sampling, cost.trees, auto_sizer(state, cost),
                            graphs=self.graphs and not timed, tp=self.tp, step_fns=(tree_fn, verify_fn))
            graphs, width = step.graphs, (lambda: step.last_width)
        else:
            def step(timer=None):
                decode_fn(*args, state, budget=budget, sampling=sampling, timer=timer, chain=self._chain, tp=self.tp)
            if self.graphs and not timed:
                replay = capture_step(state, step)
            graphs, width = ((lambda: [replay.graph]) if replay else list), (lambda: budget + 1)

        def run():
            if timed:
                timer = PhaseTimer(True, self.device)
                step(timer)
                for k, v in timer.durations_ms().items():
                    self.phase_stats[k].append(v)
            elif replay is not None and self.profile:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                replay()
                b.record()
                b.synchronize()
                self.phase_stats["step (graph)"].append(a.elapsed_time(b))
            else:
                (replay or step)()
        run.graphs, run.width = graphs, width
        return run

    def _step_cost(self, B: int, budget: int) -> StepCost:
        """The cost model tabulated for ``B`` rows and ``budget`` (kept: a captured graph reads it)."""
        key = (B, budget)
        if key not in self._step_costs:
            if self.cost_model is None:
                gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
                self.cost_model = AnalyticCost.from_params(self.tparams, self.tcfg, self.dparams, self.dcfg,
                                                           self._tkv.element_size(), gpu)
            self._step_costs[key] = tabulate(self.cost_model, B, budget, self.tcfg.max_position_embeddings,
                                             self.device)
        return self._step_costs[key]

    def tree_size_stats(self) -> dict:
        """``{"mean": nodes per request-step (root excluded), "hist": {nodes: count}}`` of the last
        ``generate`` call (``tree_sizes``); mean NaN when no step ran."""
        total = sum(self.tree_sizes.values())
        mean = sum(k * c for k, c in self.tree_sizes.items()) / total if total else float("nan")
        return {"mean": mean, "hist": dict(sorted(self.tree_sizes.items()))}

    def close(self):
        """Frees the captured step graphs (the engine stays usable: later calls capture again). Under
        tensor parallelism call it (or ``dist.shutdown_tp``, which closes every engine) before
        ``destroy_process_group``: NCCL's teardown waits on graphs that captured its collectives (a TP2
        ``generate`` hung there on two H200s; pytorch/pytorch#115388)."""
        for _, run in self._graphs.values():
            for graph in run.graphs():
                graph.reset()
        self._graphs.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def report_phases(self):
        for name, vals in self.phase_stats.items():
            if vals:
                self.log(f"{name}: n={len(vals)} mean={sum(vals) / len(vals):.3f}ms last={vals[-1]:.3f}ms")
