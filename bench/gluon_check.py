"""Gluon (Hopper) verify kernels vs the Triton ``verify_mla`` on an H200: accuracy and CUDA-graph time.

    PYTHONPATH=. python bench/gluon_check.py [--splits N] [--shapes 8x8,16x64] [--page-size 1] [--partials bf16]
        [--ws] [--probes] [--variants gluon+seesaw,gluon+wscs]

One line per (T, H) at L = 46000, B = 1, P = 64 (``--page-size``: P = 1 pools are fragmented, pages
randomly permuted as ``verify_sweep.build_sets`` makes them; P < 64 takes the Gluon cp.async gather
path, which has no overlapped schedule, so the TMA-only variants are skipped there): relative error of
each Gluon variant against ``verify_mla`` ("triton" below: whatever the table runs), then us and
TFLOP/s (FLOPs = 2 T H (L + T) (576 + 512)) of it and the Gluon variants (plain, FA3 overlap, seesaw
tile pairs; ``--ws``: the warp-specialised seesaw by tiles and by column halves; ``--probes``: its pair
loop with parts left out, wrong results), then
each variant's compile (registers, spills, shared bytes). A variant that fails prints its exception;
the rest go on.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from bench.verify_sweep import SM_SCALE, build_sets  # noqa: E402
from tritree import verify_mla  # noqa: E402
from tritree.kernels import _verify_gluon as VG  # noqa: E402
from tritree.kernels import _verify_gluon_ws as VGWS  # noqa: E402
from tritree.kernels._splitkv import choose_num_splits, combine_splits, split_destinations  # noqa: E402
from tritree.kernels.configs import num_sms  # noqa: E402
from tritree.roofline import graph_time_us, rotation_count  # noqa: E402

L, B, P = 46_000, 1, 64
SHAPES = [(8, 8), (16, 8), (64, 8), (16, 64)]


VARIANTS = {"gluon": dict(overlap=False, seesaw=False), "gluon+ovl": dict(overlap=True, seesaw=False),
            "gluon+seesaw": dict(overlap=False, seesaw=True)}
COMPILES = {}
# --probes: the ws kernel with parts of its pair loop left out (a time decomposition; wrong results):
# copies alone, scores + P V without the softmax, scores alone.
PROBES = {"gluon+ws-load": 1, "gluon+ws-mma": 2, "gluon+ws-qk": 3}


def gluon_call(s, out, lse, num_splits, variant, scratch):
    q = s["q"]
    dst_o, dst_l, o_strides, l_strides = scratch
    args = (q, s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], s["tree_lens"], dst_o, dst_l, o_strides,
            l_strides, SM_SCALE, num_splits)
    if variant.startswith("gluon+ws"):
        k = VGWS.launch_verify_gluon_ws(*args, colsplit=variant in ("gluon+wscs", "gluon+wscs-nopf"),
                                        probe=PROBES.get(variant, 0),
                                        l2_prefetch=False if variant == "gluon+wscs-nopf" else None)
    else:
        k = VG.launch_verify_gluon(*args, **VARIANTS[variant])
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse)
    return k


def describe(k):
    if k is None:
        return "?"
    try:
        k._init_handles()
    except Exception:  # noqa: BLE001
        pass
    regs = getattr(k, "n_regs", "?")
    spills = getattr(k, "n_spills", "?")
    shared = getattr(getattr(k, "metadata", None), "shared", "?")
    return f"regs {regs} spills {spills} B shared {shared} B"


def run_shape(T, H, splits_arg, P=P, partials="fp32"):
    flops = 2 * B * T * H * (L + T) * (576 + 512)
    n_sets = rotation_count(B * (L + T) * 576 * 2)
    sets = build_sets(B, T, H, L, P, n_sets, torch.bfloat16, "cuda")
    for s in sets:
        s["tree_lens"] = torch.full((B,), T, dtype=torch.int32, device="cuda")
    num_splits = splits_arg or choose_num_splits(batch=B, row_blocks=triton.cdiv(T * H, VG.BLOCK_M),
                                                 max_keys=sets[0]["page_table"].shape[1] * P, block_n=VG.BLOCK_N,
                                                 sms=num_sms(torch.device("cuda")), programs_per_sm=1,
                                                 whole_waves=True)
    outs = [(torch.empty(B, T, H, 512, device="cuda", dtype=torch.bfloat16),
             torch.empty(B, T, H, device="cuda", dtype=torch.float32)) for _ in sets]
    res = {}
    # Triton reference (its own default config and split count).
    tri_fns = [lambda s=s, o=o: verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"],
                                           sm_scale=SM_SCALE, out=o[0], lse=o[1]) for s, o in zip(sets, outs)]
    try:
        tri_fns[0]()
        ref = outs[0][0].float().clone()
        res["triton"] = (graph_time_us(tri_fns), 0.0)
    except Exception as e:  # noqa: BLE001
        print(f"  triton failed: {type(e).__name__}: {e}", flush=True)
        ref = None
    variants = [v for v in VARIANTS if P % VG.BLOCK_N == 0 or not VARIANTS[v]["overlap"]]
    for name in variants:
        try:
            scratches = [split_destinations(o[0], o[1], num_splits, T * H) for o in outs]
            if partials != "fp32" and num_splits > 1:  # narrower o partials (same strides; lse stays fp32)
                scratches = [(sc[0].to(getattr(torch, partials)), *sc[1:]) for sc in scratches]
            fns = [lambda s=s, o=o, sc=sc, name=name: gluon_call(s, o[0], o[1], num_splits, name, sc)
                   for s, o, sc in zip(sets, outs, scratches)]
            outs[0][0].fill_(float("nan"))
            COMPILES[(name, num_splits > 1)] = fns[0]()
            torch.cuda.synchronize()
            got = outs[0][0].float()
            err = float((got - ref).norm() / ref.norm()) if ref is not None else float("nan")
            if torch.isnan(got).any():
                err = float("nan")
            res[name] = (graph_time_us(fns), err)
        except Exception as e:  # noqa: BLE001
            print(f"  {name} failed: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
            torch.cuda.synchronize()
    parts = []
    for name in ("triton", *variants):
        if name in res:
            us, err = res[name]
            tf = flops / (us * 1e-6) / 1e12
            e = "" if name == "triton" else f" err {err:.1e}"
            parts.append(f"{name} {us:8.1f} us {tf:6.1f} TF/s{e}")
        else:
            parts.append(f"{name} FAILED")
    print(f"L={L} B={B} P={P} T={T:3d} H={H:2d} gluon_splits={num_splits:3d} partials={partials} | "
          + " | ".join(parts), flush=True)
    del sets
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=0, help="Gluon split count (default: one program per SM)")
    ap.add_argument("--shapes", default="", help="comma-separated TxH, e.g. 8x8,16x64")
    ap.add_argument("--page-size", type=int, default=P,
                    help="pool page size (default 64; 1 = token-granular, randomly permuted pages)")
    ap.add_argument("--ws", action="store_true",
                    help="also the warp-specialised seesaw (_verify_gluon_ws): gluon+wscs, O += P V by column halves "
                         "(what verify_mla runs above 64 rows with P >= 64, and above 16 rows with P < 64, where its "
                         "producer gathers rows), gluon+ws, by tiles (TMA pools only)")
    ap.add_argument("--variants", default="", help="comma-separated Gluon variants to run (default: all)")
    ap.add_argument("--probes", action="store_true",
                    help="also the ws kernel's time decomposition (gluon+ws-load / -mma / -qk; wrong results)")
    ap.add_argument("--partials", default="fp32", choices=["fp32", "bfloat16", "float16"],
                    help="dtype of the Gluon variants' split partials (o; lse stays fp32)")
    args = ap.parse_args()
    if args.ws:
        # Dispatched by name in gluon_call; "overlap" marks it TMA-only (skipped for gathered pools).
        VARIANTS["gluon+ws"] = dict(overlap=True, seesaw=True)
        VARIANTS["gluon+wscs"] = dict(overlap=False, seesaw=True)  # also P < 64: the producer gathers rows
        VARIANTS["gluon+wscs-nopf"] = dict(overlap=True, seesaw=True)  # TMA, without the L2 prefetch
    if args.probes:
        for name in PROBES:
            VARIANTS[name] = dict(overlap=True, seesaw=True)
    if args.variants:
        for name in [v for v in VARIANTS if v not in args.variants.split(",")]:
            del VARIANTS[name]
    if not VG.GLUON_AVAILABLE:
        sys.exit(f"Gluon unavailable: {VG._IMPORT_ERROR!r}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    print(f"# torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}", flush=True)
    for T, H in shapes:
        try:
            run_shape(T, H, args.splits, args.page_size, args.partials)
        except Exception as e:  # noqa: BLE001
            print(f"T={T} H={H} failed: {type(e).__name__}: {e}", flush=True)
            torch.cuda.empty_cache()
    for (name, multi), k in COMPILES.items():
        print(f"# compile {name:13s} P={args.page_size} splits={'N' if multi else '1'}: {describe(k)}", flush=True)
    print(f"# 3-D TMA descriptor in use: {VG.USE_TMA3D}", flush=True)


if __name__ == "__main__":
    main()
