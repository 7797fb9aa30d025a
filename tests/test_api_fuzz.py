"""The API fuzzer: every public op on random valid inputs laid out as views of bigger poisoned buffers
(offsets, padded rows, reordered dimensions, column slices, strided last dimensions where the op reads
by stride) against its reference, nothing outside the outputs written; and random invalid inputs
(dtype, rank, sizes, types, strides, devices, values, scalars) refused with a ``ValueError`` or
``TypeError`` that names the argument. Samples live in ``tests/_api_samples.py``.

Each op runs in a subprocess, so that a kernel writing out of bounds (which can kill the process) is a
failed test. Every run draws fresh examples; a failure prints its seed and hypothesis' reproduction blob.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._api_samples import SAMPLES
from .conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[1]
# Examples per op on the CPU (Triton's interpreter): the attention ops cost ~1-2 s an example.
CPU_EXAMPLES = {"verify_mla": 12, "draft_attention": 12}
GPU_EXAMPLES = 40


def run_samples(mode: str, op: str, examples: int, *, debug: bool = False, prefix: tuple = (), timeout=900):
    seed = random.randrange(2**31)
    env = dict(os.environ)
    env.pop("TRITREE_DEBUG", None)
    if debug:
        env["TRITREE_DEBUG"] = "1"
    if not HAS_GPU:
        env["TRITON_INTERPRET"] = "1"
    cmd = [*prefix, sys.executable, "-m", "tests._api_samples", mode, op, str(examples), str(seed)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    how = f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit status {res.returncode}"
    assert res.returncode == 0, (f"`{' '.join(cmd[len(prefix):])}` ({how}, TRITREE_DEBUG={int(debug)}):\n"
                                 f"{res.stdout[-4000:]}\n{res.stderr[-8000:]}")
    return res


@pytest.mark.parametrize("op", sorted(SAMPLES))
@pytest.mark.parametrize("mode", ["valid", "invalid", "unchecked"])
def test_fuzz(mode, op):
    """CPU: the kernels in Triton's interpreter; value checks always run on CPU inputs (``unchecked``
    turns them off, as for GPU inputs without ``TRITREE_DEBUG=1``: bad values may give any result but
    must not write outside the outputs)."""
    if HAS_GPU:
        pytest.skip("the GPU form of this test is test_gpu_fuzz")
    run_samples(mode, op, CPU_EXAMPLES.get(op, 25))


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(SAMPLES))
@pytest.mark.parametrize("mode,debug", [("valid", False), ("valid", True), ("invalid", True),
                                        ("invalid", False), ("unchecked", False)])
def test_gpu_fuzz(mode, debug, op):
    """GPU, with value checks (``TRITREE_DEBUG=1``) and without. ``invalid`` without them refuses all but
    bad values; ``unchecked`` runs the bad values unchecked: any result, but nothing written outside the
    outputs."""
    run_samples(mode if debug or mode != "invalid" else "invalid_structure", op, GPU_EXAMPLES, debug=debug)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer (CUDA toolkit)")
@pytest.mark.parametrize("op", ["verify_mla", "draft_attention", "kv_write_", "kv_commit_", "kv_gather",
                                "accept_tree", "build_tree"])
def test_gpu_unchecked_values_under_memcheck(op):
    """Bad lengths, page ids and trees without value checks under compute-sanitizer's memcheck: no
    out-of-bounds access."""
    run_samples("unchecked", op, 4, prefix=("compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3"),
                timeout=1800)
