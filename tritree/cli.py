"""Command line: ``python -m tritree [COMMAND] ...`` (also the ``tritree`` console script);
``python -m tritree --help`` lists the commands, ``python -m tritree COMMAND --help`` their options.

``generate`` (the default: no command, or a first argument that is an option, means ``generate``):
speculative decoding (target + DFlash draft + DDTree) of a batch of prompts, printing the tokens, tokens
per second, the mean acceptance length and the phase split; ``--check`` also decodes without
speculation and confirms the outputs match. Without ``--model`` / ``--draft`` it uses the shipped tiny
pair (``--random``: a tiny random pair, whose acceptance lengths mean nothing). Without a GPU every
kernel runs in Triton's interpreter (the command re-executes itself with ``TRITON_INTERPRET=1``).

``--budget auto`` (the default on a GPU): trees of ``--max-budget`` nodes, each step verifying them at the size
(one of ``tree_buckets(--max-budget)``, each its own graph) with the most expected tokens per unit of step time
(:mod:`tritree.budget`), under
the step-cost table of this GPU from ``--cost-model`` (default ``~/.cache/tritree/step_cost.json``, written
by ``bench calibrate``) or, without one, the analytic model.

``demo``: the verify-attention kernel on a random tree over a random paged latent cache, checked
against the float64 reference and, on a GPU, timed against the hardware floor. ``bench``: decode,
calibrate (GPU) and accept benchmarks. ``train``: the tiny pair. ``memory``: per-GPU bytes from configs.

A checkpoint directory (``generate`` and ``memory``: ``--model``, ``--draft``) that is missing, has no
readable ``config.json``, a config the loaders refuse or (``generate``) no weights is refused with one
line naming the flag, the directory and what is wrong, exit status 2.

Tensor parallelism (``generate``, ``bench decode``): ``torchrun --nproc-per-node N -m tritree generate
--tp N`` (NCCL on GPUs, gloo on the CPU); ``--tp N`` without torchrun relaunches the command under
``torchrun --standalone`` with N local processes; a torchrun launch without ``--tp`` uses WORLD_SIZE.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def torch_has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _ensure_interpreter_without_gpu() -> None:
    """Triton reads TRITON_INTERPRET when it is imported; re-run this command with it set when there is
    no GPU, so that the demo exercises the kernel rather than the CPU reference path."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "tritree", *sys.argv[1:]], env)


def demo(args) -> int:
    import torch

    from . import verify_mla, verify_mla_reference
    from .kernels.configs import arch_of
    from .testing import random_verify_inputs

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or ("bf16" if gpu else "fp32")]
    B, T, H, P = args.batch, args.tree, args.heads, args.page_size
    L = args.context if args.context is not None else (46_000 if gpu else 200)
    sm_scale = 192**-0.5 * (1 + 0.1 * math.log(64)) ** 2
    where = f"GPU {torch.cuda.get_device_name()} ({arch_of(device)} configs)" if gpu else "CPU, Triton interpreter"
    print(f"tritree verify-attention demo on {where}")
    print(f"shape: B={B} T={T} H={H} L={L} P={P} {args.dtype or str(dtype).removeprefix('torch.')}, "
          f"random DDTree-like trees, fragmented page table")
    case = random_verify_inputs(B, T, H, P, [L] * B, None, ("wide", "random", "chain"), dtype, seed=args.seed,
                                device=device)
    call = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
    out = verify_mla(*call, sm_scale=sm_scale)
    ref = verify_mla_reference(*(x.double() if x.is_floating_point() else x for x in call), sm_scale=sm_scale)
    err = float((out.double() - ref).norm() / ref.norm())
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    ok = err <= tol and not torch.isnan(out).any()
    print(f"check against the float64 reference: relative error {err:.2e} (tolerance {tol:.0e}) "
          f"{'OK' if ok else 'FAILED'}")
    if gpu:
        from .roofline import ceilings_source, device_ceilings, graph_time_us, verify_mla_counts

        ceil = device_ceilings()
        o = torch.empty_like(out)
        lse = torch.empty(out.shape[:3], dtype=torch.float32, device=device)
        us = graph_time_us([lambda: verify_mla(*call, sm_scale=sm_scale, out=o, lse=lse)])
        nbytes, flops = verify_mla_counts(B, T, H, L, dtype_bytes=case["kv"].element_size())
        floor_us, bound = ceil.floor_us(nbytes, flops)
        print(f"time: {us:.1f} us per call (CUDA graph replay, median; one input set, so L2 may help) | "
              f"floor {floor_us:.1f} us ({bound}-bound, copy {ceil.copy_gbps:.0f} GB/s, matmul "
              f"{ceil.matmul_tflops:.0f} TFLOP/s {ceilings_source()}) | {nbytes / us / 1e3:.0f} GB/s, "
              f"{flops / us / 1e6:.1f} TFLOP/s")
    else:
        print("time: not measured (no GPU); see bench/RESULTS.md for H200 numbers")
    return 0 if ok else 1


def _load_pair(args, device, dtype, tp=None):
    import torch

    from .model import dflash
    from .model.config import dflash_tiny, kimi_tiny
    from .model.kimi_k2 import init_params
    from .model.loading import load_dflash_params, load_params
    from .model.parallel import shard_draft_params, shard_params

    if args.model:  # the directories passed _check_generate; what the loaders find wrong inside is one line too
        with _checkpoint_errors("generate", "--model", args.model):
            tparams, tcfg = load_params(args.model, device=device, dtype=dtype, tp=tp)
        with _checkpoint_errors("generate", "--draft", args.draft):
            dparams, dcfg = load_dflash_params(args.draft, device=device, dtype=dtype, tp=tp)
        return tparams, tcfg, dparams, dcfg, f"target {args.model}, draft {args.draft}"
    from .train import ASSETS, shipped_pair
    if not args.random and (ASSETS / "target" / "model.safetensors").exists():
        return shipped_pair(device, dtype, tp)
    tcfg = kimi_tiny()
    dcfg = dflash_tiny(tcfg)
    tparams, tcfg = shard_params(init_params(tcfg, seed=args.seed, device=device, dtype=dtype), tcfg, tp)
    dparams, dcfg = shard_draft_params(dflash.init_params(dcfg, seed=args.seed + 1, device=device, dtype=dtype), dcfg,
                                       tp)
    del torch
    return tparams, tcfg, dparams, dcfg, ("tiny random target/draft pair (random weights: the acceptance length "
                                          "means nothing until trained models exist)")


def _cost_model(cmd: str, path, gpu: bool):
    """``(model or None for the analytic default, description)`` for ``--budget auto``: this GPU's table
    from ``path`` (``--cost-model``; default file when None, skipped when absent or without this GPU)."""
    import torch

    from .budget import DEFAULT_COST_PATH, load_cost_file

    name = torch.cuda.get_device_name() if gpu else None
    explicit = path is not None
    path = path or DEFAULT_COST_PATH
    if not os.path.exists(path):
        if explicit:
            _usage_error(cmd, f"--cost-model {path}: no such file")
        return None, "analytic default (no step-cost file)"
    try:
        tables = load_cost_file(path)
    except (OSError, ValueError) as e:
        _usage_error(cmd, f"--cost-model {path}: {e}")
    if name in tables:
        return tables[name], f"measured table for {name} from {path}"
    if explicit:
        _usage_error(cmd, f"--cost-model {path}: no table for {name or 'the CPU'} (it has {sorted(tables)})")
    return None, f"analytic default ({path} has no table for {name or 'the CPU'})"


def _accept_cost_table(path, gpu_name):
    """``bench accept --cost-model PATH [--cost-gpu NAME]``: that table (default this GPU's, or the file's
    only one); usage errors for a missing file, an invalid one or no such table."""
    import torch

    from .budget import load_cost_file

    if not os.path.exists(path):
        _usage_error("bench accept", f"--cost-model {path}: no such file")
    try:
        tables = load_cost_file(path)
    except (OSError, ValueError) as e:
        _usage_error("bench accept", f"--cost-model {path}: {e}")
    name = gpu_name or (torch.cuda.get_device_name() if torch_has_gpu() else None)
    if name is None and len(tables) == 1:
        return next(iter(tables.values()))
    if name not in tables:
        _usage_error("bench accept", f"--cost-model {path}: no table for {name or 'the CPU'} (it has "
                                     f"{sorted(tables)}; --cost-gpu picks one)")
    return tables[name]


def _size_histogram(hist: dict) -> str:
    """``{nodes: count}`` in power-of-two buckets: ``0: 3, 1: 2, 2-3: 7, 4-7: 1``."""
    buckets = {}
    for k, c in hist.items():
        lo = 0 if k == 0 else 1 << (k.bit_length() - 1)
        buckets[lo] = buckets.get(lo, 0) + c
    return ", ".join(f"{lo}: {c}" if lo < 2 else f"{lo}-{2 * lo - 1}: {c}" for lo, c in sorted(buckets.items()))


def generate(args, tp=None) -> int:
    import time

    import torch
    from tqdm import tqdm

    from .engine import Engine

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"  # under TP: the rank's GPU, selected by init_tp
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or ("bf16" if gpu else "fp32")]
    tparams, tcfg, dparams, dcfg, what = _load_pair(args, device, dtype, tp)
    where = f"GPU {torch.cuda.get_device_name()}" if gpu else "CPU (kernels in the Triton interpreter)"
    rank0 = tp is None or tp.rank == 0
    say = print if rank0 else (lambda *a, **k: None)  # every rank computes the same tokens; one prints them
    if tp is not None and tp.active:
        where += f", tensor parallel over {tp.world} ranks"
    say(f"tritree generate on {where}: {what}")
    g = torch.Generator().manual_seed(args.seed)
    text = tcfg.vocab_size == 257  # bytes as tokens (the shipped pair)
    if args.prompt and not text:  # _check_generate catches it first, unless the shipped pair is missing
        _usage_error("generate", f"--prompt needs a byte-level target (257 tokens, as the shipped pair); this one "
                                 f"has {tcfg.vocab_size}: give --prompt-ids")
    if args.prompt_ids:
        prompts = args.prompt_ids
    elif text:
        prompts = [list(p.encode()) for p in (args.prompt or ["def __init__(self, ", "import os\nimport sys\n\n\ndef main("])]
    else:
        prompts = [torch.randint(0, tcfg.vocab_size, (n,), generator=g).tolist()
                   for n in [11, 4, 23, 7][:args.batch]]
    cost_model = None
    if args.budget == "auto" and not args.chain:
        cost_model, how = _cost_model("generate", args.cost_model, gpu)
        say(f"tree size: auto, at most {args.max_budget} nodes; step cost: {how}")
    engine = Engine(tparams, tcfg, dparams, dcfg, page_size=args.page_size, num_pages=args.num_pages,
                    graphs=gpu and not args.eager, compile=args.compile, tp=tp, cost_model=cost_model)
    engine.log = say
    total = len(prompts) * args.max_new_tokens
    bar = tqdm(total=total, desc="tokens", unit="tok", disable=args.quiet or not rank0)
    t0 = time.perf_counter()
    res = engine.generate(prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, budget=args.budget, seed=args.seed, stop_tokens=args.stop,
                          stream=lambda i, toks: bar.update(len(toks)), chain=args.chain, max_budget=args.max_budget)
    if gpu:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    bar.close()
    n_tok = sum(len(r.tokens) for r in res)
    for i, r in enumerate(res):
        if r.error:  # this request's own error: one line, the others are still shown
            if rank0:
                print(f"tritree generate: error: request {i}: {r.error}", file=sys.stderr)
        elif text:
            shown_p = bytes(t for t in prompts[i] if t < 256).decode(errors="replace")
            shown = bytes(t for t in r.tokens if t < 256).decode(errors="replace")
            say(f"[{i}] {shown_p!r}\n    -> {shown!r} ({r.finish})")
        else:
            say(f"[{i}] prompt {prompts[i]}\n    -> {r.tokens} ({r.finish})")
    steps = sum(r.steps for r in res if not r.error)
    gen_after_first = sum(max(0, len(r.tokens) - 1) for r in res if not r.error)
    acc = f"{gen_after_first / steps:.2f} tokens per step" if steps else "n/a (no decode step ran)"
    if args.chain:  # the chain's size is the draft's block, whatever --budget says
        tree = f"the DFlash chain of {dcfg.block_size - 1} nodes"
    elif args.budget == "auto":
        tree = f"budget auto, at most {args.max_budget} nodes"
    else:
        tree = f"budget {args.budget}"
    included = ("prefill and CUDA graph capture included" if engine.graphs else "prefill included" if gpu
                else "prefill included, kernels in the Triton interpreter on the CPU")
    rate = f"{n_tok / dt:.1f} tokens/s" if dt > 0 else "no time measured"
    say(f"{n_tok} tokens in {dt:.2f} s ({rate}, {included}); mean acceptance length {acc} ({tree})")
    sizes = engine.tree_size_stats()
    if sizes["hist"]:
        say(f"tree nodes verified per request and step (root excluded): mean {sizes['mean']:.2f}; histogram "
            f"{_size_histogram(sizes['hist'])}")
    if engine.phase_stats:
        engine.report_phases()
    else:
        say("phase split: set TRITREE_PROFILE=1" + (" (TRITREE_PROFILE=eager for per-phase times under CUDA graphs)"
                                                     if engine.graphs else ""))
    ok = True
    if args.check:
        plain = engine.generate(prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, budget=args.budget, seed=args.seed, stop_tokens=args.stop,
                                speculative=False)
        same = all(a.tokens == b.tokens for a, b in zip(res, plain) if not a.error)
        if args.temperature == 0:
            ok = same
            say(f"check: speculative output {'equals' if same else 'DIFFERS FROM'} plain greedy decoding")
        else:
            say("check: at temperature > 0 the outputs are samples; the distributions are equal "
                "(tests/test_engine.py), the tokens need not be")
    return 0 if ok and not any(r.error for r in res) else 1


TP_HELP = ("tensor-parallel ranks: run under 'torchrun --nproc-per-node N -m tritree ... --tp N' (without "
           "torchrun the command relaunches itself so); default WORLD_SIZE")



def _usage_error(cmd: str, message: str):
    """A user's mistake: one line on stderr, exit status 2 (as argparse reports its own)."""
    print(f"tritree {cmd}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    parse.__name__ = f"int >= {lo}"
    return parse


def _budget(text: str):
    """``auto`` or an int >= 1."""
    if text == "auto":
        return text
    try:
        return _int_at_least(1)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 1: {e}") from None


def _page_size(text: str) -> int:
    v = _int_at_least(1)(text)
    if v > 128 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two in [1, 128], got {v}")
    return v


def _float_in(lo: float, hi: float, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (lo < v if lo_open else lo <= v) or not v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {text}")
        return v
    return parse


def _prompt_ids(text: str) -> list[list[int]]:
    """``'1,2,3;4,5'`` -> ``[[1, 2, 3], [4, 5]]``."""
    try:
        prompts = [[int(t) for t in p.split(",")] for p in text.split(";")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, prompts separated by ';', got "
                                         f"{text!r}") from None
    if any(t < 0 for p in prompts for t in p):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return prompts


# ---- checkpoint directories: one line naming the flag, the directory and what is wrong -----------------

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def _one_line(e: BaseException) -> str:
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)  # a KeyError's str() adds quotes
    return " ".join(str(text).split())


def _checkpoint_config(cmd: str, flag: str, path: str, kind: str, weights: bool, warn: bool = True):
    """The config of the checkpoint directory ``path`` (``kind`` "target": a :class:`KimiK2Config`,
    "draft": a :class:`DFlashConfig`); otherwise a usage error naming ``flag``, the directory and what is
    wrong: no such directory, no config.json, invalid JSON, a config the loaders refuse and (``weights``)
    neither model.safetensors nor its index. The config's warnings (unknown keys) are shown only when it
    is accepted, and only with ``warn``."""
    import warnings

    from .model.config import DFlashConfig, KimiK2Config

    def bad(what):
        _usage_error(cmd, f"{flag} {path}: {what}")

    if not os.path.isdir(path):
        bad("not a directory" if os.path.exists(path) else "no such directory")
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        bad("no config.json")
    try:
        with open(file, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        bad(f"config.json is not valid JSON ({e})")
    except (OSError, UnicodeDecodeError) as e:
        bad(f"cannot read config.json ({_one_line(e)})")
    if not isinstance(raw, dict):
        bad(f"config.json is not a JSON object (it holds a {type(raw).__name__})")
    read = KimiK2Config.from_hf if kind == "target" else DFlashConfig.from_hf
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            cfg = read(raw)
    except (ValueError, KeyError, TypeError) as e:  # what from_hf refuses, or a value of the wrong JSON type
        bad(f"config.json is not a valid {kind} config ({type(e).__name__}: {_one_line(e)})")
    if weights and not any(os.path.isfile(os.path.join(path, n)) for n in WEIGHT_FILES):
        bad(f"no {' or '.join(WEIGHT_FILES)}")
    for w in said if warn else ():
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return cfg


class _checkpoint_errors:
    """``with _checkpoint_errors(cmd, flag, path): load(path)``: what a loader raises about the files
    (a missing tensor, a shape the config contradicts, an unreadable shard) as a usage error naming
    the directory; anything else propagates."""

    def __init__(self, cmd: str, flag: str, path: str):
        self.cmd, self.flag, self.path = cmd, flag, path

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        from safetensors import SafetensorError

        if e is not None and isinstance(e, (OSError, KeyError, ValueError, SafetensorError)):
            _usage_error(self.cmd, f"{self.flag} {self.path}: {_one_line(e)}")
        return False


def _check_generate(args) -> None:
    """``generate``'s arguments that argparse cannot check alone, before any weight is read (and before
    the interpreter re-exec, so a mistake costs no second start)."""
    if bool(args.model) != bool(args.draft):
        _usage_error("generate", "--model and --draft go together")
    if args.prompt is not None and args.prompt_ids is not None:
        _usage_error("generate", "--prompt and --prompt-ids exclude each other: give the prompts as text or as "
                                 "token ids")
    if args.prompt is not None and "" in args.prompt:
        _usage_error("generate", "--prompt '': an empty prompt (decoding starts from at least one token)")
    if args.chain and args.budget is not None:
        _usage_error("generate", f"--budget {args.budget} and --chain exclude each other: the chain's size is the "
                                 "draft's block size - 1")
    vocab = None
    if args.model:  # warn=False: the loaders read the configs again and warn then
        vocab = _checkpoint_config("generate", "--model", args.model, "target", weights=True, warn=False).vocab_size
        _checkpoint_config("generate", "--draft", args.draft, "draft", weights=True, warn=False)
    elif args.random:
        from .model.config import kimi_tiny

        vocab = kimi_tiny().vocab_size
    if args.prompt and vocab is not None and vocab != 257:  # text prompts are bytes: the shipped pair's tokens
        _usage_error("generate", f"--prompt needs a byte-level target (257 tokens, as the shipped pair); this "
                                 f"one has {vocab}: give --prompt-ids")


def _tensor_parallel(args, argv):
    """The rank's :class:`tritree.dist.TPGroup` (None for one process). ``--tp N`` outside torchrun
    replaces this process with ``torchrun --standalone --nproc-per-node N -m tritree <argv>``."""
    want = getattr(args, "tp", None)
    if (want or 1) > 1 and "WORLD_SIZE" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={want}",
               "-m", "tritree", *argv]
        os.execv(sys.executable, cmd)
    if want is None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None
    from .dist import init_tp

    try:
        tp = init_tp(want)
    except ValueError as e:
        raise SystemExit(str(e))
    return tp if tp.active else None


# ---- memory: a per-GPU memory report from the configs alone (tritree/memory.py) ----------------------

def _gpu_mem(text: str) -> int:
    from .memory import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_memory_parser(sub) -> None:
    m = sub.add_parser("memory", help="per-GPU memory of a target + draft, from configs",
                       description="Per-GPU memory of a target + draft from their configs (no checkpoint, no GPU).")
    m.add_argument("--model",
                   help="target checkpoint directory (only its config.json is read); default: the Kimi K2.6 preset")
    m.add_argument("--draft", help="DFlash draft directory (only its config.json is read); "
                   "default: the K2.6 DFlash preset with the preset target, no draft with --model")
    m.add_argument("--no-draft", action="store_true", help="the target alone")
    m.add_argument("--tp", type=_int_at_least(1), default=8, help="tensor-parallel GPUs")
    m.add_argument("--expert-split", choices=["ep", "tp"], default="ep",
                   help="routed experts: ep = E/tp whole experts per GPU (tritree's layout), tp = every expert's "
                        "intermediate split over the GPUs on whole quantisation groups")
    m.add_argument("--ctx", type=_int_at_least(1), default=46_000, help="tokens per request the KV caches hold")
    m.add_argument("--batch", type=_int_at_least(1), default=1, help="requests")
    m.add_argument("--page-size", type=_page_size, default=64)
    m.add_argument("--experts", choices=["int4", "bf16", "fp8"], default="int4",
                   help="routed experts' format: int4 packed as the K2.6 checkpoint, bf16, fp8 128x128 blocks")
    m.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp8", "fp32"], default="bf16")
    m.add_argument("--no-activations", action="store_true", help="leave out the prefill activation estimate")
    m.add_argument("--gpu-mem", type=_gpu_mem, default=None,
                   help="memory per GPU for the verdict: 96 (= 96GB, 10^9 B), 89.4GiB, 97887MiB")


def memory(args) -> int:
    from .memory import format_report, memory_report
    from .model.config import kimi_k26, kimi_k26_dflash

    if args.draft and args.no_draft:
        _usage_error("memory", "--draft and --no-draft exclude each other")
    cfgs = {flag: _checkpoint_config("memory", flag, path, kind, weights=False) if path else None
            for flag, path, kind in (("--model", args.model, "target"), ("--draft", args.draft, "draft"))}
    cfg = cfgs["--model"] or kimi_k26()
    draft = cfgs["--draft"] or (None if args.no_draft or args.model else kimi_k26_dflash())
    title = f"{args.model or 'Kimi K2.6 (preset)'} + {args.draft or ('no draft' if draft is None else 'DFlash (preset)')}"
    try:
        rep = memory_report(cfg, draft, tp=args.tp, ctx=args.ctx, batch=args.batch, page_size=args.page_size,
                            kv_dtype=args.kv_dtype, experts=args.experts, expert_parallel=args.expert_split == "ep",
                            activations=not args.no_activations, title=title)
    except ValueError as e:
        _usage_error("memory", f"--tp {args.tp} --expert-split {args.expert_split}: {e}")
    print(format_report(rep, args.gpu_mem))
    return 0


TRAIN_OUT = "tritree-train-out"  # defaults that write: a new folder of the current directory, no tracked file
ACCEPT_PLOT = os.path.join("tritree-bench", "acceptance.png")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tritree", description="tritree: tree speculative decoding (DFlash draft + DDTree) with Triton kernels.",
        epilog="Without a command, or when the first argument is an option ('tritree --prompt x'), the command "
               "is generate. 'tritree COMMAND --help' shows a command's options.")
    # one short line per command: the listing must not wrap
    sub = ap.add_subparsers(dest="cmd", title="commands", metavar="COMMAND")
    gen = sub.add_parser("generate", help="speculative decoding of prompts (the default)",
                         description="Speculative decoding of a batch of prompts: target + DFlash draft + DDTree.")
    gen.add_argument("--model", help="target checkpoint directory (HF layout: config.json, model.safetensors or "
                                     "its index)")
    gen.add_argument("--draft", help="DFlash draft checkpoint directory (HF layout)")
    gen.add_argument("--prompt", action="append", help="a text prompt (repeatable; the shipped byte-level pair; "
                                                       "not with --prompt-ids)")
    gen.add_argument("--prompt-ids", type=_prompt_ids, help="prompts as token ids: '1,2,3;4,5' (default: built-in "
                                                            "prompts; not with --prompt)")
    gen.add_argument("--random", action="store_true", help="a tiny random pair instead of the shipped one")
    gen.add_argument("--chain", action="store_true", help="the DFlash chain (draft block size - 1 nodes) instead of "
                                                          "a DDTree; not with --budget")
    gen.add_argument("--batch", type=_int_at_least(1), default=2, help="random prompts when --prompt-ids is not given")
    gen.add_argument("--max-new-tokens", "-n", type=_int_at_least(1), default=None,
                     help="default 16 on the CPU, 64 on a GPU")
    gen.add_argument("--budget", type=_budget, default=None,
                     help="draft-tree nodes per step, or 'auto': sized each step by the step-cost model "
                          "(default: auto on a GPU, 8 on the CPU)")
    gen.add_argument("--max-budget", type=_int_at_least(1), default=64,
                     help="--budget auto: the largest tree (built at this size, verified at one of "
                          "tritree.budget.tree_buckets(N))")
    gen.add_argument("--cost-model", default=None,
                     help="--budget auto: step-cost JSON (bench calibrate); default ~/.cache/tritree/step_cost.json "
                          "when it has this GPU, else the analytic model")
    gen.add_argument("--temperature", type=_float_in(0.0, float("inf")), default=0.0)
    gen.add_argument("--top-k", type=_int_at_least(1), default=None)
    gen.add_argument("--top-p", type=_float_in(0.0, 1.0, lo_open=True), default=None)
    gen.add_argument("--stop", type=_int_at_least(0), action="append", default=[], help="stop token id (repeatable)")
    gen.add_argument("--page-size", type=_page_size, default=16)
    gen.add_argument("--num-pages", type=_int_at_least(1), default=1024)
    gen.add_argument("--eager", action="store_true", help="no CUDA graph")
    gen.add_argument("--compile", action="store_true", help="torch.compile the step (GPU)")
    gen.add_argument("--check", action="store_true", help="also decode without speculation and compare")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--tp", type=_int_at_least(1), default=None, help=TP_HELP)
    bench = sub.add_parser("bench", help="benchmarks: decode and calibrate (GPU), accept",
                           description="Benchmarks: 'decode' (the motivating scenario, GPU), 'calibrate' (the "
                                       "step-cost table of --budget auto, GPU), 'accept' (acceptance lengths of the "
                                       "shipped pair, CPU or GPU).")
    bench.add_argument("which", choices=["decode", "accept", "calibrate"])
    bench.add_argument("--prompts", type=_int_at_least(1), default=16, help="accept: held-out prompts")
    bench.add_argument("--prompt-len", type=_int_at_least(1), default=96, help="accept: prompt bytes")
    bench.add_argument("--fresh-prompts", action="store_true",
                       help="accept: cut prompts from this machine's held-out files instead of the shipped ones")
    bench.add_argument("--new", type=_int_at_least(1), default=48, help="accept: new tokens per prompt")
    bench.add_argument("--plot", default=ACCEPT_PLOT, help=f"accept: PNG path (default {ACCEPT_PLOT} under the "
                                                           "current directory)")
    bench.add_argument("--ctx", type=_int_at_least(1), default=46_000, help="committed context tokens")
    bench.add_argument("--gen", type=_int_at_least(1), default=160, help="tokens' worth of steps to time (steps = gen / 8)")
    bench.add_argument("--budgets", type=_budget, nargs="+", default=None,
                       help="decode: 7 16 64 (7 = the DFlash chain's size; 'auto': sized by the cost model, "
                            "at most --max-budget); accept: 8 16 32 64 128 (and 'auto')")
    bench.add_argument("--max-budget", type=_int_at_least(1), default=64,
                       help="decode 'auto' and calibrate: the largest tree (built at this size, verified at one of "
                            "tritree.budget.tree_buckets(N))")
    bench.add_argument("--cost-model", default=None,
                       help="decode 'auto': step-cost JSON (default as generate); accept: the table that sizes "
                            "'auto' (at each of its contexts) and models every mode's tokens/s")
    bench.add_argument("--grid-batch", type=_int_at_least(1), nargs="+", default=[1], help="calibrate: batches")
    bench.add_argument("--grid-ctx", type=_int_at_least(0), nargs="+", default=[4096, 16384, 46000],
                       help="calibrate: context lengths")
    bench.add_argument("--grid-tree", type=_int_at_least(1), nargs="+", default=None,
                       help="calibrate: tree tokens per request, root included (default 1 and "
                            "tritree.budget.tree_buckets(--max-budget))")
    bench.add_argument("--layers", type=_int_at_least(1), default=2,
                       help="target layers of the small slices (layer 0 dense, MoE after); layers past --layers + 1 "
                            "of the 61-layer slice share their routed experts")
    bench.add_argument("--batch", type=_int_at_least(1), default=None,
                       help="decode: requests (default 1); accept: prompts decoded together (default all)")
    bench.add_argument("--cost-gpu", default=None,
                       help="accept: the table of --cost-model to use (default this GPU's, or the file's only one)")
    bench.add_argument("--out", default=None, help="append JSON rows here (calibrate: the step-cost JSON, default "
                                                   "~/.cache/tritree/step_cost.json, other GPUs' tables kept)")
    bench.add_argument("--tp", type=int, default=None, help="decode: " + TP_HELP)
    bench.add_argument("--compile", action="store_true",
                       help="decode: the step under torch.compile (eager and captured; the 61-layer step compiles "
                            "every layer: minutes)")
    bench.add_argument("--profile", action="store_true",
                       help="decode: also print a cProfile of the eager steps (the first slice of each budget)")
    bench.add_argument("--experts", choices=["int4", "bf16"], default="int4",
                       help="decode: routed experts INT4 packed (the W4A16 op) or bf16 (the grouped bf16 path)")
    tr = sub.add_parser("train", help="train the tiny target + DFlash draft",
                        description="Train the tiny target + DFlash draft on the Python standard library's source.")
    tr.add_argument("--out", default=TRAIN_OUT,
                    help=f"output directory: target/, draft/, TRAINING.md (default {TRAIN_OUT} under the current "
                         "directory; the shipped pair is tritree/assets/tiny)")
    tr.add_argument("--target-steps", type=int, default=1500)
    tr.add_argument("--draft-steps", type=int, default=1500)
    tr.add_argument("--batch", type=int, default=16)
    tr.add_argument("--seq", type=int, default=128)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--device", default=None)
    d = sub.add_parser("demo", help="verify-attention kernel check (+ timing on a GPU)",
                       description="The verify-attention kernel checked against the float64 reference (+ timing "
                                   "on a GPU).")
    for p in (d,):
        p.add_argument("--batch", "-B", type=int, default=1)
        p.add_argument("--tree", "-T", type=int, default=16, help="tree tokens per request, root included")
        p.add_argument("--heads", "-H", type=int, default=8, help="query heads (8 = Kimi K2.6 at TP8)")
        p.add_argument("--context", "-L", type=int, default=None, help="committed tokens (46000 on a GPU, 200 on the CPU)")
        p.add_argument("--page-size", "-P", type=int, default=64)
        p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None)
        p.add_argument("--seed", type=int, default=0)
    _add_memory_parser(sub)
    return ap


def main(argv=None) -> int:
    ap = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # generate is the default command; -h / --help alone is the top-level help that lists the commands
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["generate", *argv]
    args = ap.parse_args(argv)
    if args.cmd == "memory":  # no kernel runs: before the interpreter re-exec
        return memory(args)
    if args.cmd == "train":
        from .train import main as train_main
        return train_main(args)
    if args.cmd == "bench" and args.which in ("calibrate", "decode") and not torch_has_gpu():
        _usage_error(f"bench {args.which}", "needs a CUDA GPU (it times decode steps there); none is visible")
    if args.cmd == "generate":
        _check_generate(args)
    _ensure_interpreter_without_gpu()
    if args.cmd == "demo":
        return demo(args)
    tp = _tensor_parallel(args, argv) if args.cmd == "generate" or (
        args.cmd == "bench" and args.which == "decode") else None
    try:
        return _dispatch(args, tp)
    finally:
        if tp is not None:
            from .dist import shutdown_tp

            shutdown_tp()


def _dispatch(args, tp) -> int:
    if args.cmd == "bench":
        if args.which == "accept":
            if not torch_has_gpu():
                os.environ["TRITON_INTERPRET"] = "0"  # the CPU reference path: the interpreter is too slow here
            from .bench_accept import main as accept_main
            args.cost_table = None if args.cost_model is None else _accept_cost_table(args.cost_model, args.cost_gpu)
            args.budgets = args.budgets or [8, 16, 32, 64, 128]
            return accept_main(args)
        if args.which == "calibrate":
            from .bench_decode import calibrate
            return calibrate(args)
        from .bench_decode import main as bench_main
        args.batch = args.batch or 1
        args.budgets = args.budgets or [7, 16, 64]
        if "auto" in args.budgets:
            args.cost_model, how = _cost_model("bench decode", args.cost_model, torch_has_gpu())
            print(f"budget auto: at most {args.max_budget} nodes; step cost: {how}")
        return bench_main(args, tp)
    import torch
    gpu = torch.cuda.is_available()
    if args.max_new_tokens is None:
        args.max_new_tokens = 64 if gpu else 16
    if args.budget is None:
        args.budget = "auto" if gpu else 8
    return generate(args, tp)


if __name__ == "__main__":
    sys.exit(main())
