"""Command line: ``python -m tritree [demo] ...`` (also the ``tritree`` console script).

Until the decoding engine exists, the main job is the verify-attention demo: a random tree over a
random paged latent cache, the Triton kernel's output checked against the float64 reference and, on a
GPU, its time against the hardware floor. Without a GPU the kernel runs in Triton's interpreter
(small default shape).
"""

from __future__ import annotations

import argparse
import math
import os
import sys


def _ensure_interpreter_without_gpu() -> None:
    """Triton reads TRITON_INTERPRET when it is imported; re-run this command with it set when there is
    no GPU, so that the demo exercises the kernel rather than the CPU reference path."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "tritree", *sys.argv[1:]], env)


def demo(args) -> int:
    import torch

    from . import verify_mla, verify_mla_reference
    from .kernels.configs import arch_of
    from .testing import random_verify_inputs

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or ("bf16" if gpu else "fp32")]
    B, T, H, P = args.batch, args.tree, args.heads, args.page_size
    L = args.context if args.context is not None else (46_000 if gpu else 200)
    sm_scale = 192**-0.5 * (1 + 0.1 * math.log(64)) ** 2
    where = f"GPU {torch.cuda.get_device_name()} ({arch_of(device)} configs)" if gpu else "CPU, Triton interpreter"
    print(f"tritree verify-attention demo on {where}")
    print(f"shape: B={B} T={T} H={H} L={L} P={P} {args.dtype or str(dtype).removeprefix('torch.')}, "
          f"random DDTree-like trees, fragmented page table")
    case = random_verify_inputs(B, T, H, P, [L] * B, None, ("wide", "random", "chain"), dtype, seed=args.seed,
                                device=device)
    call = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    out = verify_mla(*call, sm_scale=sm_scale)
    ref = verify_mla_reference(*(x.double() if x.is_floating_point() else x for x in call), sm_scale=sm_scale)
    err = float((out.double() - ref).norm() / ref.norm())
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    ok = err <= tol and not torch.isnan(out).any()
    print(f"check against the float64 reference: relative error {err:.2e} (tolerance {tol:.0e}) "
          f"{'OK' if ok else 'FAILED'}")
    if gpu:
        from .roofline import graph_time_us, measure_ceilings, verify_mla_counts

        ceil = measure_ceilings()
        o = torch.empty_like(out)
        lse = torch.empty(out.shape[:3], dtype=torch.float32, device=device)
        us = graph_time_us([lambda: verify_mla(*call, sm_scale=sm_scale, out=o, lse=lse)])
        nbytes, flops = verify_mla_counts(B, T, H, L, dtype_bytes=case["kv"].element_size())
        floor_us, bound = ceil.floor_us(nbytes, flops)
        print(f"time: {us:.1f} us per call (CUDA graph replay, median; one input set, so L2 may help) | "
              f"floor {floor_us:.1f} us ({bound}-bound, copy {ceil.copy_gbps:.0f} GB/s, matmul "
              f"{ceil.matmul_tflops:.0f} TFLOP/s measured now) | {nbytes / us / 1e3:.0f} GB/s, "
              f"{flops / us / 1e6:.1f} TFLOP/s")
    else:
        print("time: not measured (no GPU); see bench/RESULTS.md for H200 numbers")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tritree", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="verify-attention check against the reference (+ timing on a GPU)")
    for p in (ap, d):
        p.add_argument("--batch", "-B", type=int, default=1)
        p.add_argument("--tree", "-T", type=int, default=16, help="tree tokens per request, root included")
        p.add_argument("--heads", "-H", type=int, default=8, help="query heads (8 = Kimi K2.6 at TP8)")
        p.add_argument("--context", "-L", type=int, default=None, help="committed tokens (46000 on a GPU, 200 on the CPU)")
        p.add_argument("--page-size", "-P", type=int, default=64)
        p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None)
        p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    _ensure_interpreter_without_gpu()
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
