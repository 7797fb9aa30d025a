"""What the bandwidth-bound verify shape (T=8, H=8, B=1, P=64) can reach on this GPU, and where its time goes.

    PYTHONPATH=. python bench/stream_ceiling.py [--ctx 46000]

Graph-timed over input sets rotated past the L2 (``tritree.roofline``), in one run:

* the read ceiling at this size: a Triton kernel that only reads the ``(L + T) x 576`` bf16 KV bytes
  of one verify call (each program sums a contiguous chunk; several grids and block sizes, the best
  reported), a device copy of the same bytes, and an empty kernel (one graph node's cost);
* ``verify_mla`` at T=8, H=8 over context lengths (the slope is the streaming rate, the intercept the
  fixed cost: launch, Q, partials, merge);
* at ``--ctx``: the plain Gluon attention kernel alone (``VerifyPlan.split_kernel``) and the split merge alone.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.verify_sweep import SM_SCALE, build_sets  # noqa: E402
from tritree import verify_mla  # noqa: E402
from tritree.kernels._splitkv import choose_num_splits, combine_splits  # noqa: E402
from tritree.kernels.configs import AttnConfig, num_sms  # noqa: E402
from tritree.kernels.verify import VerifyPlan  # noqa: E402
from tritree.kernels.verify import gluon_launch as GL  # noqa: E402
from tritree.roofline import cached_ceilings, graph_time_us, rotation_count, versions  # noqa: E402


@triton.jit
def _read_kernel(X, Out, n, chunk, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.range(0, chunk, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(Out + pid, tl.sum(acc, 0))


@triton.jit
def _empty_kernel(Out):
    tl.store(Out, 1.0)


def read_time(pools, grid, block, stages, warps):
    n = pools[0].numel()
    chunk = triton.cdiv(triton.cdiv(n, grid), block) * block
    out = torch.empty(grid, device="cuda", dtype=torch.float32)
    fns = [lambda x=x: _read_kernel[(grid,)](x, out, n, chunk, BLOCK=block, num_stages=stages, num_warps=warps)
           for x in pools]
    return graph_time_us(fns)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=46000)
    args = ap.parse_args()
    T, H, P, B = 8, 8, 64, 1
    ceil = cached_ceilings()
    print(f"# {versions()}; ceilings: copy {ceil.copy_gbps:.0f} GB/s, matmul {ceil.matmul_tflops:.1f} TF/s", flush=True)
    L = args.ctx
    kv_bytes = (L + T) * 576 * 2
    floor_us = kv_bytes / (ceil.copy_gbps * 1e9) * 1e6
    print(f"# L={L}: KV bytes {kv_bytes / 1e6:.1f} MB, floor at the copy rate {floor_us:.1f} us", flush=True)

    n_sets = rotation_count(kv_bytes)
    pools = [torch.randn(kv_bytes // 2, device="cuda").to(torch.bfloat16) for _ in range(n_sets)]
    sink = torch.empty(1, device="cuda")
    t = graph_time_us([lambda: _empty_kernel[(1,)](sink)] * 8)
    print(f"empty kernel (one graph node): {t:.1f} us", flush=True)
    dsts = [torch.empty_like(x) for x in pools]
    t = graph_time_us([lambda x=x, d=d: d.copy_(x) for x, d in zip(pools, dsts)])
    print(f"device copy of the KV bytes: {t:.1f} us = {2 * kv_bytes / t / 1e3:.0f} GB/s (read + write)", flush=True)
    del dsts
    sms = num_sms(torch.device("cuda"))
    best = None
    for grid in (sms, 2 * sms, 4 * sms, 8 * sms):
        for block, warps in ((4096, 8), (8192, 8), (8192, 16)):
            for stages in (2, 4):
                t = read_time(pools, grid, block, stages, warps)
                print(f"read-only kernel grid {grid:5d} block {block:5d} warps {warps:2d} stages {stages}: {t:6.1f} us "
                      f"= {kv_bytes / t / 1e3:5.0f} GB/s = {floor_us / t:5.1%} of the copy floor", flush=True)
                if best is None or t < best[0]:
                    best = (t, grid, block, warps, stages)
    print(f"best read-only: {best[0]:.1f} us (grid {best[1]}, block {best[2]}, warps {best[3]}, stages {best[4]}) "
          f"= {floor_us / best[0]:.1%} of the copy floor", flush=True)
    del pools
    torch.cuda.empty_cache()

    for ctx in (1000, 4000, 16000, 46000, 128000):
        sets = build_sets(B, T, H, ctx, P, rotation_count((ctx + T) * 576 * 2), torch.bfloat16, "cuda")
        outs = [(torch.empty(B, T, H, 512, device="cuda", dtype=torch.bfloat16),
                 torch.empty(B, T, H, device="cuda", dtype=torch.float32)) for _ in sets]
        fns = [lambda s=s, o=o: verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"],
                                           sm_scale=SM_SCALE, out=o[0], lse=o[1]) for s, o in zip(sets, outs)]
        t = graph_time_us(fns)
        fl = (ctx + T) * 576 * 2 / (ceil.copy_gbps * 1e9) * 1e6
        line = f"verify_mla T=8 H=8 P=64 L={ctx:6d}: {t:6.1f} us (floor {fl:5.1f} us, {fl / t:5.1%})"
        if ctx == L and GL.GLUON_AVAILABLE:
            for s in sets:
                s["tree_lens"] = torch.full((B,), T, dtype=torch.int32, device="cuda")
            splits = choose_num_splits(batch=B, row_blocks=1, max_keys=sets[0]["page_table"].shape[1] * P,
                                       block_n=64, sms=sms, programs_per_sm=1, whole_waves=True)
            # the plain kernel as verify_mla plans it (bf16 partials over TMA), one plan (and partials) a set
            cfg = AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon")
            args = [(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], s["tree_lens"]) for s in sets]
            plans = [VerifyPlan(*a, sm_scale=SM_SCALE, config=cfg, num_splits=splits) for a in args]
            assert plans[0].launch.route == "gluon", plans[0].launch
            scr = [p.split_kernel(*a) for p, a in zip(plans, args)]  # each plan's partials

            t_main = graph_time_us([lambda p=p, a=a: p.split_kernel(*a) for p, a in zip(plans, args)])
            t_merge = graph_time_us([lambda sc=sc, o=o: combine_splits(sc[0], sc[1], o[0], o[1])
                                     for sc, o in zip(scr, outs)])
            line += f" | {splits} splits: attention kernel alone {t_main:.1f} us, merge alone {t_merge:.1f} us"
        print(line, flush=True)
        del sets, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
