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


def uses_kernel(device: torch.device) -> bool:
    """Whether an op on ``device`` runs its Triton kernel (every op asks this, nothing else): on CUDA devices, and on
    any device under Triton's interpreter (the CPU tests run the kernels' code); otherwise its PyTorch reference."""
    return device.type == "cuda" or interpreting()


def eager() -> bool:
    """Whether the ops take their plan path (not traced by torch.compile)."""
    return not torch.compiler.is_compiling()


class KernelLauncher:
    """``fn[grid](*args, **constexprs, **options)`` with the compiled binary cached per pointer alignment.

    ``args`` are the kernel's runtime arguments in order; ``constexprs`` and ``options`` (``num_warps``,
    ``launch_pdl``, ``ptx_options``, ...) are fixed at construction. ``descriptors``: ``{position: host TMA
    descriptor}`` templates (shape, strides, block); a call passes at such a position the tensor the
    descriptor is over (its base), and no descriptor object is built per call. Under the interpreter every
    launch goes through ``fn[grid]``."""

    __slots__ = ("fn", "constexprs", "options", "_tail", "_binaries", "_ptr_positions", "_tensor_maps",
                 "_templates")

    def __init__(self, fn, constexprs: dict | None = None, descriptors: dict | None = None, **options):
        self.fn = fn
        self.constexprs = dict(constexprs or {})
        self.options = options
        self._templates = dict(descriptors or {})
        self._binaries: dict = {}
        self._ptr_positions: tuple | None = None
        self._tensor_maps: dict = {}
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

    def __call__(self, grid, *args) -> None:
        """``grid``: a 3-tuple of ints."""
        if self._tail is None:
            self.fn[grid](*self._with_descriptors(args), **self.constexprs, **self.options)
            return
        pos = self._ptr_positions
        if pos is None:
            pos = self._ptr_positions = tuple(i for i, a in enumerate(args)
                                              if isinstance(a, torch.Tensor) and i not in self._templates)
        # Pointers go to the binary as integers: Triton's launcher then neither calls data_ptr() nor asks the
        # driver what each pointer is (a driver call per pointer, the bulk of a launch's host time). The
        # plan's signature fixed every tensor's device.
        flat = list(args)
        key = 0
        for bit, i in enumerate(pos):
            ptr = flat[i] = args[i].data_ptr()
            if ptr & 15:
                key |= 1 << bit
        entry = self._binaries.get(key)
        if entry is None:
            if len(grid) != 3:
                raise ValueError(f"{self.fn.__name__}: a KernelLauncher grid has 3 dimensions, got {grid}")
            binary = self.fn[grid](*self._with_descriptors(args), **self.constexprs, **self.options)
            self._binaries[key] = (binary, binary.function, binary.packed_metadata, _raw_launch(binary.run))
            return
        binary, function, metadata, (raw, positions, metas, head) = entry
        hooks = knobs.runtime
        if hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls:  # a profiler's hooks: their metadata
            binary[grid](*self._with_descriptors(args), *self._tail)
            return
        if self._templates and not positions:
            flat = self._with_descriptors(flat)
        stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        if positions:
            flat = self._expand_descriptors(flat, positions, metas)
        if head is None:  # a launcher of another shape: through its own call
            binary.run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None, *flat, *self._tail)
            return
        raw(grid[0], grid[1], grid[2], stream, function, *head, metadata, None, None, None, *flat, *self._tail)

    def _with_descriptors(self, args) -> list:
        """``args`` with the template descriptors rebased on the tensors given at their positions."""
        if not self._templates:
            return args
        out = list(args)
        for i, template in self._templates.items():
            if isinstance(out[i], torch.Tensor):
                out[i] = rebased(template, out[i])
        return out

    def _expand_descriptors(self, args, positions, metas) -> list:
        """The kernel arguments with each host TMA descriptor (or a template's base tensor) replaced by its
        encoded tensor map, shape and strides (what Triton's launcher passes), the encoding kept per
        (argument, base pointer): a descriptor's shape and strides are the plan's."""
        out, prev = [], 0
        maps = self._tensor_maps
        for pos, meta in zip(positions, metas):
            out.extend(args[prev:pos])
            desc = args[pos]
            base = desc if isinstance(desc, torch.Tensor) else desc.base
            k = (pos, base.data_ptr())
            enc = maps.get(k)
            if enc is None:
                if len(maps) > 256:
                    maps.clear()
                if base is desc:
                    desc = rebased(self._templates[pos], base)
                enc = maps[k] = tuple(_make_tensordesc_arg(desc, meta))
            out.extend(enc)
            prev = pos + 1
        out.extend(args[prev:])
        return out


def rebased(desc, base):
    """A copy of a host TMA descriptor over ``base`` (same shape and strides; a launch reads only the base's
    pointer and dtype), without re-running its checks."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


def _raw_launch(launcher):
    """``(raw launch, descriptor positions, their metadata, head)`` for triton's 3.6-style CUDA launcher (a
    Python ``__call__`` that allocates no scratch here, around the compiled C launch, itself wrapped where
    the kernel takes host TMA descriptors to re-encode every descriptor on every launch): the C launch
    called directly with ``head = (cooperative, pdl, None, None)``, descriptor encodings kept by the
    launcher. ``head`` is None where the launcher has another shape (the launch then goes through it)."""
    other = (None, (), (), None)
    params = list(inspect.signature(type(launcher).__call__).parameters)
    if params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
        return other
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return other
    inner = getattr(launcher, "launch", None)
    if inner is None:
        return other
    head = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None)
    code = getattr(inner, "__code__", None)
    if code is None:  # the compiled launch itself: no descriptors
        return inner, (), (), head
    if inner.__closure__ is None or _make_tensordesc_arg is None:
        return other
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__)))
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
        return other
    positions = tuple(sorted(cells["tensordesc_indices"]))
    metas = cells["tensordesc_meta"]
    if not metas or len(metas) != len(positions) or any(m is None for m in metas):
        return other  # descriptors the launcher decomposes with their tensor: its own path
    return cells["launcher"], positions, tuple(metas), head


try:
    from triton.backends.nvidia.driver import make_tensordesc_arg as _make_tensordesc_arg
except ImportError:  # pragma: no cover - other triton versions keep the launcher's own path
    _make_tensordesc_arg = None


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
        """The plan of ``key`` (built by ``build(*args, **kwargs)`` on a miss). ``TypeError`` for an
        unhashable key. A plan decides kernel or reference (:func:`uses_kernel`) when it is built, so whether
        Triton's interpreter is on is part of the key: a plan built under it never runs the interpreter after
        ``TRITON_INTERPRET`` is unset, nor the other way round."""
        key = (key, interpreting())
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
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors])


def scalars(*values) -> tuple:
    """Scalar options as plan-cache keys: by type and value (``True``, ``1`` and ``1.0`` are equal dict keys,
    but only some of them are valid options)."""
    return tuple([(type(v), v) for v in values])


def capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing()


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
        if torch._C._cuda_isCurrentStreamCapturing():
            return self._make()
        sid = torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch._C._cuda_getDevice())
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


_ZEROED: dict = {}
_OLD_ZEROED: list = []


def _zeroed(device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    key = (device if device.type != "cuda" else torch.device("cuda", device.index if device.index is not None
                                                             else torch.cuda.current_device()), dtype)
    buf = _ZEROED.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    size = max(4096, 1 << max(0, n - 1).bit_length())
    fresh = torch.zeros(size, dtype=dtype, device=device)
    if capturing(device):
        return fresh
    if buf is not None:
        _OLD_ZEROED.append(buf)  # a captured graph may still use it
    _ZEROED[key] = fresh
    return fresh


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """The device's arrival counters (int32, all 0 between launches: every kernel that uses them leaves them at 0;
    kernels on one stream use them in turn), at least ``n``. Allocated zeroed outside
    CUDA-graph capture and never freed (captured graphs hold the address). First needed, or needed larger,
    inside a capture: a fresh zeroed buffer the graph re-zeroes at every replay (a memset node), not cached."""
    return _zeroed(device, n, torch.int32)


def zeroed_workspace(device: torch.device, n: int) -> torch.Tensor:
    """The device's fp32 sum workspace, at least ``n`` elements, all 0 between launches: a kernel that adds partial
    sums into it has the reader of each sum (the last program to arrive) store 0 back. Allocated, cached and
    replaced as :func:`arrival_counters`; the same rule: kernels on one stream use it in turn."""
    return _zeroed(device, n, torch.float32)
