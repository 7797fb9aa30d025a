"""KV cache ops on a GPU: achieved GB/s of write / commit / gather / page copies against the measured
copy bandwidth, the latency of one request's commit over 61 layers, defrag time, and verify attention
on a fragmented pool before and after ``defrag_``.

    python -m bench.kv_sweep --out kv.jsonl          (GPU)
    python -m bench.kv_sweep --smoke                 (CPU interpreter: runs every path at tiny sizes)
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from tritree import PagePool, defrag_, kv_commit_, kv_gather, kv_write_, tree_mask_from_parents, verify_mla
from tritree.roofline import append_jsonl
from tritree.testing import random_trees


def _timer(smoke: bool):
    if smoke:
        def wall_us(fns):
            t0 = time.perf_counter()
            for f in fns:
                f()
            return (time.perf_counter() - t0) * 1e6 / len(fns)
        return wall_us
    from tritree.roofline import graph_time_us
    return graph_time_us


def run(smoke: bool, out_path: str | None):
    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    timer = _timer(smoke)
    copy_gbps = float("nan")
    if not smoke:
        from tritree.roofline import measure_ceilings
        copy_gbps = measure_ceilings().copy_gbps
    layers, E = (2, 576) if smoke else (61, 576)
    rows = []

    def record(op, us, nbytes, **kw):
        r = dict(op=op, us=us, gbps=nbytes / (us * 1e-6) / 1e9 if us else float("nan"), bytes=nbytes, **kw)
        r["frac_copy"] = r["gbps"] / copy_gbps
        rows.append(r)
        print(f"{op:34s} {us:10.1f} us {r['gbps']:8.1f} GB/s ({100 * r['frac_copy']:5.1f}% of copy)  {kw}", flush=True)

    # 1. kv_write_ / kv_gather: large moves over a stacked pool, P = 64, fragmented pages.
    B, T, P = (2, 8, 16) if smoke else (16, 128, 64)
    L = 32 if smoke else 4096
    pages = math.ceil((L + T) / P)
    kv = torch.randn(layers, B * pages, P, E, device=dev, dtype=dt)
    table = torch.randperm(B * pages, device=dev).view(B, pages).int()
    kv_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    new = torch.randn(layers, B, T, E, device=dev, dtype=dt)
    record("kv_write_ (stacked)", timer([lambda: kv_write_(kv, table, kv_lens, new, stacked=True)]),
           2 * new.numel() * new.element_size(), layers=layers, B=B, T=T, P=P)
    S = L + T
    gl = kv_lens + T
    us = timer([lambda: kv_gather(kv, table, gl, max_len=S, stacked=True)])
    record("kv_gather (stacked)", us, 2 * layers * B * S * E * kv.element_size(), layers=layers, B=B, S=S, P=P)

    # 2. kv_commit_: one request, T = 64 tree, 10 accepted nodes, all 61 layers in one launch.
    T1 = 8 if smoke else 64
    idx = [0, 3, 4, 7] if smoke else [0, 3, 4, 9, 15, 22, 30, 41, 50, 63]
    lens1 = torch.tensor([L], dtype=torch.int32, device=dev)
    acc = torch.tensor([idx + [-1] * (T1 - len(idx))], dtype=torch.int32, device=dev)
    acc_len = torch.tensor([len(idx)], dtype=torch.int32, device=dev)
    t1 = table[:1]
    us = timer([lambda: kv_commit_(kv, t1, lens1, acc, acc_len, stacked=True)])
    moved = sum(1 for j, a in enumerate(idx) if a != j)
    record("kv_commit_ 1 request x all layers", us, 2 * layers * moved * E * kv.element_size(), layers=layers,
           accepted=len(idx), moved_rows=moved)
    # Many requests, every node accepted but shifted (the most data a commit can move).
    accB = torch.tensor([[0] + list(range(2, T + 1))[:T - 1] + [-1]] * B, dtype=torch.int32, device=dev)
    accB_len = torch.full((B,), T - 1, dtype=torch.int32, device=dev)
    us = timer([lambda: kv_commit_(kv, table, kv_lens, accB, accB_len, stacked=True)])
    record("kv_commit_ B requests, shifted path", us, 2 * layers * B * (T - 2) * E * kv.element_size(), layers=layers,
           B=B, moved_rows_per_request=T - 2)

    # 3. defrag_ of a P = 1 pool fragmented at random, one long request, then verify before / after.
    Lv, Tv, H = (48, 8, 4) if smoke else (46_000, 16, 8)
    n_pages = Lv + Tv + (64 if smoke else 4096)
    lat = torch.randn(n_pages, 1, 576, device=dev, dtype=dt)
    pool = PagePool(n_pages, 1)
    perm = torch.randperm(n_pages).tolist()
    pool.pages["r"] = perm[:Lv + Tv]
    pool._free = set(perm[Lv + Tv:])
    vt = pool.page_table(["r"], device=dev)
    vlens = torch.tensor([Lv], dtype=torch.int32, device=dev)
    q = torch.randn(1, Tv, H, 576, device=dev, dtype=dt)
    parents = random_trees(1, Tv, ("wide",), device=dev)
    mask, _ = tree_mask_from_parents(parents)
    scale = 192**-0.5
    before_out = verify_mla(q, lat, vt, vlens, mask, sm_scale=scale)
    o = torch.empty_like(before_out)
    lse = torch.empty(before_out.shape[:3], device=dev, dtype=torch.float32)
    us_before = timer([lambda: verify_mla(q, lat, vt, vlens, mask, sm_scale=scale, out=o, lse=lse)])
    warm = PagePool(4, 1, pages={"w": [2, 0]})  # compile the page-copy kernel outside the timing
    defrag_(torch.zeros(4, 1, 576, device=dev, dtype=dt), warm.page_table(["w"], device=dev),
            torch.tensor([2], dtype=torch.int32, device=dev), warm, ["w"])
    if not smoke:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    new_table = defrag_(lat, vt, vlens + Tv, pool, ["r"])
    if not smoke:
        torch.cuda.synchronize()
    defrag_us = (time.perf_counter() - t0) * 1e6
    record("defrag_ (P=1, one 46k request)", defrag_us, 2 * (Lv + Tv) * 576 * lat.element_size(), pages=Lv + Tv)
    after_out = verify_mla(q, lat, new_table, vlens, mask, sm_scale=scale)
    assert torch.equal(after_out, before_out), "defrag changed what verify reads"
    us_after = timer([lambda: verify_mla(q, lat, new_table, vlens, mask, sm_scale=scale, out=o, lse=lse)])
    rows.append(dict(op="verify P=1 before/after defrag", before_us=us_before, after_us=us_after, L=Lv, T=Tv, H=H))
    print(f"verify_mla P=1 L={Lv} T={Tv} H={H}: fragmented {us_before:.1f} us, after defrag_ {us_after:.1f} us", flush=True)
    append_jsonl(out_path, rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    run(args.smoke, args.out)


if __name__ == "__main__":
    main()
