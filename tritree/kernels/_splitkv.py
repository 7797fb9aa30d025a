"""The split-KV attention core shared by the verify and draft attentions (flash-decoding).

A request's keys are cut into ``num_splits`` contiguous chunks, one program per (row block, chunk),
so that one request fills the GPU. Each program keeps an online softmax in base 2 (scores are
pre-multiplied by ``sm_scale * log2(e)``) and writes a partial ``(o / l, m + log2 l)`` per row; the
combine kernel merges the partials. ``num_splits`` depends only on static shapes (batch, rows, page
table capacity, SM count) so a launch can be captured in a CUDA graph; the chunk length itself is
computed on the device from each request's length.

Output rows are ``row = t * H + h`` over ``[B, T, H, D]`` outputs; partials are
``part_o: [B, S, T*H, D] float32`` and ``part_lse: [B, S, T*H] float32`` (log2 units, ``-inf`` where a
chunk had no visible key for the row).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def online_softmax_step(qk, m_i, l_i):
    """One tile of the online softmax. ``qk``: [BM, BN] scores in log2 units, -inf where masked.

    Returns ``p`` (unnormalised probabilities), ``alpha`` (rescale of the running accumulator) and
    the new running max and sum. Rows that have seen no visible key keep ``m = -inf, l = 0``.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def finalize_rows(acc, m_i, l_i):
    """``(acc / l, m + log2 l)`` per row; ``(0, -inf)`` for rows with no visible key."""
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse2 = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))
    return o, lse2


@triton.jit
def _softmax_tile(qk, visible, m_i, l_i, sm_scale_log2e, MASKED: tl.constexpr, PRESCALED: tl.constexpr):
    if PRESCALED:
        qk = qk.to(tl.float32)
    else:
        qk = (qk * sm_scale_log2e).to(tl.float32)  # Inductor passes Python floats as fp64
    if MASKED:
        qk = tl.where(visible, qk, float("-inf"))
    return online_softmax_step(qk, m_i, l_i)


@triton.jit
def attend_tile(qk, v, visible, m_i, l_i, acc, sm_scale_log2e, MASKED: tl.constexpr, IEEE: tl.constexpr,
                SPLIT_SCORES: tl.constexpr = False, PRESCALED: tl.constexpr = False):
    """Folds one KV tile into the running softmax: ``qk: [BM, BN]`` raw scores, ``v: [BN, Dv]``
    values, ``visible: [BM, BN]`` (read only when ``MASKED``). Returns ``(m, l, acc)``.

    ``IEEE``: exact fp32 products for fp32 inputs (tf32 would miss the 1e-5 fp32 tolerance); a bool,
    not a string constexpr, because Inductor re-emits user kernels and strings do not survive that.

    ``SPLIT_SCORES``: the softmax runs inside a branch that is always taken (on a runtime value the
    compiler cannot fold). Triton gives a dot whose result feeds another dot all the warps along M
    (``warpsPerCTA = [num_warps, 1]``); with 64 rows on 8 warps both warpgroups then compute the same
    scores. Values leaving an ``scf.if`` are not uses of the scores, so the score dot gets the
    ordinary layout instead (the warpgroups split the keys) and P reaches the second dot through
    shared memory, as in FlashMLA. ``PRESCALED``: ``qk`` already carries ``sm_scale_log2e``."""
    if SPLIT_SCORES:
        if sm_scale_log2e > 0.0:
            p, alpha, m_i, l_i = _softmax_tile(qk, visible, m_i, l_i, sm_scale_log2e, MASKED, PRESCALED)
        else:  # never taken (the scale is positive); differs so the two branches cannot be merged
            p, alpha, m_i, l_i = _softmax_tile(-qk, visible, m_i, l_i, -sm_scale_log2e, MASKED, PRESCALED)
    else:
        p, alpha, m_i, l_i = _softmax_tile(qk, visible, m_i, l_i, sm_scale_log2e, MASKED, PRESCALED)
    acc = acc * alpha[:, None]
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_i, l_i, acc


@triton.jit
def store_rows(Out, Lse, acc, m_i, l_i, row_ok, row_in, b, pid_s, t, h, part_row,
               stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
               SINGLE_SPLIT: tl.constexpr, D: tl.constexpr):
    """Writes a program's rows. One split: the final ``Out[b, t, h, :]`` (output dtype) and
    ``Lse[b, t, h]`` (natural log). Several: the partials ``Out[b, pid_s, part_row, :]`` (fp32) and
    ``Lse[b, pid_s, part_row]`` (log2), whose row strides are ``stride_oh`` / ``stride_lh``.
    ``row_ok``: rows with a real query (others get zeros and -inf); ``row_in``: rows that exist."""
    o, lse2 = finalize_rows(acc, m_i, l_i)
    o = tl.where(row_ok[:, None], o, 0.0)
    lse2 = tl.where(row_ok, lse2, float("-inf"))
    d = tl.arange(0, D)
    if SINGLE_SPLIT:
        o_ptr = Out + b.to(tl.int64) * stride_ob + (t * stride_ot + h * stride_oh)[:, None] + d[None, :]
        tl.store(o_ptr, o.to(Out.dtype.element_ty), mask=row_in[:, None])
        tl.store(Lse + b.to(tl.int64) * stride_lb + t * stride_lt + h * stride_lh, lse2 * 0.6931471805599453,
                 mask=row_in)
    else:
        o_ptr = (Out + b.to(tl.int64) * stride_ob + pid_s.to(tl.int64) * stride_os
                 + part_row.to(tl.int64)[:, None] * stride_oh + d[None, :])
        tl.store(o_ptr, o.to(Out.dtype.element_ty), mask=row_in[:, None])
        tl.store(Lse + b.to(tl.int64) * stride_lb + pid_s * stride_ls + part_row * stride_lh, lse2, mask=row_in)


@triton.jit
def page_group(PageTable, page_base, g, max_pages, num_pages, PAGE_SIZE: tl.constexpr, PAGE_GROUP: tl.constexpr):
    """Page ids of the ``PAGE_GROUP`` pages from key ``g`` (page-aligned) on, in one vector load, clamped
    into the pool: loaded ahead of their tiles, so no K/V address of the tile loop waits on a load
    made inside it (Triton's pipeliner then runs the next tiles' copies under this tile's math)."""
    cols = tl.minimum(g // PAGE_SIZE + tl.arange(0, PAGE_GROUP), max_pages - 1)
    return tl.minimum(tl.maximum(tl.load(PageTable + page_base + cols), 0), num_pages - 1)


@triton.jit
def page_of(pages, g, n, PAGE_SIZE: tl.constexpr, PAGE_GROUP: tl.constexpr):
    """The page id of key ``n`` from a :func:`page_group` vector starting at key ``g`` (a register select)."""
    return tl.sum(tl.where(tl.arange(0, PAGE_GROUP) == (n - g) // PAGE_SIZE, pages, 0), 0)


def split_destinations(out, lse, num_splits: int, rows: int, narrow: bool = False):
    """Where a split-KV kernel writes: ``(dst_o, dst_l, o_strides, l_strides)`` for
    :func:`store_rows`. One split writes ``out``/``lse`` directly; several write partials
    ``[B, S, rows, D]`` / ``[B, S, rows]`` (float32 lse) for :func:`combine_splits`, the rows in
    float32, or in a 16-bit ``out``'s dtype with ``narrow`` (the Gluon kernels' staged stores)."""
    if num_splits == 1:
        return (out, lse, (out.stride(0), out.stride(1), out.stride(2), 0),
                (lse.stride(0), lse.stride(1), lse.stride(2), 0))
    B, D = out.shape[0], out.shape[-1]
    narrow = bool(narrow) and out.dtype in (torch.bfloat16, torch.float16)
    dst_o = torch.empty(B, num_splits, rows, D, dtype=out.dtype if narrow else torch.float32, device=out.device)
    dst_l = torch.empty(B, num_splits, rows, dtype=torch.float32, device=out.device)
    return (dst_o, dst_l, (dst_o.stride(0), 0, dst_o.stride(2), dst_o.stride(1)),
            (dst_l.stride(0), 0, dst_l.stride(2), dst_l.stride(1)))


# The merge signals dependents at its start (``griddepcontrol.launch_dependents``; a no-op unless the next
# kernel is launched by programmatic dependent launch, as the warp-specialised verify split kernel is): that
# kernel's grid is then placed while the merge runs and waits for the merge's completion itself (in
# ``griddepcontrol.wait``), which takes ~1 us off each verify call (bench/RESULTS.md, verify attention).
def pdl_capable(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use programmatic dependent launch (``griddepcontrol``): a
    Hopper-or-later GPU, not the interpreter."""
    return (device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def merge_signals(device: torch.device) -> bool:
    """Whether the merge on ``device`` signals dependents at its start (``pdl_capable``)."""
    return pdl_capable(device)


@triton.jit
def _combine_kernel(
    PartO, PartLse, Out, Lse,
    stride_pob, stride_pos, stride_pom,
    stride_plb, stride_pls,
    stride_ob, stride_ot, stride_oh,
    stride_lb, stride_lt, stride_lh,
    H, num_splits,
    SPLIT_CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SIGNAL: tl.constexpr = False,
):
    # One pass with a running maximum (the partials' lse are log2): each chunk's partial rows and
    # lse are loaded together, so a chunk costs one memory round trip and chunks can be in flight
    # together (the merge is bound by bytes in flight, not by arithmetic).
    if SIGNAL:  # a kernel launched after this one by programmatic dependent launch may be placed now
        gdc_launch_dependents()
    row = tl.program_id(0)
    b = tl.program_id(1)
    pid_d = tl.program_id(2)
    t = row // H
    h = row % H
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    lse_base = PartLse + b.to(tl.int64) * stride_plb + row
    o_base = PartO + b.to(tl.int64) * stride_pob + row.to(tl.int64) * stride_pom
    m = tl.full([1], float("-inf"), tl.float32)
    denom = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        ss = s0 + tl.arange(0, SPLIT_CHUNK)
        s_ok = ss < num_splits
        o = tl.load(o_base + ss[:, None].to(tl.int64) * stride_pos + d[None, :], mask=s_ok[:, None], other=0.0)
        part_lse = tl.load(lse_base + ss * stride_pls, mask=s_ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(part_lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(part_lse - m_safe)
        denom = denom * alpha + tl.sum(w, 0)
        acc = acc * alpha + tl.sum(o.to(tl.float32) * w[:, None], 0)
        m = m_new
    has = denom > 0.0
    out = acc / tl.where(has, denom, 1.0)
    out_ptr = Out + b.to(tl.int64) * stride_ob + t * stride_ot + h * stride_oh + d
    tl.store(out_ptr, out.to(Out.dtype.element_ty))
    if pid_d == 0:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lse = tl.where(has, (m_safe + tl.log2(tl.where(has, denom, 1.0))) * 0.6931471805599453, float("-inf"))
        lse_ptr = Lse + b.to(tl.int64) * stride_lb + t * stride_lt + h * stride_lh + tl.arange(0, 1)
        tl.store(lse_ptr, lse)


# Enough merge programs that every SM holds several (the merge is bound by bytes in flight), at most
# this many fp32 partial values loaded per program per chunk, and 8 warps from this many values (else 4).
_COMBINE_MIN_PROGRAMS = 1024
_COMBINE_CHUNK_VALUES = 4096
_COMBINE_WARPS8_VALUES = 8192
# 16-bit partials by columns, where there are rows enough: a warp's 16-byte loads cover 256 columns of one
# split, so 256-column warps side by side, each thread summing its splits in registers (a 256-column block
# whose 4 warps took 4 splits summed them through shared memory: twice the merge time). At most 16 splits
# a chunk (<= 128 bf16 values, 64 registers, a thread: one round of loads), and 512-column programs (two
# warps) where there are rows enough.
_COMBINE_16BIT_MIN_PROGRAMS = 256
_COMBINE_16BIT_MAX_CHUNK = 16


def combine_config(rows: int, splits: int, D: int, elem_bytes: int = 4) -> tuple[int, int, int]:
    """``(BLOCK_D, SPLIT_CHUNK, num_warps)`` of the merge of ``splits`` partials of ``rows`` rows
    (all batches) of ``D`` columns: column blocks narrowed until there are enough programs, then
    as many splits per chunk as fit ``_COMBINE_CHUNK_VALUES``. 16-bit partials (``elem_bytes`` = 2): where
    there are enough rows, whole 256-column warps side by side."""
    if elem_bytes == 2 and D % 256 == 0 and rows * (D // 256) >= _COMBINE_16BIT_MIN_PROGRAMS:
        wide = D % 512 == 0 and rows * (D // 512) >= 2 * _COMBINE_16BIT_MIN_PROGRAMS
        block_d = 512 if wide else 256
        chunk = max(1, min(triton.next_power_of_2(splits), _COMBINE_16BIT_MAX_CHUNK))
        return block_d, chunk, block_d // 256
    block_d = D
    while block_d > 32 and block_d % 2 == 0 and rows * (D // block_d) < _COMBINE_MIN_PROGRAMS:
        block_d //= 2
    chunk = max(1, min(triton.next_power_of_2(splits), _COMBINE_CHUNK_VALUES // block_d))
    num_warps = 8 if chunk * block_d >= _COMBINE_WARPS8_VALUES else 4  # <= 64 values per thread
    return block_d, chunk, num_warps


class MergePlan:
    """The merge of ``[B, S, M, D]`` partials (``partials_dtype``, contiguous) and ``[B, S, M]`` lse into
    ``out: [B, T, H, D]`` / ``lse: [B, T, H]`` of the given strides, for one static signature: grid, tiles
    and every integer argument decided once; ``run`` launches the compiled merge directly."""

    def __init__(self, B: int, S: int, M: int, D: int, H: int, partials_dtype: torch.dtype,
                 out_strides: tuple, lse_strides: tuple, device: torch.device):
        from ._launch import KernelLauncher

        elem = torch.empty((), dtype=partials_dtype).element_size()
        block_d, chunk, num_warps = combine_config(B * M, S, D, elem)
        self.grid = (M, B, D // block_d)
        self.args = (S * M * D, M * D, D, S * M, M, *out_strides[:3], *lse_strides[:3], H, S)
        self.launcher = KernelLauncher(_combine_kernel, dict(SPLIT_CHUNK=chunk, BLOCK_D=block_d,
                                                             SIGNAL=merge_signals(device)), num_warps=num_warps)

    def run(self, part_o, part_lse, out, lse) -> None:
        self.launcher(self.grid, part_o, part_lse, out, lse, *self.args)


def combine_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   launch=None) -> None:
    """Merges ``part_o: [B, S, T*H, D]``, ``part_lse: [B, S, T*H]`` (log2) into ``out: [B, T, H, D]``
    and ``lse: [B, T, H]`` (natural log). ``launch`` wraps the kernel (``torch.library.wrap_triton``: the
    path torch.compile traces; eager calls use :class:`MergePlan`)."""
    B, S, M, D = part_o.shape
    H = out.shape[2]
    block_d, chunk, num_warps = combine_config(B * M, S, D, part_o.element_size())
    kernel = _combine_kernel if launch is None else launch(_combine_kernel)
    kernel[(M, B, D // block_d)](
        part_o, part_lse, out, lse,
        part_o.stride(0), part_o.stride(1), part_o.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        H, S,
        # Every constexpr passed, defaulted ones too: torch.compile's wrap_triton fills in no defaults.
        SPLIT_CHUNK=chunk, BLOCK_D=block_d, SIGNAL=launch is None and merge_signals(part_o.device),
        num_warps=num_warps,
    )


def choose_num_splits(*, batch: int, row_blocks: int, max_keys: int, block_n: int, sms: int,
                      programs_per_sm: int = 1, min_tiles_per_split: int = 4, max_splits: int = 256,
                      whole_waves: bool = False) -> int:
    """Split count from static shapes only: enough programs to fill ``sms * programs_per_sm``, no
    chunk shorter than ``min_tiles_per_split`` tiles of the page-table capacity ``max_keys``.
    ``whole_waves``: round the split count down, so that the programs never spill into a partly
    filled extra wave (for kernels with one resident program per SM: 9 row blocks at two per SM
    would otherwise make 270 programs on 132 SMs, a third wave of 6)."""
    per = max(1, batch * row_blocks)
    want = max(1, (sms * programs_per_sm) // per) if whole_waves else math.ceil(sms * programs_per_sm / per)
    by_len = max(1, max_keys // (block_n * min_tiles_per_split))
    return int(max(1, min(want, by_len, max_splits)))


def balanced_num_splits(*, batch: int, row_blocks: int, max_keys: int, block_n: int, sms: int,
                        min_tiles_per_split: int = 4, max_splits: int = 256, fixed_tiles: int = 4,
                        slack: float = 0.05) -> int:
    """Split count for a kernel with one resident program an SM whose (row block, split) programs do not
    fill whole waves: the smallest count within ``slack`` of the least modelled time, where a launch of
    ``S`` splits takes ``ceil(batch row_blocks S / sms)`` waves of programs that each walk
    ``ceil(max_keys / (S block_n))`` tiles plus ``fixed_tiles`` of fixed cost (queries, prologue, store).
    Static shapes only. With ``batch row_blocks`` between ``sms / 2`` and ``sms`` (four requests of 65 x 8
    rows in 32-row blocks: 68 on 132 SMs) whole waves would leave one split and half the SMs idle; several
    short waves of more splits come nearer the ``batch row_blocks / sms`` of perfect balance."""
    per = max(1, batch * row_blocks)
    tiles = max(1, -(-max_keys // block_n))
    top = int(max(1, min(max_splits, max_keys // (block_n * min_tiles_per_split))))

    def cost(S: int) -> int:
        return -(-per * S // sms) * (-(-tiles // S) + fixed_tiles)

    best = min(cost(S) for S in range(1, top + 1))
    return next(S for S in range(1, top + 1) if cost(S) <= best * (1 + slack))


@triton.jit
def split_chunk(n_keys, pid_s, num_splits, ALIGN: tl.constexpr):
    """Keys ``[start, end)`` of split ``pid_s`` of ``num_splits`` over ``n_keys`` keys: chunks of
    ``cdiv(n_keys, num_splits)`` rounded up to a multiple of ``ALIGN`` (a page or a tile), the last one cut
    at ``n_keys`` (chunks past it are empty: ``start >= end``). Plain ``tl`` scalar ops, so Triton and
    Gluon kernels share it."""
    chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), ALIGN) * ALIGN
    start = pid_s * chunk
    end = tl.minimum(start + chunk, n_keys)
    return start, end
