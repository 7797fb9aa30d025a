"""Samples of every public op for the API fuzzer (``tests/test_api_fuzz.py``), in the style of PyTorch's
OpInfo samples: each ``sample_*`` draws one valid call (small shapes), says how to run the op and its
reference, which tensors it writes, and the dimension names of every tensor (so a mutation of one
dimension knows which arguments an error may name). ``tests/_api_fuzz_checks.py`` runs them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from hypothesis import strategies as st

import tritree
from tritree import testing as TT

from .kernels.test_tree_mask import loop_reference

SM_SCALE = 0.07
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


@dataclass
class Sample:
    """One valid call of a public op.

    ``tensors``: contiguous inputs by argument name (outputs given to the op included); ``dims``: a
    name per dimension of each tensor (an int: a size fixed by the op; a name shared by several tensors:
    sizes that must agree; a name of one tensor: free); ``run(t)``: the op on tensors ``t``;
    ``reference(t)``: the expected result on contiguous copies ``t`` (written tensors updated in place);
    ``check(got, want)``: compares ``run``'s result with ``reference``'s; ``written``: tensors the op
    writes; ``lead``: tensors whose trailing dims must stay one contiguous run (how many leading dims a
    layout may pad or reorder); ``strided_last``: tensors the op reads through the stride of their last
    dimension too; ``values``: value mutations the op must refuse (name -> function of the tensors that
    returns the broken tensors)."""

    op: str
    tensors: dict[str, torch.Tensor | None]
    dims: dict[str, tuple]
    run: Callable[[dict], Any]
    reference: Callable[[dict], Any]
    check: Callable[[Any, Any], None]
    written: tuple[str, ...] = ()
    lead: dict[str, int] = field(default_factory=dict)  # the KV pools' per-token dims: any rank, one run
    strided_last: tuple[str, ...] = ()
    any_dtype: tuple[str, ...] = ()  # tensors the op takes in any dtype of its family (KV pools it only moves)
    contiguous: tuple[str, ...] = ()  # tensors the op requires contiguous (placed at an offset only)
    check_written: Callable[[torch.Tensor, torch.Tensor], None] | None = None  # a written tensor vs the reference's
    values: dict[str, Callable[[dict], dict]] = field(default_factory=dict)
    scalars: dict[str, list] = field(default_factory=dict)  # scalar argument -> invalid values (run_scalar)
    run_scalar: Callable[[dict, str, Any], Any] | None = None


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------

def close(got: torch.Tensor, want: torch.Tensor, dtype, what: str):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: elements not written (NaN poison left)"
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin) and torch.equal(got[~fin], want[~fin]), f"{what}: infinities"
    if fin.any():
        err = (got[fin] - want[fin]).norm() / want[fin].norm().clamp_min(1e-30)
        assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


def equal(got, want, what: str):
    assert torch.equal(got.detach().cpu(), want.detach().cpu()), f"{what}: {got} != {want}"


def _d(t: torch.Tensor | None):
    return None if t is None else (t.double() if t.is_floating_point() else t)


# ------------------------------------------------------------------------------------------------
# Samples
# ------------------------------------------------------------------------------------------------

def _lists(draw, n, lo, hi, extra=()):
    pick = st.integers(lo, hi) if not extra else st.one_of(st.integers(lo, hi), st.sampled_from(extra))
    return draw(st.lists(pick, min_size=n, max_size=n))


def _set(t: dict, name: str, b: int, value: int, col: int | None = None) -> dict:
    x = t[name].clone()
    if col is None:
        x[b] = value
    else:
        x[b, col] = value
    return {**t, name: x}


def sample_verify_mla(draw, device) -> Sample:
    B, T, H = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 3))
    P = draw(st.sampled_from([1, 4, 16]))
    kv_lens = _lists(draw, B, 0, 40, (0, 1, P))
    tree_lens = draw(st.none() | st.lists(st.integers(0, T), min_size=B, max_size=B))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    kinds = tuple(draw(st.lists(st.sampled_from(TT.TREE_KINDS), min_size=1, max_size=2)))
    case = TT.random_verify_inputs(B, T, H, P, kv_lens, tree_lens, kinds, dtype, seed=draw(st.integers(0, 2**20)),
                                   fragmented=draw(st.booleans()), device=device)
    give_out, give_lse, return_lse = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    as_plan = draw(st.booleans())
    t = dict(case)
    t["out"] = torch.full((B, T, H, 512), float("nan"), dtype=dtype, device=device) if give_out else None
    t["lse"] = torch.full((B, T, H), float("nan"), device=device) if give_lse else None
    names = ("q", "kv", "page_table", "kv_lens", "tree_mask")

    def run(t):
        kw = dict(tree_lens=t["tree_lens"], out=t["out"], lse=t["lse"], return_lse=return_lse)
        if as_plan:
            plan = tritree.VerifyPlan(*(t[n] for n in names), t["tree_lens"], sm_scale=SM_SCALE, out=t["out"],
                                      lse=t["lse"])
            return plan.run(*(t[n] for n in names), **kw)
        return tritree.verify_mla(*(t[n] for n in names), sm_scale=SM_SCALE, **kw)

    def reference(t):
        out, lse = tritree.verify_mla_reference(*(_d(t[n]) for n in names), sm_scale=SM_SCALE,
                                                tree_lens=t["tree_lens"], return_lse=True)
        if t["out"] is not None:
            t["out"].copy_(out)
        if t["lse"] is not None:
            t["lse"].copy_(lse)
        return (out, lse) if return_lse else out

    def check(got, want):
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w, what in zip(got, want, ("out", "lse")):
            close(g, w, dtype if what == "out" else torch.float32, what)

    num_pages = case["kv"].shape[0]
    values = {
        "kv_lens": lambda t: _set(t, "kv_lens", B - 1, -1),
        "page_table": lambda t: _set(t, "page_table", 0, num_pages, 0) if tree_lens is None else _set(
            _set(t, "page_table", 0, num_pages, 0), "tree_lens", 0, T),  # a page in use
    }
    if tree_lens is not None:
        values["tree_lens"] = lambda t: _set(t, "tree_lens", 0, T + 1)
    return Sample("verify_mla", t, dict(q=("B", "T", "H", 576), kv=("N", "P", 576), page_table=("B", "M"),
                                        kv_lens=("B",), tree_mask=("B", "T", "W"), tree_lens=("B",),
                                        out=("B", "T", "H", 512), lse=("B", "T", "H")),
                  run, reference, check, written=("out", "lse"), strided_last=("lse",), values=values,
                  scalars={"sm_scale": [float("nan"), "0.1", None]},
                  run_scalar=lambda t, k, v: tritree.verify_mla(*(t[n] for n in names), sm_scale=v,
                                                                tree_lens=t["tree_lens"]))


def sample_draft_attention(draw, device) -> Sample:
    B, S = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 8]))
    Hkv, group, D = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([16, 32]))
    P = draw(st.sampled_from([1, 4, 16]))
    ctx_lens = _lists(draw, B, 0, 40, (0, 1, P))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    window = draw(st.none() | st.integers(1, 20))
    return_lse, as_plan = draw(st.booleans()), draw(st.booleans())
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    page_table, num_pages = TT.paged_layout([max(1, L) for L in ctx_lens], B, P, extra_pages=1, generator=g)
    Hq = Hkv * group
    t = dict(q=torch.randn(B, S, Hq, D, generator=g), k_cache=torch.randn(num_pages, P, Hkv, D, generator=g),
             v_cache=torch.randn(num_pages, P, Hkv, D, generator=g), page_table=page_table,
             ctx_lens=torch.tensor(ctx_lens, dtype=torch.int32), k_blk=torch.randn(B, S, Hkv, D, generator=g),
             v_blk=torch.randn(B, S, Hkv, D, generator=g))
    t = {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in t.items()}
    names = tuple(t)

    def run(t):
        if as_plan:
            plan = tritree.DraftAttentionPlan(*(t[n] for n in names), sm_scale=D**-0.5, window=window)
            return plan.run(*(t[n] for n in names), return_lse=return_lse)
        return tritree.draft_attention(*(t[n] for n in names), sm_scale=D**-0.5, window=window,
                                       return_lse=return_lse)

    def reference(t):
        return tritree.draft_attention_reference(*(_d(t[n]) for n in names), sm_scale=D**-0.5, window=window,
                                                 return_lse=return_lse)

    def check(got, want):
        got, want = (got, want) if return_lse else ((got,), (want,))
        for gg, w, what in zip(got, want, ("out", "lse")):
            close(gg, w, dtype if what == "out" else torch.float32, what)

    values = {"ctx_lens": lambda t: _set(t, "ctx_lens", 0, -1),
              "page_table": lambda t: _set(_set(t, "page_table", B - 1, -1, 0), "ctx_lens", B - 1, 1)}
    return Sample("draft_attention", t, dict(q=("B", "S", "Hq", "D"), k_cache=("N", "P", "Hkv", "D"),
                                             v_cache=("N", "P", "Hkv", "D"), page_table=("B", "M"), ctx_lens=("B",),
                                             k_blk=("B", "S", "Hkv", "D"), v_blk=("B", "S", "Hkv", "D")),
                  run, reference, check, values=values,
                  scalars={"sm_scale": [float("inf"), "x"], "window": [0, -3, 2.5]},
                  run_scalar=lambda t, k, v: tritree.draft_attention(
                      *(t[n] for n in names), **{"sm_scale": D**-0.5, "window": window, k: v}))


def _kv_pool(draw, device, T_max=6):
    stacked = draw(st.booleans())
    layers = draw(st.integers(1, 2)) if stacked else 1
    B, P = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 8]))
    tok = draw(st.sampled_from([(1,), (5,), (32,), (2, 3)]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int8]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    T = draw(st.integers(1, T_max))
    kv_lens = _lists(draw, B, 0, 20, (0, P))
    page_table, num_pages = TT.paged_layout([L + T for L in kv_lens], B, P, extra_pages=1, generator=g)
    shape = ((layers,) if stacked else ()) + (num_pages, P) + tok
    kv = (torch.randn(shape, generator=g) * 50).to(dtype)
    lead = (3 if stacked else 2)
    return dict(stacked=stacked, layers=layers, B=B, P=P, T=T, tok=tok, dtype=dtype, g=g, kv=kv.to(device),
                page_table=page_table.to(device), kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
                num_pages=num_pages, lead=lead)


def _kv_dims(c):
    layer = ("L",) if c["stacked"] else ()
    tok = tuple(f"E{i}" for i in range(len(c["tok"])))
    return layer, tok


def sample_kv_write_(draw, device) -> Sample:
    c = _kv_pool(draw, device)
    B, T, stacked = c["B"], c["T"], c["stacked"]
    layer, tok = _kv_dims(c)
    new_shape = ((c["layers"],) if stacked else ()) + (B, T) + c["tok"]
    new = (torch.randn(new_shape, generator=c["g"]) * 50).to(c["dtype"]).to(device)
    tree_lens = draw(st.none() | st.lists(st.integers(0, T), min_size=B, max_size=B))
    t = dict(kv=c["kv"], page_table=c["page_table"], kv_lens=c["kv_lens"], new=new,
             tree_lens=None if tree_lens is None else torch.tensor(tree_lens, dtype=torch.int32, device=device))
    names = ("kv", "page_table", "kv_lens", "new", "tree_lens")

    def run(t):
        return tritree.kv_write_(*(t[n] for n in names), stacked=stacked)

    def reference(t):
        return tritree.kv_write_reference(*(t[n] for n in names), stacked=stacked)

    def bad_page(t):  # a page in use (request 0 writes at least its first row)
        t = _set(t, "page_table", 0, c["num_pages"], 0)
        return t if tree_lens is None else _set(t, "tree_lens", 0, T)

    values = {"kv_lens": lambda t: _set(t, "kv_lens", 0, -1), "page_table": bad_page}
    if tree_lens is not None:
        values["tree_lens"] = lambda t: _set(t, "tree_lens", B - 1, T + 1)
    return Sample("kv_write_", t, dict(kv=layer + ("N", "P") + tok, page_table=("B", "M"), kv_lens=("B",),
                                       new=layer + ("B", "T") + tok, tree_lens=("B",)),
                  run, reference, lambda got, want: equal(got, want, "kv"), written=("kv",),
                  lead={"kv": c["lead"]}, strided_last=("new",), values=values)


def _random_accept(T, rng):
    n = rng.randint(0, T)
    rest = sorted(rng.sample(range(1, T), max(0, n - 1))) if n > 0 else []
    idx = ([0] + rest) if n > 0 else []
    return idx + [-1] * (T - len(idx)), len(idx)


def sample_kv_commit_(draw, device) -> Sample:
    c = _kv_pool(draw, device, T_max=9)
    B, T, stacked = c["B"], c["T"], c["stacked"]
    layer, tok = _kv_dims(c)
    rng = random.Random(draw(st.integers(0, 2**20)))
    acc = [_random_accept(T, rng) for _ in range(B)]
    t = dict(kv=c["kv"], page_table=c["page_table"], kv_lens=c["kv_lens"],
             accept_idx=torch.tensor([a for a, _ in acc], dtype=torch.int32, device=device),
             accept_len=torch.tensor([n for _, n in acc], dtype=torch.int32, device=device))
    names = ("kv", "page_table", "kv_lens", "accept_idx", "accept_len")

    def run(t):
        return tritree.kv_commit_(*(t[n] for n in names), stacked=stacked)

    def reference(t):
        return tritree.kv_commit_reference(*(t[n] for n in names), stacked=stacked)

    values = {"kv_lens": lambda t: _set(t, "kv_lens", 0, -1),
              "accept_len": lambda t: _set(t, "accept_len", 0, T + 1),
              "accept_idx": lambda t: _set(_set(t, "accept_idx", B - 1, T, 0), "accept_len", B - 1, 1)}
    return Sample("kv_commit_", t, dict(kv=layer + ("N", "P") + tok, page_table=("B", "M"), kv_lens=("B",),
                                        accept_idx=("B", "T"), accept_len=("B",)),
                  run, reference, lambda got, want: equal(got, want, "new kv_lens"), written=("kv",),
                  lead={"kv": c["lead"]}, any_dtype=("kv",), values=values)


def sample_kv_gather(draw, device) -> Sample:
    c = _kv_pool(draw, device)
    stacked = c["stacked"]
    layer, tok = _kv_dims(c)
    max_len = draw(st.none() | st.integers(0, 30))
    t = dict(kv=c["kv"], page_table=c["page_table"], kv_lens=c["kv_lens"])
    names = tuple(t)
    values = {"kv_lens": lambda t: _set(t, "kv_lens", 0, -1),
              "page_table": lambda t: _set(_set(t, "page_table", 0, -5, 0), "kv_lens", 0, 1)}
    return Sample("kv_gather", t, dict(kv=layer + ("N", "P") + tok, page_table=("B", "M"), kv_lens=("B",)),
                  lambda t: tritree.kv_gather(*(t[n] for n in names), max_len, stacked=stacked),
                  lambda t: tritree.kv_gather_reference(*(t[n] for n in names), max_len, stacked=stacked),
                  lambda got, want: equal(got, want, "gathered"), lead={"kv": c["lead"]}, any_dtype=("kv",),
                  values=values,
                  scalars={"max_len": [-1, 2.5, "3"]},
                  run_scalar=lambda t, k, v: tritree.kv_gather(*(t[n] for n in names), v, stacked=stacked))


def sample_tree_mask_from_parents(draw, device) -> Sample:
    B, T = draw(st.integers(0, 3)), draw(st.integers(1, 40))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    kinds = tuple(draw(st.lists(st.sampled_from(TT.TREE_KINDS), min_size=1, max_size=3)))
    parents = TT.random_trees(B, T, kinds, generator=g).to(draw(st.sampled_from([torch.int32, torch.int64])))
    tree_lens = draw(st.none() | st.lists(st.integers(0, T), min_size=B, max_size=B))
    t = dict(parents=parents.to(device),
             tree_lens=None if tree_lens is None else torch.tensor(tree_lens, dtype=torch.int32, device=device))

    def check(got, want):
        equal(got[0], want[0], "tree_mask")
        equal(got[1], want[1], "depth")

    def bad_parents(t):  # a root with a parent, or a node its own parent (in a row that is not padding)
        t = _set(t, "parents", 0, 0, 0) if T == 1 else _set(t, "parents", 0, T - 1, T - 1)
        return t if t["tree_lens"] is None else _set(t, "tree_lens", 0, T)

    values = {"parents": bad_parents}
    if tree_lens is not None:
        values["tree_lens"] = lambda t: _set(t, "tree_lens", 0, T + 1)
    if B == 0:
        values = {}
    return Sample("tree_mask_from_parents", t, dict(parents=("B", "T"), tree_lens=("B",)),
                  lambda t: tritree.tree_mask_from_parents(t["parents"], t["tree_lens"]),
                  lambda t: loop_reference(t["parents"].cpu(), torch.full((B,), T) if t["tree_lens"] is None
                                           else t["tree_lens"].cpu()),
                  check, strided_last=("parents",), values=values)


def sample_build_tree(draw, device) -> Sample:
    B, D, Vv = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 30))
    budget = draw(st.integers(1, 24))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    logits = (torch.randn(B, D, Vv, generator=g) * 3).to(draw(st.sampled_from(FLOATS)))
    roots = torch.randint(0, Vv, (B,), generator=g).to(draw(st.sampled_from([torch.int32, torch.int64])))
    t = dict(draft_logits=logits.to(device), root_tokens=roots.to(device))

    def check(got, want):
        got = type(want)(*(x.cpu() for x in got))
        assert torch.allclose(got.scores, want.scores, rtol=1e-6, atol=1e-6, equal_nan=True), "scores"
        equal(got.tree_lens, want.tree_lens, "tree_lens")
        if all(torch.equal(a, b) for a, b in zip(got, want)):
            return
        # Two candidates whose scores differ by a rounding (the kernel's log-softmax is not the
        # reference's bit for bit) may be taken in either order: then the kernel's tree must be a
        # best-first tree of its own, node scores those of the reference within rounding.
        lp = torch.log_softmax(t["draft_logits"].cpu().double(), -1)
        for b in range(B):
            n = int(want.tree_lens[b])
            seen = set()
            for i in range(1, n):
                p, tok, d = int(got.parents[b, i]), int(got.tokens[b, i]), int(got.depth[b, i])
                assert 0 <= p < i and d == int(got.depth[b, p]) + 1 and (p, tok) not in seen, f"tree {b}: node {i}"
                seen.add((p, tok))
                assert abs(float(got.scores[b, p]) + float(lp[b, d - 1, tok]) - float(got.scores[b, i])) < 1e-5, \
                    f"tree {b}: node {i}'s score"
            for name in ("tokens", "parents", "depth"):  # padding as the reference's
                equal(getattr(got, name)[b, n:], getattr(want, name)[b, n:], name)
        equal(got.tree_mask, tritree.tree_mask_from_parents(got.parents, got.tree_lens)[0], "tree_mask")

    def bad_logits(t):
        x = t["draft_logits"].clone()
        x[0, 0, 0] = float("nan")
        return {**t, "draft_logits": x}

    return Sample("build_tree", t, dict(draft_logits=("B", "D", "V"), root_tokens=("B",)),
                  lambda t: tritree.build_tree(t["draft_logits"], budget, t["root_tokens"]),
                  lambda t: tritree.build_tree_reference(t["draft_logits"].cpu(), budget, t["root_tokens"].cpu()),
                  check, strided_last=("draft_logits",),
                  values={"root_tokens": lambda t: _set(t, "root_tokens", B - 1, Vv), "draft_logits": bad_logits},
                  scalars={"budget": [0, -2, 2.0, True, None]},
                  run_scalar=lambda t, k, v: tritree.build_tree(t["draft_logits"], v, t["root_tokens"]))


def _draw_tree(draw, device, vocab):
    """A batch of random trees for the acceptance walk: (B, T, generator, dict of tokens, parents, tree_lens)."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 20))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    kinds = tuple(draw(st.lists(st.sampled_from(TT.TREE_KINDS), min_size=1, max_size=3)))
    parents = TT.random_trees(B, T, kinds, generator=g)
    tokens = torch.randint(0, vocab, (B, T), generator=g, dtype=torch.int32)
    tree_lens = torch.tensor(_lists(draw, B, 0, T, (T,)), dtype=torch.int32)
    return B, T, g, dict(tokens=tokens.to(device), parents=parents.to(device), tree_lens=tree_lens.to(device))


def _bad_parents(T):
    """A root with a parent, or a node after its parent, in a row that is not padding."""
    def bad(t):
        t = _set(t, "parents", 0, 0, 0) if T == 1 else _set(t, "parents", 0, T, T - 1)
        return _set(t, "tree_lens", 0, T)
    return bad


def sample_accept_tree(draw, device) -> Sample:
    Vv = draw(st.integers(2, 12))
    B, T, g, t = _draw_tree(draw, device, Vv)
    logits = torch.randn(B, T, Vv, generator=g).to(draw(st.sampled_from(FLOATS)))
    t["target_logits"] = logits.to(device)
    names = tuple(t)

    def reference(t):
        picks = t["target_logits"].cpu().float().argmax(-1).to(torch.int32)
        return (*tritree.accept_tree_reference(t["tokens"].cpu(), t["parents"].cpu(), t["tree_lens"].cpu(), picks),
                picks)

    def check(got, want):
        for a, b, what in zip(got, want, ("accept_idx", "accept_len", "bonus", "picks")):
            equal(a, b, what)

    return Sample("accept_tree", t, dict(tokens=("B", "T"), parents=("B", "T"), tree_lens=("B",),
                                         target_logits=("B", "T", "V")),
                  lambda t: tritree.accept_tree(*(t[n] for n in names)), reference, check,
                  strided_last=("target_logits",),
                  values={"tree_lens": lambda t: _set(t, "tree_lens", 0, T + 1), "parents": _bad_parents(T)},
                  scalars={"temperature": [-1.0, float("nan"), "hot"], "top_k": [0, 1.5], "top_p": [0.0, 1.5]},
                  run_scalar=lambda t, k, v: tritree.accept_tree(*(t[n] for n in names), **{k: v}))


def sample_accept_picks(draw, device) -> Sample:
    Vv = draw(st.integers(1, 4))
    B, T, g, t = _draw_tree(draw, device, Vv)
    t["picks"] = torch.randint(0, Vv, (B, T), generator=g, dtype=torch.int32).to(device)
    names = tuple(t)

    def check(got, want):
        for a, b, what in zip(got, want, ("accept_idx", "accept_len", "bonus")):
            equal(a, b, what)

    return Sample("accept_picks", t, dict(tokens=("B", "T"), parents=("B", "T"), tree_lens=("B",), picks=("B", "T")),
                  lambda t: tritree.accept_picks(*(t[n] for n in names)),
                  lambda t: tritree.accept_tree_reference(*(t[n].cpu() for n in names)), check,
                  values={"tree_lens": lambda t: _set(t, "tree_lens", 0, T + 1), "parents": _bad_parents(T)})


def sample_embed_rows(draw, device) -> Sample:
    R, H = draw(st.integers(1, 12)), draw(st.integers(1, 80))
    n, start = draw(st.integers(0, 7)), draw(st.integers(0, 20))
    rows = draw(st.integers(0, R))
    scale = draw(st.sampled_from([1.0, 0.5, 3.0]))
    dtype = draw(st.sampled_from(FLOATS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    t = dict(table=torch.randn(R, H, generator=g).to(dtype).to(device),
             tokens=torch.randint(0, start + R + 3, (1, n), generator=g).to(device))

    def call(t, **kw):
        opts = dict(start=start, rows=rows, scale=scale)
        opts.update(kw)
        return tritree.embed_rows(t["table"], t["tokens"], **opts)

    return Sample("embed_rows", t, dict(table=("R", "H"), tokens=("m", "n")), call,
                  lambda t: tritree.embed_rows_reference(t["table"].cpu(), t["tokens"].cpu(), start, rows, scale),
                  lambda got, want: close(got, want, dtype, "out"),
                  lead={"tokens": 2}, strided_last=("tokens",),  # ids of any shape and strides
                  scalars={"start": [-1, 1.5, None], "rows": [R + 1, -1, 2.0], "scale": [float("nan"), "2"]},
                  run_scalar=lambda t, k, v: call(t, **{k: v}))


def sample_token_tables(draw, device) -> Sample:
    B, n_pages = draw(st.integers(0, 3)), draw(st.integers(1, 5))
    P = draw(st.sampled_from([1, 2, 8]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    page_table = torch.randperm(64, generator=g)[:B * n_pages].view(B, n_pages).to(torch.int32)
    max_tokens = draw(st.none() | st.integers(0, n_pages * P))
    t = dict(page_table=page_table.to(device))

    def run(t):
        slots = tritree.token_table_from_page_table(t["page_table"], P, max_tokens)
        back = tritree.page_table_from_token_table(slots, P) if max_tokens is None else None
        return slots, back

    def reference(t):
        pt = t["page_table"].cpu().long()
        slots = (pt[:, :, None] * P + torch.arange(P)).reshape(B, n_pages * P)
        slots = slots if max_tokens is None else slots[:, :max_tokens]
        return slots.to(torch.int32), (pt.to(torch.int32) if max_tokens is None else None)

    def check(got, want):
        equal(got[0], want[0], "slots")
        if want[1] is not None:
            equal(got[1], want[1], "page_table back")

    return Sample("token_table_from_page_table", t, dict(page_table=("B", "M")), run, reference, check,
                  strided_last=("page_table",),
                  scalars={"page_size": [0, 3, -4, 2.0, None], "max_tokens": [-1, 1.5]},
                  run_scalar=lambda t, k, v: tritree.token_table_from_page_table(
                      t["page_table"], **{"page_size": P, "max_tokens": max_tokens, k: v}))


def sample_page_table_from_token_table(draw, device) -> Sample:
    B, n_pages = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    P = draw(st.sampled_from([1, 2, 4]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    pages = torch.randperm(32, generator=g)[:B * n_pages].view(B, n_pages).long()
    S = draw(st.integers(1, n_pages * P))
    slots = (pages[:, :, None] * P + torch.arange(P)).reshape(B, n_pages * P)[:, :S]
    slots = slots.to(draw(st.sampled_from([torch.int32, torch.int64])))
    kv_lens = torch.tensor(_lists(draw, B, 0, S), dtype=torch.int32)
    t = dict(req_to_token=slots.to(device), kv_lens=kv_lens.to(device))

    def bad_slots(t):
        x = t["req_to_token"].clone()
        x[0, 0] = x[0, 0] + 1
        return {**t, "req_to_token": x, "kv_lens": torch.full_like(t["kv_lens"], S)}

    return Sample("page_table_from_token_table", t, dict(req_to_token=("B", "S"), kv_lens=("B",)),
                  lambda t: tritree.page_table_from_token_table(t["req_to_token"], P, t["kv_lens"]),
                  lambda t: pages.to(torch.int32)[:, :-(-S // P)],
                  lambda got, want: equal(got, want, "page_table"), strided_last=("req_to_token",),
                  values={"req_to_token": bad_slots} if P > 1 else {"kv_lens": lambda t: _set(t, "kv_lens", 0, S + 1)},
                  scalars={"page_size": [0, 3, 2.0, None]},
                  run_scalar=lambda t, k, v: tritree.page_table_from_token_table(t["req_to_token"], v, t["kv_lens"]))


def sample_expected_accept(draw, device) -> Sample:
    B, T = draw(st.integers(0, 3)), draw(st.integers(0, 40))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    scores = -torch.rand(B, T, generator=g).cumsum(1) * 2
    if T and B:
        scores[:, -draw(st.integers(0, T)):] = float("-inf")  # padding
    t = dict(scores=scores.to(device))

    def reference(t):
        p = torch.exp(t["scores"].cpu().double())
        p[:, :1] = 0
        return p.cumsum(1)

    return Sample("expected_accept", t, dict(scores=("B", "T")), lambda t: tritree.expected_accept(t["scores"]),
                  reference, lambda got, want: close(got, want, torch.float32, "expected_accept"),
                  strided_last=("scores",))


def sample_routed_experts_int4(draw, device) -> Sample:
    from tritree.kernels.moe.int4 import Int4Experts

    E, H, I = draw(st.integers(1, 4)), draw(st.sampled_from([32, 64])), draw(st.sampled_from([32, 64]))
    N, k = draw(st.integers(0, 12)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    ex = Int4Experts.quantize(torch.randn(E, I, H, generator=g) * H**-0.5, torch.randn(E, I, H, generator=g) * H**-0.5,
                              torch.randn(E, H, I, generator=g) * I**-0.5)
    idx = torch.randint(-1, E + 1, (N, k), generator=g, dtype=torch.int32)  # -1 and E: another rank's experts
    t = dict(x=torch.randn(N, H, generator=g).to(dtype), topk_idx=idx, topk_w=torch.rand(N, k, generator=g),
             w13_packed=ex.w13_packed, w13_scale=ex.w13_scale, w2_packed=ex.w2_packed, w2_scale=ex.w2_scale,
             out=torch.full((N, H), float("nan")).to(dtype) if draw(st.booleans()) else None)
    t = {n: None if x is None else x.to(device) for n, x in t.items()}
    w = ("w13_packed", "w13_scale", "w2_packed", "w2_scale")

    def run(t):
        return tritree.routed_experts_int4(t["x"], t["topk_idx"], t["topk_w"], Int4Experts(*(t[n] for n in w)),
                                           out=t["out"])

    def reference(t):
        ref = tritree.moe_int4_reference(t["x"].cpu(), t["topk_idx"].cpu(), t["topk_w"].cpu(),
                                         Int4Experts(*(t[n].cpu() for n in w)))
        if t["out"] is not None:
            t["out"].copy_(ref)
        return ref

    tol = {torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]  # weights and h rounded to x's dtype before the MMA

    def check(got, want):
        got, want = got.detach().cpu().double(), want.cpu().double()  # want: the fp64 result or a copy into out
        assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert not torch.isnan(got).any(), "elements not written"
        if not want.numel():
            return
        err = (got - want).norm() / want.norm().clamp_min(1e-30)
        assert err <= tol or want.norm() == 0 and got.abs().max() == 0, f"relative error {err:.3g} > {tol}"

    return Sample("routed_experts_int4", t, dict(x=("N", "H"), topk_idx=("N", "k"), topk_w=("N", "k"),
                                                 w13_packed=("E", "I2", "H8"), w13_scale=("E", "I2", "H32"),
                                                 w2_packed=("E", "H", "I8"), w2_scale=("E", "H", "I32"),
                                                 out=("N", "H")),
                  run, reference, check, written=("out",), contiguous=w, check_written=check)


def sample_moe_route(draw, device) -> Sample:
    E = draw(st.sampled_from([8, 16, 32]))
    n_group = draw(st.sampled_from([g for g in (1, 2, 4) if E // g >= 2]))
    topk_group = draw(st.integers(1, n_group))
    top_k = draw(st.integers(1, min(4, topk_group * (E // n_group))))
    H, B, T = draw(st.sampled_from([16, 48])), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    N = B * T
    dtype = draw(st.sampled_from(FLOATS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    with_lens = draw(st.booleans())
    t = dict(x=torch.randn(N, H, generator=g).to(dtype), weight=(torch.randn(E, H, generator=g) * H**-0.5).to(dtype),
             bias=torch.randn(E, generator=g) * 0.1 if draw(st.booleans()) else None,
             tree_lens=torch.randint(0, T + 1, (B,), generator=g, dtype=torch.int32) if with_lens else None,
             logits_out=torch.full((N, E), float("nan")) if draw(st.booleans()) else None)
    t = {n: None if x is None else x.to(device) for n, x in t.items()}
    opts = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, scaling=2.5, expert_offset=draw(st.integers(0, 3)))

    def call(t, **over):
        kw = {**opts, **over}
        return tritree.moe_route(t["x"], t["weight"], t["bias"], tree_lens=t["tree_lens"],
                                 rows_per_request=T if t["tree_lens"] is not None else None,
                                 logits_out=t["logits_out"], **kw)

    def reference(t):
        c = {n: None if x is None else x.cpu() for n, x in t.items()}
        lg = torch.empty(N, E, dtype=torch.float64)
        idx, w = tritree.moe_route_reference(c["x"], c["weight"], c["bias"], tree_lens=c["tree_lens"],
                                             rows_per_request=T if c["tree_lens"] is not None else None,
                                             logits_out=lg, **opts)
        if t["logits_out"] is not None:
            t["logits_out"].copy_(lg)
        return idx, w, lg

    def check(got, want):
        (idx, w), (ridx, rw, lg) = got, want
        idx, w = idx.cpu(), w.cpu()
        assert idx.shape == ridx.shape and w.shape == rw.shape, "shapes"
        assert idx.dtype == torch.int32 and w.dtype == torch.float32, "dtypes"
        pad = torch.zeros(N, dtype=torch.bool)
        if t["tree_lens"] is not None:
            pad = (torch.arange(N) % T) >= t["tree_lens"].cpu().long().repeat_interleave(T)
        assert torch.equal(idx[pad], ridx[pad]) and torch.equal(w[pad], rw[pad]), "padding rows"
        # Picks: the same choices as the reference's (a different id only at a tie within rounding).
        choice = torch.sigmoid(lg) + (0 if t["bias"] is None else t["bias"].cpu().double())
        got_c = choice.gather(1, (idx[~pad] + opts["expert_offset"]).long()) if (~pad).any() else None
        if got_c is not None:
            want_c = choice.gather(1, (ridx[~pad] + opts["expert_offset"]).long())
            assert torch.allclose(got_c, want_c, atol=2e-2 if dtype != torch.float32 else 1e-5), "picks"
            assert torch.allclose(w[~pad].double(), rw[~pad].double(), atol=3e-2, rtol=3e-2), "weights"

    def check_logits(view, want):
        close(view, want, torch.float32 if dtype == torch.float32 else torch.bfloat16, "logits_out")

    return Sample("moe_route", t, dict(x=("N", "H"), weight=("E", "H"), bias=("E",), tree_lens=("B",),
                                       logits_out=("N", "E")),
                  call, reference, check, written=("logits_out",), check_written=check_logits,
                  contiguous=("bias", "tree_lens"),
                  scalars={"top_k": [0, E + 1, 2.0], "n_group": [0, 3 * E], "scaling": [float("nan"), "2"],
                           "expert_offset": [1.5]},
                  run_scalar=lambda t, k, v: call(t, **{k: v}))


SAMPLES = {s.__name__.removeprefix("sample_"): s for s in (
    sample_verify_mla, sample_draft_attention, sample_kv_write_, sample_kv_commit_, sample_kv_gather,
    sample_tree_mask_from_parents, sample_build_tree, sample_accept_tree, sample_accept_picks, sample_embed_rows,
    sample_token_tables,
    sample_page_table_from_token_table, sample_expected_accept, sample_routed_experts_int4, sample_moe_route)}
