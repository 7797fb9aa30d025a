"""DFlash draft attention: a block of queries over a paged GQA context cache plus the block's own keys.

Every block query sees every context token of its request (or those within ``window`` positions) and
every block token: no causal mask. The (block slots x query heads of one KV head) rows are packed into
the matrix-multiply rows, so each context K/V tile, loaded once, serves the whole block and the whole
GQA group. The context is split across programs with the split-KV core that :mod:`.verify_mla` uses
(:mod:`._splitkv`: the tile step, the row store, the combine); the last split also takes the block's
own keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, StreamScratch, eager, interpreting, scalars, signature, uses_kernel
from ._splitkv import (
    LOG2E,
    MergePlan,
    attend_tile,
    choose_num_splits,
    combine_splits,
    page_group,
    page_of,
    split_chunk,
    split_destinations,
    store_rows,
)
from .configs import AttnConfig, arch_of, lookup, num_sms

# Rows bucket (block slots x heads per KV head) -> config. Kimi-K2.6-DFlash: 64 query / 8 KV heads of
# 128, block 8 -> 64 rows per KV head. On sm_120 (and sm_80) 64-row tiles need 244-255 registers on 8
# warps and spill on 4 (the paged gather keeps a 64-bit address per K and V element in flight); 32-row
# tiles on 8 warps stay near 200, within 101,376 B of shared memory (tests/kernels/test_aot_audit.py).
DRAFT_ATTN_CONFIGS: dict[str, dict[int, AttnConfig]] = {
    "sm_90": {
        16: AttnConfig(16, 64, 4, 2),
        # Page ids loaded ahead of their tiles, 3 stages: faster than 64x64x4x2 without them at K2.6-DFlash
        # shapes (H200; bench/RESULTS.md, section "draft_attention").
        1 << 30: AttnConfig(64, 64, 4, 3, hoist_pages=True),
    },
    "sm_120": {
        16: AttnConfig(16, 64, 4, 2),
        # Page ids hoisted, 32x64 tiles, 3 stages: 77,824 B, 202 registers for sm_120, no spill; in emulation
        # (DISABLE_MMA_V3=1 on the H200) 2.3x faster than 32x32x8x2 at K2.6-DFlash shapes, and ahead of 64x64x8x1
        # except with a sliding window (bench/RESULTS.md, section "sm_120").
        1 << 30: AttnConfig(32, 64, 8, 3, hoist_pages=True),
    },
    "sm_80": {
        16: AttnConfig(16, 64, 4, 2),
        1 << 30: AttnConfig(32, 32, 8, 2),
    },
    "cpu": {
        1 << 30: AttnConfig(32, 32, 4, 1),
    },
}


# --------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------

def draft_attention_reference(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, *, sm_scale, window=None,
                              return_lse=False):
    """Plain PyTorch draft attention with the semantics of :func:`draft_attention`, computed in
    ``promote(q.dtype, float32)``; reads the lengths on the host (a specification, not a fast path)."""
    B, S, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    cdt = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(B, S, Hq, D, dtype=cdt, device=q.device)
    lse = torch.zeros(B, S, Hq, dtype=cdt, device=q.device)
    for b, L in enumerate(ctx_lens.tolist()):
        pos = torch.arange(L, device=q.device)
        pages = page_table[b, pos // P].long()
        k = torch.cat([k_cache[pages, pos % P], k_blk[b]]).to(cdt).repeat_interleave(Hq // Hkv, dim=1)
        v = torch.cat([v_cache[pages, pos % P], v_blk[b]]).to(cdt).repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("shd,khd->hsk", q[b].to(cdt), k) * sm_scale  # [Hq, S, L + S]
        if window is not None:
            q_pos = L + torch.arange(S, device=q.device)
            k_pos = torch.arange(L + S, device=q.device)
            far = (q_pos[:, None] - k_pos[None, :]).abs() >= window
            scores = scores.masked_fill(far[None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        out[b] = torch.einsum("hsk,khd->shd", torch.exp(scores - row_lse[..., None]), v)
        lse[b] = row_lse.transpose(0, 1)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------

@triton.jit
def _ctx_tile(Cache, PageTable, s, s_ok, page_base, kvh, stride_p, stride_s, stride_h, max_pages, num_pages,
              PAGE_SIZE: tl.constexpr, HEAD_D: tl.constexpr):
    """Rows ``s`` of one KV head of a paged ``[num_pages, P, Hkv, D]`` pool; page ids clamped into the
    pool (a bad layout gives wrong rows, never a fault)."""
    col = tl.minimum(s // PAGE_SIZE, max_pages - 1)
    page = tl.load(PageTable + page_base + col)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    tok = page * stride_p + (s % PAGE_SIZE) * stride_s + kvh * stride_h
    return tl.load(Cache + tok[:, None] + tl.arange(0, HEAD_D)[None, :], mask=s_ok[:, None], other=0.0)


@triton.jit
def _scores(q, k, IEEE: tl.constexpr):
    if IEEE:  # exact fp32 products for fp32 inputs
        return tl.dot(q, tl.trans(k), input_precision="ieee")
    return tl.dot(q, tl.trans(k))


@triton.jit
def _attend_kv(q, k, v, visible, m_i, l_i, acc, sm_scale_log2e, MASKED: tl.constexpr, UPCAST: tl.constexpr,
               IEEE: tl.constexpr):
    if UPCAST:  # interpreter: its bf16 dot is wrong
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return attend_tile(_scores(q, k, IEEE), v, visible, m_i, l_i, acc, sm_scale_log2e, MASKED, IEEE)


@triton.jit
def _ctx_step(q, KC, VC, PageTable, s, s_ok, visible, page_base, kvh, stride_kcp, stride_kcs, stride_kch,
              stride_vcp, stride_vcs, stride_vch, max_pages, num_pages, m_i, l_i, acc, sm_scale_log2e,
              PAGE_SIZE: tl.constexpr, HEAD_D: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr,
              IEEE: tl.constexpr):
    """One tile of context keys ``s``: K and V from the paged pools, then the softmax update."""
    k = _ctx_tile(KC, PageTable, s, s_ok, page_base, kvh, stride_kcp, stride_kcs, stride_kch, max_pages, num_pages,
                  PAGE_SIZE, HEAD_D)
    v = _ctx_tile(VC, PageTable, s, s_ok, page_base, kvh, stride_vcp, stride_vcs, stride_vch, max_pages, num_pages,
                  PAGE_SIZE, HEAD_D)
    return _attend_kv(q, k, v, visible, m_i, l_i, acc, sm_scale_log2e, MASKED, UPCAST, IEEE)


@triton.jit
def _draft_attention_kernel(
    Q, KC, VC, PageTable, CtxLens, KB, VB,
    Out, Lse,
    sm_scale_log2e,
    stride_qb, stride_qs, stride_qh,
    stride_kcp, stride_kcs, stride_kch,
    stride_vcp, stride_vcs, stride_vch,
    stride_ptb, max_pages, num_pages,
    stride_kbb, stride_kbs, stride_kbh,
    stride_vbb, stride_vbs, stride_vbh,
    stride_ob, stride_ot, stride_oh, stride_os,
    stride_lb, stride_lt, stride_lh, stride_ls,
    S, Hq, Hkv, num_splits, window,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    HOIST_PAGES: tl.constexpr = False,
    PAGE_GROUP: tl.constexpr = 16,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    ctx_len = tl.maximum(tl.load(CtxLens + b), 0)  # unchecked lengths: no key before the first page

    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = slot * GROUP + head within the group
    slot = r // GROUP
    h = kvh * GROUP + r % GROUP
    row_ok = r < S * GROUP
    q = tl.load(Q + b.to(tl.int64) * stride_qb + (slot * stride_qs + h * stride_qh)[:, None]
                + tl.arange(0, HEAD_D)[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:  # interpreter: its bf16 dot is wrong
        q = q.to(tl.float32)
    # Window: the key at position p is visible to row r iff p > q_pos(r) - window (and, for block keys,
    # the symmetric bound); q_pos(r) = ctx_len + slot(r).
    key_floor = ctx_len + slot - window

    lo = 0
    if HAS_WINDOW:  # the earliest context key any row of the block can see
        lo = tl.maximum(ctx_len - window + 1, 0)
    if HOIST_PAGES:
        # Page-aligned chunks (P >= BLOCK_N, so tiles never straddle pages): the keys before ``lo``
        # that this adds are outside the window, which the full tiles mask anyway.
        lo = (lo // PAGE_SIZE) * PAGE_SIZE
        start, end = split_chunk(ctx_len - lo, pid_s, num_splits, PAGE_SIZE)
    else:
        start, end = split_chunk(ctx_len - lo, pid_s, num_splits, BLOCK_N)
    start += lo
    end += lo
    full_end = start + (tl.maximum(end - start, 0) // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    page_base = b.to(tl.int64) * stride_ptb
    offs_n = tl.arange(0, BLOCK_N)

    # Full context tiles: unmasked unless a window applies; then the chunk's remainder (< BLOCK_N keys).
    if HOIST_PAGES:
        # Page ids of PAGE_GROUP pages in one load ahead of their tiles (as in verify_mla).
        offs_d = tl.arange(0, HEAD_D)
        for g in range(start, full_end, PAGE_GROUP * PAGE_SIZE):
            pages = page_group(PageTable, page_base, g, max_pages, num_pages, PAGE_SIZE, PAGE_GROUP)
            for n in range(g, tl.minimum(g + PAGE_GROUP * PAGE_SIZE, full_end), BLOCK_N):
                page = page_of(pages, g, n, PAGE_SIZE, PAGE_GROUP).to(tl.int64)
                rows = ((n % PAGE_SIZE) + offs_n).to(tl.int64)
                k = tl.load(KC + page * stride_kcp + kvh * stride_kch + rows[:, None] * stride_kcs + offs_d[None, :])
                v = tl.load(VC + page * stride_vcp + kvh * stride_vch + rows[:, None] * stride_vcs + offs_d[None, :])
                s = n + offs_n
                m_i, l_i, acc = _attend_kv(q, k, v, s[None, :] > key_floor[:, None], m_i, l_i, acc, sm_scale_log2e,
                                           HAS_WINDOW, UPCAST, IEEE)
    else:
        for n in range(start, full_end, BLOCK_N):
            s = n + offs_n
            m_i, l_i, acc = _ctx_step(q, KC, VC, PageTable, s, s < full_end, s[None, :] > key_floor[:, None],
                                      page_base, kvh, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs,
                                      stride_vch, max_pages, num_pages, m_i, l_i, acc, sm_scale_log2e, PAGE_SIZE,
                                      HEAD_D, HAS_WINDOW, UPCAST, IEEE)
    if full_end < end:
        s = full_end + offs_n
        visible = (s < end)[None, :]
        if HAS_WINDOW:
            visible = visible & (s[None, :] > key_floor[:, None])
        m_i, l_i, acc = _ctx_step(q, KC, VC, PageTable, s, s < end, visible, page_base, kvh, stride_kcp, stride_kcs,
                                  stride_kch, stride_vcp, stride_vcs, stride_vch, max_pages, num_pages, m_i, l_i,
                                  acc, sm_scale_log2e, PAGE_SIZE, HEAD_D, True, UPCAST, IEEE)

    # The block's own keys, in the last split.
    if pid_s == num_splits - 1:
        j = tl.arange(0, BLOCK_S)
        j_ok = j < S
        kb = tl.load(KB + b.to(tl.int64) * stride_kbb + kvh * stride_kbh + (j * stride_kbs)[:, None]
                     + tl.arange(0, HEAD_D)[None, :], mask=j_ok[:, None], other=0.0)
        vb = tl.load(VB + b.to(tl.int64) * stride_vbb + kvh * stride_vbh + (j * stride_vbs)[:, None]
                     + tl.arange(0, HEAD_D)[None, :], mask=j_ok[:, None], other=0.0)
        if UPCAST:
            kb = kb.to(tl.float32)
            vb = vb.to(tl.float32)
        qk = _scores(q, kb, IEEE)
        visible = j_ok[None, :]
        if HAS_WINDOW:
            dist = slot[:, None] - j[None, :]
            visible = visible & (tl.where(dist < 0, -dist, dist) < window)
        m_i, l_i, acc = attend_tile(qk, vb, visible, m_i, l_i, acc, sm_scale_log2e, True, IEEE)

    store_rows(Out, Lse, acc, m_i, l_i, row_ok, row_ok, b, pid_s, slot, h, slot * Hq + h,
               stride_ob, stride_ot, stride_oh, stride_os, stride_lb, stride_lt, stride_lh, stride_ls,
               SINGLE_SPLIT, HEAD_D)


# --------------------------------------------------------------------------------------------------
# Launcher: a plan per static signature (eager), the registered op (torch.compile)
# --------------------------------------------------------------------------------------------------

def _choose(q, k_cache, page_table, window, config, num_splits) -> tuple[AttnConfig, int]:
    """The config (``config`` or the architecture's table by packed rows ``S * Hq / Hkv``) and the split
    count (one wave of the SMs; no chunk shorter than 4 tiles of the context the window lets a block see)."""
    B, S, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    cfg = config or lookup(DRAFT_ATTN_CONFIGS, arch_of(q.device), S * (Hq // Hkv))
    if num_splits is None:
        max_keys = page_table.shape[1] * k_cache.shape[1]
        if window is not None:
            max_keys = min(max_keys, window)
        num_splits = choose_num_splits(batch=B * Hkv, row_blocks=triton.cdiv(S * (Hq // Hkv), cfg.block_m),
                                       max_keys=max_keys, block_n=cfg.block_n, sms=num_sms(q.device),
                                       programs_per_sm=cfg.programs_per_sm)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return cfg, int(num_splits)


def _launch_parts(q, k_cache, v_cache, page_table, k_blk, v_blk, o_strides, l_strides, sm_scale, window,
                  cfg: AttnConfig, num_splits):
    """``(grid, int args after the nine tensors, constexprs, options)`` of the kernel."""
    B, S, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    grid = (triton.cdiv(S * group, cfg.block_m), num_splits, B * Hkv)
    ints = (sm_scale * LOG2E, q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            page_table.stride(0), page_table.shape[1], k_cache.shape[0],
            k_blk.stride(0), k_blk.stride(1), k_blk.stride(2),
            v_blk.stride(0), v_blk.stride(1), v_blk.stride(2),
            *o_strides, *l_strides,
            S, Hq, Hkv, num_splits, window if window is not None else 1 << 30)
    constexprs = dict(
        GROUP=group, PAGE_SIZE=k_cache.shape[1], HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_S=max(16, triton.next_power_of_2(S)), SINGLE_SPLIT=num_splits == 1, HAS_WINDOW=window is not None,
        UPCAST=interpreting() and q.dtype == torch.bfloat16, IEEE=q.dtype == torch.float32,
        HOIST_PAGES=cfg.hoist_pages and k_cache.shape[1] >= cfg.block_n, PAGE_GROUP=16)
    return grid, ints, constexprs, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, out, lse, sm_scale, window, cfg: AttnConfig,
            num_splits, launch=torch.library.wrap_triton):
    """The kernel and merge through ``launch`` (``wrap_triton``: what torch.compile traces)."""
    B, S, Hq, D = q.shape
    dst_o, dst_l, o_strides, l_strides = split_destinations(out, lse, num_splits, S * Hq)
    grid, ints, constexprs, options = _launch_parts(q, k_cache, v_cache, page_table, k_blk, v_blk, o_strides,
                                                    l_strides, sm_scale, window, cfg, num_splits)
    launch(_draft_attention_kernel)[grid](q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, dst_o, dst_l,
                                          *ints, **constexprs, **options)
    if num_splits > 1:
        combine_splits(dst_o, dst_l, out, lse, launch=launch)


@torch.library.triton_op("tritree::draft_attention", mutates_args=())
def _draft_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                        ctx_lens: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor, sm_scale: float,
                        window: int, block_m: int, block_n: int, num_warps: int, num_stages: int,
                        num_splits: int, hoist_pages: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _launch(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, out, lse, sm_scale, window if window > 0 else None,
            AttnConfig.concrete(block_m, block_n, num_warps, num_stages, hoist_pages=hoist_pages), int(num_splits))
    return out, lse


def _validate(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window):
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    dev = q.device
    B, S, Hq, D = q.shape
    if S < 1 or Hq < 1 or D < 16 or D > 256 or D & (D - 1):
        raise ValueError(f"q must have shape [B, S, Hq, D] with S >= 1 and D a power of two in [16, 256], "
                         f"got {tuple(q.shape)}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        V.check_tensor(name, c, ndim=4, dtypes=V.ATTN_DTYPES, device=dev)
        if c.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {c.dtype}")
    num_pages, P, Hkv, Dk = k_cache.shape
    if Dk != D or Hkv < 1 or Hq % Hkv:
        raise ValueError(f"k_cache must have shape [num_pages, P, Hkv, {D}] with Hkv dividing Hq = {Hq}, "
                         f"got {tuple(k_cache.shape)}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if P < 1 or P > 128 or P & (P - 1):
        raise ValueError(f"page size P = k_cache.shape[1] must be a power of two in [1, 128], got {P}")
    for name, t in (("k_blk", k_blk), ("v_blk", v_blk)):
        V.check_tensor(name, t, ndim=4, dtypes=(q.dtype,), device=dev)
        V.check_shape(name, t, (B, S, Hkv, D), "[B, S, Hkv, D]")
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    if page_table.shape[0] != B:
        raise ValueError(f"page_table must have shape [B, max_pages] with B = {B}, got {tuple(page_table.shape)}")
    V.check_tensor("ctx_lens", ctx_lens, ndim=1, dtypes=(torch.int32,), device=dev)
    V.check_shape("ctx_lens", ctx_lens, (B,), "[B]")
    V.check_float("sm_scale", sm_scale, lo=0.0, lo_open=True)
    if window is not None:
        V.check_int("window", window, 1)


def _check_values(k_cache, page_table, ctx_lens) -> None:
    V.check_paged_lengths(page_table, k_cache.shape[0], k_cache.shape[1], ctx_lens, torch.zeros_like(ctx_lens),
                          lens_name="ctx_lens")


class DraftAttentionPlan:
    """:func:`draft_attention` for one static signature (shapes, strides, dtypes, device, scale, window,
    config): validated, config and splits chosen, kernels bound once; ``run`` does the per-call work (value
    checks where they apply, the output, the launches). Split partials as :class:`VerifyPlan`'s: one set per
    CUDA stream for eager calls, a fresh set inside a graph capture."""

    def __init__(self, q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, *, sm_scale, window=None,
                 config: AttnConfig | None = None, num_splits: int | None = None):
        _validate(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window)
        B, S, Hq, D = q.shape
        self.shape, self.dtype, self.device = (B, S, Hq, D), q.dtype, q.device
        self.sm_scale, self.window = float(sm_scale), window
        self.signature = signature(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk)
        self.reference = not uses_kernel(q.device)
        if self.reference:
            return
        self.config, self.num_splits = _choose(q, k_cache, page_table, window, config, num_splits)
        Sp, M = self.num_splits, S * Hq
        if Sp > 1:
            o_strides, l_strides = (Sp * M * D, 0, D, M * D), (Sp * M, 0, 1, M)
            self._merge = MergePlan(B, Sp, M, D, Hq, torch.float32, (S * Hq * D, Hq * D, D), (S * Hq, Hq, 1),
                                    q.device)
            self._scratch = StreamScratch(lambda: (torch.empty(B, Sp, M, D, dtype=torch.float32, device=q.device),
                                                   torch.empty(B, Sp, M, dtype=torch.float32, device=q.device)))
        else:
            o_strides, l_strides = (S * Hq * D, Hq * D, D, 0), (S * Hq, Hq, 1, 0)
        self._lse_scratch = StreamScratch(lambda: torch.empty(B, S, Hq, dtype=torch.float32, device=q.device))
        self._grid, self._ints, constexprs, options = _launch_parts(
            q, k_cache, v_cache, page_table, k_blk, v_blk, o_strides, l_strides, self.sm_scale, window, self.config,
            Sp)
        self._kernel = KernelLauncher(_draft_attention_kernel, constexprs, **options)

    def run(self, q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, *, return_lse: bool = False):
        """Runs the plan on inputs of its signature (a ``ValueError`` otherwise)."""
        if signature(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk) != self.signature:
            raise ValueError("the inputs do not match this plan's shapes, strides, dtypes and device")
        return self._run(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, return_lse)

    def _run(self, q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, return_lse):
        if V.checks_values(self.device):
            _check_values(k_cache, page_table, ctx_lens)
        if self.reference:
            out, lse = draft_attention_reference(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk,
                                                 sm_scale=self.sm_scale, window=self.window, return_lse=True)
            out, lse = out.to(q.dtype), lse.to(torch.float32)
            return (out, lse) if return_lse else out
        B, S, Hq, D = self.shape
        out = torch.empty(B, S, Hq, D, dtype=self.dtype, device=self.device)
        lse = (torch.empty(B, S, Hq, dtype=torch.float32, device=self.device) if return_lse
               else self._lse_scratch.get(self.device))
        dst_o, dst_l = self._scratch.get(self.device) if self.num_splits > 1 else (out, lse)
        self._kernel(self._grid, q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, dst_o, dst_l, *self._ints)
        if self.num_splits > 1:
            self._merge.run(dst_o, dst_l, out, lse)
        return (out, lse) if return_lse else out


def _build(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window, config, num_splits):
    return DraftAttentionPlan(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale=sm_scale,
                              window=window, config=config, num_splits=num_splits)


_PLANS = PlanCache("draft_attention", _build)


def draft_attention(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, *, sm_scale, window=None,
                    return_lse=False, config: AttnConfig | None = None, num_splits: int | None = None):
    """DFlash block attention over a paged GQA context cache plus the block's own keys (non-causal).

    Args:
        q: ``[B, S, Hq, D]`` block queries (S = block size, e.g. 8 or 16), bf16 / fp16 / fp32; D a
            power of two in [16, 256] (Kimi-K2.6-DFlash: Hq 64, D 128).
        k_cache, v_cache: ``[num_pages, P, Hkv, D]`` one draft layer's context pools, q's dtype; Hkv
            divides Hq (GQA); P a power of two in [1, 128].
        page_table: ``[B, max_pages]`` int32; context position s of request b is
            ``cache[page_table[b, s // P], s % P]``.
        ctx_lens: ``[B]`` int32 context tokens of each request; block slot i sits at position
            ``ctx_lens[b] + i``.
        k_blk, v_blk: ``[B, S, Hkv, D]`` the block's own keys and values (not cached).
        sm_scale: softmax scale (``D ** -0.5`` for DFlash).
        window: ``None`` (every key visible) or ``W``: a key at position p is visible to the query at
            position q iff ``|q - p| < W`` (the sliding-window rule of the DFlash reference).
        return_lse: also return ``lse: [B, S, Hq]`` float32 natural-log log-sum-exp.
        config, num_splits: override the per-architecture launch config and the split count.

    Returns:
        ``out: [B, S, Hq, D]`` in q's dtype (and ``lse``); softmax in fp32. Query head h reads KV
        head ``h // (Hq // Hkv)``.

    Every tensor is read through its own strides (the last dimension contiguous). Checks shapes, dtypes,
    devices and strides always; lengths and page ids against the pool when the inputs are on the CPU or
    ``TRITREE_DEBUG=1``. Eager calls run a :class:`DraftAttentionPlan` cached per static signature;
    CUDA-graph capturable; traced by torch.compile as ``tritree::draft_attention``.
    """
    if not eager():
        _validate(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window)
        if not uses_kernel(q.device):
            out, lse = draft_attention_reference(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk,
                                                 sm_scale=sm_scale, window=window, return_lse=True)
            return (out.to(q.dtype), lse.float()) if return_lse else out.to(q.dtype)
        cfg, splits = _choose(q, k_cache, page_table, window, config, num_splits)
        out, lse = _draft_attention_op(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, float(sm_scale),
                                       int(window or 0), cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages,
                                       splits, hoist_pages=bool(cfg.hoist_pages))
        return (out, lse) if return_lse else out
    try:
        key = (signature(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk),
               scalars(sm_scale, window, config, num_splits))
        hash(key)
    except (AttributeError, TypeError):  # not tensors / unhashable scalars: validation says what is wrong
        plan = _build(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window, config, num_splits)
    else:
        plan = _PLANS.get(key, q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, sm_scale, window, config,
                          num_splits)
    return plan._run(q, k_cache, v_cache, page_table, ctx_lens, k_blk, v_blk, return_lse)
