"""Builders of random inputs (trees, paged layouts) shared by the tests, benchmarks and demos."""

from __future__ import annotations

import torch

TREE_KINDS = ("random", "chain", "star", "wide")


def random_parents(kind: str, T: int, generator: torch.Generator | None = None) -> list[int]:
    """Parents (parents-first order, root -1) of a tree of ``T`` nodes of the given shape."""
    if kind == "chain":
        return [-1] + list(range(T - 1))
    if kind == "star":
        return [-1] + [0] * (T - 1)
    if kind == "wide":  # DDTree-like: a few deep paths with siblings near the root
        return [-1] + [max(0, i - 1 - (i % 3)) for i in range(1, T)]
    if kind == "random":
        return [-1] + [int(torch.randint(0, i, (), generator=generator)) for i in range(1, T)]
    raise ValueError(f"unknown tree kind {kind!r}; known: {TREE_KINDS}")


def random_trees(B: int, T: int, kinds=("random",), generator=None, device="cpu") -> torch.Tensor:
    """``[B, T]`` int32 parents, request b of shape ``kinds[b % len(kinds)]``."""
    rows = [random_parents(kinds[b % len(kinds)], T, generator) for b in range(B)]
    return torch.tensor(rows, dtype=torch.int32, device=device).view(B, T)  # [0, T] when B = 0


def paged_layout(capacity_tokens: list[int] | int, B: int, page_size: int, *, extra_pages: int = 0,
                 fragmented: bool = True, generator=None, device="cpu"):
    """A page table giving request b room for ``capacity_tokens[b]`` tokens.

    Returns ``(page_table [B, max_pages] int32, num_pages)``. Pages are a random permutation of the
    pool when ``fragmented`` (plus ``extra_pages`` unused ones), else contiguous ascending runs.
    Unused table entries point at page 0 (valid, never read)."""
    if isinstance(capacity_tokens, int):
        capacity_tokens = [capacity_tokens] * B
    pages_per = [max(1, -(-c // page_size)) for c in capacity_tokens]
    max_pages = max(pages_per)
    total = sum(pages_per)
    num_pages = total + extra_pages
    order = torch.randperm(num_pages, generator=generator) if fragmented else torch.arange(num_pages)
    table = torch.zeros(B, max_pages, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = order[at:at + n].to(torch.int32)
        at += n
    return table.to(device), num_pages


def random_verify_inputs(B: int, T: int, H: int, P: int, kv_lens: list[int], tree_lens: list[int] | None = None,
                         kinds=("random",), dtype=torch.float32, *, seed: int = 0, fragmented: bool = True,
                         device="cpu") -> dict:
    """Random inputs of :func:`tritree.verify_mla`: ``q, kv, page_table, kv_lens, tree_mask, tree_lens``
    (``tree_lens`` None when not given). Request b holds ``kv_lens[b] + T`` tokens in its pages."""
    from .kernels.tree import tree_mask_from_parents

    g = torch.Generator().manual_seed(seed)
    parents = random_trees(B, T, kinds, generator=g)
    page_table, num_pages = paged_layout([L + T for L in kv_lens], B, P, extra_pages=2, fragmented=fragmented,
                                         generator=g)
    kv = torch.randn(num_pages, P, 576, generator=g).to(dtype)
    q = torch.randn(B, T, H, 576, generator=g).to(dtype)
    kv_lens_t = torch.tensor(kv_lens, dtype=torch.int32)
    tree_lens_t = None if tree_lens is None else torch.tensor(tree_lens, dtype=torch.int32)
    tree_mask, _ = tree_mask_from_parents(parents, tree_lens_t)
    out = dict(q=q, kv=kv, page_table=page_table, kv_lens=kv_lens_t, tree_mask=tree_mask, tree_lens=tree_lens_t)
    return {k: (None if v is None else v.to(device)) for k, v in out.items()}
