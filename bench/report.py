"""Markdown tables from verify_sweep JSONL files (for bench/RESULTS.md).

    python -m bench.report sweep.jsonl [--sm120 sm120.jsonl]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def key(r):
    return (r["L"], r["T"], r["H"], r["B"], r["P"])


def side_by_side(rows, sm120=None) -> str:
    by = defaultdict(dict)
    for r in rows + (sm120 or []):
        by[key(r)][r["variant"]] = r
    cols = ["tritree", "torch"] + (["tritree-sm120"] if sm120 else [])
    out = ["| L | T | H | B | P | floor us (bound) | tritree us | % floor | GB/s | TFLOP/s | PyTorch us | speedup vs PyTorch |"
           + (" sm_120 emul. us |" if sm120 else ""),
           "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if sm120 else "")]
    for k in sorted(by):
        v = by[k]
        t = v.get("tritree")
        if t is None or "skipped" in t:
            continue
        p = v.get("torch")
        p_us = f"{p['us']:.1f}" if p and "us" in p else "skipped"
        sp = f"{p['us'] / t['us']:.2f}x" if p and "us" in p else "-"
        line = (f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {t['floor_us']:.1f} ({t['bound'][:3]}) | {t['us']:.1f} | "
                f"{100 * t['frac_floor']:.1f}% | {t['gbps']:.0f} | {t['tflops']:.1f} | {p_us} | {sp} |")
        if sm120:
            e = v.get("tritree-sm120")
            line += f" {e['us']:.1f} |" if e and "us" in e else " - |"
        out.append(line)
    del cols
    return "\n".join(out)


def configs_table(rows) -> str:
    by = defaultdict(dict)
    for r in rows:
        if "us" in r:
            by[(r["T"], r["H"], r["P"], r["variant"])][r["config"]] = r["us"]
    out = []
    for k in sorted(by):
        best = min(by[k].values())
        cells = "; ".join(f"{c.replace('AttnConfig', '')}: {us:.0f}{' *' if us == best else ''}"
                          for c, us in sorted(by[k].items(), key=lambda kv: kv[1]))
        out.append(f"- T={k[0]} H={k[1]} P={k[2]} {k[3]}: {cells}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--sm120")
    ap.add_argument("--configs", action="store_true", help="the file is a config exploration")
    args = ap.parse_args(argv)
    rows = load(args.sweep)
    if args.configs:
        print(configs_table(rows))
    else:
        print(side_by_side(rows, load(args.sm120) if args.sm120 else None))


if __name__ == "__main__":
    main()
