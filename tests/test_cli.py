"""The CLI refuses bad flags with one line naming the flag and exit status 2 (no traceback), honours
explicit values instead of replacing them by defaults, and reports a request's own error as one line
on stderr (exit status 1) while printing the others' results. ``--help`` lists the commands; a bad
checkpoint directory is one line naming it; the summary says what ran; defaults that write stay out of
the repository."""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritree import cli

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tritree" / "assets" / "tiny"


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


# ---- what a newcomer meets: the command listing, bad checkpoints, outputs, defaults that write ---------

def _run(*argv, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tritree", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_help_lists_every_command_on_one_line(capsys):
    """``--help`` / ``-h`` is the top-level help: every command with its one-line help, not generate's options."""
    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(sub.choices) >= {"generate", "bench", "train", "demo", "memory"}
    r = _run("--help", env=dict(os.environ, COLUMNS="80"))
    assert r.returncode == 0 and not r.stderr, r.stderr
    with pytest.raises(SystemExit) as e:
        cli.main(["-h"])
    assert e.value.code == 0 and capsys.readouterr().out.split() == r.stdout.split()
    for name, text in helps.items():
        assert any(line.split() == [name, *text.split()] for line in r.stdout.splitlines()), (name, r.stdout)
    assert "--prompt-ids" not in r.stdout  # generate's options are in 'generate --help'


def test_no_command_or_a_leading_option_means_generate(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "generate", lambda args, tp: seen.update(vars(args)) or 0)
    monkeypatch.setattr(cli, "_ensure_interpreter_without_gpu", lambda: None)
    assert cli.main([]) == 0 and seen["cmd"] == "generate"
    assert cli.main(["--prompt", "x"]) == 0 and seen["cmd"] == "generate" and seen["prompt"] == ["x"]


def _bad_checkpoints(root: Path, kind: str) -> dict:
    """Checkpoint directories, each wrong in one way, and what the error line must say (``kind``: the
    shipped pair's "target" or "draft" gives the valid config of the directory without weights)."""
    cases = {"missing": (root / "none", "no such directory"), "a file": (root / "file", "not a directory")}
    (root / "file").write_text("")
    for name, config, says in (("empty", None, "no config.json"),
                               ("invalid json", "{", "not valid JSON"),
                               ("not an object", "[1]", "not a JSON object"),
                               ("refused config", '{"num_experts_per_tok": null, "num_hidden_layers": 2}',
                                "not a valid"),
                               ("no weights", "valid", "no model.safetensors or model.safetensors.index.json")):
        d = root / name.replace(" ", "_")
        d.mkdir()
        if config == "valid":
            shutil.copy(TINY / kind / "config.json", d)
        elif config is not None:
            (d / "config.json").write_text(config)
        cases[name] = (d, says)
    return cases


@pytest.mark.parametrize("flag", ["--model", "--draft"])
def test_a_bad_checkpoint_directory_is_one_line_in_every_command(tmp_path, flag, capsys, monkeypatch):
    """generate and memory: one line on stderr naming the flag, the directory and what is wrong; exit 2."""
    monkeypatch.setattr(cli, "_ensure_interpreter_without_gpu", lambda: None)
    good = str(TINY / ("target" if flag == "--draft" else "draft"))
    for case, (path, says) in _bad_checkpoints(tmp_path, "target" if flag == "--model" else "draft").items():
        other = "--draft" if flag == "--model" else "--model"
        commands = [["generate", flag, str(path), other, good]]
        if case != "no weights":  # memory reads config.json only
            commands.append(["memory", flag, str(path)] + (["--no-draft"] if flag == "--model" else []))
        for argv in commands:
            with pytest.raises(SystemExit) as e:
                cli.main(argv)
            assert e.value.code == 2, (case, argv)
            line = _one_error_line(capsys.readouterr().err)
            assert f"tritree {argv[0]}: error: {flag} {path}: " in line and says in line, (case, line)


def test_a_bad_checkpoint_is_one_line_through_the_command(tmp_path):
    """As a user meets it: an invalid config.json is one line, exit 2, before any start-up."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    r = _run("generate", "--model", str(bad), "--draft", str(TINY / "draft"))
    assert r.returncode == 2, r.stderr
    line = _one_error_line(r.stderr)
    assert line.startswith(f"tritree generate: error: --model {bad}: config.json is not valid JSON"), line


def test_what_the_loaders_find_wrong_inside_a_checkpoint_is_one_line(tmp_path, capsys):
    """A config.json whose tensors the weights lack (the loader's KeyError) or an unreadable shard."""
    import torch

    mixed, corrupt = tmp_path / "mixed", tmp_path / "corrupt"  # the target's config over the draft's tensors
    for d in (mixed, corrupt):
        d.mkdir()
        shutil.copy(TINY / "target" / "config.json", d)
    shutil.copy(TINY / "draft" / "model.safetensors", mixed)
    (corrupt / "model.safetensors").write_bytes(b"not safetensors")
    for model, says in ((mixed, "has no tensor 'model.embed_tokens.weight'"), (corrupt, "header")):
        args = cli._parser().parse_args(["generate", "--model", str(model), "--draft", str(TINY / "draft")])
        with pytest.raises(SystemExit) as e:
            cli._load_pair(args, "cpu", torch.float32)
        assert e.value.code == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith(f"tritree generate: error: --model {model}: ") and says in line, line


def test_arguments_that_would_be_dropped_or_meaningless_are_refused(capsys, monkeypatch):
    """An empty prompt, text and token-id prompts together, --chain with a --budget it ignores, text for a
    target that does not read bytes: one line, exit 2 (through the command once, the rest in process)."""
    r = _run("--prompt", "a", "--prompt-ids", "1,2")
    assert r.returncode == 2, r.stderr
    assert _one_error_line(r.stderr).startswith("tritree generate: error: --prompt and --prompt-ids exclude each other")
    monkeypatch.setattr(cli, "_ensure_interpreter_without_gpu", lambda: pytest.fail("not refused before the start"))
    for argv, says in ((["--prompt", ""], "--prompt '': an empty prompt"),
                       (["--prompt", "a", "--prompt-ids", "1,2"], "--prompt and --prompt-ids"),
                       (["--chain", "--budget", "8"], "--budget 8 and --chain"),
                       (["--random", "--prompt", "a"], "--prompt needs a byte-level target")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith("tritree generate: error: ") and says in line, line


def test_the_summary_says_what_ran(capsys, monkeypatch):
    """The chain's size beside its histogram, no CUDA graph on the CPU, and "n/a" (not nan) for the
    acceptance length when no request decoded."""
    if cli.torch_has_gpu():
        pytest.skip("the CPU wording")
    args = cli._parser().parse_args(["generate", "--chain", "-n", "2", "--quiet", "--prompt", "def f("])
    assert cli._dispatch(args, None) == 0
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if " tokens in " in line)
    hist = next(line for line in out.splitlines() if "histogram" in line)
    assert "(the DFlash chain of 7 nodes)" in summary and "mean 7.00" in hist, out
    assert "graph" not in out.lower() and "Triton interpreter on the CPU" in summary, out
    args = cli._parser().parse_args(["generate", "--random", "-n", "1", "--quiet", "--prompt-ids", "100000"])
    assert cli._dispatch(args, None) == 1
    captured = capsys.readouterr()
    assert "nan" not in captured.out and "mean acceptance length n/a" in captured.out, captured.out
    assert "request 0" in _one_error_line(captured.err)


@pytest.mark.skipif(cli.torch_has_gpu(), reason="the CPU refusal")
def test_bench_decode_refuses_on_the_cpu_like_calibrate():
    r = _run("bench", "decode")
    assert r.returncode == 2
    assert _one_error_line(r.stderr) == ("tritree bench decode: error: needs a CUDA GPU (it times decode steps "
                                         "there); none is visible")


def test_aot_prints_no_triton_warnings_or_leak_report():
    """``python -m tritree.kernels.aot`` sets TRITON_DEFAULT_FP_FUSION (Triton warns when it is unset) and
    exits without nanobind's leak report (the Gluon bindings leave objects behind; one is leaked here on
    purpose, the way they do). One small table stands in for all of them."""
    script = ("import ctypes, sys\n"
              "import triton._C.libtriton as lt\n"
              "from tritree.kernels import aot\n"
              "for name in dir(aot):\n"
              "    if name.endswith('_reports') and name != 'accept_reports':\n"
              "        setattr(aot, name, lambda archs=None, **kw: [])\n"
              "ctypes.pythonapi.Py_IncRef(ctypes.py_object(lt.ir.context()))\n"
              "sys.argv = ['aot', '--arch', 'sm_80']\n"
              "aot._cli()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "_accept" in r.stdout and "FAIL" not in r.stdout, r.stdout
    assert r.stderr == "", r.stderr


def test_defaults_that_write_stay_out_of_the_repository():
    """train --out and bench accept --plot default to a new folder of the current directory (no tracked
    path, said in --help); bench calibrate's table goes to the user's cache, outside the checkout."""
    from tritree.budget import DEFAULT_COST_PATH

    ap = cli._parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    out, plot = ap.parse_args(["train"]).out, ap.parse_args(["bench", "accept"]).plot
    for path, cmd in ((out, "train"), (plot, "bench")):
        assert not os.path.isabs(path) and Path(path).parts[0] not in ("tritree", "bench", "tests"), path
        tracked = subprocess.run(["git", "ls-files", Path(path).parts[0]], capture_output=True, text=True, cwd=ROOT)
        assert tracked.returncode != 0 or tracked.stdout == "", tracked.stdout
        assert f"default {path}" in " ".join(sub[cmd].format_help().split()), cmd
    assert ROOT not in Path(DEFAULT_COST_PATH).resolve().parents
