"""Per-architecture launch configurations and their lookup.

Each kernel family has a table keyed by architecture name (``"sm_90"``, ``"sm_120"``, ``"sm_80"``,
``"cpu"`` for the Triton interpreter). The architecture of a tensor's device is found by
:func:`arch_of`; ``TRITREE_ARCH=sm_120`` in the environment forces a table (used on the H200 to run
the sm_120 configs under ``DISABLE_MMA_V3=1``, the closest available stand-in for sm_120's
``mma.sync`` path). Every config of every table is compiled ahead of time by
``tests/kernels/test_aot_audit.py`` for its architecture and checked against its shared-memory limit
and for register spills.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Architectures whose configs must not spill registers (the audit fails on any spill there).
NO_SPILL_ARCHS = ("sm_120",)

# Per-block shared-memory limits (bytes) by architecture, for the ahead-of-time audit.
SHARED_MEMORY_LIMIT = {
    "sm_80": 166_912,
    "sm_90": 232_448,
    "sm_120": 101_376,
}

# Compute capability used when compiling a table ahead of time.
CAPABILITY = {"sm_80": 80, "sm_90": 90, "sm_120": 120}


@dataclass(frozen=True)
class AttnConfig:
    """Launch configuration of a split-KV attention kernel.

    block_m: query rows (tree tokens x heads, packed) per program.
    block_n: KV tokens per tile.
    num_warps / num_stages: as in ``triton.Config``.
    programs_per_sm: target number of resident programs per SM used to pick the split count.
    tma: when P >= block_n and the pool is contiguous, load KV tiles with tensor-memory-accelerator
        copies (``tl.make_tensor_descriptor``; Hopper and later) instead of per-element pointers, with
        split chunks on page boundaries and the page ids of 16 pages read in one load ahead of their tiles.
    hoist_pages: (draft attention) split chunks start on page boundaries and the page ids of 16 pages are
        read in one load ahead of their tiles, so no KV address waits on a load inside the loop.
    split_scores: the warpgroups split each score tile by keys instead of both computing all of it
        (``_splitkv.attend_tile``); verify_mla only.
    kernel: ``"triton"``, a Hopper Gluon schedule of verify_mla (64x64 tiles, 8 warps): ``"gluon"``
        (the plain schedule) or ``"gluon-ws"`` (the warp-specialised one: TMA tiles where P % 64 == 0, else
        row gathers by its producer partition), or ``"gluon-mma"``, the sm_120 ``mma.sync`` kernel (32x32
        tiles, 8 warps, row gathers; also runs on Hopper). A call the Gluon kernels cannot serve (other GPU,
        dtype, unaligned rows, triton without Gluon) runs the Triton kernel with the same tile sizes.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1
    tma: bool = False
    hoist_pages: bool = False
    split_scores: bool = False
    kernel: str = "triton"

    @classmethod
    def concrete(cls, block_m, block_n, num_warps, num_stages, **flags) -> "AttnConfig":
        """A config from a traced op's arguments. After a recompilation torch.compile may pass these
        ints as symbols, and Triton needs constants (num_warps, tile sizes): ``int()`` specialises
        them, guarding on their values."""
        return cls(int(block_m), int(block_n), int(num_warps), int(num_stages),
                   **{k: (v if isinstance(v, str) else bool(v)) for k, v in flags.items()})


def arch_of(device: torch.device | str) -> str:
    """Name of the config table for ``device``: ``TRITREE_ARCH`` if set, else by capability."""
    forced = os.environ.get("TRITREE_ARCH")
    if forced:
        return forced
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return _cuda_arch(device.index if device.index is not None else torch.cuda.current_device())


@torch.compiler.assume_constant_result
def _cuda_arch(index: int) -> str:
    major, _minor = torch.cuda.get_device_capability(index)
    if major == 12:
        return "sm_120"
    if major in (9, 10):  # sm_100 has the same 227 KB of shared memory as sm_90
        return "sm_90"
    return "sm_80"


def arch_table(table: dict[str, dict], arch: str) -> dict:
    """``table[arch]``: one op's configs by row bound on ``arch``. Every op's rule for an architecture its table
    lacks: a ``ValueError`` naming the known ones (:func:`arch_of` names sm_90, sm_120, sm_80 and cpu, which every
    table has; another name comes from ``TRITREE_ARCH``)."""
    if arch not in table:
        known = sorted(k for k in table if ":" not in k)
        raise ValueError(f"no config table for architecture {arch!r} (TRITREE_ARCH?); known: {known}")
    return table[arch]


def lookup(table: dict[str, dict], arch: str, rows: int, page_size: int | None = None, kv_fp8: bool = False,
           fp32: bool = False):
    """Every op's config lookup: ``table`` maps an architecture to ``{row bound: config}``; the config of the first
    bound >= ``rows`` (else the largest bound's). Verify and draft attention: ``rows`` packed query rows;
    ``fp32``: the ``"<arch>:fp32"`` table where there is one (4-byte tiles, whatever the page size; with
    ``kv_fp8``, ``"<arch>:fp32:fp8"`` where there is one);
    ``kv_fp8``: the ``"<arch>:fp8"`` table where there is one (fp8 pools); with ``page_size``, pages smaller than a
    config's tiles (TMA tiles and hoisted page ids need whole pages; pointer loads then take one page id per row, a
    different compile) send the lookup to the ``"<arch>:small_pages"`` table where there is one."""
    arch_table(table, arch)
    if fp32 and f"{arch}:fp32" in table:
        key = f"{arch}:fp32:fp8" if kv_fp8 and f"{arch}:fp32:fp8" in table else f"{arch}:fp32"
        return _bucket(table[key], rows)
    cfg = _bucket(table[f"{arch}:fp8" if kv_fp8 and f"{arch}:fp8" in table else arch], rows)
    small = f"{arch}:small_pages"
    if page_size is not None and page_size < cfg.block_n and small in table:
        cfg = _bucket(table[small], rows)
    return cfg


def _bucket(buckets: dict[int, AttnConfig], rows: int) -> AttnConfig:
    for bound in sorted(buckets):
        if rows <= bound:
            return buckets[bound]
    return buckets[max(buckets)]


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 4  # interpreter: a few splits, so that tests exercise the combine step


@torch.compiler.assume_constant_result
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
