"""The CLI refuses bad flags with one line naming the flag and exit status 2 (no traceback), honours
explicit values instead of replacing them by defaults, and reports a request's own error as one line
on stderr (exit status 1) while printing the others' results."""

import subprocess
import sys
from pathlib import Path

import pytest

from tritree import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv,flag", [
    (["--budget", "0"], "--budget"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--budget", "x"], "--budget"),
    (["--prompt-ids", "1,2;3,x"], "--prompt-ids"),
    (["--prompt-ids", "1,-2"], "--prompt-ids"),
    (["--page-size", "3"], "--page-size"),
    (["--top-p", "0"], "--top-p"),
    (["--top-k", "0"], "--top-k"),
    (["--temperature", "-1"], "--temperature"),
    (["--tp", "0"], "--tp"),
    (["--model", "/no/such/dir", "--draft", "/no/such/dir"], "--model"),
    (["--model", str(ROOT)], "--draft"),
])
def test_bad_flags_exit_2_with_one_line(argv, flag):
    r = subprocess.run([sys.executable, "-m", "tritree", "generate", *argv], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and flag in r.stderr
    assert len([line for line in r.stderr.splitlines() if "error" in line]) == 1


def test_explicit_values_are_not_replaced(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "generate", lambda args, tp: seen.update(vars(args)) or 0)
    monkeypatch.setattr(cli, "_ensure_interpreter_without_gpu", lambda: None)
    assert cli.main(["generate", "--budget", "1", "--max-new-tokens", "1", "--prompt-ids", "1,2;3"]) == 0
    assert seen["budget"] == 1 and seen["max_new_tokens"] == 1 and seen["prompt_ids"] == [[1, 2], [3]]
    assert cli.main(["generate"]) == 0
    assert seen["budget"] >= 1 and seen["max_new_tokens"] >= 1 and seen["prompt_ids"] is None


def test_a_bad_request_is_one_line_on_stderr_and_the_others_still_run():
    r = subprocess.run([sys.executable, "-m", "tritree", "generate", "--random", "--prompt-ids", "1,2,3;500",
                        "-n", "2", "--budget", "2", "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "request 1" in errors[0] and "vocabulary" in errors[0], r.stderr
    assert "[0] prompt [1, 2, 3]" in r.stdout and "(length)" in r.stdout


def test_budget_auto_is_parsed_and_bad_budgets_name_the_flag(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "generate", lambda args, tp: seen.update(vars(args)) or 0)
    monkeypatch.setattr(cli, "_ensure_interpreter_without_gpu", lambda: None)
    assert cli.main(["generate", "--budget", "auto", "--max-budget", "12"]) == 0
    assert seen["budget"] == "auto" and seen["max_budget"] == 12
    assert cli.main(["generate", "--budget", "5"]) == 0 and seen["budget"] == 5
    assert cli._size_histogram({0: 2, 1: 1, 2: 3, 3: 1, 9: 4}) == "0: 2, 1: 1, 2-3: 4, 8-15: 4"


@pytest.mark.skipif(cli.torch_has_gpu(), reason="the CPU refusal")
def test_bench_calibrate_refuses_on_the_cpu_with_one_line():
    r = subprocess.run([sys.executable, "-m", "tritree", "bench", "calibrate"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "calibrate" in lines[0] and "GPU" in lines[0], r.stderr


def test_bench_accept_cost_model_errors_are_one_line(tmp_path):
    """A missing, invalid or GPU-less step-cost file for ``bench accept`` is a usage error naming --cost-model."""
    good = tmp_path / "cost.json"
    good.write_text('{"version": 1, "gpus": {"GPU X": {"batch": [1], "ctx": [0], "tree": [1, 9], '
                    '"step_ms": [[[1.0, 2.0]]], "static_tree": 9}}}')
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for argv in (["--cost-model", str(tmp_path / "none.json")], ["--cost-model", str(bad)],
                 ["--cost-model", str(good), "--cost-gpu", "GPU Y"]):
        r = subprocess.run([sys.executable, "-m", "tritree", "bench", "accept", *argv], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "--cost-model" in r.stderr, r.stderr
