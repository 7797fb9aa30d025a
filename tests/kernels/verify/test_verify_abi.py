"""The verify kernels' one argument list (``kernels.verify.abi``): every kernel's signature is the ABI's, every
launch passes what its kernel takes, and the family registers one ``torch.library`` op."""

import inspect

import pytest
import torch

from tritree.kernels.configs import AttnConfig
from tritree.kernels.verify import abi
from tritree.kernels.verify import gluon_launch as GL
from tritree.kernels.verify.triton_kernel import _verify_mla_kernel, launch_config


def _kernels():
    if not GL.GLUON_AVAILABLE:
        pytest.skip(f"this triton has no Gluon: {GL._IMPORT_ERROR!r}")
    return {"triton": _verify_mla_kernel, "gluon": GL._verify_gluon_kernel, "gluon-ws": GL._verify_gluon_ws_kernel,
            "gluon-mma": GL._verify_gluon_mma_kernel}


def _params(fn, constexpr: bool) -> tuple:
    """The names of ``fn``'s runtime (or constexpr) parameters, from its Python source (a jitted kernel, or the
    interpreter's wrapper of one)."""
    sig = inspect.signature(fn.fn)
    return tuple(n for n, p in sig.parameters.items() if ("constexpr" in str(p.annotation)) == constexpr)


@pytest.mark.parametrize("kernel", abi.KERNELS)
def test_kernel_signatures_are_the_abi(kernel):
    fn = _kernels()[kernel]
    assert _params(fn, False) == abi.arg_names(kernel)
    assert set(abi.DIVISIBLE) <= set(abi.arg_names(kernel))
    descs = {n: "tensordesc<bf16[64,64]>" for n in abi.DESCRIPTORS[kernel]}
    assert tuple(abi.signature(kernel, q="bf16", kv="bf16", out="fp32", descriptors=descs)) == abi.arg_names(kernel)


@pytest.mark.parametrize("kernel", abi.KERNELS)
def test_scalar_args_fill_the_abi(kernel):
    """The builder's arguments are exactly those after the kernel's tensors and descriptors."""
    B, T, H = 2, 3, 4
    q = torch.zeros(B, T, H, 576, dtype=torch.bfloat16)
    kv = torch.zeros(5, 16, 576, dtype=torch.bfloat16)
    args = abi.scalar_args(kernel, q, kv, torch.zeros(B, 6, dtype=torch.int32), torch.zeros(B, T, 1, dtype=torch.int32),
                           (1, 2, 3, 4), (5, 6, 7, 8), sm_scale=0.5, kv_scale=None, num_splits=3, narrow_splits=2)
    after = abi.arg_names(kernel)[2 + len(abi.DESCRIPTORS[kernel]) + len(abi.TENSORS):]
    assert len(args) == len(after)
    named = dict(zip(after, args))
    assert (named["T"], named["H"], named["num_splits"], named["max_pages"], named["num_pages"]) == (T, H, 3, 6, 5)
    assert (named["stride_ob"], named["stride_os"], named["stride_lb"], named["stride_ls"]) == (1, 4, 5, 8)
    assert named.get("narrow_splits", 2) == 2


def test_launches_pass_every_constexpr():
    """The Triton launch names every constexpr of its kernel (defaulted ones too); the Gluon launches name only
    constexprs their kernel has."""
    fns = _kernels()
    cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True)
    _, cx, _ = launch_config(cfg, num_splits=2, tma=True, batch=1, T=8, H=8, d_lat=512, d_pe=64,
                             q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, page_size=64)
    assert set(cx) == set(_params(fns["triton"], True))
    for kernel in abi.GLUON_KERNELS:
        for P, splits, T in ((64, 1, 8), (1, 4, 65), (128, 15, 65)):
            g = GL.plan_verify_gluon(kernel=kernel, batch=1, T=T, H=8, page_size=P, num_splits=splits, num_sms=132,
                                     pdl_capable=True)
            assert set(dict(g.constexprs)) <= set(_params(fns[kernel], True))
            assert g.fn is fns[kernel]


def test_one_library_op():
    import tritree.kernels.verify  # noqa: F401  (registers the op)

    assert hasattr(torch.ops.tritree, "verify_mla")
    for gone in ("verify_mla_out", "verify_mla_gluon"):
        with pytest.raises((AttributeError, RuntimeError)):
            getattr(torch.ops.tritree, gone)


def test_compiled_call_runs_the_eager_plan():
    """Under torch.compile (fullgraph) ``verify_mla`` is the one op, which runs the eager plan: the same bits as
    the eager call, with and without outputs given, with an explicit config and split count."""
    from tritree import verify_mla
    from tritree.kernels._launch import uses_kernel
    from tritree.testing import random_verify_inputs

    case = random_verify_inputs(1, 5, 2, 16, [40], kinds=("random",))
    if not uses_kernel(case["q"].device):
        pytest.skip("the reference path is traced inline")
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    cfg = AttnConfig(16, 16, 4, 1)
    kw = dict(sm_scale=0.1, tree_lens=case["tree_lens"], config=cfg, num_splits=2, return_lse=True)
    ref, ref_lse = verify_mla(*args, **kw)
    torch._dynamo.reset()
    out, lse = torch.compile(lambda *a: verify_mla(*a, **kw), backend="aot_eager", fullgraph=True)(*args)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    o, g = torch.empty_like(ref), torch.empty_like(ref_lse)
    torch.compile(lambda *a: verify_mla(*a, out=o, lse=g, **kw), backend="aot_eager", fullgraph=True)(*args)
    assert torch.equal(o, ref) and torch.equal(g, ref_lse)


def test_split_kernel_writes_the_partials_run_merges():
    """``VerifyPlan.split_kernel`` (the benchmarks' and the Gluon tests' kernel alone) writes the partials that
    ``run`` merges: merged by the split merge they give ``run``'s output."""
    from tritree.kernels._launch import uses_kernel
    from tritree.kernels._splitkv import combine_splits
    from tritree.kernels.verify import VerifyPlan
    from tritree.testing import random_verify_inputs

    case = random_verify_inputs(1, 5, 2, 16, [40], kinds=("random",))
    if not uses_kernel(case["q"].device):
        pytest.skip("the reference path launches no kernel")
    args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"], case["tree_lens"])
    plan = VerifyPlan(*args, sm_scale=0.1, config=AttnConfig(16, 16, 4, 1), num_splits=3)
    ref, ref_lse = plan.run(*args, return_lse=True)
    part_o, part_l = plan.split_kernel(*args)
    assert part_o.shape[:2] == (1, 3) and part_l.shape[:2] == (1, 3)
    out, lse = torch.empty_like(ref), torch.empty_like(ref_lse)
    combine_splits(part_o, part_l, out, lse)
    assert torch.allclose(out, ref) and torch.allclose(lse, ref_lse)
    one = VerifyPlan(*args, sm_scale=0.1, config=AttnConfig(16, 16, 4, 1), num_splits=1)
    o1, l1 = one.split_kernel(*args)
    assert torch.equal(o1, one.run(*args))
