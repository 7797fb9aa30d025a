"""The shared model layers (``tritree/model/layers.py``) against their float64 formulas, and how many
kernels a layer of either model launches in an eager call (host time follows that count)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from tritree.model import dflash, kimi_k2
from tritree.model.config import dflash_tiny, kimi_tiny
from tritree.model.layers import apply_rope, cos_sin, inv_freq_kept, rms_norm, yarn_inv_freq


def _rms_norm_hf(x, w, eps):
    """transformers' DeepseekV3RMSNorm: float32 statistics, rounded to x's dtype, then the weight."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 5), d=st.sampled_from([1, 7, 64, 96]), dtype=st.sampled_from(["float32", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_rms_norm_matches_the_float64_formula(rows, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    x = (torch.randn(rows, d, generator=g) * 3).to(dt)
    w = (torch.rand(d, generator=g) + 0.5).to(dt)
    x64 = x.double()
    ref = w.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == dt and out.shape == x.shape
    tol = dict(rtol=1e-5, atol=1e-6) if dt == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    # transformers rounds before the weight: at most a unit in the last place apart
    torch.testing.assert_close(out, _rms_norm_hf(x, w, 1e-6), **tol)


def test_rms_norm_weight_of_another_dtype_promotes():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.rand(8, dtype=torch.float32) + 0.5
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _rms_norm_hf(x, w, 1e-6))


@settings(max_examples=25, deadline=None)
@given(half=st.integers(1, 32), n=st.integers(1, 6), amplitude=st.sampled_from([1.0, 0.7]), seed=st.integers(0, 2**16))
def test_rope_tables_and_rotation_match_rotate_half(half, n, amplitude, seed):
    g = torch.Generator().manual_seed(seed)
    inv = torch.rand(half, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 50_000, (2, n), generator=g)
    x = torch.randn(2, n, 3, 2 * half, generator=g, dtype=torch.float64)
    cos, sin = cos_sin(inv, pos, torch.float64, amplitude)
    ang = pos[..., None].double() * inv
    c, s = torch.cat([ang.cos(), ang.cos()], -1) * amplitude, torch.cat([ang.sin(), ang.sin()], -1) * amplitude
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    ref = x * c[:, :, None] + rot * s[:, :, None]
    torch.testing.assert_close(apply_rope(x, cos[:, :, None], sin[:, :, None]), ref, rtol=1e-5, atol=1e-5)


def test_inv_freq_is_kept_per_configuration():
    rs = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}
    a = inv_freq_kept(16, 1e4, rs)
    assert a is inv_freq_kept(16, 1e4, dict(rs))
    assert torch.equal(a, yarn_inv_freq(16, 1e4, rs))
    assert not torch.equal(inv_freq_kept(16, 1e4, {**rs, "factor": 4.0}), a)
    assert torch.equal(inv_freq_kept(16, 1e4, None), yarn_inv_freq(16, 1e4, None))


# --------------------------------------------------------------------------------------------------
# Kernels launched per layer (eager): the host time of an eager step is about this count times a launch
# --------------------------------------------------------------------------------------------------

class _Launches(TorchDispatchMode):
    """Counts dispatched aten ops that are not views (a view launches nothing), on the CPU path: ``F.rms_norm``
    counts as one (one fused kernel on a GPU; on the CPU it dispatches its parts), a tritree op as one.
    Counted on a second call (the first also fills what is kept across calls, e.g. the rope frequencies)."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.inside = 0
        self.active = False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and not func.is_view and func is not torch.ops.aten._unsafe_view.default:
            self.n += 1
        return func(*args, **(kwargs or {}))

    def one(self, fn):
        def counted(*a, **k):
            if self.active and not self.inside:
                self.n += 1
            self.inside += 1
            try:
                return fn(*a, **k)
            finally:
                self.inside -= 1
        return counted


def _launches(monkeypatch, modules, names, run) -> int:
    counter = _Launches()
    monkeypatch.setattr(torch.nn.functional, "rms_norm", counter.one(torch.nn.functional.rms_norm))
    for mod in modules:
        for name in names:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, counter.one(getattr(mod, name)))
    run()
    with counter:
        run()
    monkeypatch.undo()
    return counter.n


def _draft_launches(monkeypatch, layers: int) -> int:
    tcfg = kimi_tiny()
    dcfg = dflash_tiny(tcfg, num_hidden_layers=layers)
    params = dflash.to_kernel_layout_(dflash.init_params(dcfg, seed=0))  # as the Engine holds them
    B, S = 2, dcfg.block_size
    x = torch.randn(B, S, dcfg.hidden_size)
    positions = torch.arange(S)[None].expand(B, S) + 5

    def attend(i, q, k, v):
        return q
    return _launches(monkeypatch, (dflash,), ("fused_linear", "head_norm_rope"),
                     lambda: dflash.block_hidden(params, dcfg, x, positions, None, attend=attend))


def _target_launches(monkeypatch, layers: int) -> int:
    cfg = kimi_tiny(num_hidden_layers=layers)
    params = kimi_k2.to_kernel_layout_(kimi_k2.init_params(cfg, seed=0))  # as the Engine holds them
    B, T, P = 1, 5, 8
    pages = 4
    cache = {"kv": torch.zeros(layers, pages, P, cfg.latent_dim), "page_table": torch.arange(pages, dtype=torch.int32)[None],
             "kv_lens": torch.full((B,), 7, dtype=torch.int32)}
    tokens = torch.randint(0, cfg.vocab_size, (B, T), dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1, 2]], dtype=torch.int32)
    from tritree.kernels import tree_mask_from_parents
    mask, depth = tree_mask_from_parents(parents)
    names = ("verify_mla", "kv_write_", "moe_route", "routed_experts", "routed_experts_int4", "fused_linear",
             "mla_query_", "mla_output")
    return _launches(monkeypatch, (kimi_k2,), names, lambda: kimi_k2.verify(params, cfg, tokens, depth, mask, cache))


# Per layer, counted as the difference of a 3- and a 2-layer model (so fixed costs are left out; the attention is
# replaced by the identity here): the draft's 4 projections (``kernels.linear``: q | k | v with the input norm in the
# launch, gate|up with the post-attention norm and SiLU-and-mul, o_proj and down with the residual adds), the per-head
# norms and rotation of q and k (``kernels.head_norm_rope``, one launch) (5);
# the target's MoE layer (kimi_tiny's layers after the first, its params as the Engine holds them): the attention
# block (the input norm with q_a and kv_a, the q_a norm with q_b: ``kernels.linear`` both; ``mla_query_``,
# ``verify_mla``, ``mla_output``, ``o_proj`` with the residual), the post-attention norm, router (one op:
# ``moe_route``), routed and shared experts, the residual add (16). Hand-written norms and per-layer rope tables
# cost more (45 and 87 in an earlier count). Raise a bound only for a reason: an eager step's host time is about
# this count times one launch (~5-10 us on the H200's host).
DRAFT_LAUNCHES_PER_LAYER = 5
TARGET_MOE_LAUNCHES_PER_LAYER = 16


def test_draft_layer_launches_are_bounded(monkeypatch):
    per_layer = _draft_launches(monkeypatch, 3) - _draft_launches(monkeypatch, 2)
    assert per_layer <= DRAFT_LAUNCHES_PER_LAYER, per_layer


def test_target_layer_launches_are_bounded(monkeypatch):
    per_layer = _target_launches(monkeypatch, 3) - _target_launches(monkeypatch, 2)
    assert per_layer <= TARGET_MOE_LAUNCHES_PER_LAYER, per_layer


def test_rope_tables_are_computed_once_per_forward(monkeypatch):
    """The target's rope tables are built once per verify, not once per layer."""
    calls = []
    real = kimi_k2.rope_cos_sin
    monkeypatch.setattr(kimi_k2, "rope_cos_sin", lambda *a, **k: calls.append(1) or real(*a, **k))
    _target_launches(monkeypatch, 3)  # two forwards of a 3-layer model
    assert len(calls) == 2
