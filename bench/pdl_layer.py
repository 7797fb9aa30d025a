"""The KV write and the verify attention of one layer, as a model's layer runs them (``kv_write_`` of the tree's
latent rows, then ``verify_mla``), graph-timed back to back over rotated input sets. On Hopper the KV write
signals its dependents at its start and the warp-specialised verify split kernel is launched by programmatic
dependent launch where its launch rule says so (``tritree.kernels.verify.gluon_launch``), so it is placed while the write runs.

    python -m bench.pdl_layer --ctx 46000 --T 65 --H 8 --rounds 3
"""
from __future__ import annotations

import argparse

import torch

from tritree.kernels import kv_write_, verify_mla
from tritree.roofline import graph_time_us, rotation_count
from tritree.testing import random_verify_inputs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=46000)
    ap.add_argument("--T", type=int, default=65)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    T, H, L = args.T, args.H, args.ctx
    fns = []
    for seed in range(rotation_count((L + T) * 576 * 2)):
        c = random_verify_inputs(1, T, H, 64, [L], [T], ("wide",), torch.bfloat16, seed=seed, fragmented=False,
                                 device="cuda")
        new = torch.randn(1, T, 576, device="cuda").to(torch.bfloat16)
        fns.append(lambda c=c, new=new: (
            kv_write_(c["kv"], c["page_table"], c["kv_lens"], new, c["tree_lens"]),
            verify_mla(c["q"], c["kv"], c["page_table"], c["kv_lens"], c["tree_mask"], sm_scale=0.1,
                       tree_lens=c["tree_lens"])))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; T={T} H={H} L={L}: kv_write_ + verify_mla, "
          f"graph-timed, us a layer", flush=True)
    for r in range(args.rounds):
        print(f"round {r + 1} {graph_time_us(fns):7.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
