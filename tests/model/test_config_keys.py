"""Every config key of a checkpoint is implemented (parity with transformers' DeepseekV3ForCausalLM and
PyPI dflash's DFlashDraftModel on tiny random checkpoints), ignored because it has no effect on
inference, or refused at load; the README's tables are the code's."""

import json
import os
import re
import warnings

import pytest
import torch

from tritree import tree_mask_from_parents
from tritree.model import dflash
from tritree.model.config import DRAFT_CONFIG_KEYS, ROPE_CONFIG_KEYS, TARGET_CONFIG_KEYS, DFlashConfig, KimiK2Config
from tritree.model.kimi_k2 import prefill, rope_inv_freq, verify
from tritree.model.loading import load_dflash_params, load_params
from tritree.testing import paged_layout

from ..conftest import DEVICE

transformers = pytest.importorskip("transformers")

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
TABLES = {"TARGET_CONFIG_KEYS": TARGET_CONFIG_KEYS, "DRAFT_CONFIG_KEYS": DRAFT_CONFIG_KEYS,
          "ROPE_CONFIG_KEYS": ROPE_CONFIG_KEYS}


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

def readme_tables() -> dict:
    """``{table name: {key: (handling, note)}}`` from the README's "Config keys" section."""
    text = open(README).read()
    out, current = {}, None
    for line in text.split("### Config keys", 1)[1].split("\n#", 1)[0].splitlines():
        m = re.search(r"`(\w+_CONFIG_KEYS)`", line)
        if m and not line.startswith("|"):
            current = out.setdefault(m.group(1), {})
            continue
        if current is None or not line.startswith("| `"):
            continue
        keys, handling, note = (c.strip() for c in line.strip().strip("|").split("|"))
        for k in keys.split(","):
            current[k.strip().strip("`")] = (handling, note)
    return out


def test_readme_table_is_the_code_table():
    tables = readme_tables()
    assert set(tables) == set(TABLES)
    for name, table in TABLES.items():
        assert tables[name] == {k: (r.handling, r.note) for k, r in table.items()}, name


def test_every_transformers_and_dflash_key_is_in_the_table():
    from transformers import DeepseekV3Config, Qwen3Config

    target = DeepseekV3Config(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                               "original_max_position_embeddings": 64, "mscale": 1.0,
                                               "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                               "truncate": True, "attention_factor": 1.0}).to_dict()
    assert set(target) - set(TARGET_CONFIG_KEYS) == set()
    assert {"rope_scaling." + k for k in target["rope_parameters"]} <= set(ROPE_CONFIG_KEYS)
    from transformers.modeling_rope_utils import RopeParameters
    assert {"rope_scaling." + k for k in RopeParameters.__annotations__} <= set(ROPE_CONFIG_KEYS)
    # DeepSeek's own config.json keys (custom-code checkpoints, Kimi K2.x)
    assert {"moe_layer_freq", "topk_method", "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size",
            "num_nextn_predict_layers", "quantization_config"} <= set(TARGET_CONFIG_KEYS)
    assert set(Qwen3Config().to_dict()) - set(DRAFT_CONFIG_KEYS) == set()
    dflash_keys = {"target_layer_ids", "num_target_layers", "mask_token_id", "block_size", "input_embedding_scale",
                   "output_multiplier", "final_logit_softcapping", "conv_kernel_size", "conv_group_size",
                   "selector_rank", "selector_top_k", "is_causal", "dflash_config"}
    assert dflash_keys <= set(DRAFT_CONFIG_KEYS)
    # every field tritree writes into a config.json is a key it reads
    assert set(KimiK2Config().to_dict()) <= set(TARGET_CONFIG_KEYS)


def test_missing_keys_take_transformers_defaults():
    from transformers import DeepseekV3Config, Qwen3Config

    minimal = {"num_hidden_layers": 2}
    cfg, hf = KimiK2Config.from_hf(minimal), DeepseekV3Config(**minimal)
    for k in ("vocab_size", "hidden_size", "num_attention_heads", "n_routed_experts", "n_group", "topk_group",
              "first_k_dense_replace", "routed_scaling_factor", "rms_norm_eps", "max_position_embeddings",
              "q_lora_rank", "rope_interleave", "attention_bias", "norm_topk_prob", "tie_word_embeddings"):
        assert getattr(cfg, k) == getattr(hf, k), k
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] and cfg.rope_scaling is None
    draft = {"num_hidden_layers": 2, "num_key_value_heads": 4, "dflash_config": {"mask_token_id": 3,
                                                                                  "target_layer_ids": [0]}}
    d, q = DFlashConfig.from_hf(draft), Qwen3Config(**{k: v for k, v in draft.items() if k != "dflash_config"})
    for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "max_position_embeddings", "attention_bias"):
        assert getattr(d, k) == getattr(q, k), k
    assert d.rope_theta == q.rope_parameters["rope_theta"] and d.windows == (None, None)
    assert d.block_size == 16  # dflash's default


# --------------------------------------------------------------------------------------------------
# Target: RoPE variants against transformers' rotary embedding and attention scale (no weights)
# --------------------------------------------------------------------------------------------------

ROPE_CASES = {
    "default": None,
    "mscale_differs": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 2.0,
                       "mscale_all_dim": 1.0},
    "no_mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    "attention_factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                         "attention_factor": 0.7, "mscale_all_dim": 0.5},
    "factor_from_lengths": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64,
                            "truncate": False, "beta_fast": 16.0},
    "old_name": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 500.0},
}


@pytest.mark.parametrize("case", ROPE_CASES)
def test_target_rope_parameters_match_transformers(case):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    rope = ROPE_CASES[case]
    kw = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, qk_rope_head_dim=16, qk_nope_head_dim=8, max_position_embeddings=512,
              rope_theta=2000.0)
    if rope is not None:
        kw["rope_scaling" if "type" in rope else "rope_parameters"] = dict(rope)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_cfg = DeepseekV3Config(**kw)
    rotary = DeepseekV3RotaryEmbedding(hf_cfg)
    cfg = KimiK2Config.from_hf(hf_cfg.to_dict(), strict=True)
    assert torch.allclose(rope_inv_freq(cfg), rotary.inv_freq.float(), rtol=1e-6)
    assert cfg.rope_amplitude == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert cfg.softmax_scale == pytest.approx(DeepseekV3Attention(hf_cfg, 0).scaling, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Target: whole-model parity per implemented key
# --------------------------------------------------------------------------------------------------

def hf_tiny(**over):
    """A 2-layer DeepSeek-V3 (layer 0 dense, layer 1 MoE) with random weights, norms and biases."""
    from transformers import DeepseekV3Config

    kw = dict(vocab_size=53, hidden_size=32, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=2,
              first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16,
              qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2,
              n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.0, rms_norm_eps=1e-5,
              max_position_embeddings=256, tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                               "original_max_position_embeddings": 32, "mscale": 1.0, "mscale_all_dim": 1.0})
    kw.update(over)
    hf_cfg = DeepseekV3Config(**kw)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


TARGET_CASES = {
    "rope_interleave_false": dict(rope_interleave=False),
    "yarn_amplitude": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 32, "mscale": 1.5,
                                            "mscale_all_dim": 0.5}),
    "attention_bias": dict(attention_bias=True),
    "q_lora_rank_none": dict(q_lora_rank=None),
    "norm_topk_prob_false": dict(norm_topk_prob=False),
    "n_group_2_topk_group_1": dict(n_group=2, topk_group=1),
    "first_k_dense_replace_0": dict(first_k_dense_replace=0),
    "tie_word_embeddings": dict(tie_word_embeddings=True),
    "default_rope": dict(rope_parameters={"rope_type": "default", "rope_theta": 300.0}),
}


@pytest.mark.parametrize("case", TARGET_CASES)
def test_target_key_matches_transformers(tmp_path, case):
    """Prefill logits of a prompt, and verify logits of a chain of tree nodes after it, against
    transformers on the whole sequence."""
    model = hf_tiny(**TARGET_CASES[case])
    model.save_pretrained(tmp_path)
    cfg = KimiK2Config.from_hf(str(tmp_path), strict=True)
    params, cfg = load_params(str(tmp_path), cfg, device=DEVICE)
    g = torch.Generator().manual_seed(1)
    S, T = 6, 3
    seq = torch.randint(0, cfg.vocab_size, (1, S + T), generator=g)
    with torch.no_grad():
        ref = model(seq).logits[0]
    page_table, num_pages = paged_layout(S + T, 1, 4, generator=g)
    cache = {"kv": torch.zeros(cfg.num_hidden_layers, num_pages, 4, cfg.latent_dim, device=DEVICE),
             "page_table": page_table.to(DEVICE), "kv_lens": torch.zeros(1, dtype=torch.int32, device=DEVICE)}
    logits, _, cache = prefill(params, cfg, seq[:, :S].to(DEVICE), cache)
    err = (logits[0].cpu() - ref[:S]).norm() / ref[:S].norm()
    assert err < 1e-5, err
    tree_mask, depth = tree_mask_from_parents(torch.arange(-1, T - 1, dtype=torch.int32, device=DEVICE)[None])
    logits, _ = verify(params, cfg, seq[:, S:].to(DEVICE), depth, tree_mask, cache)
    err = (logits[0].cpu() - ref[S:]).norm() / ref[S:].norm()
    assert err < 1e-4, err


# --------------------------------------------------------------------------------------------------
# Target: refusals
# --------------------------------------------------------------------------------------------------

BASE_TARGET = {k: v for k, v in KimiK2Config(num_hidden_layers=2).to_dict().items()
               if k not in ("weight_prefix", "num_local_heads", "first_local_head")}

TARGET_REFUSED = [
    ("hidden_act", "gelu"),
    ("num_key_value_heads", 8),
    ("moe_layer_freq", 2),
    ("topk_method", "group_limited_greedy"),
    ("scoring_func", "softmax"),
    ("quantization_config", {"quant_method": "gptq", "bits": 4}),
    ("quantization_config", {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 128}}}}),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [64, 64]}),
    ("qk_latent_eps", 1e-5),
    ("weight_prefix", "language_model."),
    ("num_local_heads", 8),
    ("first_local_head", 8),
    ("partial_rotary_factor", 0.5),
    ("n_group", None),
    ("rope_scaling.rope_type", "linear"),
    ("rope_scaling.partial_rotary_factor", 0.5),
]


@pytest.mark.parametrize("key,value", TARGET_REFUSED, ids=[f"{k}={v}" for k, v in TARGET_REFUSED])
def test_target_refuses(key, value):
    raw = dict(BASE_TARGET)
    if key.startswith("rope_scaling."):
        raw["rope_scaling"] = {**raw["rope_scaling"], key.split(".")[1]: value}
    else:
        raw[key] = value
    with pytest.raises(ValueError, match=re.escape(key)):
        KimiK2Config.from_hf(raw)


def test_refusal_names_the_value_and_what_is_supported():
    with pytest.raises(ValueError, match=r"'scoring_func' = 'softmax' is not supported; tritree supports sigmoid"):
        KimiK2Config.from_hf({**BASE_TARGET, "scoring_func": "softmax"})


def test_unknown_keys_warn_or_with_strict_raise():
    raw = {**BASE_TARGET, "use_magic_routing": True}
    with pytest.warns(UserWarning, match="use_magic_routing"):
        KimiK2Config.from_hf(raw)
    with pytest.raises(ValueError, match="use_magic_routing"):
        KimiK2Config.from_hf(raw, strict=True)
    with pytest.raises(ValueError, match="use_magic_routing"):
        DFlashConfig.from_hf({**DRAFT_BASE, "use_magic_routing": 1}, strict=True)


# --------------------------------------------------------------------------------------------------
# Draft: parity per implemented key, refusals
# --------------------------------------------------------------------------------------------------

DRAFT_BASE = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 41, "intermediate_size": 48,
              "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 40, "block_size": 4}}

# (reference config kwargs, config.json edits: Qwen3Config saves its derived values, a hand-written
# config.json need not)
DRAFT_CASES = {
    "final_logit_softcapping": (dict(dflash={"final_logit_softcapping": 1.5}), {}),
    "attention_bias": (dict(attention_bias=True), {}),
    "sliding_window_without_use_sliding_window": (dict(layer_types=["sliding_attention"] * 2, sliding_window=3,
                                                       use_sliding_window=False, is_causal=False),
                                                  {"sliding_window": 3}),
    "max_window_layers": (dict(use_sliding_window=True, sliding_window=3, max_window_layers=1, is_causal=False),
                          {"layer_types": None}),
}


def draft_reference(attention_bias=False, dflash=None, **kw):
    dflash_ref = pytest.importorskip("dflash.model", reason="the reference: pip install --no-deps dflash==0.1.0")
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=41, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 16},
                      attention_bias=attention_bias, num_target_layers=3, **kw)
    cfg.dflash_config = {"target_layer_ids": [0, 2], "mask_token_id": 40, "block_size": 4, **(dflash or {})}
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = dflash_ref.DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    return model


@pytest.mark.parametrize("case", DRAFT_CASES)
def test_draft_key_matches_dflash(tmp_path, case):
    from .test_dflash import reference_hidden, save

    kw, edits = DRAFT_CASES[case]
    model = draft_reference(**kw)
    save(model, tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    conf.update({k: v for k, v in edits.items() if v is not None})
    for k in (k for k, v in edits.items() if v is None):
        del conf[k]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    params, cfg = load_dflash_params(str(tmp_path), DFlashConfig.from_hf(str(tmp_path), strict=True), device=DEVICE)
    g = torch.Generator().manual_seed(1)
    L, S, H, V = 9, cfg.block_size, cfg.hidden_size, cfg.vocab_size
    taps = torch.randn(1, L, cfg.n_taps, H, generator=g)
    embed = torch.randn(V, H, generator=g)
    lm_head = 2 * torch.randn(V, H, generator=g) / H**0.5
    page_table, num_pages = paged_layout(L + S, 1, 4, generator=g)
    cache = dflash.new_cache(cfg, num_pages, 4, page_table.to(DEVICE), torch.zeros(1, dtype=torch.int32, device=DEVICE))
    cache = dflash.materialize_context_(params, cfg, taps.to(DEVICE), torch.arange(L, device=DEVICE)[None], cache)
    anchor = torch.tensor([5])
    logits = dflash.draft(params, cfg, embed.to(DEVICE), lm_head.to(DEVICE), anchor.to(DEVICE), cache["kv_lens"],
                          cache).cpu()[0]
    block = torch.full((S,), cfg.mask_token_id)
    block[0] = anchor[0]
    want = model.compute_logits(reference_hidden(model, taps[0], embed[block], L)[1:], lambda x: x @ lm_head.t())
    err = (logits - want).abs().max() / want.abs().max()
    assert err < 1e-4, err


def test_draft_taps_default_from_num_target_layers():
    for layers, n_target in ((2, 4), (6, 61), (1, 9), (3, 20)):
        raw = {**DRAFT_BASE, "num_hidden_layers": layers, "num_target_layers": n_target,
               "dflash_config": {"mask_token_id": 40}}
        model = pytest.importorskip("dflash.model")
        assert list(DFlashConfig.from_hf(raw).target_layer_ids) == model.build_target_layer_ids(n_target, layers)


DRAFT_REFUSED = [
    ("hidden_act", "gelu_pytorch_tanh"),
    ("partial_rotary_factor", 0.5),
    ("is_causal", True),
    ("conv_kernel_size", 4),
    ("selector_rank", 16),
    ("layer_types", ["full_attention", "chunked_attention"]),
    ("rope_scaling.rope_type", "longrope"),
]


@pytest.mark.parametrize("key,value", DRAFT_REFUSED, ids=[f"{k}={v}" for k, v in DRAFT_REFUSED])
def test_draft_refuses(key, value):
    raw = dict(DRAFT_BASE)
    if key.startswith("rope_scaling."):
        raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, key.split(".")[1]: value}
    else:
        raw[key] = value
    with pytest.raises(ValueError, match=re.escape(key)):
        DFlashConfig.from_hf(raw)


def test_draft_refuses_causal_sliding_layers_and_missing_keys():
    with pytest.raises(ValueError, match="is_causal"):  # dflash makes a sliding layer causal by default
        DFlashConfig.from_hf({**DRAFT_BASE, "use_sliding_window": True, "sliding_window": 3,
                              "layer_types": ["sliding_attention"] * 2})
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig.from_hf({**DRAFT_BASE, "dflash_config": {"target_layer_ids": [0]}})
    with pytest.raises(ValueError, match="target_layer_ids"):
        DFlashConfig.from_hf({**DRAFT_BASE, "dflash_config": {"mask_token_id": 1}})
    with pytest.raises(ValueError, match="conv_group_size"):  # DFlash2, under dflash_config
        DFlashConfig.from_hf({**DRAFT_BASE, "dflash_config": {**DRAFT_BASE["dflash_config"], "conv_group_size": 8}})


def test_widths_the_kernels_cannot_tile_are_refused_at_load():
    """Widths verify_mla (latent, rope: powers of two >= 16) and draft_attention (head: a power of two in
    [16, 256]) cannot run are refused when the config is made, not at the first kernel launch."""
    from tritree.model.config import dflash_tiny, kimi_tiny

    for k, v in (("kv_lora_rank", 24), ("qk_rope_head_dim", 8)):
        with pytest.raises(ValueError, match=k):
            kimi_tiny(**{k: v})
    for v in (8, 48, 512):
        with pytest.raises(ValueError, match="head_dim"):
            dflash_tiny(head_dim=v)
