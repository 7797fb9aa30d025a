"""``python -m tritree bench accept``: acceptance of the shipped tiny pair on held-out text.

For the DFlash chain and DDTree budgets 8-128, greedy and temperature 1: mean acceptance length
(tokens emitted per step, the bonus token included) over prompts cut from held-out standard-library
files, the wall-clock time against plain decoding on the same machine, and a PNG plot (``--plot``,
default ``./tritree-bench/acceptance.png``; ``bench/results/acceptance.png`` is the committed one).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from .roofline import append_jsonl

SHIPPED_PROMPTS = Path(__file__).parent / "assets" / "tiny" / "heldout_prompts.json"


def cut_prompts(n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` bytes cut from this machine's held-out standard-library files."""
    from .train import corpus

    files = [f for f in corpus("heldout") if len(f) > 2 * length]
    g = torch.Generator().manual_seed(0)
    prompts = []
    for i in range(n):
        f = files[i % len(files)]
        s = int(torch.randint(0, len(f) - length, (1,), generator=g))
        prompts.append(list(f[s:s + length]))
    return prompts


def heldout_prompts(n: int, length: int, fresh: bool = False) -> tuple[list[list[int]], str]:
    """The prompts shipped with the pair when they fit (``n`` and ``length`` as shipped): the
    held-out split is recomputed from each machine's standard library, so cutting fresh prompts on
    another Python version measures different text (seen: H200 with 3.12 vs CPU with 3.11)."""
    if not fresh and SHIPPED_PROMPTS.exists():
        shipped = json.loads(SHIPPED_PROMPTS.read_text())
        if shipped["prompt_len"] == length and len(shipped["prompts"]) >= n:
            return shipped["prompts"][:n], f"shipped with the pair, cut from Python {shipped['python']}'s files"
    return cut_prompts(n, length), f"cut from this machine's Python {platform.python_version()} files"


def modelled_ms(table, L: float, steps, mode: str, budget, block: int) -> float:
    """The summed step time (ms) of ``steps`` (``Engine.step_nodes``: ``(active requests, tree nodes in all,
    tree size verified at)`` per step) under ``table`` at context ``L``: a fixed-size step (a budget, the
    chain's block, plain decoding) costs its own graph's time (``captured_ms`` when measured), an auto step
    the table's auto step at the size it verified at (``step_ms``)."""
    fixed = table.captured_cost_ms if table.captured_ms is not None else table.cost_ms
    total = 0.0
    for a, _, width in steps:
        if mode == "auto":
            total += table.cost_ms(a, L, width)
        else:
            T = 1 if mode == "plain" else block if mode == "chain" else budget + 1
            total += fixed(a, L, T)
    return total


def main(args) -> int:
    from .engine import Engine
    from .train import shipped_pair

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    tparams, tcfg, dparams, dcfg, what = shipped_pair(device, torch.float32)
    table = getattr(args, "cost_table", None)  # a tritree.budget.CostTable (the CLI picks it) or None

    def engine(cost_model=None):
        return Engine(tparams, tcfg, dparams, dcfg, page_size=16, num_pages=4096, graphs=gpu, cost_model=cost_model)

    prompts, source = heldout_prompts(args.prompts, args.prompt_len, fresh=getattr(args, "fresh_prompts", False))
    B = getattr(args, "batch", None) or len(prompts)
    groups = [prompts[i:i + B] for i in range(0, len(prompts), B)]
    print(f"bench accept on {'GPU ' + torch.cuda.get_device_name() if gpu else 'CPU (reference ops)'}: {what}; "
          f"{len(prompts)} held-out prompts of {args.prompt_len} bytes ({source}), {args.new} new tokens, "
          f"{B} at a time", flush=True)
    if table is not None:
        print(f"modelled tokens/s: steps timed by the step-cost table of {table.gpu} ({table.source}) at "
              f"context {', '.join(str(L) for L in table.ctx)}: this pair's acceptance, that model's step times",
              flush=True)

    def timed(eng, **kw):
        # Warm-up at the same batch, budget and sampling first: kernel JIT (Triton specialises on
        # the tree size) and the allocator stay out of the timed run.
        eng.generate(groups[0], 4, seed=3, **kw)
        if gpu:
            torch.cuda.synchronize()
        res, steps = [], []
        t0 = time.perf_counter()
        for g in groups:
            res += eng.generate(g, args.new, seed=3, **kw)
            steps += eng.step_nodes
        if gpu:
            torch.cuda.synchronize()
        return res, steps, time.perf_counter() - t0

    fixed_eng = engine()
    modes = [("chain", dict(chain=True), fixed_eng, None)]
    modes += [(f"tree {b}", dict(budget=b), fixed_eng, None) for b in args.budgets if b != "auto"]
    if "auto" in args.budgets:
        auto = dict(budget="auto", max_budget=args.max_budget)
        if table is None:  # the engine's default cost model (the analytic one of this pair)
            modes.append(("auto", auto, fixed_eng, None))
        else:  # auto sized by the model of each context
            modes += [(f"auto @{L}", auto, engine(table.at_ctx(L)), L) for L in table.ctx]
    rows = []
    for temp in (0.0, 1.0):
        _, plain_steps, plain_s = timed(fixed_eng, temperature=temp, speculative=False)
        for name, kw, eng, at in modes:
            res, steps, dt = timed(eng, temperature=temp, **kw)
            emitted = sum(len(r.tokens) - 1 for r in res)
            row = dict(mode=name, temperature=temp, acceptance=emitted / sum(r.steps for r in res), steps=len(steps),
                       seconds=dt, plain_seconds=plain_s, speedup=plain_s / dt, device=device, batch=B,
                       tokens=emitted + len(res))
            if name.startswith("auto"):
                row["tree_nodes_mean"] = eng.tree_size_stats()["mean"]
            if table is not None:
                mode = "auto" if name.startswith("auto") else "chain" if name == "chain" else "tree"
                budget = kw.get("budget")
                ctxs = [at] if at is not None else table.ctx
                row["modelled_tokens_per_s"] = {
                    str(L): 1e3 * emitted / modelled_ms(table, L, steps, mode, budget, dcfg.block_size) for L in ctxs}
            rows.append(row)
            extra = (f"; modelled {', '.join(f'{v:.1f} tokens/s at {L}' for L, v in row['modelled_tokens_per_s'].items())}"
                     if table is not None else "")
            nodes = f", mean tree {row['tree_nodes_mean']:.1f} nodes" if "tree_nodes_mean" in row else ""
            print(f"temperature {temp}: {name:11s} acceptance length {row['acceptance']:5.2f} tokens/step{nodes}, "
                  f"{dt:7.3f} s, {row['tokens'] / dt:,.0f} tokens/s (plain {plain_s:.3f} s, speedup {plain_s / dt:.2f}x)"
                  f"{extra}", flush=True)
        if table is not None and 1 in table.tree:
            for L in table.ctx:
                ms = modelled_ms(table, L, plain_steps, "plain", None, dcfg.block_size)
                tokens = sum(s[0] for s in plain_steps)  # one token a request and step
                print(f"temperature {temp}: plain decoding modelled {1e3 * tokens / ms:.1f} tokens/s at {L}", flush=True)
    chain = {r["temperature"]: r["acceptance"] for r in rows if r["mode"] == "chain"}
    for r in rows:
        r["vs_chain"] = r["acceptance"] / chain[r["temperature"]]
    if table is not None:
        _print_auto_summary(rows, table)
    append_jsonl(args.out, rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for temp in (0.0, 1.0):
        pts = [(int(r["mode"].split()[1]), r["acceptance"]) for r in rows
               if r["temperature"] == temp and r["mode"].startswith("tree")]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"DDTree, temperature {temp:g}")
        ax.axhline(chain[temp], linestyle="--", color="gray" if temp else "black", linewidth=1,
                   label=f"DFlash chain, temperature {temp:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree budget (nodes)")
    ax.set_ylabel("acceptance length (tokens / step)")
    ax.set_title(f"tiny pair, held-out stdlib text ({device})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")
    return 0


def _print_auto_summary(rows, table) -> None:
    """Per temperature and context: auto's modelled tokens/s against the best fixed budget's."""
    for temp in sorted({r["temperature"] for r in rows}):
        for L in table.ctx:
            fixed = [(r["modelled_tokens_per_s"][str(L)], r["mode"]) for r in rows
                     if r["temperature"] == temp and r["mode"].startswith("tree")]
            auto = [r["modelled_tokens_per_s"][str(L)] for r in rows
                    if r["temperature"] == temp and r["mode"] == f"auto @{L}"]
            if not fixed or not auto:
                continue
            best, which = max(fixed)
            print(f"temperature {temp}, context {L}: auto {auto[0]:.1f} tokens/s = {auto[0] / best:.3f}x the best "
                  f"fixed budget ({which}: {best:.1f}); vs each: "
                  + ", ".join(f"{m}: {auto[0] / v:.2f}x" for v, m in fixed), flush=True)
