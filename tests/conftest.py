"""Test setup: without a GPU, Triton kernels run in the interpreter (set before triton is imported)."""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    assert "triton" not in sys.modules or os.environ["TRITON_INTERPRET"] == "1", "set TRITON_INTERPRET before triton loads"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

# Under pytest-xdist the workers share the machine's cores: one intra-op thread pool per core, not per worker
# (oversubscribed OpenMP pools make the small CPU ops of the engine tests several times slower). Subprocesses
# the tests start inherit the same share.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _THREADS = max(1, _CORES // _WORKERS)
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "tritree", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True)
settings.load_profile("tritree")

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE
