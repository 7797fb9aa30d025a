"""``python -m tritree train``: trains a tiny Kimi-K2-architecture target (MLA with YaRN, sigmoid-routed
MoE with a shared expert, layer 0 dense, bytes as tokens) on the Python standard library's own source,
then a DFlash draft for it with the DFlash recipe (target frozen, random anchors, block
``[anchor, MASK...]``, per-position loss weights ``exp(-(k-1)/gamma)``), and saves both in the Hugging
Face layout the loaders read, under ``--out`` (default ``./tritree-train-out``; the shipped pair was
written with ``--out tritree/assets/tiny``). Files whose path hashes to 0 mod 20 are held out and never trained on.
Reference PyTorch ops with autograd; runs on the CPU (minutes) or a GPU.
"""

from __future__ import annotations

import json
import math
import os
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import dflash
from .model.config import DFlashConfig, KimiK2Config
from .model.kimi_k2 import init_params, prefill
from .model.layers import rope_permutation
from .model.loading import load_dflash_params, load_params

MASK = 256  # bytes are tokens 0..255; 256 is the draft's mask token
ASSETS = Path(__file__).parent / "assets" / "tiny"


def tiny_target_config() -> KimiK2Config:
    return KimiK2Config(
        vocab_size=257, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        routed_scaling_factor=2.5, rms_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        max_position_embeddings=1024)


def tiny_draft_config(target: KimiK2Config) -> DFlashConfig:
    return DFlashConfig(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
                      "beta_slow": 1.0},
        rope_amplitude=1.0, target_layer_ids=(0, 1, 2), mask_token_id=MASK, block_size=8, windows=(None, None),
        max_position_embeddings=1024)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------

def corpus(split: str) -> list[bytes]:
    """The standard library's ``*.py`` files (tests excluded), sorted; ``split`` "train" or "heldout"."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if "test" in rel.split("/")[0] or "site-packages" in rel:
            continue
        held = zlib.crc32(rel.encode()) % 20 == 0
        if held == (split == "heldout"):
            try:
                out.append(f.read_bytes())
            except OSError:
                continue
    return out


def sample_batch(data: torch.Tensor, batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
    return torch.stack([data[s:s + seq] for s in starts.tolist()])


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------

def _trainable(params: dict) -> list:
    return [t for k, t in params.items() if not k.endswith("e_score_correction_bias")]


def train_target(cfg, data, steps, batch, seq, lr, device, log) -> dict:
    params = init_params(cfg, seed=0, device=device)
    for t in _trainable(params):
        t.requires_grad_(True)
    opt = torch.optim.AdamW(_trainable(params), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    t0 = time.time()
    for step in range(steps):
        x = sample_batch(data, batch, seq + 1, g).to(device)
        logits, _, _ = prefill(params, cfg, x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(_trainable(params), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"target step {step:5d} loss {loss.item():.3f} nats/byte ({time.time() - t0:.0f} s)")
    return {k: v.detach() for k, v in params.items()}


def draft_loss(dparams, dcfg, tparams, tcfg, x, anchors, gamma=7.0):
    """DFlash loss of blocks ``[x[a], MASK...]`` at positions ``a..a+S-1`` over context ``x[:a]``."""
    B, Ls = x.shape
    S = dcfg.block_size
    dev = x.device
    with torch.no_grad():
        _, taps, _ = prefill(tparams, tcfg, x, taps=tuple(dcfg.target_layer_ids))
    ctx = dflash.context_features(dparams, dcfg, taps)
    pos_ctx = torch.arange(Ls, device=dev)[None].expand(B, -1)
    kv_ctx = dflash.context_kv(dparams, dcfg, ctx, pos_ctx)
    visible = torch.cat([torch.arange(Ls, device=dev)[None] < anchors[:, None],
                         torch.ones(B, S, dtype=torch.bool, device=dev)], dim=1)  # [B, Ls + S]

    def attend(i, q, k, v):
        kk = torch.cat([kv_ctx[i][0], k], dim=1).transpose(1, 2)
        vv = torch.cat([kv_ctx[i][1], v], dim=1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=visible[:, None, None, :],
                                           scale=dcfg.softmax_scale, enable_gqa=True)
        return o.transpose(1, 2)

    block = torch.full((B, S), dcfg.mask_token_id, dtype=torch.long, device=dev)
    block[:, 0] = x[torch.arange(B, device=dev), anchors]
    emb = tparams["model.embed_tokens.weight"][block] * dcfg.input_embedding_scale
    positions = anchors[:, None] + torch.arange(S, device=dev)
    h = dflash.block_hidden(dparams, dcfg, emb, positions, None, attend=attend)
    logits = F.linear(h[:, 1:], tparams["lm_head.weight"])
    labels = x[torch.arange(B, device=dev)[:, None], positions[:, 1:]]
    w = torch.exp(-(torch.arange(S - 1, device=dev, dtype=torch.float32)) / gamma)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(B, S - 1)
    return (ce * w).sum() / (w.sum() * B), ce.mean(0)


def train_draft(dcfg, tparams, tcfg, data, steps, batch, seq, lr, device, log) -> dict:
    dparams = dflash.init_params(dcfg, seed=1, device=device)
    for t in dparams.values():
        t.requires_grad_(True)
    opt = torch.optim.AdamW(list(dparams.values()), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    S = dcfg.block_size
    for step in range(steps):
        x = sample_batch(data, batch, seq, g).to(device)
        anchors = torch.randint(1, seq - S, (batch,), generator=g).to(device)
        loss, per_pos = draft_loss(dparams, dcfg, tparams, tcfg, x, anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(dparams.values()), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"draft  step {step:5d} loss {loss.item():.3f} (slot 1 {per_pos[0].item():.2f}, slot {S - 1} "
                f"{per_pos[-1].item():.2f}) ({time.time() - t0:.0f} s)")
    return {k: v.detach() for k, v in dparams.items()}


# --------------------------------------------------------------------------------------------------
# Saving in the Hugging Face layout
# --------------------------------------------------------------------------------------------------

def save_target(params: dict, cfg: KimiK2Config, path: Path) -> None:
    """DeepSeek-V3 names and config keys; rope rows back to the checkpoint's interleaved order, experts
    unstacked (what :func:`tritree.model.load_params` reads)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    inv = torch.argsort(rope_permutation(cfg.qk_rope_head_dim))
    out = {}
    for k, t in params.items():
        t = t.detach().float().cpu().contiguous()
        if not cfg.rope_interleave:  # the checkpoint keeps tritree's halves layout
            pass
        elif k.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
            t = t.view(cfg.num_attention_heads, cfg.qk_head_dim, -1).clone()
            t[:, cfg.qk_nope_head_dim:] = t[:, cfg.qk_nope_head_dim:][:, inv]
            t = t.reshape(-1, t.shape[-1])
        elif k.endswith(("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_proj_with_mqa.bias")):
            t = t.clone()
            t[cfg.kv_lora_rank:] = t[cfg.kv_lora_rank:][inv]
        if ".mlp.experts." in k:
            proj = k.split("experts.")[1]
            for e in range(t.shape[0]):
                out[k.replace("experts." + proj, f"experts.{e}.{proj}")] = t[e].contiguous()
            continue
        out[k] = t
    save_file(out, str(path / "model.safetensors"))
    conf = {k: v for k, v in cfg.to_dict().items() if k not in ("weight_prefix", "num_local_heads", "first_local_head")}
    conf.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], torch_dtype="float32")
    (path / "config.json").write_text(json.dumps(conf, indent=1))


def save_draft(params: dict, cfg: DFlashConfig, path: Path) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().cpu().contiguous() for k, v in params.items()}, str(path / "model.safetensors"))
    rs = None
    if cfg.rope_scaling is not None:
        rs = dict(cfg.rope_scaling)
        rs = {"rope_type": rs.pop("type", rs.pop("rope_type", "yarn")), **rs, "attention_factor": cfg.rope_amplitude}
    # per-layer windows as Qwen3Config spells them: one sliding_window for every sliding layer
    sizes = {w for w in cfg.windows if w is not None}
    if len(sizes) > 1:
        raise ValueError(f"windows {cfg.windows}: a config.json holds one sliding_window for every sliding layer")
    windows = dict(use_sliding_window=bool(sizes), sliding_window=sizes.pop() if sizes else None, is_causal=False,
                   layer_types=["full_attention" if w is None else "sliding_attention" for w in cfg.windows])
    conf = dict(model_type="qwen3", architectures=["DFlashDraftModel"], vocab_size=cfg.vocab_size,
                hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
                rope_theta=cfg.rope_theta, rope_scaling=rs, max_position_embeddings=cfg.max_position_embeddings,
                attention_bias=cfg.attention_bias, **windows,
                dflash_config=dict(target_layer_ids=list(cfg.target_layer_ids), mask_token_id=cfg.mask_token_id,
                                   block_size=cfg.block_size, input_embedding_scale=cfg.input_embedding_scale,
                                   output_multiplier=cfg.output_multiplier,
                                   final_logit_softcapping=cfg.final_logit_softcapping),
                torch_dtype="float32")
    (path / "config.json").write_text(json.dumps(conf, indent=1))


# --------------------------------------------------------------------------------------------------
# The shipped pair (ASSETS: what ``python -m tritree train --out tritree/assets/tiny`` saved)
# --------------------------------------------------------------------------------------------------

def shipped_pair(device, dtype, tp=None):
    """The tiny target/draft pair trained by ``python -m tritree train`` and shipped in the package
    (``tp``: this rank's shards of the target and the draft), with a line that says what it is: ``(tparams, tcfg,
    dparams, dcfg, what)``."""
    tparams, tcfg = load_params(str(ASSETS / "target"), device=device, dtype=dtype, tp=tp)
    dparams, dcfg = load_dflash_params(str(ASSETS / "draft"), device=device, dtype=dtype, tp=tp)
    return tparams, tcfg, dparams, dcfg, ("the shipped tiny pair (trained on the Python standard library's source, "
                                          "bytes as tokens; tritree/assets/tiny/TRAINING.md)")


def main(args) -> int:
    os.environ["TRITON_INTERPRET"] = "0"  # the reference ops (autograd); kernels have no backward
    torch.manual_seed(0)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    train = corpus("train")
    data = torch.frombuffer(bytearray(b"\n\n".join(train)), dtype=torch.uint8).long()
    held = corpus("heldout")
    out = Path(args.out)
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    log(f"corpus: {len(train)} training files ({data.numel() / 1e6:.1f} MB), {len(held)} held-out files; device {device}")
    tcfg = tiny_target_config()
    tparams = train_target(tcfg, data, args.target_steps, args.batch, args.seq, args.lr, device, log)
    save_target(tparams, tcfg, out / "target")
    dcfg = tiny_draft_config(tcfg)
    dparams = train_draft(dcfg, tparams, tcfg, data, args.draft_steps, args.batch, args.seq, args.lr, device, log)
    save_draft(dparams, dcfg, out / "draft")
    (out / "TRAINING.md").write_text(
        "# How these checkpoints were made\n\n"
        f"Command: `python -m tritree train --out {args.out} --target-steps {args.target_steps} --draft-steps "
        f"{args.draft_steps} --batch {args.batch} --seq {args.seq} --lr {args.lr}` on {device}.\n\n"
        "Data: the Python standard library's `*.py` files (top-level test packages excluded) of the training\n"
        "machine; files whose relative path has `crc32 % 20 == 0` are held out (never trained on).\n"
        f"{len(train)} training files, {len(held)} held-out files. Tokens are bytes (0-255); 256 is the mask.\n\n"
        "Log:\n\n```\n" + "\n".join(log_lines) + "\n```\n")
    print(f"wrote {out / 'target'}, {out / 'draft'} and {out / 'TRAINING.md'}; run them with: python -m tritree "
          f"generate --model {out / 'target'} --draft {out / 'draft'}")
    return 0
