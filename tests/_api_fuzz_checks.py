"""The API fuzzer's checks of the samples of ``tests/_api_samples.py``, and the subprocess that runs them.

Valid calls run with every tensor placed as a view of a larger, poisoned buffer (an offset, padded rows,
padded dimensions in another storage order, a column slice; a strided last dimension where the op reads
it by stride): the outputs must match the reference and nothing outside the outputs may change.

Run as ``python -m tests._api_fuzz_checks MODE OP:EXAMPLES[,OP:EXAMPLES...] SEED`` (MODE: ``valid``, ``invalid``,
``invalid_structure`` (no bad values: GPU inputs without value checks) or ``unchecked`` (bad values run
unchecked; nothing may be written outside the outputs)): the fuzzer runs the ops in a subprocess, so
that an out-of-bounds write that kills the process is a failed test, not a dead test run.
"""

from __future__ import annotations

import random
import sys
import time

import torch
from hypothesis import strategies as st

from ._api_samples import SAMPLES, Sample, close

# ------------------------------------------------------------------------------------------------
# Layouts: a tensor's values in a view of a bigger buffer
# ------------------------------------------------------------------------------------------------

LAYOUTS = ("contiguous", "offset", "padded", "reordered", "strided_last")


def poison_of(dtype):
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def place(x: torch.Tensor, layout: str, rng: random.Random, lead: int | None = None, strided_last: bool = False):
    """``(view, base)``: ``view`` equals ``x``, laid out by ``layout`` inside the flat buffer ``base``
    (filled with poison elsewhere). Dimensions ``>= lead`` stay one contiguous run."""
    nd = x.dim()
    lead = nd if lead is None else lead
    shape = list(x.shape)
    pads = [0] * nd
    order = list(range(lead))
    if layout in ("padded", "reordered"):
        pads = [rng.randint(0, 3) if d < lead else 0 for d in range(nd)]
    if layout == "reordered" and lead > 1:
        outer = order[:-1] if lead == nd else order  # the last dimension stays innermost
        rng.shuffle(outer)
        order = outer + order[len(outer):]
    step = rng.randint(2, 3) if layout == "strided_last" and strided_last and nd and lead == nd else 1
    strides = [0] * nd
    run = step
    for d in range(nd - 1, lead - 1, -1):  # the packed trailing block
        strides[d] = run
        run *= shape[d]
    for d in reversed(order):
        strides[d] = run if d < nd - 1 or step == 1 else step
        run = strides[d] * (shape[d] + pads[d])
    offset = (rng.randint(1, 5) if layout != "contiguous" else 0) + sum(rng.randint(0, p) * s for p, s in
                                                                          zip(pads, strides))
    size = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1 + (3 if layout != "contiguous" else 0)
    if any(n == 0 for n in shape):
        size = offset + 4
    base = torch.full((max(size, 1),), poison_of(x.dtype), dtype=x.dtype, device=x.device)
    view = base.as_strided(shape, strides, offset)
    view.copy_(x)
    return view, base


def inside_mask(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    m = torch.zeros(base.shape, dtype=torch.bool, device=base.device)
    m.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    return m


def bits(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x).view(torch.uint8)


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------

def place_all(sample: Sample, tensors: dict, rng: random.Random):
    """Every tensor of ``tensors`` placed by a random layout the op accepts: ``(views, bases)``."""
    placed, bases = {}, {}
    for name, x in tensors.items():
        if x is None:
            placed[name] = None
            continue
        layouts = (LAYOUTS[:2] if name in sample.contiguous else LAYOUTS if name in sample.strided_last
                   else LAYOUTS[:-1])
        view, base = place(x, rng.choice(layouts), rng, sample.lead.get(name), name in sample.strided_last)
        placed[name], bases[name] = view, base
    return placed, bases


def assert_written_inside(placed: dict, bases: dict, before: dict) -> None:
    """Every byte of every buffer outside its tensor's view as it was."""
    if any(b.is_cuda for b in bases.values()):
        torch.cuda.synchronize()
    for name, base in bases.items():
        outside = ~inside_mask(placed[name], base).repeat_interleave(base.element_size())
        assert torch.equal(bits(base)[outside], before[name][outside]), f"{name}: written outside its view"


def check_valid_views(sample: Sample, rng: random.Random) -> None:
    """The op on views of poisoned buffers equals its reference on contiguous copies; nothing outside
    the written tensors' views changes."""
    placed, bases = place_all(sample, sample.tensors, rng)
    before = {n: bits(b).clone() for n, b in bases.items()}
    got = sample.run(placed)
    ref_t = {n: (None if x is None else x.clone()) for n, x in sample.tensors.items()}
    want = sample.reference(ref_t)
    sample.check(got, want)
    assert_written_inside(placed, bases, before)
    for name in bases:
        view = placed[name]
        if name in sample.written:
            if sample.check_written is not None:
                sample.check_written(view, ref_t[name])
            elif view.is_floating_point() and name != "kv":
                close(view, ref_t[name], view.dtype, name)
            else:  # the KV ops move entries: bit for bit
                assert torch.equal(bits(view), bits(ref_t[name])), f"{name}: differs from the reference"
        else:
            assert torch.equal(bits(view), bits(sample.tensors[name])), f"{name}: an input was modified"


def expect_refusal(fn, names: set[str], what: str) -> None:
    try:
        fn()
    except (TypeError, ValueError) as e:
        msg = str(e)
        assert any(n in msg for n in names), f"{what}: {type(e).__name__} names none of {sorted(names)}: {msg}"
        return
    raise AssertionError(f"{what}: accepted (expected a ValueError/TypeError naming one of {sorted(names)})")


def _other_dtype(x: torch.Tensor):
    return torch.int32 if x.is_floating_point() else torch.float32


def check_unchecked_values(sample: Sample, rng: random.Random) -> None:
    """Each bad value run without value checks (GPU inputs without ``TRITREE_DEBUG=1``): any result,
    but no byte outside the written tensors' views changes and the inputs stay as they were."""
    for k, breaks in sample.values.items():
        placed, bases = place_all(sample, breaks(dict(sample.tensors)), rng)
        before = {n: bits(b).clone() for n, b in bases.items()}
        try:
            sample.run(placed)
        except ValueError:  # host-side ops check their values always
            pass
        assert_written_inside(placed, bases, before)
        for name in bases:
            if name not in sample.written:
                inside = inside_mask(placed[name], bases[name]).repeat_interleave(bases[name].element_size())
                assert torch.equal(bits(bases[name])[inside], before[name][inside]), f"{name}: an input changed"


def check_invalid(sample: Sample, rng: random.Random, values: bool = True) -> None:
    """Every invalid scalar (and, with ``values``, every bad value) of ``sample``, and each structural
    mutation (dtype, rank, size, type, last-dimension stride, device) of a random argument: the op must
    raise a ValueError/TypeError that names the argument (or, for a dimension shared with other
    arguments, one of them)."""
    for k, bad_values in sample.scalars.items():
        for v in bad_values:
            expect_refusal(lambda: sample.run_scalar(dict(sample.tensors), k, v), {k}, f"{k}={v!r}")
    for k, breaks in sample.values.items() if values else ():
        bad = breaks(dict(sample.tensors))
        expect_refusal(lambda: sample.run(bad), {k}, f"a bad value of {k}")
    present = [n for n, x in sample.tensors.items() if x is not None]
    for mutation in ("dtype", "rank", "size", "type", "last_stride", "device"):
        t = dict(sample.tensors)
        name = rng.choice(present)
        x = t[name]
        blame = {name}
        if mutation == "dtype":  # a dtype valid alone may break agreement with another argument's
            if name in sample.any_dtype:
                continue
            t[name] = x.to(_other_dtype(x))
            blame = {o for o in present if sample.tensors[o].dtype == x.dtype}
        elif mutation == "rank":
            if name in sample.lead:  # a pool of any per-token rank: one more dim may be another valid pool
                continue
            t[name] = x.unsqueeze(0)
        elif mutation == "type":
            t[name] = x.tolist()
        elif mutation == "device":
            if name == present[0]:
                continue
            t[name] = torch.empty(x.shape, dtype=x.dtype, device="meta")
        elif mutation == "last_stride":
            if name in sample.strided_last or x.dim() == 0 or x.shape[-1] < 2:
                continue
            t[name] = place(x, "strided_last", rng, None, True)[0]
        elif mutation == "size":
            dims = sample.dims[name]
            choices = [d for d, sym in enumerate(dims[:x.dim()]) if isinstance(sym, int) or sum(
                sym in sample.dims[o] for o in present) > 1]
            if not choices:
                continue
            d = rng.choice(choices)
            pad = torch.zeros((*x.shape[:d], 1, *x.shape[d + 1:]), dtype=x.dtype, device=x.device)
            if x.shape[d]:
                pad = x.narrow(d, 0, 1)
            t[name] = torch.cat([x, pad], dim=d)
            if not isinstance(dims[d], int):
                blame = {o for o in present if dims[d] in sample.dims[o]}
        expect_refusal(lambda: sample.run(t), blame, f"{mutation} of {name}")


# ------------------------------------------------------------------------------------------------
# Entry point of the subprocess
# ------------------------------------------------------------------------------------------------

def fuzz(mode: str, op: str, examples: int, at: int, device) -> None:
    """``examples`` hypothesis examples of ``op`` in ``mode`` (see the module docstring)."""
    from hypothesis import HealthCheck, given, seed, settings

    sample_fn = SAMPLES[op]
    run = settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                   suppress_health_check=list(HealthCheck))

    @seed(at)
    @run
    @given(st.data())
    def valid(data):
        check_valid_views(sample_fn(data.draw, device), random.Random(data.draw(st.integers(0, 2**30))))

    @seed(at)
    @run
    @given(st.data())
    def invalid(data):
        sample = sample_fn(data.draw, device)
        rng = random.Random(data.draw(st.integers(0, 2**30)))
        if mode == "unchecked":
            check_unchecked_values(sample, rng)
        else:
            check_invalid(sample, rng, values=mode == "invalid")

    (valid if mode == "valid" else invalid)()


def main(argv):
    """``MODE OP:EXAMPLES[,OP:EXAMPLES...] SEED``."""
    mode, ops, at = argv[0], argv[1], int(argv[2])
    if mode not in ("valid", "invalid", "invalid_structure", "unchecked"):
        raise SystemExit(f"unknown mode {mode!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if mode == "unchecked" and device.type == "cpu":  # the kernels in the interpreter as a GPU runs them: unchecked
        from tritree.kernels import _validate

        _validate.checks_values = lambda device: False
        _validate.values_checkable = lambda *tensors: False
    for item in ops.split(","):
        op, n = item.split(":")
        print(f"{mode} {op}: {n} examples, seed {at}", flush=True)
        start = time.perf_counter()
        fuzz(mode, op, int(n), at, device)
        print(f"{mode} {op}: passed in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
