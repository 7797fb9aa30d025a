"""The eager per-call path of every op: a plan built once per static signature, then launches without host
syncs; the explicit plan objects; outputs without lse. (CPU: the launches are recorded, not run, where the
test is about the host path; elsewhere the interpreter runs them.)"""

import importlib

import pytest
import torch

import tritree
from tritree.kernels import _launch
from tritree.testing import random_verify_inputs

from ..conftest import DEVICE, HAS_GPU

vm = importlib.import_module("tritree.kernels.verify.launcher")
da = importlib.import_module("tritree.kernels.draft_attention")
kvc = importlib.import_module("tritree.kernels.kv_cache")
tree = importlib.import_module("tritree.kernels.tree")
accept = importlib.import_module("tritree.kernels.accept")

SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero")


def _inputs():
    g = torch.Generator().manual_seed(0)
    v = random_verify_inputs(2, 9, 3, 16, [40, 17], [9, 5], ("random", "chain"), torch.float32, seed=1)
    q = torch.randn(2, 4, 4, 32, generator=g)
    kc = torch.randn(6, 16, 2, 32, generator=g)
    blk = torch.randn(2, 4, 2, 32, generator=g)
    ctx = torch.tensor([30, 40], dtype=torch.int32)
    pt = torch.arange(6, dtype=torch.int32).view(2, 3)
    new = torch.randn(2, 9, 576, generator=g)
    idx = torch.full((2, 9), -1, dtype=torch.int32)
    idx[:, :3] = torch.tensor([0, 2, 5])
    n = torch.tensor([3, 1], dtype=torch.int32)
    logits = torch.randn(2, 3, 50, generator=g)
    roots = torch.tensor([1, 2], dtype=torch.int32)
    target = torch.randn(2, 9, 50, generator=g)
    tokens = torch.randint(0, 50, (2, 9), dtype=torch.int32, generator=g)
    parents = torch.tensor([[-1] + list(range(8))] * 2, dtype=torch.int32)
    tl_ = torch.tensor([9, 4], dtype=torch.int32)
    return {
        "verify_mla": lambda: tritree.verify_mla(v["q"], v["kv"], v["page_table"], v["kv_lens"], v["tree_mask"],
                                                 sm_scale=0.1, tree_lens=v["tree_lens"]),
        "draft_attention": lambda: tritree.draft_attention(q, kc, kc, pt, ctx, blk, blk, sm_scale=0.2, window=20),
        "kv_write_": lambda: tritree.kv_write_(v["kv"], v["page_table"], v["kv_lens"], new, v["tree_lens"]),
        "kv_commit_": lambda: tritree.kv_commit_(v["kv"], v["page_table"], v["kv_lens"], idx, n),
        "build_tree": lambda: tritree.build_tree(logits, 6, roots),
        "accept_tree": lambda: tritree.accept_tree(tokens, parents, tl_, target),
    }


CACHES = {"verify_mla": vm._PLANS, "draft_attention": da._PLANS, "kv_write_": kvc._WRITE_PLANS,
          "kv_commit_": kvc._COMMIT_PLANS, "build_tree": tree._BUILD_PLANS, "accept_tree": accept._ACCEPT_PLANS}


@pytest.mark.skipif(HAS_GPU, reason="CPU: the interpreter's launches are recorded, not run")
@pytest.mark.parametrize("op", sorted(CACHES))
def test_repeated_call_builds_no_plan_and_syncs_nothing(op, monkeypatch):
    """A second call of the same signature reuses its plan, and the call path (validation, plan lookup,
    buffers, launches) reads no tensor value on the host: with value checks off (as for GPU inputs without
    ``TRITREE_DEBUG``), every host-reading tensor method raises during the call."""
    launches = []
    monkeypatch.setattr(_launch.KernelLauncher, "__call__", lambda self, grid, *a: launches.append(self.fn))
    monkeypatch.setattr(tritree.kernels._validate, "checks_values", lambda device: False)
    call = _inputs()[op]
    call()  # builds the plan (and may read values: e.g. the reference path)
    builds = CACHES[op].builds
    n_launches = len(launches)
    for name in SYNCING:
        def refuse(*a, _name=name, **k):
            raise AssertionError(f"Tensor.{_name} called on the per-call path")
        monkeypatch.setattr(torch.Tensor, name, refuse)
    call()
    monkeypatch.undo()
    assert CACHES[op].builds == builds, "a repeated call built a new plan"
    assert len(launches) == 2 * n_launches and n_launches >= 1


def test_verify_plan_object_runs_its_signature_and_refuses_others():
    v = random_verify_inputs(1, 5, 2, 16, [33], [5], ("random",), torch.float32, seed=2, device=DEVICE)
    args = (v["q"], v["kv"], v["page_table"], v["kv_lens"], v["tree_mask"], v["tree_lens"])
    plan = tritree.VerifyPlan(*args, sm_scale=0.1, config=tritree.AttnConfig(16, 16, 4, 1), num_splits=2)
    assert plan.launch.num_splits == 2 and plan.launch.route in ("triton", "reference")
    out, lse = plan.run(*args, return_lse=True)
    ref, ref_lse = tritree.verify_mla_reference(*(a.double() if a.is_floating_point() else a for a in args[:5]),
                                                sm_scale=0.1, tree_lens=v["tree_lens"], return_lse=True)
    assert (out.double() - ref).abs().max() < 1e-4 and (lse.double() - ref_lse).abs().max() < 1e-4
    with pytest.raises(ValueError, match="do not match this plan"):
        plan.run(v["q"][:, :4], *args[1:])
    with pytest.raises(ValueError, match="out must have"):
        plan.run(*args, out=torch.empty(1, 5, 2, 512, dtype=torch.float16, device=DEVICE))


def test_out_without_lse_and_lse_without_out():
    v = random_verify_inputs(2, 7, 2, 16, [50, 9], [7, 3], ("random", "wide"), torch.float32, seed=3, device=DEVICE)
    args = (v["q"], v["kv"], v["page_table"], v["kv_lens"], v["tree_mask"])
    kw = dict(sm_scale=0.1, tree_lens=v["tree_lens"], config=tritree.AttnConfig(16, 16, 4, 1), num_splits=3)
    ref, ref_lse = tritree.verify_mla(*args, return_lse=True, **kw)
    out = torch.full_like(ref, float("nan"))
    assert tritree.verify_mla(*args, out=out, **kw) is out
    assert torch.equal(out, ref)
    lse = torch.full_like(ref_lse, float("nan"))
    got, got_lse = tritree.verify_mla(*args, lse=lse, return_lse=True, **kw)
    assert got_lse is lse and torch.equal(got, ref) and torch.equal(lse, ref_lse)


def test_plan_cache_info_counts_builds():
    info = tritree.plan_cache_info()
    assert set(info) >= set(CACHES)
    assert all(v["builds"] >= v["plans"] >= 0 for v in info.values())
    tritree.clear_plan_caches()
    assert all(v["plans"] == 0 for v in tritree.plan_cache_info().values())


def test_stream_scratch_is_fresh_inside_a_capture_and_shared_otherwise():
    made = []
    scratch = _launch.StreamScratch(lambda: made.append(1) or torch.empty(1))
    a = scratch.get(torch.device("cpu"))
    assert scratch.get(torch.device("cpu")) is a and len(made) == 1


def test_length_and_token_values_out_of_range_are_refused():
    """Value ranges checked alike by every op that takes them (CPU inputs; GPU inputs with TRITREE_DEBUG=1):
    tree_lens in [0, T], root tokens inside the vocabulary."""
    v = random_verify_inputs(2, 9, 3, 16, [40, 17], [9, 5], ("random", "chain"), torch.float32, seed=1)
    new = torch.randn(2, 9, 576)
    for bad in ([10, 5], [-1, 5]):
        tl_ = torch.tensor(bad, dtype=torch.int32)
        with pytest.raises(ValueError, match="tree_lens"):
            tritree.kv_write_(v["kv"], v["page_table"], v["kv_lens"], new, tl_)
        with pytest.raises(ValueError, match="tree_lens"):
            tritree.verify_mla(v["q"], v["kv"], v["page_table"], v["kv_lens"], v["tree_mask"], sm_scale=0.1,
                               tree_lens=tl_)
        with pytest.raises(ValueError, match="tree_lens"):
            tritree.tree_mask_from_parents(torch.tensor([[-1] + list(range(8))] * 2, dtype=torch.int32), tl_)
        with pytest.raises(ValueError, match="tree_lens"):
            tritree.accept_tree(torch.zeros(2, 9, dtype=torch.int32),
                                torch.tensor([[-1] + list(range(8))] * 2, dtype=torch.int32), tl_, torch.randn(2, 9, 50))
    logits = torch.randn(2, 3, 50)
    for bad in ([50, 1], [0, -1]):
        with pytest.raises(ValueError, match="root_tokens"):
            tritree.build_tree(logits, 4, torch.tensor(bad, dtype=torch.int32))


@pytest.mark.parametrize("which", ["tokens", "parents", "both"])
def test_accept_tree_reads_views_of_wider_buffers_by_their_strides(which):
    """``tokens`` / ``parents`` as column slices of wider int32 buffers (their last dim contiguous): the
    kernel reads each by its own row stride and writes only its outputs (the buffers' other columns keep
    their values), matching the reference walk."""
    g = torch.Generator().manual_seed(5)
    B, T, V = 3, 7, 20
    tokens = torch.randint(0, V, (B, T), dtype=torch.int32, generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]] * B, dtype=torch.int32)
    tree_lens = torch.tensor([7, 4, 1], dtype=torch.int32)
    target = torch.randn(B, T, V, generator=g)
    target[:, :, 0] += 5.0  # the target mostly picks token 0
    tokens[:, 1:] = torch.where(torch.rand(B, T - 1, generator=g) < 0.6, 0, tokens[:, 1:])
    want = tritree.accept_tree(tokens, parents, tree_lens, target)
    wide_t = torch.full((B, 3 * T), 77, dtype=torch.int32)
    wide_p = torch.full((B, 2 * T + 5), 88, dtype=torch.int32)
    wide_t[:, T:2 * T] = tokens
    wide_p[:, 5:5 + T] = parents
    t_in = wide_t[:, T:2 * T] if which in ("tokens", "both") else tokens
    p_in = wide_p[:, 5:5 + T] if which in ("parents", "both") else parents
    got = tritree.accept_tree(t_in.to(DEVICE), p_in.to(DEVICE), tree_lens.to(DEVICE), target.to(DEVICE))
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())
    assert (wide_t[:, :T] == 77).all() and (wide_t[:, 2 * T:] == 77).all() and (wide_p[:, :5] == 88).all()


def test_set_debug_switches_the_value_checks_of_gpu_inputs():
    from tritree.kernels import _validate as V

    cuda = torch.device("cuda")
    before = tritree.set_debug(True)
    try:
        assert V.checks_values(cuda) and V.debug_checks_enabled()
        assert tritree.set_debug(False) is True
        assert not V.checks_values(cuda) and V.checks_values(torch.device("cpu"))
        with pytest.raises(TypeError, match="enabled"):
            tritree.set_debug("1")
    finally:
        tritree.set_debug(before)


def test_a_plan_built_under_the_interpreter_is_not_reused_without_it(monkeypatch):
    """Kernel or reference is decided when a plan is built: a CPU call after ``TRITON_INTERPRET`` is unset takes
    the reference path, not the interpreted kernel of the plan cached under it (and back again)."""
    if DEVICE.type != "cpu":
        pytest.skip("the interpreter's switch acts on CPU tensors")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 32, generator=g), torch.randn(16, 32, generator=g)
    launches = []
    real = _launch.KernelLauncher.__call__
    monkeypatch.setattr(_launch.KernelLauncher, "__call__", lambda self, *a, **k: launches.append(1) or real(self, *a, **k))
    for env, kernel in (("1", True), ("0", False), ("1", True)):
        monkeypatch.setenv("TRITON_INTERPRET", env)
        n = len(launches)
        torch.testing.assert_close(tritree.linear(x, w), x @ w.t(), rtol=1e-4, atol=1e-4)
        assert (len(launches) > n) == kernel, env
