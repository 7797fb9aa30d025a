"""Where the captured decode step's time goes, by kernel family, per MoE layer and against each family's floor.

    python -m bench.step_profile [--ctx 46000] [--budgets 8 16 64] [--batch 1] [--layers 2] [--replays 20]
        [--experts int4|bf16] [--json OUT]

For each budget, the real-shape one-rank slice of ``python -m tritree bench decode``
(:func:`tritree.bench_decode.build`: rank 0 of TP8, 8 of 64 heads, 48 of 384 experts under top-8 routing over all
384, the rank's shared-expert, vocabulary and draft shards, collectives left out; random weights, caches filled
to ``--ctx``) is built with ``--layers`` and with all 61 target layers (same seed and shapes otherwise; in the
61-layer slice each layer past the first ``--layers + 1`` reads the routed experts of one of the slice's MoE
layers, :func:`tritree.bench_decode.share_routed_experts`: one GPU holds a rank's 61 layers but not their 71 GB of
experts, and no expert's bytes are still in the L2 when a later layer reads them again). Each slice's decode step (the state reset, then
:func:`tritree.step.decode_step_`, greedy sampling) is captured in one CUDA graph as ``bench decode``
captures it (warm-up call, a call on a side stream, capture; the reset's copies are graph nodes too),
timed as ``bench decode`` times it (median of ``--replays`` CUDA-event-timed replays after 2 warm-up
replays) and then replayed ``--replays`` times under ``torch.profiler`` (CUDA activity), one replay at a
time. From the device events of every replay (kernels, memcpy, memset; one replay = the events of one
``cudaGraphLaunch``, by correlation id, else the replays are split at the largest gaps):

- every event's family from its name (:data:`FAMILIES`, an ordered list of ``(family, regex)``, the first
  match wins; a split-KV merge (``_combine_kernel``) takes the family of the attention kernel before it;
  names nothing matches are ``other`` and are printed, so that the table can be fixed from a run);
- per replay: events and summed event time per family and per kernel name; the idle time between graph nodes
  (the span minus the union of the event intervals: for events one after another, the sum of
  ``max(0, start_next - end_prev)``, with overlapping (PDL) events counted once); the span (first start to
  last end);
- one MoE layer: the 61-layer profile minus the ``layers`` profile over the ``61 - layers`` MoE layers between
  them, per family and per kernel name (replay means; the names printed under each budget's table,
  :func:`kernel_table`): the mean layer of the step, so the routing of any one layer (and the draft's taps, which
  differ between slices) weighs a sixtieth;
- each family's bytes floor per layer, over the copy bandwidth measured in this process
  (:func:`tritree.roofline.copy_gbps_now`; the compute-bound floors over :func:`tritree.roofline.device_ceilings`'
  matmul rate, the recorded H200 one or measured now on other GPUs):
  experts, the mean unique local experts the tokens route to in those layers (counted in one eager step of
  the same inputs, ids read from the router's output) times the bytes of one expert (INT4: 1.6875 I H,
  ``bench.moe_sweep.expert_bytes``), plus the shared expert where the experts are INT4 (the MoE block's
  expert kernels run it); router, the router weight and bias; projections, the attention projections (and
  the shared expert of dense-expert layers, the dense MLP of a dense layer); norms, the norm weights and their
  rows read and written; verify attention, :func:`tritree.roofline.verify_mla_counts` (the KV once, q and
  the output; with its FLOP floor, the larger counts); KV writes, the tree's latents read and written.
  Other families have no floor;
- the 61-layer step, by the event-timed graph and by the profiled span (tracing may lengthen a replay: the
  two side by side), and its events by family beside the small slice's, against the step's own bytes floor
  (the target's non-expert weights of 61 layers, the routed experts its tokens touch (the mean unique count
  of its MoE layers), lm_head twice (verify and draft), the draft's weights, the target and draft KV reads,
  the embedding rows). It is measured, not extrapolated from two small slices: a graph's fixed costs change
  with its nodes (the step's device-to-device copies ran on the copy engine in one graph and as kernels in
  another), so the difference of a 2- and a 3-layer graph is not one layer's time (bench/RESULTS.md).

Assumptions: Kimi K2.6's ``first_k_dense_replace`` is 1 (``tritree.model.config.kimi_k26``; layer 0 dense,
layers 1-60 MoE), so with ``--layers`` >= 1 the layers past the small slice are MoE layers and the 61-layer step has
1 dense and 60 MoE layers. The slice routes each of the B (budget + 1) tree tokens to 1 of 48 local experts
(top-1, the average share of a TP8 rank); the expected unique experts of N tokens, ``E (1 - (1 - k / E)^N)``,
is printed beside the count. Dense GEMMs cannot be told apart by name (cuBLAS picks ``nvjet`` /
``sm90_xmma`` / ``cutlass`` kernels by shape): attention projections, the shared expert, the W_UK / W_UV
absorption and the logits are one family, ``projections (dense GEMMs)``; float32 GEMMs (the router's) are
``router``. The draft phase's norms and GEMMs fall into the same families as the target's: only the
per-layer difference isolates the target layer. Everything above the GPU section (classification,
per-replay aggregation of ``(name, start_us, end_us)`` events, differencing, bytes, floors, the table) is
pure Python, tested on the CPU by ``tests/bench/test_step_profile.py``; the GPU part (build, capture,
profile) is :func:`profile_budget` and what it calls.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time

from tritree.roofline import Ceilings, verify_mla_counts

TOTAL_LAYERS = 61  # Kimi K2.6's num_hidden_layers
DENSE_LAYERS = 1  # its first_k_dense_replace

MERGE = "split merge"  # placeholder family: takes the family of the attention kernel before it
OTHER = "other"

# Ordered: the first pattern that matches a name (re.search) gives its family. The repository's own kernels
# first (their names are exact), then library kernels, generic names last.
FAMILIES: list[tuple[str, str]] = [
    ("tree/accept", r"\b_(topk_bound|topk_select|ddtree|gumbel_pick|walk|greedy_accept)_kernel\b"),
    ("KV writes/commit", r"\b_(kv_write|kv_commit|kv_gather|page_copy)_kernel\b"),
    ("verify attention", r"\b_verify_\w*kernel\b"),
    ("draft attention", r"\b_draft_attention\w*kernel\b"),
    (MERGE, r"\b_combine_kernel\b"),
    ("experts (routed + shared)", r"\b_(gate_up|down)(_int4|_mma)?_kernel\b|\b_(align|silu_mul)_kernel\b|fused_moe"),
    # today torch: a float32 GEMM (cuBLAS sgemm / f32 kernels) then topk (and sort, for the bf16 path's
    # argsort/searchsorted); a Triton router kernel is named _route...
    ("router", r"\b_route\w*|gatherTopK|[Tt]op[Kk]|[Ss]ort|sgemm|gemm_f32f32|_f32f32_f32f32|nvjet_sss"
               r"|(gemm|gemv)\w*<(int, int, )?float\b|splitKreduce_kernel<\d+, \d+, int, float, float, float, float\b"),
    ("norms", r"layer_?norm|LayerNorm|rms_?norm|RMSNorm|RowwiseMoments|\b_(block_norm|head_rope)_kernel\b"),
    ("projections (dense GEMMs)", r"nvjet|gemm|gemv|cutlass|xmma|splitKreduce|cublas|\bdot_kernel|\b_(linear|mla)_kernel\b"),
    ("elementwise", r"CatArray|\btriton_(poi|red|per)_|\b_embed_kernel\b"),  # Inductor's names may say "_to_copy"
    ("copies", r"(?i)memcpy|memset|copy|roll_cuda_kernel"),
    ("elementwise", r"elementwise|reduce_kernel|index|[Gg]ather|[Ss]catter|[Ss]oft[Mm]ax|cumsum|[Ss]can|[Ff]ill"
                    r"|arange|where"),
]
ATTENTION = ("verify attention", "draft attention")
_COMPILED = [(f, re.compile(p)) for f, p in FAMILIES]


# The table's order; a family added to FAMILIES and not here comes after these.
TABLE_ORDER = ("experts (routed + shared)", "router", "projections (dense GEMMs)", "norms", "verify attention", "draft attention",
               "tree/accept", "KV writes/commit", "elementwise", "copies")


def family_order() -> list[str]:
    """The families in table order (:data:`TABLE_ORDER`, then the rest of :data:`FAMILIES`), ``other`` last."""
    out = list(TABLE_ORDER)
    for f, _ in FAMILIES:
        if f != MERGE and f not in out:
            out.append(f)
    return out + [OTHER]


def classify(name: str) -> str:
    """The family of one event name (:data:`MERGE` for a split-KV merge, :data:`OTHER` for no match)."""
    for fam, rx in _COMPILED:
        if rx.search(name):
            return fam
    return OTHER


def _sorted(events):
    return sorted(events, key=lambda e: (e[1], e[2]))


def families_of(events) -> list[str]:
    """Families of ``events`` (``(name, start_us, end_us)``, in start order): a merge takes the family of
    the last attention event before it (verify attention when none)."""
    out, last_attn = [], ATTENTION[0]
    for name, _, _ in events:
        fam = classify(name)
        if fam in ATTENTION:
            last_attn = fam
        elif fam == MERGE:
            fam = last_attn
        out.append(fam)
    return out


def idle_and_span(events) -> tuple[float, float]:
    """``(idle_us, span_us)`` of one replay's events (any order): the span from the first start to the
    last end, and the idle time within it, where no event runs (overlapping events counted once)."""
    if not events:
        return 0.0, 0.0
    ev = _sorted(events)
    idle, end = 0.0, ev[0][2]
    for _, s, e in ev[1:]:
        idle += max(0.0, s - end)
        end = max(end, e)
    return idle, end - ev[0][1]


def summarize_replay(events) -> dict:
    """One replay's events ``(name, start_us, end_us)``: per family and per name ``{"count", "us"}`` (summed
    durations; ``names`` maps a name to its family too; a split-KV merge's name carries the family it takes,
    ``"_combine_kernel (verify attention)"``), ``kernels`` / ``kernel_us`` over all, ``idle_us`` and
    ``span_us`` (:func:`idle_and_span`), and the names classified ``other``."""
    ev = _sorted(events)
    fams: dict[str, dict] = {}
    names: dict[str, dict] = {}
    other: dict[str, int] = {}
    for (name, s, e), fam in zip(ev, families_of(ev)):
        key = f"{name} ({fam})" if classify(name) == MERGE else name  # a merge is listed under each family it serves
        for d in (fams.setdefault(fam, {"count": 0, "us": 0.0}),
                  names.setdefault(key, {"count": 0, "us": 0.0, "family": fam})):
            d["count"] += 1
            d["us"] += e - s
        if fam == OTHER:
            other[name] = other.get(name, 0) + 1
    idle, span = idle_and_span(ev)
    return dict(families=fams, names=names, kernels=len(ev), kernel_us=sum(e - s for _, s, e in ev), idle_us=idle,
                span_us=span, other=other)


def average(summaries: list[dict]) -> dict:
    """The mean of :func:`summarize_replay` results (a family absent from a replay counts 0 there), with
    ``replays`` and the per-replay ``spans_us`` / ``idles_us`` / ``kernel_counts``."""
    n = len(summaries)
    fams = sorted({f for s in summaries for f in s["families"]}, key=family_order().index)
    mean = {f: {k: sum(s["families"].get(f, {}).get(k, 0) for s in summaries) / n for k in ("count", "us")}
            for f in fams}
    family = {k: v["family"] for s in summaries for k, v in s["names"].items()}
    names = {k: {"count": sum(s["names"].get(k, {}).get("count", 0) for s in summaries) / n,
                 "us": sum(s["names"].get(k, {}).get("us", 0.0) for s in summaries) / n, "family": f}
             for k, f in family.items()}
    other: dict[str, int] = {}
    for s in summaries:
        for k, v in s["other"].items():
            other[k] = max(other.get(k, 0), v)
    return dict(replays=n, families=mean, names=names, kernels=sum(s["kernels"] for s in summaries) / n,
                kernel_us=sum(s["kernel_us"] for s in summaries) / n, idle_us=sum(s["idle_us"] for s in summaries) / n,
                span_us=sum(s["span_us"] for s in summaries) / n, spans_us=[s["span_us"] for s in summaries],
                idles_us=[s["idle_us"] for s in summaries], kernel_counts=[s["kernels"] for s in summaries],
                other=other)


def split_replays(events, n: int) -> list[list]:
    """``events`` (any order) cut into ``n`` replays at the ``n - 1`` largest idle gaps (replays run one at a
    time, with a host synchronisation between them)."""
    ev = _sorted(events)
    if n < 1 or len(ev) < n:
        raise ValueError(f"cannot split {len(ev)} events into {n} replays")
    gaps, end = [], ev[0][2]
    for i in range(1, len(ev)):
        gaps.append((ev[i][1] - end, i))
        end = max(end, ev[i][2])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[:n - 1])
    bounds = [0] + cuts + [len(ev)]
    return [ev[a:b] for a, b in zip(bounds, bounds[1:])]


def group_by_launch(events, launch_ids, n: int) -> list[list] | None:
    """``events`` ``(name, start_us, end_us, correlation_id)`` grouped into replays by the correlation ids of
    the graph launches (``launch_ids``), in time order, as ``(name, start_us, end_us)``; None unless exactly
    ``n`` launches have events (then :func:`split_replays` is the fallback)."""
    ids = set(launch_ids)
    groups: dict = {}
    for name, s, e, c in events:
        if c in ids:
            groups.setdefault(c, []).append((name, s, e))
    if len(groups) != n:
        return None
    return sorted((_sorted(g) for g in groups.values()), key=lambda g: g[0][1])


def layer_difference(a: dict, b: dict, layers: int = 1) -> dict:
    """One layer's mean: ``b`` minus ``a``, both :func:`average` results of slices ``layers`` layers apart, over
    ``layers``."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    fams = [f for f in family_order() if f in a["families"] or f in b["families"]]
    zero = {"count": 0.0, "us": 0.0}
    names = {k: {"count": (b["names"].get(k, zero)["count"] - a["names"].get(k, zero)["count"]) / layers,
                 "us": (b["names"].get(k, zero)["us"] - a["names"].get(k, zero)["us"]) / layers,
                 "family": (b["names"].get(k) or a["names"][k])["family"]}
             for k in {**a["names"], **b["names"]}}
    return dict(families={f: {k: (b["families"].get(f, zero)[k] - a["families"].get(f, zero)[k]) / layers
                              for k in ("count", "us")} for f in fams}, names=names,
                **{k: (b[k] - a[k]) / layers for k in ("kernels", "kernel_us", "idle_us", "span_us")})


def kernel_table(diff: dict, min_us: float = 0.5, width: int = 72) -> str:
    """One layer's kernels by name (``diff``: :func:`layer_difference`): count and us a layer, and the family, the
    names whose count changes or whose time changes by ``min_us`` or more, the largest first (names cut to
    ``width``)."""
    rows = sorted(((v["us"], v["count"], v["family"], k) for k, v in diff["names"].items()
                   if v["count"] != 0 or abs(v["us"]) >= min_us), key=lambda r: -r[0])
    lines = [f"{'n/layer':>7} {'us/layer':>9}  {'family':<26} kernel"]
    lines += [f"{n:>7.1f} {us:>9.1f}  {fam:<26} {name[:width]}" for us, n, fam, name in rows]
    return "\n".join(lines)


# ---- bytes --------------------------------------------------------------------------------------------

def param_nbytes(shapes: dict) -> dict:
    """Bytes of every parameter of ``shapes`` as :func:`tritree.bench_decode.build` holds them: INT4 words
    int32, their scales bf16, the router's correction bias float32, the rest (the router weight too) bf16."""
    def size(k):
        if k.endswith("_packed") or k.endswith("e_score_correction_bias"):
            return 4
        return 2
    return {k: math.prod(s) * size(k) for k, s in shapes.items()}


def expected_unique(E: int, k: int, N: int) -> float:
    """Expected distinct experts of ``N`` tokens each routed to ``k`` of ``E`` experts, uniformly."""
    return E * (1 - (1 - k / E) ** N)


def layer_bytes(nbytes: dict, layer: int, rows: int, unique_experts: float, n_experts: int,
                shared_with_experts: bool = True) -> dict:
    """Bytes by family of target layer ``layer`` (``nbytes``: :func:`param_nbytes` or the built tensors'
    bytes by name): routed experts, ``unique_experts`` of the layer's ``n_experts`` stacked ones; router,
    its weight and bias; projections, the attention projections and the shared expert (or the dense MLP);
    norms, each norm weight and its ``rows`` rows read and written (bf16, the weight's width). The shared expert of
    an INT4 layer counts with the experts when ``shared_with_experts`` (the MoE block runs it in the expert
    kernels' grids), else with the projections (cuBLAS: ``moe.block.MoeBlockPlan.shared_splits``)."""
    p = f"model.layers.{layer}."
    int4 = any(k.startswith(p + "mlp.experts.w13_") for k in nbytes)
    out = {"experts (routed + shared)": 0.0, "router": 0.0, "projections (dense GEMMs)": 0.0, "norms": 0.0}
    experts = 0
    for k, v in nbytes.items():
        if not k.startswith(p):
            continue
        k = k[len(p):]
        if k.startswith("mlp.experts."):
            experts += v
        elif k.startswith("mlp.gate."):
            out["router"] += v
        elif "layernorm" in k:
            out["norms"] += v * (1 + 2 * rows)
        elif k.startswith("mlp.shared_experts.") and int4 and shared_with_experts:  # in the block's expert kernels
            out["experts (routed + shared)"] += v
        else:
            out["projections (dense GEMMs)"] += v
    if experts:
        out["experts (routed + shared)"] += unique_experts * experts / n_experts
    return out


def attention_bytes(B: int, T: int, heads: int, ctx: int, latent: int = 576, elem: int = 2) -> dict:
    """``{family: (bytes, flops)}`` of one layer's verify attention (:func:`verify_mla_counts`) and tree
    KV write (``B T`` latents read and written)."""
    nbytes, flops = verify_mla_counts(B, T, heads, ctx, elem)
    return {"verify attention": (nbytes, flops), "KV writes/commit": (2 * B * T * latent * elem, 0)}


def step_bytes(nbytes: dict, draft_nbytes: dict, dense: dict, moe: dict, hidden: int, target_rows: int,
               draft_rows: int, draft_kv: int, total: int = TOTAL_LAYERS, n_dense: int = DENSE_LAYERS) -> dict:
    """The bytes one step must move, by part: ``n_dense`` layers of ``dense`` and ``total - n_dense`` of
    ``moe`` (``{family: bytes}``, attention included), lm_head twice (the verify logits and the draft's),
    the final norm, the embedding rows of the tree and of the draft block (bf16), every draft weight, and
    ``draft_kv`` bytes of draft context read."""
    head = nbytes.get("lm_head.weight", 0)
    parts = dict(dense_layers=n_dense * sum(dense.values()), moe_layers=(total - n_dense) * sum(moe.values()),
                 lm_head=2 * head, final_norm=nbytes.get("model.norm.weight", 0),
                 embedding_rows=(target_rows + draft_rows) * hidden * 2, draft_weights=sum(draft_nbytes.values()),
                 draft_kv=draft_kv)
    parts["total"] = sum(parts.values())
    return parts


def floor_rows(diff: dict, base: dict, costs: dict, ceil: Ceilings, full: dict | None = None) -> list[dict]:
    """The table's rows, one a family (:func:`family_order`): per layer (``diff``, :func:`layer_difference`)
    ``n`` and ``us``, the floor of ``costs[family]`` (bytes, or ``(bytes, flops)``) on ``ceil`` with its
    bound and ``ratio`` = us / floor (None without a cost), the ``layers`` step's ``n`` and ``us``
    (``base``, :func:`average`) and the 61-layer step's (``full``, :func:`average`; None without it)."""
    rows = []
    for f in family_order():
        d, s = diff["families"].get(f), base["families"].get(f)
        w = full["families"].get(f) if full is not None else None
        if d is None and s is None and w is None:
            continue
        d = d or {"count": 0.0, "us": 0.0}
        s = s or {"count": 0.0, "us": 0.0}
        floor = bound = ratio = None
        if f in costs:
            c = costs[f]
            nb, fl = c if isinstance(c, tuple) else (c, 0)
            floor, bound = ceil.floor_us(nb, fl)
            ratio = d["us"] / floor if floor > 0 else None
        w = w or ({"count": 0.0, "us": 0.0} if full is not None else {"count": None, "us": None})
        rows.append(dict(family=f, n_layer=d["count"], us_layer=d["us"], floor_us=floor, bound=bound, ratio=ratio,
                         n_step=s["count"], us_step=s["us"], n_full=w["count"], us_full=w["us"]))
    return rows


def analyse(a: dict, full: dict, layers: int, costs: dict, ceil: Ceilings, step: dict, graph_ms: float,
            total: int = TOTAL_LAYERS) -> dict:
    """A budget's numbers from the two profiles (:func:`average` of the ``layers`` slice, ``a``, and of the
    ``total``-layer one, ``full``): one MoE layer, the mean of the ``total - layers`` layers between them
    (:func:`layer_difference`), its family rows (:func:`floor_rows`, with both steps' families) and floor (all
    ``costs``), and the ``total``-layer step (``graph_ms``, its profiled span) against ``step``
    (:func:`step_bytes`)."""
    diff = layer_difference(a, full, total - layers)
    rows = floor_rows(diff, a, costs, ceil, full)
    layer_floor = sum(ceil.floor_us(*(c if isinstance(c, tuple) else (c, 0)))[0] for c in costs.values())
    floor_ms = step["total"] / (ceil.copy_gbps * 1e9) * 1e3
    return dict(per_layer=diff, rows=rows, layer_floor_us=layer_floor,
                step61=dict(graph_ms=graph_ms, span_ms=full["span_us"] / 1e3, bytes=step["total"], parts=step,
                            floor_ms=floor_ms, ratio=graph_ms / floor_ms if floor_ms > 0 else None))


def _num(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def budget_table(title: str, layers: int, res: dict, a: dict, copy_gbps: float, full: dict) -> str:
    """The fixed-width table of one budget: a row a family, then all events, idle, span, and the 61-layer
    line (``res``: :func:`analyse`; ``a``: the ``layers`` profile; ``full``: the 61-layer one, its columns
    last)."""
    L = layers
    head = (f"{'family':<26} {'n/layer':>7} {'us/layer':>9} {'floor us':>9} {'x floor':>8} "
            f"{f'n/step L={L}':>11} {f'us/step L={L}':>13} {f'n/step {TOTAL_LAYERS}':>10} "
            f"{f'us/step {TOTAL_LAYERS}':>11}")
    lines = [title, head, "-" * len(head)]
    for r in res["rows"]:
        fl = _num(r["floor_us"]) + ("c" if r["bound"] == "compute" else "")
        lines.append(f"{r['family']:<26} {r['n_layer']:>7.1f} {r['us_layer']:>9.1f} {fl:>9} "
                     f"{_num(r['ratio'], '{:.2f}x'):>8} {r['n_step']:>11.1f} {r['us_step']:>13.1f} "
                     f"{_num(r['n_full']):>10} {_num(r['us_full']):>11}")
    d = res["per_layer"]
    lines.append(f"{'all events':<26} {d['kernels']:>7.1f} {d['kernel_us']:>9.1f} {'':>9} {'':>8} "
                 f"{a['kernels']:>11.1f} {a['kernel_us']:>13.1f} {full['kernels']:>10.1f} {full['kernel_us']:>11.1f}")
    lines.append(f"{'idle between events':<26} {'':>7} {d['idle_us']:>9.1f} {'':>9} {'':>8} {'':>11} "
                 f"{a['idle_us']:>13.1f} {'':>10} {full['idle_us']:>11.1f}")
    lr = d["span_us"] / res["layer_floor_us"] if res["layer_floor_us"] > 0 else None
    lines.append(f"{'span':<26} {'':>7} {d['span_us']:>9.1f} {res['layer_floor_us']:>9.1f} {_num(lr, '{:.2f}x'):>8} "
                 f"{'':>11} {a['span_us']:>13.1f} {'':>10} {full['span_us']:>11.1f}")
    s = res["step61"]
    lines.append(f"61-layer step: graph {s['graph_ms']:.2f} ms (CUDA events, as bench decode), profiled span "
                 f"{s['span_ms']:.2f} ms; bytes floor {s['floor_ms']:.2f} ms ({s['bytes'] / 1e9:.2f} GB at "
                 f"{copy_gbps:.0f} GB/s): {_num(s['ratio'], '{:.2f}x')}")
    return "\n".join(lines)


# ---- GPU ----------------------------------------------------------------------------------------------

def _slice_step(layers: int, ctx: int, budget: int, batch: int, experts: str, own_layers: int | None = None):
    """The slice and its step as ``tritree.bench_decode.run`` builds them: the state's mutable entries
    reset, then one greedy decode step."""
    from tritree.bench_decode import build, slice_group, state_reset
    from tritree.step import SamplingConfig, decode_step_

    tcfg, dcfg, tparams, dp, state = build(layers, ctx, budget, batch, experts=experts, own_layers=own_layers)
    reset = state_reset(state)
    sampling = SamplingConfig()

    def step():
        reset()
        decode_step_(tparams, tcfg, dp, dcfg, state, budget=budget, sampling=sampling, tp=slice_group())

    return tcfg, dcfg, tparams, dp, state, step


def _capture(step):
    """``step`` warmed and captured in one CUDA graph as ``tritree.roofline.graph_time_us`` does."""
    import torch

    step()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g


def _graph_ms(g, reps: int, warmup: int = 2) -> float:
    """Median CUDA-event time of one replay (as ``graph_time_us``: ``warmup`` replays first)."""
    import torch

    for _ in range(warmup):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


_SYNC = re.compile(r"\bSync\b|Wait Event")


def _profiled_replays(g, n: int) -> tuple[list[list], int]:
    """``n`` replays of ``g`` under torch.profiler, one at a time: the events of each, and the device
    events outside every replay (e.g. a replay prologue's fill)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
            torch.cuda.synchronize()
            time.sleep(0.0005)  # a gap between replays larger than any inside one (for the fallback split)
    cuda = torch.autograd.DeviceType.CUDA
    dev, launches = [], set()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None:
        for e in results.events():
            if e.device_type() == cuda:
                if _SYNC.search(e.name()):  # a synchronisation record, not a graph node
                    continue
                s = e.start_ns() / 1e3
                dev.append((e.name(), s, s + e.duration_ns() / 1e3, e.correlation_id()))
            elif "GraphLaunch" in e.name():
                launches.add(e.correlation_id())
    else:  # FunctionEvents: no correlation ids
        dev = [(e.name, e.time_range.start, e.time_range.end, 0) for e in prof.events()
               if e.device_type == cuda and not _SYNC.search(e.name)]
    replays = group_by_launch(dev, launches, n)
    if replays is None:
        return split_replays([d[:3] for d in dev], n), 0
    return replays, len(dev) - sum(len(r) for r in replays)


def _unique_experts(step, n_local: int) -> list[int]:
    """Distinct local experts each MoE layer's tokens route to in one eager ``step`` (the ids the router's
    launches return, in the MoE block or before the routed-expert op; padding rows' -1 left out)."""
    from unittest import mock

    import torch

    import tritree.kernels.moe.router as R

    counts = []
    launch = R._launch

    def counting(*args, **kw):
        idx, w = launch(*args, **kw)
        ids = idx[(idx >= 0) & (idx < n_local)]
        counts.append(int(torch.unique(ids).numel()))
        return idx, w

    with mock.patch.object(R, "_launch", counting):
        step()
    torch.cuda.synchronize()
    return counts


def profile_slice(layers: int, ctx: int, budget: int, batch: int, experts: str, replays: int,
                  own_layers: int | None = None) -> dict:
    """One slice (``tritree.bench_decode.build``, ``own_layers`` passed on): its graph time, :func:`average` of
    its profiled replays, the unique experts per MoE layer, and what the floors need (parameter bytes by name,
    shapes)."""
    import gc

    import torch

    tcfg, dcfg, tparams, dp, state, step = _slice_step(layers, ctx, budget, batch, experts, own_layers)
    g = _capture(step)
    graph_ms = _graph_ms(g, replays)
    per, outside = _profiled_replays(g, replays)
    prof = average([summarize_replay(r) for r in per])
    E_local, I_shared = _local_moe_sizes(tparams)
    unique = _unique_experts(step, E_local)
    # top-k over all experts: a rank's E_local of E see top_k E_local / E picks a token on average
    top_k_local = tcfg.num_experts_per_tok * E_local / tcfg.n_routed_experts
    out = dict(layers=layers, graph_ms=graph_ms, profile=prof, events_outside_replays=outside,
               unique_experts=unique, nbytes={k: t.numel() * t.element_size() for k, t in tparams.items()},
               draft_nbytes={k: t.numel() * t.element_size() for k, t in dp.items()},
               heads=tcfg.heads, hidden=tcfg.hidden_size, n_experts=E_local, top_k=top_k_local, block=dcfg.block_size,
               draft_kv_token=2 * dcfg.num_key_value_heads * dcfg.head_dim * state["dkv"].element_size(),
               draft_layers=dcfg.num_hidden_layers,
               shared_with_experts=lambda rows: _shared_with_experts(tcfg, E_local, I_shared, rows))
    del g, tparams, dp, state, step
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _local_moe_sizes(tparams: dict) -> tuple[int, int]:
    """``(experts, shared intermediate)`` the slice's MoE layers hold on this rank, from the tensors."""
    for k, t in tparams.items():
        if k.endswith("mlp.shared_experts.down_proj.weight"):
            p = k[:-len("shared_experts.down_proj.weight")] + "experts."
            stacked = next(v for n, v in tparams.items() if n.startswith(p) and ("w13_" in n or "gate_proj" in n))
            return stacked.shape[0], t.shape[1]
    return 0, 0


def _shared_with_experts(tcfg, E_local: int, I_shared: int, rows: int) -> bool:
    """Whether the MoE block's plan runs the shared expert in the expert kernels' grids at ``rows`` tokens."""
    import torch

    from tritree.kernels.configs import arch_of, num_sms
    from tritree.kernels.moe.block import plan_moe_block

    dev = torch.device("cuda")
    plan = plan_moe_block(rows, tcfg.hidden_size, tcfg.n_routed_experts, E_local, tcfg.moe_intermediate_size,
                          I_shared, torch.bfloat16, torch.bfloat16, tcfg.num_experts_per_tok, tcfg.n_group,
                          tcfg.topk_group, arch_of(dev), num_sms(dev))
    return plan.shared_splits != (0, 0)


def profile_budget(args, budget: int, ceil: Ceilings) -> dict:
    """Both slices of one budget (``--layers`` and all 61 layers), profiled and analysed (:func:`analyse`)."""
    L, T, B = args.layers, budget + 1, args.batch
    pa = profile_slice(L, args.ctx, budget, B, args.experts, args.replays)
    pf = profile_slice(TOTAL_LAYERS, args.ctx, budget, B, args.experts, args.replays, own_layers=L + 1)
    added = pf["unique_experts"][L - DENSE_LAYERS:]  # the MoE layers past the small slice's
    uniq = statistics.mean(added) if added else 0.0
    uniq_step = statistics.mean(pf["unique_experts"]) if pf["unique_experts"] else 0.0
    rows = B * T
    attn = attention_bytes(B, T, pf["heads"], args.ctx)
    moe = layer_bytes(pf["nbytes"], L, rows, uniq, pf["n_experts"], pf["shared_with_experts"](rows))
    dense = layer_bytes(pf["nbytes"], 0, rows, 0, pf["n_experts"])
    costs = {**moe, **attn}
    attn_bytes = {k: nb for k, (nb, _) in attn.items()}
    # the step's experts: those its tokens touch, the mean over its MoE layers
    moe_step = layer_bytes(pf["nbytes"], L, rows, uniq_step, pf["n_experts"], pf["shared_with_experts"](rows))
    step = step_bytes(pf["nbytes"], pf["draft_nbytes"], {**dense, **attn_bytes}, {**moe_step, **attn_bytes},
                      pf["hidden"], rows, B * pf["block"], B * args.ctx * pf["draft_kv_token"] * pf["draft_layers"])
    res = analyse(pa["profile"], pf["profile"], L, costs, ceil, step, pf["graph_ms"])
    res.update(budget=budget, T=T, batch=B, ctx=args.ctx, experts=args.experts, layers=[L, TOTAL_LAYERS],
               unique_experts_per_moe_layer=pf["unique_experts"], unique_experts_layer_mean=uniq,
               unique_experts_step_mean=uniq_step,
               unique_experts_expected=expected_unique(pf["n_experts"], pf["top_k"], rows),
               costs={k: list(v) if isinstance(v, tuple) else v for k, v in costs.items()},
               profiles={str(p["layers"]): dict(graph_ms=p["graph_ms"], events_outside_replays=p["events_outside_replays"],
                                                **p["profile"]) for p in (pa, pf)})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=46000)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 64])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2, help="target layers of the small slice (>= 1: the layers past "
                    "it are MoE layers)")
    ap.add_argument("--replays", type=int, default=20, help="CUDA-event-timed replays, and profiled replays")
    ap.add_argument("--experts", choices=("int4", "bf16"), default="int4")
    ap.add_argument("--json", metavar="OUT", help="write every number to OUT (JSON)")
    args = ap.parse_args(argv)
    if args.layers < DENSE_LAYERS:
        ap.error(f"--layers must be >= {DENSE_LAYERS} (Kimi K2.6's dense layers), or a layer past it is dense")
    import torch

    if not torch.cuda.is_available():
        print("bench.step_profile needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from tritree.roofline import ceilings_source, copy_gbps_now, device_ceilings, versions

    # the step's floor over the copy rate of this run (the bf16 matmul rate, for compute-bound floors, as recorded)
    ceil = Ceilings(copy_gbps_now(), device_ceilings().matmul_tflops)
    src = f"copy measured in this process; bf16 matmul {ceilings_source()}"
    print(f"# {versions()}; copy {ceil.copy_gbps:.0f} GB/s, bf16 matmul {ceil.matmul_tflops:.0f} TFLOP/s ({src})",
          flush=True)
    results, tables = [], []
    for budget in args.budgets:
        t0 = time.perf_counter()
        res = profile_budget(args, budget, ceil)
        results.append(res)
        a = res["profiles"][str(args.layers)]
        other = {}
        for p in res["profiles"].values():
            other.update(p["other"])
        if other:
            print(f"budget {budget}: unclassified events (family 'other'; extend FAMILIES): "
                  + "; ".join(f"{n[:160]} x{c}" for n, c in sorted(other.items())), flush=True)
        for k, p in res["profiles"].items():
            if p["events_outside_replays"]:
                print(f"budget {budget}, {k} layers: {p['events_outside_replays']} device events outside the "
                      f"graph replays (left out)", flush=True)
        u = res["unique_experts_per_moe_layer"]
        print(f"budget {budget}: unique local experts a MoE layer of the {TOTAL_LAYERS}-layer step: mean "
              f"{res['unique_experts_layer_mean']:.1f} past the {args.layers}-layer slice, {res['unique_experts_step_mean']:.1f} "
              f"over all (expected {res['unique_experts_expected']:.1f} for uniform routing; {min(u or [0])}-"
              f"{max(u or [0])} a layer); {time.perf_counter() - t0:.0f} s", flush=True)
        title = (f"budget {budget} (T = {res['T']}), batch {args.batch}, ctx {args.ctx}, {args.experts} experts: one "
                 f"MoE layer = (the {TOTAL_LAYERS}- minus the {args.layers}-layer step) / {TOTAL_LAYERS - args.layers}, "
                 f"means of {a['replays']} profiled replays; floor 'c' = compute-bound")
        tables.append(budget_table(title, args.layers, res, a, ceil.copy_gbps, res["profiles"][str(TOTAL_LAYERS)])
                      + "\n\none MoE layer by kernel name:\n"
                      + kernel_table(res["per_layer"]))
    if args.json:
        doc = dict(command="python -m bench.step_profile " + " ".join(sys.argv[1:] if argv is None else argv),
                   gpu=torch.cuda.get_device_name(), versions=versions(), copy_gbps=ceil.copy_gbps,
                   matmul_tflops=ceil.matmul_tflops, ceilings=src, families=FAMILIES, budgets=results)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}", flush=True)
    print()
    print("\n\n".join(tables), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
