"""The speculative decoding engine: lossless against plain greedy decoding and against an independent
full-sequence recomputation, batches with different prompt lengths, stop tokens, bad requests, sampling
exactness (chi-square), and the captured-graph step against the eager step (GPU)."""

import math
import random

import pytest
import torch

from tritree.engine import Engine
from tritree.model import dflash
from tritree.model.config import dflash_tiny, kimi_tiny
from tritree.model.kimi_k2 import init_params, prefill

from .conftest import DEVICE


def make_engine(vocab=97, seed=0, device=DEVICE, num_pages=256, **kw):
    tcfg = kimi_tiny(vocab_size=vocab)
    dcfg = dflash_tiny(tcfg)
    tp = init_params(tcfg, seed=seed, device=device)
    dp = dflash.init_params(dcfg, seed=seed + 1, device=device)
    return Engine(tp, tcfg, dp, dcfg, page_size=8, num_pages=num_pages, **kw)


@pytest.fixture
def reference_path(monkeypatch):
    """Kernels' CPU reference paths instead of the Triton interpreter (fast; the kernels themselves are
    tested against the same references elsewhere)."""
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")


def greedy_oracle(engine, prompt, n):
    """Plain greedy continuation by recomputing the whole sequence each token (no cache, no tree)."""
    seq = list(prompt)
    for _ in range(n):
        logits, _, _ = prefill(engine.tparams, engine.tcfg, torch.tensor([seq], device=engine.device))
        seq.append(int(torch.argmax(logits[0, -1])))
    return seq[len(prompt):]


PROMPTS = [[5, 17, 3, 88, 41, 9, 12], [60], [7, 7, 7, 30, 2, 19, 44, 45, 46, 1, 0, 90, 13]]


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_greedy_speculative_equals_plain_greedy(reference_path, budget):
    eng = make_engine()
    spec = eng.generate(PROMPTS, 12, budget=budget)
    plain = eng.generate(PROMPTS, 12, budget=budget, speculative=False)
    for s, p, prompt in zip(spec, plain, PROMPTS):
        assert s.error is None and p.error is None
        assert s.tokens == p.tokens, (s.tokens, p.tokens)
        assert len(s.tokens) == 12 and s.finish == "length"
        assert s.steps <= p.steps
    assert spec[0].tokens == greedy_oracle(eng, PROMPTS[0], 12)
    if budget == 64:  # a wide tree over a 97-token vocabulary accepts several tokens per step
        assert sum(r.steps for r in spec) < sum(r.steps for r in plain)


def test_greedy_dflash_chain_equals_plain_greedy(reference_path):
    eng = make_engine()
    chain = eng.generate(PROMPTS, 12, chain=True)
    plain = eng.generate(PROMPTS, 12, speculative=False)
    assert [r.tokens for r in chain] == [r.tokens for r in plain]


def test_greedy_through_the_triton_kernels():
    """The same equality with every op in its Triton kernel (the interpreter on the CPU)."""
    eng = make_engine()
    prompts = PROMPTS[:2]
    spec = eng.generate(prompts, 6, budget=8)
    for r, prompt in zip(spec, prompts):
        assert r.tokens == greedy_oracle(eng, prompt, 6)


def test_stop_tokens_and_streaming(reference_path):
    eng = make_engine()
    full = eng.generate(PROMPTS, 10, budget=16)
    stop = full[0].tokens[4]
    streamed = {i: [] for i in range(len(PROMPTS))}
    res = eng.generate(PROMPTS, 10, budget=16, stop_tokens=[stop], stream=lambda i, t: streamed[i].extend(t))
    for r, f, i in zip(res, full, range(len(PROMPTS))):
        if stop in f.tokens:
            cut = f.tokens.index(stop) + 1
            assert r.tokens == f.tokens[:cut] and r.finish == "stop"
        else:
            assert r.tokens == f.tokens and r.finish == "length"
        assert streamed[i] == r.tokens


def test_bad_requests_do_not_take_down_the_batch(reference_path):
    eng = make_engine()
    prompts = [[1, 2, 3], [], [4, 500], list(range(90)) * 30, [9, 8]]
    res = eng.generate(prompts, 5, budget=4)
    assert res[1].error and "empty" in res[1].error
    assert res[2].error and "vocabulary" in res[2].error
    assert res[3].error and "cache" in res[3].error
    good = eng.generate([prompts[0], prompts[4]], 5, budget=4)
    assert res[0].tokens == good[0].tokens and res[4].tokens == good[1].tokens
    with pytest.raises(ValueError, match="budget"):
        eng.generate([[1, 2]], 5, budget=0)


def _chi2_critical(df, z=3.719):  # upper 1e-4 quantile, Wilson-Hilferty
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampling_matches_the_target_distribution(reference_path):
    """Temperature 1 on an 8-token vocabulary: the joint law of the first two generated tokens (the
    second comes out of a speculative step) equals plain sampling from the target."""
    V, N = 8, 1600
    eng = make_engine(vocab=V, seed=3, num_pages=2 * N + 8)
    prompt = [1, 5, 2]
    res = eng.generate([prompt] * N, 2, temperature=1.0, budget=6, seed=11)
    pairs = [tuple(r.tokens[:2]) for r in res]
    with torch.no_grad():
        logits, _, _ = prefill(eng.tparams, eng.tcfg, torch.tensor([prompt], device=eng.device))
        p1 = torch.softmax(logits[0, -1].double(), -1)
        seqs = torch.tensor([prompt + [a] for a in range(V)], device=eng.device)
        l2, _, _ = prefill(eng.tparams, eng.tcfg, seqs)
        p2 = torch.softmax(l2[:, -1].double(), -1)
    joint = (p1[:, None] * p2).cpu()
    counts = torch.zeros(V, V)
    for a, b in pairs:
        counts[a, b] += 1
    expected = joint * N
    keep = expected >= 5  # chi-square cells with enough mass; the rest pooled
    stat = (((counts - expected) ** 2 / expected)[keep]).sum()
    rest_e, rest_c = expected[~keep].sum(), counts[~keep].sum()
    df = int(keep.sum()) - 1
    if rest_e > 0:
        stat += (rest_c - rest_e) ** 2 / rest_e
        df += 1
    assert stat < _chi2_critical(df), f"chi2 {stat:.1f} with {df} dof"


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_gpu_graph_step_equals_eager_step_and_plain_greedy(budget):
    eng_graph = make_engine(device="cuda", graphs=True)
    eng_eager = make_engine(device="cuda", graphs=False)
    a = eng_graph.generate(PROMPTS, 16, budget=budget)
    b = eng_eager.generate(PROMPTS, 16, budget=budget)
    c = eng_eager.generate(PROMPTS, 16, budget=budget, speculative=False)
    for x, y, z in zip(a, b, c):
        assert x.tokens == y.tokens == z.tokens
    assert a[0].tokens == greedy_oracle(eng_eager, PROMPTS[0], 16)
    chain = eng_graph.generate(PROMPTS, 16, chain=True)
    assert [r.tokens for r in chain] == [r.tokens for r in c]
    stop = c[0].tokens[5]
    stopped = eng_graph.generate(PROMPTS, 16, budget=budget, stop_tokens=[stop])
    assert stopped[0].tokens == c[0].tokens[:c[0].tokens.index(stop) + 1] and stopped[0].finish == "stop"
    graphs = len(eng_graph._graphs)
    again = eng_graph.generate(PROMPTS, 16, budget=budget)  # replays the captured graph on fresh state
    assert [r.tokens for r in again] == [r.tokens for r in a] and len(eng_graph._graphs) == graphs


def _sync_guarded(fn, calls: list):
    """``fn`` run under ``torch.cuda.set_sync_debug_mode("error")`` (a host sync inside raises); its name is
    appended to ``calls`` after each call."""
    def guarded(*a, **k):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*a, **k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            calls.append(fn.__name__)
    return guarded


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [0, 16])
def test_gpu_eager_step_never_waits_for_the_gpu(monkeypatch, budget):
    """The eager decode step queues its work and returns: any host synchronisation inside it (a value
    read, a data-dependent shape) raises under ``set_sync_debug_mode("error")``. Only the host loop
    between steps reads results."""
    import tritree.engine as engine_mod

    calls = []
    guarded = _sync_guarded(engine_mod.decode_step_, calls)

    eng = make_engine(device="cuda", graphs=False)
    eng.generate(PROMPTS, 4, budget=max(budget, 1))  # compiles and fills the caches outside the guard
    monkeypatch.setattr(engine_mod, "decode_step_", guarded)
    out = eng.generate(PROMPTS, 8, budget=budget) if budget else eng.generate(PROMPTS, 8, speculative=False)
    assert calls and all(r.error is None and len(r.tokens) == 8 for r in out), [r.error for r in out]


@pytest.mark.gpu
def test_gpu_auto_step_reads_the_host_once(monkeypatch):
    """An auto-sized step's two parts queue their work without a host sync: the size between them is the
    step's one read."""
    import tritree.engine as engine_mod

    calls = []
    eng = make_engine(device="cuda", graphs=False)
    eng.generate(PROMPTS, 4, budget="auto", max_budget=16)  # compiles and fills the caches outside the guard
    for name in ("tree_step_", "verify_step_"):
        monkeypatch.setattr(engine_mod, name, _sync_guarded(getattr(engine_mod, name), calls))
    out = eng.generate(PROMPTS, 8, budget="auto", max_budget=16)
    assert "tree_step_" in calls and "verify_step_" in calls
    assert all(r.error is None and len(r.tokens) == 8 for r in out), [r.error for r in out]


def test_close_all_engines_frees_every_live_engines_graphs():
    """What ``dist.shutdown_tp`` runs before destroying the process group (NCCL's teardown hangs on
    live graphs that captured collectives): every engine a caller still holds loses its graphs."""
    from tritree.engine import close_all_engines

    class FakeGraph:
        resets = 0

        def reset(self):
            FakeGraph.resets += 1

    engines = [make_engine(device="cpu", graphs=False) for _ in range(2)]
    for i, eng in enumerate(engines):
        run = lambda: None  # noqa: E731
        run.graphs = lambda n=i + 1: [FakeGraph() for _ in range(n)]  # an auto step holds several
        eng._graphs[("key", i)] = ({}, run)
    close_all_engines()
    assert FakeGraph.resets == 3 and not any(eng._graphs for eng in engines)


@pytest.mark.gpu
def test_gpu_close_frees_graphs_and_the_engine_captures_again():
    with make_engine(device="cuda", graphs=True) as eng:
        a = [r.tokens for r in eng.generate(PROMPTS, 10, budget=4)]
        assert eng._graphs
        eng.close()
        assert not eng._graphs
        assert [r.tokens for r in eng.generate(PROMPTS, 10, budget=4)] == a
    assert not eng._graphs


@pytest.mark.gpu
def test_gpu_compiled_graph_step():
    eng = make_engine(device="cuda", graphs=True, compile=True)
    ref = make_engine(device="cuda", graphs=False)
    assert [r.tokens for r in eng.generate(PROMPTS, 10, budget=16)] == \
        [r.tokens for r in ref.generate(PROMPTS, 10, budget=16)]


# --------------------------------------------------------------------------------------------------
# Admission: per-request errors, the cache limit, the pool's free pages
# --------------------------------------------------------------------------------------------------

def _alone(eng, prompt, n, **kw):
    """``prompt``'s tokens generated on its own (a fresh engine with a large pool, same weights)."""
    ref = Engine(eng.tparams, eng.tcfg, eng.dparams, eng.dcfg, page_size=eng.page_size, num_pages=256)
    (r,) = ref.generate([prompt], n, **kw)
    assert r.error is None, r.error
    return r.tokens


def test_malformed_prompts_get_their_own_error(reference_path):
    import numpy as np

    eng = make_engine()
    bad = [None, 7, "abc", [1.5, 2], [True, 2], [[1, 2]], torch.tensor([1.0, 2.0]), [3, -1], [3, 97]]
    good = [[1, 2, 3], (4, 5), torch.tensor([6, 7, 8]), np.array([9, 10], dtype=np.int64), [np.int32(11)]]
    res = eng.generate([good[0], *bad[:4], good[1], *bad[4:], *good[2:]], 4, budget=4)
    got_good = [res[0], res[5], *res[-3:]]
    got_bad = [*res[1:5], *res[6:-3]]
    for r, p in zip(got_bad, bad):
        assert r.error and r.tokens == [] and r.finish is None, (p, r)
    for r, p in zip(got_good, good):
        assert r.error is None and r.tokens == _alone(eng, [int(t) for t in p], 4, budget=4)
    assert "vocabulary" in res[-4].error and "vocabulary" in res[-5].error
    assert eng.pool.free_pages == eng.pool.num_pages


def test_prompt_at_the_cache_limit_is_admitted_and_one_more_token_is_refused(reference_path):
    """4 pages of 8 hold 32 positions; a request reserves prompt + max_new_tokens + tree + 2 of them.
    Admission and reservation must count the same positions: the longest admitted prompt runs."""
    eng = make_engine(num_pages=4)
    n, budget = 5, 4
    longest = 32 - (n + budget + 1 + 2)
    fits, over = list(range(1, longest + 1)), list(range(1, longest + 2))
    (alone,) = eng.generate([over], n, budget=budget)
    assert alone.error and "cache" in alone.error
    res = eng.generate([fits, over], n, budget=budget)
    assert res[0].error is None and res[0].tokens == _alone(eng, fits, n, budget=budget)
    assert res[1].error and "cache" in res[1].error and res[1].tokens == []
    assert eng.pool.free_pages == 4


def test_prompt_at_the_model_position_limit(reference_path):
    eng = make_engine(num_pages=160)  # 1280 cache positions (both requests fit) > the model's 512
    n, budget = 2, 1
    longest = eng.tcfg.max_position_embeddings - (n + budget + 1 + 2)
    res = eng.generate([[3] * longest, [3] * (longest + 1)], n, budget=budget)
    assert res[0].error is None and len(res[0].tokens) == n
    assert res[1].error and "model" in res[1].error


def test_batch_needing_more_pages_than_the_pool_has_is_queued(reference_path):
    """Each request fits the pool alone, together they do not: they run as pages come back, and every
    result equals the request run on its own."""
    eng = make_engine(num_pages=6)
    prompts = [list(range(1, 12)), list(range(20, 30)), [5, 6], list(range(40, 55)), [7] * 9]
    res = eng.generate(prompts, 6, budget=4)
    for r, p in zip(res, prompts):
        assert r.error is None and r.tokens == _alone(eng, p, 6, budget=4)
    assert eng.pool.free_pages == 6 and not eng.pool.pages


def test_admission_counts_the_pages_free_now_not_the_whole_pool(reference_path):
    """Pages held outside the call: a request that fits the whole pool but not what is free is refused
    with its own error; the others run."""
    eng = make_engine(num_pages=6)
    eng.pool.reserve("held", 3 * 8)
    prompts = [[1, 2, 3], list(range(1, 30)), [4, 5]]
    res = eng.generate(prompts, 4, budget=4)
    assert res[0].error is None and res[0].tokens == _alone(eng, prompts[0], 4, budget=4)
    assert res[1].error and "free" in res[1].error and res[1].tokens == []
    assert res[2].error is None and res[2].tokens == _alone(eng, prompts[2], 4, budget=4)
    assert eng.pool.free_pages == 3 and list(eng.pool.pages) == ["held"]


def test_queued_requests_through_the_triton_kernels():
    """Two rows for three requests (4 pages, 2 each): the third takes the first row freed, and the row
    left without a request steps on the sink page (empty context) beside a running one."""
    eng = make_engine(num_pages=4)
    prompts = [[5, 17, 3], [60, 1], [7, 7, 7, 30]]
    res = eng.generate(prompts, 4, budget=4)
    for r, p in zip(res, prompts):
        assert r.error is None and r.tokens == greedy_oracle(eng, p, 4)
    assert eng.pool.free_pages == 4

# Malformed requests of the random batches below, and the word their error must contain.
MALFORMED = [([], "empty"), ([97], "vocabulary"), ([3, -1], "vocabulary"), (None, "sequence"), ("12", "sequence"),
             ([1.5, 2], "integer"), ([True], "integer"), ([[1, 2]], "integer")]


@pytest.mark.parametrize("seed,kw,held", [(0, {"budget": 4}, 0), (1, {"chain": True}, 0), (2, {"budget": 16}, 3)])
def test_many_random_requests_through_a_small_pool(reference_path, seed, kw, held):
    """30 requests of random lengths (a few malformed, a few longer than the cache) through a pool of
    12 pages of 8, with a random stop token, ``held`` pages taken outside the call: every request
    completes with plain greedy decoding's tokens (the target alone, a pool large enough for all)
    or gets its own error, and every page comes back."""
    rng = random.Random(seed)
    eng = make_engine(num_pages=12)
    n = 6
    T = (eng.dcfg.block_size if kw.get("chain") else kw["budget"] + 1)
    if held:
        eng.pool.reserve("held", held * eng.page_size)
    prompts, expect = [], []  # expect: None (tokens) or a word of the error
    for _ in range(30):
        u = rng.random()
        if u < 0.15:
            p, word = rng.choice(MALFORMED)
        elif u < 0.25:
            p, word = [rng.randrange(97) for _ in range(rng.randint(96 - n - T - 1, 120))], "cache"
        else:
            p = [rng.randrange(97) for _ in range(rng.randint(1, 96 - n - T - 2))]
            pages = -(-(len(p) + n + T + 2) // eng.page_size)
            word = "free" if pages > eng.pool.num_pages - held else None
        prompts.append(p)
        expect.append(word)
    assert "cache" in expect and {w for _, w in MALFORMED} & set(expect) and ("free" in expect) == bool(held)
    stop = [rng.randrange(97)]
    res = eng.generate(prompts, n, stop_tokens=stop, **kw)
    ok = [i for i, w in enumerate(expect) if w is None]
    plain = make_engine(num_pages=1024).generate([prompts[i] for i in ok], n, stop_tokens=stop, speculative=False)
    for i, r, w in zip(range(len(prompts)), res, expect):
        if w is None:
            assert r.error is None, (i, r.error)
            assert r.tokens == plain[ok.index(i)].tokens and r.finish in ("stop", "length")
        else:
            assert r.error and w in r.error and r.tokens == [] and r.finish is None, (i, prompts[i], r)
    assert len(ok) >= 15 and sum(-(-(len(prompts[i]) + n + T + 2) // 8) for i in ok) > 3 * 12  # queued
    assert any(r.finish == "stop" for r in res) or stop[0] not in sum((r.tokens for r in plain), [])
    assert eng.pool.free_pages == 12 - held and list(eng.pool.pages) == (["held"] if held else [])
    i = ok[0]
    assert res[i].tokens == greedy_oracle(eng, prompts[i], len(res[i].tokens))  # the plain path itself
