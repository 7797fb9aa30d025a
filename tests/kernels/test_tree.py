"""DDTree build and tree acceptance against their references, the lattice definition, and exactness of
sampling (chi-square)."""

import itertools
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.accept import accept_picks, accept_tree, accept_tree_reference
from tritree.kernels.tree import build_tree, build_tree_reference, topk_per_depth
from tritree.testing import random_trees

from ..conftest import DEVICE, HAS_GPU


def _same_values(got, want):
    """Bit for bit in the interpreter (numpy's exp on both sides); on a GPU the log-softmax's exp differs
    from numpy's in the last bits, which moves a row's normaliser by about one float32 ulp."""
    got = got.cpu()
    return torch.allclose(got, want, rtol=1e-6, atol=1e-6) if HAS_GPU else torch.equal(got, want)


@st.composite
def draft_cases(draw):
    B = draw(st.integers(1, 3))
    D = draw(st.integers(1, 6))
    V = draw(st.integers(1, 40))
    budget = draw(st.integers(1, 48))
    ties = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if ties:  # a few distinct values: many equal log-probabilities and equal path scores
        logits = torch.randint(0, 3, (B, D, V), generator=g).float()
    else:
        logits = torch.randn(B, D, V, generator=g) * 3
    return logits, budget, torch.randint(0, max(V, 1), (B,), generator=g, dtype=torch.int32)


@settings(max_examples=60)
@given(draft_cases())
def test_build_tree_matches_heap_reference(case):
    logits, budget, root = case
    tree = build_tree(logits.to(DEVICE), budget, root.to(DEVICE))
    ref = build_tree_reference(logits, budget, root)
    for name, got, want in zip(tree._fields, tree, ref):
        assert _same_values(got, want) if name == "scores" else torch.equal(got.cpu(), want), name
    B, D, V = logits.shape
    reachable = sum(min(budget, V) ** d for d in range(1, D + 1))
    assert tree.tree_lens.cpu().tolist() == [1 + min(budget, reachable)] * B


@settings(max_examples=30)
@given(draft_cases())
def test_reference_selects_the_best_paths_of_the_lattice(case):
    """The node set is prefix-closed and no unselected path scores higher than a selected one."""
    logits, budget, root = case
    B, D, V = logits.shape
    K = min(budget, V)
    if K ** min(D, 3) > 5000:
        return
    ref = build_tree_reference(logits, budget, root)
    lp, _ = topk_per_depth(logits, K)
    for b in range(B):
        n = int(ref.tree_lens[b])
        # rank path of every node
        ranks = {0: ()}
        for i in range(1, n):
            d = int(ref.depth[b, i])
            par = int(ref.parents[b, i])
            assert par < i and int(ref.depth[b, par]) == d - 1  # parents first, one level up
            # rank = position of the token among the top-K at depth d
            tok_rank = [r for r in range(K) if int(topk_per_depth(logits[b:b + 1], K)[1][0, d - 1, r]) == int(ref.tokens[b, i])][0]
            ranks[i] = ranks[par] + (tok_rank,)
            exact = sum(float(lp[b, k, r]) for k, r in enumerate(ranks[i]))
            assert abs(exact - float(ref.scores[b, i])) <= 1e-4 * max(1.0, abs(exact))
        chosen = set(ranks.values()) - {()}
        assert len(chosen) == n - 1
        worst = min((float(ref.scores[b, i]) for i in range(1, n)), default=math.inf)
        for depth in range(1, min(D, 3) + 1):
            for path in itertools.product(range(K), repeat=depth):
                if path not in chosen:
                    score = sum(float(lp[b, k, r]) for k, r in enumerate(path))
                    assert score <= worst + 1e-4 * max(1.0, abs(worst)), (path, score, worst)


def test_dominant_rank0_path_gives_the_dflash_chain():
    D, V = 7, 50
    logits = torch.full((1, D, V), -5.0)
    logits[:, :, 3] = 10.0
    tree = build_tree(logits.to(DEVICE), D, torch.tensor([9], dtype=torch.int32, device=DEVICE))
    assert tree.parents.cpu().tolist() == [[-1] + list(range(D))]
    assert tree.tokens.cpu().tolist() == [[9] + [3] * D]
    assert tree.depth.cpu().tolist() == [list(range(D + 1))]


# ---------------------------------------------------------------------------------------------
# accept_tree
# ---------------------------------------------------------------------------------------------

@settings(max_examples=40)
@given(draft_cases(), st.integers(0, 2**31 - 1))
def test_greedy_accept_matches_reference_walk(case, seed):
    logits, budget, root = case
    tree = build_tree(logits.to(DEVICE), budget, root.to(DEVICE))
    B, T = tree.tokens.shape
    V = logits.shape[-1]
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, T, V, generator=g)
    # make the target agree with the draft along some path now and then
    target[:, :, :] += 4.0 * torch.nn.functional.one_hot(torch.randint(0, V, (B, T), generator=g), V)
    idx, n, bonus, picks = accept_tree(tree.tokens, tree.parents, tree.tree_lens, target.to(DEVICE))
    ridx, rn, rbonus = accept_tree_reference(tree.tokens.cpu(), tree.parents.cpu(), tree.tree_lens.cpu(), picks.cpu())
    assert torch.equal(picks.cpu(), torch.argmax(target, dim=-1).to(torch.int32))
    assert torch.equal(idx.cpu(), ridx) and torch.equal(n.cpu(), rn) and torch.equal(bonus.cpu(), rbonus)
    # The emitted tokens are the target's greedy continuation along the tree.
    toks, par = tree.tokens.cpu(), tree.parents.cpu()
    for b in range(B):
        path = idx[b, :int(n[b])].cpu().tolist()
        assert path[0] == 0
        for prev, node in zip(path, path[1:]):
            assert int(par[b, node]) == prev and int(toks[b, node]) == int(picks[b, prev])
        last = path[-1]
        children = [c for c in range(int(tree.tree_lens[b])) if int(par[b, c]) == last]
        assert all(int(toks[b, c]) != int(picks[b, last]) for c in children)
        assert int(bonus[b]) == int(picks[b, last])


def test_greedy_ties_pick_the_lowest_id():
    tokens = torch.tensor([[0, 5, 7]], dtype=torch.int32, device=DEVICE)
    parents = torch.tensor([[-1, 0, 0]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    logits = torch.zeros(1, 3, 10, device=DEVICE)
    logits[0, 0, [5, 7]] = 1.0
    idx, n, bonus, picks = accept_tree(tokens, parents, lens, logits)
    assert int(picks[0, 0]) == 5 and idx[0, :2].tolist() == [0, 1] and int(n[0]) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_accept_over_vocabulary_chunks(dtype):
    """A vocabulary of several 4096-token chunks (each program one chunk of a row, the request's last
    program reduces them): ties across chunks, the maximum in the last, part-filled chunk, rows of -inf,
    logits read through a strided view; the arrival counters are left 0, so a second call agrees."""
    from tritree.kernels.accept import _ACCEPT_PLANS, greedy_accept_layout

    B, T, Vv = 2, 3, 3 * 4096 + 5
    assert greedy_accept_layout(B, T, Vv, 4)[-1] > 1  # the interpreter's 4 "SMs": several chunks a row
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(B, T, 2 * Vv, generator=g)
    logits = wide[:, :, ::2]
    logits[0, 0, [100, 5000]] = 9.0  # a tie across chunks: the lower id
    logits[0, 1, Vv - 1] = 9.0  # the last id, in the part-filled chunk
    logits[1, 0] = float("-inf")  # all -inf: id 0, as torch's argmax
    logits[1, 1] = float("-inf")
    logits[1, 1, 8191] = -3.0
    logits = logits.to(dtype)
    tokens = torch.tensor([[0, 100, 4], [0, 0, 8191]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 1], [-1, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([3, 3], dtype=torch.int32)
    args = (tokens.to(DEVICE), parents.to(DEVICE), lens.to(DEVICE), logits.to(DEVICE))
    for _ in range(2):
        idx, n, bonus, picks = accept_tree(*args)
        want = torch.argmax(logits.float(), dim=-1).to(torch.int32)
        assert torch.equal(picks.cpu(), want)
        assert picks[0, 0] == 100 and picks[0, 1] == Vv - 1 and picks[1, 0] == 0 and picks[1, 1] == 8191
        ridx, rn, rbonus = accept_tree_reference(tokens, parents, lens, want)
        assert torch.equal(idx.cpu(), ridx) and torch.equal(n.cpu(), rn) and torch.equal(bonus.cpu(), rbonus)
        assert n.tolist() == [2, 3]
    if DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        for plan in _ACCEPT_PLANS._plans.values():
            if getattr(plan, "greedy", False) and hasattr(plan, "_scratch"):
                for _, _, arrive in plan._scratch._sets.values():
                    assert int(arrive.abs().sum()) == 0


def _chi2_critical(df, z=3.719):  # upper 1e-4 quantile, Wilson-Hilferty
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts, probs, n):
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


def test_sampling_is_exact_for_any_tree():
    """First and first-two emitted tokens follow the target, whatever the draft tree proposes."""
    V, N, temp = 4, 3000, 0.8
    g = torch.Generator().manual_seed(0)
    first_logits = torch.randn(V, generator=g)
    second_logits = torch.randn(V, V, generator=g)  # row x1: the target's logits after x1
    # A draft tree: root, children tokens 0 and 2, and a grandchild under token 0 (token 1).
    tokens = torch.tensor([0, 0, 2, 1], dtype=torch.int32)
    parents = torch.tensor([-1, 0, 0, 1], dtype=torch.int32)
    node_logits = torch.stack([first_logits, second_logits[0], second_logits[2], second_logits[1]])
    B = N
    out = accept_tree(tokens.repeat(B, 1).to(DEVICE), parents.repeat(B, 1).to(DEVICE),
                      torch.full((B,), 4, dtype=torch.int32, device=DEVICE),
                      node_logits.repeat(B, 1, 1).to(DEVICE), temperature=temp, seed=1234, step=0)
    idx, n, bonus, picks = (x.cpu() for x in out)
    emitted = []
    for b in range(B):
        path = idx[b, :int(n[b])].tolist()
        emitted.append([int(tokens[c]) for c in path[1:]] + [int(bonus[b])])
    # Where only one token was emitted, the next step's root pick supplies the second.
    need = [b for b in range(B) if len(emitted[b]) < 2]
    if need:
        x1 = torch.tensor([emitted[b][0] for b in need])
        nxt = accept_tree(torch.zeros(len(need), 1, dtype=torch.int32, device=DEVICE),
                          torch.full((len(need), 1), -1, dtype=torch.int32, device=DEVICE),
                          torch.ones(len(need), dtype=torch.int32, device=DEVICE),
                          second_logits[x1].unsqueeze(1).to(DEVICE), temperature=temp, seed=1234, step=1)
        for k, b in enumerate(need):
            emitted[b].append(int(nxt[2][k]))
    p1 = torch.softmax(first_logits / temp, -1)
    p2 = torch.softmax(second_logits / temp, -1)
    c1 = [sum(1 for e in emitted if e[0] == v) for v in range(V)]
    assert _chi2(c1, p1.tolist(), N) < _chi2_critical(V - 1)
    joint = [p1[a] * p2[a, c] for a in range(V) for c in range(V)]
    cj = [sum(1 for e in emitted if (e[0], e[1]) == (a, c)) for a in range(V) for c in range(V)]
    assert _chi2(cj, [float(p) for p in joint], N) < _chi2_critical(V * V - 1)


def test_sampling_with_top_k_top_p_follows_the_filtered_distribution():
    V, N = 6, 3000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
    lens = torch.ones(N, dtype=torch.int32, device=DEVICE)
    tok = torch.zeros(N, 1, dtype=torch.int32, device=DEVICE)
    par = torch.full((N, 1), -1, dtype=torch.int32, device=DEVICE)
    batch = logits.view(1, 1, V).repeat(N, 1, 1).to(DEVICE)
    for top_k, top_p, keep in [(3, None, 3), (None, 0.6, None)]:
        out = accept_tree(tok, par, lens, batch, temperature=1.0, top_k=top_k, top_p=top_p, seed=7)
        picks = out[3][:, 0].cpu()
        probs = torch.softmax(logits, -1)
        if keep is None:  # nucleus: smallest prefix with mass >= top_p
            cum = torch.cumsum(probs, 0)
            keep = int((cum - probs < top_p).sum())
        target = torch.zeros(V)
        target[:keep] = probs[:keep] / probs[:keep].sum()
        assert (picks >= keep).sum() == 0
        counts = [int((picks == v).sum()) for v in range(keep)]
        assert _chi2(counts, target[:keep].tolist(), N) < _chi2_critical(keep - 1)


def test_sampling_is_reproducible_and_keyed_by_step():
    logits = torch.randn(2, 3, 50).to(DEVICE)
    tok = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    par = torch.tensor([[-1, 0, 0]] * 2, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([3, 3], dtype=torch.int32, device=DEVICE)
    a = accept_tree(tok, par, lens, logits, temperature=1.0, seed=5, step=3)[3]
    b = accept_tree(tok, par, lens, logits, temperature=1.0, seed=5, step=3)[3]
    c = [accept_tree(tok, par, lens, logits, temperature=1.0, seed=5, step=s)[3] for s in range(4, 8)]
    assert torch.equal(a, b)
    assert any(not torch.equal(a, x) for x in c)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


@st.composite
def walk_cases(draw):
    """Random trees (every shape random_trees draws), a small vocabulary so that siblings share tokens and picks
    often match, tree_lens from 0 to T, and picks as a column-sliced view (strided rows) half of the time."""
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 70))
    V = draw(st.integers(1, 4))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    parents = random_trees(B, T, (draw(st.sampled_from(["random", "wide", "chain"])),), generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    tree_lens = torch.tensor(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), dtype=torch.int32)
    wide = torch.randint(0, V, (B, T + draw(st.sampled_from([0, 3]))), generator=g, dtype=torch.int32)
    return tokens, parents, tree_lens, wide[:, :T]


@settings(max_examples=60)
@given(walk_cases())
def test_accept_picks_matches_the_reference_walk(case):
    tokens, parents, tree_lens, picks = case
    want = accept_tree_reference(tokens, parents, tree_lens, picks)
    got = accept_picks(*(t.to(DEVICE) for t in (tokens, parents, tree_lens)), picks.to(DEVICE))
    for a, b in zip(got, want):  # every element compared: accept_idx is -1 past the path
        assert a.device == DEVICE and a.dtype == torch.int32
        assert torch.equal(a.cpu(), b)


def test_accept_picks_equals_accept_tree_on_the_picks_of_its_logits():
    g = torch.Generator().manual_seed(5)
    B, T, V = 3, 9, 3
    parents = random_trees(B, T, ("random",), generator=g).to(DEVICE)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32).to(DEVICE)
    tree_lens = torch.tensor([9, 0, 4], dtype=torch.int32, device=DEVICE)
    logits = torch.randn(B, T, V, generator=g).to(DEVICE)
    idx, n, bonus, picks = accept_tree(tokens, parents, tree_lens, logits)
    for a, b in zip(accept_picks(tokens, parents, tree_lens, picks), (idx, n, bonus)):
        assert torch.equal(a, b)
    assert int(n[1]) == 0 and int(bonus[1]) == -1


def test_accept_picks_bad_inputs(monkeypatch):
    monkeypatch.setattr("tritree.kernels._validate.DEBUG_CHECKS", True)
    tokens = torch.zeros(1, 4, dtype=torch.int32, device=DEVICE)
    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32, device=DEVICE)
    lens = torch.full((1,), 4, dtype=torch.int32, device=DEVICE)
    picks = torch.zeros(1, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="picks must have dtype"):
        accept_picks(tokens, parents, lens, picks.long())
    with pytest.raises(ValueError, match="picks must have shape"):
        accept_picks(tokens, parents, lens, picks[:, :3])
    with pytest.raises(ValueError, match="parents-first"):
        accept_picks(tokens, torch.tensor([[-1, 0, 3, 1]], dtype=torch.int32, device=DEVICE), lens, picks)
    with pytest.raises(ValueError, match="tree_lens"):
        accept_picks(tokens, parents, torch.full((1,), 5, dtype=torch.int32, device=DEVICE), picks)
    with pytest.raises(TypeError, match="tokens"):
        accept_picks(tokens.tolist(), parents, lens, picks)

def test_bad_inputs(monkeypatch):
    monkeypatch.setattr("tritree.kernels._validate.DEBUG_CHECKS", True)
    logits = torch.randn(1, 3, 10, device=DEVICE)
    root = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="budget"):
        build_tree(logits, 0, root)
    with pytest.raises(ValueError, match="draft_logits must have 3"):
        build_tree(logits[0], 4, root)
    with pytest.raises(ValueError, match="root_tokens must have shape"):
        build_tree(logits, 4, torch.zeros(2, dtype=torch.int32, device=DEVICE))
    bad = logits.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        build_tree(bad, 4, root)
    tree = build_tree(logits, 4, root)
    target = torch.randn(1, 5, 10, device=DEVICE)
    with pytest.raises(ValueError, match="parents-first"):
        accept_tree(tree.tokens, torch.tensor([[-1, 0, 3, 1, 2]], dtype=torch.int32, device=DEVICE), tree.tree_lens, target)
    with pytest.raises(ValueError, match="target_logits must have shape"):
        accept_tree(tree.tokens, tree.parents, tree.tree_lens, target[:, :4])
    with pytest.raises(ValueError, match="temperature"):
        accept_tree(tree.tokens, tree.parents, tree.tree_lens, target, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        accept_tree(tree.tokens, tree.parents, tree.tree_lens, target, temperature=1.0, top_p=0.0)
    target[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        accept_tree(tree.tokens, tree.parents, tree.tree_lens, target)
    with pytest.raises(TypeError, match="tokens must have dtype"):
        accept_tree(tree.tokens.long(), tree.parents, tree.tree_lens, target)


# ---------------------------------------------------------------------------------------------
# The fused top-k (log-softmax, lower bound, candidates, exact selection)
# ---------------------------------------------------------------------------------------------

@st.composite
def topk_cases(draw):
    """Logits of a few rows with ties, -inf, V not a power of two, k up to V; launch shapes that split a
    row over several programs (small blocks) and candidate capacities small enough to overflow (the
    whole-row fallback)."""
    B, D = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    V = draw(st.integers(1, 700))
    k = draw(st.integers(1, V))
    kind = draw(st.sampled_from(["randn", "ties", "neginf", "flat"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if kind == "ties":
        x = torch.randint(0, 3, (B, D, V), generator=g).float()
    elif kind == "flat":  # one value everywhere: every token ties
        x = torch.zeros(B, D, V)
    else:
        x = torch.randn(B, D, V, generator=g) * 3
    if kind == "neginf":  # probability-0 tokens, sometimes more of them than V - k
        x[torch.rand(B, D, V, generator=g) < draw(st.sampled_from([0.3, 0.9]))] = float("-inf")
        x[..., draw(st.integers(0, V - 1))] = 1.0  # no all -inf row
    plan = draw(st.sampled_from([{}, {"block1": 64, "block2": 32, "ctas": 12}, {"block2": 16, "ctas": 40}]))
    cap = draw(st.sampled_from([None, k, min(V, k + 3)]))
    if cap is not None:
        plan = dict(plan, cap=cap)
    return x, k, plan


@settings(max_examples=40)
@given(topk_cases())
def test_topk_kernel_matches_the_reference(case):
    """The kernels' top-k equals ``torch.topk`` of the tie-rule keys of the reference log-softmax, bit for
    bit (log-probabilities included), whatever the split of the rows and the candidates' capacity."""
    from tritree.kernels.tree import _topk_device
    x, k, plan = case
    lp, ids = _topk_device(x.to(DEVICE), k, **plan)
    want_lp, want_ids = topk_per_depth(x, k)
    assert torch.equal(ids.cpu(), want_ids)
    assert _same_values(lp, want_lp)


def test_topk_fallback_with_massive_ties_takes_the_lowest_ids():
    """3 values over 600 tokens, k = 50 and room for only 50 candidates: the whole-row fallback must keep
    the lowest ids of the top value."""
    from tritree.kernels.tree import _topk_device
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (1, 2, 600), generator=g).to(torch.bfloat16)
    lp, ids = _topk_device(x.to(DEVICE), 50, block1=64, block2=64, ctas=16, cap=50)
    for d in range(2):
        top = torch.nonzero(x[0, d].float() == x[0, d].float().max())[:, 0][:50].to(torch.int32)
        assert torch.equal(ids[0, d].cpu(), top)
    assert _same_values(lp, topk_per_depth(x, 50)[0])


def test_log_softmax_reference_is_a_log_softmax():
    from tritree.kernels.tree import log_softmax_reference
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 1000, generator=g, dtype=torch.float64) * 4
    x[0, 0, :10] = float("-inf")
    got = log_softmax_reference(x.float()).double()
    want = torch.log_softmax(x.float().double(), -1)
    assert torch.allclose(got, want, rtol=1e-6, atol=2e-6)


def test_topk_kernel_reads_strided_half_precision_logits():
    from tritree.kernels.tree import _topk_device
    g = torch.Generator().manual_seed(2)
    base = (torch.randn(300, 2, 3, generator=g) * 2).to(torch.float16)
    x = base.permute(1, 2, 0)  # [B=2, D=3, V=300], stride 6 along V
    lp, ids = _topk_device(x.to(DEVICE), 20, block1=64, block2=64, ctas=8)
    want_lp, want_ids = topk_per_depth(x.contiguous(), 20)
    assert torch.equal(ids.cpu(), want_ids) and _same_values(lp, want_lp)


def test_build_tree_never_creates_probability_zero_nodes():
    logits = torch.full((2, 3, 6), float("-inf"))
    logits[:, :, :2] = torch.tensor([0.5, -0.25])
    logits[1, 2] = float("-inf")
    logits[1, 2, 4] = 0.0  # one token only at the last depth of request 1
    root = torch.tensor([1, 2], dtype=torch.int32)
    tree = build_tree(logits.to(DEVICE), 20, root.to(DEVICE))
    ref = build_tree_reference(logits, 20, root)
    for name, got, want in zip(tree._fields, tree, ref):
        assert _same_values(got, want) if name == "scores" else torch.equal(got.cpu(), want), name
    assert tree.tree_lens.cpu().tolist() == [1 + 2 + 4 + 8, 1 + 2 + 4 + 4]
    assert bool(torch.isfinite(tree.scores[:, 1:][tree.depth[:, 1:] > 0]).all())


# ---------------------------------------------------------------------------------------------
# GPU: the real vocabulary
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("B,D,budget", [(1, 7, 64), (2, 15, 1024), (3, 7, 16)])
def test_gpu_build_tree_at_kimi_vocabulary(B, D, budget):
    g = torch.Generator().manual_seed(budget)
    logits = torch.randn(B, D, 163_840, generator=g) * 3
    root = torch.randint(0, 163_840, (B,), generator=g, dtype=torch.int32)
    tree = build_tree(logits.cuda(), budget, root.cuda())
    ref = build_tree_reference(logits, budget, root)
    for name, got, want in zip(tree._fields, tree, ref):
        if name == "scores":  # CPU and GPU log-softmax may differ in the last bit
            assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got.cpu(), want), name


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 64, 1000, 1024])
@pytest.mark.parametrize("ties", [False, True])
def test_gpu_topk_at_kimi_vocabulary(k, ties):
    """At V = 163,840 in bf16: with massive ties (50 values: ~3,300 tokens share the top one, so the
    candidates overflow and the whole-row fallback runs) and without."""
    from tritree.kernels.tree import _topk_device
    g = torch.Generator().manual_seed(k)
    if ties:
        x = torch.randint(0, 50, (4, 5, 163_840), generator=g).to(torch.bfloat16)
    else:
        x = (torch.randn(4, 5, 163_840, generator=g) * 3).to(torch.bfloat16)
    lp, ids = _topk_device(x.cuda(), k)
    want_lp, want_ids = topk_per_depth(x, k)
    assert torch.equal(ids.cpu(), want_ids)
    assert torch.allclose(lp.cpu(), want_lp, rtol=1e-6, atol=1e-6)  # the GPU's exp: last bits of c


@pytest.mark.gpu
def test_gpu_build_tree_in_a_cuda_graph():
    """Captured once, replayed on new logits: the same trees as eager calls (no host sync, static shapes)."""
    B, D, V, budget = 2, 7, 163_840, 64
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(B, D, V, generator=g) * 3).to(torch.bfloat16).cuda()
    root = torch.randint(0, V, (B,), generator=g, dtype=torch.int32).cuda()
    build_tree(logits, budget, root)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = build_tree(logits, budget, root)
    for seed in range(3):
        logits.copy_((torch.randn(B, D, V, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16))
        graph.replay()
        eager = build_tree(logits, budget, root)
        for name, got, want in zip(eager._fields, out, eager):
            assert torch.equal(got, want), name


@pytest.mark.gpu
def test_gpu_accept_and_graph_replay_with_a_device_step():
    B, T, V = 4, 65, 163_840
    g = torch.Generator().manual_seed(3)
    tree = build_tree((torch.randn(B, 7, V, generator=g) * 3).cuda(), T - 1, torch.zeros(B, dtype=torch.int32).cuda())
    target = torch.randn(B, T, V, generator=g).cuda().to(torch.bfloat16)
    idx, n, bonus, picks = accept_tree(tree.tokens, tree.parents, tree.tree_lens, target)
    ridx, rn, rbonus = accept_tree_reference(tree.tokens.cpu(), tree.parents.cpu(), tree.tree_lens.cpu(), picks.cpu())
    assert torch.equal(picks.cpu(), torch.argmax(target.float().cpu(), dim=-1).to(torch.int32))
    assert torch.equal(idx.cpu(), ridx) and torch.equal(n.cpu(), rn) and torch.equal(bonus.cpu(), rbonus)
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    eager = [accept_tree(tree.tokens, tree.parents, tree.tree_lens, target, temperature=1.0, seed=9,
                         step=torch.full_like(step, s))[3] for s in range(3)]
    out = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["picks"] = accept_tree(tree.tokens, tree.parents, tree.tree_lens, target, temperature=1.0, seed=9,
                                   step=step)[3]
    for s in range(3):
        step.fill_(s)
        graph.replay()
        assert torch.equal(out["picks"], eager[s])
    assert not torch.equal(eager[0], eager[1])


def test_build_tree_is_an_opaque_op_for_torch_compile():
    """Traced as one custom op (its kernels pass work between programs through scratch buffers,
    which Inductor's analysis of user kernels cannot follow)."""
    from tritree.kernels.tree import _build_tree_op
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 50, generator=g).to(DEVICE)
    root = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    torch.library.opcheck(_build_tree_op, (logits, 6, root), test_utils=("test_schema", "test_faketensor"))
    eager = build_tree(logits, 6, root)
    traced = torch.compile(lambda x, r: tuple(build_tree(x, 6, r)), backend="aot_eager", fullgraph=True)(logits, root)
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)


def test_top_k_counters_are_left_zero_for_the_next_call():
    """The top-k passes zero each other's arrival and candidate counters, so a plan's scratch is zeroed
    once (no memset per call): repeated calls on one plan give the reference's tree every time."""
    import tritree.kernels.tree as tree_mod
    from tritree.kernels._launch import scalars, signature

    g = torch.Generator().manual_seed(3)
    trees = []
    for _ in range(3):
        logits = torch.randn(2, 3, 50, generator=g).to(DEVICE)
        root = torch.tensor([1, 4], dtype=torch.int32, device=DEVICE)
        tree = build_tree(logits, 7, root)
        ref = build_tree_reference(logits.cpu(), 7, root.cpu())
        assert torch.equal(tree.tokens.cpu(), ref.tokens) and torch.equal(tree.parents.cpu(), ref.parents)
        plan = tree_mod._BUILD_PLANS.get((signature(logits, root), scalars(7)), logits, 7, root)
        if plan.reference:
            pytest.skip("CPU reference path: no kernels")
        (counters, *_), _ranks = plan._scratch.get(logits.device)
        assert int(counters.abs().sum()) == 0
        trees.append(tree)
