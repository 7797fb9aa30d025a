"""Tensor parallelism on ``torch.distributed``: the group object the model and the engine take, and the
vocabulary-parallel pieces (embedding lookup, output head, target picks, tree acceptance).

Every rank runs the same program on the same (replicated) activations; only parameters are sharded
(:mod:`tritree.model.parallel` says which). A collective is an all-reduce of a partial sum (attention
``o_proj``, MLPs, expert-parallel MoE, vocabulary-parallel embedding) or an all-gather of a small tensor
(per-node picks, draft logits). All of them have static shapes and none reads a value on the host, so a
whole decode step stays one CUDA graph per rank with the NCCL calls inside it.

``TPGroup()`` (world size 1) is a no-op everywhere: single-process code paths are unchanged.

Replicated values must stay bit-identical on every rank (each rank builds the same tree and accepts the
same tokens): they are, because every all-reduce hands every rank the same bytes and everything else is
the same deterministic computation on the same inputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TPGroup:
    """A tensor-parallel group: ``world`` ranks, this one ``rank``; ``group`` is the
    ``torch.distributed`` process group (``None``: the default group). ``TPGroup()`` = one process."""

    world: int = 1
    rank: int = 0
    group: object = None

    def __post_init__(self):
        if not (isinstance(self.world, int) and self.world >= 1):
            raise ValueError(f"world must be an int >= 1, got {self.world!r}")
        if not (isinstance(self.rank, int) and 0 <= self.rank < self.world):
            raise ValueError(f"rank must be an int in [0, {self.world}), got {self.rank!r}")

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks, in place (returns ``x``)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[world, *x.shape]``: every rank's ``x`` in rank order."""
        if self.world == 1:
            return x[None]
        import torch.distributed as dist

        out = x.new_empty((self.world, *x.shape))
        # The list form: gloo, NCCL and torch 2.11-2.13 all take it (all_gather_into_tensor's output layout
        # and deprecation status vary).
        dist.all_gather(list(out.unbind(0)), x.contiguous(), group=self.group)
        return out


def active(tp: TPGroup | None) -> bool:
    return tp is not None and tp.world > 1


def all_reduce_(tp: TPGroup | None, x: torch.Tensor) -> torch.Tensor:
    """``tp.all_reduce_(x)``; ``x`` itself without a group (no copy, no call)."""
    return tp.all_reduce_(x) if active(tp) else x


def init_tp(world: int | None = None, backend: str | None = None) -> TPGroup:
    """The group of a ``torchrun`` launch (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``...):
    initialises the default process group (NCCL with a GPU, else gloo) and, on a GPU, selects
    ``cuda:LOCAL_RANK``. ``world`` (e.g. ``--tp``), when given, must equal ``WORLD_SIZE``. Without
    ``WORLD_SIZE`` (a plain ``python`` run) returns ``TPGroup()`` if ``world`` is 1 or None.
    ``TRITREE_STACKS_EVERY_S=N`` makes every rank print its threads' Python stacks every N seconds
    (to find where a hung rank waits)."""
    import torch.distributed as dist

    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if world is not None and world != env_world:
        raise ValueError(f"--tp {world} but this launch has WORLD_SIZE={env_world}; run it as "
                         f"'torchrun --nproc-per-node {world} -m tritree ... --tp {world}'")
    if env_world == 1:
        return TPGroup()
    if os.environ.get("TRITREE_STACKS_EVERY_S"):  # a hung rank shows where it waits (debugging aid)
        import faulthandler
        import sys

        faulthandler.dump_traceback_later(float(os.environ["TRITREE_STACKS_EVERY_S"]), repeat=True, file=sys.stderr)
    if not dist.is_initialized():
        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend or ("nccl" if gpu else "gloo"))
    return TPGroup(dist.get_world_size(), dist.get_rank())


# Callables ``shutdown_tp`` runs before it destroys the group, in registration order. Layers above this
# module register their own (the engine: ``close_all_engines``), so that this module imports none of them.
_TEARDOWN_HOOKS: list = []


def register_teardown(fn) -> None:
    """Runs ``fn()`` in :func:`shutdown_tp` before the process group goes (once, however often it is
    registered): a layer that holds resources tied to the group (CUDA graphs that captured NCCL
    collectives) frees them there."""
    if fn not in _TEARDOWN_HOOKS:
        _TEARDOWN_HOOKS.append(fn)


def shutdown_tp() -> None:
    """Destroys the launch's process group (if any). CUDA graphs that captured NCCL collectives must
    be freed first (pytorch/pytorch#115388: the teardown otherwise hangs): the registered teardown hooks
    run (:func:`register_teardown`; importing :mod:`tritree.engine` registers one that frees every live
    engine's graphs, ``Engine.close``) and unreachable objects are collected before the group goes."""
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    for fn in list(_TEARDOWN_HOOKS):
        fn()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# Vocabulary parallelism: rank r holds rows [r * Vs, (r + 1) * Vs) of embed_tokens and lm_head,
# Vs = ceil(V / world); the last shard is zero-padded to Vs rows (its padded logits are -inf).
# --------------------------------------------------------------------------------------------------

def vocab_shard(vocab_size: int, tp: TPGroup | None) -> tuple[int, int, int]:
    """``(start, real_rows, padded_rows)`` of this rank's vocabulary shard."""
    world, rank = (tp.world, tp.rank) if tp is not None else (1, 0)
    per = -(-vocab_size // world)
    start = min(rank * per, vocab_size)
    return start, min(per, vocab_size - start), per


def embed(tp: TPGroup | None, table: torch.Tensor, tokens: torch.Tensor, vocab_size: int,
          scale: float = 1.0) -> torch.Tensor:
    """``table[tokens] * scale`` with ``table`` this rank's vocabulary shard ``[Vs, hidden]``: each rank looks up
    the tokens it holds (zeros elsewhere, one launch: :func:`tritree.kernels.embed_rows`) and an all-reduce adds
    them; exactly one rank contributes to each row, so the result is exact. In one process an id out of range is
    an indexing error. ``tokens [...]`` -> ``[..., hidden]``."""
    if not active(tp):
        x = table[tokens]
        return x if scale == 1.0 else x * scale
    from .kernels import embed_rows

    start, rows, _ = vocab_shard(vocab_size, tp)
    return tp.all_reduce_(embed_rows(table, tokens, start=start, rows=rows, scale=scale))


def lm_logits(tp: TPGroup | None, h: torch.Tensor, head: torch.Tensor, vocab_size: int,
              scale: float = 1.0) -> torch.Tensor:
    """float32 logits ``h [..., hidden] @ head^T * scale``: ``[..., V]`` in one process, this rank's
    shard ``[..., Vs]`` under TP (padding columns -inf, so no pick lands there)."""
    out = F.linear(h, head.to(h.dtype))
    if scale != 1.0:
        out = out * scale
    out = out.float()
    if active(tp):
        _, rows, per = vocab_shard(vocab_size, tp)
        if rows < per:
            out[..., rows:] = float("-inf")
    return out


def gather_vocab(tp: TPGroup | None, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full ``[..., V]`` logits from every rank's shard ``[..., Vs]`` (an all-gather of all of them)."""
    if not active(tp):
        return logits
    parts = tp.all_gather(logits)  # [world, ..., Vs]
    full = torch.cat(parts.unbind(0), dim=-1)
    return full if full.shape[-1] == vocab_size else full[..., :vocab_size].contiguous()  # rows of V, as usual


def greedy_picks(tp: TPGroup | None, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``argmax`` over the whole vocabulary (lowest id on ties): ``logits [..., Vs]`` -> int32 ``[...]``,
    without gathering the logits: each rank's (max, first argmax), all-gathered, then the first rank
    with the largest max; shards are in id order, so that is the lowest id among equal maxima."""
    if not active(tp):
        return torch.argmax(logits, dim=-1).to(torch.int32)
    start, _, _ = vocab_shard(vocab_size, tp)
    idx = torch.argmax(logits, dim=-1, keepdim=True)  # first maximum within the shard
    val = torch.gather(logits, -1, idx)[..., 0].float()
    idx = idx[..., 0]
    vals = tp.all_gather(val)  # [world, ...]
    ids = tp.all_gather((idx + start).to(torch.int32))
    best = torch.argmax(vals, dim=0, keepdim=True)  # first maximum: the lowest rank
    return torch.gather(ids, 0, best)[0]


def target_picks(tp: TPGroup | None, logits: torch.Tensor, vocab_size: int, *, temperature: float = 0.0,
                 top_k=None, top_p=None, seed: int = 0, step=0) -> torch.Tensor:
    """:func:`tritree.kernels.accept.target_picks` of vocabulary-sharded ``logits [B, T, Vs]``: greedy
    without gathering (:func:`greedy_picks`); sampling gathers the logits first (exact, but an
    all-gather of ``B T V`` floats: a first version)."""
    from .kernels.accept import target_picks as picks_full

    if temperature == 0.0:
        return greedy_picks(tp, logits, vocab_size)
    return picks_full(gather_vocab(tp, logits, vocab_size), temperature=temperature, top_k=top_k, top_p=top_p,
                      seed=seed, step=step)


def accept_tree(tp: TPGroup | None, tokens, parents, tree_lens, logits, vocab_size: int, *,
                temperature: float = 0.0, top_k=None, top_p=None, seed: int = 0, step=0):
    """:func:`tritree.accept_tree` with vocabulary-sharded target ``logits [B, T, Vs]`` (the same
    return values). Greedy: per-node picks without gathering the logits, then the walk
    (:func:`accept_with_picks`); sampling: on the gathered logits."""
    from .kernels import accept_tree as accept_full

    if not active(tp) or temperature != 0.0:
        return accept_full(tokens, parents, tree_lens, gather_vocab(tp, logits, vocab_size), temperature=temperature,
                           top_k=top_k, top_p=top_p, seed=seed, step=step)
    return accept_with_picks(tokens, parents, tree_lens, greedy_picks(tp, logits, vocab_size))


def accept_with_picks(tokens, parents, tree_lens, picks):
    """The walk of :func:`tritree.accept_tree` for given per-node ``picks [B, T]`` (global token ids), in one
    launch (:func:`tritree.kernels.accept_picks`). Returns ``(accept_idx, accept_len, bonus, picks)`` like
    ``accept_tree``."""
    from .kernels import accept_picks

    return (*accept_picks(tokens, parents, tree_lens, picks), picks)
