"""``bench/verify_sweep.py`` without a GPU: which cases, configs and split counts its command line runs."""

import json

import bench.verify_sweep as VS
from tritree.roofline import Ceilings


def _sweep(monkeypatch, tmp_path, argv):
    calls = []

    def fake_case(B, T, H, L, P, variant, ceil, config=None, check=True, trees="random", fragmented=None,
                  num_splits=None):
        calls.append((T, variant, config, num_splits))
        return dict(B=B, T=T, H=H, L=L, P=P, variant=variant, config=str(config), skipped="stub")

    monkeypatch.setattr(VS, "run_case", fake_case)
    monkeypatch.setattr(VS, "cached_ceilings", lambda path: Ceilings(3000.0, 800.0))
    monkeypatch.setattr(VS, "ceilings_source", lambda: "made up")
    out = tmp_path / "rows.jsonl"
    VS.main([*argv, "--out", str(out)])
    return calls, [json.loads(line) for line in out.read_text().splitlines()]


def test_splits_run_each_tritree_case_once_a_count_and_zero_is_the_plans(monkeypatch, tmp_path):
    calls, rows = _sweep(monkeypatch, tmp_path, ["--grid", "engine", "--splits", "0,62,66", "--filter", "T == 9",
                                                 "--variant", "tritree", "--variant", "torch"])
    assert calls == [(9, "tritree", None, None), (9, "tritree", None, 62), (9, "tritree", None, 66),
                     (9, "torch", None, None)]
    assert len(rows) == 4


def test_the_engine_grid_holds_the_decode_steps_tree_sizes():
    assert VS.GRIDS["engine"]["T"] == [9, 17, 65]  # budgets 8, 16 and 64 (bench decode's)
