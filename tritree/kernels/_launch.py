"""Cheap eager launches: compiled kernels launched directly, and launch plans cached per static signature.

An eager ``kernel[grid](*args)`` through Triton's JIT binds and specialises every argument and looks the
binary up by a key string on every call (tens of microseconds for a kernel of 40 arguments on the H200's
host), and a call through a ``torch.library`` op adds its dispatch (more than the kernel's own time at
decode shapes). The ops therefore launch in two ways:

- traced by torch.compile (``torch.compiler.is_compiling()``): through their registered ``torch.library``
  ops, as Inductor needs;
- otherwise (eager calls, and CUDA-graph capture of eager calls): through a plan built once per static
  signature (shapes, strides, dtypes, device, options), whose :class:`KernelLauncher` objects launch the
  compiled binary directly.

A :class:`KernelLauncher` is bound to fixed constexprs and launch options; the integer arguments it is given
must depend only on the plan's static signature (shapes and strides), because the binary is chosen by
the pointer alignments alone (Triton also specialises integers equal to 1 or divisible by 16: those are
fixed with the signature). The first launch for each alignment pattern goes through the JIT (compiling or
finding the binary); later ones call the binary's launcher.
"""

from __future__ import annotations

import inspect
import os
from collections import OrderedDict

import torch
from triton import knobs


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def eager() -> bool:
    """Whether the ops take their plan path (not traced by torch.compile)."""
    return not torch.compiler.is_compiling()


class KernelLauncher:
    """``fn[grid](*args, **constexprs, **options)`` with the compiled binary cached per pointer alignment.

    ``args`` are the kernel's runtime arguments in order; ``constexprs`` and ``options`` (``num_warps``,
    ``launch_pdl``, ``ptx_options``, ...) are fixed at construction. Under the interpreter every launch goes
    through ``fn[grid]``."""

    __slots__ = ("fn", "constexprs", "options", "_tail", "_binaries", "_ptr_positions")

    def __init__(self, fn, constexprs: dict | None = None, **options):
        self.fn = fn
        self.constexprs = dict(constexprs or {})
        self.options = options
        self._binaries: dict = {}
        self._ptr_positions: tuple | None = None
        self._tail = None
        params = getattr(fn, "params", None)
        if params is None:  # Triton's interpreter: launched through fn[grid] every time
            return
        n_rt = sum(1 for p in params if not p.is_constexpr)
        if any(p.is_constexpr for p in params[:n_rt]):
            raise TypeError(f"{fn.__name__}: KernelLauncher needs the constexpr parameters after the runtime ones")
        missing = [p.name for p in params[n_rt:] if p.name not in self.constexprs and p.default is inspect.Parameter.empty]
        if missing:
            raise TypeError(f"{fn.__name__}: constexprs without a value: {missing}")
        # The constexprs as the compiled launcher takes them: every one, in signature order, defaults filled.
        self._tail = tuple(self.constexprs.get(p.name, p.default) for p in params[n_rt:])

    def _key(self, args) -> tuple:
        pos = self._ptr_positions
        if pos is None:
            pos = self._ptr_positions = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        return tuple(args[i].data_ptr() & 15 == 0 for i in pos)

    def __call__(self, grid, *args) -> None:
        """``grid``: a 3-tuple of ints."""
        if self._tail is None:
            self.fn[grid](*args, **self.constexprs, **self.options)
            return
        key = self._key(args)
        entry = self._binaries.get(key)
        if entry is None:
            if len(grid) != 3:
                raise ValueError(f"{self.fn.__name__}: a KernelLauncher grid has 3 dimensions, got {grid}")
            binary = self.fn[grid](*args, **self.constexprs, **self.options)
            self._binaries[key] = (binary, binary.run, binary.function, binary.packed_metadata)
            return
        binary, run, function, metadata = entry
        hooks = knobs.runtime
        if hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls:  # a profiler's hooks: their metadata
            binary[grid](*args, *self._tail)
            return
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None, *args, *self._tail)


class PlanCache:
    """Plans by static signature, least recently used evicted past ``maxsize`` (eager plans own no memory
    that a captured graph could still use; see each plan's scratch rule)."""

    def __init__(self, name: str, build, maxsize: int = 64):
        self.name = name
        self._build = build
        self._plans: OrderedDict = OrderedDict()
        self.maxsize = maxsize
        self.builds = 0
        _CACHES[name] = self

    def get(self, key, *args, **kwargs):
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(*args, **kwargs)
            self.builds += 1
            self._plans[key] = plan
            if len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


_CACHES: dict[str, PlanCache] = {}


def plan_cache_info() -> dict:
    """``{op: {"plans": plans cached, "builds": plans built so far}}`` for every op's plan cache."""
    return {name: {"plans": len(c), "builds": c.builds} for name, c in _CACHES.items()}


def clear_plan_caches() -> None:
    """Drops every cached plan (and the scratch buffers they own); the next call of each op plans again."""
    for c in _CACHES.values():
        c.clear()


def signature(*tensors) -> tuple:
    """The static facts of tensors a plan depends on: shape, strides, dtype, device (None stays None)."""
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class StreamScratch:
    """Scratch buffers of a plan: one set per CUDA stream, reused by eager calls on that stream (which are
    ordered as launched); inside a CUDA-graph capture a fresh set per call, which the graph's memory pool keeps
    for the graph's lifetime (a cached set could be freed under the graph or shared by two graphs)."""

    __slots__ = ("_make", "_sets")

    def __init__(self, make):
        self._make = make
        self._sets: dict = {}

    def get(self, device: torch.device):
        if device.type != "cuda":
            s = self._sets.get(None)
            if s is None:
                s = self._sets[None] = self._make()
            return s
        if torch.cuda.is_current_stream_capturing():
            return self._make()
        sid = torch.cuda.current_stream(device).cuda_stream
        s = self._sets.get(sid)
        if s is None:
            s = self._sets[sid] = self._make()
        return s


_FULL_LENGTHS: dict = {}


def full_lengths(B: int, n: int, device: torch.device) -> torch.Tensor:
    """``[B]`` int32 of ``n``'s (an op's ``tree_lens=None``), cached per (device, B, n) so that eager calls, and
    graphs captured after one, launch no fill kernel (a graph node of its own, ~1 us). Read-only. First met
    inside a capture (where the fill runs only at replay), a fresh fill that is not cached."""
    key = (device, B, n)
    t = _FULL_LENGTHS.get(key)
    if t is None:
        t = torch.full((B,), n, dtype=torch.int32, device=device)
        if capturing(device):
            return t
        _FULL_LENGTHS[key] = t  # never evicted: captured graphs may hold its address
    return t
