"""verify_mla sweep on a GPU: time, GB/s, TFLOP/s and fraction of the floor, side by side with the
PyTorch version a user would write (gather the pages, dense masked attention).

    python -m bench.verify_sweep --grid full --variant tritree --variant torch --out results.jsonl
    DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120 python -m bench.verify_sweep --grid sm120 --variant tritree-sm120 \
        --variant tritree-sm120-triton --mma-sync-ceiling
    python -m bench.verify_sweep --trees chain --variant tritree --variant flashinfer ...
    python -m bench.verify_sweep --grid engine --splits 0,62,66 --filter "T == 9"   # split counts side by side

``flashinfer``: FlashInfer's MLA kernel (``flashinfer.mla.BatchMLAPagedAttentionWrapper``, issue #2's named
peer; FlashInfer carried to the GPU machine as wheels, ``bench/PEERS.md``) over the same pool, page
table and queries, for chain-shaped trees only (``--trees chain``: its causal mask is a chain's tree mask).

The sm_120 emulation (mma.sync instead of wgmma, with the sm_120 config table) must run in its own
process: Triton reads DISABLE_MMA_V3 when it compiles. ``tritree-sm120`` is what ``verify_mla`` runs there
(bf16 pools: the Gluon ``mma.sync`` kernel, ``kernel="gluon-mma"``, whose instructions are sm_120's on any GPU;
fp8 pools: the Triton kernel); ``tritree-sm120-triton`` the Triton kernel with the tiles that served bf16 pools
on sm_120 before the Gluon kernel (16x64x4x2 at P >= 64, 32x32x8x2 below). ``--mma-sync-ceiling`` measures
``bench.mma_sync_ceiling`` in the same process and reports each row against it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch

from tritree import tree_mask_from_parents, verify_mla
from tritree.kernels.configs import AttnConfig
from tritree.roofline import (
    Ceilings,
    cached_ceilings,
    ceilings_source,
    graph_time_us,
    rotation_count,
    verify_mla_counts,
    versions,
)
from tritree.testing import paged_layout, random_trees

SM_SCALE = 192**-0.5 * (1 + 0.1 * math.log(64)) ** 2
GRIDS = {
    # The whole grid: L x T x H x B x P.
    "full": dict(L=[4096, 16384, 46000, 131072], T=[8, 16, 32, 64, 128], H=[8, 16, 64], B=[1, 4, 16], P=[1, 64]),
    # The target shapes and their neighbours.
    # A run of a few minutes: every L, the target T and H extremes, both page sizes.
    "issue": dict(L=[4096, 16384, 46000, 131072], T=[8, 16, 64, 128], H=[8, 64], B=[1], P=[1, 64]),
    "batch": dict(L=[4096, 16384, 46000], T=[16, 64], H=[8], B=[4, 16], P=[64]),
    "targets": dict(L=[46000], T=[8, 16, 64], H=[8, 64], B=[1], P=[1, 64]),
    # The engine's verify shapes (T = budget + 1) on a TP8 rank of K2.6 (8 heads).
    "engine": dict(L=[46000], T=[9, 17, 65], H=[8], B=[1], P=[64]),
    # sm_120's target shapes: T = 8, 17, 65 with H = 8 and T = 16 with H = 64, at 46k and 128k, B = 1 and 4.
    "sm120": dict(L=[46000, 131072], T=[8, 16, 17, 65], H=[8, 64], B=[1, 4], P=[1, 64],
                  where=lambda B, T, H, L, P: (H == 8 and T != 16) or (H == 64 and T == 16)),
}
TORCH_SCORE_LIMIT = 8 << 30  # skip the dense PyTorch version when its score tensor would exceed this


def torch_verify(q, kv, page_table, kv_lens, tree_mask, sm_scale, max_len):
    """The straightforward PyTorch version: gather every page, dense attention with a boolean mask.
    Static shapes (``max_len`` keys), so it can be captured in a CUDA graph."""
    B, T, H, _ = q.shape
    P = kv.shape[1]
    pos = torch.arange(max_len, device=q.device)
    keys = kv[page_table[:, pos // P].long(), pos % P]  # [B, S, 576]
    scores = torch.einsum("bthd,bsd->bths", q, keys).float() * sm_scale
    j = pos[None, :] - kv_lens[:, None]  # tree index of key s
    jj = j.clamp(0, T - 1)
    words = torch.gather(tree_mask, 2, (jj // 32)[:, None, :].expand(B, T, max_len).long())
    bit = ((words >> (jj % 32)[:, None, :]) & 1).bool()
    visible = (j < 0)[:, None, :] | (bit & (j < T)[:, None, :])
    scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.einsum("bths,bsd->bthd", p, keys[..., :512])


TREE_KINDS = {"random": ("random", "wide"), "chain": ("chain",)}


def build_sets(B, T, H, L, P, n_sets, dtype, device, seed=0, trees="random", fragmented=None):
    """``n_sets`` input sets; pages randomly permuted with ``fragmented`` (default: at P = 1 only)."""
    g = torch.Generator().manual_seed(seed)
    cap = L + T
    sets = []
    parents = random_trees(B, T, TREE_KINDS[trees], generator=g)
    tree_mask, _ = tree_mask_from_parents(parents.to(device))
    kv_lens = torch.full((B,), L, dtype=torch.int32, device=device)
    for _ in range(n_sets):
        page_table, num_pages = paged_layout(cap, B, P, fragmented=(P == 1) if fragmented is None else fragmented,
                                             generator=g, device=device)
        kv = torch.randn(num_pages, P, 576, device=device, dtype=dtype)
        q = torch.randn(B, T, H, 576, device=device, dtype=dtype)
        sets.append(dict(q=q, kv=kv, page_table=page_table, kv_lens=kv_lens, tree_mask=tree_mask))
    return sets


def flashinfer_fns(sets, B, T, H, L, P, backend="auto"):
    """One FlashInfer MLA call per input set (planned here, outside any graph), writing preallocated
    outputs; queries and pool are views of the same tensors tritree reads (512 latent ++ 64 rope
    channels), the pool's pages through the same page table. Returns ``(fns, backend)``."""
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    dev = sets[0]["q"].device
    n_pages = -(-(L + T) // P)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * T
    kv_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * n_pages
    kv_len = torch.full((B,), L + T, dtype=torch.int32, device=dev)
    fns = []
    for s in sets:
        wrapper = BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.int8, device=dev), backend=backend)
        kv_indices = s["page_table"][:, :n_pages].reshape(-1).contiguous()
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len, H, 512, 64, P, True, SM_SCALE, s["q"].dtype,
                     s["kv"].dtype)
        q = s["q"].reshape(B * T, H, 576)
        out = torch.empty(B * T, H, 512, dtype=s["q"].dtype, device=dev)
        fns.append(lambda w=wrapper, q=q, kv=s["kv"], o=out: w.run(q[..., :512], q[..., 512:], kv[..., :512],
                                                                     kv[..., 512:], out=o).view(B, T, H, 512))
    return fns, getattr(wrapper, "_backend", backend)


def to_fp8_sets(sets):
    """The pools quantised to float8_e4m3fn with one per-tensor scale (``kv_scale`` of each set)."""
    for s in sets:
        scale = float(s["kv"].abs().max()) / 448.0
        s["kv"] = (s["kv"].float() / scale).to(torch.float8_e4m3fn)
        s["kv_scale"] = scale
    return sets


def sm120_triton_config(P: int) -> AttnConfig:
    """The Triton kernel's tiles that served bf16 pools on sm_120 before the Gluon kernel: 16x64x4x2 where a
    page holds a tile, 32x32x8x2 below (one page id a row; 16x64 spills there)."""
    return AttnConfig(16, 64, 4, 2) if P >= 64 else AttnConfig(32, 32, 8, 2)


def run_case(B, T, H, L, P, variant, ceil: Ceilings, config=None, check=True, trees="random", fragmented=None,
             num_splits=None):
    fp8 = variant == "tritree-fp8"
    if variant == "tritree-sm120-triton" and config is None:
        config = sm120_triton_config(P)
    nbytes, flops = verify_mla_counts(B, T, H, L, kv_bytes=1 if fp8 else 2)
    n_sets = rotation_count(B * (L + T) * 576 * (1 if fp8 else 2))
    row = dict(B=B, T=T, H=H, L=L, P=P, variant=variant, trees=trees, config=str(config) if config else "default",
               num_splits=num_splits or "plan",
               fragmented=(P == 1) if fragmented is None else bool(fragmented))
    if variant == "flashinfer" and trees != "chain":
        return {**row, "skipped": "FlashInfer's MLA mask is causal: chain-shaped trees only (--trees chain)"}
    sets = build_sets(B, T, H, L, P, n_sets, torch.bfloat16, "cuda", trees=trees, fragmented=fragmented)
    if fp8:
        sets = to_fp8_sets(sets)
    if variant == "flashinfer":
        try:
            fns, row["backend"] = flashinfer_fns(sets, B, T, H, L, P)
        except ImportError as e:
            return {**row, "skipped": f"flashinfer not importable: {e}"}
    elif variant == "torch":
        if B * T * H * (L + T) * 4 * 3 > TORCH_SCORE_LIMIT:
            return {**row, "skipped": "score tensor too large"}
        fns = [lambda s=s: torch_verify(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], SM_SCALE, L + T)
               for s in sets]
    else:
        outs = [(torch.empty(B, T, H, 512, device="cuda", dtype=torch.bfloat16),
                 torch.empty(B, T, H, device="cuda", dtype=torch.float32)) for _ in sets]
        fns = [lambda s=s, o=o: verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"],
                                           sm_scale=SM_SCALE, out=o[0], lse=o[1], config=config,
                                           num_splits=num_splits, kv_scale=s.get("kv_scale"))
               for s, o in zip(sets, outs)]
    try:
        us = graph_time_us(fns)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {**row, "skipped": "out of memory"}
    floor_us, bound = ceil.floor_us(nbytes, flops)
    row.update(us=us, gbps=nbytes / (us * 1e-6) / 1e9, tflops=flops / (us * 1e-6) / 1e12, floor_us=floor_us,
               bound=bound, frac_floor=floor_us / us, frac_copy_bw=nbytes / (us * 1e-6) / 1e9 / ceil.copy_gbps,
               frac_mma=flops / (us * 1e-6) / 1e12 / ceil.matmul_tflops, n_sets=n_sets)
    if check and variant != "torch" and B * T * H * (L + T) * 4 * 3 <= TORCH_SCORE_LIMIT // 4:
        s = sets[0]
        kv_ref = s["kv"].float() * s.get("kv_scale", 1.0)
        ref = torch_verify(s["q"].float(), kv_ref, s["page_table"], s["kv_lens"], s["tree_mask"], SM_SCALE, L + T)
        out = fns[0]() if variant in ("torch", "flashinfer") else verify_mla(
            s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], sm_scale=SM_SCALE, config=config,
            num_splits=num_splits, kv_scale=s.get("kv_scale"))
        row["rel_err"] = float((out.float() - ref).norm() / ref.norm())
    del sets
    torch.cuda.empty_cache()
    return row


def parse_config(text: str) -> AttnConfig:
    """``BM,BN,warps,stages[,programs_per_sm[,tma[,split_scores]]][,KERNEL]`` (KERNEL: a non-numeric last
    field, ``gluon`` / ``gluon-ws`` / ``gluon-mma`` / ``triton``: :class:`AttnConfig` ``kernel``), e.g. ``64,64,8,2,1,1,1,gluon-ws``."""
    parts = [p.strip() for p in text.split(",")]
    kernel = "triton"
    if not parts[-1].isdigit():
        kernel = parts.pop()
    v = [int(x) for x in parts]
    if not 4 <= len(v) <= 7:
        raise ValueError(f"a verify config is BM,BN,warps,stages[,programs_per_sm[,tma[,split_scores]]][,KERNEL]; "
                         f"got {text!r}")
    flag = lambda i: bool(v[i]) if len(v) > i else False  # noqa: E731
    return AttnConfig(*v[:4], programs_per_sm=v[4] if len(v) > 4 else 1, tma=flag(5), split_scores=flag(6),
                      kernel=kernel)


def fmt_row(r):
    frag = "f" if r.get("fragmented") and r["P"] > 1 else " "  # P = 1 pools are always permuted
    head = f"L={r['L']:>6} T={r['T']:>3} H={r['H']:>2} B={r['B']:>2} P={r['P']:>2}{frag} {r['variant']:14s}"
    if "skipped" in r:
        return head + f" skipped ({r['skipped']})"
    err = f" err {r['rel_err']:.1e}" if "rel_err" in r else ""
    err += f" [{r['backend']}]" if "backend" in r else ""
    return (head + f" {r['us']:9.1f} us  floor {r['floor_us']:8.1f} ({r['bound'][:3]})  {r['frac_floor']*100:5.1f}% "
            f"{r['gbps']:7.0f} GB/s ({r['frac_copy_bw']*100:4.1f}%)  {r['tflops']:6.1f} TFLOP/s ({r['frac_mma']*100:4.1f}%){err}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="targets", choices=sorted(GRIDS))
    ap.add_argument("--variant", action="append",
                    choices=["tritree", "tritree-fp8", "tritree-sm120", "tritree-sm120-triton", "torch",
                             "flashinfer"],
                    help="tritree-fp8: the pool quantised to float8_e4m3fn with a per-tensor scale; tritree-sm120: "
                         "the sm_120 table under mma.sync emulation; tritree-sm120-triton: the Triton kernel with "
                         "sm_120's former bf16 tiles; torch: the dense PyTorch version; flashinfer: FlashInfer's "
                         "MLA kernel (with --trees chain)")
    ap.add_argument("--mma-sync-ceiling", action="store_true",
                    help="measure the mma.sync ceiling (bench.mma_sync_ceiling) in this process and report each "
                         "row's TFLOP/s against it")
    ap.add_argument("--trees", default="random", choices=sorted(TREE_KINDS),
                    help="tree shapes: random/wide trees, or chains (causal; what FlashInfer supports)")
    ap.add_argument("--fragmented", action="store_true",
                    help="pages randomly permuted at every page size (default: at P = 1 only)")
    ap.add_argument("--configs", default="",
                    help="semicolon-separated configs to try instead of the table (parse_config: "
                         "BM,BN,warps,stages[,programs_per_sm[,tma[,split_scores]]][,KERNEL])")
    ap.add_argument("--splits", default="",
                    help="comma-separated split counts to run each tritree case with (0: the plan's own)")
    ap.add_argument("--filter", default="", help="python expression over B,T,H,L,P selecting cases")
    ap.add_argument("--out", default="verify_sweep.jsonl")
    ap.add_argument("--ceilings", default="", help="JSON file of measured ceilings (measured if absent)")
    args = ap.parse_args(argv)
    variants = args.variant or ["tritree"]
    sm120 = {"tritree-sm120", "tritree-sm120-triton"} & set(variants)
    if sm120 and (os.environ.get("DISABLE_MMA_V3") != "1" or os.environ.get("TRITREE_ARCH") != "sm_120"):
        sys.exit(f"{sorted(sm120)} need DISABLE_MMA_V3=1 TRITREE_ARCH=sm_120 in the environment")
    ceil = cached_ceilings(args.ceilings)
    print(f"# {versions()}; copy {ceil.copy_gbps:.0f} GB/s, bf16 matmul {ceil.matmul_tflops:.0f} TFLOP/s "
          f"({'from ' + args.ceilings if args.ceilings else ceilings_source()})", flush=True)
    mma_sync = None
    if args.mma_sync_ceiling:
        from bench.mma_sync_ceiling import measure

        mma_sync = max(t for t, _ in measure(8192).values())
        print(f"# mma.sync ceiling (Triton bf16 matmul 8192^3, this process): {mma_sync:.1f} TFLOP/s", flush=True)
    configs = [None]
    if args.configs:
        configs = [parse_config(c) for c in args.configs.split(";")]
    splits = [int(x) or None for x in args.splits.split(",")] if args.splits else [None]
    grid = GRIDS[args.grid]
    t0 = time.time()
    with open(args.out, "a") as f:
        for L, T, H, B, P in itertools.product(grid["L"], grid["T"], grid["H"], grid["B"], grid["P"]):
            if args.filter and not eval(args.filter, {}, dict(B=B, T=T, H=H, L=L, P=P)):
                continue
            if "where" in grid and not grid["where"](B=B, T=T, H=H, L=L, P=P):
                continue
            for variant in variants:
                for cfg, n_splits in itertools.product(*((configs, splits) if variant.startswith("tritree")
                                                          else ([None], [None]))):
                    try:
                        r = run_case(B, T, H, L, P, variant, ceil, config=cfg, trees=args.trees,
                                     fragmented=True if args.fragmented else None, num_splits=n_splits)
                    except Exception as e:  # record and go on: one bad config must not lose the sweep
                        r = dict(B=B, T=T, H=H, L=L, P=P, variant=variant, config=str(cfg), skipped=f"{type(e).__name__}: {str(e)[:200]}")
                        torch.cuda.empty_cache()
                    r["ceilings"] = ceil.__dict__
                    extra = ""
                    if mma_sync and "tflops" in r:
                        r["mma_sync_tflops"] = mma_sync
                        r["frac_mma_sync"] = r["tflops"] / mma_sync
                        extra = f"  {r['frac_mma_sync'] * 100:5.1f}% of mma.sync"
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    print(fmt_row(r) + extra + (f" [{r['config']}]" if cfg else "")
                          + (f" [{n_splits} splits]" if n_splits else ""), flush=True)
    print(f"# sweep done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
