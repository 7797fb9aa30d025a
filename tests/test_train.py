"""Training of the tiny pair (smoke), the HF-layout round trip of both checkpoints, and the shipped
pair: it loads through the normal loaders and speculative greedy output equals plain greedy output."""

import pytest
import torch

from tritree import train
from tritree.engine import Engine
from tritree.model import dflash
from tritree.model.kimi_k2 import init_params
from tritree.model.loading import load_dflash_params, load_params

from .conftest import DEVICE


@pytest.fixture
def reference_path(monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("draft_options", [{}, dict(windows=(None, 3), final_logit_softcapping=2.5),
                                           dict(rope_scaling=None, input_embedding_scale=2.0, output_multiplier=0.5)])
def test_checkpoints_round_trip_through_the_loaders(tmp_path, draft_options):
    """Every option of the draft's config (windows, soft-capping, no rope scaling, scales) survives."""
    tcfg = train.tiny_target_config()
    dcfg = train.tiny_draft_config(tcfg).with_(**draft_options)
    tp = init_params(tcfg, seed=5)
    dp = dflash.init_params(dcfg, seed=6)
    train.save_target(tp, tcfg, tmp_path / "t")
    train.save_draft(dp, dcfg, tmp_path / "d")
    tp2, tcfg2 = load_params(str(tmp_path / "t"))
    dp2, dcfg2 = load_dflash_params(str(tmp_path / "d"))
    assert tcfg2.with_(weight_prefix="") == tcfg.with_(weight_prefix="")
    assert dcfg2.with_(rope_scaling=dcfg.rope_scaling) == dcfg  # rope_scaling gains HF's spelling of the keys
    from tritree.model.layers import yarn_inv_freq
    if dcfg.rope_scaling is None:
        assert dcfg2.rope_scaling is None
    else:
        assert torch.equal(yarn_inv_freq(32, 1e4, dcfg2.rope_scaling), yarn_inv_freq(32, 1e4, dcfg.rope_scaling))
    for k, v in tp.items():
        assert torch.equal(tp2[k], v), k  # the rope rows come back in tritree's order
    for k, v in dp.items():
        assert torch.equal(dp2[k], v), k


def test_training_steps_reduce_the_loss(reference_path):
    tcfg = train.tiny_target_config()
    dcfg = train.tiny_draft_config(tcfg)
    data = torch.frombuffer(bytearray(b"def f(x):\n    return x + 1\n\n" * 400), dtype=torch.uint8).long()
    logs = []
    tp = train.train_target(tcfg, data, 30, 8, 64, 3e-3, "cpu", logs.append)
    first, last = float(logs[0].split("loss ")[1].split()[0]), float(logs[-1].split("loss ")[1].split()[0])
    assert last < first - 1.0, logs
    dlogs = []
    train.train_draft(dcfg, tp, tcfg, data, 30, 8, 64, 3e-3, "cpu", dlogs.append)
    d0, d1 = float(dlogs[0].split("loss ")[1].split()[0]), float(dlogs[-1].split("loss ")[1].split()[0])
    assert d1 < d0 - 1.0, dlogs


@pytest.mark.skipif(not (train.ASSETS / "target" / "model.safetensors").exists(), reason="no shipped pair")
def test_shipped_pair_is_lossless_and_readable(reference_path):
    tp, tcfg = load_params(str(train.ASSETS / "target"), device=DEVICE)
    dp, dcfg = load_dflash_params(str(train.ASSETS / "draft"), device=DEVICE)
    eng = Engine(tp, tcfg, dp, dcfg, page_size=16, num_pages=512)
    prompts = [list(b"def __init__(self, "), list(b"import os\nimport sys\n\n"), list(b"    return ")]
    spec = eng.generate(prompts, 40, budget=16)
    plain = eng.generate(prompts, 40, speculative=False)
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    text = bytes(t for r in spec for t in r.tokens if t < 256)
    printable = sum(32 <= c < 127 or c in (9, 10) for c in text) / len(text)
    assert printable > 0.95, text  # readable: plain ASCII source text
    assert sum(r.steps for r in spec) < sum(r.steps for r in plain)  # the draft helps


def test_shipped_heldout_prompts_are_used_and_held_out():
    """The acceptance benchmark reads the prompts shipped with the pair (so machines with another
    Python, hence another standard library, measure the same text); they are 96-byte token lists."""
    from tritree.bench_accept import heldout_prompts
    prompts, source = heldout_prompts(16, 96)
    assert "shipped" in source and len(prompts) == 16
    assert all(len(p) == 96 and all(0 <= t < 256 for t in p) for p in prompts)
    _, fresh = heldout_prompts(2, 50)  # another length: cut from this machine's files
    assert "this machine" in fresh
