"""Input checks shared by the launchers: clear ``TypeError``/``ValueError`` naming the argument."""

from __future__ import annotations

import math
import numbers
import os

import torch

ATTN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# Value checks of GPU inputs: ``TRITREE_DEBUG=1`` when tritree is imported, or :func:`set_debug` (read on
# every call: a module flag, not the environment, whose lookup costs more than a check of a small input).
DEBUG_CHECKS = os.environ.get("TRITREE_DEBUG", "0") not in ("", "0", "false", "False")


def debug_checks_enabled() -> bool:
    """Full (value) checks of GPU inputs cost a device-to-host sync; they run when ``TRITREE_DEBUG=1`` at
    import or after ``set_debug(True)``. Inputs on the CPU are always fully checked (no sync to pay)."""
    return DEBUG_CHECKS


def set_debug(enabled: bool) -> bool:
    """Turns the value checks of GPU inputs on or off (the run-time form of ``TRITREE_DEBUG=1``); returns
    the previous setting. Plans read it on every call."""
    global DEBUG_CHECKS
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, DEBUG_CHECKS = DEBUG_CHECKS, enabled
    return previous


def check_tensor(name: str, x, *, ndim: int | None = None, dtypes=None, device: torch.device | None = None,
                 last_contiguous: bool = True) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).removeprefix('torch.')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (the device of the op's first tensor), got {x.device}")
    if last_contiguous and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(x.stride())}")


def check_shape(name: str, x: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {what} = {tuple(expected)}, got {tuple(x.shape)}")


def check_int(name: str, v, lo: int | None = None, hi: int | None = None, *, power_of_two: bool = False) -> int:
    """``v`` a Python (or numpy) integer, not a bool, in ``[lo, hi]`` (and a power of two if asked)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}], "
                         f"got {v}")
    if power_of_two and (v < 1 or v & (v - 1)):
        raise ValueError(f"{name} must be a power of two, got {v}")
    return v


def check_float(name: str, v, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """``v`` a finite real number (not a bool) in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    v = float(v)
    low_bad = lo is not None and (v <= lo if lo_open else v < lo)
    if not math.isfinite(v) or low_bad or (hi is not None and v > hi):
        span = f"{'(' if lo_open else '['}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise ValueError(f"{name} must be a finite number in {span}, got {v!r}")
    return v


def values_checkable(*tensors: torch.Tensor) -> bool:
    """Whether value checks (which read tensors on the host) should run now: never while
    torch.compile traces (they would be data-dependent branches)."""
    if torch.compiler.is_compiling():
        return False
    return debug_checks_enabled() or all(t.device.type == "cpu" for t in tensors)


def checks_values(device: torch.device) -> bool:
    """The plans' form of :func:`values_checkable` (never traced): inputs on ``device`` are value-checked
    when it is the CPU or ``TRITREE_DEBUG=1``."""
    return DEBUG_CHECKS or device.type == "cpu"


def check_value_range(name: str, x: torch.Tensor, lo: int, hi: int, what: str = "") -> None:
    """Every value of ``x`` in ``[lo, hi]`` (read on the host: only where values are checked)."""
    v = x.detach().to("cpu", torch.int64)
    bad = (v < lo) | (v > hi)
    if bool(bad.any()):
        i = tuple(int(j) for j in torch.nonzero(bad)[0])
        at = f"[{', '.join(map(str, i))}]" if i else ""
        raise ValueError(f"{name}{at} = {int(v[i])} must be in [{lo}, {hi}]{what}")


def check_paged_lengths(page_table: torch.Tensor, num_pages: int, page_size: int, kv_lens: torch.Tensor,
                        extra: torch.Tensor, lens_name: str = "kv_lens") -> None:
    """Value checks of a paged layout: lengths in range, every page in use a valid id.

    ``extra: [B]`` tokens beyond ``kv_lens`` that the op touches (the tree nodes)."""
    kv_lens_c = kv_lens.detach().to("cpu", torch.int64)
    extra_c = extra.detach().to("cpu", torch.int64)
    if (kv_lens_c < 0).any():
        raise ValueError(f"{lens_name} must be >= 0, got {kv_lens_c.tolist()}")
    capacity = page_table.shape[1] * page_size
    ends = kv_lens_c + extra_c
    if (ends > capacity).any():
        b = int(torch.nonzero(ends > capacity)[0, 0])
        raise ValueError(
            f"{lens_name}[{b}] + tree tokens = {int(ends[b])} exceeds the page table's capacity "
            f"{page_table.shape[1]} pages x {page_size} = {capacity} tokens")
    pt = page_table.detach().to("cpu", torch.int64)
    used_pages = (ends + page_size - 1) // page_size
    cols = torch.arange(pt.shape[1])[None, :]
    in_use = cols < used_pages[:, None]
    bad = in_use & ((pt < 0) | (pt >= num_pages))
    if bad.any():
        b, c = (int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(f"page_table[{b}, {c}] = {int(pt[b, c])} is out of range [0, {num_pages}) "
                         f"for a page in use")
