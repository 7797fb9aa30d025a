"""Paged KV cache operations: write, commit (accepted tree path -> sequence), gather. The host-side page
allocator, defragmentation and the token-table interop are in ``kv_pool.py``.

Every op is generic over the per-token shape: the target's latent pool ``[num_pages, P, 576]``, the
draft's ``[num_pages, P, H_kv, D]`` K or V pool, or, with ``stacked=True``, all layers at once
``[layers, num_pages, P, ...]`` (one launch for every layer). The per-token dims must be contiguous
(they are flattened to ``E`` elements by a view; nothing is copied).

The commit kernel's ordering argument: accepted indices are strictly increasing from 0, so every move
``kv_lens + a_j -> kv_lens + j`` has source >= destination. Moves are done in chunks of ``ROWS``
accepted nodes in increasing ``j``; all sources of a chunk are read (and a CTA barrier passed) before
any of its destinations is written, and a chunk's destinations (< j0 + ROWS) never hold a later
chunk's sources (>= j0 + ROWS). Programs own disjoint (layer, request, element block) ranges: a move
touches only the same elements of two rows, so programs of different column blocks never conflict.
The launch gives each program a 128-byte column block of every row and (up to a 16 KB tile, bf16
trees of up to 128 nodes) all of its request's accepted rows in one chunk, so every (layer, request,
column block) runs in parallel in one launch, each read-all-then-write; the kernel also writes the
new lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from . import _validate as V
from ._launch import KernelLauncher, PlanCache, eager, full_lengths, signature, uses_kernel
from ._splitkv import pdl_capable

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.uint8)


# --------------------------------------------------------------------------------------------------
# Layout helpers
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pool:
    view: torch.Tensor  # [layers, num_pages, P, E]
    token_shape: tuple
    stacked: bool

    @property
    def layers(self):
        return self.view.shape[0]

    @property
    def num_pages(self):
        return self.view.shape[1]

    @property
    def page_size(self):
        return self.view.shape[2]

    @property
    def row(self):
        return self.view.shape[3]


def _pool(kv, stacked: bool, name: str = "kv") -> _Pool:
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(kv).__name__}")
    lead = 3 if stacked else 2
    if kv.dim() < lead + 1:
        what = "[layers, num_pages, P, ...]" if stacked else "[num_pages, P, ...]"
        raise ValueError(f"{name} must have shape {what} with at least one per-token dim, got {tuple(kv.shape)}")
    if kv.dtype not in KV_DTYPES:
        raise TypeError(f"{name} has unsupported dtype {kv.dtype}")
    tok = tuple(kv.shape[lead:])
    expected = 1
    for d in range(kv.dim() - 1, lead - 1, -1):  # per-token dims must be one contiguous run
        if kv.shape[d] > 1 and kv.stride(d) != expected:
            raise ValueError(f"{name} must be contiguous in its per-token dims {tok}, got strides {tuple(kv.stride())}")
        expected *= kv.shape[d]
    P = kv.shape[lead - 1]
    if P < 1 or P & (P - 1):
        raise ValueError(f"{name} page size P = {P} must be a power of two")
    view = kv.unsqueeze(0) if not stacked else kv
    # flatten (a view: the per-token dims are one contiguous run), not as_strided: torch.compile cannot
    # functionalise a kernel's mutation through an as_strided view
    view = view.flatten(3) if view.dim() > 4 else view
    return _Pool(view, tok, stacked)


def _pool_strides(kv, stacked: bool) -> tuple[int, int, int]:
    """(layer, page, slot) element strides of ``kv`` as the kernels index it. The kernels receive the
    caller's tensor itself rather than a view made here: torch.compile functionalises a kernel's
    mutation of its input, not of a view created inside the op."""
    if stacked:
        return kv.stride(0), kv.stride(1), kv.stride(2)
    return 0, kv.stride(0), kv.stride(1)


def _check_table(page_table, kv_lens, B_expected, device):
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=device)
    V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32,), device=device)
    B = page_table.shape[0] if B_expected is None else B_expected
    V.check_shape("page_table", page_table, (B, page_table.shape[1]), "[B, max_pages]")
    V.check_shape("kv_lens", kv_lens, (B,), "[B]")
    return B


# The KV write's warps: with 4, ptxas builds the page-table form (pages of 64) for sm_120 with an 8-byte stack
# (triton 3.6 and 3.9); with 8 nothing spills (``python -m tritree.kernels.aot``).
WRITE_WARPS = 8


def _block_e(E: int) -> int:
    return min(256, triton.next_power_of_2(E))


# --------------------------------------------------------------------------------------------------
# Shared jit pieces
# --------------------------------------------------------------------------------------------------

@triton.jit
def _row_offsets(PageTable, page_base, pos, ok, max_pages, num_pages, stride_kp, stride_ks, PAGE_SIZE: tl.constexpr):
    """Element offsets (int64) of logical positions ``pos`` of one request, clamped into the pool (a negative
    position, from lengths no check has seen, is row 0 of the first page, never before it)."""
    pos = tl.maximum(pos, 0)
    col = tl.minimum(pos // PAGE_SIZE, max_pages - 1)
    page = tl.load(PageTable + page_base + col, mask=ok, other=0)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    return page * stride_kp + (pos % PAGE_SIZE).to(tl.int64) * stride_ks


# --------------------------------------------------------------------------------------------------
# kv_write_
# --------------------------------------------------------------------------------------------------

@triton.jit
def _kv_write_kernel(KV, New, PageTable, KvLens, TreeLens,
                     stride_kl, stride_kp, stride_ks,
                     stride_nl, stride_nb, stride_nt,
                     stride_ptb, T, E, max_pages, num_pages, t_blocks,
                     PAGE_SIZE: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, SIGNAL: tl.constexpr):
    if SIGNAL:  # the next kernel (the verify split kernel, launched by programmatic dependent launch) may be placed
        gdc_launch_dependents()
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    pid_e = tl.program_id(2)
    b = pid // t_blocks
    t = (pid % t_blocks) * ROWS + tl.arange(0, ROWS)
    ok = (t < T) & (t < tl.load(TreeLens + b))
    pos = tl.load(KvLens + b) + t
    dst = _row_offsets(PageTable, b.to(tl.int64) * stride_ptb, pos, ok, max_pages, num_pages, stride_kp, stride_ks,
                       PAGE_SIZE)
    e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    m = ok[:, None] & (e < E)[None, :]
    src = New + layer * stride_nl + b.to(tl.int64) * stride_nb + t.to(tl.int64)[:, None] * stride_nt + e[None, :]
    vals = tl.load(src, mask=m)
    tl.store(KV + layer * stride_kl + dst[:, None] + e[None, :], vals, mask=m)


def kv_write_reference(kv, page_table, kv_lens, new, tree_lens=None, *, stacked=False):
    """Loop version of :func:`kv_write_` (the specification)."""
    pool = _pool(kv, stacked)
    P = pool.page_size
    newv = new if stacked else new.unsqueeze(0)
    B, T = newv.shape[1], newv.shape[2]
    newv = newv.reshape(newv.shape[0], B, T, pool.row)
    lens = kv_lens.tolist()
    n = [T] * B if tree_lens is None else tree_lens.tolist()
    for b in range(B):
        for i in range(min(T, int(n[b]))):
            pos = int(lens[b]) + i
            pool.view[:, int(page_table[b, pos // P]), pos % P] = newv[:, b, i]
    return kv


def kv_write_(kv, page_table, kv_lens, new, tree_lens=None, *, stacked=False):
    """Writes ``new`` at logical positions ``kv_lens[b] + i`` of each request's pages, in place.

    Args:
        kv: ``[num_pages, P, *tok]`` (or ``[layers, num_pages, P, *tok]`` with ``stacked=True``).
        page_table: ``[B, max_pages]`` int32. kv_lens: ``[B]`` int32.
        new: ``[B, T, *tok]`` (``[layers, B, T, *tok]`` when stacked), kv's dtype; read through its own
            strides (a copy is made per call only where its per-token dims are not one contiguous run).
        tree_lens: ``[B]`` int32; rows ``i >= tree_lens[b]`` are not written.
    Returns ``kv``. Eager calls run a plan cached per static signature (no host sync unless value checks
    run: CPU inputs or ``TRITREE_DEBUG=1``).
    """
    if eager():
        try:
            key = (signature(kv, page_table, kv_lens, new, tree_lens), bool(stacked))
        except AttributeError:  # not tensors: validation says which
            _WritePlan(kv, page_table, kv_lens, new, tree_lens, stacked)
            raise
        _WRITE_PLANS.get(key, kv, page_table, kv_lens, new, tree_lens, stacked).run(kv, page_table, kv_lens, new,
                                                                                     tree_lens)
        return kv
    pool, B, T = _validate_write(kv, page_table, kv_lens, new, tree_lens, stacked)
    if not uses_kernel(kv.device):
        return kv_write_reference(kv, page_table, kv_lens, new, tree_lens, stacked=stacked)
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=kv.device)
    if kv.device.type == "cuda":
        _kv_write_op(kv, page_table, kv_lens, new, tree_lens, stacked)
    else:
        _kv_write_launch(kv, page_table, kv_lens, new, tree_lens, stacked)
    return kv


def _validate_write(kv, page_table, kv_lens, new, tree_lens, stacked):
    pool = _pool(kv, stacked)
    V.check_tensor("new", new, dtypes=(kv.dtype,), device=kv.device, last_contiguous=False)
    lead = 3 if stacked else 2
    if new.dim() != lead + len(pool.token_shape) or tuple(new.shape[lead:]) != pool.token_shape:
        want = "[layers, B, T, *tok]" if stacked else "[B, T, *tok]"
        raise ValueError(f"new must have shape {want} with tok = {pool.token_shape}, got {tuple(new.shape)}")
    if stacked and new.shape[0] != pool.layers:
        raise ValueError(f"new has {new.shape[0]} layers, kv has {pool.layers}")
    B, T = new.shape[lead - 2], new.shape[lead - 1]
    _check_table(page_table, kv_lens, B, kv.device)
    if tree_lens is not None:
        V.check_tensor("tree_lens", tree_lens, ndim=1, dtypes=(torch.int32,), device=kv.device)
        V.check_shape("tree_lens", tree_lens, (B,), "[B]")
    return pool, B, T


def _check_write_values(pool, page_table, kv_lens, tree_lens, B, T):
    if tree_lens is not None:
        V.check_value_range("tree_lens", tree_lens, 0, T, f" (T = {T} rows of new)")
    n = torch.full((B,), T) if tree_lens is None else tree_lens.cpu()
    V.check_paged_lengths(page_table, pool.num_pages, pool.page_size, kv_lens, n)


class _WritePlan:
    """kv_write_ for one static signature: validated, grid and integer arguments decided, kernel bound."""

    def __init__(self, kv, page_table, kv_lens, new, tree_lens, stacked):
        pool, B, T = _validate_write(kv, page_table, kv_lens, new, tree_lens, stacked)
        self.pool_geometry = (pool.num_pages, pool.page_size)
        self.B, self.T, self.stacked = B, T, bool(stacked)
        self.kernel = uses_kernel(kv.device)
        if not self.kernel:
            return
        lead = 3 if stacked else 2
        self._flat = (pool.layers, B, T, pool.row)
        self._copy = not new[(0,) * lead].is_contiguous()  # per-token dims not one run: a copy per call
        # the copy's own layout (reshape alone may return a view that keeps a strided last dimension)
        newv = (new.reshape(self._flat).contiguous() if self._copy else new.reshape(self._flat) if stacked
                else new.unsqueeze(0).view(self._flat))
        rows = min(16, triton.next_power_of_2(T))
        t_blocks = triton.cdiv(T, rows)
        block_e = _block_e(pool.row)
        self._grid = (B * t_blocks, pool.layers, triton.cdiv(pool.row, block_e))
        self._ints = (*_pool_strides(kv, stacked), newv.stride(0), newv.stride(1), newv.stride(2),
                      page_table.stride(0), T, pool.row, page_table.shape[1], pool.num_pages, t_blocks)
        self._launch = KernelLauncher(_kv_write_kernel, dict(PAGE_SIZE=pool.page_size, ROWS=rows, BLOCK_E=block_e,
                                                             SIGNAL=write_signals(kv.device)), num_warps=WRITE_WARPS)

    def run(self, kv, page_table, kv_lens, new, tree_lens):
        if V.checks_values(kv.device):
            _check_write_values(_Geometry(*self.pool_geometry), page_table, kv_lens, tree_lens, self.B, self.T)
        if not self.kernel:
            kv_write_reference(kv, page_table, kv_lens, new, tree_lens, stacked=self.stacked)
            return
        if tree_lens is None:
            tree_lens = full_lengths(self.B, self.T, kv.device)
        if self._copy:
            new = new.reshape(self._flat).contiguous()
        self._launch(self._grid, kv, new, page_table, kv_lens, tree_lens, *self._ints)


@dataclass(frozen=True)
class _Geometry:
    num_pages: int
    page_size: int


_WRITE_PLANS = PlanCache("kv_write_", _WritePlan)


# Opaque to torch.compile (declared mutation of kv): traced into, a model's compiled verify gave wrong
# logits on the H200 (bench/compile_diag.py) and these launches are the kernels that mutate an input.
@torch.library.custom_op("tritree::kv_write_", mutates_args=("kv",))
def _kv_write_op(kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor, new: torch.Tensor,
                 tree_lens: torch.Tensor, stacked: bool) -> None:
    _kv_write_launch(kv, page_table, kv_lens, new, tree_lens, stacked)


# The KV write signals dependents at its start (``griddepcontrol.launch_dependents``): in a model's layer it
# runs right before ``verify_mla``, whose warp-specialised split kernel (launched by programmatic dependent
# launch) is then placed while the write still runs and waits for the write's completion itself, before its
# first global read (bench/RESULTS.md, "one layer's KV write + verify"). A no-op before kernels launched
# without programmatic dependent launch.
def write_signals(device: torch.device) -> bool:
    """Whether the KV write on ``device`` signals dependents (``_splitkv.pdl_capable``)."""
    return pdl_capable(device)


def _kv_write_launch(kv, page_table, kv_lens, new, tree_lens, stacked):
    pool = _pool(kv, stacked)
    lead = 3 if stacked else 2
    B, T = new.shape[lead - 2], new.shape[lead - 1]
    newv = (new if stacked else new.unsqueeze(0))
    flat = (*newv.shape[:3], pool.row)
    newv = newv.view(flat) if newv[0, 0, 0].is_contiguous() else newv.reshape(flat).contiguous()
    rows = min(16, triton.next_power_of_2(T))
    t_blocks = triton.cdiv(T, rows)
    block_e = _block_e(pool.row)
    _kv_write_kernel[(B * t_blocks, pool.layers, triton.cdiv(pool.row, block_e))](
        kv, newv, page_table, kv_lens, tree_lens,
        *_pool_strides(kv, stacked),
        newv.stride(0), newv.stride(1), newv.stride(2),
        page_table.stride(0), T, pool.row, page_table.shape[1], pool.num_pages, t_blocks,
        PAGE_SIZE=pool.page_size, ROWS=rows, BLOCK_E=block_e, SIGNAL=write_signals(kv.device), num_warps=WRITE_WARPS)


# --------------------------------------------------------------------------------------------------
# kv_commit_
# --------------------------------------------------------------------------------------------------

@triton.jit
def _commit_rows(base, PageTable, page_base, kv_len, n_acc, T, j, a, e, e_ok, max_pages, num_pages,
                 stride_kp, stride_ks, PAGE_SIZE: tl.constexpr):
    """Moves rows ``kv_len + a -> kv_len + j`` (the ROWS accepted nodes ``j`` of one chunk, columns
    ``e``): every source of the chunk is read before any destination is written."""
    move = (j < n_acc) & (j < T) & (a != j)  # the fast path (a == j) moves nothing
    src = _row_offsets(PageTable, page_base, kv_len + a, move, max_pages, num_pages, stride_kp, stride_ks, PAGE_SIZE)
    dst = _row_offsets(PageTable, page_base, kv_len + j, move, max_pages, num_pages, stride_kp, stride_ks, PAGE_SIZE)
    m = move[:, None] & e_ok
    vals = tl.load(base + src[:, None] + e[None, :], mask=m)
    tl.debug_barrier()  # every thread's source reads are done before any thread writes a destination
    tl.store(base + dst[:, None] + e[None, :], vals, mask=m)


@triton.jit
def _kv_commit_kernel(KV, PageTable, KvLens, AcceptIdx, AcceptLen, NewLens,
                      stride_kl, stride_kp, stride_ks, stride_ptb, stride_ab,
                      T, E, max_pages, num_pages,
                      PAGE_SIZE: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, EVEN_E: tl.constexpr):
    """One program per (column block, request, layer). The first chunk of ROWS accepted nodes (all of
    them when T <= ROWS, the launcher's usual choice) is loaded without waiting for ``accept_len``, so
    the dependent memory round trips are: {lengths, accept_idx} -> page table -> rows -> stores."""
    pid_e = tl.program_id(0)
    b = tl.program_id(1)
    layer = tl.program_id(2)
    b64 = b.to(tl.int64)
    kv_len = tl.load(KvLens + b)
    n_acc = tl.load(AcceptLen + b)
    j = tl.arange(0, ROWS)
    a = tl.load(AcceptIdx + b64 * stride_ab + j, mask=j < T, other=0)
    # the new length, written once per request (no separate launch for kv_lens + accept_len)
    tl.store(NewLens + b, kv_len + n_acc, mask=(pid_e == 0) & (layer == 0))
    page_base = b64 * stride_ptb
    e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    if EVEN_E:  # no column mask: the row segments load and store as 16-byte vectors
        e_ok = tl.full([1, BLOCK_E], 1, tl.int1)
    else:
        e_ok = (e < E)[None, :]
    base = KV + layer.to(tl.int64) * stride_kl
    _commit_rows(base, PageTable, page_base, kv_len, n_acc, T, j, a, e, e_ok, max_pages, num_pages,
                 stride_kp, stride_ks, PAGE_SIZE)
    # Later chunks (trees larger than ROWS with more than ROWS accepted nodes), in increasing j: a
    # chunk's destinations (< j0) never hold a later chunk's sources (a_j >= j >= j0).
    for j0 in range(ROWS, n_acc, ROWS):
        tl.debug_barrier()
        jj = j0 + tl.arange(0, ROWS)
        aa = tl.load(AcceptIdx + b64 * stride_ab + jj, mask=(jj < n_acc) & (jj < T), other=0)
        _commit_rows(base, PageTable, page_base, kv_len, n_acc, T, jj, aa, e, e_ok, max_pages, num_pages,
                     stride_kp, stride_ks, PAGE_SIZE)


def kv_commit_reference(kv, page_table, kv_lens, accept_idx, accept_len, *, stacked=False):
    """Loop version of :func:`kv_commit_` (moves in increasing j; returns the new lengths)."""
    pool = _pool(kv, stacked)
    P = pool.page_size
    for b in range(page_table.shape[0]):
        L = int(kv_lens[b])
        for j in range(int(accept_len[b])):
            a = int(accept_idx[b, j])
            if a == j:
                continue
            src, dst = L + a, L + j
            pool.view[:, int(page_table[b, dst // P]), dst % P] = pool.view[:, int(page_table[b, src // P]), src % P]
    return kv_lens + accept_len.to(kv_lens.dtype)


def kv_commit_(kv, page_table, kv_lens, accept_idx, accept_len, *, stacked=False):
    """Moves the accepted tree nodes' KV into the sequence, in place, on every layer given.

    For ``j < accept_len[b]`` the entry at ``kv_lens[b] + accept_idx[b, j]`` moves to ``kv_lens[b] + j``.

    Args:
        kv: ``[num_pages, P, *tok]`` (``[layers, num_pages, P, *tok]`` with ``stacked=True``).
        page_table: ``[B, max_pages]`` int32. kv_lens: ``[B]`` int32 (before the tree).
        accept_idx: ``[B, T]`` int32, strictly increasing, ``accept_idx[b, 0] = 0`` (the root) when
            ``accept_len[b] > 0``, padded with -1 (from :func:`accept_tree`).
        accept_len: ``[B]`` int32 in ``[0, T]``.
    Returns ``new_kv_lens = kv_lens + accept_len`` ([B] int32). No host sync unless value checks run
    (CPU inputs or ``TRITREE_DEBUG=1``). Overlapping sources and destinations are handled (see module).
    Eager calls run a plan cached per static signature.
    """
    if eager():
        try:
            key = (signature(kv, page_table, kv_lens, accept_idx, accept_len), bool(stacked))
        except AttributeError:  # not tensors: validation says which
            _CommitPlan(kv, page_table, kv_lens, accept_idx, accept_len, stacked)
            raise
        return _COMMIT_PLANS.get(key, kv, page_table, kv_lens, accept_idx, accept_len, stacked).run(
            kv, page_table, kv_lens, accept_idx, accept_len)
    _validate_commit(kv, page_table, kv_lens, accept_idx, accept_len, stacked)
    if not uses_kernel(kv.device):
        return kv_commit_reference(kv, page_table, kv_lens, accept_idx, accept_len, stacked=stacked)
    if kv.device.type == "cuda":
        return _kv_commit_op(kv, page_table, kv_lens, accept_idx, accept_len, stacked)
    return _kv_commit_launch(kv, page_table, kv_lens, accept_idx, accept_len, stacked)


def _validate_commit(kv, page_table, kv_lens, accept_idx, accept_len, stacked):
    pool = _pool(kv, stacked)
    B = _check_table(page_table, kv_lens, None, kv.device)
    V.check_tensor("accept_idx", accept_idx, ndim=2, dtypes=(torch.int32,), device=kv.device)
    V.check_tensor("accept_len", accept_len, ndim=1, dtypes=(torch.int32,), device=kv.device)
    if accept_idx.shape[0] != B:
        raise ValueError(f"accept_idx must have shape [B, T] with B = {B}, got {tuple(accept_idx.shape)}")
    V.check_shape("accept_len", accept_len, (B,), "[B]")
    return pool


def _check_commit_values(num_pages, page_size, page_table, kv_lens, accept_idx, accept_len):
    _check_accept(accept_idx, accept_len)
    V.check_paged_lengths(page_table, num_pages, page_size, kv_lens,
                          accept_idx.max(dim=1).values.clamp(min=-1).cpu() + 1)


class _CommitPlan:
    """kv_commit_ for one static signature: validated, layout and integer arguments decided, kernel bound."""

    def __init__(self, kv, page_table, kv_lens, accept_idx, accept_len, stacked):
        pool = _validate_commit(kv, page_table, kv_lens, accept_idx, accept_len, stacked)
        self.geometry = (pool.num_pages, pool.page_size)
        self.stacked = bool(stacked)
        self.kernel = uses_kernel(kv.device)
        B, T = accept_idx.shape
        self.B, self.layers = B, pool.layers
        if not self.kernel:
            return
        rows, block_e = _commit_layout(T, pool.row, kv.element_size())
        self._grid = (triton.cdiv(pool.row, block_e), B, pool.layers)
        self._ints = (*_pool_strides(kv, stacked), page_table.stride(0), accept_idx.stride(0), T, pool.row,
                      page_table.shape[1], pool.num_pages)
        self._launch = KernelLauncher(_kv_commit_kernel, dict(PAGE_SIZE=pool.page_size, ROWS=rows, BLOCK_E=block_e,
                                                              EVEN_E=pool.row % block_e == 0), num_warps=4)

    def run(self, kv, page_table, kv_lens, accept_idx, accept_len):
        if V.checks_values(kv.device):
            _check_commit_values(*self.geometry, page_table, kv_lens, accept_idx, accept_len)
        if not self.kernel:
            return kv_commit_reference(kv, page_table, kv_lens, accept_idx, accept_len, stacked=self.stacked)
        new_lens = torch.empty_like(kv_lens)
        if self.B == 0:
            return new_lens
        if self.layers == 0:
            return new_lens.copy_(kv_lens + accept_len)
        self._launch(self._grid, kv, page_table, kv_lens, accept_idx, accept_len, new_lens, *self._ints)
        return new_lens


_COMMIT_PLANS = PlanCache("kv_commit_", _CommitPlan)


@torch.library.custom_op("tritree::kv_commit_", mutates_args=("kv",))
def _kv_commit_op(kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor, accept_idx: torch.Tensor,
                  accept_len: torch.Tensor, stacked: bool) -> torch.Tensor:
    return _kv_commit_launch(kv, page_table, kv_lens, accept_idx, accept_len, stacked)


@_kv_commit_op.register_fake
def _kv_commit_fake(kv, page_table, kv_lens, accept_idx, accept_len, stacked):
    return torch.empty_like(kv_lens)


COMMIT_TILE_BYTES = 16 << 10  # a program's rows x columns tile (read into registers, then written)
COMMIT_SEGMENT_BYTES = 128    # columns per program: one 128-byte segment of each row


def _commit_layout(T: int, E: int, elem_bytes: int) -> tuple[int, int]:
    """(ROWS, BLOCK_E) of the commit launch: narrow column blocks (128 B of each row) so that one
    program holds every accepted row of its (request, layer) in one chunk up to a 16 KB tile (bf16:
    T <= 128), and the grid has ``ceil(E / BLOCK_E)`` programs per request and layer, all in parallel."""
    block_e = min(triton.next_power_of_2(E), max(1, COMMIT_SEGMENT_BYTES // elem_bytes))
    max_rows = min(256, max(16, COMMIT_TILE_BYTES // (block_e * elem_bytes)))  # powers of two
    return min(triton.next_power_of_2(max(T, 1)), max_rows), block_e


def _kv_commit_launch(kv, page_table, kv_lens, accept_idx, accept_len, stacked, rows=None):
    """Launches the commit; returns the new lengths (written by the kernel). ``rows`` overrides the
    chunk size (tests use it to reach the multi-chunk path at small T)."""
    pool = _pool(kv, stacked)
    B, T = accept_idx.shape
    new_lens = torch.empty_like(kv_lens)
    auto_rows, block_e = _commit_layout(T, pool.row, kv.element_size())
    rows = auto_rows if rows is None else rows
    if B == 0:
        return new_lens
    if pool.layers == 0:
        return new_lens.copy_(kv_lens + accept_len)
    _kv_commit_kernel[(triton.cdiv(pool.row, block_e), B, pool.layers)](
        kv, page_table, kv_lens, accept_idx, accept_len, new_lens,
        *_pool_strides(kv, stacked), page_table.stride(0), accept_idx.stride(0),
        T, pool.row, page_table.shape[1], pool.num_pages,
        PAGE_SIZE=pool.page_size, ROWS=rows, BLOCK_E=block_e, EVEN_E=pool.row % block_e == 0, num_warps=4)
    return new_lens


def _check_accept(accept_idx, accept_len):
    idx = accept_idx.detach().cpu().to(torch.int64)
    n = accept_len.detach().cpu().to(torch.int64)
    B, T = idx.shape
    if ((n < 0) | (n > T)).any():
        b = int(torch.nonzero((n < 0) | (n > T))[0, 0])
        raise ValueError(f"accept_len[{b}] = {int(n[b])} must be in [0, T = {T}] (no more nodes than the tree has)")
    for b in range(B):
        k = int(n[b])
        if k == 0:
            continue
        row = idx[b, :k]
        if int(row[0]) != 0:
            raise ValueError(f"accept_idx[{b}] must start at 0 (the root), got {row.tolist()}")
        if k > 1 and not bool((row[1:] > row[:-1]).all()):
            raise ValueError(f"accept_idx[{b}, :{k}] must be strictly increasing, got {row.tolist()}")
        if int(row[-1]) >= T:
            raise ValueError(f"accept_idx[{b}] has node {int(row[-1])} outside the tree of T = {T}")


# --------------------------------------------------------------------------------------------------
# kv_gather
# --------------------------------------------------------------------------------------------------

@triton.jit
def _kv_gather_kernel(KV, Out, PageTable, KvLens,
                      stride_kl, stride_kp, stride_ks,
                      stride_ol, stride_ob, stride_os,
                      stride_ptb, S, E, max_pages, num_pages, s_blocks,
                      PAGE_SIZE: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    pid_e = tl.program_id(2)
    b = pid // s_blocks
    s = (pid % s_blocks) * ROWS + tl.arange(0, ROWS)
    live = s < tl.load(KvLens + b)
    src = _row_offsets(PageTable, b.to(tl.int64) * stride_ptb, s, live, max_pages, num_pages, stride_kp, stride_ks,
                       PAGE_SIZE)
    e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = (e < E)[None, :]
    vals = tl.load(KV + layer * stride_kl + src[:, None] + e[None, :], mask=live[:, None] & e_ok, other=0)
    dst = Out + layer * stride_ol + b.to(tl.int64) * stride_ob + s.to(tl.int64)[:, None] * stride_os + e[None, :]
    tl.store(dst, vals, mask=(s < S)[:, None] & e_ok)


def kv_gather_reference(kv, page_table, kv_lens, max_len=None, *, stacked=False):
    pool = _pool(kv, stacked)
    P = pool.page_size
    lens = [int(x) for x in kv_lens.tolist()]
    S = max(lens, default=0) if max_len is None else max_len
    B = page_table.shape[0]
    out = torch.zeros(pool.layers, B, S, pool.row, dtype=kv.dtype, device=kv.device)
    for b in range(B):
        for s in range(min(lens[b], S)):
            out[:, b, s] = pool.view[:, int(page_table[b, s // P]), s % P]
    out = out.view(pool.layers, B, S, *pool.token_shape)
    return out if stacked else out[0]


def kv_gather(kv, page_table, kv_lens, max_len: int | None = None, *, stacked=False):
    """Contiguous copy of each request's committed KV: ``[B, S, *tok]`` (``[layers, B, S, *tok]`` when
    stacked), zero beyond ``kv_lens[b]``. ``S = max(kv_lens)`` (a host sync) unless ``max_len`` is
    given (then static and graph-capturable; rows past ``max_len`` are dropped)."""
    pool = _pool(kv, stacked)
    B = _check_table(page_table, kv_lens, None, kv.device)
    if max_len is None:
        S = max(int(kv_lens.max()), 0) if B else 0  # (negative lengths, unchecked: nothing to gather)
    else:
        S = V.check_int("max_len", max_len, 0)
    if V.values_checkable(kv_lens, page_table):
        V.check_paged_lengths(page_table, pool.num_pages, pool.page_size, kv_lens, torch.zeros(B, dtype=torch.int64))
    if not uses_kernel(kv.device):
        return kv_gather_reference(kv, page_table, kv_lens, S, stacked=stacked)
    out = torch.empty(pool.layers, B, S, pool.row, dtype=kv.dtype, device=kv.device)
    if B and S:
        rows = 16
        s_blocks = triton.cdiv(S, rows)
        block_e = _block_e(pool.row)
        kv4 = pool.view
        _kv_gather_kernel[(B * s_blocks, pool.layers, triton.cdiv(pool.row, block_e))](
            kv4, out, page_table, kv_lens,
            kv4.stride(0), kv4.stride(1), kv4.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            page_table.stride(0), S, pool.row, page_table.shape[1], pool.num_pages, s_blocks,
            PAGE_SIZE=pool.page_size, ROWS=rows, BLOCK_E=block_e, num_warps=4)
    out = out.view(pool.layers, B, S, *pool.token_shape)
    return out if stacked else out[0]
