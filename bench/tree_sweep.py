"""build_tree and accept_tree on a GPU: time per call (CUDA graph replay) and, for accept_tree, the
achieved bandwidth of the one read of the target logits against the measured copy bandwidth.

    python -m bench.tree_sweep --out tree.jsonl       (GPU)
    python -m bench.tree_sweep --smoke                (CPU interpreter, tiny sizes, no timing claims)
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from tritree import accept_tree, build_tree
from tritree.roofline import append_jsonl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = "cpu" if args.smoke else "cuda"
    if args.smoke:
        def timer(fns):
            t0 = time.perf_counter()
            for f in fns:
                f()
            return (time.perf_counter() - t0) * 1e6 / len(fns)
        copy_gbps, V = float("nan"), 1000
        grid_build = list(itertools.product([1, 2], [16, 64], [7]))
        grid_accept = [16, 64]
    else:
        from tritree.roofline import graph_time_us as timer
        from tritree.roofline import measure_ceilings
        copy_gbps, V = measure_ceilings().copy_gbps, 163_840
        grid_build = list(itertools.product([1, 8, 32], [16, 64, 256, 1024], [7, 15]))
        grid_accept = [16, 64, 256]
    rows = []
    for B, budget, D in grid_build:
        logits = torch.randn(B, D, V, device=dev)
        root = torch.zeros(B, dtype=torch.int32, device=dev)
        us = timer([lambda: build_tree(logits, budget, root)])
        rows.append(dict(op="build_tree", B=B, budget=budget, D=D, V=V, us=us))
        print(f"build_tree  B={B:>2} budget={budget:>4} D={D:>2} V={V}: {us:9.1f} us", flush=True)
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
