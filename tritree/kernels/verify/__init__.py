"""Tree-masked MLA verify attention over a paged latent KV cache: the kernel family behind ``verify_mla``.

MLA in absorbed form is MQA with a single KV head: key = the cached 576 values (512 latent ++ 64 rope), value =
the first 512 of them. The kernels pack (tree tokens x heads) into the rows of the matrix multiply so each KV
tile, loaded once, serves every head and every tree node as key and as value; the keys are split across
programs (``_splitkv``) so one request fills the GPU. The committed prefix is visible to every node, so the
tree bitmask is read only in the tiles that hold tree keys: a single pass with a masked tail.

The package, one role a module:

* ``abi``: the kernels' argument list (names, order, divisibility) and the one builder of their scalar
  arguments, used by the launcher and the ahead-of-time audit (``kernels.aot``);
* ``policy``: the per-architecture config tables and ``plan_launch``, the one place that decides which kernel
  a call runs (its route), with which tiles, split count and partials;
* ``launcher``: ``VerifyPlan`` (every launch of every verify kernel, the 3-D TMA fallback included), the plan
  cache behind ``verify_mla`` and its one ``torch.library`` op;
* ``gluon_launch``: the Gluon kernels' launch rules (grid, constexprs, options, TMA descriptors);
* ``reference``: the PyTorch specification and the input checks;
* the kernels: ``triton_kernel`` (Triton), ``gluon_plain`` and ``gluon_ws`` (+ ``gluon_ws_producer``) (Hopper
  Gluon schedules), ``gluon_mma`` (sm_120's ``mma.sync`` Gluon kernel).
"""

from .abi import D_LATENT, D_QK, D_ROPE, GLUON_KERNELS
from .launcher import VerifyPlan, verify_mla
from .policy import VERIFY_MLA_CONFIGS, VerifyLaunch, plan_launch
from .reference import KV_FP8, verify_mla_reference

__all__ = ["D_LATENT", "D_QK", "D_ROPE", "GLUON_KERNELS", "KV_FP8", "VERIFY_MLA_CONFIGS", "VerifyLaunch",
           "VerifyPlan", "plan_launch", "verify_mla", "verify_mla_reference"]
