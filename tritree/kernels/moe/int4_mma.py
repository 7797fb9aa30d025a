"""Gluon ``mma.sync`` W4A16 grouped-expert kernels: weights straight from memory into registers.

The Triton kernels of :mod:`tritree.kernels.moe.int4` stage every weight tile through shared memory and feed
Hopper's ``wgmma`` from registers: per 64 weights a thread issues about 230 instructions (copies, shared-memory
loads, the dequantisation, descriptor and warpgroup bookkeeping for eight ``wgmma`` of 16 columns each), so the
layer is bound by instruction issue and latency at about half the copy bandwidth (bench/RESULTS.md, INT4
sections). Here:

- the weights are repacked once at load (:func:`repack_mma`) so that the 16 x 16 A fragment of ``mma.sync``
  m16n8k16 that lane ``4 g + q`` holds, for each 16-column slice, is one 32-bit word of eight nibbles; a lane's
  eight words of a 128-column tile are 32 contiguous bytes and a warp's 1 KB, read with two 16-byte loads a lane
  straight into registers (no shared memory, no barrier);
- a nibble pair becomes a bf16 pair by one mask and one packed FMA (``int4_triton._magic_pairs``), in the register
  the MMA reads;
- the activations are stored in a column order (:func:`mma_order`) in which a lane's B fragments of a 128-column
  tile are 64 contiguous bytes, also loaded straight into registers;
- the next tile's loads are issued before the current tile's arithmetic (one tile in flight a warp);
- a block is 8 or 16 rows (``mma.sync``'s N of 8): at decode an expert has one or two rows;
- gate_up runs one wave of programs that take (column tile, block, K chunk) work from a ticket queue: a grid of
  one program an item left the items past the first wave to run alone at the end (bench/RESULTS.md, "INT4 routed
  experts"), and in-order chunks keep an expert's blocks running together on its weight rows.

Each warp owns 16 output rows (gate_up: 16 gate rows and the same 16 up rows, so SiLU-and-mul is local to
the thread), a CTA ``WARPS`` such warps. The same instructions run on sm_90 and sm_120 (the RTX PRO 6000 has
no ``wgmma``); no shared memory is used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .._gluon_common import _cta_barrier
from .._launch import arrival_counters, zeroed_workspace
from .align import align_routing, min_blocks

KT = 128  # columns of a K tile: eight 16-column MMA slices
GROUPS = 4  # 32-column scale groups a K tile
CAST_ROWS = gl.constexpr(32)  # output rows a pass of the down kernel's final cast


# --------------------------------------------------------------------------------------------------
# Layouts (host)
# --------------------------------------------------------------------------------------------------

def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """``[..., K/8]`` int32 words -> ``[..., K]`` nibbles ``u`` in ``[0, 16)`` (int32)."""
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    return ((packed[..., None] >> shifts) & 0xF).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def repack_mma(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint-layout INT4 ``packed [E, R, K/8]`` int32 and ``scale [E, R, K/32]`` bf16 -> the kernels'
    ``(words [E, R/16, K/128, 32, 8] int32, scales [E, R/16, K/128, 8, 2, 4] bf16)``.

    Word ``s`` of lane ``4 g + q`` in tile ``(m, t)`` holds, at nibble ``j + 4 h`` (``j = 2 j1 + j0``), the
    weight of row ``16 m + 8 j0 + g`` and column ``128 t + 16 s + 8 j1 + 2 q + h`` (stored as ``q + 8``): the
    ``mma.sync`` A fragment of slice ``s``. Scales ``[m, t, g, j0, c]``: row ``16 m + 8 j0 + g``, group ``4 t + c``.
    ``R`` must be a multiple of 16 and ``K`` of 128. Returned with the checkpoint tensors' shapes ``[E, R, K/8]`` and
    ``[E, R, K/32]`` (the same bytes, another order): a layer holds one layout or the other, never both."""
    E, R, Kw = packed.shape
    K = Kw * 8
    if R % 16 or K % KT:
        raise ValueError(f"repack_mma needs rows % 16 == 0 and columns % {KT} == 0, got R={R}, K={K}")
    words = torch.empty(E, R // 16, K // KT, 32, 8, dtype=torch.int32, device=packed.device)
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    for e in range(E):  # one expert at a time: the unpacked nibbles are 32x the packed bytes
        u = _unpack(packed[e])  # [R, K] in [0, 16)
        u = u.view(R // 16, 2, 8, K // KT, 8, 2, 4, 2)  # m, j0, g, t, s, j1, q, h
        u = u.permute(0, 3, 2, 6, 4, 7, 5, 1)  # m, t, g, q, s, h, j1, j0: nibble position 4 h + 2 j1 + j0
        words[e] = (u.reshape(R // 16, K // KT, 32, 8, 8) << shifts).sum(-1, dtype=torch.int32)
    s = scale.view(E, R // 16, 2, 8, K // KT, GROUPS)  # e, m, j0, g, t, c
    scales = s.permute(0, 1, 4, 3, 2, 5).contiguous()  # e, m, t, g, j0, c
    return words.view(E, R, Kw), scales.view(E, R, K // KT * GROUPS)


def unrepack_mma(words: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`repack_mma`: the checkpoint layout ``(packed [E, R, K/8], scale [E, R, K/32])``."""
    E, R, Kw = words.shape
    K = Kw * 8
    packed = torch.empty_like(words)
    shifts = 4 * torch.arange(8, device=words.device, dtype=torch.int32)
    w = words.view(E, R // 16, K // KT, 32, 8)
    for e in range(E):
        u = _unpack(w[e]).view(R // 16, K // KT, 8, 4, 8, 2, 2, 2)  # m, t, g, q, s, h, j1, j0
        u = u.permute(0, 7, 2, 1, 4, 6, 3, 5).reshape(R, K // 8, 8)  # m, j0, g, t, s, j1, q, h
        packed[e] = (u << shifts).sum(-1, dtype=torch.int32)
    s = scales.view(E, R // 16, K // KT, 8, 2, GROUPS)  # e, m, t, g, j0, c
    return packed, s.permute(0, 1, 4, 3, 2, 5).reshape(E, R, K // KT * GROUPS).contiguous()


def mma_order(x: torch.Tensor) -> torch.Tensor:
    """``x [N, K]`` (K a multiple of 128) in the column order the kernels read activations: in each 128-column
    tile, position ``32 q + 4 s + 2 j1 + h`` holds column ``16 s + 8 j1 + 2 q + h`` (a lane's B fragments of the
    tile, contiguous). A copy."""
    N, K = x.shape
    return x.reshape(N, K // KT, 8, 2, 4, 2).permute(0, 1, 4, 2, 3, 5).reshape(N, K)


# --------------------------------------------------------------------------------------------------
# Dequantisation: a nibble pair of a word -> a bf16 / fp16 pair, one mask and one packed FMA
# --------------------------------------------------------------------------------------------------

def _asm_bf16(mask: str, up: str) -> str:
    """bf16: the pair's nibbles masked in place into the low bits of each half, ``v 2^-133`` with ``v = u`` (mask
    ``0x000F000F``) or ``v = 16 u`` (``0x00F000F0``: bits 4-7; the value stays linear in ``v`` below 256), then
    ``v 2^-133 * (s 2^E) - s 2^-30`` with ``2^E`` = ``up`` (2^100, or 2^96 for ``16 u``): ``(u - 8) s 2^-33``
    rounded once (``OUT_SCALE`` = 2^33 restores it)."""
    return f"""{{
    .reg .b32 t, s2, sp, b, up, dn, nz;
    mov.b32 up, {up};
    mov.b32 dn, 0xB080B080;
    mov.b32 nz, 0x80008000;
    mov.b32 s2, {{$3, $3}};
    fma.rn.bf16x2 sp, s2, up, nz;
    fma.rn.bf16x2 b, s2, dn, nz;
    and.b32 t, $2, {mask};
    fma.rn.bf16x2 t, t, sp, b;
    mov.b32 {{$0, $1}}, t;
    }}"""


def _asm_fp16(mask: str, one: str, bias: str) -> str:
    """fp16: ``1024 + v`` by one ``lop3`` (the nibbles into the mantissas of the magic 1024), ``(1024 + v) one + bias``
    = ``u - 8`` (exact: ``one`` 1 or 1/16, ``bias`` -1032 or -72), then times ``s``."""
    return f"""{{
    .reg .b32 t, one, bias, s2, nz;
    mov.b32 one, {one};
    mov.b32 bias, {bias};
    mov.b32 nz, 0x80008000;
    lop3.b32 t, $2, {mask}, 0x64006400, 0xEA;
    fma.rn.f16x2 t, t, one, bias;
    mov.b32 s2, {{$3, $3}};
    fma.rn.f16x2 t, t, s2, nz;
    mov.b32 {{$0, $1}}, t;
    }}"""


_LO_BF16 = gl.constexpr(_asm_bf16("0x000F000F", "0x71807180"))
_HI_BF16 = gl.constexpr(_asm_bf16("0x00F000F0", "0x6F806F80"))
_LO_FP16 = gl.constexpr(_asm_fp16("0x000F000F", "0x3C003C00", "0xE408E408"))
_HI_FP16 = gl.constexpr(_asm_fp16("0x00F000F0", "0x2C002C00", "0xD480D480"))
BF16_OUT_SCALE = 2.0 ** 33


@gluon.jit
def _pairs(w, s, HIGH: gl.constexpr, DTYPE: gl.constexpr):
    """Nibbles ``j, j + 4`` of ``w`` (``HIGH``: the word's bits 4-7 / 20-23, else 0-3 / 16-19) as a pair."""
    if DTYPE == gl.bfloat16:
        if HIGH:
            asm: gl.constexpr = _HI_BF16
        else:
            asm: gl.constexpr = _LO_BF16
        return gl.inline_asm_elementwise(asm, "=h,=h,r,h", [w, s], dtype=(gl.bfloat16, gl.bfloat16), is_pure=True,
                                         pack=1)
    else:
        if HIGH:
            asm: gl.constexpr = _HI_FP16
        else:
            asm: gl.constexpr = _LO_FP16
        return gl.inline_asm_elementwise(asm, "=h,=h,r,h", [w, s.to(gl.float16)], dtype=(gl.float16, gl.float16),
                                         is_pure=True, pack=1)


@gluon.jit
def _a_operand(words, s_row0, s_row8, a_op: gl.constexpr, DTYPE: gl.constexpr, WARPS: gl.constexpr):
    """A warp-row tile's words ``[WARPS, 8 g, 4 q, 4 c, 2 s0]`` and its rows' scales (``s_row0``: rows ``g``,
    ``s_row8``: rows ``g + 8``, ``[WARPS, 8, 4, 4, 1]``) -> the A operand ``[16 WARPS, 128]`` in ``a_op``. Nibble
    ``j = 2 j1 + j0``: ``j0`` picks the row (bits 0-3 or 4-7 of each half), ``j1`` the word shifted by 8."""
    w8 = words >> 8
    lo00, hi00 = _pairs(words, s_row0, False, DTYPE)  # j = 0
    lo01, hi01 = _pairs(words, s_row8, True, DTYPE)   # j = 1
    lo10, hi10 = _pairs(w8, s_row0, False, DTYPE)     # j = 2
    lo11, hi11 = _pairs(w8, s_row8, True, DTYPE)      # j = 3
    # A join adds the fastest register dim: j1 first, then j0, then h (the fragment's order h, j0, j1).
    a = gl.join(gl.join(gl.join(lo00, lo10), gl.join(lo01, lo11)),
                gl.join(gl.join(hi00, hi10), gl.join(hi01, hi11)))  # [W, g, q, c, s0, j1, j0, h]
    a = gl.permute(a, (0, 6, 1, 3, 4, 5, 2, 7))  # [W, j0, g, c, s0, j1, q, h]
    return gl.convert_layout(gl.reshape(a, [16 * WARPS, 128]), a_op)


@gluon.jit
def _b_operand(xt, b_op: gl.constexpr, BM: gl.constexpr):
    """Activations ``[BM, 4 q, 32]`` (:func:`mma_order`) -> the B operand ``[128, BM]`` in ``b_op``."""
    x = gl.reshape(xt, [BM, 4, 8, 2, 2])  # n, q, s, j1, h
    x = gl.permute(x, (2, 3, 1, 4, 0))  # s, j1, q, h, n
    return gl.convert_layout(gl.reshape(x, [128, BM]), b_op)


@gluon.jit
def _w_tile(pw, ps, t, ok, w_l5: gl.constexpr, WARPS: gl.constexpr):
    """K tile ``t`` of a warp-row tile: words ``[W, 8, 4, 4, 2]`` and the two rows' scales ``[W, 8, 4, 4, 1]``
    (zeros where ``ok`` is false)."""
    w = gl.load(pw + t * 256, mask=ok)
    w = gl.convert_layout(gl.reshape(w, [WARPS, 8, 4, 4, 2]), w_l5)
    sc = gl.load(ps + t * 64, mask=ok)  # [W, 8, 4 q, 2 j0, 4 c], the same for every q
    s0, s8 = gl.split(gl.permute(sc, (0, 1, 2, 4, 3)))
    s0 = gl.expand_dims(gl.convert_layout(s0, gl.SliceLayout(4, w_l5)), 4)
    s8 = gl.expand_dims(gl.convert_layout(s8, gl.SliceLayout(4, w_l5)), 4)
    return w, s0, s8


@gluon.jit
def _w_pointers(Wp, Ws, e64, m0, stride_we, stride_wm, stride_se, stride_sm, w_l4: gl.constexpr,
                s_l5: gl.constexpr, WARPS: gl.constexpr):
    """Word pointers ``[W, 8 g, 4 q, 8 s]`` and scale pointers ``[W, 8 g, 4 q, 2 j0, 4 c]`` of K tile 0 of
    m-tiles ``m0 + w``."""
    w1 = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, w_l4))))
    g1 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, w_l4))))
    q1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, w_l4))))
    s1 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, w_l4))))
    w4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(w1, 1), 2), 3)
    g4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(g1, 0), 2), 3)
    q4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(q1, 0), 1), 3)
    s4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(s1, 0), 1), 2)
    pw = Wp + e64 * stride_we + (m0 + w4).to(gl.int64) * stride_wm + (g4 * 4 + q4) * 8 + s4
    ws1 = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, s_l5)))))
    gs1 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, s_l5)))))
    qs1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, s_l5)))))
    js1 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, s_l5)))))
    cs1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, s_l5)))))
    ws5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(ws1, 1), 2), 3), 4)
    gs5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gs1, 0), 2), 3), 4)
    qs5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(qs1, 0), 1), 3), 4)
    js5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(js1, 0), 1), 2), 4)
    cs5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(cs1, 0), 1), 2), 3)
    ps = Ws + e64 * stride_se + (m0 + ws5).to(gl.int64) * stride_sm + gs5 * 8 + js5 * 4 + cs5 + qs5 * 0
    return pw, ps


@gluon.jit
def _x_pointers(X, rows, stride_x, x_l3: gl.constexpr):
    """Activation pointers ``[BM, 4 q, 32]`` of K tile 0 of rows ``rows`` (``[BM]``)."""
    q1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_l3)))
    v1 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l3)))
    r3 = gl.expand_dims(gl.expand_dims(rows.to(gl.int64) * stride_x, 1), 2)
    return X + r3 + gl.expand_dims(gl.expand_dims(q1 * 32, 0), 2) + gl.expand_dims(gl.expand_dims(v1, 0), 1)


@gluon.jit
def _block(BlockStart, BlockEnd, SortedIdx, b, row_l: gl.constexpr, BM: gl.constexpr):
    """Block ``b``'s sorted rows ``r``, the last real one, the rows clamped to it and their assignments."""
    start = gl.load(BlockStart + b)
    end = gl.load(BlockEnd + b)
    r = start + gl.arange(0, BM, layout=row_l)
    rc = gl.minimum(r, end - 1)
    return start, end, rc, gl.load(SortedIdx + rc)


@gluon.jit
def _slot(n, KT: gl.constexpr):
    """Where column ``n`` of an activation row goes in :func:`mma_order`."""
    r = n % KT
    return n - r + 32 * ((r // 2) % 4) + 4 * (r // 16) + 2 * ((r // 8) % 2) + r % 2


# Layouts, a function of (WARPS, BM) only: words [W, 8 g, 4 q, 8 s] (32 contiguous bytes a lane), the same split
# [.., 4 c, 2 s0], scales [W, 8 g, 4 q, 2 j0, 4 c] (16 contiguous bytes), activations [BM, 4 q, 32] (64 bytes),
# 16-bit weights [16 W, 128] (16 contiguous bytes a lane), and the mma.sync m16n8 layout with a warp a 16-row slice.
@gluon.jit
def _routed_gate_up(X, Wp, Ws, e64, m0, xrows, I, lo, hi, stride_x, stride_we, stride_wm, stride_se, stride_sm,
                    BM: gl.constexpr, WARPS: gl.constexpr, DTYPE: gl.constexpr):
    """``(x Wg^T, x Wu^T)`` of INT4 expert ``e64``'s gate m-tiles ``m0 .. m0 + WARPS`` (and the up m-tiles ``I/16``
    further) over K tiles ``lo .. hi`` (an even count), activation rows ``xrows``; fp32 ``[16 WARPS, BM]``, times
    the dequantisation's ``1 / OUT_SCALE``. Two tiles an iteration in two register sets: tile ``t + 1``'s loads
    are in flight while tile ``t`` computes."""
    w_l4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 8, 4, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    w_l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 2], [1, 8, 4, 1, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    s_l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2, 4], [1, 8, 4, 1, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    pg, psg = _w_pointers(Wp, Ws, e64, m0, stride_we, stride_wm, stride_se, stride_sm, w_l4, s_l5, WARPS)
    pu, psu = _w_pointers(Wp, Ws, e64, m0 + I // 16, stride_we, stride_wm, stride_se, stride_sm, w_l4, s_l5, WARPS)
    px = _x_pointers(X, xrows, stride_x, x_l3)
    acc_g = gl.zeros([16 * WARPS, BM], gl.float32, layout=mma)
    acc_u = gl.zeros([16 * WARPS, BM], gl.float32, layout=mma)
    wg_a, sg0_a, sg8_a = _w_tile(pg, psg, lo, True, w_l5, WARPS)
    wu_a, su0_a, su8_a = _w_tile(pu, psu, lo, True, w_l5, WARPS)
    x_a = gl.load(px + lo * 128)
    for t in range(lo, hi, 2):
        wg_b, sg0_b, sg8_b = _w_tile(pg, psg, t + 1, True, w_l5, WARPS)
        wu_b, su0_b, su8_b = _w_tile(pu, psu, t + 1, True, w_l5, WARPS)
        x_b = gl.load(px + (t + 1) * 128)
        xb = _b_operand(x_a, b_op, BM)
        acc_g = mma_v2(_a_operand(wg_a, sg0_a, sg8_a, a_op, DTYPE, WARPS), xb, acc_g)
        acc_u = mma_v2(_a_operand(wu_a, su0_a, su8_a, a_op, DTYPE, WARPS), xb, acc_u)
        more = t + 2 < hi
        wg_a, sg0_a, sg8_a = _w_tile(pg, psg, t + 2, more, w_l5, WARPS)
        wu_a, su0_a, su8_a = _w_tile(pu, psu, t + 2, more, w_l5, WARPS)
        x_a = gl.load(px + (t + 2) * 128, mask=more)
        xb = _b_operand(x_b, b_op, BM)
        acc_g = mma_v2(_a_operand(wg_b, sg0_b, sg8_b, a_op, DTYPE, WARPS), xb, acc_g)
        acc_u = mma_v2(_a_operand(wu_b, su0_b, su8_b, a_op, DTYPE, WARPS), xb, acc_u)
    return acc_g, acc_u


@gluon.jit
def _routed_down(Hbuf, Wp, Ws, Acc, TopkW, BlockStart, BlockEnd, SortedIdx, b, e64, c0, lo, per, Hd, stride_h,
                 stride_we, stride_wm, stride_se, stride_sm, stride_a, TOPK: gl.constexpr, BM: gl.constexpr,
                 WARPS: gl.constexpr, CT: gl.constexpr, DTYPE: gl.constexpr, OUT_SCALE: gl.constexpr):
    """Routed block ``b`` (INT4 expert ``e64``) against output column tiles ``c0 .. c0 + CT`` of ``16 WARPS``
    columns, K tiles ``lo .. lo + per`` (an even count) of each: ``Acc += topk_w h Wd^T`` by atomics. The tiles
    of all ``CT`` column tiles are one stream, two an iteration in two register sets (the next tile's loads in
    flight while the current one computes, across column tiles too); the first weight tile is in flight before
    the block's rows are read."""
    w_l4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 8, 4, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    w_l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 2], [1, 8, 4, 1, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    s_l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2, 4], [1, 8, 4, 1, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    pw, ps = _w_pointers(Wp, Ws, e64, c0 * WARPS, stride_we, stride_wm, stride_se, stride_sm, w_l4, s_l5, WARPS)
    dw = WARPS * stride_wm  # a column tile further: words, scales
    ds = WARPS * stride_sm
    w_a, s0_a, s8_a = _w_tile(pw, ps, lo, True, w_l5, WARPS)
    start, end, rc, _ = _block(BlockStart, BlockEnd, SortedIdx, b, gl.SliceLayout(1, gl.SliceLayout(2, x_l3)), BM)
    rows = start + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    ok = rows < end
    a = gl.load(SortedIdx + gl.minimum(rows, end - 1))
    wt = gl.expand_dims(gl.load(TopkW + a, mask=ok, other=0.0).to(gl.float32) * OUT_SCALE, 0)
    cols = gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, mma))
    dst = Acc + gl.expand_dims((a // TOPK).to(gl.int64) * stride_a, 0) + gl.expand_dims(c0 * (16 * WARPS) + cols, 1)
    ph = _x_pointers(Hbuf, rc, stride_h, x_l3)
    h_a = gl.load(ph + lo * 128)
    acc = gl.zeros([16 * WARPS, BM], gl.float32, layout=mma)
    n = CT * per
    for j in range(0, n, 2):
        t = lo + j % per
        more = j + 2 < n
        tn = lo + (j + 2) % per
        if CT == 1:  # one column tile: the pointers stay
            w_b, s0_b, s8_b = _w_tile(pw, ps, t + 1, True, w_l5, WARPS)
        else:
            ci = j // per  # the column tile of tiles j and j + 1
            cn = (j + 2) // per
            w_b, s0_b, s8_b = _w_tile(pw + ci * dw, ps + ci * ds, t + 1, True, w_l5, WARPS)
        h_b = gl.load(ph + (t + 1) * 128)
        acc = mma_v2(_a_operand(w_a, s0_a, s8_a, a_op, DTYPE, WARPS), _b_operand(h_a, b_op, BM), acc)
        if CT == 1:
            w_a, s0_a, s8_a = _w_tile(pw, ps, tn, more, w_l5, WARPS)
        else:
            w_a, s0_a, s8_a = _w_tile(pw + cn * dw, ps + cn * ds, tn, more, w_l5, WARPS)
        h_a = gl.load(ph + tn * 128, mask=more)
        acc = mma_v2(_a_operand(w_b, s0_b, s8_b, a_op, DTYPE, WARPS), _b_operand(h_b, b_op, BM), acc)
        if CT > 1:
            if cn != ci:  # the column tile's sums are whole
                mask = gl.expand_dims(ok, 0) & gl.expand_dims((c0 + ci) * (16 * WARPS) + cols < Hd, 1)
                gl.atomic_add(dst + ci * (16 * WARPS), acc * wt, mask=mask, sem="relaxed")
                acc = gl.zeros([16 * WARPS, BM], gl.float32, layout=mma)
    if CT == 1:
        mask = gl.expand_dims(ok, 0) & gl.expand_dims(c0 * (16 * WARPS) + cols < Hd, 1)
        gl.atomic_add(dst, acc * wt, mask=mask, sem="relaxed")


@gluon.jit
def _dense_product(X, W, xrows, wrows, lo, hi, stride_x, stride_w, BM: gl.constexpr, WARPS: gl.constexpr):
    """``x W^T`` of 16-bit weight rows ``wrows`` (``[16 WARPS]``, natural layout) over K tiles ``lo .. hi``,
    activation rows ``xrows`` (:func:`mma_order`); fp32 ``[16 WARPS, BM]``. The shared expert: a few percent of
    the block's bytes, so the weight tile goes to the MMA's layout through shared memory (the compiler's
    conversion) instead of a repacked layout."""
    w_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    k1 = gl.arange(0, 128, layout=gl.SliceLayout(0, w_l))
    pw = W + gl.expand_dims(wrows.to(gl.int64) * stride_w, 1) + gl.expand_dims(k1, 0)
    px = _x_pointers(X, xrows, stride_x, x_l3)
    acc = gl.zeros([16 * WARPS, BM], gl.float32, layout=mma)
    for t in range(lo, hi):
        w = gl.load(pw + t * 128)
        acc = mma_v2(gl.convert_layout(w, a_op), _b_operand(gl.load(px + t * 128), b_op, BM), acc)
    return acc


@gluon.jit
def _store_h(g, u, rows, cols, mask, Hbuf, stride_h):
    """``silu(g) * u`` at rows ``rows`` of ``Hbuf`` (its dtype), columns ``cols`` in :func:`mma_order`."""
    h = g / (1.0 + gl.exp(-g)) * u
    dst = Hbuf + gl.expand_dims(rows.to(gl.int64) * stride_h, 0) + gl.expand_dims(_slot(cols, 128), 1)
    gl.store(dst, h.to(Hbuf.dtype.element_ty), mask=mask)


@gluon.jit
def _gate_up_out(g, u, grows, hrows, ok_rows, cols, ncols, Hbuf, Gacc, Count, tile, up, stride_h, stride_g,
                 SPLIT):
    """A program's gate and up sums ``[16 WARPS, BM]`` (rows ``ok_rows``, columns ``cols < ncols``): with one split
    h at rows ``hrows`` of ``Hbuf``; with ``SPLIT > 1`` added by atomics to rows ``grows`` of ``Gacc`` (gate, then
    up ``up`` columns further; zero before), and the tile's last split to arrive (counter ``tile``) turns the sums
    into h and sets the sums and the counter back to 0."""
    mask = gl.expand_dims(ok_rows, 0) & gl.expand_dims(cols < ncols, 1)
    if SPLIT == 1:
        _store_h(g, u, hrows, cols, mask, Hbuf, stride_h)
    else:
        dst = Gacc + gl.expand_dims(grows.to(gl.int64) * stride_g, 0) + gl.expand_dims(cols, 1)
        gl.atomic_add(dst, g, mask=mask, sem="relaxed")
        gl.atomic_add(dst + up, u, mask=mask, sem="relaxed")
        _cta_barrier()  # every thread's sums added before the arrival is released
        if gl.atomic_add(Count + tile, 1, sem="acq_rel") == SPLIT - 1:
            gs = gl.load(dst, mask=mask, other=0.0, cache_modifier=".cg")
            us = gl.load(dst + up, mask=mask, other=0.0, cache_modifier=".cg")
            _store_h(gs, us, hrows, cols, mask, Hbuf, stride_h)
            gl.store(dst, gl.zeros_like(gs), mask=mask)  # the workspace and the counter left at 0 for the next launch
            gl.store(dst + up, gl.zeros_like(us), mask=mask)
            gl.store(Count + tile, 0)


@gluon.jit
def _gate_up_mma_kernel(X, Wp, Ws, Sw, Hbuf, Gacc, Gs, Count, Queue, Used, BlockExpert, BlockStart, BlockEnd,
                        SortedIdx, N, E, Hd, I, Is, NB, SS, P,
                        stride_x, stride_we, stride_wm, stride_se, stride_sm, stride_sw, stride_h, stride_g, stride_gs,
                        TOPK: gl.constexpr, BM: gl.constexpr, WARPS: gl.constexpr, CHUNK: gl.constexpr,
                        DTYPE: gl.constexpr, OUT_SCALE: gl.constexpr):
    """Grid ``(SS Is / (16 WARPS) + P,)``: h columns ``16 WARPS c .. + 16 WARPS``.

    The first ``SS Is / (16 WARPS)`` programs: split ``ks`` of ``SS`` of the shared expert's column tile ``c``
    (``Sw [2 Is, Hd]``: gate rows then up rows, x's dtype) for every token, in blocks of ``BM``: added to
    ``Gs [N, 2 Is]`` (fp32, zeroed; h directly when ``SS`` is 1) and the last split of each (row block, column
    tile) writes h at rows ``N TOPK + token`` of ``Hbuf``.

    The other ``P`` programs (one wave) share the routed items (column tile ``c``, block ``b`` < ``Used[0]``),
    each ``Hd / 256`` pairs of K tiles of its block's sorted rows against INT4 expert ``BlockExpert[b]``
    (``Wp``/``Ws``: :func:`repack_mma` of ``w13``: gate m-tiles ``0 .. I/16``, up m-tiles ``I/16 .. I/8``), cut
    into chunks of ``CHUNK`` pairs (fewer when there are fewer than ``P CHUNK`` pairs), in the order (``c``,
    ``b``, chunk): a program takes the next chunk from the ticket counter ``Queue[0]`` (left at 0) until none is
    left. So the programs end together whatever the routing
    (none runs a whole item alone at the end), and the chunks in flight at any time are neighbours in that order:
    an expert's blocks run together and share its weight rows in L2. An item of one chunk writes
    ``silu(x Wg^T) * (x Wu^T)`` to ``Hbuf`` (x's dtype, :func:`mma_order`); the chunks of a longer item add to
    ``Gacc [N TOPK, 2 I]`` (fp32, zero; left zero) and the last to arrive writes h.

    ``X [N, Hd]``: the activations in :func:`mma_order`. Arrival counters ``Count`` (left at 0): routed item
    ``b (I / 16 WARPS) + c``, then the shared tiles."""
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    pid = gl.program_id(0)
    n_c = I // (16 * WARPS)
    n_cs = Is // (16 * WARPS)
    if pid < SS * n_cs:
        ks = pid // n_cs
        c = pid - ks * n_cs
        cols = c * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, mma))
        wr = c * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, gl.BlockedLayout(
            [1, 8], [2, 16], [WARPS, 1], [1, 0])))
        per_s = Hd // 128 // SS
        for n0 in range(0, N, BM):  # every row block against the same weight rows: re-read from L1 / L2
            xr = gl.minimum(n0 + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l3))), N - 1)
            acc_g = _dense_product(X, Sw, xr, wr, ks * per_s, ks * per_s + per_s, stride_x, stride_sw, BM, WARPS)
            acc_u = _dense_product(X, Sw, xr, wr + Is, ks * per_s, ks * per_s + per_s, stride_x, stride_sw, BM,
                                   WARPS)
            n = n0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
            _gate_up_out(acc_g, acc_u, n, N * TOPK + n, n < N, cols, Is, Hbuf, Gs, Count,
                         NB * n_c + (n0 // BM) * n_cs + c, Is, stride_h, stride_gs, SS)
    else:
        ppi = Hd // 256  # tile pairs an item
        used = gl.load(Used)
        # CHUNK pairs a chunk, fewer when the programs would not all get one (few items: a token's experts)
        chunk = gl.maximum(gl.minimum(used * n_c * ppi // P, CHUNK), 1)
        cpi = (ppi + chunk - 1) // chunk  # chunks an item
        n_chunks = used * n_c * cpi
        k = gl.atomic_add(Queue, 1, sem="relaxed")
        while k < n_chunks:
            item = k // cpi
            k0 = (k - item * cpi) * chunk
            _routed_item(X, Wp, Ws, Hbuf, Gacc, Count, BlockExpert, BlockStart, BlockEnd, SortedIdx, item, used, n_c,
                         I, k0, gl.minimum(k0 + chunk, ppi), cpi, stride_x, stride_we, stride_wm, stride_se, stride_sm,
                         stride_h, stride_g, TOPK, BM, WARPS, DTYPE, OUT_SCALE)
            k = gl.atomic_add(Queue, 1, sem="relaxed")
        if k == n_chunks + P - 1:  # the last ticket: every program has taken its last one
            gl.store(Queue, 0)


@gluon.jit
def _routed_item(X, Wp, Ws, Hbuf, Gacc, Count, BlockExpert, BlockStart, BlockEnd, SortedIdx, item, used, n_c, I, k0,
                 k1, parts, stride_x, stride_we, stride_wm, stride_se, stride_sm, stride_h, stride_g,
                 TOPK: gl.constexpr, BM: gl.constexpr, WARPS: gl.constexpr, DTYPE: gl.constexpr,
                 OUT_SCALE: gl.constexpr):
    """Pairs ``k0 .. k1`` of K tiles of routed item ``item`` (column tile ``item // used``, block ``item % used``),
    one of the ``parts`` chunks of the item (:func:`_gate_up_out`)."""
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    c = item // used
    b = item - c * used
    e = gl.load(BlockExpert + b)
    start, end, rc, a = _block(BlockStart, BlockEnd, SortedIdx, b, gl.SliceLayout(1, gl.SliceLayout(2, x_l3)), BM)
    acc_g, acc_u = _routed_gate_up(X, Wp, Ws, e.to(gl.int64), c * WARPS, a // TOPK, I, 2 * k0, 2 * k1, stride_x,
                                   stride_we, stride_wm, stride_se, stride_sm, BM, WARPS, DTYPE)
    rows = start + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    cols = c * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, mma))
    _gate_up_out(acc_g * OUT_SCALE, acc_u * OUT_SCALE, rows, rows, rows < end, cols, I, Hbuf, Gacc, Count,
                 b * n_c + c, I, stride_h, stride_g, parts)


@gluon.jit
def _down_mma_kernel(Hbuf, Wp, Ws, Sd, Acc, Out, TopkW, Count, Used, BlockExpert, BlockStart, BlockEnd, SortedIdx,
                     N, E, Hd, I, Is, NB, SDS, stride_h, stride_we, stride_wm, stride_se, stride_sm, stride_sd, stride_a,
                     stride_o, TOPK: gl.constexpr, BM: gl.constexpr, WARPS: gl.constexpr, SPLIT: gl.constexpr,
                     CT: gl.constexpr, DTYPE: gl.constexpr, OUT_SCALE: gl.constexpr):
    """Grid ``(NB + SDS, Hd / (16 WARPS CT), SPLIT)``: ``Acc [N, Hd]`` fp32 (initialised by the caller) ``+=``
    output column tiles ``CT c .. CT c + CT`` of ``16 WARPS`` columns by atomics, then the column group's last
    program to arrive (counter ``c``, left at 0) writes them to ``Out [N, Hd]`` in its dtype.

    Program ``b < NB``: ``topk_w h Wd^T`` of routed block ``b`` (``Wp``/``Ws``: :func:`repack_mma` of ``w2``;
    split ``z`` of its ``I / 128`` K tiles); the blocks past the ``Used[0]`` that own rows exit at once, without
    arriving (block 0 arrives always). Program ``b >= NB``: split ``b - NB`` of ``SDS`` of ``h Sd^T`` (``z = 0``
    only; every split arrives), the shared expert ``Sd [Hd, Is]`` (h rows ``N TOPK + token``), every token in
    blocks of ``BM``. ``Hbuf``: h in :func:`mma_order`. Each routed split's K tiles must be even in number."""
    x_l3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    cast_l: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [WARPS, 1], [1, 0])
    b = gl.program_id(0)
    c = gl.program_id(1)
    z = gl.program_id(2)
    live = gl.minimum(gl.maximum(gl.load(Used), 1), NB)  # routed programs that arrive, a split each
    if b < NB:
        if b < live:
            e = gl.load(BlockExpert + b)
            if e < E:
                per = I // 128 // SPLIT
                _routed_down(Hbuf, Wp, Ws, Acc, TopkW, BlockStart, BlockEnd, SortedIdx, b, e.to(gl.int64), c * CT,
                             z * per, per, Hd, stride_h, stride_we, stride_wm, stride_se, stride_sm, stride_a, TOPK, BM,
                             WARPS, CT, DTYPE, OUT_SCALE)
    else:
        if z == 0:
            ks = b - NB
            per_s = Is // 128 // SDS
            for ci in range(CT):
                cols = (c * CT + ci) * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, mma))
                wr = (c * CT + ci) * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(1, gl.BlockedLayout(
                    [1, 8], [2, 16], [WARPS, 1], [1, 0])))
                for n0 in range(0, N, BM):  # every row block against the same weight rows: re-read from L1 / L2
                    hr = N * TOPK + gl.minimum(
                        n0 + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l3))), N - 1)
                    acc = _dense_product(Hbuf, Sd, hr, wr, ks * per_s, ks * per_s + per_s, stride_h, stride_sd, BM,
                                         WARPS)
                    rows = n0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
                    dst = Acc + gl.expand_dims(rows.to(gl.int64) * stride_a, 0) + gl.expand_dims(cols, 1)
                    gl.atomic_add(dst, acc, mask=gl.expand_dims(rows < N, 0) & gl.expand_dims(cols < Hd, 1),
                                  sem="relaxed")
    if (b >= NB) | (b < live):
        _cta_barrier()  # every thread's sums added before the arrival is released
        if gl.atomic_add(Count + c, 1, sem="acq_rel") == (live + SDS) * SPLIT - 1:
            for ci in range(CT):
                oc = (c * CT + ci) * (16 * WARPS) + gl.arange(0, 16 * WARPS, layout=gl.SliceLayout(0, cast_l))
                for r0 in range(0, N, CAST_ROWS):
                    orow = r0 + gl.arange(0, CAST_ROWS, layout=gl.SliceLayout(1, cast_l))
                    m = gl.expand_dims(orow < N, 1) & gl.expand_dims(oc < Hd, 0)
                    r64 = gl.expand_dims(orow.to(gl.int64), 1)
                    v = gl.load(Acc + r64 * stride_a + gl.expand_dims(oc, 0), mask=m, other=0.0, cache_modifier=".cg")
                    gl.store(Out + r64 * stride_o + gl.expand_dims(oc, 0), v.to(Out.dtype.element_ty), mask=m)
            gl.store(Count + c, 0)  # for the next launch


# --------------------------------------------------------------------------------------------------
# Plan and launch
# --------------------------------------------------------------------------------------------------

WARPS = 4
# Warps an SM the plan aims for in the down kernel (K splits raise the count when few blocks own rows): each warp
# keeps one K tile of loads in flight, and the bytes in flight set the bandwidth a latency-bound stream reaches.
# Higher targets split more and were slower at N = 9-33 (bench/RESULTS.md, "INT4 routed experts").
WARPS_PER_SM = 8
MAX_SPLIT = 8
DOWN_TILES = 16  # K tiles of 128 a down program streams at most (over its column tiles): EP8's I = 2048 in one
REGISTERS_PER_SM = 65536  # sm_90 and sm_120
# K tile pairs a routed gate_up chunk (an item of K2.6's H = 7168 is 28 pairs: 4 chunks): short enough that the
# chunks in flight cover an expert's blocks together and the last chunks end together, long enough that a
# chunk's pipeline start and its atomic sums stay small against its weight bytes (bench/RESULTS.md, "INT4 routed
# experts").
CHUNK_PAIRS = 7


def launch_options(block_m: int, dtype: torch.dtype) -> dict:
    """Launch options of both kernels: a register cap (``maxnreg``) by block size. Without one ptxas built the
    gate_up kernel for sm_120 with an 8-byte stack (bf16 blocks of 8 and 16 rows, fp16 blocks of 8; triton
    3.6); with it none of the builds spills (``python -m tritree.kernels.aot``)."""
    return {"num_warps": WARPS, "maxnreg": 128 if block_m == 8 else 168}


def resident_programs(block_m: int, sms: int) -> int:
    """Programs of ``WARPS`` warps that are resident at once on ``sms`` SMs under :func:`launch_options`'s register
    cap: the routed gate_up's grid, one wave."""
    return REGISTERS_PER_SM // (launch_options(block_m, torch.bfloat16)["maxnreg"] * 32 * WARPS) * sms


def shape_ok(H: int, I: int) -> bool:
    """Whether the kernels serve hidden size ``H`` and intermediate ``I``: both multiples of 256 (K tiles of
    128, two an iteration; CTAs of ``16 WARPS`` rows)."""
    return H % 256 == 0 and I % 256 == 0


@dataclass(frozen=True)
class Int4MmaPlan:
    """One shape's launch, from static shapes only.

    block_m: sorted rows a block (8 or 16: one or two ``mma.sync`` N tiles).
    num_blocks: the align's block bound (``align.min_blocks``).
    gate_up_programs: the routed gate_up's programs, which take its chunks from a queue (:func:`resident_programs`:
        one wave).
    down_split: the down kernel's K split (an even number of 128-column tiles a part).
    down_cols: output column tiles (of ``16 WARPS``) a down program streams one after the other (a divisor of
    ``H / (16 WARPS)``): with a small ``I`` a column tile is a few KB of weights.
    """

    block_m: int
    num_blocks: int
    gate_up_programs: int
    down_split: int
    down_cols: int = 1

    def as_ints(self) -> list[int]:
        return [self.block_m, self.num_blocks, self.gate_up_programs, self.down_split, self.down_cols]

    @classmethod
    def from_ints(cls, v) -> "Int4MmaPlan":
        return cls(*(int(a) for a in v))


def check_plan(plan: Int4MmaPlan, H: int, I: int, assignments: int, E: int) -> None:
    """A given plan must hold for any routing: the block bound, at least one gate_up program, and down K splits
    of even numbers of 128-column tiles."""
    bound = min_blocks(assignments, E, plan.block_m)
    if plan.block_m not in (8, 16):
        raise ValueError(f"plan.block_m must be 8 or 16, got {plan.block_m}")
    if plan.num_blocks < bound:
        raise ValueError(f"plan.num_blocks = {plan.num_blocks} is below the bound {bound} of {assignments} "
                         f"assignments in blocks of {plan.block_m}")
    if plan.gate_up_programs < 1:
        raise ValueError(f"plan.gate_up_programs must be >= 1, got {plan.gate_up_programs}")
    tiles = I // KT
    if plan.down_split < 1 or tiles % plan.down_split or (tiles // plan.down_split) % 2:
        raise ValueError(f"plan.down_split = {plan.down_split} must divide the {tiles} K tiles of {KT} columns into "
                         f"parts of an even number of tiles")
    col_tiles = H // (16 * WARPS)
    if plan.down_cols < 1 or col_tiles % plan.down_cols:
        raise ValueError(f"plan.down_cols = {plan.down_cols} must divide the {col_tiles} output column tiles")


def _split(warps: int, tiles: int, target: int) -> int:
    """The smallest K split (dividing ``tiles`` into even parts, at most ``MAX_SPLIT``) that brings ``warps`` to
    ``target``."""
    best = 1
    for s in range(1, MAX_SPLIT + 1):
        if tiles % s or (tiles // s) % 2:
            continue
        best = s
        if warps * s >= target:
            break
    return best


@functools.lru_cache(maxsize=1024)
def plan_int4_mma(N: int, topk: int, E: int, H: int, I: int, sms: int, global_experts: int | None = None,
                  block_m: int | None = None) -> Int4MmaPlan:
    """Block size by the expected rows an expert under uniform routing (8 up to 8 rows, else 16); gate_up one
    wave of streaming programs; the down kernel's K split by the warps the expected blocks give (``WARPS_PER_SM``
    a SM). ``block_m`` replaces the rule (benchmarks)."""
    A = N * topk
    G = max(E, global_experts or E)
    used = max(1, min(E, A, math.ceil(E * (1 - (1 - min(1.0, topk / G)) ** N) - 1e-9)))
    rows = max(1, -(-(A * E // G) // used) if G > E else -(-A // used))
    bm = block_m or (8 if rows <= 8 else 16)
    blocks = used * -(-rows // bm)
    target = WARPS_PER_SM * sms
    down_split = _split(blocks * H // 16, I // KT, target)
    return Int4MmaPlan(bm, min_blocks(A, E, bm), resident_programs(bm, sms), down_split,
                       _down_cols(blocks * down_split, H // (16 * WARPS), I // KT // down_split, target))


def _down_cols(programs: int, col_tiles: int, tiles: int, target: int) -> int:
    """Column tiles a down program streams: the most (a divisor of ``col_tiles``) that keep ``programs`` (blocks
    times splits) at ``target`` warps and a program at ``DOWN_TILES`` K tiles. A program's fixed part (the
    block's rows, the arrival) is paid once for its tiles."""
    best = 1
    for ct in range(2, col_tiles + 1):
        if col_tiles % ct:
            continue
        if ct * tiles > DOWN_TILES or programs * (col_tiles // ct) * WARPS < target:
            break
        best = ct
    return best


def _least_split(tiles: int, programs: int, target: int) -> int:
    """The smallest split of ``tiles`` K tiles (dividing them) that brings ``programs`` to ``target``."""
    for s in range(1, tiles + 1):
        if tiles % s == 0 and programs * s >= target:
            return s
    return tiles


def plan_shared_splits(H: int, I_shared: int, sms: int) -> tuple[int, int]:
    """K splits of the shared expert's gate_up (over the ``H / 128`` tiles) and down (over ``I_shared / 128``).
    Each shared program owns 16 ``WARPS`` weight rows and one split and runs every token's row block against them
    (the weights read from memory once, again from L1 / L2), one tile in flight: splits bring the programs to two
    an SM, and more would add fp32 atomics (``N x 2 I_shared`` a gate_up split)."""
    return (_least_split(H // KT, I_shared // (16 * WARPS), 2 * sms),
            _least_split(I_shared // KT, H // (16 * WARPS), 2 * sms))


def run_experts(xm, topk_idx, topk_w, w13, s13, w2, s2, acc, out, plan: Int4MmaPlan, gacc, shared=None) -> None:
    """The routed experts (and the shared expert) into ``out``: align, gate_up, down (no host sync).

    ``xm [N, H]``: the activations in :func:`mma_order` (bf16/fp16); ``acc [N, H]`` fp32, initialised (zeros, or
    the residual): the down kernel adds into it and writes the sums to ``out [N, H]`` (its dtype); ``gacc``:
    zeroed fp32 ``[N k, 2 I]`` (the sums of the gate_up items that programs share; left zeroed); ``shared``:
    ``(gate_up [2 Is, H], down [H, Is], (gate_up split, down split), gs)``: the shared expert in x's dtype (``Is``
    a multiple of 128), run with every token at weight 1, its K splits (:func:`plan_shared_splits`) and, when the
    gate_up split is above 1, ``gs``: zeroed fp32 ``[N, 2 Is]`` (left zeroed)."""
    N, H = xm.shape
    E, I2, _ = w13.shape
    I, k = I2 // 2, topk_idx.shape[1]
    if N == 0:
        return
    bm = plan.block_m
    sorted_idx, block_expert, block_start, block_end, used = align_routing(topk_idx, E, bm, plan.num_blocks)
    sw13, sd, (ss, sds), gs = shared if shared is not None else (xm, xm, (0, 0), None)  # none without shared
    Is = sd.shape[1] if shared is not None else 0
    sb = -(-N // bm) if shared is not None else 0
    hbuf = torch.empty(N * k + (N if shared is not None else 0), max(I, Is), dtype=xm.dtype, device=xm.device)
    gs = gs if gs is not None else gacc
    n_c, n_cs = I // (16 * WARPS), Is // (16 * WARPS)
    queue = plan.num_blocks * n_c + sb * n_cs  # after the gate_up items' and the shared tiles' counters
    count = arrival_counters(xm.device, max(queue + 1, H // (16 * WARPS)))
    dt = gl.bfloat16 if xm.dtype == torch.bfloat16 else gl.float16
    scale = BF16_OUT_SCALE if xm.dtype == torch.bfloat16 else 1.0
    _gate_up_mma_kernel[(ss * n_cs + plan.gate_up_programs,)](
        xm, w13, s13, sw13, hbuf, gacc, gs, count, count[queue:], used, block_expert, block_start, block_end,
        sorted_idx, N, E, H, I, Is, plan.num_blocks, ss, plan.gate_up_programs, xm.stride(0), w13.stride(0),
        16 * w13.stride(1), s13.stride(0), 16 * s13.stride(1), sw13.stride(0), hbuf.stride(0), gacc.stride(0),
        gs.stride(0), TOPK=k, BM=bm, WARPS=WARPS, CHUNK=CHUNK_PAIRS, DTYPE=dt, OUT_SCALE=scale,
        **launch_options(bm, xm.dtype))
    tw = topk_w.reshape(-1)
    if tw.dtype != torch.float32 or not tw.is_contiguous():
        tw = tw.float().contiguous()
    ct, dsplit = plan.down_cols, plan.down_split
    _down_mma_kernel[(plan.num_blocks + sds, H // (16 * WARPS) // ct, dsplit)](
        hbuf, w2, s2, sd, acc, out, tw, count, used, block_expert, block_start, block_end, sorted_idx, N, E, H, I, Is,
        plan.num_blocks, sds, hbuf.stride(0), w2.stride(0), 16 * w2.stride(1), s2.stride(0), 16 * s2.stride(1),
        sd.stride(0), acc.stride(0), out.stride(0),
        TOPK=k, BM=bm, WARPS=WARPS, SPLIT=dsplit, CT=ct, DTYPE=dt, OUT_SCALE=scale, **launch_options(bm, xm.dtype))


def launch(x, topk_idx, topk_w, w13, s13, w2, s2, out, plan: Int4MmaPlan) -> None:
    """The routed layer on mma-layout experts (``int4.Int4Experts`` with ``layout="mma"``): the activations in
    :func:`mma_order`, then :func:`run_experts` (align, gate_up, down, which writes ``out``). No host sync."""
    N, H = x.shape
    I, k = w13.shape[1] // 2, topk_idx.shape[1]
    acc = torch.zeros(N, H, dtype=torch.float32, device=x.device)
    gacc = zeroed_workspace(x.device, N * k * 2 * I)[:N * k * 2 * I].view(N * k, 2 * I)
    run_experts(mma_order(x), topk_idx, topk_w, w13, s13, w2, s2, acc, out, plan, gacc)
