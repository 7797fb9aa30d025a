"""Kimi K2.6 verify per layer on a real-shape slice (random bf16 weights), split into attention, MLA
projections, MoE and the rest, each against its floor (issue #5).

    python -m bench.model_sweep --out model.jsonl        (GPU)

Views: TP8 (8 of 64 heads; routed experts: the rank's 48 of 384 with one routed expert per token, the
average share under expert parallelism) and TP1 (64 heads, all 384 experts, top-8). Layer 0 (dense MLP)
and layer 1 (MoE) are timed; L = 46000 committed tokens, T in {16, 64}, batch 1.
"""

from __future__ import annotations

import argparse

import torch

from tritree import tree_mask_from_parents, verify_mla
from tritree.bench_decode import _random_params
from tritree.model import kimi_k2
from tritree.model.config import kimi_k26
from tritree.roofline import append_jsonl, device_ceilings, graph_time_us, verify_mla_counts
from tritree.testing import random_trees


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--ctx", type=int, default=46_000)
    ap.add_argument("--compile", action="store_true", help="torch.compile each timed block")
    ap.add_argument("--views", default="TP8,TP1", help="comma-separated subset of TP8,TP1")
    args = ap.parse_args(argv)
    ceil = device_ceilings()
    print(f"ceilings: copy {ceil.copy_gbps:.0f} GB/s, bf16 matmul {ceil.matmul_tflops:.0f} TFLOP/s", flush=True)
    rows = []
    dev, dt, L, P = "cuda", torch.bfloat16, args.ctx, 64
    for view, heads, experts, topk in (("TP8", 8, 48, 1), ("TP1", 64, 384, 8)):
        if view not in args.views.split(","):
            continue
        cfg = kimi_k26(num_hidden_layers=2, num_local_heads=heads, n_routed_experts=experts,
                       num_experts_per_tok=topk, weight_prefix="")
        params = _random_params(kimi_k2.param_shapes(cfg), dev, dt)
        for T in (16, 64):
            pages = (L + T + P - 1) // P
            cache = {"kv": torch.randn(2, pages, P, cfg.latent_dim, device=dev, dtype=dt),
                     "page_table": torch.arange(pages, dtype=torch.int32, device=dev)[None],
                     "kv_lens": torch.full((1,), L, dtype=torch.int32, device=dev)}
            mask, depth = tree_mask_from_parents(random_trees(1, T, ("wide",)).to(dev))
            rope = kimi_k2.rope_cos_sin(cfg, (L + depth).long(), dt)
            x = torch.randn(1, T, cfg.hidden_size, device=dev, dtype=dt)
            q = torch.randn(1, T, heads, cfg.latent_dim, device=dev, dtype=dt)
            for layer in (0, 1):
                p = kimi_k2.layer_prefix(layer)
                kv = cache["kv"][layer]

                def attn_block():  # its input RMSNorm included
                    return kimi_k2.attention_verify(params, cfg, layer, x, rope, cache, mask, None, kv)

                def attention_only():
                    return verify_mla(q, kv, cache["page_table"], cache["kv_lens"], mask, sm_scale=cfg.softmax_scale)

                def mlp_block():
                    h = kimi_k2.rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
                    return kimi_k2.mlp(params, cfg, layer, h)

                def whole_layer():
                    y = x + attn_block()
                    h = kimi_k2.rms_norm(y, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
                    return y + kimi_k2.mlp(params, cfg, layer, h)

                if args.compile:  # fuses the norms, RoPE and casts around the projections
                    attn_block, mlp_block, whole_layer = (torch.compile(f, dynamic=False)
                                                          for f in (attn_block, mlp_block, whole_layer))
                t_layer = graph_time_us([whole_layer])
                t_attn_block = graph_time_us([attn_block])
                t_attn = graph_time_us([attention_only])
                t_mlp = graph_time_us([mlp_block])
                # floors
                a_bytes, a_flops = verify_mla_counts(1, T, heads, L)
                proj = [p + "self_attn." + n + ".weight" for n in
                        ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")]
                proj_bytes = sum(params[n].numel() * params[n].element_size() for n in proj)
                proj_flops = 2 * T * sum(params[n].numel() for n in proj)
                if cfg.is_moe(layer):
                    # the experts this batch actually routes to (bias-free sigmoid top-k on these inputs)
                    h = kimi_k2.rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
                    scores = torch.sigmoid(h.reshape(T, -1).float() @ params[p + "mlp.gate.weight"].float().t())
                    used = torch.topk(scores + params[p + "mlp.gate.e_score_correction_bias"], topk, -1).indices
                    n_used = int(torch.unique(used).numel())
                    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 2
                    shared = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.n_shared_experts * 2
                    mlp_bytes = n_used * per_expert + shared
                    mlp_flops = 2 * T * (topk + cfg.n_shared_experts) * 3 * cfg.hidden_size * cfg.moe_intermediate_size
                else:
                    n_used = 0
                    mlp_bytes = 3 * cfg.hidden_size * cfg.intermediate_size * 2
                    mlp_flops = 2 * T * 3 * cfg.hidden_size * cfg.intermediate_size
                parts = {
                    "attention": (t_attn, *ceil.floor_us(a_bytes, a_flops)),
                    "mla_projections": (t_attn_block - t_attn, *ceil.floor_us(proj_bytes, proj_flops)),
                    "mlp" if layer == 0 else "moe": (t_mlp, *ceil.floor_us(mlp_bytes, mlp_flops)),
                    "rest": (t_layer - t_attn_block - t_mlp, 0.0, "-"),
                }
                row = dict(view=view, compiled=args.compile, heads=heads, experts=experts, topk=topk, experts_used=n_used, T=T, L=L,
                           layer=layer, layer_us=t_layer,
                           parts={k: dict(us=v[0], floor_us=v[1], bound=v[2]) for k, v in parts.items()})
                rows.append(row)
                desc = "; ".join(f"{k} {v[0]:.1f} us (floor {v[1]:.1f} {v[2]})" for k, v in parts.items())
                print(f"{view}{' compiled' if args.compile else ''} T={T:>2} layer {layer} ({'MoE, ' + str(n_used) + ' experts used' if layer else 'dense'}): "
                      f"{t_layer:.1f} us = {desc}", flush=True)
        params.clear()  # free the slice before the next view
        torch.cuda.empty_cache()
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
