"""KV cache ops against their references and against direct checks of what must (not) change."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.kv_cache import (
    _commit_layout,
    _kv_commit_launch,
    _kv_commit_op,
    kv_commit_,
    kv_commit_reference,
    kv_gather,
    kv_gather_reference,
    kv_write_,
    kv_write_reference,
)
from tritree.kernels.kv_pool import (
    PagePool,
    PoolExhausted,
    _move_rounds,
    defrag_,
    page_table_from_token_table,
    token_table_from_page_table,
)
from tritree.testing import paged_layout

from ..conftest import DEVICE

TOKEN_SHAPES = [(576,), (2, 8), (3,)]


def make_pool(layers, num_pages, P, tok, dtype, g):
    shape = ((layers,) if layers else ()) + (num_pages, P) + tok
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


def logical(kv, page_table, kv_lens_list, P, stacked):
    """{(b, s): row} of every committed position, read with plain indexing."""
    out = {}
    for b, L in enumerate(kv_lens_list):
        for s in range(L):
            page = int(page_table[b, s // P])
            out[(b, s)] = (kv[:, page, s % P] if stacked else kv[page, s % P]).clone()
    return out


@st.composite
def paged_cases(draw, max_T=20):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, max_T))
    P = draw(st.sampled_from([1, 2, 16, 64]))
    kv_lens = draw(st.lists(st.integers(0, 150), min_size=B, max_size=B))
    tok = draw(st.sampled_from(TOKEN_SHAPES))
    layers = draw(st.sampled_from([0, 1, 3]))  # 0: an unstacked pool
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(B=B, T=T, P=P, kv_lens=kv_lens, tok=tok, layers=layers, dtype=dtype, seed=seed)


def build(c):
    g = torch.Generator().manual_seed(c["seed"])
    page_table, num_pages = paged_layout([L + c["T"] for L in c["kv_lens"]], c["B"], c["P"], extra_pages=3,
                                         generator=g)
    kv = make_pool(c["layers"], num_pages, c["P"], c["tok"], c["dtype"], g)
    return g, kv, page_table.to(DEVICE), torch.tensor(c["kv_lens"], dtype=torch.int32, device=DEVICE)


@settings(max_examples=25)
@given(paged_cases(), st.data())
def test_kv_write_matches_reference(c, data):
    g, kv, page_table, kv_lens = build(c)
    stacked = c["layers"] > 0
    lead = (c["layers"],) if stacked else ()
    new = torch.randn(lead + (c["B"], c["T"]) + c["tok"], generator=g).to(c["dtype"]).to(DEVICE)
    tree_lens = None
    if data.draw(st.booleans()):
        tree_lens = torch.tensor(data.draw(st.lists(st.integers(0, c["T"]), min_size=c["B"], max_size=c["B"])),
                                 dtype=torch.int32, device=DEVICE)
    ref = kv_write_reference(kv.clone(), page_table, kv_lens, new, tree_lens, stacked=stacked)
    out = kv_write_(kv, page_table, kv_lens, new, tree_lens, stacked=stacked)
    assert out is kv
    assert torch.equal(kv, ref)


def random_accept(T, rng):
    n = rng.randint(0, T)
    rest = sorted(rng.sample(range(1, T), max(0, n - 1))) if n > 0 else []
    idx = ([0] + rest) if n > 0 else []
    return idx + [-1] * (T - len(idx)), len(idx)


@settings(max_examples=30)
@given(paged_cases(max_T=24), st.integers(0, 2**31 - 1), st.sampled_from(["random", "fast", "skip1"]),
       st.sampled_from([None, None, 4, 8]))
def test_kv_commit_moves_exactly_the_accepted_entries(c, seed, pattern, chunk):
    """``chunk``: the launch's rows per chunk forced small, so trees of several chunks (a loop over
    chunks, each read-then-write) are covered at interpreter sizes; None: the launcher's layout (one
    chunk holds the whole tree here)."""
    g, kv, page_table, kv_lens = build(c)
    stacked = c["layers"] > 0
    B, T, P = c["B"], c["T"], c["P"]
    rng = random.Random(seed)
    rows, lens = [], []
    for _ in range(B):
        if pattern == "fast":
            n = rng.randint(0, T)
            row, k = list(range(n)) + [-1] * (T - n), n
        elif pattern == "skip1" and T >= 3:  # [0, 2, 3, ...]: every destination is the next source
            k = rng.randint(2, T - 1)
            row = [0] + list(range(2, k + 1)) + [-1] * (T - k)
        else:
            row, k = random_accept(T, rng)
        rows.append(row)
        lens.append(k)
    accept_idx = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    accept_len = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    before = kv.clone()
    tree_end = [L + T for L in c["kv_lens"]]
    snap = logical(before, page_table.cpu(), tree_end, P, stacked)
    ref = kv.clone()
    ref_lens = kv_commit_reference(ref, page_table, kv_lens, accept_idx, accept_len, stacked=stacked)
    if chunk is None:
        new_lens = kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, stacked=stacked)
    else:
        new_lens = _kv_commit_launch(kv, page_table, kv_lens, accept_idx, accept_len, stacked, rows=chunk)
    assert torch.equal(new_lens, ref_lens) and torch.equal(new_lens.cpu(), torch.tensor(c["kv_lens"]) + torch.tensor(lens))
    assert torch.equal(kv, ref)
    # Directly: the prefix is unchanged, the accepted entries sit in order, nothing else moved.
    after = logical(kv, page_table.cpu(), tree_end, P, stacked)
    changed = set()
    for b in range(B):
        L = c["kv_lens"][b]
        for s in range(L):
            assert torch.equal(after[(b, s)], snap[(b, s)])
        for j in range(lens[b]):
            assert torch.equal(after[(b, L + j)], snap[(b, L + rows[b][j])]), (b, j)
            if rows[b][j] != j:
                changed.add((b, L + j))
        for s in range(L + lens[b], L + T):
            assert torch.equal(after[(b, s)], snap[(b, s)]), "a position past the accepted path was touched"
    # Every element outside the changed positions is bit-identical (other pages, other requests).
    mask = torch.ones(kv.shape[:-len(c["tok"])], dtype=torch.bool, device=DEVICE)
    for b, s in changed:
        page = int(page_table[b, s // P])
        if stacked:
            mask[:, page, s % P] = False
        else:
            mask[page, s % P] = False
    assert torch.equal(kv[mask], before[mask])


@settings(max_examples=20)
@given(paged_cases(), st.one_of(st.none(), st.integers(0, 200)))
def test_kv_gather_matches_reference(c, max_len):
    _, kv, page_table, kv_lens = build(c)
    stacked = c["layers"] > 0
    out = kv_gather(kv, page_table, kv_lens, max_len, stacked=stacked)
    ref = kv_gather_reference(kv, page_table, kv_lens, max_len if max_len is not None else max(c["kv_lens"]),
                              stacked=stacked)
    assert torch.equal(out, ref)
    snap = logical(kv, page_table.cpu(), c["kv_lens"], c["P"], stacked)
    for (b, s), row in snap.items():
        if max_len is None or s < max_len:
            got = out[:, b, s] if stacked else out[b, s]
            assert torch.equal(got, row)


def test_commit_chain_of_64_layers_in_one_call():
    """61 layers in one launch (rows of 72 bf16: two column blocks, the second partly masked)."""
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(61, 12, 16, 72, generator=g).to(torch.bfloat16).to(DEVICE)
    page_table = torch.randperm(12, generator=g)[:8].view(2, 4).int().to(DEVICE)
    kv_lens = torch.tensor([40, 3], dtype=torch.int32, device=DEVICE)
    accept_idx = torch.tensor([[0, 2, 3, 7] + [-1] * 12, [0, 1, 2, 3] + [-1] * 12], dtype=torch.int32, device=DEVICE)
    accept_len = torch.tensor([4, 4], dtype=torch.int32, device=DEVICE)
    ref = kv.clone()
    ref_lens = kv_commit_reference(ref, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    new_lens = kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    assert torch.equal(kv, ref) and torch.equal(new_lens, ref_lens)


def test_commit_layout():
    assert _commit_layout(64, 576, 2) == (64, 64)     # one request-layer's whole tree in one program, 9 columns
    assert _commit_layout(128, 576, 2) == (128, 64)
    assert _commit_layout(1025, 576, 2) == (128, 64)  # larger trees: chunks of 128 accepted nodes
    assert _commit_layout(16, 576, 4) == (16, 32)
    assert _commit_layout(300, 576, 1) == (128, 128)
    assert _commit_layout(8, 3, 4) == (8, 4)


@pytest.mark.parametrize("P", [1, 16])
def test_commit_tree_larger_than_one_chunk(P):
    """The launcher's own layout with T > ROWS (300 nodes, bf16 rows: chunks of 128): accepted paths
    that cross chunk boundaries, every destination the next one's source."""
    T, E, L = 300, 64, 37
    rows, _ = _commit_layout(T, E, 2)
    assert rows < T
    g = torch.Generator().manual_seed(P)
    page_table, num_pages = paged_layout([L + T, 5 + T], 2, P, extra_pages=2, generator=g)
    page_table = page_table.to(DEVICE)
    kv = torch.randn(num_pages, P, E, generator=g).to(torch.bfloat16).to(DEVICE)
    kv_lens = torch.tensor([L, 5], dtype=torch.int32, device=DEVICE)
    shifted = [0] + list(range(2, 262))  # 261 accepted: rows 1..260 each take the next row
    sparse = [0] + sorted(random.Random(P).sample(range(1, T), 199))
    accept_idx = torch.tensor([shifted + [-1] * (T - len(shifted)), sparse + [-1] * (T - len(sparse))],
                              dtype=torch.int32, device=DEVICE)
    accept_len = torch.tensor([len(shifted), len(sparse)], dtype=torch.int32, device=DEVICE)
    ref = kv.clone()
    ref_lens = kv_commit_reference(ref, page_table, kv_lens, accept_idx, accept_len)
    new_lens = kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len)
    assert torch.equal(kv, ref) and torch.equal(new_lens, ref_lens)


def test_commit_custom_op_registration():
    """The op torch.compile and CUDA graphs see: declared mutation of kv, the new lengths returned
    (written by the kernel, a fresh tensor), a fake implementation for tracing."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 6, 4, 8, generator=g).to(DEVICE)
    page_table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    kv_lens = torch.tensor([2, 1], dtype=torch.int32, device=DEVICE)
    accept_idx = torch.tensor([[0, 2, 3, -1], [0, 1, 3, -1]], dtype=torch.int32, device=DEVICE)
    accept_len = torch.tensor([3, 3], dtype=torch.int32, device=DEVICE)
    torch.library.opcheck(_kv_commit_op, (kv.clone(), page_table, kv_lens, accept_idx, accept_len, True))
    ref = kv.clone()
    ref_lens = kv_commit_reference(ref, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    new_lens = _kv_commit_op(kv, page_table, kv_lens, accept_idx, accept_len, True)
    assert torch.equal(kv, ref) and torch.equal(new_lens, ref_lens)
    # traced by torch.compile (functionalised mutation of kv, the returned lengths used downstream)
    kv2, ref2 = kv.clone(), kv.clone()
    ref2_lens = kv_commit_reference(ref2, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    step = torch.compile(lambda *a: _kv_commit_op(*a, True) + 1, backend="aot_eager", fullgraph=True)
    out = step(kv2, page_table, kv_lens, accept_idx, accept_len)
    assert torch.equal(kv2, ref2) and torch.equal(out, ref2_lens + 1)


# ---------------------------------------------------------------------------------------------
# PagePool and defrag_
# ---------------------------------------------------------------------------------------------

def test_page_pool_allocates_grows_frees_and_reports():
    pool = PagePool(10, 4)
    assert pool.reserve("a", 9) == [0, 1, 2]  # 3 pages of 4
    assert pool.reserve("b", 4) == [3]
    assert pool.reserve("a", 12) == [0, 1, 2]  # no growth needed
    assert pool.reserve("b", 8) == [3, 4]      # extended in place
    pool.release("a")
    assert pool.usage()["used"] == 2 and pool.free_pages == 8
    assert pool.reserve("c", 12) == [0, 1, 2]  # lowest free run
    table = pool.page_table(["b", "c"], max_pages=4)
    assert table.tolist() == [[3, 4, 0, 0], [0, 1, 2, 0]] and table.dtype == torch.int32
    before = pool.usage()
    with pytest.raises(PoolExhausted, match="needs 6 more pages"):
        pool.reserve("d", 24)
    assert "d" not in pool.pages and pool.usage() == before  # a refused request leaves the pool as it was
    with pytest.raises(PoolExhausted):
        pool.reserve("b", 40)  # a growing request that does not fit keeps its pages
    assert pool.pages["b"] == [3, 4] and pool.usage() == before
    with pytest.raises(ValueError, match="n_tokens"):
        pool.reserve("e", -1)
    with pytest.raises(ValueError, match="power of two"):
        PagePool(4, 3)


def random_fragmented_pool(num_pages, P, rng, n_requests):
    pool = PagePool(num_pages, P)
    live = {}
    for step in range(40):
        r = rng.randrange(n_requests)
        if r in live and rng.random() < 0.3:
            pool.release(r)
            del live[r]
            continue
        want = live.get(r, 0) + rng.randint(0, 3 * P)
        try:
            pool.reserve(r, want)
            live[r] = want
        except PoolExhausted:
            pass
    return pool, live


@settings(max_examples=12)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 2, 16]), st.sampled_from([0, 2]),
       st.sampled_from([1 << 10, 1 << 30]))
def test_defrag_keeps_every_request_and_makes_runs_contiguous(seed, P, layers, scratch):
    rng = random.Random(seed)
    pool, live = random_fragmented_pool(24, P, rng, 5)
    requests = list(pool.pages)
    if not requests:
        return
    lens = [min(live.get(r, 0), pool.capacity(r)) for r in requests]
    g = torch.Generator().manual_seed(seed)
    tok = (3, 4)
    kv = make_pool(layers, 24, P, tok, torch.float32, g)
    kv2 = make_pool(0, 24, P, (5,), torch.float16, g)  # a second pool sharing the page ids (e.g. V)
    stacked = layers > 0
    table = pool.page_table(requests, device=DEVICE)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    before = kv_gather(kv, table, kv_lens, stacked=stacked)
    before2 = kv_gather(kv2, table, kv_lens)
    owned_before = {r: len(p) for r, p in pool.pages.items()}
    if stacked:
        new_table = defrag_(kv, table, kv_lens, pool, requests, stacked=True, scratch_bytes=scratch)
        defrag_check = kv_gather(kv, new_table, kv_lens, stacked=True)
        assert torch.equal(defrag_check, before)
    else:
        new_table = defrag_([kv, kv2], table, kv_lens, pool, requests, scratch_bytes=scratch)
        assert torch.equal(kv_gather(kv, new_table, kv_lens), before)
        assert torch.equal(kv_gather(kv2, new_table, kv_lens), before2)
    at = 0
    for b, r in enumerate(requests):
        pages = pool.pages[r]
        assert len(pages) == owned_before[r]
        assert pages == list(range(at, at + len(pages)))
        assert new_table[b, :len(pages)].tolist() == pages
        at += len(pages)
    assert pool.free_pages == 24 - at


@settings(max_examples=200)
@given(st.integers(1, 40), st.integers(0, 10), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_move_rounds_never_overwrite_unread_content(n_live, n_free, cap, seed):
    rng = random.Random(seed)
    num_pages = n_live + n_free
    live = rng.sample(range(num_pages), n_live)
    targets = rng.sample(range(num_pages), n_live)
    mapping = {s: d for s, d in zip(live, targets) if s != d}
    # targets must not land on live pages that stay put
    stay = {s for s, d in zip(live, targets) if s == d}
    mapping = {s: d for s, d in mapping.items() if d not in stay}
    if len(set(mapping.values())) != len(mapping):
        return
    mem = {p: ("c", p) for p in range(num_pages + 1)}  # content; page num_pages is the parking page
    rounds = _move_rounds(mapping, set(live), num_pages, cap)
    for rnd in rounds:
        assert len(rnd) <= cap
        scratch = [mem[s] for s, _ in rnd]
        for (_, d), val in zip(rnd, scratch):
            mem[d] = val
    for s, d in mapping.items():
        assert mem[d] == ("c", s)


@pytest.mark.parametrize("scratch_bytes", [1, 1 << 20])
def test_defrag_full_pool_with_a_cycle(scratch_bytes):
    """No free page and a 4-page cycle: broken through scratch (large) or the parking page (one page)."""
    pool = PagePool(4, 1, pages={"a": [1, 2], "b": [3, 0]})
    kv = torch.arange(4.0, device=DEVICE).view(4, 1, 1)
    table = pool.page_table(["a", "b"], device=DEVICE)
    lens = torch.tensor([2, 2], dtype=torch.int32, device=DEVICE)
    new_table = defrag_(kv, table, lens, pool, ["a", "b"], scratch_bytes=scratch_bytes)
    assert new_table.tolist() == [[0, 1], [2, 3]] and kv.flatten().tolist() == [1.0, 2.0, 3.0, 0.0]


def test_token_table_interop_round_trip():
    g = torch.Generator().manual_seed(1)
    page_table, _ = paged_layout([40, 17], 2, 8, generator=g)
    slots = token_table_from_page_table(page_table, 8)
    assert slots.shape == (2, page_table.shape[1] * 8)
    assert torch.equal(page_table_from_token_table(slots, 8), page_table)
    # page size 1: the token table is the page table
    assert torch.equal(page_table_from_token_table(slots, 1), slots)
    bad = slots.clone()
    bad[0, 3] += 1
    with pytest.raises(ValueError, match="aligned runs"):
        page_table_from_token_table(bad, 8)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _commit_case():
    kv = torch.zeros(6, 4, 8, device=DEVICE)
    page_table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    kv_lens = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    accept_idx = torch.tensor([[0, 1, 3, -1], [0, 2, -1, -1]], dtype=torch.int32, device=DEVICE)
    accept_len = torch.tensor([3, 2], dtype=torch.int32, device=DEVICE)
    return kv, page_table, kv_lens, accept_idx, accept_len


@pytest.mark.parametrize("change,match", [
    (lambda a: a.__setitem__(4, torch.tensor([5, 2], dtype=torch.int32, device=DEVICE)), "accept_len\\[0\\] = 5"),
    (lambda a: a[3].__setitem__((0, 1), 3), "strictly increasing"),
    (lambda a: a[3].__setitem__((1, 0), 1), "must start at 0"),
    (lambda a: a.__setitem__(1, torch.tensor([[0, 1, 2], [9, 4, 5]], dtype=torch.int32, device=DEVICE)), "out of range"),
    (lambda a: a.__setitem__(2, torch.tensor([10, 0], dtype=torch.int32, device=DEVICE)), "exceeds the page table"),
    (lambda a: a.__setitem__(3, a[3].long()), "accept_idx must have dtype"),
    (lambda a: a.__setitem__(0, a[0].transpose(0, 1)), "contiguous in its per-token dims|page size"),
])
def test_commit_validation(change, match, monkeypatch):
    monkeypatch.setattr("tritree.kernels._validate.DEBUG_CHECKS", True)
    args = list(_commit_case())
    change(args)
    with pytest.raises((ValueError, TypeError), match=match):
        kv_commit_(*args)


def test_write_and_gather_validation():
    kv, page_table, kv_lens, _, _ = _commit_case()
    with pytest.raises(ValueError, match="new must have shape"):
        kv_write_(kv, page_table, kv_lens, torch.zeros(2, 3, 9, device=DEVICE))
    with pytest.raises(TypeError, match="new must have dtype"):
        kv_write_(kv, page_table, kv_lens, torch.zeros(2, 3, 8, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="new has 3 layers, kv has 2"):
        kv_write_(kv.view(2, 3, 4, 8), page_table, kv_lens, torch.zeros(3, 2, 3, 8, device=DEVICE), stacked=True)
    with pytest.raises(ValueError, match="max_len"):
        kv_gather(kv, page_table, kv_lens, -1)
    with pytest.raises(TypeError, match="kv must be a torch.Tensor"):
        kv_gather([kv], page_table, kv_lens)


@pytest.mark.gpu
def test_gpu_real_sizes_commit_and_gather():
    """61 layers of latent pools, one 46k-token request, P = 64."""
    P, L, T = 64, 46_000, 64
    pages = (L + T + P - 1) // P
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(61, pages + 4, P, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    page_table = torch.randperm(pages + 4, device="cuda", generator=g)[:pages].view(1, pages).int()
    kv_lens = torch.tensor([L], dtype=torch.int32, device="cuda")
    idx = [0, 3, 4, 9, 15, 22, 30, 41, 50, 63]
    accept_idx = torch.tensor([idx + [-1] * (T - len(idx))], dtype=torch.int32, device="cuda")
    accept_len = torch.tensor([len(idx)], dtype=torch.int32, device="cuda")
    before = kv_gather(kv, page_table, kv_lens + T, stacked=True)
    new_lens = kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    after = kv_gather(kv, page_table, kv_lens + T, stacked=True)
    assert int(new_lens) == L + len(idx)
    assert torch.equal(after[:, :, :L], before[:, :, :L])
    for j, a in enumerate(idx):
        assert torch.equal(after[:, 0, L + j], before[:, 0, L + a])
    assert torch.equal(after[:, :, L + len(idx):], before[:, :, L + len(idx):])


@pytest.mark.gpu
@pytest.mark.parametrize("T,pattern", [(64, "tree"), (128, "shifted"), (300, "shifted")])
def test_gpu_commit_layouts_eager_graph_and_compiled(T, pattern):
    """bf16 latent rows, 61 layers, B = 16 at the launch layouts (T = 64: one chunk of 64; T = 128: one
    chunk of 128; T = 300: chunks of 128), against the reference: eager, replayed from a CUDA graph,
    and (T = 128) under torch.compile (the custom op, its returned lengths)."""
    P, B, layers = 16, 16, 61
    g = torch.Generator().manual_seed(T)
    rng = random.Random(T)
    lens = [rng.randint(0, 300) for _ in range(B)]
    page_table, num_pages = paged_layout([L + T for L in lens], B, P, extra_pages=4, generator=g)
    page_table = page_table.cuda()
    gc = torch.Generator(device="cuda").manual_seed(T)
    kv0 = torch.randn(layers, num_pages, P, 576, generator=gc, device="cuda", dtype=torch.bfloat16)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    rows, ns = [], []
    for b in range(B):
        if pattern == "shifted":
            n = T - 1 - b
            row = [0] + list(range(2, n + 1))
        else:
            row, n = random_accept(T, rng)
            row = row[:n]
        rows.append(row + [-1] * (T - len(row)))
        ns.append(len(row))
    accept_idx = torch.tensor(rows, dtype=torch.int32, device="cuda")
    accept_len = torch.tensor(ns, dtype=torch.int32, device="cuda")
    ref = kv0.clone()
    ref_lens = kv_commit_reference(ref, page_table, kv_lens, accept_idx, accept_len, stacked=True)
    kv = kv0.clone()
    assert torch.equal(kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, stacked=True), ref_lens)
    assert torch.equal(kv, ref)
    kv.copy_(kv0)
    out = torch.empty_like(kv_lens)
    kv_commit_(kv0.clone(), page_table, kv_lens, accept_idx, accept_len, stacked=True)  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, stacked=True))
    kv.copy_(kv0)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(kv, ref) and torch.equal(out, ref_lens)
    if T != 128:
        return
    kv.copy_(kv0)
    step = torch.compile(lambda *a: kv_commit_(*a, stacked=True) + 0, fullgraph=True)
    assert torch.equal(step(kv, page_table, kv_lens, accept_idx, accept_len), ref_lens)
    assert torch.equal(kv, ref)
