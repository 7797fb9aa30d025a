"""The API fuzzer: every public op on random valid inputs laid out as views of bigger poisoned buffers
(offsets, padded rows, reordered dimensions, column slices, strided last dimensions where the op reads
by stride) against its reference, nothing outside the outputs written; and random invalid inputs
(dtype, rank, sizes, types, strides, devices, values, scalars) refused with a ``ValueError`` or
``TypeError`` that names the argument. Samples live in ``tests/_api_samples.py``, their checks in ``tests/_api_fuzz_checks.py``.

The ops run in a subprocess (one per mode: the interpreter's start-up is paid once), so that a kernel
writing out of bounds, which can kill the process, is a failed test naming the op. Every run draws
fresh examples; a failure prints its seed and hypothesis' reproduction blob.
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
# Examples per op on the CPU (Triton's interpreter; the attention ops cost ~1 s an example) and on a GPU.
CPU_EXAMPLES = {"verify_mla": 10, "draft_attention": 10, "build_tree": 15, "routed_experts_int4": 10}
# Each new shape compiles (verify_mla's Gluon kernels ~15-30 s an example on the H200): bounded so that an
# op's run takes a few minutes.
GPU_EXAMPLES = {"verify_mla": 3}
GPU_DEFAULT_EXAMPLES = 15
# Under memcheck every access is instrumented; verify_mla's examples also compile (~15-30 s each).
MEMCHECK_EXAMPLES = {"verify_mla": 2}
ATTENTION_AND_KV = ("verify_mla", "draft_attention", "kv_write_", "kv_commit_", "kv_gather", "accept_tree",
                    "build_tree", "routed_experts_int4")


def run_samples(mode: str, examples: dict[str, int], *, debug: bool = False, prefix: tuple = (), timeout=1200):
    seed = random.randrange(2**31)
    env = dict(os.environ)
    env.pop("TRITREE_DEBUG", None)
    if debug:
        env["TRITREE_DEBUG"] = "1"
    if not HAS_GPU:
        env["TRITON_INTERPRET"] = "1"
    ops = ",".join(f"{op}:{n}" for op, n in examples.items())
    cmd = [*prefix, sys.executable, "-m", "tests._api_fuzz_checks", mode, ops, str(seed)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    how = f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit status {res.returncode}"
    assert res.returncode == 0, (f"`{' '.join(cmd[len(prefix):])}` ({how}, TRITREE_DEBUG={int(debug)}):\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-8000:]}")
    return res


@pytest.mark.skipif(HAS_GPU, reason="on a GPU: test_gpu_fuzz")
@pytest.mark.parametrize("mode", ["valid", "invalid", "unchecked"])
def test_fuzz(mode):
    """CPU: the kernels in Triton's interpreter; value checks always run on CPU inputs (``unchecked``
    turns them off, as for GPU inputs without ``TRITREE_DEBUG=1``: bad values may give any result but
    must not write outside the outputs)."""
    run_samples(mode, {op: CPU_EXAMPLES.get(op, 20) for op in sorted(SAMPLES)})


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(SAMPLES))
@pytest.mark.parametrize("mode,debug", [("valid", False), ("valid", True), ("invalid", True),
                                        ("invalid_structure", False), ("unchecked", False)])
def test_gpu_fuzz(mode, debug, op):
    """GPU, with value checks (``TRITREE_DEBUG=1``) and without: without them bad values are not refused
    (``invalid_structure`` leaves them out) and ``unchecked`` runs them: any result, but nothing written
    outside the outputs. One op a test: each new shape compiles, and the ops run in parallel under
    pytest-xdist."""
    run_samples(mode, {op: GPU_EXAMPLES.get(op, GPU_DEFAULT_EXAMPLES)}, debug=debug)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer (CUDA toolkit)")
@pytest.mark.parametrize("op", ATTENTION_AND_KV)
def test_gpu_unchecked_values_under_memcheck(op):
    """Bad lengths, page ids and trees without value checks under compute-sanitizer's memcheck: no
    out-of-bounds access, read or write (one op a test: the instrumented runs are slow, and run in
    parallel under pytest-xdist)."""
    run_samples("unchecked", {op: MEMCHECK_EXAMPLES.get(op, 3)},
                prefix=("compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3"), timeout=3000)
