"""Every config compiles ahead of time for its architecture within its shared-memory limit and
without register spills (sm_120: 101,376 B per block), on a machine without that GPU."""

import pytest

from tritree.kernels.aot import audit_in_subprocess


@pytest.mark.parametrize("arch", ["sm_120", "sm_90", "sm_80"])
def test_kernel_configs_compile(arch):
    reports = audit_in_subprocess((arch,))
    assert reports, f"no configs for {arch}"
    bad = [r for r in reports if not r.ok]
    assert not bad, "\n".join(f"{r.arch} {r.config}: shared {r.shared}/{r.shared_limit}, spill {r.spill_bytes}" for r in bad)
    for r in reports:
        assert r.registers > 0  # the resource report was read
    # The one-launch MoE router: every config of its table, bf16 and fp32 inputs, one group and 8 groups.
    from tritree.kernels.moe.router import ROUTER_CONFIGS

    router = [r for r in reports if r.kernel == "_route_kernel"]
    assert len(router) == 4 * len(set(ROUTER_CONFIGS[arch].values())), [r.config for r in router]
    # The MoE block's launches: its norm kernel everywhere, the Gluon expert kernels on sm_90 and sm_120.
    names = {r.kernel for r in reports}
    assert "_block_norm_kernel" in names
    if arch != "sm_80":
        assert {"_gate_up_mma_kernel", "_down_mma_kernel"} <= names
    # The skinny linear: every GPU config of its table, four variants each (bf16 one split, and several with and
    # without the norm, bias and residual; fp16 with them).
    from tritree.kernels.linear import LINEAR_CONFIGS

    lin = [r for r in reports if r.kernel == "_linear_kernel"]
    lin_configs = {c for key, t in LINEAR_CONFIGS.items() if key.split(":")[0] == arch for c in t.values()}
    assert len(lin) == 4 * len(lin_configs), [r.config for r in lin]
    # The absorbed MLA kernel: every config of its table, as mla_query_ and as mla_output.
    from tritree.kernels.mla_decode import MLA_CONFIGS

    mla = [r for r in reports if r.kernel == "_mla_kernel"]
    assert len(mla) == 2 * len(set(MLA_CONFIGS[arch].values())), [r.config for r in mla]
    # The draft's per-head norm and rope: every config, three variants.
    from tritree.kernels.head_rope import HEAD_ROPE_CONFIGS

    assert len([r for r in reports if r.kernel == "_head_rope_kernel"]) == 3 * len(set(HEAD_ROPE_CONFIGS[arch].values()))
    # The verify kernel with fp32 queries: the fp32 table's tiles at 64-key and one-key pages, one split and
    # several, over fp32 pools and (where fp8 pools are compiled) fp8 ones.
    from tritree.kernels.aot import FP8_KV_ARCHS
    from tritree.kernels.verify.policy import VERIFY_MLA_CONFIGS

    fp32 = [r.config for r in reports if r.kernel == "_verify_mla_kernel" and " q fp32" in r.config]
    fp8_table = VERIFY_MLA_CONFIGS.get(f"{arch}:fp32:fp8", VERIFY_MLA_CONFIGS[f"{arch}:fp32"])
    assert len([c for c in fp32 if " kv " not in c]) == 4 * len(set(VERIFY_MLA_CONFIGS[f"{arch}:fp32"].values())), fp32
    assert len([c for c in fp32 if " kv fp8e4nv" in c]) == (4 * len(set(fp8_table.values()))
                                                            if arch in FP8_KV_ARCHS else 0), fp32
    # The vocabulary-shard lookup: every config, three variants.
    from tritree.kernels.embed import EMBED_CONFIGS

    assert len([r for r in reports if r.kernel == "_embed_kernel"]) == 3 * len(set(EMBED_CONFIGS[arch].values()))
    # The routing align: EP8 and TP8 expert counts, blocks of 8 and 16 rows.
    assert len([r for r in reports if r.kernel == "_align_kernel"]) == 3


def test_gluon_verify_kernels_compile_for_sm90():
    """The Gluon (Hopper) verify kernels' shipped launches (plain and warp-specialised; one split and several;
    TMA tiles at P = 64, 128 and row gathers at P = 1, 16; narrow, full and part-filled last row blocks) fit
    sm_90's shared memory, and split-PDL builds wait before their first global load
    (``python -m tritree.kernels.aot --gluon`` exits non-zero otherwise)."""
    import os
    import subprocess
    import sys

    from tritree.kernels.verify import gluon_launch as L

    if not L.GLUON_AVAILABLE:
        pytest.skip(f"this triton has no Gluon: {L._IMPORT_ERROR!r}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tritree.kernels.aot", "--gluon"], capture_output=True, text=True,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("gluon sm_90") == 44, res.stdout
    assert res.stdout.count("wait before first load True") == 24, res.stdout


def test_linear_norm_keeps_the_operand_pipeline_whole_on_sm90():
    """With the row norm, the skinny linear's x tile is pipelined in as many shared-memory buffers as the weight tile
    on sm_90 (its only consumer is the asynchronous wgmma): read by registers too, Triton gave it one buffer fewer
    and the next tiles' copies raced the wgmma still reading it (wrong outputs at some K splits on an H100)."""
    import os
    import subprocess
    import sys

    code = r"""
import re
import torch
from tritree.kernels.aot import compile_kernel
from tritree.kernels.linear import LINEAR_CONFIGS, _constexprs, _linear_kernel, plan_linear
cfg = LINEAR_CONFIGS["sm_90"][32]
plan = plan_linear(1, 2112, 7168, torch.bfloat16, "sm_90", 132)
sig = {n: "*bf16" for n in ("X", "W", "Bias", "Res", "Out")}
sig.update(Part="*fp32", SumSq="*fp32", Count="*i32", NormW="*bf16")
sig.update({n: "i32" for n in ("M", "N", "K", "stride_x", "stride_w", "stride_r", "stride_o", "k_split")}, eps="fp32")
consts = _constexprs(plan, 7168, torch.bfloat16, True, False, False)
k = compile_kernel(_linear_kernel, sig, consts, "sm_90", cfg.num_warps, cfg.num_stages,
                   ("X", "W", "Out", "Part", "SumSq", "K", "stride_x", "stride_w", "stride_o", "k_split"))
print(re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x(\d+)x(\d+)xbf16", k.asm["ttgir"]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    allocs = eval(res.stdout.strip().splitlines()[-1])  # [(stages, rows, cols)] of x's and the weight's buffers
    x = [a for a in allocs if a[1] == "16"]
    w = [a for a in allocs if a[1] == "64"]
    from tritree.kernels.linear import LINEAR_CONFIGS

    stages = str(LINEAR_CONFIGS["sm_90"][32].num_stages)
    assert x and w and x[0][0] == w[0][0] == stages, allocs  # both pipelined in every stage
