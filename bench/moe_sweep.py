"""Routed-expert layer at Kimi K2.6's per-rank shapes: INT4 (W4A16) against its bandwidth floor and peers.

    PYTHONPATH=. python bench/moe_sweep.py [--shape ep8 tp8] [--tokens 1 9 17 33 65 129]
        [--routing uniform skewed] [--variant int4 int4-triton bf16 sglang walk] [--configs "..."]

Shapes (H = 7168, top-8 of 384 experts): ``ep8``, one expert-parallel rank's 48 experts of I = 2048 (ids of
the other ranks' experts are skipped); ``tp8``, one tensor-parallel rank's 384 experts of I = 2048 / 8 = 256.

The whole routed layer (align + gate_up + down, epilogues included) is graph-timed over routing sets rotated
so that the experts they touch exceed the L2 (``tritree.roofline.graph_time_us``). Bytes: each touched
local expert's INT4 nibbles and scales once (``1.6875 I H`` bytes) plus x and out; GB/s and % of the
measured copy bandwidth on those bytes. Routing: ``uniform`` (top-8 distinct experts of 384 per token) or
``skewed`` (every token on the same 8 experts, a different 8 per rotated set).

Variants: ``int4`` (``tritree.routed_experts_int4`` on the experts in the layout the GPU's kernels stream,
``kernel_layout``: on sm_90 / sm_120 the Gluon ``mma.sync`` kernels over the repacked ``"mma"`` layout),
``int4-triton`` (the Triton kernels over the checkpoint layout: what other GPUs run), ``bf16``
(``tritree.kernels.moe.routed_experts`` over the same weights dequantised: the dense path), ``sglang`` (SGLang's
``fused_moe_kernel_gptq_awq`` from its own files, ``bench/peer_sglang_moe.py``). Each variant is checked against
the float32 reference of the dequantised weights at every shape before it is timed. Under ``DISABLE_MMA_V3=1
TRITREE_ARCH=sm_120`` the ``int4-triton`` variant runs the sm_120 configs on the H200 (mma.sync emulation);
the ``int4`` variant's kernels are ``mma.sync`` on every GPU.

``walk`` (``bench/int4_walk.py``) reads the same touched experts' weights with the int4 plan's tiles and does
no arithmetic: the access pattern's own ceiling (not checked against the reference; it computes nothing).

The whole MoE block (post-attention norm to residual; ``--variant block block-ops``): ``block`` is
``tritree.moe_block`` (five launches on sm_90 / sm_120), ``block-ops`` the same semantics as the model composed
it from ops before the block existed (``F.rms_norm``, ``moe_route``, ``routed_experts_int4``, the shared expert
as two cuBLAS GEMMs with SiLU-and-mul between, the residual add). Here the router picks the experts: random
router weights give near-uniform picks; ``skewed`` adds a bias of 1 to 8 local experts (another 8 per rotated
set), so every token picks them. Floor bytes: the touched experts, the bf16 router weight (384 x 7168), the
rank's bf16 shared expert (I = 2048 / 8: the shared expert is tensor-parallel in both shapes) and the residual
read and written; K2.6's routing (one group, top-8, ``routed_scaling_factor`` 2.827). The error is against the
float32 reference of the block (``moe_block_reference``); a row whose routing sits within rounding of a tie
can pick differently and adds to it.

``--configs "BM,gBN,gBK,gW,gS,dBN,dBK,dW,dS,swap;..."`` times these ``Int4MoeConfig`` instead of the table's
(for ``int4-triton`` and ``walk``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tritree.kernels.configs import arch_of, num_sms  # noqa: E402
from tritree.kernels.moe import routed_experts  # noqa: E402
from tritree.kernels.moe.int4 import GROUP, Int4Experts, kernel_layout, routed_experts_int4  # noqa: E402
from tritree.kernels.moe.int4_mma import plan_int4_mma  # noqa: E402
from tritree.kernels.moe.int4_triton import Int4MoeConfig, plan_int4_moe  # noqa: E402
from tritree.roofline import L2_ROTATE_BYTES, cached_ceilings, graph_time_us, versions  # noqa: E402

HIDDEN, TOPK, ALL_EXPERTS = 7168, 8, 384
SHAPES = {"ep8": (48, 2048), "tp8": (384, 256)}  # local experts, intermediate per rank
SHARED_I = 2048 // 8  # the shared expert's intermediate on one rank of eight
SCALING, EPS = 2.827, 1e-5
BLOCK_VARIANTS = ("block", "block-ops")


def expert_bytes(H: int, I: int) -> int:
    """INT4 bytes of one expert: gate + up + down nibbles (0.5 B a weight) and bf16 scales (one per 32)."""
    return 3 * H * I // 2 + 3 * H * I // GROUP * 2


def random_experts(E: int, H: int, I: int, device, seed: int = 0) -> Int4Experts:
    g = torch.Generator(device=device).manual_seed(seed)

    def packed(*shape):
        return torch.randint(-2**31, 2**31 - 1, shape, generator=g, device=device, dtype=torch.int32)

    def scale(*shape):  # |W| ~ 8 * 2e-3: the magnitude of real expert weights
        return (torch.rand(shape, generator=g, device=device) * 2e-3 + 1e-3).to(torch.bfloat16)

    return Int4Experts(packed(E, 2 * I, H // 8), scale(E, 2 * I, H // GROUP), packed(E, H, I // 8),
                       scale(E, H, I // GROUP))


def routing_sets(N: int, E: int, routing: str, n_sets: int, device, seed: int = 1):
    """``n_sets`` of ``(topk_idx [N, 8] int32 local ids, topk_w [N, 8] fp32)``: global ids of 384 experts
    minus this rank's first (0), so ids >= E are another rank's."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sets = []
    for s in range(n_sets):
        if routing == "uniform":
            idx = torch.rand(N, ALL_EXPERTS, generator=g).argsort(1)[:, :TOPK]
        else:  # every token on the same 8 local experts, another 8 per set (no set repeats the last's)
            first = (s * TOPK) % max(TOPK, E - E % TOPK)
            idx = (first + torch.arange(TOPK)).remainder(E).expand(N, TOPK)
        w = torch.rand(N, TOPK, generator=g).softmax(-1)
        sets.append((idx.to(torch.int32).contiguous().to(device), w.to(device)))
    return sets


def rotated_sets(N: int, E: int, routing: str, per_expert: int, device, cap: int = 64):
    """Routing sets enough that the experts they touch, together, exceed ``L2_ROTATE_BYTES`` (at most
    ``cap``, at least 2)."""
    n = 2
    while True:
        sets = routing_sets(N, E, routing, n, device)
        total = sum(touched(i, E) for i, _ in sets) * per_expert
        if total >= L2_ROTATE_BYTES or n >= cap:
            return sets
        n = min(cap, max(n + 1, math.ceil(n * L2_ROTATE_BYTES / max(total, 1))))


def touched(idx: torch.Tensor, E: int) -> int:
    ids = idx[(idx >= 0) & (idx < E)]
    return int(torch.unique(ids).numel())


def parse_config(text: str) -> Int4MoeConfig:
    v = [int(a) for a in text.split(",")]
    if len(v) != 10:
        raise ValueError(f"--configs: 10 integers per config (BM,gBN,gBK,gW,gS,dBN,dBK,dW,dS,swap), got {text!r}")
    return Int4MoeConfig(v[0], tuple(v[1:5]), tuple(v[5:9]), bool(v[9]))


def make_variant(variant: str, experts: Int4Experts, dense, plan, kernel_experts: Int4Experts | None = None):
    if variant == "int4":
        ke = kernel_experts or experts
        return lambda x, idx, w, out: routed_experts_int4(x, idx, w, ke, out=out, global_experts=ALL_EXPERTS)
    if variant == "int4-triton":
        return lambda x, idx, w, out: routed_experts_int4(x, idx, w, experts, out=out, plan=plan)
    if variant == "walk":
        from bench.int4_walk import make_walk
        return make_walk(experts, plan)
    if variant == "bf16":
        wg, wu, wd = dense
        return lambda x, idx, w, out: out.copy_(routed_experts(x, idx, w, wg, wu, wd))
    if variant == "sglang":
        from bench.peer_sglang_moe import make_sglang_int4_moe
        run = make_sglang_int4_moe(experts, TOPK, torch.bfloat16)
        return lambda x, idx, w, out: out.copy_(run(x, idx, w))
    raise ValueError(f"unknown variant {variant!r}")


def check(fn, experts_f32, x, idx, w) -> float:
    """Relative error of ``fn`` against the float32 reference (dequantised weights); poisoned output."""
    out = torch.full_like(x, float("nan"))
    fn(x, idx, w, out)
    wg, wu, wd = experts_f32
    ref = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(idx[(idx >= 0) & (idx < wg.shape[0])]).tolist():
        tok, slot = torch.nonzero(idx == e, as_tuple=True)
        xe = x[tok].float()
        h = torch.nn.functional.silu(xe @ wg[e].t()) * (xe @ wu[e].t())
        ref.index_add_(0, tok, (h @ wd[e].t()) * w[tok, slot, None])
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def block_operands(device, seed: int = 2) -> dict:
    """The block's dense operands at K2.6's shapes (bf16): norm weight, router weight, shared gate|up and down."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

    return dict(norm_weight=rnd(HIDDEN, scale=0.1) + 1, router_weight=rnd(ALL_EXPERTS, HIDDEN, scale=HIDDEN**-0.5),
                shared_gate_up=rnd(2 * SHARED_I, HIDDEN, scale=HIDDEN**-0.5),
                shared_down=rnd(HIDDEN, SHARED_I, scale=SHARED_I**-0.5))


def block_biases(E: int, routing: str, n_sets: int, device) -> list:
    """Per rotated set the router's correction bias: zeros (``uniform``), or 1 on 8 local experts, another 8 per
    set (``skewed``)."""
    out = []
    for s in range(n_sets):
        b = torch.zeros(ALL_EXPERTS, device=device)
        if routing == "skewed":
            first = (s * TOPK) % max(TOPK, E - E % TOPK)
            b[(first + torch.arange(TOPK, device=device)).remainder(E)] = 1.0
        out.append(b)
    return out


def make_block_variant(variant: str, ops: dict, experts: Int4Experts):
    from tritree.kernels import moe_block, moe_route

    nw, rw, sgu, sd = ops["norm_weight"], ops["router_weight"], ops["shared_gate_up"], ops["shared_down"]
    if variant == "block":
        return lambda x, bias, out: moe_block(x, nw, rw, bias, experts, sgu, sd, eps=EPS, top_k=TOPK,
                                              scaling=SCALING, out=out)

    def composed(x, bias, out):  # the model's MoE layer before the block: ~15 launches
        xn = torch.nn.functional.rms_norm(x, (HIDDEN,), nw, EPS)
        idx, w = moe_route(xn, rw, bias, top_k=TOPK, scaling=SCALING)
        y = routed_experts_int4(xn, idx, w, experts, global_experts=ALL_EXPERTS)
        gu = torch.nn.functional.linear(xn, sgu)
        y = y + torch.nn.functional.linear(torch.nn.functional.silu(gu[:, :SHARED_I]) * gu[:, SHARED_I:], sd)
        torch.add(x, y, out=out)
    return composed


def block_rows(shape, routing, N, experts, kernel_experts, ops, per_expert, ceil, variants, dev):
    """The block variants at one (shape, routing, N): rows of the sweep's table."""
    from tritree.kernels import moe_block_reference, moe_route_reference

    E = experts.num_experts
    g = torch.Generator().manual_seed(N * 1009 + E)  # the same router inputs (so the same experts) in every run

    def rows():
        return torch.randn(N, HIDDEN, generator=g).to(device=dev, dtype=torch.bfloat16)

    probe = [rows() for _ in range(2)]
    biases = block_biases(E, routing, 2, dev)

    def picks(x, bias):
        xn = torch.nn.functional.rms_norm(x, (HIDDEN,), ops["norm_weight"], EPS)
        return moe_route_reference(xn, ops["router_weight"], bias, top_k=TOPK, dtype=torch.float32)[0]

    per_set = sum(touched(picks(x, b), E) for x, b in zip(probe, biases)) / 2 * per_expert
    n_sets = max(2, min(64, math.ceil(L2_ROTATE_BYTES / max(per_set, 1))))
    xs = [rows() for _ in range(n_sets)]
    biases = block_biases(E, routing, n_sets, dev)
    used = sum(touched(picks(x, b), E) for x, b in zip(xs, biases)) / n_sets
    dense = ALL_EXPERTS * HIDDEN * 2 + 3 * SHARED_I * HIDDEN * 2
    nbytes = used * per_expert + dense + 2 * N * HIDDEN * 2
    floor_us = nbytes / (ceil.copy_gbps * 1e9) * 1e6
    outs = [torch.empty_like(x) for x in xs]
    rows = []
    for variant in variants:
        r = dict(shape=shape, E=E, I=experts.intermediate, routing=routing, N=N, used=used, variant=variant,
                 plan="-", floor_us=floor_us, bytes=nbytes)
        try:
            fn = make_block_variant(variant, ops, kernel_experts)
            out = torch.full_like(xs[0], float("nan"))
            fn(xs[0], biases[0], out)
            ref = moe_block_reference(xs[0], ops["norm_weight"], ops["router_weight"], biases[0], experts,
                                      ops["shared_gate_up"], ops["shared_down"], eps=EPS, top_k=TOPK, scaling=SCALING,
                                      dtype=torch.float32)
            r["rel_err"] = float((out.float() - ref).norm() / ref.norm()) if torch.isfinite(out).all() else float("inf")
            fns = [lambda x=x, b=b, o=o: fn(x, b, o) for x, b, o in zip(xs, biases, outs)]
            us = graph_time_us(fns)
            r.update(us=us, gbps=nbytes / (us * 1e-6) / 1e9, pct_copy=100 * nbytes / (us * 1e-6) / (ceil.copy_gbps * 1e9),
                     x_floor=us / floor_us)
            print(f"{shape:5} {routing:7} {N:4d} {used:5.1f} {variant:9} {'x floor ' + format(us / floor_us, '.2f'):25} "
                  f"{r['rel_err']:8.1e} {us:8.1f} {floor_us:7.1f} {r['gbps']:6.0f} {r['pct_copy']:5.1f}%", flush=True)
        except Exception as e:  # record and go on
            r["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{shape:5} {routing:7} {N:4d} {used:5.1f} {variant:9} skipped: {r['skipped']}", flush=True)
        rows.append(r)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs="+", default=["ep8", "tp8"], choices=sorted(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 9, 17, 33, 65, 129])
    ap.add_argument("--routing", nargs="+", default=["uniform", "skewed"], choices=["uniform", "skewed"])
    ap.add_argument("--variant", nargs="+", default=["int4", "bf16"], choices=["int4", "int4-triton", "walk", "bf16", "sglang", *BLOCK_VARIANTS])
    ap.add_argument("--configs", default="", help="semicolon-separated Int4MoeConfig (see module) for int4-triton and walk")
    ap.add_argument("--out", default="moe_sweep.jsonl")
    ap.add_argument("--ceilings", default="", help="JSON file of measured ceilings (measured if absent)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    ceil = cached_ceilings(args.ceilings)
    arch = arch_of(dev)
    print(f"# {versions()}; arch table {arch}; copy {ceil.copy_gbps:.0f} GB/s", flush=True)
    configs = [parse_config(c) for c in args.configs.split(";")] if args.configs else [None]
    print(f"{'shape':5} {'route':7} {'N':>4} {'used':>5} {'variant':8} {'config':26} {'err':>8} {'us':>8} "
          f"{'floor':>7} {'GB/s':>6} {'%copy':>6}", flush=True)
    t0 = time.time()
    with open(args.out, "a") as f:
        for shape in args.shape:
            E, I = SHAPES[shape]
            experts = random_experts(E, HIDDEN, I, dev)
            kernel_experts = experts.to_layout(kernel_layout(dev, HIDDEN, I))
            f32 = experts.dequantize(torch.float32)
            dense = tuple(t.to(torch.bfloat16) for t in f32) if "bf16" in args.variant else None
            per_expert = expert_bytes(HIDDEN, I)
            block_variants = [v for v in args.variant if v in BLOCK_VARIANTS]
            ops = block_operands(dev) if block_variants else None
            for routing in args.routing:
                for N in args.tokens:
                    for r in (block_rows(shape, routing, N, experts, kernel_experts, ops, per_expert, ceil,
                                         block_variants, dev) if block_variants else []):
                        r.update(arch=arch, ceilings=ceil.__dict__)
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                    if len(block_variants) == len(args.variant):
                        continue
                    sets = rotated_sets(N, E, routing, per_expert, dev)
                    n_sets = len(sets)
                    used = sum(touched(i, E) for i, _ in sets) / n_sets
                    nbytes = used * per_expert + 2 * N * HIDDEN * 2
                    floor_us = nbytes / (ceil.copy_gbps * 1e9) * 1e6
                    xs = [torch.randn(N, HIDDEN, device=dev, dtype=torch.bfloat16) for _ in sets]
                    outs = [torch.empty_like(x) for x in xs]
                    for variant in [v for v in args.variant if v not in BLOCK_VARIANTS]:
                        tiled = variant in ("int4-triton", "walk")
                        for cfg in (configs if tiled else [None]):
                            plan = (plan_int4_moe(N, TOPK, E, HIDDEN, I, arch, num_sms(dev), cfg, ALL_EXPERTS)
                                    if tiled else None)
                            label = (f"BM{plan.block_m} sk{plan.gate_up_split}/{plan.down_split}"
                                     f"{' swap' if plan.config.swap_ab else ''}"
                                     f"{' *' if cfg is not None else ''}") if plan else "-"
                            if variant == "int4" and kernel_experts.layout == "mma":
                                mp = plan_int4_mma(N, TOPK, E, HIDDEN, I, num_sms(dev), ALL_EXPERTS)
                                label = f"mma BM{mp.block_m} p{mp.gate_up_programs} sk{mp.down_split}"
                            r = dict(shape=shape, E=E, I=I, routing=routing, N=N, used=used, variant=variant,
                                     arch=arch, config=str(plan.config) if plan else None, plan=label,
                                     floor_us=floor_us, bytes=nbytes)
                            try:
                                fn = make_variant(variant, experts, dense, plan, kernel_experts)
                                r["rel_err"] = float("nan") if variant == "walk" else check(fn, f32, xs[0], *sets[0])
                                fns = [lambda x=x, s=s, o=o: fn(x, s[0], s[1], o) for x, s, o in zip(xs, sets, outs)]
                                us = graph_time_us(fns)
                                r.update(us=us, gbps=nbytes / (us * 1e-6) / 1e9,
                                         pct_copy=100 * nbytes / (us * 1e-6) / (ceil.copy_gbps * 1e9))
                                print(f"{shape:5} {routing:7} {N:4d} {used:5.1f} {variant:8} {label:26} "
                                      f"{r['rel_err']:8.1e} {us:8.1f} {floor_us:7.1f} {r['gbps']:6.0f} "
                                      f"{r['pct_copy']:5.1f}%", flush=True)
                            except Exception as e:  # record and go on: one failing variant must not lose the sweep
                                r["skipped"] = f"{type(e).__name__}: {str(e)[:300]}"
                                print(f"{shape:5} {routing:7} {N:4d} {used:5.1f} {variant:8} {label:26} "
                                      f"skipped: {r['skipped']}", flush=True)
                                torch.cuda.empty_cache()
                            r["ceilings"] = ceil.__dict__
                            f.write(json.dumps(r) + "\n")
                            f.flush()
            del experts, kernel_experts, f32, dense
            torch.cuda.empty_cache()
    print(f"# sweep done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
