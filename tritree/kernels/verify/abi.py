"""The verify kernels' argument list (ABI): what every kernel of the family takes, in order, and the one builder
of its scalar arguments.

Every kernel (``"triton"``: ``triton_kernel._verify_mla_kernel``; ``"gluon"``: ``gluon_plain``;
``"gluon-ws"``: ``gluon_ws``; ``"gluon-mma"``: ``gluon_mma``) takes, in this order:

* ``Q``, ``KV``; then the kernel's TMA descriptors (``DESCRIPTORS``: the Hopper Gluon kernels only);
* ``PageTable``, ``KvLens``, ``TreeMask``, ``TreeLens``, ``Out``, ``Lse`` (``Out``/``Lse``: the output and
  lse with one split, else the split partials ``[B, S, T*H, 512]`` / ``[B, S, T*H]``);
* the scales (``SCALES``): ``sm_scale_log2e`` (the softmax scale times log2(e), times an fp8 pool's
  ``kv_scale``), and for the kernels that read fp8 pools ``v_scale`` (that ``kv_scale``, applied to O once);
* the integers ``INT_ARGS`` (strides and extents), then the kernel's own (``EXTRA_INT_ARGS``: the ws kernel's
  narrow block split count);
* its constexprs (each kernel's own; the launch plan names them).

:func:`scalar_args` builds the arguments after the tensors and descriptors, for the eager plan, the traced
launch and (by :func:`signature`, their types) the ahead-of-time audit. A test checks every kernel's
signature against :func:`arg_names`.
"""

from __future__ import annotations

from .._splitkv import LOG2E

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE

KERNELS = ("triton", "gluon", "gluon-ws", "gluon-mma")
GLUON_KERNELS = KERNELS[1:]

DESCRIPTORS = {"triton": (), "gluon": ("kv_desc", "kv_desc3"),
               "gluon-ws": ("kv_desc", "kv_desc3", "kv_desc_pages", "out_desc"), "gluon-mma": ()}
TENSORS = ("PageTable", "KvLens", "TreeMask", "TreeLens", "Out", "Lse")
SCALES = {"triton": ("sm_scale_log2e", "v_scale"), "gluon": ("sm_scale_log2e",), "gluon-ws": ("sm_scale_log2e",),
          "gluon-mma": ("sm_scale_log2e", "v_scale")}
INT_ARGS = ("stride_qb", "stride_qt", "stride_qh", "stride_kvp", "stride_kvs", "stride_ptb", "max_pages", "num_pages",
            "stride_mb", "stride_mt", "stride_ob", "stride_ot", "stride_oh", "stride_os", "stride_lb", "stride_lt",
            "stride_lh", "stride_ls", "T", "H", "num_splits")
EXTRA_INT_ARGS = {"triton": (), "gluon": (), "gluon-ws": ("narrow_splits",), "gluon-mma": ()}
# The arguments a launch specialises as 16-byte divisible (pointers and the strides of 16-byte rows), as the
# runtime specialises them for torch's allocations.
DIVISIBLE = ("Q", "KV", "PageTable", "KvLens", "TreeMask", "TreeLens", "Out", "Lse", "stride_qb", "stride_qt",
             "stride_qh", "stride_kvp", "stride_kvs", "stride_ob", "stride_ot", "stride_oh", "stride_os")


def arg_names(kernel: str) -> tuple[str, ...]:
    """The runtime arguments of ``kernel`` in order (its constexprs follow)."""
    return (("Q", "KV") + DESCRIPTORS[kernel] + TENSORS + SCALES[kernel] + INT_ARGS + EXTRA_INT_ARGS[kernel])


def scalar_args(kernel: str, q, kv, page_table, tree_mask, o_strides, l_strides, *, sm_scale: float,
                kv_scale: float | None, num_splits: int, narrow_splits: int | None = None) -> tuple:
    """The arguments of ``kernel`` after its tensors and descriptors: scales, then ``INT_ARGS`` (and the ws
    kernel's ``narrow_splits``). ``o_strides`` / ``l_strides``: the destination's ``(b, t, h, split)`` strides
    (``_splitkv.split_destinations``)."""
    B, T, H, _ = q.shape
    kv_scale = 1.0 if kv_scale is None else float(kv_scale)
    scales = (float(sm_scale) * kv_scale * LOG2E, kv_scale)[:len(SCALES[kernel])]
    ints = (q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(1), page_table.stride(0),
            page_table.shape[1], kv.shape[0], tree_mask.stride(0), tree_mask.stride(1), *o_strides, *l_strides, T, H,
            int(num_splits))
    extra = ()
    if EXTRA_INT_ARGS[kernel]:
        extra = (int(num_splits if narrow_splits is None else narrow_splits),)
    return scales + ints + extra


def signature(kernel: str, *, q: str, kv: str, out: str, descriptors: dict[str, str] | None = None) -> dict:
    """``{argument: type}`` of ``kernel``'s runtime arguments for an ahead-of-time compile: ``q`` / ``kv`` /
    ``out`` element types (``"bf16"``, ``"fp8e4nv"``, ...), ``descriptors`` the descriptor types by name."""
    types = {"Q": "*" + q, "KV": "*" + kv, "Out": "*" + out, "Lse": "*fp32", **(descriptors or {})}
    sig = {}
    for name in arg_names(kernel):
        if name in types:
            sig[name] = types[name]
        elif name in TENSORS:
            sig[name] = "*i32"
        elif name in SCALES[kernel]:
            sig[name] = "fp32"
        elif name in DESCRIPTORS[kernel]:
            raise ValueError(f"the type of descriptor {name!r} is missing")
        else:
            sig[name] = "i32"
    return sig


def divisibility(fn) -> dict:
    """The ``tt.divisibility`` attributes of ``DIVISIBLE`` for the compiled ``fn``."""
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in DIVISIBLE}

