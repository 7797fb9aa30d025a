"""The skinny linear (``tritree.linear``) against cuBLAS (``torch.nn.functional.linear``) at Kimi K2.6's and the
DFlash draft's projection shapes.

    PYTHONPATH=. python bench/linear_sweep.py [--shape NAME ...] [--rows 1 8 17 33 65 129] [--variant tritree cublas
        tritree-norm] [--configs "BM,BN,BK,W,S[,PPS];..."] [--out linear_sweep.jsonl]

Shapes (``N x K``, bf16): one TP8 rank's (``tp8-*``: 8 of 64 heads, the latent projections replicated) and the
DFlash draft's TP8 shard (``draft-*``). Variants: ``tritree`` (``linear(x, w)``), ``tritree-norm`` (``linear(x, w * g,
rms_eps=1e-6)``: an RMSNorm folded in, its weight in the weight's columns; its peer is ``cublas-norm``,
``F.rms_norm`` with the weight, then ``F.linear``),
``cublas`` (``F.linear``). Each is checked against the float32 product first. Times are graph-timed
(``tritree.roofline.graph_time_us``: calls back to back in one CUDA graph over weight sets rotated past the L2)
and eager (``triton.testing.do_bench``, median). Floor: the weight, x and out once over the copy bandwidth measured
in the same process. ``--configs`` times these ``LinearConfig`` (``BM,BN,BK,num_warps,num_stages[,programs_per_sm]``)
instead of the table's (the ``tritree`` variants).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from tritree.kernels.configs import arch_of, num_sms  # noqa: E402
from tritree.kernels.linear import LinearConfig, linear, plan_linear  # noqa: E402
from tritree.roofline import cached_ceilings, graph_time_us, rotation_count, versions  # noqa: E402

# name -> (N, K): out features, in features
SHAPES = {
    "tp8-qkv_a": (2112, 7168),  # q_a and kv_a concatenated (as the model holds them)
    "tp8-q_a": (1536, 7168),
    "tp8-kv_a": (576, 7168),
    "tp8-q_b": (1536, 1536),
    "tp8-kv_b": (2048, 512),
    "tp8-o": (7168, 1024),
    "tp8-dense-gate_up": (4608, 7168),
    "tp8-dense-down": (7168, 2304),
    "tp8-lm_head": (20480, 7168),  # the vocabulary shard (163,840 / 8 rows): verify's and the draft's logits
    "draft-qkv": (1280, 7168),
    "draft-o": (7168, 1024),
    "draft-gate_up": (4608, 7168),
    "draft-down": (7168, 2304),
    "draft-context-kv": (256, 7168),  # a layer's k | v rows (the context K/V of the accepted tokens)
}
VARIANTS = ("tritree", "cublas", "tritree-norm", "cublas-norm")


def parse_config(text: str) -> LinearConfig:
    v = [int(a) for a in text.split(",")]
    if len(v) not in (5, 6):
        raise ValueError(f"--configs: 5 or 6 integers per config (BM,BN,BK,W,S[,PPS]), got {text!r}")
    return LinearConfig(*v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8, 17, 33, 65, 129])
    ap.add_argument("--variant", nargs="+", default=["tritree", "cublas"], choices=VARIANTS)
    ap.add_argument("--configs", default="", help="semicolon-separated LinearConfig (see module) for tritree")
    ap.add_argument("--out", default="linear_sweep.jsonl")
    ap.add_argument("--ceilings", default="", help="JSON file of measured ceilings (measured if absent)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    ceil = cached_ceilings(args.ceilings)
    arch, sms = arch_of(dev), num_sms(dev)
    print(f"# {versions()}; arch table {arch}; {sms} SMs; copy {ceil.copy_gbps:.0f} GB/s", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16
    configs = [parse_config(c) for c in args.configs.split(";")] if args.configs else [None]
    rows = []
    t0 = time.time()
    with open(args.out, "a") as f:
        for name in args.shape:
            N, K = SHAPES[name]
            n_sets = rotation_count(N * K * 2)
            ws = [(torch.randn(N, K, generator=g, device=dev) / K**0.5).to(dt) for _ in range(n_sets)]
            gw = (1 + 0.1 * torch.randn(K, generator=g, device=dev)).to(dt)
            wgs = [(w.float() * gw.float()).to(dt) for w in ws] if any(v.endswith("-norm") for v in args.variant) else ws
            for M in args.rows:
                xs = [torch.randn(M, K, generator=g, device=dev).to(dt) for _ in range(n_sets)]
                nbytes = N * K * 2 + M * (K + N) * 2
                floor_us = nbytes / (ceil.copy_gbps * 1e9) * 1e6
                cases = [(v, c) for v in args.variant for c in (configs if v.startswith("tritree") else [None])]
                for variant, cfg in cases:
                    r = dict(shape=name, N=N, K=K, M=M, variant=variant, arch=arch, floor_us=floor_us, bytes=nbytes)
                    norm = variant.endswith("-norm")
                    try:
                        if variant.startswith("tritree"):
                            p = plan_linear(M, N, K, dt, arch, sms, cfg, norm=norm)  # the plan production runs
                            c = p.config
                            r["plan"] = (f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} "
                                         f"g{p.grid}{' *' if cfg else ''}" if p.kernel else "composed ops")

                            def call(i, norm=norm, p=p):
                                return linear(xs[i], wgs[i] if norm else ws[i], rms_eps=1e-6 if norm else None, plan=p)
                        else:
                            def call(i, norm=norm):
                                x = F.rms_norm(xs[i], (K,), gw, 1e-6) if norm else xs[i]
                                return F.linear(x, ws[i])
                        y = call(0).float()
                        x0 = xs[0].float()
                        if norm:
                            x0 = x0 * torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + 1e-6) * gw.float()
                        ref = x0 @ ws[0].float().t()
                        r["err"] = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
                        r["graph_us"] = graph_time_us([lambda i=i: call(i) for i in range(n_sets)])
                        r["eager_us"] = triton.testing.do_bench(lambda: call(0), return_mode="median") * 1e3
                        r["pct_copy"] = 100 * nbytes / (r["graph_us"] * 1e-6) / 1e9 / ceil.copy_gbps
                        print(f"{name:18} M={M:4d} {variant:13} {r.get('plan', '-'):34} graph {r['graph_us']:7.1f} us "
                              f"eager {r['eager_us']:7.1f} us floor {floor_us:6.1f} us {r['pct_copy']:5.1f}% "
                              f"err {r['err']:.1e}", flush=True)
                    except Exception as e:  # record and go on: one failing variant must not lose the sweep
                        r["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
                        print(f"{name:18} M={M:4d} {variant:13} skipped: {r['skipped']}", flush=True)
                    r["ceilings"] = ceil.__dict__
                    rows.append(r)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
    print(f"# sweep done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
