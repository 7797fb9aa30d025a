"""The memory report (tritree/memory.py) against hand counts, the model's own parameter shapes and
allocations, the INT4 facts of docs/SPEC.md section 7, and its command line."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritree import cli
from tritree.dist import TPGroup
from tritree.memory import (
    GB,
    expert_bytes,
    format_report,
    linear_bytes,
    memory_report,
    pages_per_request,
    parse_size,
)
from tritree.model import dflash
from tritree.model.config import dflash_tiny, kimi_k26, kimi_k26_dflash, kimi_tiny
from tritree.model.kimi_k2 import init_params, param_shapes
from tritree.model.parallel import local_param_shapes

from ._quant_helpers import quantize_fp8_blocks, quantize_int4

ROOT = Path(__file__).resolve().parents[1]


def _nbytes(params: dict) -> int:
    return sum(t.numel() * t.element_size() for t in params.values())


def _shape_bytes(shapes: dict) -> int:
    """bf16 everywhere but the router's bias, which the loader keeps in float32."""
    return sum(math.prod(s) * (4 if n.endswith("e_score_correction_bias") else 2) for n, s in shapes.items())


def test_tiny_components_by_hand():
    # kimi_tiny: V 97, hidden 48, 3 layers (layer 0 dense, intermediate 96), 4 heads, q_lora 24, kv_lora 32,
    # nope 8, rope 16, v 12, 8 experts of I 32, 1 shared; dflash_tiny: 2 layers, 4/2 heads of 16, I 64, 2 taps
    rep = memory_report(kimi_tiny(), dflash_tiny(), tp=1, ctx=100, batch=3, page_size=16, experts="bf16")
    got = {r.name.split(" (")[0]: r.per_rank for r in rep.rows}
    assert got["embed_tokens"] == got["lm_head"] == 97 * 48 * 2
    assert got["attention q_a, kv_a_with_mqa"] == (24 * 48 + 48 * 48) * 2 * 3
    assert got["attention q_b, kv_b, o"] == (4 * 24 * 24 + 4 * 20 * 32 + 48 * 48) * 2 * 3
    assert got["norms"] == ((2 * 48 + 24 + 32) * 3 + 48) * 2
    assert got["dense MLP"] == 3 * 96 * 48 * 2
    assert got["shared experts"] == 3 * 32 * 48 * 2 * 2
    assert got["router"] == (8 * 48 * 2 + 8 * 4) * 2
    assert got["routed experts, bf16"] == 8 * 3 * 32 * 48 * 2 * 2
    draft_layer = 2 * 48 + 2 * 16 + 64 * 48 + 2 * 32 * 48 + 48 * 64 + 3 * 64 * 48
    assert got["DFlash draft"] == (48 * 96 + 2 * 48 + 2 * draft_layer) * 2
    tokens = (3 * 7 + 1) * 16  # 100 tokens -> 7 pages of 16, 3 requests, + the engine's sink page
    assert got["KV cache, MLA latent 48"] == 3 * tokens * 48 * 2
    assert got["KV cache, draft K+V"] == 2 * tokens * 2 * 2 * 16 * 2
    # tp=2: vocabulary rows ceil(97 / 2) = 49 (padded), heads, intermediates and experts halved
    rep2 = memory_report(kimi_tiny(), dflash_tiny(), tp=2, ctx=100, batch=3, page_size=16, experts="bf16")
    got2 = {r.name.split(" (")[0]: r for r in rep2.rows}
    assert got2["embed_tokens"].per_rank == 49 * 48 * 2 and got2["embed_tokens"].total == 97 * 48 * 2
    assert got2["attention q_b, kv_b, o"].per_rank * 2 == got["attention q_b, kv_b, o"]
    assert got2["routed experts, bf16"].per_rank * 2 == got["routed experts, bf16"]
    for same in ("attention q_a, kv_a_with_mqa", "norms", "router"):
        assert got2[same].per_rank == got[same]
    # the draft: 2 of 4 query heads, 1 of 2 KV heads, 32 of 64 MLP rows, half of fc's input columns a rank
    draft_layer2 = 2 * 48 + 2 * 16 + 32 * 48 + 2 * 16 * 48 + 48 * 32 + 3 * 32 * 48
    assert got2["DFlash draft"].per_rank == (48 * 48 + 2 * 48 + 2 * draft_layer2) * 2
    assert got2["DFlash draft"].total == got["DFlash draft"]
    assert got2["KV cache, draft K+V"].per_rank * 2 == got["KV cache, draft K+V"]


def test_expert_formats_by_hand():
    cfg = kimi_tiny()  # experts: gate/up [32, 48], down [48, 32]
    int4 = 2 * (32 * 6 * 4 + 32 * 2 * 2) + (48 * 4 * 4 + 48 * 1 * 2)  # words [out, in/8] + scales [out, ceil(in/32)]
    fp8 = 3 * (32 * 48 + 1 * 1 * 4)  # a byte a weight + one float32 128x128 block scale
    assert expert_bytes(cfg, "int4") == int4 and expert_bytes(cfg, "fp8") == fp8
    assert expert_bytes(cfg, "bf16") == 3 * 32 * 48 * 2
    for fmt, per in (("int4", int4), ("fp8", fp8)):
        rep = memory_report(cfg, tp=1, ctx=1, experts=fmt)
        assert rep.row("routed experts").per_rank == 8 * 2 * per


def test_linear_bytes_match_quantised_tensors():
    w = torch.randn(96, 320)
    packed, scale, _ = quantize_int4(w)
    assert linear_bytes(96, 320, "int4") == _nbytes({"p": packed, "s": scale})
    w8, scale_inv, _ = quantize_fp8_blocks(w)
    assert linear_bytes(96, 320, "fp8") == _nbytes({"w": w8, "s": scale_inv})


def test_tiny_model_parameters_equal_the_report():
    """The report's weights are the bytes of the model's own parameters (tp=1) and of every rank's shard
    (parallel.py's shapes), so the formulas cannot drift from the model."""
    cfg, dcfg = kimi_tiny(), dflash_tiny()
    target = _nbytes(init_params(cfg, dtype=torch.bfloat16))  # the router's bias float32, as loaded
    draft = _nbytes(dflash.init_params(dcfg, dtype=torch.bfloat16))
    rep = memory_report(cfg, dcfg, tp=1, ctx=10, experts="bf16")
    assert rep.row("DFlash draft").per_rank == draft
    assert rep.weights == target + draft
    for tp in (2, 4):
        rep = memory_report(cfg, tp=tp, ctx=10, experts="bf16")
        for r in range(tp):
            assert _shape_bytes(local_param_shapes(cfg, TPGroup(world=tp, rank=r))) == rep.weights


def test_k26_shapes_equal_the_report():
    """The same at Kimi K2.6's real shapes (shapes only, nothing allocated), TP1 and every rank of TP8."""
    cfg = kimi_k26()
    assert _shape_bytes(param_shapes(cfg)) == memory_report(cfg, tp=1, experts="bf16").weights
    per_rank = memory_report(cfg, tp=8, experts="bf16").weights
    for r in (0, 7):
        assert _shape_bytes(local_param_shapes(cfg, TPGroup(world=8, rank=r))) == per_rank


def test_caches_equal_the_engine_buffers():
    from tritree.engine import Engine

    cfg, dcfg = kimi_tiny(), dflash_tiny()
    tp_, dp = init_params(cfg), dflash.init_params(dcfg)
    ctx, batch, P = 37, 2, 8
    eng = Engine(tp_, cfg, dp, dcfg, page_size=P, num_pages=batch * pages_per_request(ctx, P), graphs=False)
    rep = memory_report(cfg, dcfg, tp=1, ctx=ctx, batch=batch, page_size=P, kv_dtype="fp32")
    assert rep.caches == eng._tkv.nbytes + eng._dkv.nbytes


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("fmt", ["int4", "bf16", "fp8"])
@pytest.mark.parametrize("ep", [True, False])
def test_routed_experts_over_the_ranks_sum_to_the_total(tp, fmt, ep):
    row = memory_report(kimi_k26(), tp=tp, experts=fmt, expert_parallel=ep).row("routed experts")
    assert row.per_rank * tp == row.total == expert_bytes(kimi_k26(), fmt) * 384 * 60


def test_expert_tp_keeps_whole_quantisation_groups():
    cfg = kimi_tiny(moe_intermediate_size=64)
    memory_report(cfg, tp=2, experts="int4", expert_parallel=False)  # 2 slices of 32 columns
    with pytest.raises(ValueError, match="32-column"):
        memory_report(cfg, tp=4, experts="int4", expert_parallel=False)
    with pytest.raises(ValueError, match="128-column"):
        memory_report(kimi_k26(), tp=32, experts="fp8", expert_parallel=False)
    with pytest.raises(ValueError, match="n_routed_experts"):
        memory_report(kimi_tiny(n_routed_experts=6), tp=4, experts="int4", expert_parallel=True)


def test_k26_int4_facts():
    """docs/SPEC.md section 7: 24.77 MB an expert (22.02 MB nibbles + 2.75 MB scales), 570.8 GB for the
    60 x 384 routed experts, 71.3 GB per GPU of 8."""
    cfg = kimi_k26()
    assert expert_bytes(cfg, "int4") == 3 * 7168 * 2048 // 2 + 3 * 7168 * 2048 // 32 * 2
    assert expert_bytes(cfg, "int4") / 1e6 == pytest.approx(24.77, abs=0.005)
    row = memory_report(cfg, tp=8, experts="int4").row("routed experts")
    assert row.total / GB == pytest.approx(570.8, rel=0.005)
    assert row.per_rank / GB == pytest.approx(71.3, abs=0.05)


def test_bf16_is_four_times_int4_without_scales():
    cfg = kimi_k26()
    int4 = memory_report(cfg, tp=8, experts="int4").row("routed experts").total
    bf16 = memory_report(cfg, tp=8, experts="bf16").row("routed experts").total
    scales = 3 * 7168 * 2048 // 32 * 2 * 384 * 60
    assert bf16 == 4 * (int4 - scales)
    assert bf16 / 1e12 == pytest.approx(2.03, abs=0.01)  # "~2 TB"


def test_pages_round_up_per_request():
    assert [pages_per_request(n, 64) for n in (1, 63, 64, 65, 46000)] == [1, 1, 1, 2, 719]
    kv = {n: memory_report(kimi_tiny(), tp=1, ctx=n, page_size=16).row("KV cache, MLA").per_rank for n in (1, 16, 17)}
    page = 3 * 16 * 48 * 2  # one page of 16 tokens, 3 layers; every report holds the engine's sink page too
    assert kv[1] == kv[16] == 2 * page and kv[17] == 3 * page
    one = memory_report(kimi_tiny(), tp=1, ctx=17, batch=1, page_size=16).caches
    assert memory_report(kimi_tiny(), tp=1, ctx=17, batch=5, page_size=16).caches == (5 * 2 + 1) * one // 3


def test_verdict():
    rep = memory_report(kimi_k26(), kimi_k26_dflash(), tp=8, ctx=46_000, experts="int4")
    assert 80 * GB < rep.resident < rep.peak
    assert "FITS" in format_report(rep, rep.peak) and rep.fits(rep.peak) and not rep.fits(rep.peak - 1)
    assert format_report(rep, rep.resident).splitlines()[-1].startswith("DOES NOT FIT")
    assert parse_size("96") == parse_size("96GB") == 96 * GB and parse_size("1GiB") == 2**30
    with pytest.raises(ValueError):
        parse_size("96TB")


def test_cli_prints_the_table():
    r = subprocess.run([sys.executable, "-m", "tritree", "memory", "--tp", "8", "--ctx", "46000", "--experts", "int4",
                        "--gpu-mem", "96"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "routed experts, int4 (x60)" in r.stdout and "570.761" in r.stdout
    assert r.stdout.splitlines()[-1].startswith(("FITS", "DOES NOT FIT"))


@pytest.mark.parametrize("argv,flag", [
    (["--tp", "0"], "--tp"),
    (["--tp", "7"], "--tp"),
    (["--ctx", "0"], "--ctx"),
    (["--batch", "x"], "--batch"),
    (["--page-size", "3"], "--page-size"),
    (["--experts", "int8"], "--experts"),
    (["--kv-dtype", "int4"], "--kv-dtype"),
    (["--expert-split", "dp"], "--expert-split"),
    (["--gpu-mem", "lots"], "--gpu-mem"),
    (["--gpu-mem", "0"], "--gpu-mem"),
    (["--model", "/no/such/dir"], "--model"),
    (["--model", str(ROOT)], "--model"),  # a directory without config.json
    (["--draft", str(ROOT), "--no-draft"], "--draft"),
])
def test_cli_refuses_bad_flags_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["memory", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1
