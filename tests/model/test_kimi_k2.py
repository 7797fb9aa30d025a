"""Kimi K2 functions against transformers' DeepseekV3ForCausalLM on tiny random checkpoints."""

import json
import os

import pytest
import torch

from tritree import tree_mask_from_parents
from tritree.model.config import KimiK2Config, kimi_tiny
from tritree.model.kimi_k2 import prefill, rope_inv_freq, verify
from tritree.model.loading import load_params
from tritree.testing import paged_layout, random_trees

from ..conftest import DEVICE

transformers = pytest.importorskip("transformers")


def hf_model(cfg: KimiK2Config, seed=0):
    from transformers import DeepseekV3Config

    hf_cfg = DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        first_k_dense_replace=cfg.first_k_dense_replace, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads, q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
        n_routed_experts=cfg.n_routed_experts, num_experts_per_tok=cfg.num_experts_per_tok,
        n_shared_experts=cfg.n_shared_experts, n_group=cfg.n_group, topk_group=cfg.topk_group,
        routed_scaling_factor=cfg.routed_scaling_factor, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": cfg.rope_theta,
                         **{k: v for k, v in cfg.rope_scaling.items() if k != "type"}},
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # non-trivial routing and norms (HF initialises the bias to zero)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


def save(model, path, prefix=False):
    model.save_pretrained(path, max_shard_size="60KB")
    if prefix:  # K2.5 / K2.6 layout: text_config nesting and the language_model. prefix
        from safetensors.torch import load_file, save_file

        index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
        new_map = {}
        for file in set(index["weight_map"].values()):
            tensors = load_file(os.path.join(path, file))
            save_file({"language_model." + k: v for k, v in tensors.items()}, os.path.join(path, file))
        for k, v in index["weight_map"].items():
            new_map["language_model." + k] = v
        index["weight_map"] = new_map
        json.dump(index, open(os.path.join(path, "model.safetensors.index.json"), "w"))
        conf = json.load(open(os.path.join(path, "config.json")))
        json.dump({"model_type": "kimi_k25", "text_config": conf}, open(os.path.join(path, "config.json"), "w"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = kimi_tiny()
    model = hf_model(cfg)
    plain = tmp_path_factory.mktemp("plain")
    save(model, plain)
    prefixed = tmp_path_factory.mktemp("prefixed")
    save(model, prefixed, prefix=True)
    return cfg, model, str(plain), str(prefixed)


def test_checkpoint_has_several_shards(tiny):
    _, _, plain, _ = tiny
    assert len([f for f in os.listdir(plain) if f.endswith(".safetensors")]) > 2


def test_yarn_inverse_frequencies_match_transformers(tiny):
    cfg, model, _, _ = tiny
    hf = model.model.rotary_emb.inv_freq
    assert torch.allclose(rope_inv_freq(cfg), hf.float(), rtol=1e-6)


@pytest.mark.parametrize("which", ["plain", "prefixed"])
def test_prefill_logits_match_transformers(tiny, which):
    cfg, model, plain, prefixed = tiny
    path = plain if which == "plain" else prefixed
    loaded_cfg = KimiK2Config.from_hf(path)
    assert loaded_cfg.weight_prefix == ("language_model." if which == "prefixed" else "")
    params, cfg2 = load_params(path, loaded_cfg, device=DEVICE)
    tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(tokens).logits
    logits, taps, _ = prefill(params, cfg2, tokens.to(DEVICE), taps=(0, 1))  # HF hidden_states[-1] is normed
    err = (logits.cpu() - ref).norm() / ref.norm()
    assert err < 1e-5, err
    with torch.no_grad():
        hs = model(tokens, output_hidden_states=True).hidden_states
    assert torch.allclose(taps[:, :, 0].cpu(), hs[1], atol=1e-5) and torch.allclose(taps[:, :, 1].cpu(), hs[2], atol=1e-5)


def test_verify_logits_match_transformers_on_prefix_plus_ancestor_path(tiny):
    cfg, model, plain, _ = tiny
    params, cfg2 = load_params(plain, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    B, S, T, P = 2, 9, 6, 4
    prompt = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    parents = random_trees(B, T, ("random", "wide"), generator=g)
    node_tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    page_table, num_pages = paged_layout(S + T, B, P, extra_pages=2, generator=g)
    kv = torch.zeros(cfg.num_hidden_layers, num_pages, P, cfg.latent_dim)
    cache = {"kv": kv.to(DEVICE), "page_table": page_table.to(DEVICE),
             "kv_lens": torch.zeros(B, dtype=torch.int32, device=DEVICE)}
    _, _, cache = prefill(params, cfg2, prompt.to(DEVICE), cache)
    tree_mask, depth = tree_mask_from_parents(parents.to(DEVICE))
    logits, _ = verify(params, cfg2, node_tokens.to(DEVICE), depth, tree_mask, cache)
    for b in range(B):
        for i in range(T):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = int(parents[b, j])
            seq = torch.cat([prompt[b], node_tokens[b, list(reversed(path))]])
            with torch.no_grad():
                ref = model(seq[None]).logits[0, -1]
            err = (logits[b, i].cpu() - ref).norm() / ref.norm()
            assert err < 1e-4, (b, i, float(err))


def test_loading_errors(tiny, tmp_path):
    cfg, model, plain, _ = tiny
    with pytest.raises(ValueError, match="has shape"):
        load_params(plain, KimiK2Config.from_hf(plain, hidden_size=cfg.hidden_size + 8))
    with pytest.raises(KeyError, match="no tensor"):
        load_params(plain, KimiK2Config.from_hf(plain, weight_prefix="language_model."))
    from safetensors.torch import save_file
    (tmp_path / "config.json").write_text(open(os.path.join(plain, "config.json")).read())
    save_file({"model.layers.1.mlp.experts.0.down_proj.qweight": torch.zeros(2, 2, dtype=torch.int32)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unsupported quantization"):
        load_params(str(tmp_path))


def test_init_params_run_and_local_heads_view():
    cfg = kimi_tiny()
    from tritree.model import init_params
    params = init_params(cfg, seed=1)
    tokens = torch.randint(0, cfg.vocab_size, (1, 5))
    logits, _, _ = prefill(params, cfg, tokens)
    assert logits.shape == (1, 5, cfg.vocab_size) and torch.isfinite(logits).all()


def test_tensor_parallel_head_slices_load(tiny):
    """A TP2 rank's view loads only its heads' slices of q_b / kv_b / o_proj."""
    cfg, _, plain, _ = tiny
    full, _ = load_params(plain)
    half, cfg_r1 = load_params(plain, KimiK2Config.from_hf(plain, num_local_heads=2, first_local_head=2))
    name = "model.layers.0.self_attn.q_b_proj.weight"
    assert half[name].shape[0] == full[name].shape[0] // 2
    assert torch.equal(half[name], full[name][full[name].shape[0] // 2:])
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(half[o], full[o][:, full[o].shape[1] // 2:])


def test_int4_experts_and_fp8_weights_load_dequantised(tmp_path):
    """A checkpoint with INT4 (compressed-tensors) routed experts and an FP8 block-scaled projection
    loads to what dequantising by hand gives (``experts="dense"``)."""
    from safetensors.torch import save_file

    from tritree.model import init_params

    from .._quant_helpers import quantize_fp8_blocks, quantize_int4

    cfg = kimi_tiny(hidden_size=64, num_hidden_layers=2)
    params = init_params(cfg, seed=2)
    tensors, expected = {}, {}
    for name, t in params.items():
        if ".mlp.experts." in name:  # stacked -> per-expert names, INT4
            layer, proj = name.split(".mlp.experts.")
            for e in range(t.shape[0]):
                base = f"{layer}.mlp.experts.{e}.{proj[:-len('.weight')]}"
                packed, scale, deq = quantize_int4(t[e])
                tensors.update({base + ".weight_packed": packed, base + ".weight_scale": scale,
                                base + ".weight_shape": torch.tensor(list(t[e].shape), dtype=torch.int32)})
                expected.setdefault(name, []).append(deq)
        elif name.endswith("q_a_proj.weight"):
            w8, scale_inv, deq = quantize_fp8_blocks(t)
            tensors[name] = w8
            tensors[name + "_scale_inv"] = scale_inv
            expected[name] = deq
        else:  # plain tensors (rope rows get permuted again at load; not compared here)
            tensors[name] = t.contiguous()
    import json as _json
    (tmp_path / "config.json").write_text(_json.dumps({**{k: v for k, v in cfg.to_dict().items() if k not in (
        "weight_prefix", "num_local_heads", "first_local_head", "qk_latent_eps")}}))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded, _ = load_params(str(tmp_path), cfg, experts="dense")
    for name, want in expected.items():
        want = torch.stack(want) if isinstance(want, list) else want
        assert torch.equal(loaded[name].cpu(), want), name


@pytest.mark.gpu
@pytest.mark.parametrize("experts", ["dense", "int4"])
def test_gpu_verify_is_graph_capturable_and_compiles(experts):
    """The whole verify call (tree KV write, verify_mla, grouped MoE: bf16 or the W4A16 op) in one CUDA
    graph; and under torch.compile. Passed on the H200: bench/RESULTS.md, section "GPU test suite"."""
    from tritree.model import init_params

    cfg = kimi_tiny(hidden_size=64)  # whole 32-column groups for INT4
    params = init_params(cfg, seed=4, device="cuda", experts=experts)
    g = torch.Generator().manual_seed(5)
    B, S, T, P = 2, 12, 8, 4
    prompt = torch.randint(0, cfg.vocab_size, (B, S), generator=g).cuda()
    page_table, num_pages = paged_layout(S + T, B, P, generator=g)
    cache = {"kv": torch.zeros(cfg.num_hidden_layers, num_pages, P, cfg.latent_dim, device="cuda"),
             "page_table": page_table.cuda(), "kv_lens": torch.zeros(B, dtype=torch.int32, device="cuda")}
    _, _, cache = prefill(params, cfg, prompt, cache)
    tree_mask, depth = tree_mask_from_parents(random_trees(B, T, ("random",), generator=g).cuda())
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=g).cuda()
    eager, _ = verify(params, cfg, tokens, depth, tree_mask, cache)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        verify(params, cfg, tokens, depth, tree_mask, cache)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_logits, _ = verify(params, cfg, tokens, depth, tree_mask, cache)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(static_logits, eager, rtol=1e-4, atol=1e-4)
    compiled = torch.compile(lambda t: verify(params, cfg, t, depth, tree_mask, cache)[0])
    assert torch.allclose(compiled(tokens), eager, rtol=1e-3, atol=1e-3)
