"""The Triton W4A16 grouped-expert kernels over :class:`~tritree.kernels.moe.int4.Int4Experts` in the
checkpoint layout (the CPU interpreter; GPUs without the Gluon ``mma.sync`` kernels of
:mod:`tritree.kernels.moe.int4_mma`), their configs and plan.

Kernels (one plan per shape, :func:`plan_int4_moe`):

1. routing align (:func:`align_routing`, one single-program kernel): assignments grouped by expert, cut
   into blocks of ``block_m`` rows, a static upper bound of ``cdiv(N k, block_m) + min(E, N k)`` blocks;
   blocks past the last used one map to expert ``E`` and exit before touching any weight.
2. gate_up: ``h = silu(x Wg^T) * (x Wu^T)`` per block. A weight tile of ``block_n`` rows is ``block_n / 2`` gate
   rows over the same up rows (one MMA, one accumulator: half the registers of two tiles, so more programs
   an SM keep loads in flight); the INT4 tiles are dequantised in registers (:func:`_magic_pairs`: one mask and
   one packed FMA for two bf16 weights).
   With split-K the raw gate/up sums go to an fp32 buffer by atomics and the SiLU-and-mul moves into the
   down kernel's load.
3. down: ``out[token] += topk_w * (h Wd^T)``: routed weight and top-k combine fused (fp32 atomics; split-K
   partials add the same way), cast to the activation dtype at the end.

The dequantised tile's columns are permuted within each K tile so that the MMA's register-operand fragment of
a thread is the nibbles of adjacent packed words it loads as one vector (:func:`nibble_order`); the
activations are laid out in that order once per call (x, padded to whole tiles; the gate_up kernel stores h
in the down kernel's order): the dot's sum over K does not depend on the order of its columns, no shuffle
across threads is needed and the activation tiles load as contiguous vectors. Pointers advance by a tile per
K step; shapes whose K and output rows are multiples of the tiles (Kimi K2.6's) load without masks.

Swap-AB (``swap_ab``): the weight tile's output rows on the MMA's M and the block's tokens on N, so a block
of a few tokens does not pad the MMA's M (Hopper's wgmma needs 64 rows on M).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._launch import interpreting
from ..configs import lookup
from .align import align_routing, min_blocks

# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------

def _magic_asm(one: str, bias: str, magic: str, ty: str) -> str:
    """PTX of :func:`_magic_pairs` for fp16: ``1.0`` and ``-(1024 + 8)`` as packed pairs, the magic number
    ``1024.0`` whose low mantissa bits take a nibble, the packed FMA type."""
    return f"""{{
    .reg .b32 t, one, bias, s2, nz;
    mov.b32 one, {one};
    mov.b32 bias, {bias};
    mov.b32 nz, 0x80008000;
    lop3.b32 t, $2, 0x000F000F, {magic}, 0xEA;
    fma.rn.{ty} t, t, one, bias;
    mov.b32 s2, {{$3, $3}};
    fma.rn.{ty} t, t, s2, nz;
    mov.b32 {{$0, $1}}, t;
    }}"""


# bf16: the two nibbles masked into a pair of subnormals ``u 2^-133`` (exponent field 0: no bias to remove),
# then one FMA with the scale raised by 2^BF16_SCALE_EXP and ``-8 u``'s share, ``-s 2^(BF16_SCALE_EXP - 130)``,
# both exact powers of two of ``s`` (one pair a scale: shared by the 16 pairs of a group after CSE):
# ``(u - 8) s 2^(BF16_SCALE_EXP - 133)`` rounded once, the same bits as ``q s`` scaled by a power of two.
BF16_SCALE_EXP = 100
BF16_OUT_SCALE = 2.0 ** (133 - BF16_SCALE_EXP)  # what the bf16 kernels' fp32 sums are multiplied by
_MAGIC_BF16 = tl.constexpr("""{
    .reg .b32 t, s2, sp, b, up, dn, nz;
    mov.b32 up, 0x71807180;
    mov.b32 dn, 0xB080B080;
    mov.b32 nz, 0x80008000;
    mov.b32 s2, {$3, $3};
    fma.rn.bf16x2 sp, s2, up, nz;
    fma.rn.bf16x2 b, s2, dn, nz;
    and.b32 t, $2, 0x000F000F;
    fma.rn.bf16x2 t, t, sp, b;
    mov.b32 {$0, $1}, t;
    }""")
_MAGIC_FP16 = tl.constexpr(_magic_asm("0x3C003C00", "0xE408E408", "0x64006400", "f16x2"))


@triton.jit
def _magic_pairs(words, s, DTYPE: tl.constexpr):
    """Nibbles 0 and 4 of each (pre-shifted) word as ``DTYPE``: ``(u - 8) * s`` rounded once, by the magic-number
    conversion. bf16: one mask and one packed FMA a pair (``_MAGIC_BF16``), the value scaled by
    ``1 / BF16_OUT_SCALE``. fp16 (whose exponent range cannot hold the scaled pair): one ``lop3`` puts the nibbles
    into the mantissas of ``1024 + u``, then two packed FMAs, ``- (1024 + 8)`` (exact) and ``* s``."""
    if DTYPE == tl.bfloat16:
        return tl.inline_asm_elementwise(_MAGIC_BF16, "=h,=h,r,h", [words, s], dtype=(tl.bfloat16, tl.bfloat16),
                                         is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_MAGIC_FP16, "=h,=h,r,h", [words, s.to(tl.float16)],
                                         dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


@triton.jit
def _dequant(words, s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """Packed words ``[BLOCK_N, BLOCK_K/8]`` and their group scales ``[BLOCK_N, BLOCK_K/32]`` -> ``[BLOCK_N, BLOCK_K]`` in
    ``DTYPE``, its columns in nibble order (:func:`nibble_order`). UPCAST (the interpreter, which runs no PTX): the
    same values by fp32, unscaled."""
    M: tl.constexpr = BLOCK_K // 32
    w4 = words[:, :, None] >> (4 * tl.arange(0, 4))[None, None, :]  # [BN, words, j]: nibbles j and j + 4 low
    s4 = tl.reshape(tl.broadcast_to(s[:, :, None, None], [BLOCK_N, M, 4, 4]), [BLOCK_N, BLOCK_K // 8, 4])
    if UPCAST:
        lo = (((w4 & 0xF).to(tl.float32) - 8.0) * s4.to(tl.float32)).to(DTYPE)
        hi = ((((w4 >> 16) & 0xF).to(tl.float32) - 8.0) * s4.to(tl.float32)).to(DTYPE)
    else:
        lo, hi = _magic_pairs(w4, s4, DTYPE)
    v = tl.reshape(tl.join(lo, hi), [BLOCK_N, 4, M, 4, 2])  # [BN, q, m, j, h]: word q M + m, nibbles j, j + 4
    return tl.reshape(tl.permute(v, (0, 2, 3, 1, 4)), [BLOCK_N, BLOCK_K])  # column 32 m + 8 j + 2 q + h


def nibble_order(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """``x [N, K]`` in the column order of :func:`_dequant`'s tiles of ``block_k`` columns, ``K`` padded with zeros
    to a multiple of ``block_k`` (a copy): in each tile, position ``32 m + 8 j + 2 q + h`` holds column
    ``8 (q block_k / 32 + m) + j + 4 h`` (nibble ``j + 4h`` of the tile's word ``q block_k / 32 + m``). The MMA's
    register operand gives each thread of a quad (``q``) the column pairs ``4 i + q`` of a row: in this order a
    thread's pairs are the eight nibbles of ``block_k / 32`` adjacent words, which it loads as one vector and
    dequantises in place (no exchange between threads)."""
    N, K = x.shape
    Kp = -(-K // block_k) * block_k
    if Kp != K:
        x = F.pad(x, (0, Kp - K))
    M = block_k // 32
    return x.reshape(N, Kp // block_k, 4, M, 2, 4).permute(0, 1, 3, 5, 2, 4).reshape(N, Kp)


@triton.jit
def _nibble_slot(n, BLOCK_K: tl.constexpr):
    """Where column ``n`` of an activation goes in the nibble order of ``BLOCK_K`` tiles (:func:`nibble_order`)."""
    M: tl.constexpr = BLOCK_K // 32
    r = n % BLOCK_K
    q = r // (8 * M)
    m = (r // 8) % M
    return n - r + 32 * m + 8 * (r % 4) + 2 * q + (r // 4) % 2


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
def _block_rows(BlockStart, BlockEnd, SortedIdx, b, BLOCK_M: tl.constexpr):
    """Block ``b``'s rows of the expert-sorted assignments: ``(r, ok, rc, assignment)``: its ``BLOCK_M``
    rows, which are real, the rows clamped to its last one (rows past the end read it: no mask) and the
    assignment (token * top-k + slot) of each."""
    start = tl.load(BlockStart + b)
    end = tl.load(BlockEnd + b)
    r = start + tl.arange(0, BLOCK_M)
    rc = tl.minimum(r, end - 1)
    return r, r < end, rc, tl.load(SortedIdx + rc)


@triton.jit
def _accumulator(SWAP_AB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A zero fp32 accumulator: ``[BN, BM]`` with tokens on the MMA's N dimension (swap-AB), else ``[BM, BN]``."""
    if SWAP_AB:
        return tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        return tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)


@triton.jit
def _tile_pointers(Wp, Ws, e64, n, c, stride_pe, stride_pn, stride_se, stride_sn, BLOCK_K: tl.constexpr):
    """Expert ``e64``'s word tile ``[BN, BLOCK_K/8]`` and scale tile ``[BN, BLOCK_K/32]`` pointers at output rows
    ``n`` from word column ``c``."""
    pw = Wp + e64 * stride_pe + n.to(tl.int64)[:, None] * stride_pn + (c + tl.arange(0, BLOCK_K // 8))[None, :]
    ps = Ws + e64 * stride_se + n.to(tl.int64)[:, None] * stride_sn + (c // 4 + tl.arange(0, BLOCK_K // 32))[None, :]
    return pw, ps


@triton.jit
def _weight_tile(pw, ps, n_ok, c, K, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """Words ``[BN, BLOCK_K/8]`` and scales ``[BN, BLOCK_K/32]`` at the pointer tiles ``pw``/``ps`` (first word
    column ``c``); masked unless EVEN (K a multiple of the K tile, the output rows a multiple of the N tile)."""
    if EVEN:
        return tl.load(pw), tl.load(ps)
    else:
        cw = c + tl.arange(0, BLOCK_K // 8)
        cg = c // 4 + tl.arange(0, BLOCK_K // 32)
        return (tl.load(pw, mask=n_ok[:, None] & (cw < K // 8)[None, :], other=0),
                tl.load(ps, mask=n_ok[:, None] & (cg < K // 32)[None, :], other=0.0))


@triton.jit
def _gate_up_int4_kernel(X, Wp, Ws, Hbuf, BlockExpert, BlockStart, BlockEnd, SortedIdx, E, Hd, I, I_pad,
                         stride_x, stride_pe, stride_pn, stride_se, stride_sn, stride_h,
                         TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr,
                         OUT_SCALE: tl.constexpr, H_BLOCK_K: tl.constexpr):
    """Grid ``(blocks, cdiv(I, BLOCK_N / 2), SPLIT_K)``: a program's weight tile is ``BLOCK_N / 2`` gate rows over
    the same up rows, its output ``BLOCK_N / 2`` columns of h. ``X [N, H padded]``: the activations in the nibble
    order of ``BLOCK_K`` tiles (:func:`nibble_order`). ``SPLIT_K == 1``: ``Hbuf [N k, I_pad]`` (x's dtype) gets
    ``silu(g) * u`` at the block's sorted rows; else ``Hbuf [N k, 2 I_pad]`` fp32 (zeroed) gets ``g | u``
    partials by atomics; columns in the nibble order of the down kernel's ``H_BLOCK_K`` tiles either way
    (``I_pad``: ``I`` rounded up to them; the padding is not written). Pointers advance by a tile per step (no
    per-element address arithmetic in the loop); rows past the block's end read its last row (no mask) and are
    not stored. ``OUT_SCALE``: what the dequantisation
    left out of the sums (:func:`_magic_pairs`)."""
    b = tl.program_id(0)
    e = tl.load(BlockExpert + b)
    if e < E:  # blocks past the last used one own no rows: no weight is read for them
        r, ok, rc, a = _block_rows(BlockStart, BlockEnd, SortedIdx, b, BLOCK_M)
        tok = a // TOPK
        HALF: tl.constexpr = BLOCK_N // 2
        n = tl.program_id(1) * HALF + tl.arange(0, HALF)  # the h columns of this program
        n_ok = n < I
        i = tl.arange(0, BLOCK_N)
        rows = tl.program_id(1) * HALF + i % HALF + tl.where(i < HALF, 0, I)  # gate rows n, then up rows I + n
        rows_ok = tl.program_id(1) * HALF + i % HALF < I
        e64 = e.to(tl.int64)
        acc = _accumulator(SWAP_AB, BLOCK_M, BLOCK_N)
        lo, hi = _k_range(Hd, BLOCK_K, SPLIT_K)
        c = lo // 8  # first word column of the tile
        pw, ps = _tile_pointers(Wp, Ws, e64, rows, c, stride_pe, stride_pn, stride_se, stride_sn, BLOCK_K)
        px = X + tok.to(tl.int64)[:, None] * stride_x + (lo + tl.arange(0, BLOCK_K))[None, :]
        DT: tl.constexpr = X.dtype.element_ty
        for _k0 in range(lo, hi, BLOCK_K):
            xa = tl.load(px)  # X is padded to whole tiles
            w, sw = _weight_tile(pw, ps, rows_ok, c, Hd, BLOCK_K, EVEN)
            acc = _mma(acc, xa, _dequant(w, sw, BLOCK_N, BLOCK_K, DT, UPCAST), SWAP_AB, UPCAST)
            px += BLOCK_K
            pw += BLOCK_K // 8
            c += BLOCK_K // 8
            ps += BLOCK_K // 32
        if SWAP_AB:
            g, u = tl.split(tl.permute(tl.reshape(acc * OUT_SCALE, [2, HALF, BLOCK_M]), (2, 1, 0)))
        else:
            g, u = tl.split(tl.reshape(acc * OUT_SCALE, [BLOCK_M, 2, HALF]).permute(0, 2, 1))
        dst = Hbuf + r.to(tl.int64)[:, None] * stride_h + _nibble_slot(n, H_BLOCK_K)[None, :]  # down's K order
        mask = ok[:, None] & n_ok[None, :]
        if SPLIT_K == 1:
            tl.store(dst, (g * tl.sigmoid(g) * u).to(Hbuf.dtype.element_ty), mask=mask)
        else:
            tl.atomic_add(dst, g, mask=mask, sem="relaxed")
            tl.atomic_add(dst + I_pad, u, mask=mask, sem="relaxed")


@triton.jit
def _down_int4_kernel(Hbuf, Wp, Ws, Out, TopkW, BlockExpert, BlockStart, BlockEnd, SortedIdx, E, Hd, I, I_pad,
                      stride_h, stride_pe, stride_pn, stride_se, stride_sn, stride_o,
                      TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, ACT_IN_LOAD: tl.constexpr,
                      DTYPE: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr, OUT_SCALE: tl.constexpr):
    """Grid ``(blocks, cdiv(H, BLOCK_N), SPLIT_K)``: ``Out [N, H]`` fp32 (zeroed) ``+= topk_w h Wd^T`` by
    atomics; ``Hbuf`` as the gate_up kernel writes it, its padding zero. ``ACT_IN_LOAD``: ``Hbuf`` holds fp32
    ``g | u`` and ``h = silu(g) * u`` is formed on load
    (rounded to ``DTYPE``, as the unsplit path stores it). ``OUT_SCALE`` as in the gate_up kernel."""
    b = tl.program_id(0)
    e = tl.load(BlockExpert + b)
    if e < E:
        _, ok, rc, a = _block_rows(BlockStart, BlockEnd, SortedIdx, b, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < Hd
        e64 = e.to(tl.int64)
        acc = _accumulator(SWAP_AB, BLOCK_M, BLOCK_N)
        lo, hi = _k_range(I, BLOCK_K, SPLIT_K)
        c = lo // 8  # first word column of the tile
        pw, ps = _tile_pointers(Wp, Ws, e64, n, c, stride_pe, stride_pn, stride_se, stride_sn, BLOCK_K)
        ph = Hbuf + rc.to(tl.int64)[:, None] * stride_h + (lo + tl.arange(0, BLOCK_K))[None, :]
        for _k0 in range(lo, hi, BLOCK_K):  # Hbuf is padded to whole tiles
            if ACT_IN_LOAD:
                g = tl.load(ph)
                u = tl.load(ph + I_pad)
                h = (g * tl.sigmoid(g) * u).to(DTYPE)
            else:
                h = tl.load(ph)
            w, sw = _weight_tile(pw, ps, n_ok, c, I, BLOCK_K, EVEN)
            acc = _mma(acc, h, _dequant(w, sw, BLOCK_N, BLOCK_K, DTYPE, UPCAST), SWAP_AB, UPCAST)
            ph += BLOCK_K
            pw += BLOCK_K // 8
            c += BLOCK_K // 8
            ps += BLOCK_K // 32
        if SWAP_AB:
            y = tl.trans(acc)
        else:
            y = acc
        wt = tl.load(TopkW + a, mask=ok, other=0.0).to(tl.float32) * OUT_SCALE
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
# Measured on the H200 for sm_90 (bench/moe_sweep.py --configs); K tiles are whole 32-column scale groups.
# Bounded by the ahead-of-time audit (tests/kernels/test_aot_audit.py). sm_120: mma.sync,
# 101,376 B of shared memory, no spills; sm_90: wgmma wants 64 weight rows on M (swap-AB at few tokens).
INT4_MOE_CONFIGS: dict[str, dict[int, Int4MoeConfig]] = {
    "sm_90": {
        16: Int4MoeConfig(16, (64, 128, 4, 4), (64, 128, 4, 3), swap_ab=True),
        64: Int4MoeConfig(32, (64, 128, 4, 3), (64, 128, 4, 3), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (128, 128, 8, 3), (128, 128, 8, 3), swap_ab=False),
    },
    "sm_120": {
        16: Int4MoeConfig(16, (64, 128, 4, 2), (64, 128, 4, 2), swap_ab=True),
        64: Int4MoeConfig(32, (64, 128, 4, 2), (32, 128, 4, 2), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (32, 64, 4, 2), (32, 64, 8, 2), swap_ab=False),
    },
    "sm_80": {
        16: Int4MoeConfig(16, (64, 128, 4, 2), (64, 128, 4, 2), swap_ab=True),
        1 << 30: Int4MoeConfig(64, (32, 64, 4, 2), (32, 64, 8, 2), swap_ab=False),
    },
    # Interpreter: few programs (each interpreted operation costs the same at any tile size).
    "cpu": {
        1 << 30: Int4MoeConfig(16, (64, 128, 4, 1), (64, 128, 4, 1), swap_ab=True),
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


def _split_for(programs: int, k_tiles: int, sms: int) -> int:
    """K splits that bring ``programs`` up to about the SM count, never more than the K tiles."""
    if programs >= sms:
        return 1
    return max(1, min(MAX_SPLIT_K, k_tiles, -(-sms // programs)))


@functools.lru_cache(maxsize=1024)
def plan_int4_moe(N: int, topk: int, E: int, H: int, I: int, arch: str, sms: int,
                  config: Int4MoeConfig | None = None, global_experts: int | None = None) -> Int4MoePlan:
    """The launch plan of one shape, computed once: the config (by expected rows per used expert under
    uniform routing), the block bound (any routing), the K splits for ``sms`` SMs (by the expected blocks).
    ``config`` replaces the table's. ``global_experts``: the experts the ids are drawn from when this rank
    holds ``E`` of them (expert parallelism; default ``E``)."""
    A = N * topk
    G = max(E, global_experts or E)
    # Expected distinct local experts of N tokens' top-k under uniform routing over G (N = 17, k = 8,
    # E = G = 384: 116; E = 48 of G = 384, N = 1: 1) and the assignments they get.
    used = max(1, min(E, A, math.ceil(E * (1 - (1 - min(1.0, topk / G)) ** N) - 1e-9)))
    rows = -(-(A * E // G) // used) if G > E else -(-A // used)
    rows = max(1, rows)
    if config is None:
        config = lookup(INT4_MOE_CONFIGS, arch, rows)
    bm = config.block_m
    blocks_used = max(1, used * -(-rows // bm))  # expected blocks that own rows
    gbn, gbk = config.gate_up[:2]
    dbn, dbk = config.down[:2]
    gate_up_split = _split_for(blocks_used * -(-2 * I // gbn), -(-H // gbk), sms)
    down_split = _split_for(blocks_used * -(-H // dbn), -(-I // dbk), sms)
    return Int4MoePlan(config, min_blocks(A, E, bm), gate_up_split, down_split)


def launch(x, topk_idx, topk_w, w13_packed, w13_scale, w2_packed, w2_scale, out, plan: Int4MoePlan) -> None:
    N, H = x.shape
    E, I2, _ = w13_packed.shape
    I, k = I2 // 2, topk_idx.shape[1]
    cfg = plan.config
    sorted_idx, block_expert, block_start, block_end, _ = align_routing(topk_idx, E, cfg.block_m, plan.num_blocks)
    gbn, gbk, gw, gs = cfg.gate_up
    dbn, dbk, dw, ds = cfg.down
    I_pad = -(-I // dbk) * dbk  # h in whole K tiles of the down kernel (zero padding)
    split_gu = plan.gate_up_split > 1
    if split_gu:
        hbuf = torch.zeros(N * k, 2 * I_pad, dtype=torch.float32, device=x.device)
    elif I_pad != I:
        hbuf = torch.zeros(N * k, I_pad, dtype=x.dtype, device=x.device)
    else:
        hbuf = torch.empty(N * k, I, dtype=x.dtype, device=x.device)
    acc = torch.zeros(N, H, dtype=torch.float32, device=x.device)
    upcast = interpreting()
    out_scale = BF16_OUT_SCALE if x.dtype == torch.bfloat16 and not upcast else 1.0
    xc = nibble_order(x, gbk)  # contiguous tiles of the activations in the order the weight tiles come out
    _gate_up_int4_kernel[(plan.num_blocks, triton.cdiv(I, gbn // 2), plan.gate_up_split)](
        xc, w13_packed, w13_scale, hbuf, block_expert, block_start, block_end, sorted_idx, E, H, I, I_pad,
        xc.stride(0), w13_packed.stride(0), w13_packed.stride(1), w13_scale.stride(0), w13_scale.stride(1),
        hbuf.stride(0), TOPK=k, BLOCK_M=cfg.block_m, BLOCK_N=gbn, BLOCK_K=gbk, SPLIT_K=plan.gate_up_split,
        SWAP_AB=cfg.swap_ab, EVEN=H % gbk == 0 and I % (gbn // 2) == 0, UPCAST=upcast, OUT_SCALE=out_scale,
        H_BLOCK_K=dbk, num_warps=gw, num_stages=gs)
    tw = topk_w.reshape(-1).contiguous()
    _down_int4_kernel[(plan.num_blocks, triton.cdiv(H, dbn), plan.down_split)](
        hbuf, w2_packed, w2_scale, acc, tw, block_expert, block_start, block_end, sorted_idx, E, H, I, I_pad,
        hbuf.stride(0), w2_packed.stride(0), w2_packed.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        acc.stride(0), TOPK=k, BLOCK_M=cfg.block_m, BLOCK_N=dbn, BLOCK_K=dbk, SPLIT_K=plan.down_split,
        SWAP_AB=cfg.swap_ab, ACT_IN_LOAD=split_gu, DTYPE=_TL_DTYPE[x.dtype], EVEN=I % dbk == 0 and H % dbn == 0,
        UPCAST=upcast, OUT_SCALE=out_scale, num_warps=dw, num_stages=ds)
    out.copy_(acc)


_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
