"""build_tree and accept_tree on a GPU: time per call (CUDA graph replay); build_tree also split into its
two stages (the top-k of every depth with the log-softmax, and the best-first search with the tree mask),
each timed alone the same way; for accept_tree, the achieved bandwidth of the one read of the target
logits against the measured copy bandwidth.

    python -m bench.tree_sweep --out tree.jsonl       (GPU)
    TRITON_INTERPRET=1 python -m bench.tree_sweep --smoke   (CPU interpreter, tiny sizes, no timing claims;
                                                             without the interpreter: the CPU reference, no split)
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from tritree import accept_tree, build_tree
from tritree.kernels._launch import interpreting
from tritree.kernels.tree import _search_device, topk_per_depth
from tritree.roofline import append_jsonl

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dtype", action="append", choices=sorted(DTYPES),
                    help="draft logits dtype of the build grid (repeatable; default bf16, plus fp32 at B=1)")
    args = ap.parse_args(argv)
    dev = "cpu" if args.smoke else "cuda"
    if args.smoke:
        def timer(fns):
            t0 = time.perf_counter()
            for f in fns:
                f()
            return (time.perf_counter() - t0) * 1e6 / len(fns)

        def sets(nbytes):
            return 1
        copy_gbps, V = float("nan"), 1000
        grid_build = [(B, budget, 7, "bf16") for B, budget in itertools.product([1, 2], [16, 64])]
        grid_accept = [16, 64]
    else:
        from tritree.roofline import device_ceilings
        from tritree.roofline import graph_time_us as timer
        from tritree.roofline import rotation_count as sets
        copy_gbps, V = device_ceilings().copy_gbps, 163_840
        dtypes = args.dtype or ["bf16"]
        grid_build = [(B, budget, D, dt) for dt in dtypes
                      for B, budget, D in itertools.product([1, 8, 32], [16, 64, 256, 1024], [7, 15])]
        if not args.dtype:  # the target point also with float32 logits
            grid_build += [(1, 64, 7, "fp32"), (1, 64, 15, "fp32")]
        grid_accept = [16, 64, 256]
    rows = []
    print("build_tree: total = top-k (log-softmax + top-K of every depth) + search (best-first + tree mask), "
          "each timed alone", flush=True)
    for B, budget, D, dt in grid_build:
        n = sets(B * D * V * DTYPES[dt].itemsize)
        logits = [(torch.randn(B, D, V, device=dev) * 3).to(DTYPES[dt]) for _ in range(n)]
        root = torch.zeros(B, dtype=torch.int32, device=dev)
        K = min(budget, V)
        total = timer([lambda x=x: build_tree(x, budget, root) for x in logits])
        topk = search = float("nan")
        if dev == "cuda" or interpreting():
            topk = timer([lambda x=x: topk_per_depth(x, K, kernel=True) for x in logits])
            tables = [topk_per_depth(x, K, kernel=True) for x in logits]
            search = timer([lambda t=t: _search_device(t[0], t[1], root, budget) for t in tables])
            del tables
        rows.append(dict(op="build_tree", B=B, budget=budget, D=D, V=V, dtype=dt, us=total, topk_us=topk,
                         search_us=search, sets=n))
        print(f"build_tree  B={B:>2} budget={budget:>4} D={D:>2} V={V} {dt}: {total:9.1f} us "
              f"(top-k {topk:8.1f} us, search {search:8.1f} us)", flush=True)
        del logits
    for T, temp in itertools.product(grid_accept, [0.0, 1.0]):
        tree = build_tree(torch.randn(1, 7, V, device=dev), T - 1, torch.zeros(1, dtype=torch.int32, device=dev))
        target = torch.randn(1, T, V, device=dev, dtype=torch.float32 if args.smoke else torch.bfloat16)
        us = timer([lambda: accept_tree(tree.tokens, tree.parents, tree.tree_lens, target, temperature=temp, seed=1)])
        gbps = target.numel() * target.element_size() / (us * 1e-6) / 1e9
        rows.append(dict(op="accept_tree", T=T, V=V, temperature=temp, us=us, gbps=gbps, frac_copy=gbps / copy_gbps))
        print(f"accept_tree T={T:>4} temp={temp}: {us:9.1f} us, logits read at {gbps:7.0f} GB/s "
              f"({100 * gbps / copy_gbps:.1f}% of copy)", flush=True)
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
