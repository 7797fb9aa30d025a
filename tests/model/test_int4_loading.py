"""INT4 routed experts kept packed from a tiny compressed-tensors checkpoint: the packed model against the same
checkpoint loaded with its experts dequantised, per rank of an expert-parallel split, the bytes against
tritree.memory's formula, and a load that never makes a float copy of the routed experts."""

import json
from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tritree.dist import TPGroup
from tritree.kernels.moe.int4 import Int4Experts, quantize_int4
from tritree.memory import memory_report
from tritree.model.config import kimi_tiny
from tritree.model.kimi_k2 import INT4_EXPERT_KEYS, init_params, int4_experts, moe, prefill
from tritree.model.loading import load_params

from ..conftest import DEVICE

# hidden and expert intermediate sizes: whole 32-column scale groups
CFG = kimi_tiny(hidden_size=64)


@pytest.fixture(scope="module")
def int4_checkpoint(tmp_path_factory):
    """The K2.6 layout at tiny size: routed experts per expert as ``weight_packed`` / ``weight_scale`` /
    ``weight_shape``, everything else plain float32. Returns ``(path, per-layer Int4Experts)``."""
    from safetensors.torch import save_file

    params = init_params(CFG, seed=3)
    tensors, stacked = {}, {}
    for name, t in params.items():
        if ".mlp.experts." not in name:
            tensors[name] = t.contiguous()
            continue
        layer, proj = name.split(".mlp.experts.")
        packed, scale = quantize_int4(t)
        stacked.setdefault(layer, {})[proj] = (packed, scale)
        for e in range(t.shape[0]):
            base = f"{layer}.mlp.experts.{e}.{proj[:-len('.weight')]}"
            tensors.update({base + ".weight_packed": packed[e].contiguous(), base + ".weight_scale": scale[e].contiguous(),
                            base + ".weight_shape": torch.tensor(list(t[e].shape), dtype=torch.int32)})
    path = tmp_path_factory.mktemp("int4")
    (path / "config.json").write_text(json.dumps({k: v for k, v in CFG.to_dict().items() if k not in (
        "weight_prefix", "num_local_heads", "first_local_head", "qk_latent_eps")}))
    save_file(tensors, str(path / "model.safetensors"))
    want = {layer: Int4Experts.from_checkpoint(*d["gate_proj.weight"], *d["up_proj.weight"], *d["down_proj.weight"])
            for layer, d in stacked.items()}
    return str(path), want


def _routed_bytes(params) -> int:
    return sum(t.nbytes for k, t in params.items() if ".mlp.experts." in k)


def test_int4_checkpoint_loads_packed_and_matches_the_dequantised_model(int4_checkpoint):
    path, want = int4_checkpoint
    stats = {}
    packed, cfg = load_params(path, CFG, device=DEVICE, stats=stats)
    print("tiny INT4 model, loading memory:", stats)
    assert not any(k.endswith(".mlp.experts.gate_proj.weight") for k in packed)
    for layer, ex in want.items():
        got = int4_experts(packed, int(layer.split(".")[2]))
        for k in INT4_EXPERT_KEYS:
            assert torch.equal(getattr(got, k).cpu(), getattr(ex, k)), (layer, k)  # the checkpoint's bits
    assert stats["routed_expert_bytes"] == _routed_bytes(packed) > 0
    assert stats["host_rss_peak"] >= stats["host_rss_start"] > 0
    dense, _ = load_params(path, CFG, device=DEVICE, experts="dense")
    tokens = torch.randint(0, CFG.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        ref, taps_ref, _ = prefill(dense, cfg, tokens, taps=(1,))
        got, taps, _ = prefill(packed, cfg, tokens, taps=(1,))
        last, _, _ = prefill(packed, cfg, tokens, last_only=True)
    # the same weights; the W4A16 op rounds activations and h to bf16
    err = (got - ref).norm() / ref.norm()
    assert err < 2e-2, float(err)
    assert ((taps - taps_ref).norm() / taps_ref.norm()) < 2e-2
    assert last.shape == (2, 1, CFG.vocab_size) and torch.allclose(last[:, 0], got[:, -1], rtol=1e-5, atol=1e-5)


@dataclass(frozen=True)
class _NoCollectives(TPGroup):
    """A rank of a group whose sums return the rank's own part: the ranks' parts are added by the test."""

    def all_reduce_(self, x):
        return x


def test_expert_parallel_ranks_load_their_experts_packed_and_sum_to_the_layer(int4_checkpoint):
    """World 2: each rank reads only its experts, packed as the whole layer's shard_ep, and the ranks' MoE
    outputs (their experts plus their slice of the shared expert) add up to the dequantised single-process
    layer; the bytes per rank are tritree.memory's."""
    path, want = int4_checkpoint
    world, layer = 2, 1
    dense, _ = load_params(path, CFG, device=DEVICE, experts="dense")
    h = torch.randn(1, 5, CFG.hidden_size, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        ref = moe(dense, CFG, layer, h)
    total = 0
    report = memory_report(CFG, tp=world, experts="int4", activations=False).row("routed experts")
    for rank in range(world):
        local, lcfg = load_params(path, CFG, device=DEVICE, tp=TPGroup(world, rank))
        shard, first = want[f"model.layers.{layer}"].shard_ep(rank, world)
        assert first == rank * CFG.n_routed_experts // world
        got = int4_experts(local, layer)
        for k in INT4_EXPERT_KEYS:
            assert torch.equal(getattr(got, k).cpu(), getattr(shard, k)), (rank, k)
        assert _routed_bytes(local) == report.per_rank
        with torch.no_grad():
            total = total + moe(local, lcfg, layer, h, tp=_NoCollectives(world, rank))
    err = (total - ref).norm() / ref.norm()
    assert err < 2e-2, float(err)


def test_loaded_int4_bytes_equal_the_memory_report(int4_checkpoint):
    path, _ = int4_checkpoint
    params, _ = load_params(path, CFG)
    assert _routed_bytes(params) == memory_report(CFG, tp=1, experts="int4").row("routed experts").per_rank


class _LargestFloat(TorchDispatchMode):
    """The largest floating-point tensor any aten op returns while active."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.largest = max(self.largest, t.numel())
        return out


def test_packed_load_makes_no_float_copy_of_the_routed_experts(int4_checkpoint, monkeypatch):
    """No dequantisation at all (only the routed experts are INT4 here), and no float tensor as large as one
    layer's stacked gate projection: the experts go from the checkpoint's int32 / bf16 into their slots."""
    import tritree.model.loading as loading

    path, _ = int4_checkpoint

    def refuse(*a, **k):
        raise AssertionError("dequant_int4 called while loading INT4 experts packed")

    monkeypatch.setattr(loading, "dequant_int4", refuse)
    for world, rank in ((1, 0), (2, 1)):
        with _LargestFloat() as mode:
            load_params(path, CFG, tp=TPGroup(world, rank))
        one_layer = CFG.n_routed_experts // world * CFG.moe_intermediate_size * CFG.hidden_size
        assert 0 < mode.largest < one_layer, (world, mode.largest, one_layer)
    with pytest.raises(AssertionError, match="dequant_int4 called"):  # the check bites: dense loading dequantises
        load_params(path, CFG, experts="dense")


def test_int4_moe_compiles(int4_checkpoint):
    """The INT4 MoE under torch.compile (the op opaque, its fake impl traced) equals eager."""
    path, _ = int4_checkpoint
    params, cfg = load_params(path, CFG, device=DEVICE, dtype=torch.bfloat16)
    h = torch.randn(1, 3, CFG.hidden_size, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        eager = moe(params, cfg, 1, h)
        compiled = torch.compile(lambda x: moe(params, cfg, 1, x), backend="aot_eager", fullgraph=True)(h)
    assert torch.equal(compiled, eager)


def test_bench_decode_random_int4_experts_have_the_dense_spread():
    """``bench decode``'s random INT4 experts (words and scales drawn directly): int32 / bf16 in the INT4
    layout, dequantising to weights of the dense ones' N(0, 1 / fan_in) spread."""
    from tritree.bench_decode import _random_params
    from tritree.model.kimi_k2 import param_shapes

    cfg = CFG.with_(moe_intermediate_size=64)
    params = _random_params(param_shapes(cfg, "int4"), "cpu", torch.bfloat16)
    ex = int4_experts(params, 1)
    assert (ex.w13_packed.dtype, ex.w13_scale.dtype) == (torch.int32, torch.bfloat16)
    wg, _, wd = ex.dequantize()
    for w, fan_in in ((wg, cfg.hidden_size), (wd, cfg.moe_intermediate_size)):
        assert abs(float(w.std()) * fan_in**0.5 - 1) < 0.05


def test_to_kernel_layout_converts_in_place_under_its_own_keys():
    """The "mma" layout filed under ``w13_mma`` ...: the same tensors (converted in place), the same MoE output (to
    bf16 rounding), idempotent, and back to the checkpoint layout bit for bit; on the CPU the kernels' layout is the checkpoint's."""
    from tritree.model.kimi_k2 import INT4_MMA_KEYS, to_kernel_layout_

    cfg = kimi_tiny(hidden_size=256, moe_intermediate_size=256)
    params = init_params(cfg, seed=5, experts="int4")
    i = next(j for j in range(cfg.num_hidden_layers) if cfg.is_moe(j))
    p = f"model.layers.{i}.mlp.experts."
    before = {k: params[p + k].clone() for k in INT4_EXPERT_KEYS}
    ptr = params[p + "w13_packed"].data_ptr()
    h = torch.randn(1, 3, cfg.hidden_size)
    ref = moe(params, cfg, i, h)
    assert to_kernel_layout_(params, "cpu") is params and int4_experts(params, i).layout == "checkpoint"
    to_kernel_layout_(params, layout="mma")
    assert p + "w13_packed" not in params and params[p + "w13_mma"].data_ptr() == ptr
    assert int4_experts(params, i).layout == "mma"
    got = moe(params, cfg, i, h)  # the reference on the CPU (the checkpoint layout ran the interpreted kernels)
    assert ((got - ref).norm() / ref.norm()).item() < 2e-2
    to_kernel_layout_(params, layout="mma")  # idempotent
    to_kernel_layout_(params, layout="checkpoint")
    assert all(p + k not in params for k in INT4_MMA_KEYS)
    for k in INT4_EXPERT_KEYS:
        assert torch.equal(params[p + k], before[k])
