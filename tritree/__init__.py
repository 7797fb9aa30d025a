"""tritree: Triton kernels for tree speculative decoding on MLA models (Kimi K2.6 + DFlash + DDTree).

Conventions shared by every op
------------------------------
- One layer's latent KV pool ``kv: [num_pages, P, 576]`` (512 latent ``c_kv`` then 64 rope ``k_pe``),
  bf16, fp16 or fp32; page size ``P`` a power of two from 1 (token-granular) to 128.
- ``page_table: [B, max_pages] int32``: logical position ``s`` of request ``b`` lives at
  ``kv[page_table[b, s // P], s % P]``.
- ``kv_lens: [B] int32``: tokens committed before the tree. The tree tokens' own KV is already written
  at logical positions ``kv_lens[b] + i``, i = 0..T-1, in node order.
- A tree: ``parents: [B, T] int32`` with ``parents[:, 0] = -1`` (root) and ``parents[b, i] < i``
  (parents first); ``tree_lens: [B]`` valid nodes per request (rows beyond are padding).
- ``tree_mask: [B, T, ceil(T/32)] int32``: bit ``j % 32`` of word ``j // 32`` of row ``i`` is set iff
  node ``j`` is node ``i`` or one of its ancestors (:func:`tree_mask_from_parents`).
- Ops that update large buffers in place end in ``_`` and return them. Every op validates its inputs
  (``TypeError``/``ValueError`` naming the argument); checks that need tensor values on the host run
  for CPU inputs always and for GPU inputs with ``TRITREE_DEBUG=1`` (without them a bad value gives an
  undefined result, never an access outside the tensors).
- Tensors may be views (offsets, padded rows, reordered leading dims): every op reads and writes each
  tensor through its own strides; the last dimension must be contiguous except where an op says
  otherwise (the README's stride table). Returned tensors are new and contiguous.
- Every kernel has a plain PyTorch reference (``*_reference``), the specification the tests compare
  against in float64. Launch configs come from per-architecture tables (``tritree.kernels.configs``;
  ``TRITREE_ARCH`` forces one).
"""

from .kernels import *  # noqa: F401,F403  (the public ops; their list lives in tritree.kernels)
from .kernels import __all__ as _kernel_ops

__version__ = "0.1.0"
__all__ = list(_kernel_ops)
