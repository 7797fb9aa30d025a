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


# Rows bucket -> config. A launch with M = T*H packed rows takes the first bucket >= M (else the
# largest). Entries are the measured choices (bench/RESULTS.md, verify attention); sm_120 ones are bounded
# by its 101,376 B of shared memory (576-wide bf16 K tiles: 32x32 is the largest that fits, docs/SPEC.md section 6).
VERIFY_MLA_CONFIGS: dict[str, dict[int, AttnConfig]] = {
    "sm_90": {
        16: AttnConfig(16, 64, 4, 2),
        # Pools with P >= BLOCK_N, 64x64 tiles in two warpgroups that split the score tile. On Hopper with
        # bf16 the Gluon kernels serve; elsewhere (fp16/fp32, other GPUs, triton without Gluon) the Triton
        # kernel with TMA tiles and the same split. One program per SM with the split count rounded down to
        # whole waves: fewer splits, fewer partials to write and merge than at two or four programs an SM
        # (10-15% faster at T=64,H=8, T=16,H=64 and T=65,H=8). The plain schedule up to 64 rows.
        64: AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon"),
        # Above 64 rows: the warp-specialised kernel (its producer prefetches the next tile pair into the L2;
        # 5-7% faster than the plain schedule's tile-pair form at T=64,H=8, T=8,H=64 and T=16,H=8).
        1 << 30: AttnConfig(64, 64, 8, 2, tma=True, split_scores=True, kernel="gluon-ws"),
    },
    # Pools with pages smaller than those tiles (P=1: token-granular trees). On Hopper with bf16 the
    # warp-specialised kernel whose producer partition gathers the rows (cp.async by column halves, one page
    # id per row), one program per SM: 5-15% faster than a gather in the consumers. The Triton kernel, which
    # still serves fp16/fp32 and other GPUs with these tiles, is 1.4-1.9x slower.
    "sm_90:small_pages": {
        16: AttnConfig(16, 64, 4, 2),
        1 << 30: AttnConfig(64, 64, 8, 2, split_scores=True, kernel="gluon-ws"),
    },
    # fp8 (e4m3) pools with P >= BLOCK_N: the Triton kernel (tiles converted to bf16 in registers), three
    # stages (half-size tiles leave the shared memory for them; 9-13% faster than two); four stages do not
    # fit (258,072 B).
    "sm_90:fp8": {
        16: AttnConfig(16, 64, 4, 2),
        1 << 30: AttnConfig(64, 64, 8, 3, tma=True, split_scores=True),
    },
    "sm_120": {
        # bf16 pools: the Gluon mma.sync kernel (``_verify_gluon_sm120``: queries in registers, 32 x 32 tiles, 8
        # warps, a two-slot ring of KV tiles by row gathers at any page size; 98,304 B). The same tiles serve
        # the Triton kernel where the Gluon one does not (fp16 / fp32, unaligned rows, a triton without Gluon):
        # 32x32x8x2 compiles without a spill at P = 1, 16 and 64 (emulated 20-25% slower than 16x64x4x2, the
        # Triton kernel's best at P = 64).
        1 << 30: AttnConfig(32, 32, 8, 2, kernel="gluon-mma"),
    },
    # fp8 (e4m3) pools on sm_120: the same Gluon kernel over 1-byte tiles (61,440 B), its fragments widened to
    # bf16. Where it does not serve, the Triton kernel with these tiles: with fp8 tiles 16x64x4x2 spills
    # (converting them to bf16 takes registers); 32x32x8x2 (75,904 B, 248-254 registers, no spill at P = 1,
    # 16, 64), emulated 12-18% faster than 16x64x8x2 and 1.6-1.8x faster than 16x32x8x2.
    "sm_120:fp8": {
        1 << 30: AttnConfig(32, 32, 8, 2, kernel="gluon-mma"),
    },
    "sm_80": {
        16: AttnConfig(16, 32, 4, 2),
        1 << 30: AttnConfig(32, 64, 8, 2),
    },
    # Triton interpreter: large tiles mean fewer (slow) interpreted operations.
    "cpu": {
        1 << 30: AttnConfig(32, 32, 4, 1),
    },
}


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


def lookup(table: dict[str, dict], arch: str, rows: int, page_size: int | None = None, kv_fp8: bool = False):
    """Every op's config lookup: ``table`` maps an architecture to ``{row bound: config}``; the config of the first
    bound >= ``rows`` (else the largest bound's). Verify and draft attention: ``rows`` packed query rows;
    ``kv_fp8``: the ``"<arch>:fp8"`` table where there is one (fp8 pools); with ``page_size``, pages smaller than a
    config's tiles (TMA tiles and hoisted page ids need whole pages; pointer loads then take one page id per row, a
    different compile) send the lookup to the ``"<arch>:small_pages"`` table where there is one."""
    arch_table(table, arch)
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
