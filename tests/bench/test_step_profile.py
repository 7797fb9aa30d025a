"""The analysis of ``bench/step_profile.py`` on the CPU: kernel names to families, per-replay gaps and spans,
the per-layer difference, the floors and the table; and its command line without a GPU."""

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.step_profile import (
    MERGE,
    OTHER,
    analyse,
    attention_bytes,
    average,
    budget_table,
    classify,
    expected_unique,
    families_of,
    family_order,
    floor_rows,
    group_by_launch,
    idle_and_span,
    kernel_table,
    layer_bytes,
    layer_difference,
    param_nbytes,
    split_replays,
    step_bytes,
    summarize_replay,
)
from tritree.model.config import kimi_k26
from tritree.model.kimi_k2 import param_shapes
from tritree.roofline import Ceilings, verify_mla_counts

ROOT = Path(__file__).resolve().parents[2]

NAMES = {
    "experts (routed + shared)": ["_gate_up_int4_kernel", "_down_int4_kernel", "_align_kernel", "_gate_up_kernel", "_down_kernel"],
    "router": [
        "_route_kernel", "_route_topk_kernel",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_tn_align1>(cutlass_80_simt_sgemm_128x64_8x5_tn_align1"
        "::Params)",
        "ampere_sgemm_64x32_sliced1x4_tn",
        "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, "
        "unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int, at::cuda::detail::TensorInfo<float, "
        "unsigned int>, unsigned int, at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int)",
        "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>("
        "at::cuda::detail::TensorInfo<float, unsigned int>, unsigned int, unsigned int, unsigned int, unsigned int, "
        "at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int, at::native::GTOp<float, true>)",
        "void at::native::mbtopk::radixFindKthValues<float, unsigned int, unsigned int, 2>(at::cuda::detail::TensorInfo"
        "<float const, unsigned int>, unsigned int, unsigned int*, unsigned int, unsigned int, unsigned int, int, int, "
        "unsigned int, unsigned int, unsigned int*, short*, unsigned int*, unsigned int*, unsigned int*)",
        "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >(cublasGemmSmallNParams"
        "<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>)",
    ],
    "projections (dense GEMMs)": [
        "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNN",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x"
        "_cublas",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>"
        "(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float const*, "
        "float const*, __nv_bfloat16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*)",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_"
        "tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched"
        "<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float> >(...)",
    ],
    "norms": [
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, "
        "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
        "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16, true>(long, float, "
        "c10::BFloat16 const*, float*, float*)",
    ],
    "verify attention": ["_verify_mla_kernel", "_verify_gluon_kernel", "_verify_gluon_ws_kernel",
                         "_verify_gluon_mma_kernel"],
    "draft attention": ["_draft_attention_kernel"],
    "tree/accept": ["_topk_bound_kernel", "_topk_select_kernel", "_ddtree_kernel", "_greedy_accept_kernel",
                    "_walk_kernel", "_gumbel_pick_kernel"],
    "KV writes/commit": ["_kv_write_kernel", "_kv_commit_kernel", "_kv_gather_kernel", "_page_copy_kernel"],
    "elementwise": [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >("
        "int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
        "<c10::BFloat16> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<c10::BFloat16> const&)::{lambda(int)#1}>"
        "(int, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<c10::BFloat16> >(at::TensorIteratorBase&, "
        "at::native::CUDAFunctor_add<c10::BFloat16> const&)::{lambda(int)#1})",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
        "long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
        "unsigned int, 4, 64, 64>(...)",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...> >(long, ...)",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, ...>(int, ...)",
        "triton_poi_fused_add_mul_silu_0", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
    ],
    "copies": [
        "Memcpy DtoD (Device -> Device)", "Memset (Device)",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel"
        "_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda"
        "(float)#1}> >(at::TensorIteratorBase&, ...)",
    ],
    OTHER: ["some_new_kernel", "void foo::bar<int>(int)"],
}


@pytest.mark.parametrize("family,name", [(f, n) for f, ns in NAMES.items() for n in ns])
def test_classify_real_names(family, name):
    assert classify(name) == family


def test_every_decode_kernel_of_the_repository_has_a_family():
    """Each jit kernel of tritree/kernels (its packages too); the load-time dequantisation kernels are not in a
    decode step."""
    found = []
    for path in sorted((ROOT / "tritree" / "kernels").rglob("*.py")):
        found += re.findall(r"@(?:triton|gluon)\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+_kernel)\(", path.read_text())
    assert "_gate_up_int4_kernel" in found and "_verify_gluon_ws_kernel" in found
    missing = [k for k in found if k not in ("_int4_kernel", "_fp8_kernel") and classify(k) == OTHER]
    assert missing == []


def test_split_merge_takes_the_attention_before_it():
    ev = [("_combine_kernel", 0, 1), ("_verify_gluon_ws_kernel", 1, 2), ("_combine_kernel", 2, 3),
          ("nvjet_tst_64x8", 3, 4), ("_draft_attention_kernel", 4, 5), ("_combine_kernel", 5, 6)]
    assert classify("_combine_kernel") == MERGE
    assert families_of(ev) == ["verify attention", "verify attention", "verify attention",
                               "projections (dense GEMMs)", "draft attention", "draft attention"]


def test_family_order_lists_each_family_once_other_last():
    order = family_order()
    assert len(order) == len(set(order)) and order[-1] == OTHER and MERGE not in order
    assert set(NAMES) == set(order)


@pytest.mark.parametrize("events,idle,span", [
    ([], 0.0, 0.0),
    ([("a", 0, 10), ("b", 12, 20), ("c", 25, 30)], 7.0, 30.0),  # two gaps
    ([("a", 0, 10), ("b", 10, 20)], 0.0, 20.0),  # back to back
    ([("a", 0, 10), ("b", 5, 8), ("c", 9, 15), ("d", 20, 22)], 5.0, 22.0),  # b inside a, c overlapping a (PDL)
    ([("d", 20, 22), ("a", 0, 10), ("c", 9, 15), ("b", 5, 8)], 5.0, 22.0),  # the same, unsorted
    ([("a", 100, 150)], 0.0, 50.0),
])
def test_idle_and_span(events, idle, span):
    assert idle_and_span(events) == pytest.approx((idle, span))


def _replay(t0, extra=()):
    """A synthetic replay starting at t0: 2 norms, 1 GEMM, 1 verify + merge, 1 copy, an unknown kernel."""
    ev = [("Memcpy DtoD (Device -> Device)", 0, 1), ("vectorized_layer_norm_kernel<c10::BFloat16, float, true>", 2, 4),
          ("nvjet_tst_64x8_64x16", 4, 14), ("_verify_gluon_ws_kernel", 15, 45), ("_combine_kernel", 44, 47),
          ("vectorized_layer_norm_kernel<c10::BFloat16, float, true>", 48, 50), ("mystery", 50, 51)] + list(extra)
    return [(n, t0 + s, t0 + e) for n, s, e in ev]


def test_summarize_replay_counts_times_and_gaps():
    r = summarize_replay(list(reversed(_replay(1000.0))))
    f = r["families"]
    assert f["norms"] == {"count": 2, "us": pytest.approx(4.0)}
    assert f["verify attention"] == {"count": 2, "us": pytest.approx(33.0)}  # the merge counted with it
    assert f["copies"]["count"] == 1 and f["projections (dense GEMMs)"]["us"] == pytest.approx(10.0)
    assert r["other"] == {"mystery": 1}
    assert r["kernels"] == 7 and r["kernel_us"] == pytest.approx(1 + 2 + 10 + 30 + 3 + 2 + 1)
    assert r["idle_us"] == pytest.approx(1 + 1 + 1) and r["span_us"] == pytest.approx(51.0)
    # a merge is named by the family it serves: the draft's and the verify's merges apart
    drafted = summarize_replay(_replay(0.0) + [("_draft_attention_kernel", 60, 62), ("_combine_kernel", 62, 63)])
    assert drafted["names"]["_combine_kernel (verify attention)"] == {"count": 1, "us": pytest.approx(3.0),
                                                                     "family": "verify attention"}
    assert drafted["names"]["_combine_kernel (draft attention)"]["family"] == "draft attention"
    assert "_combine_kernel" not in drafted["names"]


def test_split_replays_at_the_largest_gaps_and_group_by_launch():
    replays = [_replay(t) for t in (0.0, 500.0, 1000.0)]
    flat = [e for r in replays for e in r]
    random.Random(0).shuffle(flat)
    assert split_replays(flat, 3) == replays
    assert split_replays(flat, 1) == [sorted(flat, key=lambda e: (e[1], e[2]))]
    with pytest.raises(ValueError):
        split_replays(flat[:2], 3)
    # by correlation id: launches 7, 9, 11; a prologue fill (id 8) before the second replay is left out
    tagged = [e + (c,) for r, c in zip(replays, (7, 9, 11)) for e in r] + [("FillFunctor", 499.0, 499.5, 8)]
    random.Random(1).shuffle(tagged)
    assert group_by_launch(tagged, {7, 9, 11, 13}, 3) == replays
    assert group_by_launch(tagged, {7, 9}, 3) is None


def _profiles():
    a = average([summarize_replay(_replay(t)) for t in (0.0, 100.0)])
    # one more layer: another norm (2 us), GEMM (10 us) and verify (30 us), with a 3 us gap before it
    more = [("vectorized_layer_norm_kernel<c10::BFloat16, float, true>", 54, 56), ("nvjet_tst_64x8", 56, 66),
            ("_verify_gluon_ws_kernel", 66, 96)]
    b = average([summarize_replay(_replay(t, more)) for t in (0.0, 100.0)])
    return a, b


def test_average_and_layer_difference():
    a, b = _profiles()
    assert a["replays"] == 2 and a["spans_us"] == [51.0, 51.0] and a["kernel_counts"] == [7, 7]
    d = layer_difference(a, b)
    assert d["families"]["norms"] == {"count": 1.0, "us": pytest.approx(2.0)}
    assert d["families"]["verify attention"] == {"count": 1.0, "us": pytest.approx(30.0)}
    assert d["families"]["copies"] == {"count": 0.0, "us": 0.0}
    assert d["kernels"] == 3 and d["kernel_us"] == pytest.approx(42.0)
    assert d["idle_us"] == pytest.approx(3.0) and d["span_us"] == pytest.approx(45.0)
    names = d["names"]
    assert names["_verify_gluon_ws_kernel"] == {"count": 1.0, "us": pytest.approx(30.0), "family": "verify attention"}
    assert names["nvjet_tst_64x8"]["count"] == 1.0 and names["nvjet_tst_64x8"]["family"] == "projections (dense GEMMs)"
    assert all(v["count"] == 0 and v["us"] == pytest.approx(0.0) for k, v in names.items()
               if k not in ("_verify_gluon_ws_kernel", "nvjet_tst_64x8",
                            "vectorized_layer_norm_kernel<c10::BFloat16, float, true>"))
    table = kernel_table(d).splitlines()
    assert table[0].split() == ["n/layer", "us/layer", "family", "kernel"] and len(table) == 4
    assert table[1].split()[:2] == ["1.0", "30.0"] and table[1].endswith("_verify_gluon_ws_kernel")  # largest first
    assert kernel_table(d, min_us=100.0).splitlines()[1:] == table[1:]  # a count that changes is listed anyway
    # slices three layers apart: the mean layer
    d3 = layer_difference(a, b, 3)
    assert d3["families"]["verify attention"] == {"count": pytest.approx(1 / 3), "us": pytest.approx(10.0)}
    assert d3["names"]["nvjet_tst_64x8"]["us"] == pytest.approx(10 / 3) and d3["span_us"] == pytest.approx(15.0)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        layer_difference(a, b, 0)


def test_layer_bytes_of_the_slice():
    cfg = kimi_k26(num_hidden_layers=3, num_local_heads=8, n_routed_experts=48, num_experts_per_tok=1,
                   weight_prefix="")
    nb = param_nbytes(param_shapes(cfg, "int4"))
    H, I, rows = 7168, 2048, 17
    moe = layer_bytes(nb, 2, rows, 14, 48)
    # bench.moe_sweep.expert_bytes, and the shared expert (bf16) that the INT4 block's expert kernels run
    assert moe["experts (routed + shared)"] == pytest.approx(14 * 1.6875 * I * H + 2 * 3 * I * H)
    assert moe["router"] == 48 * H * 2 + 48 * 4
    attn = 1536 * H + 8 * 192 * 1536 + 576 * H + 8 * 256 * 512 + H * 8 * 128
    assert moe["projections (dense GEMMs)"] == 2 * attn
    assert moe["norms"] == 2 * (2 * H + 1536 + 512) * (1 + 2 * rows)
    cublas_shared = layer_bytes(nb, 2, rows, 14, 48, shared_with_experts=False)
    assert cublas_shared["projections (dense GEMMs)"] == 2 * (attn + 3 * I * H)
    dense = layer_bytes(nb, 0, rows, 0, 48)
    assert dense["experts (routed + shared)"] == 0 and dense["router"] == 0
    assert dense["projections (dense GEMMs)"] == 2 * (attn + 3 * 18432 * H)
    bf16 = layer_bytes(param_nbytes(param_shapes(cfg, "dense")), 1, rows, 10, 48)
    assert bf16["experts (routed + shared)"] == pytest.approx(10 * 3 * I * H * 2)
    assert expected_unique(48, 1, 17) == pytest.approx(48 * (1 - (47 / 48) ** 17))
    assert expected_unique(48, 1, 1) == pytest.approx(1.0)


def test_attention_and_step_bytes():
    c = attention_bytes(1, 17, 8, 46000)
    assert c["verify attention"] == verify_mla_counts(1, 17, 8, 46000)
    assert c["KV writes/commit"] == (2 * 17 * 576 * 2, 0)
    nb = {"lm_head.weight": 1000, "model.norm.weight": 10, "model.embed_tokens.weight": 10**9}
    s = step_bytes(nb, {"fc.weight": 50, "layers.0.x": 50}, {"p": 30}, {"p": 20, "q": 5}, hidden=4, target_rows=3,
                   draft_rows=2, draft_kv=7, total=5, n_dense=1)
    assert s == dict(dense_layers=30, moe_layers=4 * 25, lm_head=2000, final_norm=10, embedding_rows=5 * 4 * 2,
                     draft_weights=100, draft_kv=7, total=30 + 100 + 2000 + 10 + 40 + 100 + 7)


def test_floors_ratios_and_table():
    a, b = _profiles()
    ceil = Ceilings(copy_gbps=1000.0, matmul_tflops=100.0)
    # norms 1 MB -> 1 us (2 us measured: 2x); verify 4 MB and 5e9 FLOPs -> 50 us, compute-bound
    costs = {"norms": 1e6, "verify attention": (4e6, 5e9), "projections (dense GEMMs)": 2e6}
    rows = {r["family"]: r for r in floor_rows(layer_difference(a, b), a, costs, ceil)}
    assert rows["norms"]["floor_us"] == pytest.approx(1.0) and rows["norms"]["ratio"] == pytest.approx(2.0)
    assert rows["norms"]["bound"] == "memory" and rows["norms"]["n_step"] == 2 and rows["norms"]["us_step"] == 4
    v = rows["verify attention"]
    assert (v["floor_us"], v["bound"], v["ratio"]) == (pytest.approx(50.0), "compute", pytest.approx(0.6))
    assert rows["copies"]["floor_us"] is None and rows["copies"]["ratio"] is None
    assert list(rows) == [f for f in family_order() if f in rows]
    step = {"total": 2e9}
    res = analyse(a, b, 2, costs, ceil, step, 30.0, total=3)  # b: the "whole" step, one layer past a
    assert res["layer_floor_us"] == pytest.approx(1 + 50 + 2)
    assert res["per_layer"] == layer_difference(a, b)
    s = res["step61"]  # the measured whole step
    assert s["graph_ms"] == 30.0 and s["span_ms"] == pytest.approx(b["span_us"] / 1e3) and s["floor_ms"] == 2.0
    assert s["ratio"] == pytest.approx(15.0)
    over59 = analyse(a, b, 2, costs, ceil, step, 30.0)  # the same profiles 59 layers apart: a 59th a layer
    assert over59["per_layer"]["kernel_us"] == pytest.approx(42.0 / 59)
    text = budget_table("budget 16 (T = 17)", 2, res, a, ceil.copy_gbps, b)
    lines = text.splitlines()
    assert lines[0] == "budget 16 (T = 17)"
    head = lines[1]
    assert head.split()[:5] == ["family", "n/layer", "us/layer", "floor", "us"] and "us/step L=2" in head
    assert head.endswith("n/step 61  us/step 61")
    assert all(len(ln) == len(head) for ln in lines[3:3 + len(rows)])  # fixed width
    body = {ln[:26].strip(): ln[26:].split() for ln in lines[3:]}
    # the last two columns: the 61-layer step's (here b: one more norm, GEMM and verify, 3 us more idle)
    assert body["norms"] == ["1.0", "2.0", "1.0", "2.00x", "2.0", "4.0", "3.0", "6.0"]
    assert body["verify attention"] == ["1.0", "30.0", "50.0c", "0.60x", "2.0", "33.0", "3.0", "63.0"]
    assert body["copies"] == ["0.0", "0.0", "-", "-", "1.0", "1.0", "1.0", "1.0"]
    assert body["all events"] == ["3.0", "42.0", "7.0", "49.0", "10.0", "91.0"]
    assert body["idle between events"] == ["3.0", "3.0", "6.0"]
    assert body["span"] == ["45.0", "53.0", "0.85x", "51.0", "96.0"]
    assert lines[-1].startswith("61-layer step: graph 30.00 ms") and "profiled span 0.10 ms" in lines[-1]
    assert "bytes floor 2.00 ms (2.00 GB at 1000 GB/s): 15.00x" in lines[-1]


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bench.step_profile", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def test_help_without_a_gpu():
    r = _run("--help", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0 and "--budgets" in r.stdout and "--json" in r.stdout


def test_without_a_gpu_exits_2_with_one_line():
    r = _run("--budgets", "8", "--replays", "2", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "needs a CUDA GPU" in r.stderr


def test_main_with_the_gpu_part_stubbed(monkeypatch, tmp_path, capsys):
    """main's printing and JSON over two synthetic slices of the real shapes, 2 and 61 layers (no GPU:
    profile_slice stubbed)."""
    import json

    import torch

    import bench.step_profile as sp
    import tritree.roofline as rl
    from tritree.model import dflash
    from tritree.model.config import kimi_k26_dflash

    a, b = _profiles()

    built = []

    def fake_slice(layers, ctx, budget, batch, experts, replays, own_layers=None):
        built.append((layers, own_layers))
        cfg = kimi_k26(num_hidden_layers=layers, num_local_heads=8, n_routed_experts=48, num_experts_per_tok=1,
                       weight_prefix="")
        return dict(layers=layers, graph_ms=4.0 if layers == 2 else 25.0, profile=a if layers == 2 else b,
                    events_outside_replays=0, unique_experts=[20] * (layers - 1) if layers < 61 else [20] + [14] * 59,
                    nbytes=param_nbytes(param_shapes(cfg, experts)),
                    draft_nbytes=param_nbytes(dflash.param_shapes(kimi_k26_dflash())), heads=8, hidden=7168,
                    n_experts=48, top_k=1, block=8, draft_kv_token=4096, draft_layers=6,
                    shared_with_experts=lambda rows: True)

    monkeypatch.setattr(sp, "profile_slice", fake_slice)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(rl, "device_ceilings", lambda *a: Ceilings(4240.0, 700.0))
    monkeypatch.setattr(rl, "copy_gbps_now", lambda *a: 3000.0)
    monkeypatch.setattr(rl, "ceilings_source", lambda *a: "measured now")
    monkeypatch.setattr(rl, "versions", lambda: "NVIDIA H100 80GB HBM3, torch x, triton y, CUDA z")
    out = tmp_path / "p.json"
    assert sp.main(["--budgets", "16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "unclassified events (family 'other'; extend FAMILIES): mystery x1" in text
    # layer 1 is in both slices: the mean past it is the layers' floor, the mean over all the step's
    assert ("unique local experts a MoE layer of the 61-layer step: mean 14.0 past the 2-layer slice, 14.1 over all "
            "(expected 14.4 for uniform routing; 14-20 a layer)") in text
    table = text[text.index("budget 16 (T = 17), batch 1"):]
    assert "one MoE layer = (the 61- minus the 2-layer step) / 59" in table
    assert built == [(2, None), (61, 3)]  # the 61-layer slice holds 3 layers' routed experts
    assert "61-layer step: graph 25.00 ms" in table
    doc = json.loads(out.read_text())
    # the floors over the copy rate measured in the run, not a recorded one
    assert doc["gpu"] == "NVIDIA H100 80GB HBM3" and doc["copy_gbps"] == 3000.0 and doc["matmul_tflops"] == 700.0
    assert doc["ceilings"] == "copy measured in this process; bf16 matmul measured now"
    assert "copy 3000 GB/s" in text
    (r,) = doc["budgets"]
    assert r["T"] == 17 and r["layers"] == [2, 61] and set(r["profiles"]) == {"2", "61"}
    assert r["profiles"]["2"]["graph_ms"] == 4.0
    assert r["per_layer"]["families"]["norms"]["count"] == pytest.approx(1 / 59)  # one more norm over 59 layers
    per_expert = 1.6875 * 2048 * 7168
    assert r["costs"]["experts (routed + shared)"] == pytest.approx(14 * per_expert + 3 * 2048 * 7168 * 2)
    parts = r["step61"]["parts"]
    assert parts["lm_head"] == 2 * 163840 * 7168 * 2 and parts["draft_kv"] == 46000 * 4096 * 6
    assert parts["moe_layers"] > 60 * (14 + 6 / 60) * per_expert  # the step's mean, layer 1's 20 in it
