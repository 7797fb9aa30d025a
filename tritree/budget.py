"""The draft tree sized for throughput: a step-cost model and the per-step choice of the tree size.

A DDTree of ``budget`` nodes comes out best-first, so each of its prefixes is itself a DDTree of a smaller
budget (the same nodes in the same order). Verifying only a prefix of ``k + 1`` nodes (root included)
accepts, in expectation, ``E(k) + 1`` tokens (:func:`tritree.kernels.expected_accept`). A step verifies at
one of a few tree sizes (:func:`tree_buckets`: 5, 9, 17, 33, 65 tokens for ``budget = 64``), each captured in
a graph of its own, so that a step costs what its size costs: the engine builds the tree at the largest
budget, picks the size on the device, reads it (one host read a step) and replays that size's verify graph
(``tritree.step``).

**Batch rule.** Every request of the batch is verified at the same size ``S`` (the graph's), and within one
graph more nodes cost nothing more, so each request keeps its first ``min(S, tree_lens)`` nodes and ``S* =
argmax_S (sum_b E_b(S - 1) + A) / cost(S)`` with ``A`` the active requests (each emits its bonus token).
Ties go to the smaller tree.

**Cost models** (both give ms per step of the whole batch, ``cost_ms(B, L, T)`` with ``T`` tree tokens
per request, root included; ``L`` the mean committed context):

- :class:`CostTable`: measured by ``python -m tritree bench calibrate`` on a GPU and stored as JSON
  (:func:`load_cost_file`), piecewise-linear in ``T``, ``L`` and ``B`` over the measured grid (linear
  extrapolation past its edges, except below the smallest measured tree, whose cost smaller trees take: a
  line through two noisy sizes would make unmeasured small trees look cheap; see :func:`parse_cost_json` for
  the schema).
- :class:`AnalyticCost` (the default when no table is given): bytes over bandwidth and FLOPs over
  throughput of what this rank holds, each component at the larger of its two times (roofline):
  weights read once per step (every non-routed target and draft tensor; the draft's embedding and head
  are the target's), the routed experts the step's ``N = B T`` tokens route to (expected distinct experts
  of uniform top-``k`` routing over ``E``: ``E_local (1 - (1 - k/E)^N)``, times an expert's bytes), the
  target's latent KV read once per layer (``B (L + T) latent`` elements) against the verify attention's
  FLOPs, and the draft's K/V cache read (:meth:`AnalyticCost.terms_ms`); the cost is a time per layer plus
  the terms times their scales, fitted to a measured step (:func:`fit_cost`, :data:`RECORDED_COST_FITS`: the
  kernels' shares of the ceilings and the per-layer launch and fixed costs). Ceilings:
  :data:`tritree.roofline.RECORDED_CEILINGS` of the GPU when recorded, else the H200's. Not modelled:
  collectives. Only the ratios of costs matter to the choice (a constant factor cancels).

Costs are made non-decreasing in the tree size (a step over more tokens is never cheaper: a measured dip
is noise) and floored at the model's cheapest step.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

SCHEMA_VERSION = 2  # 2: step_ms is the bucketed auto step (1: the tree truncated in the static graph)
DEFAULT_COST_PATH = Path("~/.cache/tritree/step_cost.json").expanduser()


# --------------------------------------------------------------------------------------------------
# Piecewise-linear interpolation (host)
# --------------------------------------------------------------------------------------------------

def _interp(x: float, xs, ys) -> np.ndarray:
    """Piecewise-linear ``ys`` (``[n, ...]``) at ``x`` over strictly increasing ``xs``; linear
    extrapolation from the edge segments; a single point is constant."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    if len(xs) == 1:
        return ys[0]
    i = int(np.clip(np.searchsorted(xs, x), 1, len(xs) - 1))
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class CostTable:
    """One GPU's measured step times: ``step_ms[b][l][t]`` at ``batch[b]``, ``ctx[l]``, ``tree[t]``
    (tree tokens per request, root included): a ``--budget auto`` step whose tree, built at ``static_tree``
    tokens, is verified at ``tree[t]`` (the draft and tree graph, the host read of the size, the verify
    graph of that size); ``captured_ms`` (optional, same layout): each tree size in one graph captured at that
    size (what a fixed ``--budget tree - 1`` step costs)."""

    gpu: str
    batch: tuple
    ctx: tuple
    tree: tuple
    step_ms: tuple
    static_tree: int
    source: str = ""
    captured_ms: tuple | None = None

    def cost_ms(self, B: float, L: float, T: float) -> float:
        return _grid_at(self.step_ms, self.batch, self.ctx, self.tree, B, L, T)

    def captured_cost_ms(self, B: float, L: float, T: float) -> float:
        """A fixed-size step of ``T`` tree tokens in its own graph; ``ValueError`` when not measured."""
        if self.captured_ms is None:
            raise ValueError(f"the step-cost table of {self.gpu} has no captured_ms (bench calibrate measures it)")
        return _grid_at(self.captured_ms, self.batch, self.ctx, self.tree, B, L, T)

    def floor_ms(self) -> float:
        return float(np.min(np.asarray(self.step_ms, dtype=np.float64)))

    def at_ctx(self, L: float) -> "CostTable":
        """This table at the one context ``L`` (interpolated; constant in context): the cost of a step at
        ``L`` whatever context the requests have (to model one context with a model of another)."""
        def col(ms):
            return None if ms is None else tuple(
                (tuple(float(v) for v in _interp(L, self.ctx, grid)),) for grid in ms)
        return CostTable(self.gpu, self.batch, (int(L),), self.tree, col(self.step_ms), self.static_tree,
                         f"{self.source} (at context {int(L)})", col(self.captured_ms))

    def ctx_points(self, max_ctx: int) -> list[int]:
        return list(self.ctx)


def _grid_at(ms, batch, ctx, tree, B: float, L: float, T: float) -> float:
    T = max(T, tree[0])  # below the smallest measured tree: its cost (a smaller tree is not assumed cheaper)
    per_b = [_interp(L, ctx, [_interp(T, tree, row) for row in grid]) for grid in ms]
    return float(_interp(B, batch, per_b))


def _fail(where: str, what: str):
    raise ValueError(f"step-cost JSON: {where}: {what}")


def _axis(where: str, v) -> tuple:
    if not isinstance(v, list) or not v:
        _fail(where, f"expected a non-empty list of integers, got {v!r}")
    for j, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            _fail(f"{where}[{j}]", f"expected an integer >= 0, got {x!r}")
    if any(b <= a for a, b in zip(v, v[1:])):
        _fail(where, f"must be strictly increasing, got {v}")
    return tuple(v)


def parse_cost_json(obj) -> dict[str, CostTable]:
    """Validated tables of a step-cost JSON document, by GPU name. Schema (version 2)::

        {"version": 2,
         "gpus": {"<torch.cuda.get_device_name()>": {
             "batch": [1, 4], "ctx": [4096, 46000], "tree": [1, 8, 65],   # strictly increasing ints
             "step_ms": [[[...len(tree)] ...len(ctx)] ...len(batch)],      # finite, > 0
             "static_tree": 65,                                             # int >= max(tree)
             "source": "how it was measured",                               # optional string
             "captured_ms": [[[...]]]}}}                                    # optional, as step_ms

    Raises ``ValueError`` naming the offending field."""
    if not isinstance(obj, dict):
        _fail("document", f"expected an object, got {type(obj).__name__}")
    if obj.get("version") != SCHEMA_VERSION:
        old = " (version 1 timed the tree truncated in one static graph: python -m tritree bench calibrate again)"
        _fail("version", f"expected {SCHEMA_VERSION}, got {obj.get('version')!r}"
              + (old if obj.get("version") == 1 else ""))
    gpus = obj.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        _fail("gpus", f"expected a non-empty object of GPU name -> table, got {gpus!r}")
    out = {}
    for name, t in gpus.items():
        w = f"gpus[{name!r}]"
        if not isinstance(t, dict):
            _fail(w, f"expected an object, got {type(t).__name__}")
        for key in ("batch", "ctx", "tree", "step_ms", "static_tree"):
            if key not in t:
                _fail(f"{w}.{key}", "missing")
        batch, ctx, tree = (_axis(f"{w}.{k}", t[k]) for k in ("batch", "ctx", "tree"))
        if batch[0] < 1 or tree[0] < 1:
            _fail(f"{w}.{'batch' if batch[0] < 1 else 'tree'}", "values must be >= 1")
        st = t["static_tree"]
        if isinstance(st, bool) or not isinstance(st, int) or st < tree[-1]:
            _fail(f"{w}.static_tree", f"expected an integer >= max(tree) = {tree[-1]}, got {st!r}")
        ms = _ms_grid(f"{w}.step_ms", t["step_ms"], batch, ctx, tree)
        captured = None if t.get("captured_ms") is None else _ms_grid(f"{w}.captured_ms", t["captured_ms"], batch,
                                                                      ctx, tree)
        src = t.get("source", "")
        if not isinstance(src, str):
            _fail(f"{w}.source", f"expected a string, got {type(src).__name__}")
        out[name] = CostTable(name, batch, ctx, tree, ms, st, src, captured)
    return out


def _ms_grid(w: str, ms, batch, ctx, tree) -> tuple:
    """A validated ``[batch][ctx][tree]`` grid of times (ms) as nested tuples of floats."""
    if not isinstance(ms, list) or len(ms) != len(batch):
        _fail(w, f"expected {len(batch)} entries (one per batch), got {ms!r:.80}")
    for i, grid in enumerate(ms):
        if not isinstance(grid, list) or len(grid) != len(ctx):
            _fail(f"{w}[{i}]", f"expected {len(ctx)} entries (one per ctx), got {grid!r:.80}")
        for j, row in enumerate(grid):
            if not isinstance(row, list) or len(row) != len(tree):
                _fail(f"{w}[{i}][{j}]", f"expected {len(tree)} values (one per tree), got {row!r:.80}")
            for k, v in enumerate(row):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    _fail(f"{w}[{i}][{j}][{k}]", f"expected a finite number > 0 (ms), got {v!r}")
    return tuple(tuple(tuple(float(v) for v in r) for r in g) for g in ms)


def load_cost_file(path) -> dict[str, CostTable]:
    """:func:`parse_cost_json` of the file ``path`` (``ValueError`` for invalid JSON too)."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"step-cost JSON: {path}: not JSON ({e})") from None
    return parse_cost_json(obj)


def cost_table_json(table: CostTable) -> dict:
    """The JSON object of one GPU's table (the inverse of :func:`parse_cost_json` for one entry)."""
    return {"batch": list(table.batch), "ctx": list(table.ctx), "tree": list(table.tree),
            "step_ms": [[list(r) for r in g] for g in table.step_ms], "static_tree": table.static_tree,
            "source": table.source,
            **({} if table.captured_ms is None else {"captured_ms": [[list(r) for r in g] for g in table.captured_ms]})}


def save_cost_table(path, table: CostTable) -> None:
    """Writes ``table`` into the JSON file ``path`` under its GPU's name, keeping the other GPUs' tables."""
    path = Path(path)
    doc = {"version": SCHEMA_VERSION, "gpus": {}}
    if path.exists():
        load_cost_file(path)  # refuse to merge into an invalid file
        doc = json.loads(path.read_text())
    doc["gpus"][table.gpu] = cost_table_json(table)
    parse_cost_json(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


# --------------------------------------------------------------------------------------------------
# Analytic default
# --------------------------------------------------------------------------------------------------

_ROUTED = (".mlp.experts.",)


@dataclass(frozen=True)
class AnalyticCost:
    """The analytic step cost (module docstring) of one rank, from the tensors it holds.

    ``fixed_bytes``/``fixed_params``: non-routed weights read per step (the target's matmul weights,
    not its embedding rows; the draft's; ``lm_head`` twice: the draft uses it too); ``expert_bytes``:
    one routed expert of one layer; ``expert_layers``, ``experts_local``, ``experts``, ``topk``: routing;
    ``attn_layers``, ``latent``, ``heads``, ``qk_dim``, ``v_dim``: the verify attention; ``kv_bytes``:
    bytes per cached element; ``draft_kv_per_token``: draft K/V elements per context token over its
    layers; ``gbps``/``tflops``: the ceilings."""

    fixed_bytes: float
    fixed_params: float
    expert_bytes: float
    expert_params: float
    expert_layers: int
    experts_local: int
    experts: int
    topk: int
    attn_layers: int
    latent: int
    heads: int
    qk_dim: int
    v_dim: int
    kv_bytes: int
    draft_kv_per_token: int
    gbps: float
    tflops: float
    layer_ms: float = 0.0
    scales: tuple = (1.0, 1.0, 1.0, 1.0)

    def terms_ms(self, B: float, L: float, T: float) -> np.ndarray:
        """The roofline times (ms) of :data:`COST_TERMS` for ``N = B T`` tree tokens: the non-routed weights, the
        distinct routed experts they route to, the verify attention, the draft's K/V."""
        N = B * T
        bw, peak = self.gbps * 1e9, self.tflops * 1e12
        distinct = self.experts_local * (1.0 - (1.0 - self.topk / self.experts) ** N)
        e_bytes = self.expert_layers * distinct * self.expert_bytes
        e_flops = 2 * N * self.expert_layers * self.topk * self.experts_local / self.experts * self.expert_params
        a_bytes = self.attn_layers * B * (L + T) * self.latent * self.kv_bytes
        a_flops = self.attn_layers * 2 * N * self.heads * (L + T) * (self.qk_dim + self.v_dim)
        d_bytes = B * L * self.draft_kv_per_token * self.kv_bytes
        return 1e3 * np.array([max(self.fixed_bytes / bw, 2 * N * self.fixed_params / peak),
                               max(e_bytes / bw, e_flops / peak), max(a_bytes / bw, a_flops / peak), d_bytes / bw])

    def cost_ms(self, B: float, L: float, T: float) -> float:
        """``attn_layers * layer_ms + sum(scales * terms_ms)``."""
        return float(self.attn_layers * self.layer_ms + np.dot(self.scales, self.terms_ms(B, L, T)))

    def floor_ms(self) -> float:
        return self.cost_ms(1, 0, 1)

    def ctx_points(self, max_ctx: int) -> list[int]:
        """Context lengths to tabulate at: the cost is piecewise linear in ``L`` (a max of affine terms),
        so a doubling grid interpolates it closely."""
        pts, x = [0], 256
        while x < max_ctx:
            pts.append(x)
            x *= 2
        return pts + [max(max_ctx, 1)]

    @classmethod
    def from_params(cls, tparams: dict, tcfg, dparams: dict, dcfg, kv_bytes: int, gpu: str | None = None):
        """The model of these tensors (meta tensors serve: only shapes and dtypes are read), with the ceilings
        and the fit (:data:`RECORDED_COST_FITS`) of ``gpu`` where recorded, else the H200's."""
        from .roofline import RECORDED_CEILINGS

        ceil = RECORDED_CEILINGS.get(gpu, RECORDED_CEILINGS["NVIDIA H200"])
        layer_ms, scales = RECORDED_COST_FITS.get(gpu, RECORDED_COST_FITS["NVIDIA H200"])
        fixed_b = fixed_p = 0
        experts: dict[str, list] = {}
        for k, t in tparams.items():
            if k == "model.embed_tokens.weight":
                continue  # B T rows gathered, not the table
            layer = next((k[:k.index(r) + len(r)] for r in _ROUTED if r in k), None)
            if layer is not None:
                experts.setdefault(layer, []).append((k, t))
                continue
            fixed_b += t.numel() * t.element_size()
            fixed_p += t.numel() if t.dim() == 2 else 0
        head = tparams["lm_head.weight"]
        fixed_b += head.numel() * head.element_size()  # the draft's head is the target's
        fixed_b += sum(t.numel() * t.element_size() for t in dparams.values())
        e_loc = e_bytes = e_params = 0
        if experts:
            ts = next(iter(experts.values()))
            e_loc = ts[0][1].shape[0]
            e_bytes = sum(t.numel() * t.element_size() for _, t in ts) / e_loc
            # packed INT4: 8 weights a 32-bit word; scales are read, not multiplied
            e_params = sum(t.numel() * (8 if k.endswith("_packed") else 1) for k, t in ts
                           if not k.endswith("_scale")) / e_loc
        layers = sum(1 for k in tparams if k.endswith(".input_layernorm.weight"))
        d_kv = 2 * dcfg.num_key_value_heads * dcfg.head_dim * dcfg.num_hidden_layers  # windows not modelled
        return cls(fixed_bytes=float(fixed_b), fixed_params=float(fixed_p), expert_bytes=float(e_bytes),
                   expert_params=float(e_params), expert_layers=len(experts), experts_local=int(e_loc),
                   experts=int(tcfg.n_routed_experts), topk=int(tcfg.num_experts_per_tok), attn_layers=layers,
                   latent=int(tcfg.latent_dim), heads=int(tcfg.heads),
                   qk_dim=int(tcfg.kv_lora_rank + tcfg.qk_rope_head_dim), v_dim=int(tcfg.kv_lora_rank),
                   kv_bytes=int(kv_bytes), draft_kv_per_token=int(d_kv), gbps=ceil.copy_gbps,
                   tflops=ceil.matmul_tflops, layer_ms=float(layer_ms), scales=tuple(float(s) for s in scales))


COST_TERMS = ("weights", "experts", "attention", "draft")

# A GPU's fit of the analytic terms to its measured steps (:func:`fit_cost`): ``(layer_ms, scales)`` (the weights'
# scale is 1: a constant, it merges into the per-layer time). H200: fitted to the captured step times of the K2.6
# TP8-rank slice (bench/RESULTS.md, "Tree size per step": the table, the fit's error and growth in T). The experts'
# scale is the inverse of the routed kernels' share of the copy bandwidth; the draft's carries the costs that grow
# with B L besides the verify attention's KV.
RECORDED_COST_FITS: dict[str, tuple[float, tuple]] = {
    "NVIDIA H200": (0.3220, (1.0, 2.2501, 1.4058, 30.4734)),
    "NVIDIA H100 80GB HBM3": (0.0894, (1.0, 1.5470, 1.7738, 7.2271)),
}


def fit_cost(model: AnalyticCost, table: CostTable, captured: bool = True) -> tuple[AnalyticCost, float]:
    """``model`` with ``layer_ms`` and the scales of the experts, attention and draft terms fitted to ``table``
    (its ``captured_ms`` when ``captured`` and measured, else ``step_ms``) by least squares on the relative
    error, every coefficient >= 0 (the best fit over the subsets of terms whose unconstrained fit is
    non-negative). Returns ``(fitted model, largest relative error over the table's cells)``."""
    import itertools

    ms = table.captured_ms if captured and table.captured_ms is not None else table.step_ms
    rows, y = [], []
    for bi, B in enumerate(table.batch):
        for li, L in enumerate(table.ctx):
            for ti, T in enumerate(table.tree):
                tm = model.terms_ms(B, L, T)
                rows.append([model.attn_layers, *tm[1:]])
                y.append(ms[bi][li][ti] - tm[0])
    F, y = np.array(rows, dtype=np.float64), np.array(y, dtype=np.float64)
    total = y + np.array([model.terms_ms(B, L, T)[0] for B in table.batch for L in table.ctx for T in table.tree])
    w = 1.0 / total
    best = None
    for mask in itertools.product((False, True), repeat=F.shape[1]):
        cols = [i for i in range(F.shape[1]) if mask[i]]
        if not cols:
            continue
        c, *_ = np.linalg.lstsq(F[:, cols] * w[:, None], y * w, rcond=None)
        if (c < 0).any():
            continue
        coef = np.zeros(F.shape[1])
        coef[cols] = c
        err = float(np.max(np.abs((F @ coef - y) / total)))
        if best is None or err < best[0]:
            best = (err, coef)
    err, coef = best if best is not None else (float("inf"), np.zeros(F.shape[1]))
    fitted = dataclasses.replace(model, layer_ms=float(coef[0]), scales=(1.0, *(float(v) for v in coef[1:])))
    return fitted, err


# --------------------------------------------------------------------------------------------------
# On the device: the tabulated cost and the choice
# --------------------------------------------------------------------------------------------------

BUCKET_BUDGETS = (4, 8, 16, 32, 64, 128, 256, 512)


def tree_buckets(budget: int) -> tuple[int, ...]:
    """The tree sizes (tokens a request, root included) an auto step of largest budget ``budget`` verifies at:
    ``b + 1`` for the :data:`BUCKET_BUDGETS` below ``budget``, and ``budget + 1`` (``budget = 64``: 5, 9, 17, 33,
    65). Each size is a graph of its own (``tritree.step``), so a step pays for the size it verifies."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")
    return tuple(b + 1 for b in BUCKET_BUDGETS if b < budget) + (budget + 1,)


class StepCost(NamedTuple):
    """A cost model tabulated for one batch width ``B`` and largest budget: ``trees`` the tree sizes of
    :func:`tree_buckets` (host ints) and ``sizes [nb] int64`` the same on the device, ``ctx [nL] float32`` context lengths (strictly increasing, ``nL >= 2``) and
    ``ms [nL, nb] float32`` the step time of the batch with trees of ``sizes[j]`` tokens, non-decreasing in
    ``j``; ``floor``: the smallest cost used (a divisor never reaches 0)."""

    trees: tuple
    sizes: torch.Tensor
    ctx: torch.Tensor
    ms: torch.Tensor
    floor: float


def tabulate(model, B: int, budget: int, max_ctx: int, device) -> StepCost:
    """``model`` (:class:`CostTable` or :class:`AnalyticCost`) at every tree size of :func:`tree_buckets`
    ``(budget)`` and at the model's context points, on ``device``."""
    sizes = tree_buckets(budget)
    ctx = sorted(set(int(c) for c in model.ctx_points(max_ctx)))
    if len(ctx) == 1:  # one measured context: constant in L
        ctx = [ctx[0], ctx[0] + 1]
    rows = np.array([[model.cost_ms(B, L, T) for T in sizes] for L in ctx], dtype=np.float64)
    floor = model.floor_ms()
    rows = np.maximum.accumulate(np.maximum(rows, floor), axis=1)
    return StepCost(sizes, torch.tensor(sizes, dtype=torch.int64, device=device),
                    torch.tensor(ctx, dtype=torch.float32, device=device),
                    torch.tensor(rows, dtype=torch.float32, device=device), float(floor))


def _cost_at(cost: StepCost, L: torch.Tensor) -> torch.Tensor:
    """``[nb]`` costs at context ``L`` (a 0-d float32 tensor): linear in ``L`` between the two
    tabulated rows around it (the edge rows' line past the ends). Device ops only."""
    nL = cost.ctx.shape[0]
    i = torch.searchsorted(cost.ctx, L.reshape(1)).clamp(1, nL - 1)
    x0, x1 = cost.ctx[i - 1], cost.ctx[i]
    w = (L - x0) / (x1 - x0)
    r0, r1 = cost.ms.index_select(0, i - 1)[0], cost.ms.index_select(0, i)[0]
    return torch.clamp(r0 + w * (r1 - r0), min=cost.floor)


def auto_tree_lens(scores: torch.Tensor, tree_lens: torch.Tensor, active: torch.Tensor, kv_lens: torch.Tensor,
                   cost: StepCost) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree size of the step, on the device (no host sync; static shapes): the module's rule over the
    sizes of ``cost``.

    Args:
        scores: ``[B, T]`` float32 path log-probabilities of best-first trees (a :class:`tritree.Tree`'s).
        tree_lens: ``[B]`` int32 nodes each tree has (root included).
        active: ``[B]`` bool, requests decoding this step (inactive rows keep the root only).
        kv_lens: ``[B]`` int32 committed context (the mean over active rows picks the cost row).
        cost: :func:`tabulate` of the model at this ``B`` and ``budget = T - 1``.
    Returns:
        ``(tree_lens [B] int32, bucket [1] int64)``: request ``b`` verifies its first
        ``min(sizes[bucket], tree_lens[b])`` nodes (inactive rows 1), in the graph of ``sizes[bucket]`` tokens.
    """
    B, T = scores.shape
    if cost.trees[-1] != T:
        raise ValueError(f"cost was tabulated for trees of up to {cost.trees[-1]} tokens, the batch has T = {T}")
    p = torch.where(active[:, None], torch.exp(scores[:, 1:]), 0.0)  # [B, T - 1]; padding: exp(-inf) = 0
    gain = torch.cat([p.new_zeros(B, 1), torch.cumsum(p, 1)], 1)  # [B, T]: E(k) of every prefix of k nodes
    got = gain.index_select(1, cost.sizes - 1).sum(0)  # [nb]: the batch's expected accepted nodes a size
    n_act = active.sum().to(torch.float32)
    L = (kv_lens.to(torch.float32) * active).sum() / n_act.clamp(min=1.0)
    bucket = torch.argmax((got + n_act) / _cost_at(cost, L)).reshape(1)  # the first maximum: the smaller tree
    out = torch.minimum(cost.sizes.index_select(0, bucket).to(torch.int32), tree_lens.to(torch.int32))
    return torch.where(active, out, torch.ones_like(out)), bucket


def auto_tree_lens_reference(scores, tree_lens, active, kv_lens, sizes, cost_fn) -> tuple[list[int], int]:
    """Python (float64) specification of :func:`auto_tree_lens`: every size ``sizes[j]`` tried, the batch's
    expected tokens (each active request's first ``sizes[j] - 1`` node probabilities, plus one) over
    ``cost_fn(j, L)``; the first best size."""
    B, T = scores.shape
    act = [bool(a) for a in active]
    n_act = sum(act)
    L = sum(float(kv_lens[b]) for b in range(B) if act[b]) / max(n_act, 1)
    best, best_j = -1.0, 0
    for j, size in enumerate(sizes):
        g = sum(math.exp(float(scores[b, i])) for b in range(B) if act[b] for i in range(1, size))
        r = (g + n_act) / cost_fn(j, L)
        if r > best:
            best, best_j = r, j
    return [min(sizes[best_j], int(tree_lens[b])) if act[b] else 1 for b in range(B)], best_j
