"""The host side of a paged KV cache: ``PagePool`` (the page allocator), ``defrag_`` (packs every request
into one ascending run of pages, in all pools sharing the page ids, with bounded scratch) and the conversion
from / to token-granular tables (SGLang ``req_to_token``). The per-token ops are in ``kv_cache.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from . import _validate as V
from ._launch import uses_kernel
from .kv_cache import _check_table, _pool

# --------------------------------------------------------------------------------------------------
# Page copies (defragmentation)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _page_copy_kernel(Src, Dst, SrcPages, DstPages,
                      stride_sl, stride_sp, stride_dl, stride_dp, PAGE_ELEMS, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < PAGE_ELEMS
    sp = tl.load(SrcPages + i).to(tl.int64)
    dp = tl.load(DstPages + i).to(tl.int64)
    vals = tl.load(Src + layer * stride_sl + sp * stride_sp + offs, mask=ok)
    tl.store(Dst + layer * stride_dl + dp * stride_dp + offs, vals, mask=ok)


def _copy_pages(src4: torch.Tensor, dst4: torch.Tensor, src_pages: list[int], dst_pages: list[int]) -> None:
    """``dst4[:, dst_pages[i]] = src4[:, src_pages[i]]`` for all i in one launch ([layers, pages, P, E]
    pools whose pages are contiguous); the lists must not overlap in a way that makes order matter."""
    if not src_pages:
        return
    dev = src4.device
    sp = torch.tensor(src_pages, dtype=torch.int32, device=dev)
    dp = torch.tensor(dst_pages, dtype=torch.int32, device=dev)
    if not uses_kernel(src4.device):
        dst4[:, dp.long()] = src4[:, sp.long()]
        return
    page_elems = src4.shape[2] * src4.shape[3]
    block = min(1024, triton.next_power_of_2(page_elems))
    _page_copy_kernel[(len(src_pages), src4.shape[0], triton.cdiv(page_elems, block))](
        src4, dst4, sp, dp, src4.stride(0), src4.stride(1), dst4.stride(0), dst4.stride(1), page_elems,
        BLOCK=block, num_warps=4)


# --------------------------------------------------------------------------------------------------
# PagePool
# --------------------------------------------------------------------------------------------------

class PoolExhausted(RuntimeError):
    """No free pages left for an allocation."""


@dataclass
class PagePool:
    """Host-side allocator of page ids for one paged pool (shared by every layer's pool of that size).

    Requests grow with :meth:`reserve` (before a decode step, with room for the next tree), and give
    their pages back with :meth:`release`. Allocation prefers extending a request's last run in place,
    then the lowest free contiguous run, then the lowest free pages. Nothing here runs inside a decode
    step: page tables are static tensors the step reads.
    """

    num_pages: int
    page_size: int
    pages: dict = field(default_factory=dict)  # request id -> list of page ids (logical order)
    _free: set = field(default_factory=set, repr=False)

    def __post_init__(self):
        self.num_pages = V.check_int("num_pages", self.num_pages, 1)
        self.page_size = V.check_int("page_size", self.page_size, 1, power_of_two=True)
        if not isinstance(self.pages, dict):
            raise TypeError(f"pages must be a dict of request -> page ids, got {type(self.pages).__name__}")
        seen: dict[int, object] = {}
        for r, ps in self.pages.items():  # given pages: valid ids, each owned by one request once
            for p in ps:
                V.check_int(f"pages[{r!r}] page id", p, 0, self.num_pages - 1)
                if p in seen:
                    raise ValueError(f"pages: page {p} is owned twice (requests {seen[p]!r} and {r!r})")
                seen[p] = r
        self.pages = {r: [int(p) for p in ps] for r, ps in self.pages.items()}
        self._free = set(range(self.num_pages)) - set(seen)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def usage(self) -> dict:
        used = self.num_pages - len(self._free)
        return {"total": self.num_pages, "used": used, "free": len(self._free), "requests": len(self.pages),
                "fraction_used": used / self.num_pages,
                "pages_per_request": {r: len(p) for r, p in self.pages.items()}}

    def capacity(self, request) -> int:
        """Tokens the request's pages can hold."""
        return len(self.pages.get(request, ())) * self.page_size

    def reserve(self, request, n_tokens: int) -> list[int]:
        """Makes ``request`` own enough pages for ``n_tokens`` tokens (growing only); returns its pages.
        Raises :class:`PoolExhausted` with the pool unchanged (a new request is not registered) when the
        free pages do not suffice."""
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an int >= 0, got {n_tokens!r}")
        have = self.pages.get(request, [])
        need = -(-n_tokens // self.page_size) - len(have)
        if need > len(self._free):
            raise PoolExhausted(
                f"KV page pool exhausted: request {request!r} needs {need} more pages of {self.page_size} tokens "
                f"for {n_tokens} tokens, {len(self._free)} of {self.num_pages} are free")
        if need > 0:
            have = have + self._take(need, after=have[-1] if have else None)
        self.pages[request] = have
        return list(have)

    def release(self, request) -> None:
        for p in self.pages.pop(request, []):
            self._free.add(p)

    def page_table(self, requests, max_pages: int | None = None, device="cpu") -> torch.Tensor:
        """``[len(requests), max_pages]`` int32 rows of the requests' pages (unused entries 0)."""
        rows = [self.pages.get(r, []) for r in requests]
        width = max([len(r) for r in rows] + [1]) if max_pages is None else V.check_int("max_pages", max_pages, 1)
        table = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, r in enumerate(rows):
            if len(r) > width:
                raise ValueError(f"request {requests[i]!r} owns {len(r)} pages > max_pages = {width}")
            table[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return table.to(device)

    def _take(self, n: int, after: int | None) -> list[int]:
        free = self._free
        if after is not None and all((after + k) in free for k in range(1, n + 1)):
            run = list(range(after + 1, after + n + 1))
        else:
            run = self._lowest_run(n) or sorted(free)[:n]
        free.difference_update(run)
        return run

    def _lowest_run(self, n: int) -> list[int] | None:
        start, length = None, 0
        for p in sorted(self._free):
            if start is not None and p == start + length:
                length += 1
            else:
                start, length = p, 1
            if length == n:
                return list(range(start, start + n))
        return None


# --------------------------------------------------------------------------------------------------
# defrag_
# --------------------------------------------------------------------------------------------------

def plan_defrag(pool: PagePool, requests) -> dict[int, int]:
    """Target page of every live page: requests packed in the given order from page 0, each one
    ascending and contiguous. Returns ``{old_page: new_page}`` for pages that move."""
    mapping, at = {}, 0
    for r in requests:
        for p in pool.pages.get(r, []):
            if p != at:
                mapping[p] = at
            at += 1
    return mapping


def defrag_(kv, page_table, kv_lens, pool: PagePool, requests=None, *, stacked=False,
            scratch_bytes: int = 256 << 20):
    """Moves pages so that each request's pages form one ascending contiguous run (requests packed in
    order from page 0), in every pool given, and updates ``pool``.

    Args:
        kv: one pool or a list of pools that share the page ids (e.g. all layers' latent pools, or a
            stacked pool with ``stacked=True``, or the draft's K and V pools).
        page_table: ``[B, max_pages]`` int32, row b = ``requests[b]``'s pages (checked against ``pool``).
        kv_lens: ``[B]`` int32 (pages beyond a request's length move too: they are its reserved room).
        requests: the request ids of the table's rows, in order (default: ``pool``'s insertion order).
        scratch_bytes: bound on the temporary buffer used to break move cycles and long chains.

    Returns the new page table (same shape, device and dtype). Logical content is unchanged: the move
    plan is a permutation executed in rounds; each round first copies a set of sources to scratch,
    then writes them to destinations whose old content has already been saved or moved.
    """
    pools = [_pool(k, stacked, f"kv[{i}]") for i, k in enumerate(kv if isinstance(kv, (list, tuple)) else [kv])]
    for i, p in enumerate(pools):
        if p.num_pages != pool.num_pages or p.page_size != pool.page_size:
            raise ValueError(f"kv[{i}] has {p.num_pages} pages of {p.page_size}, the PagePool "
                             f"{pool.num_pages} of {pool.page_size}")
        if p.view.stride(2) != p.row or p.view.stride(1) < p.page_size * p.row:
            raise ValueError(f"kv[{i}] pages must be contiguous blocks of P x tok elements")
    requests = list(pool.pages) if requests is None else list(requests)
    if sorted(map(repr, requests)) != sorted(map(repr, pool.pages)):
        raise ValueError(f"requests must list every request of the PagePool once (in the page table's row order); "
                         f"got {requests}, the pool holds {list(pool.pages)}")
    _check_table(page_table, kv_lens, len(requests), page_table.device)
    lens = kv_lens.detach().cpu().tolist()
    if any(n < 0 for n in lens):  # as every KV op: a negative length would pass the page count below
        raise ValueError(f"kv_lens must be >= 0, got {lens}")
    table = page_table.detach().cpu()
    for b, r in enumerate(requests):
        owned = pool.pages.get(r, [])
        need = -(-int(lens[b]) // pool.page_size)
        if need > len(owned):
            raise ValueError(f"kv_lens[{b}] = {lens[b]} exceeds the {len(owned)} pages request {r!r} owns")
        if table[b, :len(owned)].tolist() != owned:
            raise ValueError(f"page_table[{b}] does not match the pages PagePool holds for request {r!r}")
    mapping = plan_defrag(pool, requests)
    live = {p for ps in pool.pages.values() for p in ps}
    page_bytes = max(p.layers * p.page_size * p.row * p.view.element_size() for p in pools)
    cap = max(1, scratch_bytes // page_bytes)
    park_id = PARK(pool.num_pages)
    parking = [None] * len(pools)
    for rnd in _move_rounds(mapping, live, pool.num_pages, cap):
        for i, p in enumerate(pools):
            scratch = torch.empty(p.layers, len(rnd), p.page_size, p.row, dtype=p.view.dtype, device=p.view.device)
            moves = list(enumerate(rnd))
            _copy_pages(p.view, scratch, [s for _, (s, _) in moves if s != park_id], [k for k, (s, _) in moves if s != park_id])
            _copy_pages(parking[i], scratch, [0] * sum(s == park_id for _, (s, _) in moves),
                        [k for k, (s, _) in moves if s == park_id])
            if any(d == park_id for _, d in rnd):
                parking[i] = torch.empty(p.layers, 1, p.page_size, p.row, dtype=p.view.dtype, device=p.view.device)
                _copy_pages(scratch, parking[i], [k for k, (_, d) in moves if d == park_id], [0])
            _copy_pages(scratch, p.view, [k for k, (_, d) in moves if d != park_id], [d for _, (_, d) in moves if d != park_id])
    # Book-keeping: the pool's page lists follow the moves.
    at = 0
    for r in requests:
        n = len(pool.pages.get(r, []))
        pool.pages[r] = list(range(at, at + n))
        at += n
    pool._free = set(range(at, pool.num_pages))
    new_table = torch.zeros_like(table)
    for b, r in enumerate(requests):
        pages = pool.pages[r]
        new_table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
    return new_table.to(page_table.device)


def PARK(num_pages: int) -> int:
    """Page id of the one-page parking buffer outside the pool (used only to break a long move cycle in a
    full pool); chains are always finished before another cycle is examined, so one page suffices."""
    return num_pages


def _move_rounds(mapping: dict[int, int], live: set[int], num_pages: int, cap: int) -> list[list[tuple[int, int]]]:
    """Orders the page moves ``src -> dst`` (a permutation of live pages) into rounds of at most ``cap``
    moves such that, doing each round as (copy all its sources to scratch; write all its
    destinations), no page is written while its content is still to be read: a round's destinations
    hold no pending content, or are sources read in the same round."""
    pending = dict(mapping)  # src -> dst, content still at src
    rounds = []
    while pending:
        src_of_dst = {d: s for s, d in pending.items()}
        rnd = []
        for d0 in [d for d in src_of_dst if d not in pending]:  # chains end in a page free to write
            d = d0
            while d in src_of_dst and len(rnd) < cap:
                s = src_of_dst.pop(d)
                rnd.append((s, d))
                d = s
            if len(rnd) >= cap:
                break
        if not rnd:  # only cycles remain: whole cycles fit in a round (every destination is read in it)
            seen = set()
            for s0 in list(pending):
                if s0 in seen:
                    continue
                cycle = [s0]
                while pending[cycle[-1]] != s0:
                    cycle.append(pending[cycle[-1]])
                seen.update(cycle)
                if len(rnd) + len(cycle) <= cap:
                    rnd += [(s, pending[s]) for s in cycle]
            if not rnd:  # a cycle longer than the scratch: park one member, the cycle becomes a chain
                s0 = next(iter(pending))
                spare = next((p for p in range(num_pages) if p not in live and p not in src_of_dst), PARK(num_pages))
                rounds.append([(s0, spare)])
                pending[spare] = pending.pop(s0)
                live = live | {spare}
                continue
        for s, d in rnd:
            del pending[s]
        live = live | {d for _, d in rnd}  # a page that received its final content is no spare
        rounds.append(rnd)
    return rounds


# --------------------------------------------------------------------------------------------------
# Token-granular interop (SGLang req_to_token, page size 1)
# --------------------------------------------------------------------------------------------------

def page_table_from_token_table(req_to_token: torch.Tensor, page_size: int = 1, kv_lens: torch.Tensor | None = None):
    """Converts a token-granular table ``req_to_token: [B, max_tokens]`` (slot of each token in a
    ``[num_slots, ...]`` pool, as SGLang's ``req_to_token`` rows) to a tritree page table over the same
    memory viewed as ``[num_slots // P, P, ...]``. With P > 1 every page's tokens must be one aligned run
    of slots (checked for the first ``kv_lens[b]`` tokens when given, else all)."""
    V.check_tensor("req_to_token", req_to_token, ndim=2, dtypes=(torch.int32, torch.int64), last_contiguous=False)
    page_size = V.check_int("page_size", page_size, 1, power_of_two=True)
    B, S = req_to_token.shape
    if kv_lens is not None:
        V.check_tensor("kv_lens", kv_lens, ndim=1, dtypes=(torch.int32, torch.int64), device=req_to_token.device)
        V.check_shape("kv_lens", kv_lens, (B,), "[B]")
        V.check_value_range("kv_lens", kv_lens, 0, S, f" (the table's {S} tokens)")
    n_pages = -(-S // page_size)
    padded = torch.zeros(B, n_pages * page_size, dtype=torch.int64, device=req_to_token.device)
    padded[:, :S] = req_to_token
    first = padded[:, ::page_size]
    if page_size > 1:
        lens = torch.full((B,), S) if kv_lens is None else kv_lens.cpu().to(torch.int64)
        expect = first.repeat_interleave(page_size, dim=1) + torch.arange(page_size, device=padded.device).repeat(n_pages)
        live = torch.arange(n_pages * page_size)[None, :] < lens[:, None]
        bad = (live.to(padded.device) & (padded != expect)) | (live.to(padded.device)[:, ::page_size] & (first % page_size != 0)).repeat_interleave(page_size, 1)
        if bad.any():
            b, s = (int(v) for v in torch.nonzero(bad)[0])
            raise ValueError(f"req_to_token[{b}] is not made of aligned runs of {page_size} slots at token {s}")
    return (first // page_size).to(torch.int32)


def token_table_from_page_table(page_table: torch.Tensor, page_size: int, max_tokens: int | None = None):
    """``[B, max_pages * P]`` (or ``max_tokens``) int32 slot of each token: ``page * P + offset``."""
    V.check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), last_contiguous=False)
    page_size = V.check_int("page_size", page_size, 1, power_of_two=True)
    if max_tokens is not None:
        max_tokens = V.check_int("max_tokens", max_tokens, 0)
    B, n_pages = page_table.shape
    slots = page_table.to(torch.int64)[:, :, None] * page_size + torch.arange(page_size, device=page_table.device)
    slots = slots.reshape(B, n_pages * page_size)
    if max_tokens is not None:
        slots = slots[:, :max_tokens]
    return slots.to(torch.int32)
