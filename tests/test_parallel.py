"""Tensor parallelism (tritree.dist, tritree.model.parallel): gloo process groups of 2 and 4 CPU
processes give the single-process logits (to fp32 rounding: all-reduce changes the summation order),
picks, accepted tokens and generated text (exactly) of the tiny random pair and of the shipped pair;
checkpoints load shard-aware (each rank reads only its slices); the pieces the collectives rely on
(skipped experts, the walk from given picks) match their single-process versions. The DFlash draft is sharded
the same way: its logits and the generations are checked in the gloo groups, its shards and bytes here."""

import os

import pytest
import torch

from tritree import accept_tree
from tritree.dist import TPGroup, accept_with_picks
from tritree.kernels.moe import moe_reference, routed_experts
from tritree.model import dflash
from tritree.model.config import dflash_tiny, kimi_k26_dflash, kimi_tiny
from tritree.model.kimi_k2 import init_params, prefill
from tritree.model.loading import load_dflash_params, load_params
from tritree.model.parallel import (
    draft_shard_slice,
    local_draft_shapes,
    local_param_shapes,
    shard_config,
    shard_draft_config,
    shard_draft_params,
    shard_params,
    shard_slice,
    take_slice,
)
from tritree.testing import random_trees
from tritree.train import ASSETS

from ._tp_cases import run_cases, spawn
from .conftest import DEVICE


@pytest.fixture(scope="module")
def single_process():
    """The reference: every case in this process, no group (kernels' CPU reference paths, as the
    ranks use: the interpreter would cost minutes here; the kernels are tested against the same
    references elsewhere)."""
    old, threads = os.environ.get("TRITON_INTERPRET"), torch.get_num_threads()
    if DEVICE.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "0"
    torch.set_num_threads(1)  # tiny ops: OpenMP threads on a busy 2-core machine cost ~1000x (index_add_)
    try:
        return run_cases(None, "cpu")
    finally:
        torch.set_num_threads(threads)
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old


def check_against_single(results, ref):
    for r, res in enumerate(results):
        for key in ("prefill", "verify", "taps", "latents", "draft_logits"):  # all-reduce order: fp32 rounding only
            torch.testing.assert_close(res[key], ref[key], rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {r} {key}: {m}")
        assert res["greedy"] == res["plain"]  # lossless under TP too
        for key in ("verify_picks", "greedy", "plain", "chain", "sampled", "text"):
            want = ref[key]
            got = res[key]
            same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
            assert same, (r, key, got, want)
        for key in res:  # replicated state: bit-identical on every rank
            a, b = res[key], results[0][key]
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), (r, key)


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_tp_equals_single_process(world, single_process, tmp_path, monkeypatch):
    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # the spawned ranks inherit it
    results = spawn(world, tmp_path, "gloo")
    check_against_single(results, single_process)
    print("shipped pair, TP", world, ":", [bytes(t).decode(errors="replace") for t in results[0]["text"]])


@pytest.mark.gpu
def test_nccl_tp_equals_single_process_under_cuda_graphs(tmp_path):
    """The same with NCCL on up to 4 GPUs, the engine's steps captured in CUDA graphs (collectives
    inside). Passed on two H200s (TP2): bench/RESULTS.md, section "Decode step, TP2"."""
    world = min(4, torch.cuda.device_count())
    if world < 2:
        pytest.skip("needs 2 GPUs")
    results = spawn(world, tmp_path, "nccl")
    ref = run_cases(None, "cuda:0")
    ref = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in ref.items()}
    check_against_single(results, ref)


# --------------------------------------------------------------------------------------------------
# Shard-aware loading (no collectives: a TPGroup without a process group is enough)
# --------------------------------------------------------------------------------------------------

class _SpyOpen:
    """``safe_open`` that records every slice read and refuses whole-tensor reads."""

    reads: list = []

    def __init__(self, file, framework):
        from safetensors import safe_open

        self.f = safe_open(file, framework)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):  # the weight map of a single-file checkpoint
        return self.f.keys()

    def get_tensor(self, name):
        raise AssertionError(f"whole-tensor read of {name}")

    def get_slice(self, name):
        sl = self.f.get_slice(name)
        reads = self.reads

        class Slice:
            def get_shape(self):
                return sl.get_shape()

            def get_dtype(self):
                return sl.get_dtype()

            def __getitem__(self, idx):
                t = sl[idx]
                reads.append((name, tuple(sl.get_shape()), tuple(t.shape)))
                return t
        return Slice()


@pytest.mark.parametrize("world", [2, 4])
def test_shard_aware_load_reads_only_the_rank_slices(world, monkeypatch):
    import tritree.model.loading as loading

    path = str(ASSETS / "target")
    full, cfg = load_params(path)
    monkeypatch.setattr(loading, "safe_open", _SpyOpen)
    for rank in range(world):
        tp = TPGroup(world, rank)
        _SpyOpen.reads = []
        local, lcfg = load_params(path, tp=tp)
        assert lcfg.num_local_heads == cfg.num_attention_heads // world
        assert lcfg.first_local_head == rank * cfg.num_attention_heads // world
        assert {k: tuple(v.shape) for k, v in local.items()} == local_param_shapes(cfg, tp)
        for name, t in local.items():
            want = take_slice(full[name], shard_slice(name, lcfg, tp, tuple(full[name].shape)))
            assert torch.equal(t, want), (rank, name)
        read = {}
        for name, full_shape, got in _SpyOpen.reads:
            read[name] = (full_shape, got)
        e_loc = cfg.n_routed_experts // world
        experts = {int(n.split("experts.")[1].split(".")[0]) for n in read if ".mlp.experts." in n}
        assert experts == set(range(rank * e_loc, (rank + 1) * e_loc))  # only this rank's experts
        for name, (full_shape, got) in read.items():
            sharded = any(s in name for s in ("q_b_proj", "kv_b_proj", "o_proj", "embed_tokens", "lm_head",
                                              "shared_experts", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
            if sharded and "mlp.experts." not in name:
                assert got != full_shape and sum(got) < sum(full_shape), (name, got, full_shape)


def test_shard_aware_load_of_quantised_weights(tmp_path, monkeypatch):
    """FP8 block-scaled attention and INT4 MLP weights: a rank's load equals the slice of the full
    load, through sliced reads where the slice starts on a scale block (q_b_proj, o_proj, the dense
    MLP) and whole reads elsewhere (kv_b_proj, the shared expert's down_proj at TP2)."""
    import json

    from safetensors.torch import save_file

    from ._quant_helpers import quantize_fp8_blocks, quantize_int4

    if DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # dequantisation's reference path (kernels: test_quant.py)
    # heads of 128 query rows and 128 value columns: the TP2 slices start on FP8's 128-blocks
    cfg = kimi_tiny(hidden_size=64, num_hidden_layers=2, qk_nope_head_dim=112, v_head_dim=128, intermediate_size=128)
    params = init_params(cfg, seed=2)
    tensors = {}
    for name, t in params.items():
        if ".mlp.experts." in name:
            layer, proj = name.split(".mlp.experts.")
            for e in range(t.shape[0]):
                base = f"{layer}.mlp.experts.{e}.{proj[:-len('.weight')]}"
                packed, scale, _ = quantize_int4(t[e])
                tensors.update({base + ".weight_packed": packed, base + ".weight_scale": scale})
        elif name.endswith(("q_b_proj.weight", "kv_b_proj.weight", "o_proj.weight")):
            w8, scale_inv, _ = quantize_fp8_blocks(t)
            tensors.update({name: w8, name + "_scale_inv": scale_inv})
        elif name.endswith(("mlp.gate_proj.weight", "mlp.down_proj.weight", "shared_experts.down_proj.weight")):
            packed, scale, _ = quantize_int4(t)
            base = name[:-len(".weight")]
            tensors.update({base + ".weight_packed": packed, base + ".weight_scale": scale})
        else:
            tensors[name] = t.contiguous()
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.to_dict().items() if k not in (
        "weight_prefix", "num_local_heads", "first_local_head", "qk_latent_eps")}))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    full, _ = load_params(str(tmp_path), cfg)
    for world in (2, 4):
        for rank in range(world):
            tp = TPGroup(world, rank)
            local, lcfg = load_params(str(tmp_path), cfg, tp=tp)
            for name, t in local.items():
                want = take_slice(full[name], shard_slice(name, lcfg, tp, tuple(full[name].shape)))
                assert torch.equal(t, want), (world, rank, name)


# --------------------------------------------------------------------------------------------------
# Pieces and errors (one process)
# --------------------------------------------------------------------------------------------------

def test_bad_world_sizes_raise_value_errors():
    with pytest.raises(ValueError, match="num_attention_heads = 6 is not divisible"):
        shard_config(kimi_tiny(num_attention_heads=6), TPGroup(4, 0))
    with pytest.raises(ValueError, match="n_routed_experts = 6"):
        shard_config(kimi_tiny(n_routed_experts=6), TPGroup(4, 1))
    with pytest.raises(ValueError, match="rank"):
        TPGroup(2, 2)
    cfg = kimi_tiny()
    params = init_params(cfg)
    with pytest.raises(ValueError, match="shard_config"):  # the global config with a group
        prefill(params, cfg, torch.zeros(1, 3, dtype=torch.long), tp=TPGroup(2, 0))
    assert shard_config(cfg, TPGroup()) is cfg and shard_params(params, cfg, None)[0] == params


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("make", [kimi_k26_dflash, lambda: dflash_tiny(kimi_tiny(), num_attention_heads=8,
                                                                       num_key_value_heads=2, intermediate_size=64)])
def test_draft_shards_hold_one_world_th_of_the_weights(world, make):
    """A rank's draft: its query heads, the KV heads they read (replicated when fewer than the ranks), 1 / world
    of the MLP and of fc's input columns; every byte but the norms split (and the KV heads' replication)."""
    cfg = make()
    full = dflash.param_shapes(cfg)
    whole = sum(torch.Size(s).numel() for s in full.values())
    norms = sum(torch.Size(s).numel() for k, s in full.items() if k.endswith("norm.weight"))
    kv = sum(torch.Size(s).numel() for k, s in full.items() if k.endswith(("k_proj.weight", "v_proj.weight")))
    kv_local = kv * max(1, cfg.num_key_value_heads // world) // cfg.num_key_value_heads
    for rank in range(world):
        local = local_draft_shapes(cfg, TPGroup(world, rank))
        n = sum(torch.Size(s).numel() for s in local.values())
        assert n == (whole - norms - kv) // world + norms + kv_local
        lcfg = shard_draft_config(cfg, TPGroup(world, rank))
        assert lcfg.tp_world == world and lcfg.num_attention_heads == cfg.num_attention_heads // world
        assert {k: tuple(s) for k, s in dflash.param_shapes(lcfg).items() if k != "fc.weight"} == \
            {k: s for k, s in local.items() if k != "fc.weight"}
    from tritree.memory import memory_report
    from tritree.model.config import kimi_k26

    if make is kimi_k26_dflash:
        row = memory_report(kimi_k26(), cfg, tp=world).row("DFlash draft")
        assert row.total / world <= row.per_rank < row.total / world * 1.001


def test_draft_shards_concatenate_to_the_whole_draft():
    """Every rank's slices of q/o/MLP/fc put back together give the whole draft; each rank's K/V rows are the KV
    head of its query heads' group (here 8 query heads, 2 KV heads, 4 ranks)."""
    cfg = dflash_tiny(kimi_tiny(), num_attention_heads=8, num_key_value_heads=2, intermediate_size=64)
    params = dflash.init_params(cfg, seed=3)
    shards = [shard_draft_params(params, cfg, TPGroup(4, r))[0] for r in range(4)]
    D = cfg.head_dim
    for k, t in params.items():
        s = draft_shard_slice(k, cfg, TPGroup(4, 0), tuple(t.shape))
        if s is None:
            assert all(torch.equal(sh[k], t) for sh in shards), k
        elif k.endswith(("k_proj.weight", "v_proj.weight")):
            for r, sh in enumerate(shards):  # ranks 0, 1 read KV head 0; ranks 2, 3 KV head 1
                assert torch.equal(sh[k], t[(r // 2) * D:(r // 2 + 1) * D]), (k, r)
        else:
            assert torch.equal(torch.cat([sh[k] for sh in shards], dim=s[0]), t), k
    with pytest.raises(ValueError, match="num_key_value_heads = 3"):
        shard_draft_config(cfg.with_(num_attention_heads=12, num_key_value_heads=3), TPGroup(4, 0))
    with pytest.raises(ValueError, match="num_attention_heads = 8 is not divisible"):
        shard_draft_config(cfg, TPGroup(3, 0))
    lcfg = shard_draft_config(cfg, TPGroup(2, 1))
    with pytest.raises(ValueError, match="shard of 2"):  # a shard without its group
        dflash.context_features(shard_draft_params(params, cfg, TPGroup(2, 1))[0], lcfg,
                                torch.zeros(1, 2, cfg.n_taps, cfg.hidden_size))
    with pytest.raises(ValueError, match="global draft config"):
        shard_draft_config(lcfg, TPGroup(2, 0))


def test_draft_loads_shard_aware(monkeypatch):
    """``load_dflash_params(tp=...)`` gives each rank the slices ``shard_draft_params`` cuts from the whole."""
    whole, cfg = load_dflash_params(str(ASSETS / "draft"))
    for world in (2, 4):
        for rank in range(world):
            got, lcfg = load_dflash_params(str(ASSETS / "draft"), tp=TPGroup(world, rank))
            want, wcfg = shard_draft_params(whole, cfg, TPGroup(world, rank))
            assert lcfg == wcfg and got.keys() == want.keys()
            assert all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize("path", ["reference", "kernel"])
def test_routed_experts_skip_other_ranks_experts(path, monkeypatch):
    """Ids outside [0, E_local) are skipped, so the per-rank outputs of an expert-parallel split add up
    to the full MoE (the kernel path runs in the interpreter on the CPU)."""
    if path == "reference" and DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    g = torch.Generator().manual_seed(0)
    N, Hd, I, E, k = 7, 32, 16, 8, 2
    x = torch.randn(N, Hd, generator=g).to(DEVICE)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)]).to(DEVICE)
    w = torch.rand(N, k, generator=g).to(DEVICE)
    wg, wu = torch.randn(E, I, Hd, generator=g).to(DEVICE) / 6, torch.randn(E, I, Hd, generator=g).to(DEVICE) / 6
    wd = torch.randn(E, Hd, I, generator=g).to(DEVICE) / 4
    full = moe_reference(x, idx, w, wg, wu, wd)
    world = 4
    e = E // world
    parts = [routed_experts(x, idx - r * e, w, wg[r * e:(r + 1) * e], wu[r * e:(r + 1) * e], wd[r * e:(r + 1) * e])
             for r in range(world)]
    torch.testing.assert_close(sum(parts), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["reference", "kernel"])
def test_accept_with_picks_equals_accept_tree(path, monkeypatch):
    """The walk from given picks (the TP greedy path) equals accept_tree on the logits those picks
    come from, on random trees with repeated tokens and padding."""
    if path == "reference" and DEVICE.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    g = torch.Generator().manual_seed(3)
    B, T, V = 6, 12, 5  # a 5-token vocabulary: siblings share tokens, picks often match
    parents = random_trees(B, T, ("random", "wide", "chain"), generator=g).to(DEVICE)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32).to(DEVICE)
    tree_lens = torch.tensor([12, 1, 7, 12, 3, 9], dtype=torch.int32, device=DEVICE)
    logits = torch.randn(B, T, V, generator=g).to(DEVICE)
    want = accept_tree(tokens, parents, tree_lens, logits)
    got = accept_with_picks(tokens, parents, tree_lens, torch.argmax(logits, -1).to(torch.int32))
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())


def test_bench_decode_without_collectives_keeps_the_rank_and_leaves_collectives_out():
    """The timing-only group of ``bench decode --tp``: same world and rank, no communication."""
    from tritree.bench_decode import without_collectives

    local = without_collectives(TPGroup(4, 2))
    assert (local.world, local.rank, local.active) == (4, 2, True)
    x = torch.arange(6.0).view(2, 3)
    assert local.all_reduce_(x) is x and torch.equal(x, torch.arange(6.0).view(2, 3))
    g = local.all_gather(x)  # the rank's part in its place, the lowest value in the others'
    low = torch.finfo(x.dtype).min
    assert g.shape == (4, 2, 3) and torch.equal(g[2], x)
    assert all(bool((g[r] == low).all()) for r in (0, 1, 3))
    g[2, 0, 0] = 100.0  # a copy, not a view of x
    assert x[0, 0] == 0.0
    ids = local.all_gather(torch.arange(3, dtype=torch.int32))
    assert torch.equal(ids[2], torch.arange(3, dtype=torch.int32)) and int(ids[0, 0]) == torch.iinfo(torch.int32).min
