"""Where a Gluon verify program's time goes: ``%globaltimer`` stamps inside the kernel (H200, bench only).

    python -m bench.timeline [--shapes "8,8;64,8;65,8"] [--ctx 4096,46000] [--warm | --graph]
    python bench/timeline.py ...

Runs the table's Gluon kernel for the shape (the plain one, or the warp-specialised one, whose consumer
partition stamps; B = 1, P = 64) through ``VerifyPlan`` with its ``timeline`` flag (the kernel's ``TIMELINE``): every program stamps its start, Q landed, prefix loop
done, masked tail done and its partial stored, over its first five lse partial slots (so the lse of that launch is wrong; nothing
else reads it). Prints, per case, the kernel's span (first start to last stamp) and, over programs,
the median and maximum of: start skew (start - first start), Q, prefix loop, tail, store; then the
parts of the program that finished last. ``%globaltimer`` ticks in ns but may update only every
~1 us on some GPUs: read small parts as coarse.

The launches rotate over input sets that together exceed the L2 (as ``verify_sweep``'s graph-timed rows
do), so the launch read finds none of its KV left in the L2 by the one before it; ``--warm``: one set,
launched again and again (a 53 MB pool at L = 46,000 against the H200's 50 MB of L2, so part of each
launch's KV is still there from the previous one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton

from tritree.kernels.configs import lookup
from tritree.kernels.verify import VERIFY_MLA_CONFIGS, VerifyPlan
from tritree.kernels.verify import gluon_launch as VG
from tritree.roofline import rotation_count

try:
    from .verify_sweep import SM_SCALE, build_sets
except ImportError:  # run as a file: python bench/timeline.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.verify_sweep import SM_SCALE, build_sets

PARTS = ("skew", "Q", "prefix", "tail", "store")


def _setup(T: int, H: int, L: int, warm: bool):
    """Input sets, the table's config, the split counts and the stamped (and unstamped) plans of one call."""
    P = 64
    sets = build_sets(1, T, H, L, P, 1 if warm else rotation_count((L + T) * 576 * 2), torch.bfloat16, "cuda")
    s = sets[0]
    cfg = lookup(VERIFY_MLA_CONFIGS, "sm_90", T * H, page_size=P)
    if not cfg.kernel.startswith("gluon"):
        raise SystemExit(f"T={T},H={H}: the table runs {cfg.kernel!r}, which has no timeline")
    tree_lens = torch.full((1,), T, dtype=torch.int32, device="cuda")
    for x in sets:
        x["tree_lens"] = tree_lens

    def args(x):
        return x["q"], x["kv"], x["page_table"], x["kv_lens"], x["tree_mask"], x["tree_lens"]

    # the launch verify_mla plans for the shape (its kernel, split count and partials), stamped or not
    plans = {t: VerifyPlan(*args(s), sm_scale=SM_SCALE, config=cfg, timeline=t) for t in (0, 1, 2)}
    g = plans[1]._gluon
    if plans[1].launch.route != cfg.kernel or g.num_splits < 2:
        raise SystemExit(f"T={T},H={H}: {plans[1].launch} (the stamps need the Gluon kernel and several splits)")
    row_blocks = triton.cdiv(T * H, VG.BLOCK_M)
    narrow = bool(dict(g.constexprs).get("NARROW_ROWS"))
    # the narrow last row block (flattened grid) has programs only for its own splits
    last_splits = g.narrow_splits if narrow else g.num_splits

    def launch(x, timeline=1):
        """One call's split kernel (stamped with ``timeline``); returns its partials ``(o, lse)``."""
        return plans[timeline].split_kernel(*args(x))

    info = dict(T=T, H=H, L=L, kernel=cfg.kernel, splits=g.num_splits, sets=len(sets), narrow=narrow)
    return sets, info, row_blocks, last_splits, launch


def _stamps(dst_l, row_blocks: int, last_splits: int) -> torch.Tensor:
    """The launch's stamps, ``[programs, 5]`` int64 (``%globaltimer``'s low word, ns)."""
    stamps = []
    for m in range(row_blocks):
        raw = dst_l[0, :, m * VG.BLOCK_M: m * VG.BLOCK_M + 5].contiguous().view(torch.int32).cpu().long()
        stamps.append(raw[:last_splits] if m == row_blocks - 1 else raw)
    return torch.cat([r % (1 << 32) for r in stamps])


def _summary(st: torch.Tensor, last_splits: int) -> dict:
    first = int(st[:, 0].min())
    st = (st - first) % (1 << 32)  # ns from the first start (the low word may wrap once)
    parts = torch.stack([st[:, 0], st[:, 1] - st[:, 0], st[:, 2] - st[:, 1], st[:, 3] - st[:, 2],
                         st[:, 4] - st[:, 3]], 1).float() / 1e3
    last = int(st[:, 4].argmax())
    # the last row block's programs apart (narrow where the ws kernel runs it narrow), empty chunks left out
    n_last = (parts[-last_splits:, 2] > 0.05).sum().item()
    last_block = {p: statistics.median(parts[-last_splits:, i][parts[-last_splits:, 2] > 0.05].tolist() or [0.0])
                  for i, p in enumerate(PARTS)}
    return dict(programs=st.shape[0], span_us=float(st[:, 4].max()) / 1e3, last_block_programs=n_last,
                last_block=last_block, median={p: statistics.median(parts[:, i].tolist()) for i, p in enumerate(PARTS)},
                max={p: float(parts[:, i].max()) for i, p in enumerate(PARTS)},
                last_program={p: float(parts[last, i]) for i, p in enumerate(PARTS)})


def timeline_case(T: int, H: int, L: int, reps: int = 3, warm: bool = False) -> dict:
    sets, info, row_blocks, last_splits, launch = _setup(T, H, L, warm)
    # the last launch is read (the first compiles); with rotating sets, every set is launched at least once
    for i in range(max(reps, len(sets) + 1)):
        _, dst_l = launch(sets[(i + 1) % len(sets)])  # the last: the set launched longest ago
    torch.cuda.synchronize()
    return info | _summary(_stamps(dst_l, row_blocks, last_splits), last_splits)


def graph_timeline_case(T: int, H: int, L: int, calls: int = 12, clock: bool = False, idle_us: float = 0.0) -> dict:
    """The stamped calls as the graph-timed sweep runs them: ``calls`` calls (kernel, then the split merge)
    over the rotating sets, back to back in one CUDA graph, each with its own partial buffers (a captured call
    gets its own from its plan), so that every call's stamps survive the replay. Per call: the kernel's span;
    between calls: the time from one kernel's last stamp to the next kernel's first (the merge and two launches); and the period, first start to first
    start, which is what the graph-timed rows measure. Also graph-timed as the sweep times it (no stamps
    read), and the same calls unstamped (the shipped kernel), which tells whether the stamps cost anything.
    ``clock`` (ws kernel): each program also stamps the SM clock (``TIMELINE=2``), and the result has the
    clock rate each program ran at (cycles over ns); its parts are then not stamped. ``idle_us``: a sleep
    kernel of about that long between calls (the GPU idle as between single launches; the period then
    includes it)."""
    from tritree.kernels._splitkv import combine_splits
    from tritree.roofline import graph_time_us

    sets, info, row_blocks, last_splits, launch = _setup(T, H, L, False)
    outs = [(torch.empty(1, T, H, 512, dtype=torch.bfloat16, device="cuda"),
             torch.empty(1, T, H, dtype=torch.float32, device="cuda")) for _ in range(calls)]
    partials = [None] * calls

    def call(i, stamped=True):
        dst = launch(sets[i % len(sets)], timeline=(2 if clock else 1) if stamped else 0)
        if stamped:
            partials[i] = dst  # the captured call's own partials: its stamps after the replay
        combine_splits(dst[0], dst[1], *outs[i])  # merges the stamps as lse: garbage out, as the sweep's cost
        if idle_us > 0:
            torch.cuda._sleep(int(idle_us * 1980))  # ~cycles at the H200's top clock

    unstamped_us = graph_time_us([lambda i=i: call(i, False) for i in range(calls)])
    period_timed = graph_time_us([lambda i=i: call(i) for i in range(calls)])  # leaves the last replay's stamps
    torch.cuda.synchronize()
    raw = [_stamps(d[1], row_blocks, last_splits) for d in partials]
    base = int(raw[0][:, 0].min())
    rel = [(r - base) % (1 << 32) for r in raw]  # ns from the first call's first start
    starts = [int(r[:, 0].min()) for r in rel]
    ends = [int(r[:, 4].max()) for r in rel]
    spans = [(e - s) / 1e3 for s, e in zip(starts, ends)]
    gaps = [(starts[i + 1] - ends[i]) / 1e3 for i in range(calls - 1)]
    per_call = [_summary(r, last_splits) for r in raw]
    # per split: when its programs finished (us from the call's first start; the full row blocks' latest,
    # and the last row block's, each a median over calls): which splits set the span
    full = row_blocks - 1 if info["narrow"] else row_blocks
    ends = [((r[:, 4] - r[:, 0].min()) % (1 << 32)).double() / 1e3 for r in raw]
    split_ends = [statistics.median(float(e[:full * info["splits"]].view(full, -1)[:, j].max()) for e in ends)
                  for j in range(info["splits"])]
    last_ends = [statistics.median(float(e[full * info["splits"]:][j]) for e in ends)
                 for j in range(last_splits)] if info["narrow"] else []
    if clock:  # stamps: timer, clock, clock, clock, timer
        ghz = torch.cat([((r[:, 3] - r[:, 1]) % (1 << 32)).double() / ((r[:, 4] - r[:, 0]) % (1 << 32)).double()
                         for r in raw])
        info = info | dict(ghz_median=float(ghz.median()), ghz_min=float(ghz.min()), ghz_max=float(ghz.max()))
    return info | dict(idle_us=idle_us, calls=calls, graph_timed_us=period_timed, unstamped_us=unstamped_us,
                       span_us=statistics.median(spans),
                       spans=spans, gap_us=statistics.median(gaps),
                       period_us=(starts[-1] - starts[0]) / 1e3 / (calls - 1),
                       split_ends=split_ends, narrow_ends=last_ends,
                       median={p: statistics.median(c["median"][p] for c in per_call) for p in PARTS},
                       last_program={p: statistics.median(c["last_program"][p] for c in per_call) for p in PARTS})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8,8;64,8", help="T,H;...")
    ap.add_argument("--ctx", default="4096,16384,46000,131072")
    ap.add_argument("--warm", action="store_true", help="one input set, its KV partly left in the L2 by the "
                    "previous launch (the default rotates sets past the L2, as the graph-timed sweep does)")
    ap.add_argument("--graph", action="store_true", help="the stamped calls back to back in one CUDA graph, "
                    "with the merge, as the graph-timed sweep runs them (see graph_timeline_case)")
    ap.add_argument("--clock", action="store_true", help="--graph: the SM clock each program ran at")
    ap.add_argument("--idle-us", type=float, default=0.0, help="--graph: a sleep of about this long between calls")
    args = ap.parse_args(argv)
    fmt = lambda d: " ".join(f"{p} {d[p]:5.1f}" for p in PARTS)  # noqa: E731
    for shape in args.shapes.split(";"):
        T, H = map(int, shape.split(","))
        for L in map(int, args.ctx.split(",")):
            if args.graph:
                r = graph_timeline_case(T, H, L, clock=args.clock, idle_us=args.idle_us)
                if args.clock:
                    print(f"T={T:>3} H={H:>2} L={L:>6} {r['kernel']:12s} graph of {r['calls']} calls, idle "
                          f"{r['idle_us']:.0f} us between: graph-timed {r['graph_timed_us']:.1f} us a call (unstamped "
                          f"{r['unstamped_us']:.1f}) | span {r['span_us']:.1f} gap {r['gap_us']:.1f} | SM clock "
                          f"{r['ghz_median']:.3f} GHz median over programs ({r['ghz_min']:.3f}-{r['ghz_max']:.3f})",
                          flush=True)
                    continue
                print(f"T={T:>3} H={H:>2} L={L:>6} {r['kernel']:12s} graph of {r['calls']} calls ({r['splits']} "
                      f"splits, {r['sets']} input sets): graph-timed {r['graph_timed_us']:.1f} us a call (unstamped "
                      f"{r['unstamped_us']:.1f}) | period "
                      f"{r['period_us']:.1f} = span {r['span_us']:.1f} + gap {r['gap_us']:.1f} | spans "
                      f"{min(r['spans']):.1f}-{max(r['spans']):.1f} | median {fmt(r['median'])} | "
                      f"last to finish {fmt(r['last_program'])}", flush=True)
                ends = " ".join(f"{e:.1f}" for e in r["split_ends"])
                narrow = " ".join(f"{e:.1f}" for e in r["narrow_ends"])
                print(f"    ends by split (full blocks' latest): {ends}" + (f" | narrow block: {narrow}" if narrow else ""),
                      flush=True)
                continue
            r = timeline_case(T, H, L, warm=args.warm)
            print(f"T={T:>3} H={H:>2} L={L:>6} {r['kernel']:12s} {r['programs']} programs ({r['splits']} splits, "
                  f"{r['sets']} input set{'s' if r['sets'] > 1 else ''}): "
                  f"span {r['span_us']:.1f} us | median {fmt(r['median'])} | max {fmt(r['max'])} | "
                  f"last to finish {fmt(r['last_program'])} | last row block{' (narrow)' if r['narrow'] else ''}, "
                  f"{r['last_block_programs']} programs with keys: median {fmt(r['last_block'])}", flush=True)


if __name__ == "__main__":
    main()
