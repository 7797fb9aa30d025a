"""Where a verify_mla call's time goes: the attention kernel vs the split combine (torch.profiler).

    python -m bench.split_profile --shapes "8,8;64,8;16,64" --configs "table;64,64,8,2,1,1,1,gluon-ws"

Each case runs ``--iters`` eager calls over input sets rotated past the L2 and prints the mean device
time of every kernel that ran, per call (B = 1, bf16, L = ``--ctx``, P = ``--page-size``).
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from tritree import verify_mla

from .verify_sweep import SM_SCALE, build_sets, parse_config


def profile_case(T, H, L, P, cfg, iters):
    sets = build_sets(1, T, H, L, P, 5, torch.bfloat16, "cuda")
    out = torch.empty(1, T, H, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(1, T, H, device="cuda", dtype=torch.float32)

    def call(s):
        verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], sm_scale=SM_SCALE,
                   out=out, lse=lse, config=cfg)

    for s in sets:
        call(s)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            call(sets[i % len(sets)])
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[ev.name[:48]] += ev.time_range.elapsed_us() / iters
    return per_kernel


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8,8;16,8;64,8;16,64;65,8;17,8", help="T,H;...")
    ap.add_argument("--configs", default="table",
                    help="'table' or verify_sweep.parse_config's BM,BN,warps,stages[,programs_per_sm[,tma"
                         "[,split_scores]]][,KERNEL]; ...")
    ap.add_argument("--ctx", type=int, default=46000)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--combine", default="",
                    help="MIN_PROGRAMS,CHUNK_VALUES[,WARPS8_VALUES] of the split merge (combine_config)")
    args = ap.parse_args(argv)
    if args.combine:
        from tritree.kernels import _splitkv

        bounds = [int(x) for x in args.combine.split(",")]
        _splitkv._COMBINE_MIN_PROGRAMS, _splitkv._COMBINE_CHUNK_VALUES = bounds[:2]
        if len(bounds) > 2:
            _splitkv._COMBINE_WARPS8_VALUES = bounds[2]
    for shape in args.shapes.split(";"):
        T, H = map(int, shape.split(","))
        for c in args.configs.split(";"):
            cfg = None if c == "table" else parse_config(c)
            k = profile_case(T, H, args.ctx, args.page_size, cfg, args.iters)
            total = sum(k.values())
            parts = "  ".join(f"{name} {us:.1f}" for name, us in sorted(k.items(), key=lambda x: -x[1]))
            tag = c + (f" combine {args.combine}" if args.combine else "")
            print(f"T={T:>3} H={H:>2} P={args.page_size:>2} [{tag}] total {total:.1f} us: {parts}", flush=True)


if __name__ == "__main__":
    main()
