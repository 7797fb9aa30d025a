"""What an eager caller pays per op, against the same call in a CUDA graph (H200).

For each public op at a decode shape: the host time of one eager call (``--calls`` calls in a Python loop,
timed before the one synchronisation that ends them; the launch queue is deep enough that the loop never
waits on the GPU), ``triton.testing.do_bench`` of the eager call, and the graph-timed call (calls over input
sets rotated past the L2, captured back to back in one graph: ``tritree.roofline.graph_time_us``).
``--profile`` also prints the top of a cProfile of the eager calls of each op.

    python bench/eager_overhead.py [--ops verify_mla,draft_attention,...] [--page-size 1] [--out rows.jsonl]
        [--label NAME]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton

import tritree
from tritree.roofline import append_jsonl, graph_time_us, profile_text, rotation_count, versions
from tritree.testing import random_verify_inputs

L = 46_000


def _verify_cases(T: int, H: int, P: int):
    sets = rotation_count((L + T) * 576 * 2)
    fns = []
    for seed in range(sets):
        c = random_verify_inputs(1, T, H, P, [L], [T], ("wide",), torch.bfloat16, seed=seed, fragmented=P == 1,
                                 device="cuda")
        args = (c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"])
        fns.append(lambda a=args, tl_=c["tree_lens"]: tritree.verify_mla(*a, sm_scale=0.1, tree_lens=tl_))
    return fns


def _draft_cases(S: int = 8, Hq: int = 64, Hkv: int = 8, D: int = 128, ctx: int = 46_000, P: int = 64):
    g = torch.Generator(device="cuda").manual_seed(0)
    pages = -(-(ctx + S) // P)
    sets = rotation_count(2 * pages * P * Hkv * D * 2)
    fns = []
    for _ in range(sets):
        k = torch.randn(pages, P, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        q = torch.randn(1, S, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        kb = torch.randn(1, S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vb = torch.randn_like(kb)
        pt = torch.arange(pages, dtype=torch.int32, device="cuda")[None]
        lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        fns.append(lambda a=(q, k, v, pt, lens, kb, vb): tritree.draft_attention(*a, sm_scale=D ** -0.5))
    return fns


def _kv_cases(T: int = 65, pages: int = 800, P: int = 64):
    kv = torch.randn(pages, P, 576, device="cuda", dtype=torch.bfloat16)
    pt = torch.arange(pages, dtype=torch.int32, device="cuda")[None]
    lens = torch.tensor([L], dtype=torch.int32, device="cuda")
    new = torch.randn(1, T, 576, device="cuda", dtype=torch.bfloat16)
    tree_lens = torch.tensor([T], dtype=torch.int32, device="cuda")
    idx = torch.zeros(1, T, dtype=torch.int32, device="cuda")
    idx[0, :10] = torch.arange(0, 20, 2, device="cuda")
    n = torch.tensor([10], dtype=torch.int32, device="cuda")
    write = [lambda: tritree.kv_write_(kv, pt, lens, new, tree_lens)]
    commit = [lambda: tritree.kv_commit_(kv, pt, lens, idx, n)]  # lens is not advanced: same moves each call
    return write, commit


def _tree_cases(budget: int = 64, D: int = 7, V: int = 163_840):
    logits = torch.randn(1, D, V, device="cuda", dtype=torch.float32)
    roots = torch.zeros(1, dtype=torch.int32, device="cuda")
    build = [lambda: tritree.build_tree(logits, budget, roots)]
    tree = tritree.build_tree(logits, budget, roots)
    target = torch.randn(1, budget + 1, V, device="cuda", dtype=torch.bfloat16)
    accept = [lambda: tritree.accept_tree(tree.tokens, tree.parents, tree.tree_lens, target)]
    return build, accept


def cases(ops, P: int = 64):
    out = {}
    for T, H in ((8, 8), (17, 8), (65, 8), (16, 64)):
        if "verify_mla" in ops:
            out[f"verify_mla T={T} H={H} P={P}"] = _verify_cases(T, H, P)
    if "draft_attention" in ops:
        out["draft_attention S=8 Hq=64 Hkv=8"] = _draft_cases()
    if "kv_write_" in ops or "kv_commit_" in ops:
        w, c = _kv_cases()
        if "kv_write_" in ops:
            out["kv_write_ T=65"] = w
        if "kv_commit_" in ops:
            out["kv_commit_ T=65 10 accepted"] = c
    if "build_tree" in ops or "accept_tree" in ops:
        b, a = _tree_cases()
        if "build_tree" in ops:
            out["build_tree budget=64 D=7"] = b
        if "accept_tree" in ops:
            out["accept_tree T=65 greedy"] = a
    return out


def host_us(fn, calls: int) -> float:
    """Median over 5 rounds of the Python time of ``calls`` eager calls (before their synchronisation)."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="verify_mla,draft_attention,kv_write_,kv_commit_,build_tree,accept_tree")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--page-size", type=int, default=64, help="verify_mla's pool pages (1: a fragmented pool)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each op's eager calls")
    ap.add_argument("--label", default="", help="a name for this code version in the rows")
    ap.add_argument("--out", default=None, help="append JSON rows here")
    args = ap.parse_args()
    ops = set(args.ops.split(","))
    print(f"# {versions()}; {args.label}", flush=True)
    print(f"{'case':40s} {'host/call us':>12s} {'eager do_bench us':>18s} {'graph us':>9s} {'eager/graph':>11s}",
          flush=True)
    rows = []
    for name, fns in cases(ops, args.page_size).items():
        fn = fns[0]
        for f in fns:
            f()
        torch.cuda.synchronize()
        host = host_us(fn, args.calls)
        eager = triton.testing.do_bench(fn, warmup=25, rep=200) * 1e3
        graph = graph_time_us(fns)
        print(f"{name:40s} {host:12.1f} {eager:18.1f} {graph:9.1f} {eager / graph:11.2f}", flush=True)
        rows.append(dict(case=name, host_us=host, eager_us=eager, graph_us=graph, label=args.label,
                         versions=versions()))
        if args.profile:
            print(profile_text(fn, args.calls), flush=True)
    append_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
