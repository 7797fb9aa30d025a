"""The ``"mma"`` layout of INT4 experts and its Gluon ``mma.sync`` kernels (``tritree.kernels.moe.int4_mma``): the repacked
fragments against the checkpoint layout, the round trip, the plan's splits; on an sm_90 / sm_120 GPU the whole
routed layer against the float64 reference (splits, block sizes, other ranks' ids, empty experts, poisoned
outputs, a CUDA-graph replay)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels._launch import arrival_counters, zeroed_workspace
from tritree.kernels.moe.int4 import (
    Int4Experts,
    dequantize_int4,
    kernel_layout,
    moe_int4_reference,
    quantize_int4,
    routed_experts_int4,
)

from ...conftest import HAS_GPU

M = pytest.importorskip("tritree.kernels.moe.int4_mma")

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _mma_gpu():
    return HAS_GPU and torch.cuda.get_device_capability()[0] in (9, 12)


def mma_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not _mma_gpu(), reason="needs an sm_90 / sm_120 GPU")(test))


def _experts(E, H, I, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ex = Int4Experts.quantize(torch.randn(E, I, H, generator=g) / H**0.5, torch.randn(E, I, H, generator=g) / H**0.5,
                              torch.randn(E, H, I, generator=g) / I**0.5)
    return Int4Experts(*(t.to(device) for t in (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)))


def test_repack_mma_fragments():
    """Word s of lane 4g+q in tile (m, t) holds at nibble 4h + 2j1 + j0 the weight of row 16m + 8j0 + g, column
    128t + 16s + 8j1 + 2q + h; the scales follow their rows and groups."""
    E, R, K = 2, 32, 256
    packed, scale = quantize_int4(torch.randn(E, R, K, generator=torch.Generator().manual_seed(0)))
    words, scales = M.repack_mma(packed, scale)
    assert words.shape == packed.shape and scales.shape == scale.shape
    words, scales = words.view(E, R // 16, K // 128, 32, 8), scales.view(E, R // 16, K // 128, 8, 2, 4)
    W = dequantize_int4(packed, scale, torch.float64)
    e, m, t, g, q, s, h, j1, j0 = torch.meshgrid(*(torch.arange(n) for n in (E, R // 16, K // 128, 8, 4, 8, 2, 2, 2)),
                                                 indexing="ij")
    wd = words[e, m, t, 4 * g + q, s].to(torch.int64) & 0xFFFFFFFF
    u = (wd >> (4 * (4 * h + 2 * j1 + j0))) & 15
    row, col = 16 * m + 8 * j0 + g, 128 * t + 16 * s + 8 * j1 + 2 * q + h
    rec = (u - 8).double() * scales[e, m, t, g, j0, col % 128 // 32].double()
    assert torch.equal(rec, W[e, row, col])


def test_layout_round_trip_and_dequantize():
    ex = _experts(3, 256, 256, 1)
    mma = ex.to_layout("mma")
    assert mma.layout == "mma" and mma.to_layout("mma") is mma
    back = mma.to_layout("checkpoint")
    for a, b in zip((ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale),
                    (back.w13_packed, back.w13_scale, back.w2_packed, back.w2_scale)):
        assert torch.equal(a, b)
    for a, b in zip(ex.dequantize(), mma.dequantize()):
        assert torch.equal(a, b)
    sub, lo = mma.shard_ep(1, 3)
    assert sub.layout == "mma" and lo == 1 and torch.equal(sub.dequantize()[2], ex.dequantize()[2][1:2])
    with pytest.raises(ValueError, match="checkpoint layout"):
        mma.shard_tp(0, 2)
    with pytest.raises(ValueError, match="multiples of 256"):
        _experts(1, 64, 256, 0).to_layout("mma")
    with pytest.raises(ValueError, match="layout"):
        ex.to_layout("nvfp4")


def test_mma_order():
    x = torch.arange(3 * 256).view(3, 256)
    xm = M.mma_order(x)
    n, q, s, j1, h = torch.meshgrid(*(torch.arange(v) for v in (2, 4, 8, 2, 2)), indexing="ij")
    assert torch.equal(xm[:, 128 * n + 32 * q + 4 * s + 2 * j1 + h], x[:, 128 * n + 16 * s + 8 * j1 + 2 * q + h])


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 300), topk=st.integers(1, 8), E=st.sampled_from([8, 48, 384]),
       H=st.sampled_from([256, 1024, 7168]), I=st.sampled_from([256, 512, 2048]), sms=st.sampled_from([8, 132, 188]))
def test_plan_splits_divide_the_k_tiles(N, topk, E, H, I, sms):
    p = M.plan_int4_mma(N, topk, E, H, I, sms, 384)
    assert p.block_m in (8, 16)
    assert p.gate_up_programs == M.resident_programs(p.block_m, sms) >= sms
    assert 1 <= p.down_split <= M.MAX_SPLIT and (I // 128) % p.down_split == 0 and (I // 128 // p.down_split) % 2 == 0
    assert 1 <= p.down_cols and (H // (16 * M.WARPS)) % p.down_cols == 0
    assert p.down_cols * I // 128 // p.down_split <= M.DOWN_TILES or p.down_cols == 1
    assert M.Int4MmaPlan.from_ints(p.as_ints()) == p
    M.check_plan(p, H, I, N * topk, E)


def test_check_plan_rejects_column_groups_that_do_not_divide():
    p = M.plan_int4_mma(17, 8, 384, 7168, 256, 132, 384)
    assert p.down_cols > 1  # I = 256: a column tile is 2 K tiles, so a program streams several
    with pytest.raises(ValueError, match="down_cols"):
        M.check_plan(M.Int4MmaPlan(p.block_m, p.num_blocks, 1, 1, 3), 7168, 256, 17 * 8, 384)


def test_kernel_layout_on_the_cpu_and_reference_path():
    assert kernel_layout("cpu", 7168, 2048) == "checkpoint"
    ex = _experts(4, 256, 256, 2)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [1, -1], [3, 9], [0, 0]])
    w = torch.rand(5, 2, generator=g)
    a = routed_experts_int4(x, idx, w, ex.to_layout("mma"))  # the CPU runs the float32 reference on either layout
    b = moe_int4_reference(x, idx, w, ex, dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="Int4MmaPlan"):
        routed_experts_int4(x, idx, w, ex.to_layout("mma"), plan=object())


@mma_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,topk,E,H,I", [(1, 8, 8, 512, 256), (5, 4, 16, 256, 512), (17, 8, 16, 512, 256),
                                           (40, 6, 8, 768, 256), (3, 8, 384, 1024, 256), (9, 8, 48, 512, 1024)])
@pytest.mark.parametrize("bm,programs,dsplit,dcols", [(None, None, None, None), (8, 7, 1, 2), (16, 1, 2, 4),
                                                      (8, 3000, 2, 1)])
def test_mma_layer_matches_reference(dtype, N, topk, E, H, I, bm, programs, dsplit, dcols):
    """Default plans, and gate_up's routed tiles streamed by 1, 7 and 3000 programs (items cut at odd places, a
    program over many items, programs with no tiles)."""
    ex = _experts(E, H, I, N * 7 + E, "cuda").to_layout("mma")
    g = torch.Generator().manual_seed(N)
    x = torch.randn(N, H, generator=g).to(dtype).cuda()
    idx = torch.rand(N, E + 3, generator=g).argsort(1)[:, :topk].to(torch.int32)  # ids >= E: another rank's
    idx[0, 0] = -1
    w = torch.rand(N, topk, generator=g).softmax(-1)
    idx, w = idx.cuda(), w.cuda()
    plan = None
    if bm is not None:
        auto = M.plan_int4_mma(N, topk, E, H, I, 132)
        ds = dsplit if (I // 128) % dsplit == 0 and (I // 128 // dsplit) % 2 == 0 else 1
        from tritree.kernels.moe.align import min_blocks
        dc = dcols if (H // 64) % dcols == 0 else 1
        plan = M.Int4MmaPlan(bm, min_blocks(N * topk, E, bm), programs, ds, dc)
        assert auto.num_blocks >= 1
    out = torch.full((N, H), float("nan"), dtype=dtype, device="cuda")
    routed_experts_int4(x, idx, w, ex, out=out, plan=plan)
    ref = moe_int4_reference(x, idx, w, ex)
    assert torch.isfinite(out).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], err
    assert int(arrival_counters(out.device, 1).abs().sum()) == 0
    assert not zeroed_workspace(out.device, 1).any()  # the shared items' sums set back to 0


@mma_gpu
def test_mma_skewed_rows_and_graph_replay():
    """Every token on the same experts (blocks of many rows, several blocks an expert), then the same call
    captured in a CUDA graph and replayed on new inputs."""
    E, H, I, N = 16, 512, 256, 70
    ex = _experts(E, H, I, 3, "cuda").to_layout("mma")
    x = torch.randn(N, H, device="cuda").to(torch.bfloat16)
    idx = torch.arange(8, device="cuda", dtype=torch.int32).expand(N, 8).contiguous()
    w = torch.rand(N, 8, device="cuda")
    out = torch.empty_like(x)
    routed_experts_int4(x, idx, w, ex, out=out)
    ref = moe_int4_reference(x, idx, w, ex)
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        routed_experts_int4(x, idx, w, ex, out=out)
    x.copy_(torch.randn_like(x))
    idx.copy_(torch.randint(0, E + 2, idx.shape, device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref = moe_int4_reference(x, idx, w, ex)
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.bfloat16]


@mma_gpu
@pytest.mark.parametrize("dcols", [1, 4])
def test_mma_no_local_expert_writes_zeros(dcols):
    """Every token routed to other ranks: no block owns rows, block 0's programs still arrive and the output is
    written (zeros), in column groups of one and of several tiles."""
    E, H, I, N = 8, 512, 256, 6
    ex = _experts(E, H, I, 5, "cuda").to_layout("mma")
    x = torch.randn(N, H, device="cuda").to(torch.bfloat16)
    idx = torch.full((N, 2), E + 1, device="cuda", dtype=torch.int32)
    out = torch.full_like(x, float("nan"))
    from tritree.kernels.moe.align import min_blocks
    routed_experts_int4(x, idx, torch.rand(N, 2, device="cuda"), ex, out=out,
                        plan=M.Int4MmaPlan(8, min_blocks(N * 2, E, 8), 1, 1, dcols))
    assert torch.equal(out, torch.zeros_like(out))


@mma_gpu
def test_mma_empty_batch():
    ex = _experts(4, 256, 256, 4, "cuda").to_layout("mma")
    out = routed_experts_int4(torch.zeros(0, 256, dtype=torch.bfloat16, device="cuda"),
                              torch.zeros(0, 2, dtype=torch.int32, device="cuda"), torch.zeros(0, 2, device="cuda"), ex)
    assert out.shape == (0, 256)
