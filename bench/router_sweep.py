"""MoE router at Kimi K2.6's shapes: tritree's one-launch ``moe_route`` against the plain torch router it replaced.

    PYTHONPATH=. python bench/router_sweep.py [--tokens 1 9 17 33 65 129] [--routing k26 v3]
        [--variant kernel torch] [--configs "BT,BE,BK,W,S[,SEL,PPS];..."] [--out router_sweep.jsonl]

Shape: H = 7168, E = 384, top-8, ``routed_scaling_factor`` 2.827, normalised weights, a bias; routing ``k26``
(n_group 1, topk_group 1: Kimi K2.6) or ``v3`` (8 groups, 4 kept: DeepSeek-V3's group limit at E = 384). Each
call routes N rows of one request with ``tree_lens`` (all rows real), as the verify pass does.

Variants: ``kernel`` (``tritree.moe_route``, the router weight in bf16 as the checkpoint holds it); ``torch``
(:func:`torch_router`: the model's router before ``moe_route``, a copy of that code; its weight in float32, as
the model held it then: an sgemm, a topk and ~10 elementwise kernels). Each variant is checked against the
float64 reference (``moe_route_reference``) before it is timed: the picks equal except where two candidates'
float64 choices are within 1e-5 (``ties``: rows picking differently there), the weights to ``err``.

Times: ``graph`` (``tritree.roofline.graph_time_us``: calls back to back in one CUDA graph, weights and inputs
rotated past the L2), ``eager`` (``triton.testing.do_bench`` of the plain call, median) and ``host`` (host time
per call: N calls, one synchronize). Floor: the bf16 weight and x read once, the outputs written (bytes / the
measured copy bandwidth); ``%copy``: those bytes per graph-timed call against the copy bandwidth.

``--configs`` times these ``RouterConfig`` (``BT,BE,BK,num_warps,num_stages[,sel_lanes,programs_per_sm]``)
instead of the table's (``kernel`` only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tritree.kernels.configs import arch_of, num_sms  # noqa: E402
from tritree.kernels.moe.router import RouterConfig, moe_route, moe_route_reference, plan_moe_route  # noqa: E402
from tritree.roofline import cached_ceilings, graph_time_us, rotation_count, versions  # noqa: E402

HIDDEN, EXPERTS, TOPK, SCALING = 7168, 384, 8, 2.827
ROUTINGS = {"k26": (1, 1), "v3": (8, 4)}


def torch_router(x, weight, bias, *, top_k, n_group, topk_group, norm_topk_prob, scaling, tree_lens, T):
    """The model's router before ``moe_route`` (``tritree.model.kimi_k2.moe``), unchanged: fp32 logits, sigmoid,
    bias, group limit, ``torch.topk``, gather, normalisation, scaling, padding rows to -1."""
    scores = torch.sigmoid(x.float() @ weight.float().t())
    choice = scores + bias.float()
    if n_group > 1:
        E = weight.shape[0]
        grp = choice.view(-1, n_group, E // n_group).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(grp).scatter_(1, grp.topk(topk_group, dim=-1).indices, 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(E // n_group, 1) == 0, float("-inf"))
    idx = torch.topk(choice, top_k, dim=-1).indices
    w = scores.gather(1, idx)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * scaling
    pad = torch.arange(T, device=x.device)[None, :] >= tree_lens[:, None]
    idx = torch.where(pad.reshape(-1, 1), -1, idx)
    return idx, w


def parse_config(text: str) -> RouterConfig:
    v = [int(a) for a in text.split(",")]
    if len(v) not in (5, 6, 7):
        raise ValueError(f"--configs: 5 to 7 integers per config (BT,BE,BK,W,S[,SEL,PPS]), got {text!r}")
    return RouterConfig(*v)


def floor_bytes(N: int, H: int = HIDDEN, E: int = EXPERTS, top_k: int = TOPK) -> int:
    """The fewest bytes of one call: the bf16 weight and x read once, ids and weights written."""
    return E * H * 2 + N * H * 2 + N * top_k * 8


def check(fn, x, weight64, bias, opts) -> tuple[float, int]:
    """``(max weight error, rows picking differently within a float64 near-tie)`` against the float64 reference;
    raises if a row picks differently without a tie."""
    idx, w = fn()
    idx, w = idx.long().cpu(), w.float().cpu()
    ref_i, ref_w = moe_route_reference(x.cpu().double(), weight64, bias.cpu(), **opts)
    choice = torch.sigmoid(x.cpu().double() @ weight64.t()) + bias.cpu().double()
    ties = 0
    for r in torch.nonzero((idx != ref_i.long()).any(1)).flatten().tolist():
        if not torch.allclose(choice[r, idx[r]], choice[r, ref_i[r].long()], rtol=0, atol=1e-5):
            raise AssertionError(f"row {r} picks {idx[r].tolist()}, the reference {ref_i[r].tolist()}")
        ties += 1
    same = (idx == ref_i.long()).all(1)
    err = float((w[same].double() - ref_w[same].double()).abs().max()) if bool(same.any()) else 0.0
    return err, ties


def host_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def format_table(rows: list[dict]) -> str:
    """The summary table (one line a row; rows without ``graph_us`` print why they were skipped)."""
    head = (f"{'routing':7} {'N':>4} {'variant':7} {'plan':22} {'graph':>7} {'eager':>7} {'host':>7} {'floor':>6} "
            f"{'GB/s':>6} {'%copy':>6} {'x torch':>7} {'err':>8} {'ties':>4}")
    lines = [head]
    torch_us = {(r["routing"], r["N"]): r["graph_us"] for r in rows if r["variant"] == "torch" and "graph_us" in r}
    for r in rows:
        lead = f"{r['routing']:7} {r['N']:4d} {r['variant']:7} {r.get('plan', '-'):22}"
        if "graph_us" not in r:
            lines.append(f"{lead} skipped: {r.get('skipped', '?')}")
            continue
        base = torch_us.get((r["routing"], r["N"]))
        speed = f"{base / r['graph_us']:6.2f}x" if base else f"{'-':>7}"
        lines.append(f"{lead} {r['graph_us']:7.1f} {r['eager_us']:7.1f} {r['host_us']:7.1f} {r['floor_us']:6.1f} "
                     f"{r['gbps']:6.0f} {r['pct_copy']:5.1f}% {speed} {r['err']:8.1e} {r['ties']:4d}")
    return "\n".join(lines)


def main(argv=None):
    import triton

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 9, 17, 33, 65, 129])
    ap.add_argument("--routing", nargs="+", default=["k26", "v3"], choices=sorted(ROUTINGS))
    ap.add_argument("--variant", nargs="+", default=["kernel", "torch"], choices=["kernel", "torch"])
    ap.add_argument("--configs", default="", help="semicolon-separated RouterConfig (see module) for kernel")
    ap.add_argument("--out", default="router_sweep.jsonl")
    ap.add_argument("--ceilings", default="", help="JSON file of measured ceilings (measured if absent)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    ceil = cached_ceilings(args.ceilings)
    arch, sms = arch_of(dev), num_sms(dev)
    print(f"# {versions()}; arch table {arch}; {sms} SMs; copy {ceil.copy_gbps:.0f} GB/s", flush=True)
    configs = [parse_config(c) for c in args.configs.split(";")] if args.configs else [None]
    g = torch.Generator(device=dev).manual_seed(0)
    n_sets = rotation_count(EXPERTS * HIDDEN * 4, cap=64)  # the fp32 weights of the torch variant past the L2
    weights = [(torch.randn(EXPERTS, HIDDEN, generator=g, device=dev) / HIDDEN**0.5).to(torch.bfloat16)
               for _ in range(n_sets)]
    weights32 = [w.float() for w in weights] if "torch" in args.variant else None
    weight64 = weights[0].cpu().double()
    bias = 0.05 * torch.randn(EXPERTS, generator=g, device=dev)
    rows = []
    t0 = time.time()
    with open(args.out, "a") as f:
        for routing in args.routing:
            n_group, topk_group = ROUTINGS[routing]
            opts = dict(top_k=TOPK, n_group=n_group, topk_group=topk_group, norm_topk_prob=True, scaling=SCALING)
            for N in args.tokens:
                xs = [torch.randn(N, HIDDEN, generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
                lens = torch.full((1,), N, dtype=torch.int32, device=dev)
                nbytes = floor_bytes(N)
                floor_us = nbytes / (ceil.copy_gbps * 1e9) * 1e6
                for variant in args.variant:
                    for cfg in (configs if variant == "kernel" else [None]):
                        r = dict(routing=routing, N=N, variant=variant, arch=arch, floor_us=floor_us, bytes=nbytes)
                        try:
                            if variant == "kernel":
                                plan = plan_moe_route(N, HIDDEN, EXPERTS, torch.bfloat16, torch.bfloat16, TOPK, n_group,
                                                      topk_group, arch, sms, cfg)
                                c = plan.config
                                r["plan"] = (f"{c.block_t}x{c.block_e}x{c.block_k} w{c.num_warps} g{plan.grid[0]}."
                                             f"{plan.grid[1]}.{plan.grid[2]}{' *' if cfg else ''}")
                                r["config"] = str(c)

                                def call(i, plan=plan):
                                    return moe_route(xs[i], weights[i], bias, tree_lens=lens, rows_per_request=N,
                                                     plan=plan, **opts)
                            else:
                                def call(i):
                                    return torch_router(xs[i], weights32[i], bias, tree_lens=lens, T=N, **opts)
                            r["err"], r["ties"] = check(lambda: call(0), xs[0], weight64, bias, opts)
                            r["graph_us"] = graph_time_us([lambda i=i: call(i) for i in range(n_sets)])
                            r["eager_us"] = triton.testing.do_bench(lambda: call(0), return_mode="median") * 1e3
                            r["host_us"] = host_us(lambda: call(0))
                            r["gbps"] = nbytes / (r["graph_us"] * 1e-6) / 1e9
                            r["pct_copy"] = 100 * r["gbps"] / ceil.copy_gbps
                            print(f"{routing:5} N={N:4d} {variant:7} {r.get('plan', '-'):22} graph {r['graph_us']:7.1f} "
                                  f"us eager {r['eager_us']:7.1f} us host {r['host_us']:6.1f} us floor {floor_us:5.1f} us "
                                  f"{r['pct_copy']:5.1f}% err {r['err']:.1e} ties {r['ties']}", flush=True)
                        except Exception as e:  # record and go on: one failing variant must not lose the sweep
                            r["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
                            print(f"{routing:5} N={N:4d} {variant:7} skipped: {r['skipped']}", flush=True)
                        r["ceilings"] = ceil.__dict__
                        rows.append(r)
                        f.write(json.dumps(r) + "\n")
                        f.flush()
    print(f"# sweep done in {time.time() - t0:.0f} s")
    print(format_table(rows))


if __name__ == "__main__":
    main()
