"""Cases run identically by a single process and by every rank of a tensor-parallel group
(tests/test_parallel.py). A module of its own: spawned ranks import it without the test setup
(conftest insists on Triton's mode before triton loads; the ranks inherit the parent's mode)."""

import os
import socket

import torch

from tritree import tree_mask_from_parents
from tritree.dist import gather_vocab, greedy_picks, shutdown_tp
from tritree.engine import Engine
from tritree.model import dflash
from tritree.model.config import dflash_tiny, kimi_tiny
from tritree.model.kimi_k2 import init_params, prefill, verify
from tritree.model.loading import load_dflash_params, load_params
from tritree.model.parallel import shard_draft_params, shard_params
from tritree.testing import paged_layout, random_trees
from tritree.train import ASSETS

PROMPTS = [[5, 17, 3, 88, 41, 9, 12], [60], [7, 7, 7, 30, 2, 19, 44, 45, 46, 1, 0, 90, 13]]
TEXT_PROMPTS = [list(b"def __init__(self, "), list(b"import os\nimport sys\n\n\ndef main(")]


# --------------------------------------------------------------------------------------------------
# The same cases in one process (tp=None) and in every rank of a group
# --------------------------------------------------------------------------------------------------

def run_cases(tp, device):
    """Logits, picks and generations of the tiny random pair and the shipped pair under ``tp``."""
    out = {}
    tcfg = kimi_tiny()
    dcfg = dflash_tiny(tcfg)
    V = tcfg.vocab_size
    tparams, lcfg = shard_params(init_params(tcfg, seed=0), tcfg, tp)
    tparams = {k: v.to(device) for k, v in tparams.items()}
    dparams, dlcfg = shard_draft_params(dflash.init_params(dcfg, seed=1, device=device), dcfg, tp)
    g = torch.Generator().manual_seed(7)
    B, S, T, P = 2, 9, 6, 4
    prompt = torch.randint(0, V, (B, S), generator=g)
    parents = random_trees(B, T, ("random", "wide"), generator=g)
    nodes = torch.randint(0, V, (B, T), generator=g)
    page_table, num_pages = paged_layout(S + T, B, P, extra_pages=2, generator=g)
    cache = {"kv": torch.zeros(tcfg.num_hidden_layers, num_pages, P, tcfg.latent_dim, device=device),
             "page_table": page_table.to(device), "kv_lens": torch.zeros(B, dtype=torch.int32, device=device)}
    with torch.no_grad():
        logits, taps, cache = prefill(tparams, lcfg, prompt.to(device), cache, taps=(0, 2), tp=tp)
        out["prefill"] = gather_vocab(tp, logits, V).cpu()
        out["taps"] = taps.cpu()
        tree_mask, depth = tree_mask_from_parents(parents.to(device))
        logits, _ = verify(tparams, lcfg, nodes.to(device), depth, tree_mask, cache, tp=tp)
        out["verify"] = gather_vocab(tp, logits, V).cpu()
        out["verify_picks"] = greedy_picks(tp, logits, V).cpu()
        out["latents"] = cache["kv"].cpu()
        # the draft alone: its context from the prefill's taps, then one block's logits (all-gathered)
        dcache = dflash.new_cache(dlcfg, num_pages, P, page_table.to(device),
                                  torch.zeros(B, dtype=torch.int32, device=device))
        pos = torch.arange(S, device=device).expand(B, S)
        dcache = dflash.materialize_context_(dparams, dlcfg, taps, pos, dcache, tp=tp)
        out["draft_logits"] = dflash.draft(dparams, dlcfg, tparams["model.embed_tokens.weight"], tparams["lm_head.weight"],
                                           prompt[:, -1].to(device), dcache["kv_lens"], dcache, tp=tp).cpu()
    graphs = device != "cpu"
    with Engine(tparams, lcfg, dparams, dlcfg, page_size=8, num_pages=256, graphs=graphs, tp=tp) as eng:
        out["greedy"] = [r.tokens for r in eng.generate(PROMPTS, 12, budget=8)]
        out["plain"] = [r.tokens for r in eng.generate(PROMPTS, 12, speculative=False)]
        out["chain"] = [r.tokens for r in eng.generate(PROMPTS, 12, chain=True)]
        out["sampled"] = [r.tokens for r in eng.generate(PROMPTS, 8, budget=4, temperature=1.0, top_k=20, seed=5)]
    sp, scfg = load_params(str(ASSETS / "target"), device=device, tp=tp)
    dp, dc = load_dflash_params(str(ASSETS / "draft"), device=device, tp=tp)
    with Engine(sp, scfg, dp, dc, page_size=16, num_pages=64, graphs=graphs, tp=tp) as eng:
        out["text"] = [r.tokens for r in eng.generate(TEXT_PROMPTS, 16, budget=8)]
    return out


def _worker(rank, world, port, out_dir, backend):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # 2 and 4 processes share the machine's cores
    from tritree.dist import init_tp

    tp = init_tp(world, backend=backend)
    try:
        res = run_cases(tp, f"cuda:{rank}" if backend == "nccl" else "cpu")
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        shutdown_tp()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world, tmp_path, backend):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path), backend), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
