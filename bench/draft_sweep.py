"""DFlash draft on a GPU: ``draft_attention`` at the Kimi-K2.6-DFlash shapes against its floor and a
PyTorch SDPA baseline, and one whole draft step (context materialisation + block forward + lm_head)
with K2.6-DFlash dimensions and random weights against the weight-bandwidth floor.

    python -m bench.draft_sweep --out draft.jsonl [--configs "BM,BN,w,s;..."] [--no-step]   (GPU)
    python -m bench.draft_sweep --smoke                                                     (CPU interpreter)
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

from tritree import draft_attention
from tritree.kernels.configs import AttnConfig
from tritree.roofline import append_jsonl
from tritree.testing import paged_layout


def _sdpa_peer(q, k, v, window):
    """PyTorch SDPA over contiguous ``[B, Hkv, L + S, D]`` K/V (no paging: the baseline's best case)."""
    B, S, Hq, D = q.shape
    mask = None
    if window is not None:
        n = k.shape[2]
        q_pos = n - S + torch.arange(S, device=q.device)
        mask = (q_pos[:, None] - torch.arange(n, device=q.device)[None]).abs() < window
    return F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True)


def attention_rows(args, timer, ceil, dev):
    Hq, Hkv, D, P = 64, 8, 128, 64
    if args.smoke:
        Hq, Hkv, D, P = 8, 2, 16, 16
        grid = list(itertools.product([1], [8], [100, 300], [None, 64]))
    else:
        grid = list(itertools.product([1, 4], [8, 16], [4096, 16384, 46000, 131072], [None, 4096]))
    configs = [None] + [AttnConfig(*map(int, c.split(","))) for c in args.configs.split(";") if c]
    rows = []
    if args.filter:
        grid = [g for g in grid if eval(args.filter, {}, dict(zip("B S L window".split(), g)))]
    for B, S, L, window in grid:
        keys = min(L, window - 1) if window else L
        nbytes = B * keys * Hkv * D * 2 * 2 + 2 * B * S * Hq * D * 2
        flops = 4 * B * S * Hq * (keys + S) * D
        floor, bound = ceil(nbytes, flops)
        sets = 1 if args.smoke else max(1, min(16, (256 << 20) // max(1, B * L * Hkv * D * 4)))
        page_table, num_pages = paged_layout([L] * B, B, P, fragmented=True)
        page_table = page_table.to(dev)
        lens = torch.full((B,), L, dtype=torch.int32, device=dev)
        inputs = []
        for _ in range(sets):
            kc = torch.randn(num_pages, P, Hkv, D, device=dev, dtype=args.dtype)
            vc = torch.randn_like(kc)
            q = torch.randn(B, S, Hq, D, device=dev, dtype=args.dtype)
            kb = torch.randn(B, S, Hkv, D, device=dev, dtype=args.dtype)
            inputs.append((q, kc, vc, kb, kb.clone()))
        for cfg in configs:
            fns = [lambda a=a: draft_attention(a[0], a[1], a[2], page_table, lens, a[3], a[4], sm_scale=D**-0.5,
                                               window=window, config=cfg) for a in inputs]
            us = timer(fns)
            name = "tritree" if cfg is None else "tritree " + ",".join(map(str, (cfg.block_m, cfg.block_n, cfg.num_warps,
                                                                                  cfg.num_stages))) \
                + (" hoist" if cfg.hoist_pages else "")
            rows.append(dict(op="draft_attention", variant=name, B=B, S=S, L=L, window=window, us=us, floor_us=floor,
                             bound=bound, x_floor=us / floor))
            print(f"{name:24s} B={B} S={S:>2} L={L:>6} window={str(window):>5}: {us:8.1f} us  floor {floor:7.1f} us "
                  f"({bound})  {us / floor:5.2f}x", flush=True)
        if not args.smoke and not args.no_sdpa and B * L <= 200_000:  # the SDPA peer on contiguous K/V
            ctx = [(a[0], torch.randn(B, Hkv, L + S, D, device=dev, dtype=args.dtype)) for a in inputs[:2]]
            fns = [lambda c=c: _sdpa_peer(c[0], c[1], c[1], window) for c in ctx]
            us = timer(fns)
            rows.append(dict(op="draft_attention", variant="torch_sdpa", B=B, S=S, L=L, window=window, us=us,
                             floor_us=floor, bound=bound, x_floor=us / floor))
            print(f"{'torch_sdpa (contiguous)':24s} B={B} S={S:>2} L={L:>6} window={str(window):>5}: {us:8.1f} us  "
                  f"{us / floor:5.2f}x", flush=True)
    return rows


def step_rows(args, timer, ceil, dev):
    """One draft step at K2.6-DFlash dimensions (``--layers`` draft layers), batch 1, context L."""
    from tritree.model import dflash
    from tritree.model.config import dflash_tiny, kimi_k26_dflash

    cfg = dflash_tiny(block_size=8) if args.smoke else kimi_k26_dflash()
    L, accepted, P = (200, 5, 16) if args.smoke else (args.ctx, 5, 64)
    params = {k: (torch.randn(shape, device=dev, dtype=args.dtype) * (1.0 if k.endswith("norm.weight") else shape[-1] ** -0.5))
              for k, shape in dflash.param_shapes(cfg).items()}  # on the device: 3.5B values
    V = cfg.vocab_size
    embed = torch.randn(V, cfg.hidden_size, device=dev, dtype=args.dtype) * 0.02
    lm_head = torch.randn(V, cfg.hidden_size, device=dev, dtype=args.dtype) * 0.02
    page_table, num_pages = paged_layout([L + 64], 1, P, fragmented=False)
    page_table = page_table.to(dev)
    cache = dflash.new_cache(cfg, num_pages, P, page_table, torch.full((1,), L, dtype=torch.int32, device=dev),
                             dtype=args.dtype)
    cache["kv"].normal_()
    taps = torch.randn(1, accepted, cfg.n_taps, cfg.hidden_size, device=dev, dtype=args.dtype)
    lens0 = cache["kv_lens"].clone()
    anchor = torch.tensor([7], device=dev)

    def step():
        cache["kv_lens"].copy_(lens0)
        pos = lens0[:, None].long() + torch.arange(accepted, device=dev)
        c = dflash.materialize_context_(params, cfg, taps, pos, cache)
        return dflash.draft(params, cfg, embed, lm_head, anchor, c["kv_lens"], c)

    if args.compile:  # fuses the norms, RoPE, casts and concatenations between the GEMMs
        step = torch.compile(step, dynamic=False)
    weight_bytes = sum(t.numel() * t.element_size() for t in params.values()) + lm_head.numel() * lm_head.element_size()
    kv_bytes = cfg.num_hidden_layers * (L + accepted) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    floor, bound = ceil(weight_bytes + kv_bytes, 0)
    us = timer([step])
    if args.profile and dev == "cuda":  # where the time over the floor goes, kernel by kernel
        from torch.profiler import ProfilerActivity, profile
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    row = dict(op="draft_step", compiled=args.compile, L=L, accepted=accepted, layers=cfg.num_hidden_layers, block=cfg.block_size,
               weight_gb=weight_bytes / 1e9, kv_gb=kv_bytes / 1e9, us=us, floor_us=floor, x_floor=us / floor)
    print(f"draft step{' (compiled)' if args.compile else ''} L={L} (+{accepted} materialised, block {cfg.block_size}, {cfg.num_hidden_layers} layers): "
          f"{us / 1e3:8.3f} ms  floor {floor / 1e3:.3f} ms (weights {weight_bytes / 1e9:.2f} GB + context KV "
          f"{kv_bytes / 1e9:.2f} GB)  {us / floor:.2f}x", flush=True)
    return [row]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--configs", default="", help="BM,BN,warps,stages[,programs_per_sm,tma,hoist_pages];...")
    ap.add_argument("--filter", default="", help="attention shapes: a Python expression over B, S, L, window")
    ap.add_argument("--ctx", type=int, default=46_000)
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true", help="attention: skip the SDPA peer")
    ap.add_argument("--compile", action="store_true", help="step: torch.compile the draft step")
    ap.add_argument("--profile", action="store_true", help="step: a torch.profiler table of the step's GPU kernels")
    ap.add_argument("--ceilings", default=None, help="JSON file of measured ceilings (written when missing)")
    args = ap.parse_args(argv)
    args.dtype = torch.float32 if args.smoke else torch.bfloat16
    if args.smoke:
        dev = "cpu"

        def timer(fns):
            t0 = time.perf_counter()
            for f in fns:
                f()
            return (time.perf_counter() - t0) * 1e6 / len(fns)

        def ceil(nbytes, flops):
            return float("nan"), "n/a"
    else:
        from tritree.roofline import cached_ceilings, graph_time_us
        dev = "cuda"
        timer = graph_time_us
        c = cached_ceilings(args.ceilings)
        print(f"ceilings: copy {c.copy_gbps:.0f} GB/s, bf16 matmul {c.matmul_tflops:.0f} TFLOP/s", flush=True)
        ceil = c.floor_us
    rows = []
    if not args.no_attention:
        rows += attention_rows(args, timer, ceil, dev)
    if not args.no_step:
        rows += step_rows(args, timer, ceil, dev)
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
