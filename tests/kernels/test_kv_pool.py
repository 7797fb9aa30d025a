"""PagePool: random reserve / release sequences keep the pool consistent, a refused reservation changes
nothing, and bad arguments are refused naming them (defrag_'s too)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree import PagePool, PoolExhausted, defrag_, kv_gather, kv_write_

OPS = st.lists(st.tuples(st.sampled_from(["reserve", "release"]), st.integers(0, 5), st.integers(0, 70)),
               max_size=60)


@settings(max_examples=150)
@given(num_pages=st.integers(1, 24), page_size=st.sampled_from([1, 2, 8]), ops=OPS)
def test_random_reserve_release_keeps_the_pool_consistent(num_pages, page_size, ops):
    pool = PagePool(num_pages, page_size)
    want: dict[int, int] = {}  # request -> tokens it holds room for
    for op, r, n in ops:
        if op == "release":
            pool.release(r)
            want.pop(r, None)
            continue
        before = ({k: list(v) for k, v in pool.pages.items()}, pool.free_pages)
        need = -(-n // page_size) - len(pool.pages.get(r, []))
        try:
            pages = pool.reserve(r, n)
        except PoolExhausted:
            assert need > before[1]
            assert ({k: list(v) for k, v in pool.pages.items()}, pool.free_pages) == before, "a refusal changed the pool"
            continue
        assert need <= before[1]
        assert pages[:len(before[0].get(r, []))] == before[0].get(r, []), "a request's pages only grow at the end"
        want[r] = max(want.get(r, 0), n)
        assert pool.capacity(r) >= want[r]
    owned = [p for ps in pool.pages.values() for p in ps]
    assert len(owned) == len(set(owned)), "a page owned twice"
    assert all(0 <= p < num_pages for p in owned)
    assert len(owned) + pool.free_pages == num_pages
    for r in list(pool.pages):
        pool.release(r)
    assert pool.free_pages == num_pages


@pytest.mark.parametrize("kw,err,name", [
    (dict(num_pages=0, page_size=4), ValueError, "num_pages"),
    (dict(num_pages=4.0, page_size=4), TypeError, "num_pages"),
    (dict(num_pages=4, page_size=3), ValueError, "page_size"),
    (dict(num_pages=4, page_size="4"), TypeError, "page_size"),
    (dict(num_pages=4, page_size=4, pages={0: [4]}), ValueError, "page id"),
    (dict(num_pages=4, page_size=4, pages={0: [1], 1: [1]}), ValueError, "owned twice"),
    (dict(num_pages=4, page_size=4, pages=[[0]]), TypeError, "pages"),
])
def test_bad_pool_arguments_are_refused(kw, err, name):
    with pytest.raises(err, match=name):
        PagePool(**kw)


def test_bad_reserve_and_table_arguments_are_refused():
    pool = PagePool(4, 2, pages={"a": [2, 3]})
    assert pool.free_pages == 2
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="n_tokens"):
            pool.reserve("b", bad)
    with pytest.raises(TypeError, match="max_pages"):
        pool.page_table(["a"], max_pages=2.0)
    with pytest.raises(ValueError, match="max_pages"):
        pool.page_table(["a"], max_pages=1)


def test_defrag_refuses_negative_kv_lens_as_the_other_kv_ops_do():
    pool = PagePool(4, 2, pages={"a": [2, 3], "b": [0]})
    kv = torch.arange(8.0).view(4, 2, 1)
    table = pool.page_table(["a", "b"])
    lens = torch.tensor([2, -1], dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_lens") as other:
        kv_write_(kv.clone(), table, lens, torch.zeros(2, 1, 1))
    with pytest.raises(ValueError, match="kv_lens") as got:
        kv_gather(kv, table, lens)
    assert str(got.value) == str(other.value)
    before = ({r: list(p) for r, p in pool.pages.items()}, kv.clone())
    with pytest.raises(ValueError, match="kv_lens") as got:
        defrag_(kv, table, lens, pool, ["a", "b"])
    assert str(got.value) == str(other.value) == "kv_lens must be >= 0, got [2, -1]"
    assert pool.pages == before[0] and torch.equal(kv, before[1]), "a refused defrag_ changed the pool"
