"""Ahead-of-time compilation of kernels for a GPU architecture this machine may not have.

``python -m tritree.kernels.aot`` compiles every config of every table for its architecture and
prints shared memory, registers and spills; ``tests/kernels/test_aot_audit.py`` asserts the limits.
The sm_120 Gluon verify kernel is among them (``gluon_mma_reports``, compiled for sm_120 and sm_90).
``--gluon``: the Hopper Gluon verify kernels' shipped launches instead (``gluon_verify_reports``).
Triton compiles for any target on a CPU-only machine; registers and spills come from the
``cuobjdump`` that the Triton wheel ships.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .configs import CAPABILITY, NO_SPILL_ARCHS, SHARED_MEMORY_LIMIT, AttnConfig
from .verify import abi as verify_abi
from .verify.policy import VERIFY_MLA_CONFIGS


@dataclass(frozen=True)
class CompileReport:
    kernel: str
    arch: str
    config: str
    shared: int
    registers: int
    spill_bytes: int  # local memory + stack frame, 0 when nothing spills

    @property
    def shared_limit(self) -> int:
        return SHARED_MEMORY_LIMIT[self.arch]

    @property
    def ok(self) -> bool:
        """Within the shared-memory limit, and spill-free where the architecture demands it."""
        return self.shared <= self.shared_limit and (self.spill_bytes == 0 or self.arch not in NO_SPILL_ARCHS)


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        text = subprocess.run([_cuobjdump(), "--dump-resource-usage", path], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(path)
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {k: int(v) for k, v in fields.items()}


def compile_kernel(fn, signature: dict, constexprs: dict, arch: str, num_warps: int, num_stages: int,
                   divisible: tuple[str, ...] = ()):
    """Compiles ``fn`` for ``arch`` (e.g. ``"sm_120"``); returns the compiled kernel."""
    names = fn.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    target = GPUTarget("cuda", CAPABILITY[arch], 32)
    return triton.compile(src, target=target, options={"num_warps": num_warps, "num_stages": num_stages})


def audit_in_subprocess(archs) -> list[CompileReport]:
    """Runs the audit in a fresh interpreter without ``TRITON_INTERPRET`` (the interpreter's
    ``@triton.jit`` functions cannot be compiled)."""
    import json
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "tritree.kernels.aot", "--json"] + [f"--arch={a}" for a in archs]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"AOT audit failed:\n{res.stderr[-4000:]}")
    return [CompileReport(**r) for r in json.loads(res.stdout.strip().splitlines()[-1])]


def audit(fn, signature, constexprs, arch, num_warps, num_stages, divisible=(), label="") -> CompileReport:
    k = compile_kernel(fn, signature, constexprs, arch, num_warps, num_stages, divisible)
    use = resource_usage(k.asm["cubin"])
    return CompileReport(fn.__name__, arch, label, int(k.metadata.shared), use.get("REG", 0),
                         use.get("LOCAL", 0) + use.get("STACK", 0))


# Architectures whose verify configs are also compiled for fp8 (e4m3) pools (e4m3 needs sm_89+).
FP8_KV_ARCHS = ("sm_90", "sm_120")
# Page sizes at which the small-pages tables' configs are compiled.
SMALL_PAGE_SIZES = (1, 16)


def verify_mla_reports(dtype: str = "bf16", archs=None, split_variants=(1, 2)) -> list[CompileReport]:
    """Compiles the verify kernel for every config of every table (and the one- and many-split
    store paths, which differ), and on ``FP8_KV_ARCHS`` also with a float8_e4m3fn pool wherever
    ``configs.lookup`` can serve one from that table: ``"<arch>:fp8"`` tables with that pool only; an
    architecture's main table not with it when it has an fp8 table (``"<arch>:small_pages"`` still:
    fp8 pools with pages below a TMA tile reach it); ``"<arch>:fp32"`` tables with fp32 queries only (fp32 pools,
    and fp8 ones unless a ``"<arch>:fp32:fp8"`` table serves them), at 64-key and one-key pages."""
    from .verify.triton_kernel import _verify_mla_kernel

    reports = []
    for key, table in VERIFY_MLA_CONFIGS.items():
        arch = key.split(":")[0]  # "sm_90:small_pages" compiles for sm_90
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        fp8_only = key.endswith(":fp8")  # "sm_90:fp8", "sm_120:fp32:fp8" serve fp8 pools only
        fp32 = ":fp32" in key  # "sm_90:fp32" serves fp32 queries only, any page size
        q_dtype = "fp32" if fp32 else dtype
        no_fp8 = key in (arch, f"{arch}:fp32") and f"{key}:fp8" in VERIFY_MLA_CONFIGS
        kernels = {(c.block_m, c.block_n, c.num_warps, c.num_stages, c.tma, c.split_scores): c for c in table.values()}
        # Small-pages tables serve pages below a tile: one page id per row (the P = 1 and P = 16 compiles); where
        # an architecture that must not spill has none, its main table serves them too.
        if key.endswith(":small_pages"):
            page_sizes = SMALL_PAGE_SIZES
        elif fp32:
            page_sizes = (64, 1)
        elif arch in NO_SPILL_ARCHS and f"{arch}:small_pages" not in VERIFY_MLA_CONFIGS and key == arch:
            page_sizes = (64,) + SMALL_PAGE_SIZES
        else:
            page_sizes = (64,)
        for cfg in sorted(kernels.values(), key=lambda c: (c.block_m, c.block_n)):
            for splits, P in itertools.product(split_variants, page_sizes):
                if not fp8_only:
                    reports.append(_verify_report(_verify_mla_kernel, arch, cfg, q_dtype, splits, page_size=P))
                if arch in FP8_KV_ARCHS and not no_fp8:
                    reports.append(_verify_report(_verify_mla_kernel, arch, cfg, q_dtype, splits, kv_dtype="fp8e4nv",
                                                  page_size=P))
    return reports


def draft_attention_reports(dtype: str = "bf16", archs=None, split_variants=(1, 2)) -> list[CompileReport]:
    """The draft attention at the Kimi-K2.6-DFlash head size (D 128, GQA 8, block 16), with and
    without a window, one and many splits."""
    from .draft_attention import DRAFT_ATTN_CONFIGS, _draft_attention_kernel

    ptr = "*" + dtype
    sig = {"Q": ptr, "KC": ptr, "VC": ptr, "PageTable": "*i32", "CtxLens": "*i32", "KB": ptr, "VB": ptr,
           "Out": ptr, "Lse": "*fp32", "sm_scale_log2e": "fp32"}
    ints = ["stride_qb", "stride_qs", "stride_qh", "stride_kcp", "stride_kcs", "stride_kch", "stride_vcp",
            "stride_vcs", "stride_vch", "stride_ptb", "max_pages", "num_pages", "stride_kbb", "stride_kbs",
            "stride_kbh", "stride_vbb", "stride_vbs", "stride_vbh", "stride_ob", "stride_ot", "stride_oh",
            "stride_os", "stride_lb", "stride_lt", "stride_lh", "stride_ls", "S", "Hq", "Hkv", "num_splits",
            "window"]
    sig.update({n: "i32" for n in ints})
    divisible = ("Q", "KC", "VC", "PageTable", "CtxLens", "KB", "VB", "Out", "Lse", "stride_qb", "stride_qs",
                 "stride_qh", "stride_kcp", "stride_kcs", "stride_kch", "stride_vcp", "stride_vcs", "stride_vch")
    reports = []
    for arch, table in DRAFT_ATTN_CONFIGS.items():
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for cfg in sorted(set(table.values()), key=lambda c: (c.block_m, c.block_n)):
            for splits in split_variants:
                for window in (False, True):
                    s = dict(sig, Out=ptr if splits == 1 else "*fp32")
                    consts = {"GROUP": 8, "PAGE_SIZE": 64, "HEAD_D": 128, "BLOCK_M": cfg.block_m,
                              "BLOCK_N": cfg.block_n, "BLOCK_S": 16, "SINGLE_SPLIT": splits == 1,
                              "HAS_WINDOW": window, "UPCAST": False, "IEEE": dtype == "fp32",
                              "HOIST_PAGES": cfg.hoist_pages and cfg.block_n <= 64, "PAGE_GROUP": 16}
                    label = (f"BM{cfg.block_m} BN{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
                             f"{' hoist' if cfg.hoist_pages else ''} "
                             f"splits{'1' if splits == 1 else 'N'}{' win' if window else ''}")
                    reports.append(audit(_draft_attention_kernel, s, consts, arch, cfg.num_warps, cfg.num_stages,
                                         divisible, label))
    return reports


def tree_reports(archs=None) -> list[CompileReport]:
    """The DDTree top-k passes and search at the launch shapes of budgets 64, 256 and 1024 (bf16 logits)."""
    from .tree import _ddtree_kernel, _topk_bound_kernel, _topk_select_kernel

    reports = []
    ints = ("V", "D", "stride_xb", "stride_xd", "stride_xv", "n_blocks", "bpc")
    bound_sig = {"X": "*bf16", "Part": "*i32", "State": "*fp32", "Arrive": "*i32", **{n: "i32" for n in ints},
                 "C1": "i32", "K": "i32", "cmax": "fp32"}
    select_sig = {"X": "*bf16", "State": "*fp32", "Spart": "*i64", "Cnt": "*i32", "Arrive": "*i32", "Cand": "*i32",
                  "KeyBuf": "*i64", "OutLP": "*fp32", "OutIds": "*i32", **{n: "i32" for n in ints}, "C2": "i32",
                  "K": "i32", "CAP": "i32", "scale": "fp32", "inv_scale": "fp32"}
    search_sig = {"LP": "*fp32", "IDS": "*i32", "RootTokens": "*i32", "Tokens": "*i32", "Parents": "*i32",
                  "Depth": "*i32", "Scores": "*fp32", "Ranks": "*i32", "TreeLens": "*i32", "Mask": "*i32",
                  "D": "i32", "K": "i32", "budget": "i32", "T": "i32", "W": "i32"}
    for arch in (archs or ("sm_90", "sm_120")):
        if arch not in CAPABILITY:
            continue
        for g in (256, 4096):  # residue classes at k = 64 and k = 1024
            reports.append(audit(_topk_bound_kernel, bound_sig, {"G": g, "RB": 4096 // g, "CB": max(1, 8192 // g),
                                                                   "WAYS": max(2, min(16, 8192 // g))},
                                 arch, 4, 1, ("X", "Part"), f"G{g} w4"))
        reports.append(audit(_topk_select_kernel, select_sig, {"BLOCK": 2048, "CP": 64, "BI": 64, "BJ": 64, "FB": 256},
                             arch, 4, 1, ("X", "Cand", "KeyBuf"), "BLOCK2048 w4"))
        for budget in (64, 256, 1024):
            ns = max(32, triton.next_power_of_2(budget))
            warps = max(1, min(4, ns // 512))
            W = (budget + 32) // 32
            wp = triton.next_power_of_2(W)
            bn = max(1, min(triton.next_power_of_2(budget + 1), 16 * 32 * warps // wp))
            reports.append(audit(_ddtree_kernel, search_sig, {"NS": ns, "PF": 1024,
                                                              "BN": bn, "WP": wp}, arch, warps, 1, (),
                                 f"budget {budget} w{warps}"))
    return reports


def accept_reports(archs=None) -> list[CompileReport]:
    """Tree acceptance: the greedy single launch at K2.6's vocabulary (bf16 logits, trees of 9 to 1024 nodes)
    and the walk over given picks (after the sampled picks, and ``accept_picks``)."""
    from .accept import _greedy_accept_kernel, _walk_kernel, greedy_accept_layout

    ints = ("stride_lb", "stride_lt", "stride_lv", "stride_tb", "stride_pb", "T", "V", "chunk", "n_chunks",
            "arrivals")
    greedy_sig = {"Logits": "*bf16", "Tokens": "*i32", "Parents": "*i32", "TreeLens": "*i32", "PartVal": "*fp32",
                  "PartIdx": "*i32", "Arrive": "*i32", "Picks": "*i32", "AcceptIdx": "*i32", "AcceptLen": "*i32",
                  "Bonus": "*i32", **{n: "i32" for n in ints}}
    walk_sig = {"Tokens": "*i32", "Parents": "*i32", "TreeLens": "*i32", "Picks": "*i32", "AcceptIdx": "*i32",
                "AcceptLen": "*i32", "Bonus": "*i32", "stride_tb": "i32", "stride_pb": "i32", "stride_kb": "i32",
                "T": "i32"}
    reports = []
    for arch in (archs or ("sm_90", "sm_120")):
        if arch not in CAPABILITY:
            continue
        for T in (9, 65, 1025):
            block_r, block_v = greedy_accept_layout(1, T, 163_840, 132)[:2]
            reports.append(audit(_greedy_accept_kernel, greedy_sig, {"BLOCK_R": block_r, "BLOCK_V": block_v,
                                                                     "BLOCK_T": triton.next_power_of_2(T)},
                                 arch, 4, 1, ("Logits",), f"T{T} BR{block_r} BV{block_v} w4"))
            reports.append(audit(_walk_kernel, walk_sig, {"BLOCK_T": triton.next_power_of_2(T)}, arch, 4, 1, (),
                                 f"T{T} w4"))
    return reports


def moe_reports(archs=None, dtype: str = "bf16") -> list[CompileReport]:
    """The grouped-expert kernels at their launch defaults (``moe.MOE_LAUNCH``)."""
    from .moe.dense import MOE_LAUNCH, _down_kernel, _gate_up_kernel

    ptr = "*" + dtype
    idx = {"BlockExpert": "*i32", "BlockStart": "*i32", "BlockEnd": "*i32", "SortedTok": "*i32",
           "E": "i32", "Hd": "i32", "I": "i32"}
    L = MOE_LAUNCH
    consts = {"BLOCK_M": L["block_m"], "BLOCK_N": L["block_n"], "BLOCK_K": L["block_k"], "UPCAST": False,
              "IEEE": dtype == "fp32"}
    kernels = [
        (_gate_up_kernel, {"X": ptr, "Wg": ptr, "Wu": ptr, "Hbuf": ptr, **idx, "stride_x": "i32", "stride_we": "i32",
                           "stride_wi": "i32", "stride_h": "i32"}),
        (_down_kernel, {"Hbuf": ptr, "Wd": ptr, "Out": "*fp32", "SortedW": "*fp32", **idx, "stride_h": "i32",
                        "stride_we": "i32", "stride_wo": "i32", "stride_o": "i32"}),
    ]
    reports = []
    for arch in (archs or ("sm_90", "sm_120")):
        if arch not in CAPABILITY:
            continue
        for fn, sig in kernels:
            reports.append(audit(fn, sig, consts, arch, L["num_warps"], 1,
                                 tuple(k for k, v in sig.items() if v.startswith("*")),
                                 f"BM{L['block_m']} BN{L['block_n']} BK{L['block_k']} w{L['num_warps']}"))
    return reports


def moe_int4_reports(archs=None, dtype: str = "bf16") -> list[CompileReport]:
    """The INT4 grouped-expert kernels for every config of ``moe.int4_triton.INT4_MOE_CONFIGS``, unsplit and
    split-K (the split gate_up kernel adds fp32 partials by atomics; the down kernel then forms the
    SiLU-and-mul on load)."""
    from .moe.int4_triton import BF16_OUT_SCALE, INT4_MOE_CONFIGS, _down_int4_kernel, _gate_up_int4_kernel

    ptr = "*" + dtype
    idx = {"BlockExpert": "*i32", "BlockStart": "*i32", "BlockEnd": "*i32", "SortedIdx": "*i32",
           "E": "i32", "Hd": "i32", "I": "i32", "I_pad": "i32"}
    w = {"stride_pe": "i32", "stride_pn": "i32", "stride_se": "i32", "stride_sn": "i32"}
    act = {"bf16": "bfloat16", "fp16": "float16"}[dtype]
    reports = []
    for arch, table in INT4_MOE_CONFIGS.items():
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for cfg in sorted(set(table.values()), key=lambda c: c.block_m):
            for split in (1, 2):
                base = {"TOPK": 8, "BLOCK_M": cfg.block_m, "SPLIT_K": split, "SWAP_AB": cfg.swap_ab, "EVEN": True, "UPCAST": False,
                        "OUT_SCALE": BF16_OUT_SCALE if dtype == "bf16" else 1.0}
                for fn, tiles, sig, extra in (
                    (_gate_up_int4_kernel, cfg.gate_up,
                     {"X": ptr, "Wp": "*i32", "Ws": "*bf16", "Hbuf": ptr if split == 1 else "*fp32", **idx,
                      "stride_x": "i32", **w, "stride_h": "i32"}, {"H_BLOCK_K": cfg.down[1]}),
                    (_down_int4_kernel, cfg.down,
                     {"Hbuf": ptr if split == 1 else "*fp32", "Wp": "*i32", "Ws": "*bf16", "Out": "*fp32",
                      "TopkW": "*fp32", **idx, "stride_h": "i32", **w, "stride_o": "i32"},
                     {"ACT_IN_LOAD": split > 1, "DTYPE": getattr(triton.language, act)}),
                ):
                    bn, bk, warps, stages = tiles
                    consts = {**base, "BLOCK_N": bn, "BLOCK_K": bk, **extra}
                    divisible = tuple(k for k, v in sig.items() if v.startswith("*")) + tuple(
                        k for k in sig if k.startswith("stride"))
                    label = (f"BM{cfg.block_m} BN{bn} BK{bk} w{warps} s{stages}{' swap' if cfg.swap_ab else ''} "
                             f"split{'1' if split == 1 else 'N'}")
                    reports.append(audit(fn, sig, consts, arch, warps, stages, divisible, label))
    return reports


def moe_int4_mma_reports(archs=None) -> list[CompileReport]:
    """The Gluon ``mma.sync`` W4A16 kernels (``moe.int4_mma``: weights straight into registers, no shared
    memory) for sm_120 and sm_90: blocks of 8 and 16 rows, bf16 and fp16 activations; the down kernel with one K
    split and several, one column tile a program and eight (gate_up's routed programs take their chunks from a
    queue: one build a block size and dtype)."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon._runtime import GluonASTSource

        from .moe import int4_mma as M
    except ImportError:  # a triton without Gluon
        return []
    idx = {"BlockExpert": "*i32", "BlockStart": "*i32", "BlockEnd": "*i32", "SortedIdx": "*i32", "N": "i32",
           "E": "i32", "Hd": "i32", "I": "i32", "Is": "i32"}
    w = {"stride_we": "i32", "stride_wm": "i32", "stride_se": "i32", "stride_sm": "i32"}
    reports = []
    for arch in (archs or ("sm_120", "sm_90")):
        if arch not in ("sm_120", "sm_90"):
            continue
        for dtype, bm in itertools.product(("bf16", "fp16"), (8, 16)):
            act = "*" + dtype
            gate_up = {"X": act, "Wp": "*i32", "Ws": "*bf16", "Sw": act, "Hbuf": act, "Gacc": "*fp32", "Gs": "*fp32",
                       "Count": "*i32", "Queue": "*i32", "Used": "*i32", **idx, "NB": "i32", "SS": "i32", "P": "i32",
                       "stride_x": "i32", **w, "stride_sw": "i32", "stride_h": "i32", "stride_g": "i32",
                       "stride_gs": "i32"}
            down = {"Hbuf": act, "Wp": "*i32", "Ws": "*bf16", "Sd": act, "Acc": "*fp32", "Out": act, "TopkW": "*fp32",
                    "Count": "*i32", "Used": "*i32", **idx, "NB": "i32", "SDS": "i32", "stride_h": "i32", **w,
                    "stride_sd": "i32", "stride_a": "i32", "stride_o": "i32"}
            builds = [(M._gate_up_mma_kernel, gate_up, {"CHUNK": M.CHUNK_PAIRS}, "queue")]
            builds += [(M._down_mma_kernel, down, {"SPLIT": split, "CT": ct}, f"split{split} cols{ct}")
                       for split, ct in itertools.product((1, 2), (1, 8))]
            for fn, sig, own, what in builds:
                cx = dict(TOPK=8, BM=bm, WARPS=M.WARPS, **own, DTYPE=gl.bfloat16 if dtype == "bf16" else gl.float16,
                          OUT_SCALE=M.BF16_OUT_SCALE if dtype == "bf16" else 1.0)
                divisible = [n for n, v in sig.items() if v.startswith("*") or n.startswith("stride")]
                attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
                k = triton.compile(GluonASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in cx}},
                                                  constexprs=cx, attrs=attrs),
                                   target=GPUTarget("cuda", CAPABILITY[arch], 32),
                                   options=M.launch_options(bm, torch.bfloat16 if dtype == "bf16" else torch.float16))
                use = resource_usage(k.asm["cubin"])
                reports.append(CompileReport(fn.__name__, arch, f"BM{bm} w{M.WARPS} {what} {dtype}",
                                             int(k.metadata.shared), use.get("REG", 0),
                                             use.get("LOCAL", 0) + use.get("STACK", 0)))
    return reports


def router_reports(archs=None) -> list[CompileReport]:
    """The one-launch MoE router (``moe.router._route_kernel``) for every config of ``moe.router.ROUTER_CONFIGS`` at
    Kimi K2.6's shapes (H = 7168, top-8 of 384 experts; the K split of the config's largest row count up to
    4096 on a GPU of the architecture's usual SM count), x and weight both bf16 and both fp32, with K2.6's
    routing (one group) and DeepSeek-V3's group limit (8 groups, 4 kept)."""
    import torch

    from .moe.router import ROUTER_CONFIGS, _constexprs, _route_kernel, plan_moe_route

    sms = {"sm_90": 132, "sm_120": 188, "sm_80": 108}
    H, E, top_k = 7168, 384, 8
    ptrs = ("X", "W", "Bias", "TreeLens", "Part", "Logits", "Cand", "Count", "Idx", "Wt")
    ints = ("N", "H", "E", "stride_x", "stride_w", "stride_l", "k_split", "n_cand", "T", "expert_offset")
    divisible = ("X", "W", "Bias", "Part", "Logits", "Cand", "Idx", "Wt", "H", "E", "stride_x", "stride_w",
                 "stride_l", "k_split", "n_cand")
    reports = []
    for arch, table in ROUTER_CONFIGS.items():
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for cfg, bound in {c: b for b, c in sorted(table.items())}.items():  # each config at its largest bucket
            N = min(bound, 4096)
            for dtype in ("bf16", "fp32"):
                tdt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
                for n_group, topk_group in ((1, 1), (8, 4)):
                    plan = plan_moe_route(N, H, E, tdt, tdt, top_k, n_group, topk_group, arch, sms[arch], cfg)
                    sig = {"X": "*" + dtype, "W": "*" + dtype, "Bias": "*fp32", "TreeLens": "*i32", "Part": "*fp32",
                           "Logits": "*fp32", "Cand": "*i64", "Count": "*i32", "Idx": "*i32", "Wt": "*fp32",
                           **{n: "i32" for n in ints}, "scaling": "fp32"}
                    assert tuple(sig)[:len(ptrs)] == ptrs
                    consts = _constexprs(plan, N, H, E, tdt, tdt, top_k, n_group, topk_group, True, True, True)
                    consts["DOT_F32"] = dtype == "fp32"  # as on the GPU, also when this process interprets
                    label = (f"BT{cfg.block_t} BE{cfg.block_e} BK{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} "
                             f"{dtype} g{n_group}/{topk_group} split{plan.split_k} sel{plan.sel_rows}")
                    reports.append(audit(_route_kernel, sig, consts, arch, cfg.num_warps, cfg.num_stages, divisible,
                                         label))
    return reports


def moe_block_reports(archs=None) -> list[CompileReport]:
    """The MoE block's norm kernel (``moe.block._block_norm_kernel``) at K2.6's hidden size (7168, one program a
    row), bf16 and fp16 rows, with and without the residual (the block's other launches are the router's and the
    Gluon expert kernels', audited with them)."""
    from .moe.block import _block_norm_kernel

    reports = []
    for arch in (archs or ("sm_90", "sm_120")):
        if arch not in CAPABILITY:
            continue
        for dtype, residual in (("bf16", True), ("bf16", False), ("fp16", True)):
            sig = {"Res": "*" + dtype, "NormW": "*" + dtype, "Xn": "*" + dtype, "Xm": "*" + dtype, "Acc": "*fp32",
                   "H": "i32", "eps": "fp32", "stride_r": "i32", "stride_n": "i32", "stride_m": "i32", "stride_a": "i32"}
            consts = {"RESIDUAL": residual, "BLOCK_H": 8192}
            reports.append(audit(_block_norm_kernel, sig, consts, arch, 8, 1,
                                 ("Res", "NormW", "Xn", "Xm", "Acc", "stride_r", "stride_n", "stride_m", "stride_a"),
                                 f"{dtype} H8192 w8{' residual' if residual else ''}"))
    return reports


def linear_reports(archs=None) -> list[CompileReport]:
    """The skinny linear (``linear._linear_kernel``) for every GPU config of ``linear.LINEAR_CONFIGS`` (an
    architecture's plain and ``":norm"`` tables), bf16 and
    fp16 (fp32 rows run the composed ops on a GPU), one K split and several, with the RMSNorm prologue (and its
    weight), the bias, the SiLU-and-mul epilogue and the residual and without them."""
    from .linear import LINEAR_CONFIGS, _linear_kernel, sum_unroll

    per_arch: dict[str, dict] = {}  # an architecture's configs over its tables (plain and ":norm"), each once
    for key, table in LINEAR_CONFIGS.items():
        per_arch.setdefault(key.split(":")[0], {}).update(dict.fromkeys(table.values()))
    reports = []
    for arch, configs in per_arch.items():
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for cfg in configs:
            for dtype, split, fused in (("bf16", 1, False), ("bf16", 4, True), ("bf16", 4, False), ("fp16", 1, True)):
                sig = {"X": "*" + dtype, "W": "*" + dtype, "Bias": "*" + dtype, "Res": "*" + dtype,
                       "Out": "*" + dtype, "Part": "*fp32", "SumSq": "*fp32", "Count": "*i32", "NormW": "*" + dtype,
                       "M": "i32", "N": "i32",
                       "K": "i32", "stride_x": "i32", "stride_w": "i32", "stride_r": "i32", "stride_o": "i32",
                       "k_split": "i32", "eps": "fp32"}
                consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
                              HAS_NORM=fused, HAS_BIAS=fused, HAS_RES=fused, DOT_F32=False, EVEN_K=True,
                              SUM_UNROLL=sum_unroll(cfg), HAS_NW=fused, GLU=fused)
                label = (f"BM{cfg.block_m} BN{cfg.block_n} BK{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} {dtype} "
                         f"split{'1' if split == 1 else 'N'}{' norm(weight) bias silu_mul res' if fused else ''}")
                reports.append(audit(_linear_kernel, sig, consts, arch, cfg.num_warps, cfg.num_stages,
                                     ("X", "W", "Bias", "Res", "Out", "Part", "SumSq", "K", "stride_x", "stride_w",
                                      "stride_r", "stride_o", "k_split"), label))
    return reports


def mla_reports(archs=None) -> list[CompileReport]:
    """The absorbed MLA kernel (``mla_decode._mla_kernel``) for every GPU config of ``mla_decode.MLA_CONFIGS`` at
    Kimi K2.6's per-rank shapes (nope 128, C 512, R 64, pages of 64), bf16: ``mla_query_`` (the product, the
    rotations, the latent programs and the paged write) and ``mla_output``."""
    from .mla_decode import MLA_CONFIGS, _mla_kernel

    ptrs = ("X", "W", "Out", "Lat", "NormW", "Cos", "Sin", "KV", "PageTable", "KvLens", "TreeLens")
    ints = ("M", "K", "N", "H", "stride_xm", "stride_xh", "stride_wh", "stride_wk", "stride_wn", "stride_om",
            "stride_oh", "stride_lm", "stride_c", "stride_kp", "stride_ks", "stride_ptb", "max_pages", "num_pages",
            "T", "col_tiles", "row_blocks")
    reports = []
    for arch, table in MLA_CONFIGS.items():
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for cfg in dict.fromkeys(table.values()):
            for query in (True, False):
                sig = {**{p: "*bf16" for p in ptrs}, **{n: "i32" for n in ints}, "eps": "fp32"}
                sig.update(PageTable="*i32", KvLens="*i32", TreeLens="*i32")
                consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, QUERY=query, R=64,
                              C_PAD=512, ROWS_L=cfg.rows_l, PAGE_SIZE=64, DOT_F32=False, SIGNAL=arch == "sm_90")
                label = (f"BM{cfg.block_m} BN{cfg.block_n} BK{cfg.block_k} w{cfg.num_warps} RL{cfg.rows_l} bf16 "
                         f"{'query' if query else 'output'}")
                reports.append(audit(_mla_kernel, sig, consts, arch, cfg.num_warps, 1,
                                     ("X", "W", "Out", "Lat", "KV", "stride_xm", "stride_xh", "stride_wh", "stride_wk",
                                      "stride_om", "stride_oh", "stride_lm", "stride_c", "stride_kp", "stride_ks"),
                                     label))
    return reports


def kv_reports(archs=None) -> list[CompileReport]:
    """The KV commit kernel at its launch layouts (``kv_cache._commit_layout``): latent rows of 576 in
    bf16 (trees of 64 nodes in one chunk, of 128+ nodes in chunks of 128), fp32 and 1-byte rows; P 64 and 1.
    The KV write kernel (``kv_write_``): bf16 rows of 576, pages of 64 and 1, as launched (16-row blocks)."""
    from .kv_cache import WRITE_WARPS, _block_e, _commit_layout, _kv_commit_kernel, _kv_write_kernel

    reports = []
    for arch in (archs or ("sm_90", "sm_120")):
        if arch not in CAPABILITY:
            continue
        for dtype, nbytes, T, P in (("bf16", 2, 64, 64), ("bf16", 2, 1025, 64), ("bf16", 2, 1025, 1),
                                    ("fp32", 4, 128, 64), ("i8", 1, 128, 64)):
            rows, block_e = _commit_layout(T, 576, nbytes)
            sig = {"KV": "*" + dtype, "PageTable": "*i32", "KvLens": "*i32", "AcceptIdx": "*i32", "AcceptLen": "*i32",
                   "NewLens": "*i32", "stride_kl": "i64", "stride_kp": "i32", "stride_ks": "i32", "stride_ptb": "i32",
                   "stride_ab": "i32", "T": "i32", "E": "i32", "max_pages": "i32", "num_pages": "i32"}
            consts = {"PAGE_SIZE": P, "ROWS": rows, "BLOCK_E": block_e, "EVEN_E": True}
            reports.append(audit(_kv_commit_kernel, sig, consts, arch, 4, 1,
                                 ("KV", "PageTable", "AcceptIdx", "stride_kl", "stride_kp", "stride_ks", "stride_ab"),
                                 f"{dtype} P{P} ROWS{rows} BE{block_e} w4"))
        for P in (64, 1):
            sig = {"KV": "*bf16", "New": "*bf16", "PageTable": "*i32", "KvLens": "*i32", "TreeLens": "*i32",
                   "stride_kl": "i64", **{n: "i32" for n in ("stride_kp", "stride_ks", "stride_nl", "stride_nb",
                                                            "stride_nt", "stride_ptb", "T", "E", "max_pages",
                                                            "num_pages", "t_blocks")}}
            consts = dict(PAGE_SIZE=P, ROWS=16, BLOCK_E=_block_e(576), SIGNAL=CAPABILITY[arch] >= 90)
            reports.append(audit(_kv_write_kernel, sig, consts, arch, WRITE_WARPS, 1,
                                 ("KV", "New", "stride_kp", "stride_ks"), f"write bf16 P{P} ROWS16 w{WRITE_WARPS}"))
    return reports


def head_rope_reports(archs=None) -> list[CompileReport]:
    """The per-head norm and rope kernel (``head_rope._head_rope_kernel``) for every config of its table at the
    draft's heads of 128 (64 and 8 heads), bf16 and fp16, with and without the norm (a weight a head)."""
    from .head_rope import HEAD_ROPE_CONFIGS, _head_rope_kernel, plan_head_rope

    reports = []
    for arch in HEAD_ROPE_CONFIGS:
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for H, dtype, norm in ((64, "bf16", True), (8, "bf16", False), (64, "fp16", True)):
            plan = plan_head_rope(8, H, 128, arch)
            sig = {"X": "*" + dtype, "Out": "*" + dtype, "NormW": "*" + dtype, "Pos": "*i64", "InvFreq": "*fp32",
                   **{n: "i32" for n in ("H", "D", "stride_xm", "stride_xh", "stride_om", "stride_oh", "stride_wh")},
                   "eps": "fp32", "amplitude": "fp32"}
            consts = dict(BLOCK_H=plan.block_h, D_PAD=plan.d_pad, HAS_NORM=norm)
            reports.append(audit(_head_rope_kernel, sig, consts, arch, plan.config.num_warps, 1,
                                 ("X", "Out", "stride_xm", "stride_xh", "stride_om", "stride_oh"),
                                 f"H{H} BH{plan.block_h} D128 {dtype}{' norm' if norm else ''}"))
    return reports


def align_reports(archs=None) -> list[CompileReport]:
    """The routing align (``moe.align._align_kernel``, one program of 8 warps) at the expert counts of an EP8 rank
    (48 experts) and a TP8 rank (384), blocks of 8 and 16 rows, one chunk of blocks of 128 and of 1024."""
    import triton

    from .moe.align import _align_kernel

    reports = []
    for arch in ("sm_120", "sm_90", "sm_80"):
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for E, bm, chunk_b in ((48, 8, 128), (384, 8, 1024), (384, 16, 128)):
            sig = {"Idx": "*i32", **{n: "*i32" for n in ("SortedIdx", "BlockExpert", "BlockStart", "BlockEnd", "Used",
                                                          "Scratch")}, "A": "i32", "E": "i32", "num_blocks": "i32"}
            nb = triton.next_power_of_2(E + 2)
            reports.append(audit(_align_kernel, sig, dict(BLOCK_M=bm, NB=nb, CHUNK_A=1024, CHUNK_B=chunk_b), arch, 8,
                                 1, ("Idx", "SortedIdx", "Scratch"), f"E{E} BM{bm} NB{nb} CB{chunk_b}"))
    return reports


def embed_reports(archs=None) -> list[CompileReport]:
    """The vocabulary-shard lookup (``embed._embed_kernel``) for every config of its table at K2.x's rows of 7,168:
    bf16 with and without the scale (int32 ids), fp32 with int64 ids."""
    from .embed import EMBED_CONFIGS, _embed_kernel, plan_embed

    reports = []
    for arch in EMBED_CONFIGS:
        if arch not in CAPABILITY or (archs and arch not in archs):
            continue
        for dtype, ids, scale in (("bf16", "*i32", False), ("bf16", "*i32", True), ("fp32", "*i64", False)):
            plan = plan_embed(17, 7168, arch)
            sig = {"Table": "*" + dtype, "Tokens": ids, "Out": "*" + dtype, "start": "i32", "rows": "i32",
                   **{n: "i32" for n in ("H", "stride_t", "stride_k", "stride_o")}, "scale": "fp32"}
            reports.append(audit(_embed_kernel, sig, dict(BLOCK=plan.block, SCALE=scale), arch,
                                 plan.config.num_warps, 1, ("Table", "Out", "H", "stride_t", "stride_o"),
                                 f"H7168 B{plan.block} {dtype}{' scale' if scale else ''}"))
    return reports


def _verify_report(fn, arch: str, cfg: AttnConfig, dtype: str, num_splits: int,
                   kv_dtype: str | None = None, page_size: int = 64) -> CompileReport:
    from .verify.triton_kernel import launch_config

    sig = verify_abi.signature("triton", q=dtype, kv=kv_dtype or dtype, out=dtype if num_splits == 1 else "fp32")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8e4nv": torch.float8_e4m3fn}
    _, constexprs, _ = launch_config(cfg, num_splits=num_splits, tma=cfg.tma, batch=1, T=1, H=1,
                                     d_lat=verify_abi.D_LATENT, d_pe=verify_abi.D_ROPE, q_dtype=dtypes[dtype],
                                     kv_dtype=dtypes[kv_dtype or dtype], page_size=page_size)
    label = (f"BM{cfg.block_m} BN{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}{' tma' if cfg.tma else ''}"
             f"{' hoist' if cfg.hoist_pages else ''}{' split' if cfg.split_scores else ''} "
             f"splits{'1' if num_splits == 1 else 'N'}{' q ' + dtype if dtype != 'bf16' else ''}"
             f"{' kv ' + kv_dtype if kv_dtype else ''}"
             f"{f' P{page_size}' if page_size != 64 else ''}")
    return audit(fn, sig, constexprs, arch, cfg.num_warps, cfg.num_stages, verify_abi.DIVISIBLE, label)


def gluon_mma_reports(archs=None) -> list[CompileReport]:
    """The sm_120 ``mma.sync`` Gluon verify kernel (``kernel="gluon-mma"``) as ``verify_mla`` launches it,
    compiled for sm_120 and for sm_90 (where it also runs): bf16 and fp8 pools, one split and several, row
    gathers at P = 1, 16, 64 and 128 (sm_90: 1 and 64)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from .verify import gluon_launch as L

    if not L.GLUON_AVAILABLE:
        return []
    fn = L._verify_gluon_mma_kernel
    attrs = verify_abi.divisibility(fn)
    reports = []
    for arch in (archs or ("sm_120", "sm_90")):
        if arch not in ("sm_120", "sm_90"):
            continue
        # sm_120 (the limits that bind) at every page-size form; sm_90 one gather and one page-aligned form.
        page_sizes = (1, 16, 64, 128) if arch == "sm_120" else (1, 64)
        for kv, P, splits in itertools.product(("bf16", "fp8e4nv"), page_sizes, (1, 2)):
            launch = L.plan_verify_gluon(kernel="gluon-mma", batch=1, T=65, H=8, page_size=P, num_splits=splits,
                                         num_sms=132, pdl_capable=False)
            cx = dict(launch.constexprs)
            sig = {**verify_abi.signature("gluon-mma", q="bf16", kv=kv, out="bf16" if splits == 1 else "fp32"),
                   **{k: "constexpr" for k in cx}}
            k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                               target=GPUTarget("cuda", CAPABILITY[arch], 32), options=launch.options())
            use = resource_usage(k.asm["cubin"])
            label = (f"gluon-mma BM{cx['BLOCK_M']} BN{cx['BLOCK_N']} w{L.NUM_WARPS} splits{'1' if splits == 1 else 'N'} "
                     f"P{P}{' kv fp8e4nv' if kv != 'bf16' else ''}")
            reports.append(CompileReport(fn.__name__, arch, label, int(k.metadata.shared), use.get("REG", 0),
                                         use.get("LOCAL", 0) + use.get("STACK", 0)))
    return reports


def gluon_verify_reports() -> list[str]:
    """The Gluon verify kernels' shipped launches (``verify.gluon_launch.plan_verify_gluon``) compiled for
    sm_90: shared memory within the limit, spills, and for split-PDL builds ``griddepcontrol.wait`` ahead of
    the first global load. One line a launch, ``FAIL`` where a check fails."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from .verify import gluon_launch as L

    cases = [("gluon", T, 8, P, s) for T in (8, 1) for P in (64, 128, 1) for s in (1, 2)]
    cases += [("gluon-ws", T, H, P, s) for T, H in ((64, 8), (17, 8), (65, 8), (65, 16)) for P in (64, 128, 1, 16)
              for s in (1, 2)]
    lines = []
    for kernel, T, H, P, splits in cases:
        launch = L.plan_verify_gluon(kernel=kernel, batch=1, T=T, H=H, page_size=P, num_splits=splits, num_sms=132,
                                     pdl_capable=True)
        cx = dict(launch.constexprs)
        layout, layout3 = L._kv_smem_layout(), L._kv_smem3_layout()
        box = f"tensordesc<bf16[{L.BLOCK_N},64],{layout!r}>"
        out = "bf16" if launch.partials_16bit else "fp32"
        if kernel == "gluon":
            descs = {"kv_desc": box, "kv_desc3": f"tensordesc<bf16[{L.D_LAT // 64},{L.BLOCK_N},64],{layout3!r}>"
                     if launch.tma3d else box}
        else:
            descs = {"kv_desc": box,
                     "kv_desc3": f"tensordesc<bf16[{2 * L.BLOCK_N},64],{layout!r}>" if launch.wide_desc else box,
                     "kv_desc_pages": f"tensordesc<bf16[1,{L.BLOCK_N},64],{layout3!r}>" if launch.pages_desc else box,
                     "out_desc": f"tensordesc<bf16[1,{L.BLOCK_M},64],{layout3!r}>" if launch.partials_desc else box}
        sig = verify_abi.signature(kernel, q="bf16", kv="bf16", out=out, descriptors=descs)
        sig.update({k: "constexpr" for k in cx})
        fn = launch.fn
        attrs = verify_abi.divisibility(fn)
        opts = {"num_warps": L.NUM_WARPS, **({"ptx_options": launch.ptx_options} if launch.ptx_options else {})}
        tag = f"{kernel:8s} T={T:2d} H={H:2d} P={P:3d} splits={'1' if splits == 1 else 'N'}"
        try:
            k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=opts)
        except Exception as e:  # noqa: BLE001
            lines.append(f"gluon sm_90 {tag} COMPILE FAILED: {type(e).__name__}: {str(e)[:2000]}  FAIL")
            continue
        use = resource_usage(k.asm["cubin"])
        spill = use.get("LOCAL", 0) + use.get("STACK", 0)
        shared = int(k.metadata.shared)
        good = shared <= L.SMEM_LIMIT_SM90
        extra = ""
        if launch.launch_pdl:
            ptx = k.asm["ptx"]
            wait, load = ptx.find("griddepcontrol.wait"), ptx.find("ld.global")
            good &= 0 <= wait < load
            extra = f" wait before first load {0 <= wait < load}"
        # Spills are reported, not fatal (ptxas keeps a few loop-invariant scalars on the stack under O).
        lines.append(f"gluon sm_90 {tag} shared {shared:7d}/{L.SMEM_LIMIT_SM90} regs {use.get('REG', 0):3d} "
                     f"spill {spill:5d}{extra}  {'ok' if good else 'FAIL'}")
    return lines


def main(argv=None) -> None:
    import argparse
    import dataclasses
    import json

    # Triton 3.9 warns when the FP-fusion default is left implicit; these reports are of the kernels as they
    # are launched, with Triton's default (fusion on), so say it (a value set by the caller wins)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="only these architectures (sm_90, sm_120, sm_80)")
    ap.add_argument("--json", action="store_true", help="one JSON list of reports on stdout")
    ap.add_argument("--gluon", action="store_true", help="the Gluon verify kernels' sm_90 launches only")
    args = ap.parse_args(argv)
    if args.gluon:
        lines = gluon_verify_reports()
        print("\n".join(lines))
        if any(ln.endswith("FAIL") for ln in lines):
            raise SystemExit(1)
        return
    reports = (verify_mla_reports(archs=args.arch) + gluon_mma_reports(archs=args.arch)
               + draft_attention_reports(archs=args.arch)
               + moe_reports(archs=args.arch) + moe_int4_reports(archs=args.arch)
               + moe_int4_mma_reports(archs=args.arch) + router_reports(archs=args.arch)
               + moe_block_reports(archs=args.arch) + linear_reports(archs=args.arch) + mla_reports(archs=args.arch)
               + tree_reports(archs=args.arch) + accept_reports(archs=args.arch) + kv_reports(archs=args.arch)
               + head_rope_reports(archs=args.arch) + embed_reports(archs=args.arch) + align_reports(archs=args.arch))
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports]))
        return
    for r in reports:
        status = "ok" if r.ok else "FAIL"
        print(f"{r.kernel:24s} {r.arch:7s} {r.config:32s} shared {r.shared:7d}/{r.shared_limit:7d} "
              f"regs {r.registers:3d} spill {r.spill_bytes:5d}  {status}")


def _exit_without_teardown_report(code) -> None:
    """``sys.exit(code)`` with stderr closed for the interpreter's teardown: libtriton's Gluon bindings
    never release a few nanobind objects, and nanobind lists them on stderr at exit (Triton's own compile
    workers silence the same report so). Everything of the command itself is printed before."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    sys.exit(code)


def _cli() -> None:
    """``python -m tritree.kernels.aot``: :func:`main`, then the exit without nanobind's teardown report."""
    try:
        main()
        code = 0
    except SystemExit as e:  # --help, a usage error, FAIL: their output is already printed
        code = e.code
    _exit_without_teardown_report(code)


if __name__ == "__main__":
    _cli()
