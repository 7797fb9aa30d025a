"""``bench decode``'s slice (tritree.bench_decode) on the CPU, at a tiny config of the same structure: it holds
exactly rank 0's shard of TP8 (heads, experts, the shared expert's and the draft's slices, the vocabulary shard)
and one decode step runs under its collective-free group."""

import pytest
import torch

import tritree.bench_decode as BD
from tritree.dist import TPGroup
from tritree.model import dflash
from tritree.model.config import dflash_tiny, kimi_tiny
from tritree.model.kimi_k2 import param_shapes
from tritree.model.parallel import local_draft_shapes, local_param_shapes
from tritree.step import SamplingConfig, decode_step_


def _tiny_k26(**kw):
    # every sharded dimension divisible by 8 (the slice is one rank of TP8)
    return kimi_tiny(num_attention_heads=8, n_routed_experts=16, num_experts_per_tok=4, vocab_size=96, hidden_size=64,
                     **kw)


def _tiny_dflash(**kw):
    return dflash_tiny(_tiny_k26(), num_attention_heads=8, num_key_value_heads=2, intermediate_size=64, **kw)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(BD, "kimi_k26", _tiny_k26)
    monkeypatch.setattr(BD, "kimi_k26_dflash", _tiny_dflash)


@pytest.mark.parametrize("experts", ["int4", "bf16"])
def test_slice_is_rank_0_of_tp8_and_its_step_runs(tiny, experts):
    tcfg, dcfg, tparams, dp, state = BD.build(2, 40, 3, 2, page_size=8, dtype=torch.float32, device="cpu",
                                              experts=experts)
    rank = TPGroup(8, 0)
    layout = {"int4": "int4", "bf16": "dense"}[experts]
    want = local_param_shapes(_tiny_k26(num_hidden_layers=2, weight_prefix=""), rank, layout)
    if experts == "int4":  # as the Engine holds them: the shared expert's gate and up rows concatenated
        m = "model.layers.1.mlp.shared_experts."
        gate, _ = want.pop(m + "gate_proj.weight"), want.pop(m + "up_proj.weight")
        want[m + "gate_up_proj.weight"] = (2 * gate[0], gate[1])
    gate, _ = want.pop("model.layers.0.mlp.gate_proj.weight"), want.pop("model.layers.0.mlp.up_proj.weight")
    want["model.layers.0.mlp.gate_up_proj.weight"] = (2 * gate[0], gate[1])  # the dense layer's gate|up rows
    for i in range(2):  # and every layer's q_a and kv_a rows, and q_b with the q_a norm in it
        a = f"model.layers.{i}.self_attn."
        qa, kva = want.pop(a + "q_a_proj.weight"), want.pop(a + "kv_a_proj_with_mqa.weight")
        want[a + "qkv_a_proj.weight"] = (qa[0] + kva[0], qa[1])
        want.pop(a + "q_a_layernorm.weight")
        want[a + "q_b_normed_proj.weight"] = want.pop(a + "q_b_proj.weight")
    got = {k: tuple(v.shape) for k, v in tparams.items()}
    assert got == want  # the CPU keeps the checkpoint layout of the experts
    assert tparams["lm_head.weight"].shape[0] == 96 // 8 and tcfg.heads == 1
    assert tparams["model.layers.1.mlp.shared_experts.down_proj.weight"].shape[1] == 32 // 8
    dwant = local_draft_shapes(BD.kimi_k26_dflash(target_layer_ids=(0, 1)), rank)
    for k in [k for k in dwant if k.endswith(".mlp.gate_proj.weight")]:  # as the Engine holds them: gate|up rows
        gate, _ = dwant.pop(k), dwant.pop(k.replace("gate_proj", "up_proj"))
        dwant[k.replace("gate_proj", "gate_up_proj")] = (2 * gate[0], gate[1])
    for k in [k for k in dwant if k.endswith(".self_attn.q_proj.weight")]:  # and q|k|v rows, per-head q and k norms
        a = k[:-len("q_proj.weight")]
        q, kk, v = (dwant.pop(a + n + "_proj.weight") for n in "qkv")
        D = dwant.pop(a + "q_norm.weight")[0]
        dwant.pop(a + "k_norm.weight")
        dwant[a + "qkv_proj.weight"] = (q[0] + kk[0] + v[0], q[1])
        dwant[a + "qk_norm.weight"] = ((q[0] + kk[0]) // D, D)
    assert {k: tuple(v.shape) for k, v in dp.items()} == dwant and dcfg.tp_world == 8
    assert state["dkv"].shape[-2] == dcfg.num_key_value_heads == 1
    before = state["kv_lens"].clone()
    decode_step_(tparams, tcfg, dp, dcfg, state, budget=3, sampling=SamplingConfig(), tp=BD.slice_group())
    assert (state["kv_lens"] > before).all()  # a step committed at least the bonus token of every request
    whole = sum(torch.Size(s).numel() for s in dflash.param_shapes(dflash_tiny(_tiny_k26(), num_attention_heads=8,
                                                                                 num_key_value_heads=2,
                                                                                 intermediate_size=64)).values())
    assert sum(t.numel() for t in dp.values()) < whole / 4  # an eighth of the draft, plus its norms
    assert sum(torch.Size(s).numel() for s in param_shapes(_tiny_k26(num_hidden_layers=2)).values()) > \
        sum(t.numel() for t in tparams.values())


@pytest.mark.parametrize("experts", ["int4", "bf16"])
def test_layers_past_own_layers_share_the_routed_experts_of_the_owned_moe_layers(tiny, experts):
    """The 61-layer slice fits one GPU: layers past ``own_layers`` hold the very routed-expert tensors of the owned
    MoE layers, cycling over them (never the dense layer); every other weight is the layer's own, in the layout
    the kernels read (an INT4 layer's shared gate | up rows too), and the step runs over every layer."""
    tcfg, dcfg, tparams, dp, state = BD.build(6, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu",
                                              own_layers=3, experts=experts)
    _, _, distinct, _, _ = BD.build(6, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu", experts=experts)
    assert set(tparams) == set(distinct) and tcfg.num_hidden_layers == 6
    assert all(tparams[k].shape == distinct[k].shape for k in tparams)
    for i, src in ((3, 1), (4, 2), (5, 1)):
        mine = [k for k in tparams if k.startswith(f"model.layers.{i}.")]
        expert_keys = [k for k in mine if ".mlp.experts." in k]
        assert len(expert_keys) == {"int4": 4, "bf16": 3}[experts]
        assert ("model.layers.3.mlp.shared_experts.gate_up_proj.weight" in tparams) == (experts == "int4")
        for k in mine:
            theirs = tparams[k.replace(f"layers.{i}.", f"layers.{src}.", 1)]
            assert (tparams[k] is theirs) == (k in expert_keys)
    assert state["tkv"].shape[0] == 6  # every layer has its own KV
    before = state["kv_lens"].clone()
    decode_step_(tparams, tcfg, dp, dcfg, state, budget=3, sampling=SamplingConfig(), tp=BD.slice_group())
    assert (state["kv_lens"] > before).all()


def test_the_targets_residual_branches_are_scaled_and_the_drafts_are_not(tiny):
    """``BRANCH_SCALE`` on the target's o_proj and down projections (and the INT4 experts' down scales) only."""
    torch.manual_seed(0)
    shapes = {"a.o_proj.weight": (64, 256), "b.down_proj.weight": (64, 256), "c.mlp.experts.w2_scale": (2, 64, 8),
              "c.mlp.experts.w13_scale": (2, 64, 8), "d.q_proj.weight": (64, 256)}
    p = BD._random_params(shapes, "cpu", torch.float32, branch_scale=1e-3)
    plain = 256 ** -0.5
    assert 0.5e-3 * plain < p["a.o_proj.weight"].std() < 2e-3 * plain
    assert 0.5e-3 * plain < p["b.down_proj.weight"].std() < 2e-3 * plain
    assert 0.5 * plain < p["d.q_proj.weight"].std() < 2 * plain
    assert torch.allclose(p["c.mlp.experts.w2_scale"].float(), 1e-3 * p["c.mlp.experts.w13_scale"].float(), rtol=1e-2)
    _, _, tparams, dp, _ = BD.build(2, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu")
    o = tparams["model.layers.1.self_attn.o_proj.weight"]
    assert o.std() < 2 * BD.BRANCH_SCALE * o.shape[1] ** -0.5
    do = next(v for k, v in dp.items() if k.endswith("o_proj.weight"))
    assert do.std() > 0.5 * do.shape[1] ** -0.5


def test_build_is_seeded_so_every_tool_reads_the_same_slice(tiny):
    """Two builds of one shape hold the same weights and state whatever the RNG did before (the tools that build
    the slice then time the same routing)."""
    a = BD.build(2, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu")
    torch.rand(1000)
    b = BD.build(2, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu")
    for x, y in ((a[2], b[2]), (a[3], b[3]), (a[4], b[4])):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("own", [0, 1, 7])
def test_own_layers_must_hold_a_moe_layer_and_no_more_than_the_slice(tiny, own):
    with pytest.raises(ValueError, match="own_layers must hold a MoE layer"):
        BD.build(6, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu", own_layers=own)
    with pytest.raises(ValueError, match="held must own a MoE layer"):
        BD.share_routed_experts({}, own, 6, 1)


def test_main_reports_the_measured_61_layer_step(monkeypatch, tmp_path, capsys):
    """bench decode times the slice at --layers and at all 61 layers (those past --layers + 1 sharing their routed
    experts); the step it reports is the 61-layer graph, a MoE layer the mean of the 59 between the two."""
    import argparse
    import json

    calls = []

    def fake_run(layers, ctx, budget, batch, reps=20, tp=None, experts="int4", auto=False, cost_model=None,
                 profile=False, compile=False, own_layers=None):
        calls.append((layers, own_layers))
        return dict(layers=layers, graph_ms={2: 1.4, 61: 12.5}[layers], eager_ms=1.0 + layers,
                    host_ms=0.5, tree_nodes_mean=budget, graph_ms_without_collectives=None,
                    phases_ms={"draft": 1.0, "tree": 0.1, "verify": 0.2, "accept": 0.1, "commit": 0.05},
                    phases_graph_ms={"draft": 0.9, "tree": 0.1, "accept": 0.05, "commit": 0.04},
                    verify_attention_us=40.0, verify_attention_fragmented_us=41.0, verify_attention_one_replay_us=45.0,
                    verify_attention_floor_us=18.0, floor_bound="memory", matmul_tflops=800.0, copy_gbps=3000.0,
                    ceilings="measured now")

    monkeypatch.setattr(BD, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "d.jsonl"
    args = argparse.Namespace(budgets=[8], max_budget=64, layers=2, ctx=46000, batch=1, gen=40, out=str(out))
    assert BD.main(args) == 0
    assert calls == [(2, 2), (61, 3)]
    text = capsys.readouterr().out
    assert "budget   8: 61-layer step 12.50 ms as one graph, eager 62.00 ms (host overhead 49.50 ms)" in text
    assert "a MoE layer 188.1 us (the mean of the 59 past the 2-layer step)" in text
    assert "draft+tree+accept+commit 1.25 ms = 10.0% of the step (eager phases)" in text
    row = [json.loads(ln) for ln in out.read_text().splitlines()][-1]
    assert row["step61_ms"] == 12.5 and row["moe_layer_ms"] == pytest.approx((12.5 - 1.4) / 59)
    assert row["non_target_graph_ms"] == pytest.approx(1.09)


def test_calibrate_writes_the_61_layer_steps_it_timed(monkeypatch, tmp_path, capsys):
    """calibrate's table is the 61-layer slice's auto and captured steps as timed (no extrapolation), every grid
    cell in order, with a warning where the captured step falls with the tree size."""
    import argparse

    from tritree.budget import load_cost_file

    calls = []

    def fake_slice(ctx, batch, static, trees, experts, reps, own_layers):
        calls.append((ctx, batch, static, tuple(trees), own_layers))
        captured = [10.0 + 0.01 * ctx / 1000 + 0.1 * t for t in trees]
        if ctx == 46000:
            captured[1] = captured[0] - 0.5  # noise: a larger tree timed faster
        return [c + 0.05 for c in captured], captured

    monkeypatch.setattr(BD, "_calibrate_slice", fake_slice)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    out = tmp_path / "cost.json"
    args = argparse.Namespace(max_budget=16, grid_tree=[1, 9], grid_batch=[1], grid_ctx=[46000, 4096], layers=2,
                              gen=40, experts="int4", out=str(out))
    assert BD.calibrate(args) == 0
    assert calls == [(4096, 1, 17, (1, 9, 17), 3), (46000, 1, 17, (1, 9, 17), 3)]  # the static size joins the grid
    text = capsys.readouterr().out
    assert "batch 1 ctx 46000: warning: the captured step falls with the tree size" in text
    assert "batch 1 ctx 4096: 61-layer step ms at tree 1: auto 10.19, one graph 10.14 (1.005x)" in text
    table = load_cost_file(out)["NVIDIA H100 80GB HBM3"]
    assert table.tree == (1, 9, 17) and table.ctx == (4096, 46000) and table.static_tree == 17
    assert table.captured_ms[0][0] == pytest.approx((10.14096, 10.94096, 11.74096))
    assert table.step_ms[0][0] == pytest.approx((10.19096, 10.99096, 11.79096))
    assert "all 61 target layers (the routed experts of layers past 3 shared)" in table.source


def test_state_reset_restores_what_a_step_advances(tiny):
    tcfg, dcfg, tparams, dp, state = BD.build(2, 40, 3, 1, page_size=8, dtype=torch.float32, device="cpu")
    reset = BD.state_reset(state)
    before = {k: state[k].clone() for k in ("kv_lens", "dlens", "anchor", "pending_n", "step")}
    decode_step_(tparams, tcfg, dp, dcfg, state, budget=3, sampling=SamplingConfig(), tp=BD.slice_group())
    assert not torch.equal(state["kv_lens"], before["kv_lens"]) and not torch.equal(state["step"], before["step"])
    kv = state["kv_lens"]
    reset()
    assert state["kv_lens"] is kv  # in place
    assert all(torch.equal(state[k], v) for k, v in before.items())
