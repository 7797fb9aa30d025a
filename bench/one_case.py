"""Runs verify_mla on one shape a few times (for ncu / quick checks).

    python -m bench.one_case B T H L P [CONFIG]

CONFIG: ``verify_sweep.parse_config``'s ``BM,BN,warps,stages[,programs_per_sm[,tma[,split_scores]]][,KERNEL]``
(default: the table's).
"""
import sys

import torch

from tritree import verify_mla

from .verify_sweep import SM_SCALE, build_sets, parse_config

B, T, H, L, P = map(int, sys.argv[1:6])
cfg = parse_config(sys.argv[6]) if len(sys.argv) > 6 else None
s = build_sets(B, T, H, L, P, 1, torch.bfloat16, "cuda")[0]
for _ in range(3):
    out = verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], sm_scale=SM_SCALE, config=cfg)
torch.cuda.synchronize()
print("ok", out.shape)
