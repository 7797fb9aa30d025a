"""The config tables' lookup: row buckets, the small-pages and fp8 tables, errors."""

import pytest

from tritree.kernels.configs import lookup
from tritree.kernels.verify import VERIFY_MLA_CONFIGS


def test_sm90_buckets_and_small_pages():
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", 16).kernel == "triton"
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", 64, page_size=64).kernel == "gluon"
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", 65, page_size=64).kernel == "gluon-ws"
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", 512, page_size=64).kernel == "gluon-ws"
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", 1024, page_size=128).kernel == "gluon-ws"
    # TMA tiles need whole pages: smaller pages take the small-pages table (row gathers).
    small = lookup(VERIFY_MLA_CONFIGS, "sm_90", 520, page_size=1)
    assert small == VERIFY_MLA_CONFIGS["sm_90:small_pages"][1 << 30] and not small.tma


@pytest.mark.parametrize("rows", [8, 64, 520, 1024])
def test_fp8_pools_take_the_fp8_table_where_there_is_one(rows):
    cfg = lookup(VERIFY_MLA_CONFIGS, "sm_90", rows, page_size=64, kv_fp8=True)
    table = VERIFY_MLA_CONFIGS["sm_90:fp8"]
    assert cfg == table[min(b for b in table if rows <= b)]
    assert cfg.kernel == "triton"  # the Hopper Gluon kernels are bf16-only
    if rows > 16:
        assert cfg.num_stages == 3 and cfg.tma
    # Pages below a tile: the small-pages table, as for bf16 pools.
    assert lookup(VERIFY_MLA_CONFIGS, "sm_90", rows, page_size=1, kv_fp8=True) == \
        lookup(VERIFY_MLA_CONFIGS, "sm_90", rows, page_size=1)
    # Architectures without an fp8 table keep their own.
    assert lookup(VERIFY_MLA_CONFIGS, "sm_80", rows, kv_fp8=True) == lookup(VERIFY_MLA_CONFIGS, "sm_80", rows)
    # sm_120: fp8 pools run the Gluon mma.sync kernel at every page size (the fp8 table's config, whose 32x32
    # tiles also serve the Triton kernel where the Gluon one cannot); bf16 pools run it below 64-key pages and the
    # Triton kernel's 16x64 tiles from 64 keys.
    for P in (1, 16, 32, 64, 128):
        assert lookup(VERIFY_MLA_CONFIGS, "sm_120", rows, page_size=P, kv_fp8=True).kernel == "gluon-mma"
        assert lookup(VERIFY_MLA_CONFIGS, "sm_120", rows, page_size=P, kv_fp8=True).block_n == 32
        bf16 = lookup(VERIFY_MLA_CONFIGS, "sm_120", rows, page_size=P)
        assert (bf16.kernel, bf16.block_m, bf16.block_n) == (("gluon-mma", 32, 32) if P < 64 else ("triton", 16, 64))


@pytest.mark.parametrize("P", [1, 16, 32, 64, 128])
def test_pages_smaller_than_the_tiles_take_the_small_pages_table(P):
    for arch in ("sm_90",):
        for rows in (8, 64, 520):
            main = lookup(VERIFY_MLA_CONFIGS, arch, rows)
            small = lookup(VERIFY_MLA_CONFIGS, f"{arch}:small_pages", rows)
            assert lookup(VERIFY_MLA_CONFIGS, arch, rows, page_size=P) == (small if P < main.block_n else main)


def test_unknown_architecture_is_a_value_error():
    with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
        lookup(VERIFY_MLA_CONFIGS, "sm_75", 64)


def test_every_op_table_goes_through_the_one_lookup():
    """Every op's table has the architectures arch_of names, and an architecture it lacks is the same error."""
    import importlib

    tables = {"verify_mla": VERIFY_MLA_CONFIGS}
    for mod, name in (("draft_attention", "DRAFT_ATTN_CONFIGS"), ("moe.router", "ROUTER_CONFIGS"),
                      ("linear", "LINEAR_CONFIGS"), ("mla_decode", "MLA_CONFIGS"), ("moe.int4_triton", "INT4_MOE_CONFIGS")):
        tables[mod] = getattr(importlib.import_module(f"tritree.kernels.{mod}"), name)
    for op, table in tables.items():
        for arch in ("sm_90", "sm_120", "sm_80", "cpu"):
            assert lookup(table, arch, 1) is not None, op
        with pytest.raises(ValueError, match="no config table for architecture 'sm_75'"):
            lookup(table, "sm_75", 1)
