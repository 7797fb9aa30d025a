"""The draft tree sized per step (tritree.budget): expected acceptance of every best-first prefix,
the prefix property of DDTree, truncation by ``tree_lens`` (accept, verify, MoE), the batch rule
against a Python reference, the step-cost JSON, no host sync, and lossless generation with
``budget="auto"``."""

import dataclasses
import json

import pytest
import torch

from tritree.budget import (
    RECORDED_COST_FITS,
    AnalyticCost,
    CostTable,
    StepCost,
    auto_tree_lens,
    auto_tree_lens_reference,
    cost_table_json,
    fit_cost,
    load_cost_file,
    parse_cost_json,
    save_cost_table,
    tabulate,
    tree_buckets,
)
from tritree.kernels import expected_accept
from tritree.kernels.accept import accept_tree
from tritree.kernels.tree import build_tree

from .conftest import DEVICE


def _logits(B, D, V, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 4, (B, D, V), generator=g).float()
    return torch.randn(B, D, V, generator=g) * 2


@pytest.mark.parametrize("ties", [False, True])
def test_expected_accept_matches_float64(ties):
    tree = build_tree(_logits(3, 4, 11, 1, ties), 20, torch.zeros(3, dtype=torch.int32))
    got = expected_accept(tree.scores)
    s = tree.scores.double()
    want = torch.cumsum(torch.where(torch.arange(s.shape[1]) == 0, 0.0, torch.exp(s)), 1)
    assert got.dtype == torch.float32 and got.shape == tree.scores.shape
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-7)
    assert (got[:, 0] == 0).all() and (got.diff(dim=1) >= 0).all()


@pytest.mark.parametrize("ties", [False, True])
def test_a_best_first_prefix_is_the_tree_of_the_smaller_budget(ties):
    """Through the kernels (the interpreter on the CPU): the first k + 1 nodes of the budget-K tree are
    the budget-k tree, node for node, and the accept walk over the truncated tree (``tree_lens``)
    accepts what the small tree accepts."""
    B, D, V, K = 2, 4, 9, 24
    logits = _logits(B, D, V, 7, ties).to(DEVICE)
    root = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    big = build_tree(logits, K, root)
    target = _logits(B, K + 1, V, 8, ties).to(DEVICE)
    for k in (1, 3, 8, 17):
        small = build_tree(logits, k, root)
        for name in ("tokens", "parents", "depth", "scores"):
            assert torch.equal(getattr(small, name), getattr(big, name)[:, :k + 1]), (k, name)
        assert torch.equal(small.tree_lens, torch.clamp(big.tree_lens, max=k + 1))
        lens = torch.full((B,), k + 1, dtype=torch.int32, device=DEVICE)
        a = accept_tree(small.tokens, small.parents, small.tree_lens, target[:, :k + 1].contiguous())
        b = accept_tree(big.tokens, big.parents, lens, target)
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) and torch.equal(a[0], b[0][:, :k + 1])


def test_verify_ignores_padding_rows_and_their_experts(monkeypatch):
    """A truncated tree's rows give the logits of the small tree alone, and padding rows route to no
    expert (id -1 reaches the routed-experts op)."""
    from tritree.kernels import tree_mask_from_parents
    from tritree.model import kimi_k2
    from tritree.model.config import kimi_tiny

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU reference paths (fast)
    cfg = kimi_tiny()
    params = kimi_k2.init_params(cfg, seed=0)
    B, T, k1 = 2, 9, torch.tensor([4, 9], dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=g, dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 1, 0, 4]] * B, dtype=torch.int32)
    mask, depth = tree_mask_from_parents(parents)
    seen = []
    real = kimi_k2.routed_experts
    monkeypatch.setattr(kimi_k2, "routed_experts", lambda x, idx, *a: seen.append(idx.clone()) or real(x, idx, *a))

    def run(tok, msk, dep, lens):
        kv = torch.zeros(cfg.num_hidden_layers, 8, 8, cfg.latent_dim)
        pt = torch.arange(8, dtype=torch.int32).view(2, 4)
        prompt = torch.randint(0, cfg.vocab_size, (B, 5), generator=torch.Generator().manual_seed(1))
        cache = {"kv": kv, "page_table": pt, "kv_lens": torch.zeros(B, dtype=torch.int32)}
        _, _, cache = kimi_k2.prefill(params, cfg, prompt, cache)
        return kimi_k2.verify(params, cfg, tok, dep, msk, cache, lens)[0]

    full = run(tokens, mask, depth, k1)
    pad = torch.arange(T)[None] >= k1[:, None]
    assert all(bool((idx[pad.reshape(-1)] == -1).all()) and bool((idx[~pad.reshape(-1)] >= 0).all())
               for idx in seen[-2:])  # the two MoE layers of the verify
    small_mask, small_depth = tree_mask_from_parents(parents[:1, :4])
    small = run(tokens[:, :4], small_mask.expand(B, -1, -1).contiguous(), small_depth.expand(B, -1).contiguous(),
                torch.tensor([4, 4], dtype=torch.int32))
    assert torch.allclose(full[0, :4], small[0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(full[1, :4], small[1], rtol=1e-5, atol=1e-5)  # rows that only see their prefix


def _random_case(B, budget, seed):
    g = torch.Generator().manual_seed(seed)
    steps = -torch.rand(B, budget, generator=g) * 1.5
    scores = torch.cat([torch.zeros(B, 1), torch.cumsum(steps, 1)], 1)  # non-increasing, as best-first
    lens = torch.randint(1, budget + 2, (B,), generator=g, dtype=torch.int32)
    scores = torch.where(torch.arange(budget + 1)[None] < lens[:, None], scores, float("-inf"))
    active = torch.rand(B, generator=g) < 0.8
    kv_lens = torch.randint(0, 5000, (B,), generator=g, dtype=torch.int32)
    ctx = torch.tensor([0.0, 1000.0, 8000.0])
    trees = tree_buckets(budget)
    widths = torch.tensor([trees[0] - 1] + [b - a for a, b in zip(trees, trees[1:])], dtype=torch.float32)
    inc = torch.rand(3, len(trees), generator=g) * torch.rand(3, 1, generator=g) * 0.06 * B * widths
    ms = 1.0 + torch.rand(3, 1, generator=g) + torch.cumsum(inc, 1)
    return scores, lens, active, kv_lens, StepCost(trees, torch.tensor(trees), ctx, ms, 0.5)


def _cost_fn(cost):
    ctx, ms = cost.ctx.double().tolist(), cost.ms.double()

    def fn(j, L):
        i = min(max(1, sum(c < L for c in ctx)), len(ctx) - 1)
        w = (L - ctx[i - 1]) / (ctx[i] - ctx[i - 1])
        return max(float(ms[i - 1, j] + w * (ms[i, j] - ms[i - 1, j])), cost.floor)
    return fn


def test_tree_buckets():
    assert tree_buckets(64) == (5, 9, 17, 33, 65)
    assert tree_buckets(16) == (5, 9, 17) and tree_buckets(20) == (5, 9, 17, 21)
    assert tree_buckets(4) == (5,) and tree_buckets(1) == (2,)
    for bad in (0, -3, 2.0, True, "8"):
        with pytest.raises(ValueError, match="budget"):
            tree_buckets(bad)


@pytest.mark.parametrize("B,budget", [(1, 1), (1, 7), (3, 5), (4, 12), (2, 40)])
def test_auto_tree_lens_matches_the_python_reference(B, budget):
    picked = set()
    for seed in range(25):
        scores, lens, active, kv_lens, cost = _random_case(B, budget, seed)
        got, bucket = auto_tree_lens(scores, lens, active, kv_lens, cost)
        want, want_bucket = auto_tree_lens_reference(scores, lens, active, kv_lens, cost.trees, _cost_fn(cost))
        assert got.dtype == torch.int32 and got.tolist() == want, seed
        assert bucket.dtype == torch.int64 and bucket.shape == (1,) and int(bucket) == want_bucket, seed
        assert all(n <= cost.trees[want_bucket] for n in got.tolist())
        picked.add(want_bucket)
    assert len(picked) >= min(2, len(tree_buckets(budget)))  # the cases exercise more than one size


def test_one_request_maximises_expected_tokens_per_ms():
    """B = 1: S* = argmax_S (E(S - 1) + 1) / cost(S) over the sizes, by brute force."""
    for seed in range(20):
        scores, lens, _, kv_lens, cost = _random_case(1, 40, seed)
        active = torch.ones(1, dtype=torch.bool)
        n, bucket = auto_tree_lens(scores, lens, active, kv_lens, cost)
        E = expected_accept(scores)[0].double()
        c = [_cost_fn(cost)(j, float(kv_lens[0])) for j in range(len(cost.trees))]
        best = max(range(len(cost.trees)), key=lambda j: ((E[cost.trees[j] - 1] + 1) / c[j], -j))
        assert int(bucket) == best and int(n[0]) == min(cost.trees[best], int(lens[0])), seed


def test_auto_tree_lens_has_no_host_sync():
    """On meta tensors (no values exist, so any host read would raise) the rule runs whole."""
    scores, lens, active, kv_lens, cost = _random_case(3, 6, 0)
    meta = [x.to("meta") for x in (scores, lens, active, kv_lens)]
    out, bucket = auto_tree_lens(*meta, StepCost(cost.trees, cost.sizes.to("meta"), cost.ctx.to("meta"),
                                                 cost.ms.to("meta"), cost.floor))
    assert out.device.type == "meta" and out.shape == (3,) and out.dtype == torch.int32
    assert bucket.device.type == "meta" and bucket.shape == (1,)
    with pytest.raises(ValueError, match="tabulated for trees of up to 7 tokens"):
        auto_tree_lens(*_random_case(3, 8, 0)[:4], cost)


def _doc(**table):
    t = {"batch": [1, 4], "ctx": [0, 1000], "tree": [1, 5, 9], "static_tree": 9,
         "step_ms": [[[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]], [[2.0, 3.0, 4.0], [2.5, 3.5, 4.5]]], **table}
    return {"version": 2, "gpus": {"GPU X": t}}


@pytest.mark.parametrize("doc,field", [
    ({"version": 3, "gpus": {}}, "version"),
    ({"version": 1, "gpus": {}}, "bench calibrate again"),
    ({"version": 2}, "gpus"),
    (_doc(batch=[4, 1]), "batch"),
    (_doc(ctx="0"), "ctx"),
    (_doc(tree=[0, 5, 9]), "tree"),
    (_doc(tree=[1, 5.5, 9]), "tree[1]"),
    (_doc(static_tree=5), "static_tree"),
    (_doc(step_ms=[[[1.0, 2.0, 3.0]]]), "step_ms"),
    (_doc(step_ms=[[[1.0, 2.0], [1.5, 2.5, 3.5]], [[2.0, 3.0, 4.0], [2.5, 3.5, 4.5]]]), "step_ms[0][0]"),
    (_doc(step_ms=[[[1.0, 2.0, -3.0], [1.5, 2.5, 3.5]], [[2.0, 3.0, 4.0], [2.5, 3.5, 4.5]]]), "step_ms[0][0][2]"),
    (_doc(step_ms=[[[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]], [[2.0, 3.0, 4.0], [2.5, float("nan"), 4.5]]]), "step_ms[1][1][1]"),
    (_doc(source=3), "source"),
    (_doc(captured_ms=[[[1.0, 2.0, 3.0]]]), "captured_ms"),
    (_doc(captured_ms=[[[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]], [[2.0, 3.0, 0.0], [2.5, 3.5, 4.5]]]), "captured_ms[1][0][2]"),
])
def test_cost_json_validation_names_the_field(doc, field):
    if "gpus" in doc and isinstance(doc["gpus"], dict) and "GPU X" in doc["gpus"] and field != "source":
        doc["gpus"]["GPU X"].pop("source", None)
    with pytest.raises(ValueError, match=__import__("re").escape(field)):
        parse_cost_json(doc)


def test_cost_file_round_trip_and_interpolation(tmp_path):
    path = tmp_path / "cost.json"
    (table,) = parse_cost_json(_doc()).values()
    save_cost_table(path, table)
    save_cost_table(path, CostTable("GPU Y", (1,), (0,), (1, 2), (((1.0, 2.0),),), 2))
    tables = load_cost_file(path)
    assert set(tables) == {"GPU X", "GPU Y"} and tables["GPU X"] == table
    assert table.cost_ms(1, 0, 5) == 2.0 and table.cost_ms(1, 500, 3) == pytest.approx(1.75)
    assert table.cost_ms(2.5, 1000, 9) == pytest.approx(4.0)  # halfway between batch 1 and 4
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_cost_file(path)


def test_cost_table_captured_times_and_one_context(tmp_path):
    """``captured_ms`` (each size in its own graph) round-trips and interpolates like ``step_ms``;
    ``at_ctx`` is the table at one context, whatever context is asked."""
    captured = [[[0.5, 1.5, 2.5], [1.0, 2.0, 3.0]], [[1.5, 2.5, 3.5], [2.0, 3.0, 4.0]]]
    (table,) = parse_cost_json(_doc(captured_ms=captured)).values()
    path = tmp_path / "cost.json"
    save_cost_table(path, table)
    assert load_cost_file(path)["GPU X"] == table
    assert table.captured_cost_ms(1, 0, 5) == 1.5 and table.captured_cost_ms(1, 500, 3) == pytest.approx(1.25)
    at = table.at_ctx(500)
    assert at.ctx == (500,)
    for L in (0, 500, 10**6):
        assert at.cost_ms(4, L, 9) == pytest.approx(table.cost_ms(4, 500, 9))
        assert at.captured_cost_ms(1, L, 1) == pytest.approx(table.captured_cost_ms(1, 500, 1))
    (bare,) = parse_cost_json(_doc()).values()
    assert bare.captured_ms is None and "captured_ms" not in json.loads(json.dumps(cost_table_json(bare)))
    with pytest.raises(ValueError, match="captured_ms"):
        bare.captured_cost_ms(1, 0, 1)


def test_modelled_step_times_of_bench_accept():
    """Fixed sizes are charged their own graph's time, auto steps the auto step's time at the size they
    verified at."""
    from tritree.bench_accept import modelled_ms

    table = CostTable("t", (1, 4), (0,), (1, 9), (((2.0, 3.0),), ((4.0, 6.0),)), 9, "", (((1.0, 2.0),), ((3.0, 5.0),)))
    steps = [(1, 8, 9), (4, 0, 1), (4, 32, 9)]  # (active requests, tree nodes in all, size verified at)
    assert modelled_ms(table, 0, steps, "tree", 8, 16) == pytest.approx(2.0 + 5.0 + 5.0)
    assert modelled_ms(table, 0, steps, "plain", None, 16) == pytest.approx(1.0 + 3.0 + 3.0)
    assert modelled_ms(table, 0, steps, "auto", None, 16) == pytest.approx(3.0 + 4.0 + 6.0)
    step = tabulate(table, 2, 8, 4096, "cpu")
    assert step.trees == (5, 9) and step.sizes.tolist() == [5, 9]
    assert step.ms.shape == (2, 2) and (step.ms.diff(dim=1) >= 0).all()
    json.dumps(_doc())


def test_analytic_cost_counts_the_experts_the_tokens_route_to():
    from tritree.model import dflash
    from tritree.model.config import dflash_tiny, kimi_tiny
    from tritree.model.kimi_k2 import init_params

    tcfg = kimi_tiny()
    dcfg = dflash_tiny(tcfg)
    m = AnalyticCost.from_params(init_params(tcfg), tcfg, dflash.init_params(dcfg), dcfg, 4, None)
    assert m.experts_local == m.experts == tcfg.n_routed_experts and m.expert_layers == 2
    w = [m.cost_ms(1, 100, T) for T in range(1, 12)]
    assert all(b >= a for a, b in zip(w, w[1:])) and m.cost_ms(1, 2000, 4) > m.cost_ms(1, 100, 4)
    one = 1e3 * m.expert_layers * m.expert_bytes / (m.gbps * 1e9) * m.scales[1]  # the fit's experts scale
    distinct = lambda N: m.experts * (1 - (1 - m.topk / m.experts) ** N)  # noqa: E731
    assert m.cost_ms(1, 0, 3) - m.cost_ms(1, 0, 1) == pytest.approx(one * (distinct(3) - distinct(1)), rel=0.05)
    assert (m.layer_ms, m.scales) == RECORDED_COST_FITS["NVIDIA H200"]  # an unrecorded GPU: the H200's fit


def _slice_model():
    from tritree.bench_decode import slice_cost_model

    return dataclasses.replace(slice_cost_model("int4"), layer_ms=0.0, scales=(1.0, 1.0, 1.0, 1.0))


def test_fit_cost_recovers_the_coefficients_of_a_fitted_table():
    """A table made by a model with a known time per layer and scales gives them back, with no error."""
    base = _slice_model()
    truth = dataclasses.replace(base, layer_ms=0.25, scales=(1.0, 1.8, 1.3, 12.0))
    grid = (1, 4), (4096, 46000, 131072), (5, 9, 17, 33, 65)
    ms = tuple(tuple(tuple(truth.cost_ms(B, L, T) for T in grid[2]) for L in grid[1]) for B in grid[0])
    fitted, err = fit_cost(base, CostTable("x", *grid, ms, 65))
    assert err < 1e-9 and fitted.layer_ms == pytest.approx(0.25) and fitted.scales == pytest.approx(truth.scales)


def test_the_recorded_h200_fit_follows_the_measured_step():
    """The captured steps of bench/RESULTS.md ("Tree size per step", H200): the recorded fit is what fit_cost
    finds, within 7.5% of every cell, and grows with T as the step does (the bare terms grow 2.5-3.9x)."""
    cap = (((29.61, 34.02, 46.03, 55.09), (33.15, 40.34, 49.22, 63.25)),
           ((52.95, 58.34, 72.99, 90.83), (67.34, 73.05, 100.51, 137.04)))
    table = CostTable("NVIDIA H200", (1, 4), (46000, 131072), (9, 17, 33, 65), cap, 65, "", cap)
    fitted, err = fit_cost(_slice_model(), table)
    layer_ms, scales = RECORDED_COST_FITS["NVIDIA H200"]
    assert err < 0.076 and fitted.layer_ms == pytest.approx(layer_ms, abs=1e-4)
    assert fitted.scales == pytest.approx(scales, abs=1e-4)
    for bi, B in enumerate(table.batch):
        for li, L in enumerate(table.ctx):
            growth = fitted.cost_ms(B, L, 65) / fitted.cost_ms(B, L, 9)
            assert growth == pytest.approx(cap[bi][li][3] / cap[bi][li][0], rel=0.07)


def test_a_table_is_not_extrapolated_below_its_smallest_tree():
    """Below the smallest measured tree a step costs what that tree costs; above the largest the edge segment's
    line goes on; between sizes, contexts and batches the table interpolates."""
    ms = (((10.0, 20.0),), ((30.0, 50.0),))
    t = CostTable("x", (1, 3), (1000,), (9, 17), ms, 17)
    assert t.cost_ms(1, 1000, 5) == 10.0 and t.cost_ms(1, 1000, 1) == 10.0
    assert t.cost_ms(1, 1000, 25) == pytest.approx(30.0) and t.cost_ms(1, 1000, 13) == pytest.approx(15.0)
    assert t.cost_ms(2, 1000, 5) == pytest.approx(20.0) and t.cost_ms(3, 1000, 13) == pytest.approx(40.0)


def test_the_recorded_h100_fit_follows_the_measured_step():
    """The captured steps of bench/RESULTS.md ("Tree size per step", H100): the recorded fit is what fit_cost
    finds with the H100's bandwidth, within 11.5% of every cell."""
    from tritree.bench_decode import slice_cost_model

    gpu = "NVIDIA H100 80GB HBM3"
    cap = (((12.45, 18.27, 23.30, 31.26), (16.34, 20.62, 31.12, 42.99)),
           ((25.00, 39.37, 47.32, 67.22), (36.18, 55.14, 74.86, 115.69)))
    table = CostTable(gpu, (1, 4), (46000, 131072), (9, 17, 33, 65), cap, 65, "", cap)
    model = dataclasses.replace(slice_cost_model("int4", gpu), layer_ms=0.0, scales=(1.0, 1.0, 1.0, 1.0))
    fitted, err = fit_cost(model, table)
    layer_ms, scales = RECORDED_COST_FITS[gpu]
    assert err < 0.115 and fitted.layer_ms == pytest.approx(layer_ms, abs=1e-4)
    assert fitted.scales == pytest.approx(scales, abs=1e-4)


# --------------------------------------------------------------------------------------------------
# The engine with budget="auto"
# --------------------------------------------------------------------------------------------------

PROMPTS = [[5, 17, 3, 88, 41, 9, 12], [60], [7, 7, 7, 30, 2, 19, 44, 45, 46, 1, 0, 90, 13]]


def test_auto_budget_is_lossless_and_reports_the_sizes(monkeypatch):
    """A steep measured cost makes the sizes vary; greedy output equals plain greedy decoding."""
    from .test_engine import make_engine

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    # Random weights: nodes 5-8 add ~10% to the expected tokens, so the size follows the context: 9 tokens
    # cost what 5 cost at an empty context, 20% more at 20 (the mean context grows from 7 to ~17).
    rows = ((1.0, 1.25, 1.25), (1.0, 1.25, 1.5))
    steep = CostTable("test", (1, 4), (0, 20), (1, 5, 9), (rows, rows), 9)
    eng = make_engine(cost_model=steep)
    auto = eng.generate(PROMPTS, 10, budget="auto", max_budget=8)
    stats, step_nodes = eng.tree_size_stats(), eng.step_nodes
    plain = eng.generate(PROMPTS, 10, speculative=False)
    assert [r.tokens for r in auto] == [r.tokens for r in plain]
    assert sum(stats["hist"].values()) == sum(r.steps for r in auto)
    assert sum(a for a, _, _ in step_nodes) == sum(r.steps for r in auto)  # the steps' active requests
    assert sum(n for _, n, _ in step_nodes) == sum(k * c for k, c in stats["hist"].items())
    assert {w for _, _, w in step_nodes} <= set(tree_buckets(8)) and len({w for _, _, w in step_nodes}) > 1
    assert all(n <= a * (w - 1) for a, n, w in step_nodes)  # no tree past the size its step verified at
    assert 0 <= stats["mean"] < 8 and len(stats["hist"]) > 1 and max(stats["hist"]) <= 8
    with pytest.raises(ValueError, match="budget"):
        eng.generate(PROMPTS, 2, budget="big")
    with pytest.raises(ValueError, match="max_budget"):
        eng.generate(PROMPTS, 2, budget="auto", max_budget=0)


@pytest.mark.gpu
def test_gpu_auto_budget_graph_equals_eager_and_plain():
    from .test_engine import make_engine

    steep = CostTable("test", (1, 4), (0, 512), (1, 17), (((1.0, 1.5), (1.0, 1.5)), ((1.0, 1.5), (1.0, 1.5))), 17)
    g = make_engine(device="cuda", graphs=True, cost_model=steep)
    e = make_engine(device="cuda", graphs=False, cost_model=steep)
    a = g.generate(PROMPTS, 16, budget="auto", max_budget=16)
    b = e.generate(PROMPTS, 16, budget="auto", max_budget=16)
    eager_stats = e.tree_size_stats()  # of the last generate: taken before the plain run below
    c = e.generate(PROMPTS, 16, speculative=False)
    assert [r.tokens for r in a] == [r.tokens for r in b] == [r.tokens for r in c]
    assert g.tree_size_stats() == eager_stats
    d = make_engine(device="cuda", graphs=True).generate(PROMPTS, 16, budget="auto")  # the analytic default
    assert [r.tokens for r in d] == [r.tokens for r in c]
