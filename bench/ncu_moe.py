"""Nsight Compute counters of the routed INT4 layer's kernels beside its weight walk, at K2.6's per-rank shapes.

    PYTHONPATH=. python bench/ncu_moe.py [--shape ep8 tp8] [--tokens 17 65] [--ncu PATH]

For each shape and N (uniform top-8 routing, as ``bench/moe_sweep.py``), the script runs itself under
``ncu --clock-control none`` (the clocks left alone) and profiles one call of ``routed_experts_int4`` (the
experts in the layout the GPU's kernels stream, ``kernel_layout``: on sm_90 / sm_120 the Gluon ``mma.sync``
kernels, as ``moe_sweep``'s ``int4``) and one of the weight walk (``bench/int4_walk.py``), each after a warm-up
call. One row a kernel: its time under the profiler, DRAM throughput (% of peak), issue slots busy (% of peak),
active and eligible warps a scheduler, registers a thread, and the cycles a warp spends stalled per instruction it
issues, by reason (ncu's
``smsp__average_warps_issue_stalled_*_per_issue_active``; ``selected`` is the issue itself, 1 by definition).

A kernel whose stalls spread over many reasons at a few warps a scheduler is bound by issue latency: it
needs more warps in flight or fewer instructions, not a different memory access pattern.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.moe_sweep import SHAPES  # noqa: E402

STALLS = ("long_scoreboard", "barrier", "short_scoreboard", "mio_throttle", "wait", "gmma", "not_selected",
          "math_pipe_throttle", "dispatch_stall", "lg_throttle")
METRICS = {
    "us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_active": "smsp__warps_active.avg.per_cycle_active",
    "warps_eligible": "smsp__warps_eligible.avg.per_cycle_active",
    "regs": "launch__registers_per_thread",
    **{f"stall_{s}": f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS},
}
# kernel name -> role; the walk launches its gate_up reads, then its down reads
ROLES = {"_align_kernel": "align", "_gate_up_mma_kernel": "gate_up", "_down_mma_kernel": "down",
         "_gate_up_int4_kernel": "gate_up", "_down_int4_kernel": "down", "_walk_kernel": "walk"}


def parse_ncu_csv(text: str) -> list[dict]:
    """``ncu --csv --print-units base`` rows -> one dict a profiled launch, in launch order: ``kernel`` (the
    name), ``role`` (:data:`ROLES`; the walk's two launches ``walk gate_up`` / ``walk down``) and the
    :data:`METRICS` keys as floats (``us`` in microseconds); metrics ncu did not report are absent."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no ncu CSV header (\"ID\", ...) in the profiler's output")
    by_id: dict[int, dict] = {}
    names = {v: k for k, v in METRICS.items()}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            launch = int(row["ID"])
        except (KeyError, TypeError, ValueError):
            continue
        kernel = row.get("Kernel Name", "").split("(")[0].strip()
        rec = by_id.setdefault(launch, {"kernel": kernel})
        key = names.get(row.get("Metric Name", ""))
        if key is None:
            continue
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        if key == "us":  # nanoseconds in base units
            value /= 1e3
        rec[key] = value
    out, walks = [], 0
    for launch in sorted(by_id):
        rec = by_id[launch]
        role = ROLES.get(rec["kernel"], rec["kernel"])
        if role == "walk":
            role = "walk gate_up" if walks % 2 == 0 else "walk down"
            walks += 1
        rec["role"] = role
        out.append(rec)
    return out


def table(rows: list[dict], label: str) -> str:
    """Markdown rows of :func:`parse_ncu_csv`'s records: the two grouped kernels and the walk's two launches
    (the align and the layer's elementwise fills and copies, a few us each, left out)."""
    lines = []
    for r in rows:
        if r["role"] not in ("gate_up", "down", "walk gate_up", "walk down"):
            continue
        stalls = sorted(((r.get(f"stall_{s}", 0.0), s) for s in STALLS), reverse=True)[:4]
        top = ", ".join(f"{s} {v:.2f}" for v, s in stalls if v > 0)
        lines.append(f"| {label} | {r['role']} | {r.get('us', float('nan')):.1f} | {r.get('dram_pct', float('nan')):.1f} | "
                     f"{r.get('issue_pct', float('nan')):.1f} | {r.get('warps_active', float('nan')):.2f} / "
                     f"{r.get('warps_eligible', float('nan')):.2f} | {r.get('regs', float('nan')):.0f} | {top} |")
    return "\n".join(lines)


def child(shape: str, N: int) -> None:
    """Under the profiler: warm both calls up, then one profiled call of each."""
    import torch

    from bench.int4_walk import make_walk
    from bench.moe_sweep import ALL_EXPERTS, HIDDEN, TOPK, random_experts, routing_sets
    from tritree.kernels.configs import arch_of, num_sms
    from tritree.kernels.moe.int4 import kernel_layout, routed_experts_int4
    from tritree.kernels.moe.int4_triton import plan_int4_moe

    dev = torch.device("cuda")
    E, I = SHAPES[shape]
    experts = random_experts(E, HIDDEN, I, dev)
    idx, w = routing_sets(N, E, "uniform", 1, dev)[0]
    x = torch.randn(N, HIDDEN, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    plan = plan_int4_moe(N, TOPK, E, HIDDEN, I, arch_of(dev), num_sms(dev), None, ALL_EXPERTS)
    walk = make_walk(experts, plan)
    kernel_experts = experts.to_layout(kernel_layout(dev, HIDDEN, I))
    calls = [lambda: routed_experts_int4(x, idx, w, kernel_experts, out=out, global_experts=ALL_EXPERTS),
             lambda: walk(x, idx, w, out)]
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs="+", default=["ep8", "tp8"], choices=sorted(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=[17, 65])
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu", help="the Nsight Compute command line")
    ap.add_argument("--out", default="ncu_moe.jsonl")
    ap.add_argument("--child", nargs=2, metavar=("SHAPE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    import torch

    from tritree.roofline import versions
    print(f"# {versions()}", flush=True)
    print("| shape, N | kernel | us (ncu) | DRAM % | issue busy % | warps a scheduler, active / eligible | "
          "registers | top stalls (cycles per issued instruction) |")
    print("|---|---|---|---|---|---|---|---|")
    with open(args.out, "a") as f:
        for shape in args.shape:
            for N in args.tokens:
                cmd = [args.ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv",
                       "--print-units", "base", "--metrics", ",".join(METRICS.values()),
                       sys.executable, os.path.abspath(__file__), "--child", shape, str(N)]
                path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
                res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
                if res.returncode != 0:
                    print(f"| {shape}, {N} | ncu failed (status {res.returncode}): {res.stderr.strip()[-300:]} |")
                    continue
                rows = parse_ncu_csv(res.stdout)
                print(table(rows, f"{shape}, {N}"), flush=True)
                for r in rows:
                    f.write(json.dumps({"shape": shape, "N": N, **r, "device": torch.cuda.get_device_name()}) + "\n")


if __name__ == "__main__":
    main()
