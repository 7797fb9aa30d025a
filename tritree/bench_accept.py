"""``python -m tritree bench accept``: acceptance of the shipped tiny pair on held-out text.

For the DFlash chain and DDTree budgets 8-128, greedy and temperature 1: mean acceptance length
(tokens emitted per step, the bonus token included) over prompts cut from held-out standard-library
files, the wall-clock time against plain decoding on the same machine, and a PNG plot.
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


def main(args) -> int:
    from .engine import Engine
    from .train import shipped_pair

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    tparams, tcfg, dparams, dcfg, what = shipped_pair(device, torch.float32)
    eng = Engine(tparams, tcfg, dparams, dcfg, page_size=16, num_pages=4096, graphs=gpu)
    prompts, source = heldout_prompts(args.prompts, args.prompt_len, fresh=getattr(args, "fresh_prompts", False))
    print(f"bench accept on {'GPU ' + torch.cuda.get_device_name() if gpu else 'CPU (reference ops)'}: {what}; "
          f"{len(prompts)} held-out prompts of {args.prompt_len} bytes ({source}), {args.new} new tokens", flush=True)
    def timed(**kw):
        # Warm-up at the same batch, budget and sampling first: kernel JIT (Triton specialises on
        # the tree size) and the allocator stay out of the timed run.
        eng.generate(prompts, 4, seed=3, **kw)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = eng.generate(prompts, args.new, seed=3, **kw)
        if gpu:
            torch.cuda.synchronize()
        return res, time.perf_counter() - t0

    rows = []
    for temp in (0.0, 1.0):
        _, plain_s = timed(temperature=temp, speculative=False)
        for name, kw in [("chain", dict(chain=True))] + [(f"tree {b}", dict(budget=b)) for b in args.budgets]:
            res, dt = timed(temperature=temp, **kw)
            steps = sum(r.steps for r in res)
            emitted = sum(len(r.tokens) - 1 for r in res)
            acc = emitted / steps
            rows.append(dict(mode=name, temperature=temp, acceptance=acc, steps=steps, seconds=dt, plain_seconds=plain_s,
                             speedup=plain_s / dt, device=device))
            print(f"temperature {temp}: {name:9s} acceptance length {acc:5.2f} tokens/step, {dt:6.1f} s "
                  f"(plain {plain_s:.1f} s, speedup {plain_s / dt:.2f}x)", flush=True)
    chain = {r["temperature"]: r["acceptance"] for r in rows if r["mode"] == "chain"}
    for r in rows:
        r["vs_chain"] = r["acceptance"] / chain[r["temperature"]]
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
        pts = [(int(r["mode"].split()[1]), r["acceptance"]) for r in rows if r["temperature"] == temp and r["mode"] != "chain"]
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
