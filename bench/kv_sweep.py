"""KV cache ops on a GPU: achieved GB/s of write / commit / gather / page copies against the measured
copy bandwidth, the latency of one request's commit over 61 layers (one graph replay, and back to back
in one graph, next to the replay floor of one tiny kernel), defrag time, and verify attention on a
fragmented pool (P = 1 and P = 64) before and after ``defrag_``.

    python -m bench.kv_sweep --out kv.jsonl          (GPU)
    python -m bench.kv_sweep --smoke                 (CPU interpreter: runs every path at tiny sizes)
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from tritree import PagePool, defrag_, kv_commit_, kv_gather, kv_write_, tree_mask_from_parents, verify_mla
from tritree.kernels.kv_pool import _move_rounds, plan_defrag
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
        from tritree.roofline import device_ceilings
        copy_gbps = device_ceilings().copy_gbps
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
    moved = sum(1 for j, a in enumerate(idx) if a != j)
    one_bytes = 2 * layers * moved * E * kv.element_size()
    # The floor of this timing method: one graph replay holding one tiny kernel.
    tiny = torch.zeros(1, device=dev)
    floor_us = timer([lambda: tiny.add_(1)])
    rows.append(dict(op="graph replay floor (one tiny kernel)", us=floor_us))
    print(f"{'graph replay floor (1 tiny kernel)':34s} {floor_us:10.1f} us", flush=True)
    t1 = table[:1]
    us = timer([lambda: kv_commit_(kv, t1, lens1, acc, acc_len, stacked=True)])
    record("kv_commit_ 1 request x all layers", us, one_bytes, layers=layers, accepted=len(idx), moved_rows=moved,
           timing="one replay")
    # The same commit B times back to back in one graph, each on another request's pages: the cost
    # inside a captured decode step (kernel time + the gap between kernels, no replay launch).
    fns = [lambda b=b: kv_commit_(kv, table[b:b + 1], lens1, acc, acc_len, stacked=True) for b in range(B)]
    us = timer(fns)
    record("kv_commit_ 1 request, back to back", us, one_bytes, layers=layers, accepted=len(idx), moved_rows=moved,
           timing=f"{B} calls in one graph, per call")
    # B requests at the same acceptance (the engine's batch shape).
    accB1 = acc.expand(B, -1).contiguous()
    accB1_len = acc_len.expand(B).contiguous()
    us = timer([lambda: kv_commit_(kv, table, kv_lens, accB1, accB1_len, stacked=True)])
    record("kv_commit_ B requests x all layers", us, B * one_bytes, layers=layers, B=B, accepted=len(idx),
           moved_rows=moved)
    # Many requests, every node accepted but shifted (the most data a commit can move): accepted
    # [0, 2, 3, ..., T-1], T-2 rows move per request.
    accB = torch.tensor([[0] + list(range(2, T)) + [-1]] * B, dtype=torch.int32, device=dev)
    accB_len = torch.full((B,), T - 1, dtype=torch.int32, device=dev)
    us = timer([lambda: kv_commit_(kv, table, kv_lens, accB, accB_len, stacked=True)])
    record("kv_commit_ B requests, shifted path", us, 2 * layers * B * (T - 2) * E * kv.element_size(), layers=layers,
           B=B, moved_rows_per_request=T - 2)

    # 3. defrag_ of a pool fragmented at random (one long request), P = 1 and P = 64; verify before / after.
    for P in (1, 64):
        defrag_case(P, smoke, dev, dt, timer, record, rows)
    append_jsonl(out_path, rows)
    return rows


def defrag_case(P, smoke, dev, dt, timer, record, rows):
    """One request of L = 46,000 tokens (+ a T = 16 tree) in a pool of P-token pages randomly
    permuted (4096 tokens of free room): verify_mla (defaults) on the fragmented table, defrag_ time
    (its page-copy kernel warmed first; host planning timed apart), verify_mla on the packed table."""
    Lv, Tv, H = ((48 if P == 1 else 200), 8, 4) if smoke else (46_000, 16, 8)
    room = 64 if smoke else 4096
    need = math.ceil((Lv + Tv) / P)
    n_pages = need + math.ceil(room / P)
    lat = torch.randn(n_pages, P, 576, device=dev, dtype=dt)
    pool = PagePool(n_pages, P)
    perm = torch.randperm(n_pages).tolist()
    pool.pages["r"] = perm[:need]
    pool._free = set(perm[need:])
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
    # compile the page-copy kernel at this page size outside the timing (a 2-page chain of moves)
    warm = PagePool(4, P, pages={"w": [2, 0]})
    defrag_(torch.zeros(4, P, 576, device=dev, dtype=dt), warm.page_table(["w"], device=dev),
            torch.tensor([2 * P], dtype=torch.int32, device=dev), warm, ["w"])
    t0 = time.perf_counter()  # the host planning alone (defrag_ repeats it)
    mapping = plan_defrag(pool, ["r"])
    plan = _move_rounds(mapping, set(pool.pages["r"]), n_pages, max(1, (256 << 20) // (P * 576 * lat.element_size())))
    plan_us = (time.perf_counter() - t0) * 1e6
    if not smoke:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    new_table = defrag_(lat, vt, vlens + Tv, pool, ["r"])
    if not smoke:
        torch.cuda.synchronize()
    defrag_us = (time.perf_counter() - t0) * 1e6
    record(f"defrag_ (P={P}, one request, L={Lv})", defrag_us, 2 * need * P * 576 * lat.element_size(),
           pages=need, moved_pages=len(mapping), rounds=len(plan), host_plan_us=round(plan_us, 1))
    after_out = verify_mla(q, lat, new_table, vlens, mask, sm_scale=scale)
    assert torch.equal(after_out, before_out), "defrag changed what verify reads"
    us_after = timer([lambda: verify_mla(q, lat, new_table, vlens, mask, sm_scale=scale, out=o, lse=lse)])
    rows.append(dict(op=f"verify P={P} before/after defrag", before_us=us_before, after_us=us_after, L=Lv, T=Tv, H=H,
                     P=P, defrag_us=defrag_us, host_plan_us=plan_us))
    print(f"verify_mla P={P} L={Lv} T={Tv} H={H}: fragmented {us_before:.1f} us, after defrag_ {us_after:.1f} us "
          f"({100 * (us_after / us_before - 1):+.1f}%); defrag_ {defrag_us / 1e3:.2f} ms (host plan "
          f"{plan_us / 1e3:.2f} ms)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    run(args.smoke, args.out)


if __name__ == "__main__":
    main()
