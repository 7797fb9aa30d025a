"""The README's Python blocks run as written (extracted from README.md), so its examples cannot rot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# (line of the opening fence, code) of every ```python block
BLOCKS = [(README.count("\n", 0, m.start()) + 1, m.group(1))
          for m in re.finditer(r"^```python\n(.*?)^```", README, re.S | re.M)]


def test_the_readme_has_its_python_examples():
    code = "\n".join(c for _, c in BLOCKS)
    for name in ("build_tree(", "kv_write_(", "verify_mla(", "accept_tree(", "kv_commit_(", "Engine(", ".generate("):
        assert name in code, f"no README Python block calls {name}"


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs_as_written(line, code, tmp_path):
    # As a reader runs it: a fresh interpreter, another directory, and no TRITON_INTERPRET (conftest sets it
    # for the tests; a reader's CPU calls take the ops' PyTorch references).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"the Python block at README.md:{line} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
