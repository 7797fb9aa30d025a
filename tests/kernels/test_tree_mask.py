"""tree_mask_from_parents against a plain loop."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree import tree_mask_from_parents
from tritree.testing import TREE_KINDS, random_trees

from ..conftest import DEVICE


def loop_reference(parents, tree_lens):
    B, T = parents.shape
    W = (T + 31) // 32
    mask = torch.zeros(B, T, W, dtype=torch.int64)
    depth = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for i in range(int(tree_lens[b])):
            j, d = i, 0
            while j >= 0:
                mask[b, i, j // 32] |= 1 << (j % 32)
                j = int(parents[b, j])
                d += 1
            depth[b, i] = d - 1
    mask = torch.where(mask >= 2**31, mask - 2**32, mask).to(torch.int32)
    return mask, depth.to(torch.int32)


@settings(max_examples=60)
@given(B=st.integers(1, 4), T=st.integers(1, 130), kinds=st.lists(st.sampled_from(TREE_KINDS), min_size=1, max_size=4),
       padded=st.booleans(), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_matches_loop(B, T, kinds, padded, seed, data):
    g = torch.Generator().manual_seed(seed)
    parents = random_trees(B, T, tuple(kinds), generator=g)
    tree_lens = torch.tensor(data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B)) if padded else [T] * B,
                             dtype=torch.int32)
    mask, depth = tree_mask_from_parents(parents.to(DEVICE), tree_lens.to(DEVICE) if padded else None)
    ref_mask, ref_depth = loop_reference(parents, tree_lens)
    assert mask.dtype == torch.int32 and mask.shape == (B, T, (T + 31) // 32)
    assert torch.equal(mask.cpu(), ref_mask)
    assert torch.equal(depth.cpu(), ref_depth)


@pytest.mark.parametrize("kind", ["chain", "random", "star"])
def test_t1024(kind):
    g = torch.Generator().manual_seed(0)
    parents = random_trees(2, 1024, (kind,), generator=g)
    mask, depth = tree_mask_from_parents(parents.to(DEVICE))
    ref_mask, ref_depth = loop_reference(parents, [1024, 1024])
    assert torch.equal(mask.cpu(), ref_mask) and torch.equal(depth.cpu(), ref_depth)
    if kind == "chain":
        assert int(depth[0, -1]) == 1023


def test_no_host_sync_on_values_when_not_debug(monkeypatch):
    """Bad parents raise on CPU inputs; the op itself is pure tensor code (no .item() in the math)."""
    parents = torch.tensor([[-1, 0, 5]], dtype=torch.int32)
    with pytest.raises(ValueError, match="parents\\[0\\]"):
        tree_mask_from_parents(parents)
    import tritree.kernels._validate as V
    monkeypatch.setattr(V, "values_checkable", lambda *t: False)
    mask, depth = tree_mask_from_parents(parents)  # treated as "no parent": node 2 is its own root
    assert int(mask[0, 2, 0]) == 4 and int(depth[0, 2]) == 0


def test_bad_inputs():
    with pytest.raises(TypeError, match="parents must have dtype"):
        tree_mask_from_parents(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="parents must have 2 dimensions"):
        tree_mask_from_parents(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="tree_lens must have shape"):
        tree_mask_from_parents(torch.tensor([[-1, 0]], dtype=torch.int32), torch.tensor([2, 2], dtype=torch.int32))
