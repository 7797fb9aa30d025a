"""Measuring on a GPU by the project's method: measured ceilings, floors, graph-replay timing
with input rotation beyond the L2 cache."""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import statistics
from dataclasses import dataclass

import torch

L2_ROTATE_BYTES = 256 << 20  # rotate inputs over >= 5x the H200's 50 MB of L2


@dataclass
class Ceilings:
    copy_gbps: float      # device-to-device copy, bytes read + written per second / 1e9
    matmul_tflops: float  # bf16 8192^3 torch.matmul on random data

    def floor_us(self, nbytes: float, flops: float) -> tuple[float, str]:
        t_mem = nbytes / (self.copy_gbps * 1e9) * 1e6
        t_mma = flops / (self.matmul_tflops * 1e12) * 1e6
        return (t_mem, "memory") if t_mem >= t_mma else (t_mma, "compute")


# Paper figures of an RTX PRO 6000 Blackwell (sm_120; docs/SPEC.md section 6), not measurements: no such GPU
# is available to this project. ``bench/sm120_model.py`` uses them for its roofline model.
RTX_PRO_6000 = Ceilings(copy_gbps=1790.0, matmul_tflops=504.0)


def _event_times_ms(fn, reps: int, warmup: int, per_timing: int = 1) -> list[float]:
    """``reps`` CUDA-event timings of ``per_timing`` calls of ``fn`` back to back, in ms per call, after
    ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_timing):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per_timing)
    return times


def median_event_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median time (ms) of ``fn()`` between CUDA events, after ``warmup`` calls (host work inside ``fn``, a host
    read included, counts)."""
    return statistics.median(_event_times_ms(fn, reps, warmup))


def _copy_ms(n: int, device) -> float:
    """Median time of a device copy of ``n`` bytes (its buffers freed on return)."""
    src = torch.randn(n // 4, device=device)
    dst = torch.empty_like(src)
    return median_event_ms(lambda: dst.copy_(src), reps=20)


def copy_gbps_now(device="cuda") -> float:
    """The device-to-device copy rate measured now: a 1 GiB copy (bytes read and written), median of 20."""
    n = 1 << 30
    return 2 * n / (_copy_ms(n, device) * 1e-3) / 1e9


def measure_ceilings(device="cuda") -> Ceilings:
    copy_gbps = copy_gbps_now(device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = median_event_ms(lambda: a @ b, reps=20)
    return Ceilings(copy_gbps, 2 * 8192**3 / (ms * 1e-3) / 1e12)


def _burst_rate(fn, per_burst: int, bursts: int) -> list[float]:
    """Seconds per call of ``fn`` from ``bursts`` timings of ``per_burst`` calls back to back (the GPU
    busy between the events, as in a decode step), after one untimed burst."""
    return [t * 1e-3 for t in _event_times_ms(fn, bursts, per_burst, per_burst)]


def measure_ceilings_sustained(device="cuda", bursts: int = 10, per_burst: int = 20) -> dict:
    """The two ceilings under sustained load: bf16 8192^3 matmuls and 1 GiB device copies, ``per_burst``
    back to back per timing, median and best over ``bursts`` timings. What ``RECORDED_CEILINGS`` holds
    (``python -m tritree.roofline``, run in several processes; the highest median is recorded)."""
    n = 1 << 30

    def copy_rates():  # the buffers freed on return
        src = torch.randn(n // 4, device=device)
        dst = torch.empty_like(src)
        return [2 * n / t / 1e9 for t in _burst_rate(lambda: dst.copy_(src), per_burst // 4 or 1, bursts)]

    copy = copy_rates()
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm = [2 * 8192**3 / t / 1e12 for t in _burst_rate(lambda: a @ b, per_burst, bursts)]
    return dict(copy_gbps_median=statistics.median(copy), copy_gbps_best=max(copy),
                matmul_tflops_median=statistics.median(mm), matmul_tflops_best=max(mm))


# The ceilings each floor of this project is computed from, measured once per GPU model, by device name: a reading
# taken in each benchmark process moved the matmul ceiling by up to a tenth between processes, and with it every
# floor and ratio. The H200's: the highest burst of ``measure_ceilings_sustained`` over three processes (a floor is
# a lower bound: the fastest rate seen); the readings are in bench/RESULTS.md, section "H200 ceilings".
RECORDED_CEILINGS: dict[str, Ceilings] = {"NVIDIA H200": Ceilings(copy_gbps=4240.0, matmul_tflops=800.3)}


def device_ceilings(device="cuda") -> Ceilings:
    """``RECORDED_CEILINGS`` for this GPU model where recorded, else a reading now (``measure_ceilings``)."""
    name = torch.cuda.get_device_name(device)
    return RECORDED_CEILINGS[name] if name in RECORDED_CEILINGS else measure_ceilings(device)


def ceilings_source(device="cuda") -> str:
    """Where ``device_ceilings`` takes its numbers from, for the benchmarks' headers."""
    name = torch.cuda.get_device_name(device)
    return f"recorded for {name}" if name in RECORDED_CEILINGS else "measured now"


def graph_time_us(fns, reps: int = 20) -> float:
    """Median time of one call, from CUDA-graph replays of ``fns`` (a list of calls over rotating
    input sets, captured back to back). Warms every call before capture."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    ms = median_event_ms(g.replay, reps=reps, warmup=2)
    return ms * 1e3 / len(fns)


def profile_text(fn, calls: int, top: int = 25, sorts=("tottime",)) -> str:
    """The top ``top`` rows of one cProfile of ``calls`` calls of ``fn`` (synchronised after), once per
    order in ``sorts`` (``"tottime"``, ``"cumulative"``, ...)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    for key in sorts:
        out.write(f"by {key}:\n")
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
    return out.getvalue()


def rotation_count(bytes_per_set: int, cap: int = 32) -> int:
    return max(1, min(cap, math.ceil(L2_ROTATE_BYTES / max(1, bytes_per_set))))


def verify_mla_counts(B: int, T: int, H: int, L: int, dtype_bytes: int = 2,
                      kv_bytes: int | None = None) -> tuple[int, int]:
    """Fewest bytes (KV once, q, out) and FLOPs (QK 576 + PV 512 per row and key) of one verify call.
    ``kv_bytes``: bytes per KV element when the pool's dtype differs from q's (fp8 pools: 1)."""
    kv_bytes = dtype_bytes if kv_bytes is None else kv_bytes
    nbytes = B * (L + T) * 576 * kv_bytes + B * T * H * (576 + 512) * dtype_bytes
    flops = 2 * B * T * H * (L + T) * (576 + 512)
    return nbytes, flops


def versions() -> str:
    import triton
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return f"{dev}, torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}"


def cached_ceilings(path: str | None = None) -> Ceilings:
    """The ceilings stored in the JSON file ``path`` if it exists, else ``device_ceilings()`` (and stored
    there when ``path`` is given), so the sweeps of one run share one measurement."""
    import json
    import os

    if path and os.path.exists(path):
        with open(path) as f:
            return Ceilings(**json.load(f))
    c = device_ceilings()
    if path:
        with open(path, "w") as f:
            json.dump(c.__dict__, f)
    return c


def append_jsonl(path: str | None, rows) -> None:
    """Appends ``rows`` (dicts) to ``path`` as JSON lines; nothing when ``path`` is empty."""
    import json

    if not path:
        return
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    import json

    print(json.dumps({"device": torch.cuda.get_device_name(), **measure_ceilings_sustained()}))
