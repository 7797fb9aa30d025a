"""The compute ceiling of sm_120 emulation on the H200: a bf16 Triton matmul under ``DISABLE_MMA_V3=1``.

    DISABLE_MMA_V3=1 python -m bench.mma_sync_ceiling [--n 8192]

With ``DISABLE_MMA_V3=1`` Triton lowers ``tl.dot`` to ``mma.sync`` (as on sm_120) instead of wgmma, so
the sm_120 configs' emulated times are compared against what ``mma.sync`` itself reaches on this GPU,
not against cuBLAS's wgmma rate. Prints the best TFLOP/s over a few tile configs (8192^3, random data,
CUDA-event median) and, with ``--out``, writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from tritree.roofline import median_event_ms, versions


@triton.jit
def _matmul_kernel(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    # Grouped program order so that neighbouring programs share A rows in the L2.
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)
    first_m = group * GROUP
    size_m = min(n_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * n_n)) % size_m
    pid_n = (pid % (GROUP * n_n)) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(A + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(B + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty))


CONFIGS = [(128, 128, 64, 8, 3), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3),
           (128, 128, 64, 4, 3)]


def measure(n: int) -> dict:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ref = (a[:256].float() @ b.float()).to(torch.bfloat16)
    rows = {}
    for bm, bn, bk, warps, stages in CONFIGS:
        grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)

        def run():
            _matmul_kernel[grid](a, b, c, n, n, n, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
        try:
            run()
            torch.cuda.synchronize()
            err = ((c[:256].float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            ms = median_event_ms(run, reps=20)
            rows[f"{bm}x{bn}x{bk} w{warps} s{stages}"] = (2 * n**3 / (ms * 1e-3) / 1e12, err)
        except Exception as e:  # a config the GPU cannot run (shared memory): skipped
            rows[f"{bm}x{bn}x{bk} w{warps} s{stages}"] = (0.0, repr(e)[:80])
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    mode = "mma.sync (DISABLE_MMA_V3=1)" if os.environ.get("DISABLE_MMA_V3") == "1" else "default lowering"
    print(f"# {versions()}; Triton bf16 matmul {args.n}^3, {mode}")
    rows = measure(args.n)
    for name, (tflops, err) in rows.items():
        print(f"{name:24s} {tflops:7.1f} TFLOP/s  rel err {err}")
    best = max(t for t, _ in rows.values())
    print(f"best {best:.1f} TFLOP/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"mode": mode, "n": args.n, "best_tflops": best, "rows": rows}, f)


if __name__ == "__main__":
    main()
