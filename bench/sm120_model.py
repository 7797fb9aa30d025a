"""A paper model of verify-attention and routed-expert time on an RTX PRO 6000 Blackwell (sm_120), from
emulated runs.

    python -m bench.sm120_model RESULT.txt [RESULT.txt ...] --mma-sync-tflops 434.5 --copy-gbps 4144
    python -m bench.sm120_model --moe moe_sweep.jsonl

``--moe``: the ``arch == "sm_120"`` rows of ``bench/moe_sweep.py``'s JSON lines (run under the same
emulation); the routed layer is bandwidth-bound, so its model is the RTX PRO 6000's copy floor over the
fraction of the H200's copy floor the emulated run reaches (the ceilings stored in each row).

No sm_120 GPU is available to this project (docs/SPEC.md section 6). This prints, for each
``tritree-sm120`` / ``tritree-sm120-triton`` / ``tritree-fp8`` row of ``bench.verify_sweep`` output run under
``DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120`` on the H200:

* the RTX PRO 6000's roofline floor from its paper figures (``tritree.roofline.RTX_PRO_6000``:
  1.79 TB/s, 504 TFLOP/s dense bf16),
* the emulated run's fraction of the H200's own ceilings for that path (the ``mma.sync`` matmul rate
  of ``bench.mma_sync_ceiling`` and the measured copy bandwidth), by the bound of the shape,
* and the model: the RTX floor divided by that fraction, i.e. the time if the kernel reached the
  same fraction of the RTX PRO 6000's ceilings as it reaches of the emulation's. A model, not a
  measurement: the two GPUs differ in SM count (188 vs 132), L2 (128 vs 50 MB) and memory system.
"""

from __future__ import annotations

import argparse
import re

from tritree.roofline import RTX_PRO_6000, Ceilings, verify_mla_counts

ROW = re.compile(r"L=\s*(\d+) T=\s*(\d+) H=\s*(\d+) B=\s*(\d+) P=\s*(\d+)f? "
                 r"(tritree-sm120-triton|tritree-sm120|tritree-fp8)\s+([\d.]+) us")


def model_rows(lines, emulated: Ceilings):
    rows = []
    for line in lines:
        m = ROW.search(line)
        if not m:
            continue
        L, T, H, B, P = map(int, m.groups()[:5])
        variant, us = m.group(6), float(m.group(7))
        nbytes, flops = verify_mla_counts(B, T, H, L, kv_bytes=1 if variant == "tritree-fp8" else 2)
        rtx_floor, bound = RTX_PRO_6000.floor_us(nbytes, flops)
        emu_floor, _ = emulated.floor_us(nbytes, flops)
        fraction = emu_floor / us
        rows.append(dict(L=L, T=T, H=H, B=B, P=P, variant=variant, emulated_us=us, fraction=fraction,
                         rtx_floor_us=rtx_floor, bound=bound, rtx_model_us=rtx_floor / fraction))
    return rows


def moe_model_rows(rows):
    """``bench/moe_sweep.py`` JSON rows of the emulated sm_120 configs -> the same fields as
    :func:`model_rows` for the routed layer (memory-bound: bytes over bandwidth)."""
    out = []
    for r in rows:
        if r.get("arch") != "sm_120" or "us" not in r:
            continue
        emu_floor = r["bytes"] / (r["ceilings"]["copy_gbps"] * 1e9) * 1e6
        fraction = emu_floor / r["us"]
        rtx_floor = r["bytes"] / (RTX_PRO_6000.copy_gbps * 1e9) * 1e6
        out.append(dict(shape=r["shape"], routing=r["routing"], N=r["N"], emulated_us=r["us"], fraction=fraction,
                        rtx_floor_us=rtx_floor, rtx_model_us=rtx_floor / fraction))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", help="verify_sweep output (text) of emulated runs")
    ap.add_argument("--mma-sync-tflops", type=float, help="bench.mma_sync_ceiling's best rate on the same machine")
    ap.add_argument("--copy-gbps", type=float, help="the copy bandwidth measured in the same run")
    ap.add_argument("--moe", default=None, help="bench/moe_sweep.py JSON lines of an emulated run")
    args = ap.parse_args(argv)
    if args.moe:
        import json
        with open(args.moe) as f:
            rows = moe_model_rows(json.loads(line) for line in f if line.strip())
        print("| shape | routing | N | emulated (us) | of the emulating GPU's copy floor | RTX PRO 6000 floor (paper, us) "
              "| modelled RTX PRO 6000 time (us) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['shape']} | {r['routing']} | {r['N']} | {r['emulated_us']:.1f} | {100 * r['fraction']:.1f}% "
                  f"| {r['rtx_floor_us']:.1f} | {r['rtx_model_us']:.0f} |")
        if not args.results:
            return
    if not args.results or args.mma_sync_tflops is None or args.copy_gbps is None:
        ap.error("verify rows need RESULT files, --mma-sync-tflops and --copy-gbps")
    lines = [line for path in args.results for line in open(path)]
    rows = model_rows(lines, Ceilings(args.copy_gbps, args.mma_sync_tflops))
    print("| shape | pool | emulated (us) | of the emulation's ceiling | RTX PRO 6000 floor (paper, us) "
          "| modelled RTX PRO 6000 time (us) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        pool = ("fp8, " if r["variant"] == "tritree-fp8" else "") + f"P = {r['P']}"
        print(f"| T={r['T']}, H={r['H']} (L={r['L']}) | {pool} | {r['emulated_us']:.1f} | {100 * r['fraction']:.1f}% "
              f"| {r['rtx_floor_us']:.1f} ({r['bound']}) | {r['rtx_model_us']:.0f} |")


if __name__ == "__main__":
    main()
