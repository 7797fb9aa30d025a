"""The DFlash draft against the reference draft model of PyPI ``dflash`` (``DFlashDraftModel``) on tiny
random checkpoints: GQA ratios 1, 2, 8, sliding windows, both RoPE amplitudes, incremental context."""

import json
import math
import os

import pytest
import torch

from tritree.model import dflash
from tritree.model.config import DFlashConfig, dflash_tiny, yarn_amplitude
from tritree.model.loading import load_dflash_params
from tritree.testing import paged_layout

from ..conftest import DEVICE


def _reference_module():
    pytest.importorskip("transformers")
    return pytest.importorskip("dflash.model", reason="the reference: pip install --no-deps dflash==0.1.0")


HIDDEN, VOCAB, N_TARGET = 32, 61, 4
LEGACY_AMPLITUDE = 1 + 0.1 * math.log(64)  # 1.41589, legacy vLLM/SGLang for K2.5-DFlash


def ref_model(heads, kv_heads, window=None, amplitude=None, layers=2, seed=0):
    dflash_ref = _reference_module()
    from transformers import Qwen3Config

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 64.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0}
    if amplitude is not None:
        rope["attention_factor"] = amplitude
    kw = dict(layer_types=["sliding_attention"] * layers, sliding_window=window, use_sliding_window=True,
              is_causal=False) if window else {}
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=4096, rope_parameters=rope, attention_bias=False,
                      num_target_layers=N_TARGET, **kw)
    cfg.dflash_config = {"target_layer_ids": [0, 2, 3], "mask_token_id": VOCAB - 1, "block_size": 5}
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = dflash_ref.DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    return model


def save(model, path):
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model.config.to_dict(), f)


def reference_hidden(model, taps, block_embed, L):
    """Reference forward of one request: context = the first L tokens' taps, block after them."""
    S = block_embed.shape[0]
    with torch.no_grad():
        return model(position_ids=torch.arange(L + S)[None], noise_embedding=block_embed[None],
                     target_hidden=taps[:L].reshape(1, L, -1))[0]


CASES = [  # (heads, kv_heads, window, amplitude)
    (4, 4, None, None),          # GQA 1, amplitude from the YaRN factor (0.1 ln 64 + 1)
    (4, 2, None, 1.0),           # GQA 2, amplitude 1.0 (K2.6-DFlash)
    (8, 1, None, LEGACY_AMPLITUDE),  # GQA 8
    (8, 1, 7, 1.0),              # sliding window, shorter than the context
    (4, 2, 3, None),             # window shorter than the block
]


@pytest.mark.parametrize("layout", ["checkpoint", "kernel"])
@pytest.mark.parametrize("heads,kv_heads,window,amplitude", CASES)
def test_draft_matches_reference_model(tmp_path, heads, kv_heads, window, amplitude, layout):
    """The checkpoint's tensors as loaded, and as the Engine holds them (``to_kernel_layout_``: q | k | v and gate | up
    rows concatenated, per-head q and k norms)."""
    model = ref_model(heads, kv_heads, window, amplitude)
    save(model, tmp_path)
    params, cfg = load_dflash_params(str(tmp_path), device=DEVICE)
    if layout == "kernel":
        dflash.to_kernel_layout_(params)
        assert dflash.to_kernel_layout_(dict(params)).keys() == params.keys()  # idempotent
        assert not any(k.endswith((".q_proj.weight", ".k_norm.weight", ".gate_proj.weight")) for k in params)
    assert cfg.windows == (window, window) and cfg.block_size == 5 and cfg.target_layer_ids == (0, 2, 3)
    want_amp = amplitude if amplitude is not None else 0.1 * math.log(64) + 1
    assert cfg.rope_amplitude == pytest.approx(want_amp)

    g = torch.Generator().manual_seed(1)
    lens = [13, 4]  # different context lengths in one batch
    B, S, n_max = 2, cfg.block_size, max(lens)
    taps = torch.randn(B, n_max, cfg.n_taps, HIDDEN, generator=g)
    embed = torch.randn(VOCAB, HIDDEN, generator=g)
    lm_head = torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN**0.5
    anchor = torch.tensor([5, 17])

    page_table, num_pages = paged_layout([n + S for n in lens], B, 4, extra_pages=1, generator=g)
    cache = dflash.new_cache(cfg, num_pages, 4, page_table.to(DEVICE), torch.zeros(B, dtype=torch.int32, device=DEVICE))
    # Context arrives in two steps (prompt, then accepted tokens), as in decoding.
    first = torch.tensor([7, 1], dtype=torch.int32)
    pos = torch.arange(n_max)[None].expand(B, -1)
    cache = dflash.materialize_context_(params, cfg, taps.to(DEVICE), pos.to(DEVICE), cache, counts=first.to(DEVICE))
    rest = torch.zeros_like(taps)
    rest_pos = torch.zeros_like(pos)
    for b in range(B):
        k = lens[b] - int(first[b])
        rest[b, :k] = taps[b, first[b]:lens[b]]
        rest_pos[b, :k] = torch.arange(int(first[b]), lens[b])
    counts = torch.tensor(lens, dtype=torch.int32) - first
    cache = dflash.materialize_context_(params, cfg, rest.to(DEVICE), rest_pos.to(DEVICE), cache,
                                        counts=counts.to(DEVICE))
    assert cache["kv_lens"].tolist() == lens

    logits = dflash.draft(params, cfg, embed.to(DEVICE), lm_head.to(DEVICE), anchor.to(DEVICE),
                          cache["kv_lens"], cache).cpu()
    assert logits.shape == (B, S - 1, VOCAB)
    if window is not None:  # the window matters at these lengths: ignoring it must show
        full = dflash.draft(params, cfg.with_(windows=(None, None)), embed.to(DEVICE), lm_head.to(DEVICE),
                            anchor.to(DEVICE), cache["kv_lens"], cache).cpu()
        assert (full - logits).abs().max() > 1e-2
    for b in range(B):
        block = torch.full((S,), cfg.mask_token_id)
        block[0] = anchor[b]
        h = reference_hidden(model, taps[b], embed[block], lens[b])
        want = model.compute_logits(h[1:], lambda x: x @ lm_head.t())
        err = (logits[b] - want).abs().max() / want.abs().max()
        assert err < 1e-4, f"request {b}: relative error {err:.3g}"


def test_config_from_hf_and_presets():
    model = ref_model(8, 1, 7, 1.0)
    cfg = DFlashConfig.from_hf(model.config.to_dict())
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.mask_token_id) == (8, 1, 16, VOCAB - 1)
    from tritree.model.config import kimi_k26_dflash
    k = kimi_k26_dflash()
    assert (k.hidden_size, k.num_hidden_layers, k.num_attention_heads, k.num_key_value_heads, k.head_dim) == \
        (7168, 6, 64, 8, 128)
    assert k.target_layer_ids == (1, 12, 24, 35, 47, 58) and k.mask_token_id == 163838 and k.block_size == 8
    assert yarn_amplitude({"type": "yarn", "factor": 64.0}) == pytest.approx(LEGACY_AMPLITUDE)
    assert yarn_amplitude({"type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0}) == 1.0
    with pytest.raises(ValueError, match="non-causal"):
        DFlashConfig.from_hf({**model.config.to_dict(), "is_causal": True})
    with pytest.raises(ValueError, match="windows"):
        dflash_tiny(windows=(None,))


def test_loading_errors(tmp_path):
    model = ref_model(4, 2)
    save(model, tmp_path)
    _, cfg = load_dflash_params(str(tmp_path))
    with pytest.raises(ValueError, match="shape"):
        load_dflash_params(str(tmp_path), cfg.with_(intermediate_size=40))
    with pytest.raises(KeyError, match="layers.2"):
        load_dflash_params(str(tmp_path), cfg.with_(num_hidden_layers=3, windows=(None,) * 3))


@pytest.mark.gpu
def test_gpu_draft_step_is_graph_capturable_and_compiles():
    cfg = dflash_tiny()
    params = dflash.init_params(cfg, device="cuda", dtype=torch.bfloat16)
    B = 2
    page_table, num_pages = paged_layout([64, 64], B, 16)
    cache = dflash.new_cache(cfg, num_pages, 16, page_table.cuda(), torch.zeros(B, dtype=torch.int32, device="cuda"),
                             dtype=torch.bfloat16)
    taps = torch.randn(B, 20, cfg.n_taps, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    cache = dflash.materialize_context_(params, cfg, taps, torch.arange(20, device="cuda")[None].expand(B, -1), cache)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    anchor = torch.tensor([3, 4], device="cuda")
    eager = dflash.draft(params, cfg, embed, embed, anchor, cache["kv_lens"], cache)
    compiled = torch.compile(lambda a: dflash.draft(params, cfg, embed, embed, a, cache["kv_lens"], cache))
    got = compiled(anchor)
    assert (got - eager).abs().max() <= 0.05 * eager.abs().max()
    g = torch.cuda.CUDAGraph()
    static = {}
    with torch.cuda.graph(g):
        static["out"] = dflash.draft(params, cfg, embed, embed, anchor, cache["kv_lens"], cache)
    static["out"].zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static["out"], eager)


@pytest.mark.gpu
@pytest.mark.parametrize("windows", [(None, None), (24, None)])
def test_gpu_draft_equals_the_cpu_reference_path(windows):
    """The GPU path (Triton draft attention, paged context) computes the CPU path's draft logits in
    fp32: a draft that is right on the CPU and subtly off on the GPU would keep outputs lossless
    (the target decides) while silently lowering acceptance."""
    cfg = dflash_tiny(block_size=8, windows=windows)
    params = dflash.init_params(cfg, dtype=torch.float32)
    B, n_ctx = 2, 45
    page_table, num_pages = paged_layout([n_ctx + 16] * B, B, 16)
    g = torch.Generator().manual_seed(0)
    taps = torch.randn(B, n_ctx, cfg.n_taps, cfg.hidden_size, generator=g)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    anchor = torch.tensor([3, 9])

    def run(dev):
        p = {k: v.to(dev) for k, v in params.items()}
        cache = dflash.new_cache(cfg, num_pages, 16, page_table.to(dev), torch.zeros(B, dtype=torch.int32, device=dev),
                                 dtype=torch.float32)
        pos = torch.arange(n_ctx, device=dev)[None].expand(B, -1)
        cache = dflash.materialize_context_(p, cfg, taps.to(dev), pos, cache)
        return dflash.draft(p, cfg, embed.to(dev), embed.to(dev), anchor.to(dev), cache["kv_lens"], cache).cpu()

    cpu, gpu = run("cpu"), run("cuda")
    assert ((gpu - cpu).norm() / cpu.norm()) < 1e-4
