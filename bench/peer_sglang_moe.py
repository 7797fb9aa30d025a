"""Benchmark peer: SGLang's Triton W4A16 fused-MoE kernel (``fused_moe_kernel_gptq_awq``), run from SGLang's
own files, next to tritree's INT4 MoE.

SGLang itself is not installed on the device. Its unmodified source files (sglang 0.5.23 wheel) are carried
in the ignored folder ``.peers/`` (mirroring the package path) and found through ``sys.path``:

- ``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``: defines ``fused_moe_kernel_gptq_awq`` and the
  ``write_zeros_to_output`` helper it calls;
- ``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``: ``get_default_config``.

Both modules import heavy SGLang modules at top level (``sglang.srt.utils``, ``sglang.srt.environ``,
``sgl_kernel`` quantisation ops ...), so they are not imported. Instead the two ``@triton.jit`` functions (whose
bodies use only ``triton``/``tl``) and ``get_default_config`` are taken out of the file with ``ast`` and
compiled under the file's own name at their own line numbers, so ``inspect.getsource`` (which ``triton.jit``
uses) reads the original file. Each file's sha256 is checked against the wheel's RECORD first.

What the adapter itself does (SGLang does these with CUDA ops of ``sgl_kernel``, which are not available):

- layout: SGLang's W4A16 path (``moe_wna16``, GPTQ symmetric) wants ``B`` uint8 ``[E, N, K/2]``, byte ``i``
  of row ``n`` holding input column ``2i`` in the low nibble and ``2i+1`` in the high one, stored as ``q+8``
  (no zero-point tensor: ``has_zp=False`` makes the kernel subtract a fixed 8), and ``b_scale [E, N, K/g]``.
  Our int32 words hold column ``8c+j`` in nibble ``j``, least significant first, so on a little-endian
  machine byte ``b`` of word ``c`` is columns ``8c+2b`` (low) and ``8c+2b+1`` (high): the conversion is
  ``w13_packed.view(torch.uint8)`` (``[E, 2I, H/8]`` int32 -> ``[E, 2I, H/2]`` uint8, the same bytes),
  likewise ``w2``; the bf16 scales are used as they are (``[E, N, K/32]``, ``group_size=32``). This matches
  what SGLang's loader does to a GPTQ ``qweight [K/8, N]`` (``.T.contiguous().view(torch.uint8)``).
- routing align (``moe_align_block_size``, SGLang's "+1 offset" convention): ids outside ``[0, E)`` (experts
  of another rank) become ``-1`` as in SGLang's EP path and go to bucket 0; buckets padded to ``BLOCK_SIZE_M``;
  ``sorted_token_ids`` padded with ``N k``; ``expert_ids`` = bucket - 1, so blocks of the other ranks' routes
  have expert ``-1`` and the kernel writes zeros for those rows (as SGLang does). Buffer sizes as SGLang's
  (``numel * BM`` if ``numel < E+1`` else ``numel + (E+1)(BM-1)``, rounded up to 4). Torch ops only (scatter_add,
  cumsum, stable sort, searchsorted): no host sync, CUDA-graph capturable.
- SiLU-and-mul between the GEMMs in torch (fp32, rounded once, like sgl_kernel's ``silu_and_mul``), the second
  GEMM with ``MUL_ROUTED_WEIGHT=True, top_k=1`` into ``[N, k, H]``, then a sum over ``k`` in torch (as
  ``fused_experts`` does for ``topk > 1``).

Config: SGLang's ``try_get_optimal_moe_config`` finds no tuned ``int4_w4a16`` file for the H200 (the wheel's
only int4_w4a16 files are ``E=384,N=128,device_name=`` for triton 3.4), so it uses ``get_default_config``
(called here from SGLang's file): ``M <= E``: ``BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64,
GROUP_SIZE_M=1``; otherwise ``64, 64, 32, 8``; no ``num_warps``/``num_stages`` keys, so Triton's defaults
(4 warps, 3 stages). ``M`` is the number of tokens; the down GEMM uses the same config (no down config file).
"""

from __future__ import annotations
import __future__ as _future

import ast
import base64
import functools
import hashlib
import os
import sys
import types

import torch
import torch.nn.functional as F

SGLANG_VERSION = "0.5.23"
_KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
_CONFIG = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
# sha256 (urlsafe base64, as in the wheel's RECORD) of the unmodified files of sglang 0.5.23
_SHA256 = {
    _KERNELS: "AwAbdZ-BKFvFoGcc59yKsi-xIDXRBEJNQGbl2Yg5po0",
    _CONFIG: "AiyKpHly3Zdev3vpxtBKxMYGBM9wXPgMmzjkWXMZPQk",
}


def _find(rel: str) -> str:
    for d in sys.path:
        p = os.path.join(d or os.getcwd(), rel)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"{rel} not found on sys.path (carry .peers/ and put it on PYTHONPATH)")


def _check_sha(path: str, rel: str) -> None:
    with open(path, "rb") as f:
        got = base64.urlsafe_b64encode(hashlib.sha256(f.read()).digest()).rstrip(b"=").decode()
    if got != _SHA256[rel]:
        raise RuntimeError(f"{path} is not sglang {SGLANG_VERSION}'s {rel} (sha256 {got})")


def _load_defs(rel: str, names: tuple[str, ...], namespace: dict) -> dict:
    """Compile the top-level definitions ``names`` of the file ``rel`` (decorators included) under the file's
    own name and line numbers into ``namespace``; the rest of the file is not executed."""
    path = _find(rel)
    _check_sha(path, rel)
    with open(path) as f:
        src = f.read()
    lines = src.splitlines(keepends=True)
    found = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = (start, node.end_lineno)
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"{path} defines no {', '.join(missing)}")
    ns = dict(namespace, __name__=f"_peer_sglang.{rel[:-3].replace('/', '.')}", __file__=path)
    for n in names:  # in the given order (dependencies first)
        start, end = found[n]
        code = "\n" * (start - 1) + "".join(lines[start - 1:end])
        exec(compile(code, path, "exec", flags=_future.annotations.compiler_flag, dont_inherit=True), ns)
    return ns


@functools.lru_cache(maxsize=1)
def _sglang():
    from typing import Any, Dict, List, Optional, Tuple

    import triton
    import triton.language as tl

    k = _load_defs(_KERNELS, ("write_zeros_to_output", "fused_moe_kernel_gptq_awq"),
                   {"triton": triton, "tl": tl, "torch": torch})
    # get_default_config reads get_exec().deterministic.enable_deterministic_inference (off in serving) and,
    # for fp8 only, the shared-memory probe; the int4_w4a16 branch uses neither.
    exec_ctx = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    c = _load_defs(_CONFIG, ("get_default_config",),
                   {"get_exec": lambda: exec_ctx, "_use_low_smem_fp8_default": lambda: False, "_is_hip": False,
                    "Optional": Optional, "List": List, "Dict": Dict, "Any": Any, "Tuple": Tuple,
                    "torch": torch, "triton": triton})
    return types.SimpleNamespace(kernel=k["fused_moe_kernel_gptq_awq"], get_default_config=c["get_default_config"],
                                 tl=tl, triton=triton)


def available() -> str | None:
    """None if SGLang's kernel can be loaded from the carried files, else a one-line reason."""
    try:
        _sglang()
    except Exception as e:  # noqa: BLE001
        return f"sglang {SGLANG_VERSION} W4A16 MoE kernel unavailable: {type(e).__name__}: {e}".splitlines()[0]
    return None


def sglang_config(M: int, E: int, N: int, K: int, topk: int) -> dict:
    """SGLang's default config for ``int4_w4a16`` (``get_default_config``, from SGLang's file)."""
    return dict(_sglang().get_default_config(M, E, N, K, topk, "int4_w4a16", False, [0, 32]))


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """SGLang's ``moe_align_block_size`` contract in torch ops (no host sync): ids outside
    ``[0, num_experts)`` -> -1 -> bucket 0; returns ``(sorted_token_ids int32, expert_ids int32,
    num_tokens_post_padded int32 [1])``."""
    dev = topk_ids.device
    numel = topk_ids.numel()
    nb = num_experts + 1
    if numel < nb:
        max_padded = numel * block_size
    else:
        max_padded = numel + nb * (block_size - 1)
    max_padded = (max_padded + 3) // 4 * 4
    max_blocks = -(-max_padded // block_size)

    ids = topk_ids.reshape(-1).to(torch.int64)
    bucket = torch.where((ids >= 0) & (ids < num_experts), ids + 1, torch.zeros_like(ids))
    counts = torch.zeros(nb, dtype=torch.int64, device=dev).scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    cum_pad = torch.cumsum(padded, 0)
    start_pad = cum_pad - padded
    start_cnt = torch.cumsum(counts, 0) - counts
    sorted_bucket, order = torch.sort(bucket, stable=True)
    pos = torch.arange(numel, device=dev) - start_cnt[sorted_bucket]
    dest = start_pad[sorted_bucket] + pos
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    total = cum_pad[-1:]
    block_start = torch.arange(max_blocks, device=dev, dtype=torch.int64) * block_size
    blk_bucket = torch.searchsorted(cum_pad, block_start, right=True)
    expert_ids = torch.where(block_start < total, blk_bucket - 1, torch.full_like(blk_bucket, -1)).to(torch.int32)
    return sorted_ids, expert_ids, total.to(torch.int32)


def _invoke(sg, A, B, C, B_scale, topk_weights, num_valid, sorted_ids, expert_ids, ntpp, mul_routed_weight,
            top_k, config, compute_type):
    """The ``fused_moe_kernel_gptq_awq`` launch of SGLang's ``invoke_fused_moe_kernel`` (int4_w4a16,
    ``block_shape=[0, 32]``, no zero point), arguments in the same order and meaning."""
    EM = sorted_ids.shape[0]
    N = B.shape[1]
    grid = (sg.triton.cdiv(EM, config["BLOCK_SIZE_M"]) * sg.triton.cdiv(N, config["BLOCK_SIZE_N"]),)
    K = B.shape[2]  # as SGLang: the packed K (K/2) decides even_Ks
    even_Ks = K % config["BLOCK_SIZE_K"] == 0
    sg.kernel[grid](
        A, B, C, B_scale, None, topk_weights, sorted_ids, expert_ids, ntpp,
        N, A.shape[1], EM, num_valid,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(-2), C.stride(-1),
        B_scale.stride(0), B_scale.stride(2), B_scale.stride(1), 0, 0, 0,
        group_size=32, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=compute_type,
        has_zp=False, use_int4_w4a16=True, use_int8_w8a16=False, even_Ks=even_Ks, **config)


def make_sglang_int4_moe(experts, topk: int, dtype):
    """``run(x [N, H], topk_idx [N, k] int32, topk_w [N, k] fp32) -> [N, H]`` with SGLang's W4A16 Triton kernel
    for both GEMMs. ``experts``: :class:`tritree.kernels.moe.int4.Int4Experts`; the layout conversion (a byte
    view of the same words, see the module docstring) happens here, once."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    if sys.byteorder != "little":
        raise RuntimeError("the int32 -> uint8 byte view assumes a little-endian host")
    sg = _sglang()
    E, I2, _ = experts.w13_packed.shape
    I = I2 // 2
    H = experts.w2_packed.shape[1]
    w1 = experts.w13_packed.contiguous().view(torch.uint8)  # [E, 2I, H/2]
    w2 = experts.w2_packed.contiguous().view(torch.uint8)   # [E, H, I/2]
    s1 = experts.w13_scale.contiguous()  # [E, 2I, H/32], the kernel reads it as fp32
    s2 = experts.w2_scale.contiguous()   # [E, H, I/32]
    assert w1.shape == (E, 2 * I, H // 2) and w2.shape == (E, H, I // 2)
    compute_type = sg.tl.bfloat16 if dtype == torch.bfloat16 else sg.tl.float16
    configs = {}

    def run(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        M, k = topk_idx.shape
        assert k == topk and x.shape == (M, H) and x.dtype == dtype
        cfg = configs.get(M)
        if cfg is None:
            cfg = configs[M] = sglang_config(M, E, H, I, topk)  # host-side, shape-only
            # the kernel loads B without a K mask: K must be a whole number of BLOCK_SIZE_K
            if H % cfg["BLOCK_SIZE_K"] or I % cfg["BLOCK_SIZE_K"]:
                raise ValueError(f"H={H} and I={I} must be multiples of BLOCK_SIZE_K={cfg['BLOCK_SIZE_K']}")
        tw = topk_w.to(torch.float32).contiguous()
        sorted_ids, expert_ids, ntpp = moe_align_block_size(topk_idx, cfg["BLOCK_SIZE_M"], E)
        c1 = torch.empty((M * k, 2 * I), device=x.device, dtype=dtype)
        _invoke(sg, x.contiguous(), w1, c1, s1, tw, M * k, sorted_ids, expert_ids, ntpp, False, k, cfg,
                compute_type)
        c2 = (F.silu(c1[:, :I].float()) * c1[:, I:].float()).to(dtype)
        c3 = torch.empty((M, k, H), device=x.device, dtype=dtype)
        _invoke(sg, c2, w2, c3, s2, tw, M * k, sorted_ids, expert_ids, ntpp, True, 1, cfg, compute_type)
        return c3.sum(dim=1, dtype=torch.float32).to(dtype)

    return run


def _patch_interpreter_bf16_dot() -> None:
    """Two bf16 defects of Triton's CPU interpreter (3.9), fixed for the self-test under ``TRITON_INTERPRET=1``
    only (nothing of SGLang's code changes): it keeps bf16 as uint16 and its ``create_dot`` multiplies those
    integers (garbage for any bf16 ``tl.dot``): bf16 dot operands are widened to fp32 (exact) first; and its
    fp32 -> bf16 cast truncates where the GPU rounds to nearest even: replaced by a round-to-nearest-even."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    orig = interp.InterpreterBuilder.create_dot
    if getattr(orig, "_bf16_widened", False):
        return

    def widen(h):
        if h.dtype == tl.bfloat16:
            return interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot(self, a, b, d, *args, **kwargs):
        return orig(self, widen(a), widen(b), d, *args, **kwargs)

    orig_cast = interp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            u = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            r = np.where(np.isnan(src.data), np.uint16(0x7FC0), r)
            return interp.TensorHandle(r, tl.bfloat16)
        return orig_cast(self, src, dst_type)

    create_dot._bf16_widened = True
    interp.InterpreterBuilder.create_dot = create_dot
    interp.InterpreterBuilder.cast_impl = cast_impl


def _self_test() -> int:
    from tritree.kernels.moe.int4 import Int4Experts, moe_int4_reference

    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        _patch_interpreter_bf16_dot()

    reason = available()
    if reason:
        print(reason)
        return 1
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"
    torch.manual_seed(0)
    fails = 0
    cases = [  # (E, H, I, N, k, dtype, foreign ids)
        (4, 64, 64, 3, 2, torch.bfloat16, False),
        (4, 64, 64, 3, 2, torch.bfloat16, True),
        (4, 128, 64, 9, 2, torch.bfloat16, True),   # M > E: the 64/64/32/8 config
        (4, 64, 128, 5, 3, torch.float16, True),
    ]
    for E, H, I, N, k, dtype, foreign in cases:
        wg = torch.randn(E, I, H) / H ** 0.5
        wu = torch.randn(E, I, H) / H ** 0.5
        wd = torch.randn(E, H, I) / I ** 0.5
        ex = Int4Experts.quantize(wg, wu, wd)
        ex = Int4Experts(*(t.to(dev) for t in (ex.w13_packed, ex.w13_scale, ex.w2_packed, ex.w2_scale)))
        x = torch.randn(N, H).to(dtype).to(dev)
        idx = torch.stack([torch.randperm(E)[:k] for _ in range(N)]).to(torch.int32)
        if foreign:
            idx[0, 0] = E          # another rank's expert
            idx[-1, -1] = -1
            idx[N // 2, 0] = E + 3
        idx = idx.to(dev)
        w = torch.softmax(torch.randn(N, k), -1).to(dev)
        run = make_sglang_int4_moe(ex, k, dtype)
        out = run(x, idx, w)
        ref = moe_int4_reference(x, idx, w, ex).double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        mx = (out.double() - ref).abs().max().item()
        cfg = sglang_config(N, E, H, I, k)
        ok = err < 1e-2
        fails += not ok
        print(f"E={E} H={H} I={I} N={N} k={k} {str(dtype)[6:]} foreign={foreign} cfg={cfg}: "
              f"rel_err={err:.2e} max_abs={mx:.2e} {'OK' if ok else 'FAIL'}")
    return int(fails > 0)


if __name__ == "__main__":
    sys.exit(_self_test())
