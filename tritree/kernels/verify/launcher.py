"""The verify launcher: :class:`VerifyPlan` (one static signature validated, its launch decided by
``policy.plan_launch``, its kernel bound and launched through ``KernelLauncher``), the plan cache behind
:func:`verify_mla`, and the one ``torch.library`` op (``tritree::verify_mla``) that torch.compile sees.

Every launch of a verify kernel goes through a plan: the library call, torch.compile's op (which runs the
eager plan inside), the tests and the benchmarks (``config`` picks the kernel; ``timeline`` the bench stamps).
The plan owns the plain Gluon kernel's fallback from the 3-D TMA descriptor to 9 boxes a tile.
"""

from __future__ import annotations

import warnings

import torch

from .. import _validate as V
from .._launch import (
    KernelLauncher,
    PlanCache,
    StreamScratch,
    eager,
    full_lengths,
    interpreting,
    rebased,
    scalars,
    signature,
    uses_kernel,
)
from .._splitkv import MergePlan, pdl_capable
from ..configs import AttnConfig, num_sms
from . import abi
from . import gluon_launch as GL
from .abi import D_ROPE, GLUON_KERNELS
from .policy import launch_of
from .reference import KV_FP8, _check_values, _validate, verify_mla_reference
from .triton_kernel import _verify_mla_kernel, ensure_scratch_allocator, launch_config

# Set once a driver refused the plain Gluon kernel's 3-D descriptor: plans made from then on copy 9 boxes a tile
# (a plan made before tries the 3-D box on its first call and re-plans itself if refused).
_TMA3D_REFUSED = False


class VerifyPlan:
    """:func:`verify_mla` for one static signature: validated, its launch decided, its kernels bound.

    ``VerifyPlan(q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, sm_scale, out=None, lse=None,
    config=None, num_splits=None, d_rope=64, kv_scale=None, timeline=0)`` takes example inputs (their values
    are not read); ``plan.run(q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, out=None, lse=None,
    return_lse=False)`` then runs inputs of the same shapes, strides, dtypes and device (a ``ValueError``
    otherwise) with the per-call work only: value checks where they apply, buffers, launches.
    ``plan.launch`` says what runs (``policy.plan_launch``; ``config`` with an explicit ``kernel`` picks it
    where that kernel serves the call). ``out``/``lse`` given at planning fix the layout of the outputs ``run``
    may be given; without them ``run`` takes contiguous ones.

    ``timeline`` (bench only; a Hopper Gluon route with several splits; wrong lse): the kernel's ``TIMELINE``
    stamps over each program's first lse partial slots (``bench/timeline.py``), read from what
    :meth:`split_kernel` returns.

    Split partials are the plan's own, one set per CUDA stream, reused by eager calls; a call captured in a
    CUDA graph gets its own set, which the graph's memory pool keeps. Calls through one plan on one stream
    are ordered as launched. :func:`verify_mla` keeps plans in a cache (``plan_cache_info()``).
    """

    def __init__(self, q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, sm_scale, out=None, lse=None,
                 config: AttnConfig | None = None, num_splits: int | None = None, d_rope: int = D_ROPE,
                 kv_scale: float | None = None, timeline: int = 0):
        _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope, kv_scale, out, lse)
        B, T, H, D = q.shape
        self.shape = (B, T, H, D)
        self.d_lat, self.d_rope = D - d_rope, d_rope
        self.sm_scale = float(sm_scale)
        self.kv_scale = kv_scale
        self.device = q.device
        self.dtype = q.dtype
        self.timeline = int(timeline)
        self.launch = launch_of(q, kv, page_table, config, num_splits)
        self.signature = _key(q, kv, page_table, kv_lens, tree_mask, tree_lens)
        self._out_sig = None if out is None else (out.shape, out.stride())
        self._lse_sig = None if lse is None else (lse.shape, lse.stride())
        out_strides = out.stride() if out is not None else _contiguous_strides((B, T, H, self.d_lat))
        lse_strides = lse.stride() if lse is not None else (T * H, H, 1)
        S = self.launch.num_splits
        M = T * H
        self._merge = None
        if S > 1:
            self._merge = MergePlan(B, S, M, self.d_lat, H, self.launch.partials_dtype, out_strides, lse_strides,
                                    q.device)
            o_strides = (S * M * self.d_lat, 0, self.d_lat, M * self.d_lat)
            l_strides = (S * M, 0, 1, M)
        else:
            o_strides = (*out_strides[:3], 0)
            l_strides = (*lse_strides[:3], 0)
        # (split partials: out, lse; the lse when the caller wants none), one set per stream
        self._scratch = StreamScratch(lambda: (
            torch.empty(B, S, M, self.d_lat, dtype=self.launch.partials_dtype, device=q.device) if S > 1 else None,
            torch.empty(B, S, M, dtype=torch.float32, device=q.device) if S > 1 else None,
            torch.empty(B, T, H, dtype=torch.float32, device=q.device)))
        self._o_strides, self._l_strides = o_strides, l_strides
        route = self.launch.route
        if route == "triton":
            if self.launch.tma and not interpreting():
                ensure_scratch_allocator()
            grid, constexprs, options = launch_config(
                self.launch.config, num_splits=S, tma=self.launch.tma, batch=B, T=T, H=H, d_lat=self.d_lat,
                d_pe=d_rope, q_dtype=q.dtype, kv_dtype=kv.dtype, page_size=kv.shape[1])
            self._grid = grid
            self._split = KernelLauncher(_verify_mla_kernel, constexprs, **options)
            self._scalar_args = abi.scalar_args("triton", q, kv, page_table, tree_mask, o_strides, l_strides,
                                                sm_scale=self.sm_scale, kv_scale=kv_scale, num_splits=S)
        elif route in GLUON_KERNELS:
            self._plan_gluon(q, kv, page_table, tree_mask)

    def _plan_gluon(self, q, kv, page_table, tree_mask):
        B, T, H, _ = self.shape
        g = GL.plan_verify_gluon(kernel=self.launch.route, batch=B, T=T, H=H, page_size=kv.shape[1],
                                 num_splits=self.launch.num_splits, num_sms=num_sms(q.device),
                                 pdl_capable=pdl_capable(q.device), partials_dtype=self.launch.partials_dtype,
                                 timeline=self.timeline, tma3d=not _TMA3D_REFUSED)
        self._gluon = g
        self._grid = g.grid
        self._scalar_args = abi.scalar_args(g.kernel, q, kv, page_table, tree_mask, self._o_strides, self._l_strides,
                                            sm_scale=self.sm_scale, kv_scale=self.kv_scale, num_splits=g.num_splits,
                                            narrow_splits=g.narrow_splits)
        # Descriptor templates: their shapes and strides are the plan's; each call gives them its pool (and
        # partials) as base, which is all a launch reads of a descriptor's tensor.
        example = torch.empty(B, g.num_splits, T * H, self.d_lat, dtype=self.launch.partials_dtype,
                              device=q.device) if g.partials_desc else None
        templates = [rebased(d, None) for d in GL.descriptors_for(g, kv, example)]  # hold no pool
        self._desc_partials = 3 if g.partials_desc else -1
        self._n_desc = len(templates)
        self._split = KernelLauncher(g.fn, dict(g.constexprs), descriptors=dict(enumerate(templates, start=2)),
                                     **g.options())
        self._gluon_ok = False

    # -- per call ------------------------------------------------------------------------------------

    def run(self, q, kv, page_table, kv_lens, tree_mask, tree_lens=None, *, out=None, lse=None,
            return_lse: bool = False):
        """Runs the plan on inputs of its signature; see :func:`verify_mla` for the semantics."""
        self._check_signature(q, kv, page_table, kv_lens, tree_mask, tree_lens)
        if out is not None and (out.shape, out.stride()) != (self._out_sig or (out.shape, _contiguous_strides(
                out.shape))) or out is not None and (out.dtype != self.dtype or out.device != self.device):
            raise ValueError("out must have the layout, dtype and device the plan was made for")
        if lse is not None and ((lse.shape, lse.stride()) != (self._lse_sig or (lse.shape, _contiguous_strides(
                lse.shape))) or lse.dtype != torch.float32 or lse.device != self.device):
            raise ValueError("lse must have the layout, dtype and device the plan was made for")
        return self._run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse)

    def split_kernel(self, q, kv, page_table, kv_lens, tree_mask, tree_lens=None):
        """The split kernel alone, without the merge (benchmarks and tests: its time; its partials, the
        ``timeline`` stamps): returns what it wrote, ``(partial out, partial lse)`` (this stream's set; a fresh one
        in a graph capture) with several splits, else a fresh ``(out, lse)``. Not for the reference route."""
        self._check_signature(q, kv, page_table, kv_lens, tree_mask, tree_lens)
        if self.launch.route == "reference":
            raise ValueError("a reference plan launches no kernel")
        B, T, H, _ = self.shape
        if self.launch.num_splits > 1:
            dst_o, dst_l, _ = self._scratch.get(self.device)
        else:
            dst_o = torch.empty(B, T, H, self.d_lat, dtype=self.dtype, device=self.device)
            dst_l = torch.empty(B, T, H, dtype=torch.float32, device=self.device)
        if tree_lens is None:
            tree_lens = full_lengths(B, T, self.device)
        self._launch_split(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l)
        return dst_o, dst_l

    def _check_signature(self, q, kv, page_table, kv_lens, tree_mask, tree_lens):
        if _key(q, kv, page_table, kv_lens, tree_mask, tree_lens) != self.signature:
            raise ValueError("the inputs do not match this plan's shapes, strides, dtypes and device "
                             "(or tree_lens given / not given as at planning)")

    def _run(self, q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse):
        B, T, H, _ = self.shape
        if V.checks_values(self.device):
            _check_values(kv, page_table, kv_lens, tree_lens, T)
        if out is None:
            out = torch.empty(B, T, H, self.d_lat, dtype=self.dtype, device=self.device)
        part_o, part_l, lse_scratch = self._scratch.get(self.device)
        if lse is None:
            lse = torch.empty(B, T, H, dtype=torch.float32, device=self.device) if return_lse else lse_scratch
        if self.launch.route == "reference":
            ref_out, ref_lse = verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, sm_scale=self.sm_scale,
                                                    tree_lens=tree_lens, return_lse=True, d_rope=self.d_rope,
                                                    kv_scale=self.kv_scale)
            out.copy_(ref_out)
            lse.copy_(ref_lse)
            return (out, lse) if return_lse else out
        if tree_lens is None:
            tree_lens = full_lengths(B, T, self.device)
        S = self.launch.num_splits
        dst_o, dst_l = (part_o, part_l) if S > 1 else (out, lse)
        self._launch_split(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l)
        if S > 1:
            self._merge.run(dst_o, dst_l, out, lse)
        return (out, lse) if return_lse else out

    def _launch_split(self, q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l):
        if self.launch.route == "triton":
            self._split(self._grid, q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l,
                        *self._scalar_args)
            return
        global _TMA3D_REFUSED
        descs = (kv,) * self._n_desc if self._desc_partials < 0 else (kv, kv, kv, dst_o)  # the templates' bases
        args = (q, kv, *descs, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l, *self._scalar_args)
        if self._gluon_ok or not self._gluon.tma3d:
            self._split(self._grid, *args)
            return
        try:  # the plain kernel's 3-D latent box: a driver may refuse its descriptor
            self._split(self._grid, *args)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"3-D TMA descriptor refused ({type(e).__name__}: {e}); using 9 boxes per tile")
            _TMA3D_REFUSED = True
            self._plan_gluon(q, kv, page_table, tree_mask)
            self._launch_split(q, kv, page_table, kv_lens, tree_mask, tree_lens, dst_o, dst_l)
        self._gluon_ok = True


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _key(q, kv, page_table, kv_lens, tree_mask, tree_lens) -> tuple:
    """A plan's static signature of its inputs: their layouts, and q's and the pool's 16-byte alignment
    (the Gluon kernels need it)."""
    return (signature(q, kv, page_table, kv_lens, tree_mask, tree_lens), q.data_ptr() & 15, kv.data_ptr() & 15)


def _plan_build(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
                kv_scale) -> VerifyPlan:
    return VerifyPlan(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale=sm_scale, out=out, lse=lse,
                      config=config, num_splits=num_splits, d_rope=d_rope, kv_scale=kv_scale)


_PLANS = PlanCache("verify_mla", _plan_build)


def _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
          kv_scale) -> VerifyPlan:
    try:
        key = (_key(q, kv, page_table, kv_lens, tree_mask, tree_lens),
               None if out is None else (out.shape, out.stride(), out.dtype, out.device),
               None if lse is None else (lse.shape, lse.stride(), lse.dtype, lse.device),
               scalars(sm_scale, config, num_splits, d_rope, kv_scale))
        return _PLANS.get(key, q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config,
                          num_splits, d_rope, kv_scale)
    except (AttributeError, TypeError):  # not tensors / unhashable scalars: validation says what is wrong
        return _plan_build(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config,
                           num_splits, d_rope, kv_scale)


def verify_mla(q, kv, page_table, kv_lens, tree_mask, *, sm_scale, tree_lens=None, return_lse=False,
               out=None, lse=None, config: AttnConfig | None = None, num_splits: int | None = None,
               d_rope: int = D_ROPE, kv_scale: float | None = None):
    """Tree-masked MLA verify attention over a paged latent KV cache (absorbed form, one KV head).

    Args:
        q: ``[B, T, H, 576]`` absorbed queries (512 latent ++ 64 rope), bf16 / fp16 / fp32.
        kv: ``[num_pages, P, 576]`` one layer's latent pool, q's dtype or ``torch.float8_e4m3fn`` (with
            ``kv_scale``); P a power of two in [1, 128].
        page_table: ``[B, max_pages]`` int32; position s of request b is ``kv[page_table[b, s // P], s % P]``.
        kv_lens: ``[B]`` int32 committed tokens before the tree. The tree's own KV is already written
            at positions ``kv_lens[b] + i``, i = 0..T-1, in node order.
        tree_mask: ``[B, T, ceil(T/32)]`` int32 ancestor bits (:func:`tree_mask_from_parents`).
        sm_scale: softmax scale (Kimi K2.x: ``192**-0.5 * mscale**2``, not ``576**-0.5``).
        tree_lens: ``[B]`` int32 valid nodes per request; rows ``i >= tree_lens[b]`` are padding.
        return_lse: also return ``lse: [B, T, H]`` float32 natural-log log-sum-exp of the scores.
        out, lse: optional preallocated outputs (``[B, T, H, 512]`` q's dtype, ``[B, T, H]`` float32),
            written in place (static buffers for CUDA graphs); either may be given alone.
        config, num_splits: override the per-architecture launch config and the split count
            (``policy.plan_launch`` says what runs otherwise). ``AttnConfig(..., kernel="triton")`` forces Triton.
        d_rope: rope channels at the end of q and kv (Kimi: 64, latent 512); small models use other
            powers of two >= 16.
        kv_scale: for a ``float8_e4m3fn`` pool, its per-tensor dequantisation scale (keys and values
            are ``kv * kv_scale``; default 1.0); must be None for other pools. fp8 pools run the
            Triton kernel (tiles converted to q's dtype in registers; the scale folded into the score
            scale and applied to O once), also on Hopper; on sm_120, with bf16 queries, the Gluon
            ``mma.sync`` kernel (fragments widened to bf16, the scale applied the same way). Rows enter
            such a pool quantised with the same scale:
            ``kv_write_(kv, ..., (latent / kv_scale).to(torch.float8_e4m3fn))``.

    Returns:
        ``out: [B, T, H, 512]`` in q's dtype (and ``lse``). Row (b, i, h) attends to all ``kv_lens[b]``
        committed tokens and to tree nodes ``j < tree_lens[b]`` whose bit is set in
        ``tree_mask[b, i]``; softmax in fp32. Padding rows are zeros (lse ``-inf``).

    Checks: shapes, dtypes, devices and strides always; lengths against the page table's capacity and
    page ids in use against the pool when the inputs are on the CPU or ``TRITREE_DEBUG=1`` (these need
    the values on the host). Without them, out-of-range page ids are clamped into the pool in the kernel
    (no fault, wrong rows). Eager calls run a :class:`VerifyPlan` cached per static signature (no host
    sync); CUDA-graph capturable; under torch.compile the op ``tritree::verify_mla`` (opaque; it runs the same
    plan).
    """
    if not eager():
        return _verify_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, return_lse, out, lse,
                              config, num_splits, d_rope, kv_scale)
    plan = _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits, d_rope,
                 kv_scale)
    return plan._run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, return_lse)


# --------------------------------------------------------------------------------------------------
# torch.compile: one opaque op that runs the eager plan
# --------------------------------------------------------------------------------------------------

@torch.library.custom_op("tritree::verify_mla", mutates_args=("out", "lse"))
def _verify_mla_op(q: torch.Tensor, kv: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
                   tree_mask: torch.Tensor, tree_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   sm_scale: float, d_rope: int, kv_scale: float, block_m: int, block_n: int, num_warps: int,
                   num_stages: int, programs_per_sm: int, tma: bool, hoist_pages: bool, split_scores: bool,
                   kernel: str, num_splits: int) -> None:
    """:func:`verify_mla` under torch.compile, writing ``out``/``lse`` in place: opaque (torch.compile cannot
    trace the Gluon launches, and the plan reads data pointers), it runs the eager plan, which decides the launch
    as an eager call would. ``block_m == 0``: no config given; ``num_splits == 0``: none given; ``kv_scale``:
    an fp8 pool's (ignored for others)."""
    config = None if block_m == 0 else AttnConfig(block_m, block_n, num_warps, num_stages, programs_per_sm,
                                                  tma=tma, hoist_pages=hoist_pages, split_scores=split_scores,
                                                  kernel=kernel)
    _plan(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, config, num_splits or None, d_rope,
          kv_scale if kv.dtype == KV_FP8 else None).run(q, kv, page_table, kv_lens, tree_mask, tree_lens, out=out,
                                                          lse=lse)


@_verify_mla_op.register_fake
def _(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, sm_scale, d_rope, kv_scale, block_m, block_n,
      num_warps, num_stages, programs_per_sm, tma, hoist_pages, split_scores, kernel, num_splits):
    return None


def _verify_traced(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, return_lse, out, lse, config,
                   num_splits, d_rope, kv_scale):
    """verify_mla under torch.compile: the reference where no kernel runs, else the op (static shapes only)."""
    _validate(q, kv, page_table, kv_lens, tree_mask, tree_lens, sm_scale, d_rope, kv_scale, out, lse)
    B, T, H, D = q.shape
    if tree_lens is None:
        tree_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    if not uses_kernel(q.device):
        return verify_mla_reference(q, kv, page_table, kv_lens, tree_mask, sm_scale=sm_scale, tree_lens=tree_lens,
                                    return_lse=return_lse, d_rope=d_rope, kv_scale=kv_scale)
    if out is None:
        out = torch.empty(B, T, H, D - d_rope, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    c = config or AttnConfig(0, 0, 0, 0)
    _verify_mla_op(q, kv, page_table, kv_lens, tree_mask, tree_lens, out, lse, float(sm_scale), d_rope,
                   1.0 if kv_scale is None else float(kv_scale), c.block_m, c.block_n, c.num_warps, c.num_stages,
                   c.programs_per_sm, bool(c.tma), bool(c.hoist_pages), bool(c.split_scores), c.kernel,
                   0 if num_splits is None else int(num_splits))
    return (out, lse) if return_lse else out
