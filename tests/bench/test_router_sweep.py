"""``bench/router_sweep.py`` without a GPU: its summary table on made-up numbers, its config parser, its bytes
floor, and its torch baseline (the model's router before ``moe_route``) against the reference."""

import pytest
import torch

from bench.router_sweep import floor_bytes, format_table, parse_config, torch_router
from tritree.kernels.moe.router import RouterConfig, moe_route_reference


def _row(routing, N, variant, us, **extra):
    return dict(routing=routing, N=N, variant=variant, plan="16x32x128 w8 g1.12.19" if variant == "kernel" else "-",
                graph_us=us, eager_us=3 * us, host_us=2 * us, floor_us=2.0, gbps=5600.0, pct_copy=42.0, err=1e-7,
                ties=0, **extra)


def test_table_lines_and_speedup_over_torch():
    rows = [_row("k26", 1, "torch", 30.0), _row("k26", 1, "kernel", 6.0), _row("v3", 17, "kernel", 7.5),
            dict(routing="v3", N=17, variant="torch", skipped="RuntimeError: out of memory")]
    lines = format_table(rows).splitlines()
    assert len(lines) == 5 and lines[0].split()[:4] == ["routing", "N", "variant", "plan"]
    assert "5.00x" in lines[2]  # 30 / 6
    assert "  -" in lines[3] and "skipped: RuntimeError" in lines[4]
    assert lines[2].split()[6:9] == ["6.0", "18.0", "12.0"]  # graph, eager, host


def test_config_parser_and_floor():
    assert parse_config("16,32,128,8,4") == RouterConfig(16, 32, 128, 8, 4)
    assert parse_config("16,32,128,8,4,2048,1") == RouterConfig(16, 32, 128, 8, 4, 2048, 1)
    with pytest.raises(ValueError, match="5 to 7 integers"):
        parse_config("16,32")
    assert floor_bytes(1) == 384 * 7168 * 2 + 7168 * 2 + 64


@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (4, 2)])
def test_torch_baseline_is_the_reference(n_group, topk_group):
    g = torch.Generator().manual_seed(0)
    B, T, H, E = 2, 5, 64, 32
    x = torch.randn(B * T, H, generator=g)
    w = torch.randn(E, H, generator=g) / 8
    b = 0.1 * torch.randn(E, generator=g)
    lens = torch.tensor([5, 2], dtype=torch.int32)
    opts = dict(top_k=4, n_group=n_group, topk_group=topk_group, norm_topk_prob=True, scaling=2.827)
    idx, wt = torch_router(x, w, b, tree_lens=lens, T=T, **opts)
    ri, rw = moe_route_reference(x, w, b, tree_lens=lens, rows_per_request=T, **opts)
    assert torch.equal(idx.int(), ri)
    real = ri[:, 0] >= 0
    torch.testing.assert_close(wt[real], rw[real], rtol=1e-5, atol=1e-6)
