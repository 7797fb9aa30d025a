"""Routed experts with INT4 weights kept packed (W4A16): grouped SwiGLU over 4-bit experts, without a host sync.

Layout (:class:`Int4Experts`): the compressed-tensors ``pack-quantized`` checkpoint layout (docs/SPEC.md
section 7), stacked per layer, gate and up concatenated on the output dimension:

- ``w13_packed`` int32 ``[E, 2I, H/8]``: rows ``[0, I)`` gate, ``[I, 2I)`` up; nibble ``j`` of word ``c``
  (least significant first) is input column ``8c + j``, stored as ``q + 8`` with ``q`` in ``[-8, 7]``;
- ``w13_scale`` bf16 ``[E, 2I, H/32]``: one scale a 32-column group; ``W = q * scale`` (no zero point);
- ``w2_packed`` int32 ``[E, H, I/8]`` and ``w2_scale`` bf16 ``[E, H, I/32]``: down, the same way.

0.5 B a weight plus a bf16 scale per 32 weights, as in the checkpoint (no repacking at load).

Kernels (one plan per shape, :func:`plan_int4_moe`):

1. routing align (:func:`align_routing`, torch ops on the device): assignments sorted by expert, cut into
   blocks of ``block_m`` rows, a static upper bound of ``cdiv(N k, block_m) + min(E, N k)`` blocks;
   blocks past the last used one map to expert ``E`` and exit before touching any weight.
2. gate_up: ``h = silu(x Wg^T) * (x Wu^T)`` per block, the INT4 tiles dequantised in registers (nibble
   shift and mask, ``(u - 8) * scale`` in fp32, one scale load per 32-column group, rounded once to the
   activation dtype). With split-K the raw gate/up sums go to an fp32 buffer by atomics and the SiLU-and-mul
   moves into the down kernel's load.
3. down: ``out[token] += topk_w * (h Wd^T)``: routed weight and top-k combine fused (fp32 atomics; split-K
   partials add the same way), cast to the activation dtype at the end.

Swap-AB (``swap_ab``): the weight tile's output rows on the MMA's M and the block's tokens on N, so a block
of a few tokens does not pad the MMA's M (Hopper's wgmma needs 64 rows on M). The int4 -> 16-bit conversion
is plain shift/mask/convert (the inline-asm magic-number conversion has no interpreter path: not used).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _validate as V
from .configs import arch_of, num_sms

GROUP = 32  # input columns per scale (compressed-tensors group size of the K2.x routed experts)
ACT_DTYPES = (torch.bfloat16, torch.float16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------------------------------
# Layout: packing, stacking, sharding
# --------------------------------------------------------------------------------------------------

def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``q [..., out, in]`` integers in ``[-8, 7]`` -> ``[..., out, in/8]`` int32, column ``8c + j`` in bits
    ``4j .. 4j+3`` of word ``c``, stored as ``q + 8`` (the compressed-tensors packing)."""
    if q.shape[-1] % 8:
        raise ValueError(f"q's last dimension must be a multiple of 8, got {tuple(q.shape)}")
    u = (q.to(torch.int64) + 8).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    if bool(((u < 0) | (u > 15)).any()):
        raise ValueError("q must be in [-8, 7]")
    words = (u << (4 * torch.arange(8, device=q.device))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: ``[..., out, in/8]`` int32 -> ``[..., out, in]`` int8 in ``[-8, 7]``."""
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    u = (packed[..., None] >> shifts) & 0xF
    return (u - 8).to(torch.int8).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group quantisation as compressed-tensors does it: ``scale = amax / 7.5`` per ``group``
    input columns (rounded to bf16 first), ``q = clamp(round(w / scale), -8, 7)``. ``w [..., out, in]``
    -> ``(packed [..., out, in/8] int32, scale [..., out, in/group] bf16)``."""
    if w.shape[-1] % group:
        raise ValueError(f"w's last dimension ({w.shape[-1]}) must be a multiple of the group size {group}")
    g = w.float().reshape(*w.shape[:-1], w.shape[-1] // group, group)
    scale = (g.abs().amax(-1) / 7.5).clamp_min(1e-10).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).reshape(w.shape)
    return pack_int4(q), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """``[..., out, in]`` weights of ``packed [..., out, in/8]`` and ``scale [..., out, in/32]``."""
    q = unpack_int4(packed).to(torch.float64 if dtype == torch.float64 else torch.float32)
    return (q * scale.to(q.dtype).repeat_interleave(GROUP, dim=-1)).to(dtype)


@dataclass(frozen=True)
class Int4Experts:
    """One layer's routed experts, INT4 (see the module docstring for the layout and shapes).

    ``w13_packed [E, 2I, H/8]`` int32, ``w13_scale [E, 2I, H/32]`` bf16 (gate rows then up rows),
    ``w2_packed [E, H, I/8]`` int32, ``w2_scale [E, H, I/32]`` bf16."""

    w13_packed: torch.Tensor
    w13_scale: torch.Tensor
    w2_packed: torch.Tensor
    w2_scale: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w13_packed.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2_packed.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w13_packed.shape[1] // 2

    @classmethod
    def from_checkpoint(cls, gate_packed, gate_scale, up_packed, up_scale, down_packed, down_scale) -> "Int4Experts":
        """From per-expert checkpoint tensors (lists of ``[I, H/8]``/``[I, H/32]`` gate and up,
        ``[H, I/8]``/``[H, I/32]`` down) or already stacked ``[E, ...]`` ones."""
        def st(ts):
            return ts if isinstance(ts, torch.Tensor) else torch.stack(list(ts))
        gp, gs, upk, us = st(gate_packed), st(gate_scale), st(up_packed), st(up_scale)
        return cls(torch.cat([gp, upk], 1).contiguous(), torch.cat([gs, us], 1).to(torch.bfloat16).contiguous(),
                   st(down_packed).contiguous(), st(down_scale).to(torch.bfloat16).contiguous())

    @classmethod
    def quantize(cls, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> "Int4Experts":
        """From float weights ``w_gate/w_up [E, I, H]``, ``w_down [E, H, I]`` (:func:`quantize_int4`)."""
        (gp, gs), (upk, us), (dp, ds) = (quantize_int4(w) for w in (w_gate, w_up, w_down))
        return cls.from_checkpoint(gp, gs, upk, us, dp, ds)

    def dequantize(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w_gate [E, I, H], w_up [E, I, H], w_down [E, H, I])`` in ``dtype``."""
        w13 = dequantize_int4(self.w13_packed, self.w13_scale, dtype)
        I = self.intermediate
        return w13[:, :I], w13[:, I:], dequantize_int4(self.w2_packed, self.w2_scale, dtype)

    def shard_tp(self, rank: int, world: int) -> "Int4Experts":
        """Tensor-parallel shard ``rank`` of ``world``: the intermediate dimension I split in equal parts on
        32-column group boundaries (gate/up rows, down's input columns, packed words and scales alike). The
        ranks' outputs sum to the unsharded layer's."""
        I = self.intermediate
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world), got rank={rank}, world={world}")
        if I % (world * GROUP):
            raise ValueError(f"the intermediate size {I} must split into {world} parts of whole {GROUP}-column "
                             f"groups")
        s = I // world
        rows = torch.cat([torch.arange(rank * s, (rank + 1) * s), I + torch.arange(rank * s, (rank + 1) * s)])
        rows = rows.to(self.w13_packed.device)
        return Int4Experts(self.w13_packed[:, rows].contiguous(), self.w13_scale[:, rows].contiguous(),
                           self.w2_packed[:, :, rank * s // 8:(rank + 1) * s // 8].contiguous(),
                           self.w2_scale[:, :, rank * s // GROUP:(rank + 1) * s // GROUP].contiguous())

    def shard_ep(self, rank: int, world: int) -> tuple["Int4Experts", int]:
        """Expert-parallel shard: experts ``[rank E/world, (rank + 1) E/world)`` and the first one's id.
        Route with ``topk_idx - first``: ids outside ``[0, E/world)`` are another rank's and are skipped."""
        E = self.num_experts
        if world < 1 or not 0 <= rank < world or E % world:
            raise ValueError(f"{E} experts do not split into {world} equal parts for rank {rank}")
        lo, hi = rank * E // world, (rank + 1) * E // world
        return Int4Experts(self.w13_packed[lo:hi], self.w13_scale[lo:hi], self.w2_packed[lo:hi],
                           self.w2_scale[lo:hi]), lo


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def moe_int4_reference(x, topk_idx, topk_w, experts: Int4Experts, dtype=torch.float64) -> torch.Tensor:
    """Loop over experts on the dequantised weights, in ``dtype`` (the specification). ``x [N, H]``,
    ``topk_idx/topk_w [N, k]`` -> ``[N, H]`` in ``dtype``; ids outside ``[0, E)`` are skipped."""
    wg, wu, wd = experts.dequantize(dtype)
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for e in range(experts.num_experts):
        tok, slot = torch.nonzero(topk_idx == e, as_tuple=True)
        if tok.numel():
            xe = x[tok].to(dtype)
            h = F.silu(xe @ wg[e].t()) * (xe @ wu[e].t())
            out.index_add_(0, tok, (h @ wd[e].t()) * topk_w[tok, slot, None].to(dtype))
    return out


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------

@triton.jit
def _dequant_tile(Wp, Ws, e, n, n_ok, k0, K, stride_pe, stride_pn, stride_se, stride_sn,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """Rows ``n [BLOCK_N]`` x columns ``[k0, k0 + BLOCK_K)`` of expert ``e``'s INT4 weight -> ``[BLOCK_N,
    BLOCK_K]`` in ``DTYPE``. One load a packed word, one a 32-column scale; columns past ``K`` are 0."""
    c = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    words = tl.load(Wp + e * stride_pe + n[:, None].to(tl.int64) * stride_pn + c[None, :],
                    mask=n_ok[:, None] & (c < K // 8)[None, :], other=0)
    s = tl.load(Ws + e * stride_se + n[:, None].to(tl.int64) * stride_sn + g[None, :],
                mask=n_ok[:, None] & (g < K // 32)[None, :], other=0.0).to(tl.float32)
    u = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF  # [BN, BK/8, 8]: column 8c + j
    q = tl.reshape(u, [BLOCK_N, BLOCK_K // 32, 32]).to(tl.float32) - 8.0
    return tl.reshape(q * s[:, :, None], [BLOCK_N, BLOCK_K]).to(DTYPE)


@triton.jit
def _mma(acc, a_rows, w, SWAP_AB: tl.constexpr, UPCAST: tl.constexpr):
    """``acc += a_rows w^T`` as ``[M, N]``, or swapped ``acc += w a_rows^T`` as ``[N, M]``.
    ``a_rows [BM, BK]``, ``w [BN, BK]``. UPCAST (interpreter, where 16-bit dots are unreliable): fp32 dots
    of the same 16-bit values."""
    if SWAP_AB:
        lhs, rhs = w, tl.trans(a_rows)
    else:
        lhs, rhs = a_rows, tl.trans(w)
    if UPCAST:
        return tl.dot(lhs.to(tl.float32), rhs.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(lhs, rhs, acc)


@triton.jit
def _k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's slice ``[lo, hi)`` of the K loop: whole ``BLOCK_K`` tiles, split ``SPLIT_K`` ways."""
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    lo = tl.program_id(2) * per
    return lo, tl.minimum(K, lo + per)


@triton.jit
def _gate_up_int4_kernel(X, Wp, Ws, Hbuf, BlockExpert, BlockStart, BlockEnd, SortedIdx, E, Hd, I,
                         stride_x, stride_pe, stride_pn, stride_se, stride_sn, stride_h,
                         TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, UPCAST: tl.constexpr):
    """Grid ``(blocks, cdiv(I, BLOCK_N), SPLIT_K)``. ``SPLIT_K == 1``: ``Hbuf [N k, I]`` (x's dtype) gets
    ``silu(g) * u`` at the block's sorted rows; else ``Hbuf [N k, 2I]`` fp32 (zeroed) gets ``g | u`` partials
    by atomics."""
    b = tl.program_id(0)
    e = tl.load(BlockExpert + b)
    if e < E:  # blocks past the last used one own no rows: no weight is read for them
        start = tl.load(BlockStart + b)
        end = tl.load(BlockEnd + b)
        r = start + tl.arange(0, BLOCK_M)
        ok = r < end
        tok = tl.load(SortedIdx + r, mask=ok, other=0) // TOPK
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < I
        e64 = e.to(tl.int64)
        if SWAP_AB:
            acc_g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros_like(acc_g)
        lo, hi = _k_range(Hd, BLOCK_K, SPLIT_K)
        for k0 in range(lo, hi, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xa = tl.load(X + tok.to(tl.int64)[:, None] * stride_x + k[None, :], mask=ok[:, None] & (k < Hd)[None, :],
                         other=0.0)
            wg = _dequant_tile(Wp, Ws, e64, n, n_ok, k0, Hd, stride_pe, stride_pn, stride_se, stride_sn,
                               BLOCK_N, BLOCK_K, X.dtype.element_ty)
            acc_g = _mma(acc_g, xa, wg, SWAP_AB, UPCAST)
            wu = _dequant_tile(Wp, Ws, e64, n + I, n_ok, k0, Hd, stride_pe, stride_pn, stride_se, stride_sn,
                               BLOCK_N, BLOCK_K, X.dtype.element_ty)
            acc_u = _mma(acc_u, xa, wu, SWAP_AB, UPCAST)
        if SWAP_AB:
            g, u = tl.trans(acc_g), tl.trans(acc_u)
        else:
            g, u = acc_g, acc_u
        dst = Hbuf + r.to(tl.int64)[:, None] * stride_h + n[None, :]
        mask = ok[:, None] & n_ok[None, :]
        if SPLIT_K == 1:
            tl.store(dst, (g * tl.sigmoid(g) * u).to(Hbuf.dtype.element_ty), mask=mask)
        else:
            tl.atomic_add(dst, g, mask=mask, sem="relaxed")
            tl.atomic_add(dst + I, u, mask=mask, sem="relaxed")


@triton.jit
def _down_int4_kernel(Hbuf, Wp, Ws, Out, TopkW, BlockExpert, BlockStart, BlockEnd, SortedIdx, E, Hd, I,
                      stride_h, stride_pe, stride_pn, stride_se, stride_sn, stride_o,
                      TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, ACT_IN_LOAD: tl.constexpr,
                      DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """Grid ``(blocks, cdiv(H, BLOCK_N), SPLIT_K)``: ``Out [N, H]`` fp32 (zeroed) ``+= topk_w h Wd^T`` by
    atomics. ``ACT_IN_LOAD``: ``Hbuf`` holds fp32 ``g | u`` and ``h = silu(g) * u`` is formed on load
    (rounded to ``DTYPE``, as the unsplit path stores it)."""
    b = tl.program_id(0)
    e = tl.load(BlockExpert + b)
    if e < E:
        start = tl.load(BlockStart + b)
        end = tl.load(BlockEnd + b)
        r = start + tl.arange(0, BLOCK_M)
        ok = r < end
        a = tl.load(SortedIdx + r, mask=ok, other=0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < Hd
        e64 = e.to(tl.int64)
        if SWAP_AB:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        lo, hi = _k_range(I, BLOCK_K, SPLIT_K)
        for k0 in range(lo, hi, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            src = Hbuf + r.to(tl.int64)[:, None] * stride_h + k[None, :]
            hmask = ok[:, None] & (k < I)[None, :]
            if ACT_IN_LOAD:
                g = tl.load(src, mask=hmask, other=0.0)
                u = tl.load(src + I, mask=hmask, other=0.0)
                h = (g * tl.sigmoid(g) * u).to(DTYPE)
            else:
                h = tl.load(src, mask=hmask, other=0.0)
            w = _dequant_tile(Wp, Ws, e64, n, n_ok, k0, I, stride_pe, stride_pn, stride_se, stride_sn,
                              BLOCK_N, BLOCK_K, DTYPE)
            acc = _mma(acc, h, w, SWAP_AB, UPCAST)
        if SWAP_AB:
            y = tl.trans(acc)
        else:
            y = acc
        wt = tl.load(TopkW + a, mask=ok, other=0.0).to(tl.float32)
        tok = (a // TOPK).to(tl.int64)
        tl.atomic_add(Out + tok[:, None] * stride_o + n[None, :], y * wt[:, None], mask=ok[:, None] & n_ok[None, :],
                      sem="relaxed")


# --------------------------------------------------------------------------------------------------
# Configs and the plan
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Int4MoeConfig:
    """Tiles of the two grouped kernels for one bucket of rows per expert.

    block_m: sorted rows (token x expert assignments) per block, shared by both kernels (one align).
    gate_up / down: ``(block_n, block_k, num_warps, num_stages)``: output rows of the weight tile, K tile
        (a multiple of 32: whole scale groups), as in ``triton.Config``.
    swap_ab: weight rows on the MMA's M, tokens on N (few tokens a block).
    """

    block_m: int
    gate_up: tuple[int, int, int, int]
    down: tuple[int, int, int, int]
    swap_ab: bool


# Bucket of expected rows per used expert (``plan_int4_moe``) -> config; the first bucket >= the rows.
# Not yet measured on a GPU: sizes chosen for bandwidth (the weights are read once per block, so few wide
# blocks) and bounded by the ahead-of-time audit (tests/kernels/test_aot_audit.py). sm_120: mma.sync,
# 101,376 B of shared memory, no spills; sm_90: wgmma wants 64 weight rows on M (swap-AB at few tokens).
INT4_MOE_CONFIGS: dict[str, dict[int, Int4MoeConfig]] = {
    "sm_90": {
        16: Int4MoeConfig(16, (64, 128, 4, 3), (64, 128, 4, 3), swap_ab=True),
        64: Int4MoeConfig(32, (128, 64, 8, 3), (128, 64, 8, 3), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (128, 64, 8, 3), (128, 64, 8, 3), swap_ab=False),
    },
    # Registers (unsplit / split-K, compiled for sm_120): BM16 126-127 gate_up, 96-145 down; BM32 160-167,
    # 127-147; BM64 231-255, 105-142. The down kernel spills at BM16 with BK128 and at BM64 with BK64 when
    # split (it forms the SiLU-and-mul on load), hence the narrower K tiles there.
    "sm_120": {
        16: Int4MoeConfig(16, (64, 64, 4, 2), (64, 64, 4, 2), swap_ab=True),
        64: Int4MoeConfig(32, (64, 64, 4, 2), (64, 64, 4, 2), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (64, 64, 8, 2), (64, 32, 8, 2), swap_ab=False),
    },
    "sm_80": {
        16: Int4MoeConfig(16, (64, 64, 4, 2), (64, 64, 4, 2), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (64, 64, 8, 2), (64, 64, 8, 2), swap_ab=False),
    },
    # Interpreter: few programs (each interpreted operation costs the same at any tile size).
    "cpu": {
        1 << 30: Int4MoeConfig(16, (64, 64, 4, 1), (64, 64, 4, 1), swap_ab=True),
    },
}

MAX_SPLIT_K = 8


@dataclass(frozen=True)
class Int4MoePlan:
    """Everything a launch needs, from static shapes only (no device value is read: graph-capturable).

    num_blocks: grid bound of the align, ``cdiv(N k, block_m) + min(E, N k)``.
    gate_up_split / down_split: K splits (>1 when the output tiles of the expected used experts leave SMs
        idle; gate_up's split moves the SiLU-and-mul into the down kernel's load).
    """

    config: Int4MoeConfig
    num_blocks: int
    gate_up_split: int
    down_split: int

    @property
    def block_m(self) -> int:
        return self.config.block_m

    def as_ints(self) -> list[int]:
        """The plan as the op's ``int[]`` argument (:meth:`from_ints` inverts it)."""
        c = self.config
        return [c.block_m, *c.gate_up, *c.down, int(c.swap_ab), self.num_blocks, self.gate_up_split, self.down_split]

    @classmethod
    def from_ints(cls, v) -> "Int4MoePlan":
        v = [int(a) for a in v]
        return cls(Int4MoeConfig(v[0], tuple(v[1:5]), tuple(v[5:9]), bool(v[9])), v[10], v[11], v[12])


def min_blocks(assignments: int, E: int, block_m: int) -> int:
    """Blocks enough for any routing: every used expert adds at most one part-filled block."""
    return -(-assignments // block_m) + max(1, min(E, assignments))


def _split_for(programs: int, k_tiles: int, sms: int) -> int:
    """K splits that bring ``programs`` up to about the SM count, never more than the K tiles."""
    if programs >= sms:
        return 1
    return max(1, min(MAX_SPLIT_K, k_tiles, -(-sms // programs)))


@functools.lru_cache(maxsize=1024)
def plan_int4_moe(N: int, topk: int, E: int, H: int, I: int, arch: str, sms: int,
                  config: Int4MoeConfig | None = None) -> Int4MoePlan:
    """The launch plan of one shape, computed once: the config (by expected rows per used expert under
    uniform routing), the block bound (any routing), the K splits for ``sms`` SMs (by the expected blocks).
    ``config`` replaces the table's."""
    A = N * topk
    # Expected distinct experts of N tokens' top-k under uniform routing (N = 17, k = 8, E = 384: 116).
    used = max(1, min(E, A, math.ceil(E * (1 - (1 - min(1.0, topk / E)) ** N))))
    rows = -(-A // used)
    if config is None:
        table = INT4_MOE_CONFIGS[arch if arch in INT4_MOE_CONFIGS else "sm_80"]
        config = next((table[b] for b in sorted(table) if rows <= b), table[max(table)])
    bm = config.block_m
    blocks_used = max(1, used * -(-rows // bm))  # expected blocks that own rows
    gbn, gbk = config.gate_up[:2]
    dbn, dbk = config.down[:2]
    gate_up_split = _split_for(blocks_used * -(-I // gbn), -(-H // gbk), sms)
    down_split = _split_for(blocks_used * -(-H // dbn), -(-I // dbk), sms)
    return Int4MoePlan(config, min_blocks(A, E, bm), gate_up_split, down_split)


# --------------------------------------------------------------------------------------------------
# Routing align and launch
# --------------------------------------------------------------------------------------------------

def align_routing(topk_idx: torch.Tensor, E: int, block_m: int, num_blocks: int):
    """Token x expert assignments sorted by expert and cut into blocks, on the device (no host sync).

    ``topk_idx [N, k]`` -> ``(sorted_idx [N k] int32`` assignment ids ``t k + j`` sorted by expert (stable;
    ids outside ``[0, E)`` last, in no block), ``block_expert, block_start, block_end [num_blocks] int32)``:
    block ``b`` owns sorted rows ``[block_start, min(block_start + block_m, block_end))`` of expert
    ``block_expert``; blocks past the last used one have ``block_expert == E``."""
    flat = topk_idx.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < E), flat, E)  # another rank's experts: bucket E, read by no block
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=key.device).scatter_add_(0, key, torch.ones_like(key))[:E]
    seg_end = torch.cumsum(counts, 0)
    blocks = (counts + block_m - 1) // block_m
    cum_blocks = torch.cumsum(blocks, 0)
    bidx = torch.arange(num_blocks, device=key.device)
    block_expert = torch.searchsorted(cum_blocks, bidx, right=True)
    e_c = block_expert.clamp(max=E - 1)
    block_start = seg_end[e_c] - counts[e_c] + (bidx - (cum_blocks[e_c] - blocks[e_c])) * block_m
    return (order.to(torch.int32), block_expert.to(torch.int32), block_start.to(torch.int32),
            seg_end[e_c].to(torch.int32))


def _validate(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale) -> None:
    V.check_tensor("x", x, ndim=2, dtypes=ACT_DTYPES)
    dev = x.device
    V.check_tensor("topk_idx", topk_idx, ndim=2, dtypes=(torch.int32, torch.int64), device=dev)
    V.check_tensor("topk_w", topk_w, ndim=2, dtypes=(torch.float32, torch.bfloat16, torch.float16), device=dev)
    V.check_tensor("w13_packed", w13_packed, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_tensor("w13_scale", w13_scale, ndim=3, dtypes=(torch.bfloat16,), device=dev)
    V.check_tensor("w2_packed", w2_packed, ndim=3, dtypes=(torch.int32,), device=dev)
    V.check_tensor("w2_scale", w2_scale, ndim=3, dtypes=(torch.bfloat16,), device=dev)
    N, H = x.shape
    E, I2, _ = w13_packed.shape
    if E < 1:
        raise ValueError(f"w13_packed must hold at least one expert, got shape {tuple(w13_packed.shape)}")
    if H % GROUP:
        raise ValueError(f"x: the hidden size {H} must be a multiple of the group size {GROUP}")
    if I2 % 2 or (I2 // 2) % GROUP:
        raise ValueError(f"w13_packed: 2I = {I2} rows must be gate and up halves of a multiple of {GROUP}")
    I = I2 // 2
    if topk_w.shape != topk_idx.shape or topk_idx.shape[0] != N:
        raise ValueError(f"topk_idx and topk_w must both have shape [N, k] with N = {N}, got "
                         f"{tuple(topk_idx.shape)} and {tuple(topk_w.shape)}")
    V.check_shape("w13_packed", w13_packed, (E, 2 * I, H // 8), "[E, 2I, H/8]")
    V.check_shape("w13_scale", w13_scale, (E, 2 * I, H // GROUP), f"[E, 2I, H/{GROUP}]")
    V.check_shape("w2_packed", w2_packed, (E, H, I // 8), "[E, H, I/8]")
    V.check_shape("w2_scale", w2_scale, (E, H, I // GROUP), f"[E, H, I/{GROUP}]")
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale), ("w2_packed", w2_packed),
                    ("w2_scale", w2_scale)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")


def routed_experts_int4(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, experts: Int4Experts,
                        *, out: torch.Tensor | None = None, plan: Int4MoePlan | None = None) -> torch.Tensor:
    """Grouped routed-expert SwiGLU over INT4 experts (W4A16; see module).

    ``x [N, H]`` bf16/fp16, ``topk_idx [N, k]`` int32/int64 (ids outside ``[0, E)`` skipped: expert
    parallelism), ``topk_w [N, k]`` float -> ``[N, H]`` in x's dtype, written to ``out`` when given.
    ``plan`` replaces :func:`plan_int4_moe`'s (tests, tuning). No host sync: CUDA-graph capturable once warm.
    Runs as the op ``tritree::routed_experts_int4`` (opaque to torch.compile, with a fake impl)."""
    _validate(x, topk_idx, topk_w, experts.w13_packed, experts.w13_scale, experts.w2_packed, experts.w2_scale)
    N, H = x.shape
    k, E, I = topk_idx.shape[1], experts.num_experts, experts.intermediate
    if out is not None:
        V.check_tensor("out", out, dtypes=(x.dtype,), device=x.device)
        V.check_shape("out", out, (N, H), "[N, H]")
    if plan is None:  # a pure function of ints: traced through uncached under torch.compile
        planner = plan_int4_moe.__wrapped__ if torch.compiler.is_compiling() else plan_int4_moe
        plan = planner(N, k, E, H, I, arch_of(x.device), num_sms(x.device))
    elif plan.num_blocks < min_blocks(N * k, E, plan.block_m):
        raise ValueError(f"plan.num_blocks = {plan.num_blocks} is below the bound "
                         f"{min_blocks(N * k, E, plan.block_m)} of {N * k} assignments in blocks of {plan.block_m}")
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or topk_w.requires_grad)
    if needs_grad or (x.device.type != "cuda" and not _interpreting()):  # the kernels have no backward
        res = moe_int4_reference(x, topk_idx, topk_w, experts, dtype=torch.float32).to(x.dtype)
        return res if out is None else out.copy_(res)
    if out is None:
        out = torch.empty_like(x)
    _routed_experts_int4_op(x, topk_idx, topk_w, experts.w13_packed, experts.w13_scale, experts.w2_packed,
                            experts.w2_scale, out, plan.as_ints())
    return out


@torch.library.custom_op("tritree::routed_experts_int4", mutates_args=("out",))
def _routed_experts_int4_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, w13_packed: torch.Tensor,
                            w13_scale: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor,
                            out: torch.Tensor, plan: list[int]) -> None:
    # Opaque (not traced into): the down kernel accumulates by atomics into a buffer the op zeroes, which
    # Inductor mishandled for the bf16 kernels (moe.py).
    _launch(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, Int4MoePlan.from_ints(plan))


@_routed_experts_int4_op.register_fake
def _(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, plan):
    return None


def _launch(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, plan: Int4MoePlan) -> None:
    N, H = x.shape
    E, I2, _ = w13_packed.shape
    I, k = I2 // 2, topk_idx.shape[1]
    cfg = plan.config
    sorted_idx, block_expert, block_start, block_end = align_routing(topk_idx, E, cfg.block_m, plan.num_blocks)
    split_gu = plan.gate_up_split > 1
    if split_gu:
        hbuf = torch.zeros(N * k, 2 * I, dtype=torch.float32, device=x.device)
    else:
        hbuf = torch.empty(N * k, I, dtype=x.dtype, device=x.device)
    acc = torch.zeros(N, H, dtype=torch.float32, device=x.device)
    upcast = _interpreting()
    xc = x.contiguous()
    gbn, gbk, gw, gs = cfg.gate_up
    _gate_up_int4_kernel[(plan.num_blocks, triton.cdiv(I, gbn), plan.gate_up_split)](
        xc, w13_packed, w13_scale, hbuf, block_expert, block_start, block_end, sorted_idx, E, H, I,
        xc.stride(0), w13_packed.stride(0), w13_packed.stride(1), w13_scale.stride(0), w13_scale.stride(1),
        hbuf.stride(0), TOPK=k, BLOCK_M=cfg.block_m, BLOCK_N=gbn, BLOCK_K=gbk, SPLIT_K=plan.gate_up_split,
        SWAP_AB=cfg.swap_ab, UPCAST=upcast, num_warps=gw, num_stages=gs)
    dbn, dbk, dw, ds = cfg.down
    tw = topk_w.reshape(-1).contiguous()
    _down_int4_kernel[(plan.num_blocks, triton.cdiv(H, dbn), plan.down_split)](
        hbuf, w2_packed, w2_scale, acc, tw, block_expert, block_start, block_end, sorted_idx, E, H, I,
        hbuf.stride(0), w2_packed.stride(0), w2_packed.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        acc.stride(0), TOPK=k, BLOCK_M=cfg.block_m, BLOCK_N=dbn, BLOCK_K=dbk, SPLIT_K=plan.down_split,
        SWAP_AB=cfg.swap_ab, ACT_IN_LOAD=split_gu, DTYPE=_TL_DTYPE[x.dtype], UPCAST=upcast,
        num_warps=dw, num_stages=ds)
    out.copy_(acc)


_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
