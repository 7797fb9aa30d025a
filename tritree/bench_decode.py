"""``python -m tritree bench decode``: the motivating scenario on a GPU. A real-shape Kimi K2.6 slice holding
exactly the weights one rank of TP8 reads each step (rank 0: 8 of 64 heads, 48 of 384 INT4 experts with the real
top-8 routing over all 384, an eighth of the shared expert and the dense MLP, the vocabulary-parallel embedding
and LM head, the DFlash draft's shard; a few layers, random weights; routed experts bf16 with ``--experts
bf16``), with paged caches filled to ``--ctx`` tokens; its collectives are left out (:func:`slice_group`: an
all-reduce returns the rank's own part, a gather repeats it, so the step's other work and its shapes are the
rank's). Reports the decode step per phase (eager, CUDA events; and each phase alone in a CUDA graph, which
leaves out host launch time) and as one CUDA graph, and the verify attention against its floor, at
``--layers`` target layers and at all 61: the TP8 rank's step without its collectives, measured (past the first
``--layers + 1`` layers each layer reads the routed experts of one of the slice's MoE layers:
:func:`share_routed_experts`; one GPU holds the rank's 61 layers but not their 71 GB of experts), and a MoE
layer as the mean of the layers between the two. Not extrapolated from two small slices: a graph's fixed costs
change with its node count (the driver may run the step's device-to-device copies on the copy engine in one
graph and as kernels in another), so the difference of a 2- and a 3-layer graph is not a layer's cost.

Under ``torchrun --nproc-per-node N -m tritree bench decode --tp N`` every rank holds its real shard of
the slice instead (64/N heads, 384/N experts, vocabulary-parallel head, the draft's shard:
:func:`tritree.model.parallel.shard_draft_config`) and the step includes the collectives; rank 0 prints, with
the step's graph time with every collective left out (``without_collectives``) and from the two the
collectives' share of the step.

A budget ``"auto"`` builds trees of ``max_budget`` nodes and sizes each step by the step-cost model
(:mod:`tritree.budget`; the slice's random draft is near-uniform, so its trees are short: the row shows
the mechanism's cost, not a trained draft's sizes). ``python -m tritree bench calibrate`` (:func:`calibrate`)
times the step of this slice over a grid of batch, context and tree size and writes the step-cost JSON.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from .budget import AnalyticCost, CostTable, fit_cost, tabulate
from .dist import TPGroup, active
from .model import dflash
from .model.config import kimi_k26, kimi_k26_dflash
from .model.kimi_k2 import to_kernel_layout_
from .roofline import append_jsonl, profile_text
from .step import (
    AutoStep,
    PhaseTimer,
    SamplingConfig,
    accept_phase,
    auto_sizer,
    commit_phase_,
    decode_step_,
    draft_phase_,
    tree_buffers,
    tree_phase,
    tree_step_,
    verify_step_,
)

# Spread of a uniform random nibble minus 8 (q in [-8, 7]): sqrt((16^2 - 1) / 12).
_Q_STD = (255 / 12) ** 0.5


# The target's residual branches' output weights (attention o_proj, every down projection: dense MLP, shared and
# routed experts) are scaled by this, so that the residual stream stays near the token embeddings. With plain
# N(0, 1 / fan_in) weights the tree's hidden states converge with depth (the same attention output over the random
# context, and the MLPs' outputs of it, outweigh the embeddings), and the deeper layers of a 61-layer slice route a
# 65-node tree to a third of the experts uniform top-8 routing reaches; with this scale the layers route 5-7% below
# it on average (bench/RESULTS.md, "Decode step by kernel family"). Kernel times do not depend on the values.
BRANCH_SCALE = 2e-4
_BRANCH_OUTPUTS = ("o_proj.weight", "down_proj.weight", "mlp.experts.w2_scale")


def _random_params(shapes: dict, device, dtype, branch_scale: float = 1.0):
    """Random weights of ``shapes``: matrices ``N(0, 1 / fan_in)`` in ``dtype`` (the router's too, as loaded), norms
    1, the router's bias float32 zeros; INT4 experts (``*_packed`` / ``*_scale``,
    :func:`tritree.model.kimi_k2.param_shapes`) as random words and scales of the same spread, drawn directly
    (quantising real-shape float weights would cost far more). Residual branches' output weights (and the routed
    experts' down scales) times ``branch_scale``."""
    out = {}
    for k, shape in shapes.items():
        scale = branch_scale if k.endswith(_BRANCH_OUTPUTS) else 1.0
        if k.endswith("_packed"):  # int32 words of 8 uniform nibbles
            out[k] = torch.randint(-2**31, 2**31 - 1, shape, device=device, dtype=torch.int32)
        elif k.endswith("_scale"):  # groups of 32 columns: fan_in = 32 x the scale columns
            out[k] = torch.full(shape, scale * (32 * shape[-1]) ** -0.5 / _Q_STD, device=device, dtype=torch.bfloat16)
        elif k.endswith("norm.weight") or "layernorm" in k:
            out[k] = torch.ones(shape, device=device, dtype=dtype)
        elif k.endswith("e_score_correction_bias"):
            out[k] = torch.zeros(shape, device=device, dtype=torch.float32)
        else:
            t = torch.randn(shape, device=device, dtype=dtype)
            out[k] = t.mul_(scale * shape[-1] ** -0.5)
    return out


SLICE_WORLD = 8  # the deployment the single-GPU slice is one rank of


def slice_group(tp=None) -> TPGroup:
    """The group a slice's step runs under: ``tp`` under tensor parallelism, else rank 0 of TP8 with every
    collective left out (:func:`without_collectives`)."""
    return tp if active(tp) else without_collectives(TPGroup(SLICE_WORLD, 0))


def build(layers: int, ctx: int, budget: int, batch: int, page_size: int = 64, dtype=torch.bfloat16, device="cuda",
          tp=None, experts: str = "int4", own_layers: int | None = None):
    """The slice's configs (the rank's views), random weights and a filled decode state; run its step under
    :func:`slice_group` ``(tp)``. ``experts``: the routed experts ``"int4"`` (packed as K2.6's checkpoint) or
    ``"bf16"`` (dense, the bf16 grouped path). ``own_layers``: only the first ``own_layers`` target layers
    hold routed experts of their own (:func:`share_routed_experts`; every other weight is each layer's own),
    so that all 61 layers of a rank fit one GPU. Seeded (``torch.manual_seed(0)``): the same shapes give the same
    weights, hence the same routing, in every tool that builds the slice (``bench decode``, ``bench calibrate``,
    ``bench/step_profile.py``) and on every rank."""
    layout = {"int4": "int4", "bf16": "dense"}[experts]
    from .model.parallel import local_draft_shapes, local_param_shapes, shard_config, shard_draft_config

    group = slice_group(tp)
    torch.manual_seed(0)
    full = kimi_k26(num_hidden_layers=layers, weight_prefix="")
    held = layers if own_layers is None else own_layers
    if not full.first_k_dense_replace < held <= layers:
        raise ValueError(f"own_layers must hold a MoE layer and at most the {layers} layers: "
                         f"{full.first_k_dense_replace + 1} <= own_layers <= {layers}, got {own_layers}")
    tcfg, shapes = shard_config(full, group), local_param_shapes(full, group, layout)
    shapes = {k: v for k, v in shapes.items() if ".mlp.experts." not in k or int(k.split(".")[2]) < held}
    # The slice has only the first layers; the draft taps them instead of layers 1, 12, ..., 58 (same
    # shapes and cost, other values).
    dfull = kimi_k26_dflash(target_layer_ids=tuple(min(i, layers - 1) for i in kimi_k26_dflash().target_layer_ids))
    tparams = to_kernel_layout_(_random_params(shapes, device, dtype, BRANCH_SCALE), device)  # as the Engine holds them
    if held < layers:  # then the later layers' shared-expert rows (their experts are in the kernel layout)
        to_kernel_layout_(share_routed_experts(tparams, held, layers, full.first_k_dense_replace), device)
    dparams = dflash.to_kernel_layout_(_random_params(local_draft_shapes(dfull, group), device, dtype))
    dcfg = shard_draft_config(dfull, group)
    T = budget + 1
    accepted = min(5, T)  # ~5 tokens accepted last step: the draft's pending context
    cap = ctx + 4 * T + 64
    pages_per = math.ceil(cap / page_size)
    num_pages = pages_per * batch
    page_table = torch.arange(num_pages, dtype=torch.int32, device=device).view(batch, pages_per)
    state = {
        "tkv": torch.randn(layers, num_pages, page_size, tcfg.latent_dim, device=device, dtype=dtype),
        "dkv": torch.randn(dcfg.num_hidden_layers, num_pages, page_size, 2, dcfg.num_key_value_heads, dcfg.head_dim,
                           device=device, dtype=dtype),
        "page_table": page_table,
        "kv_lens": torch.full((batch,), ctx, dtype=torch.int32, device=device),
        "dlens": torch.full((batch,), ctx, dtype=torch.int32, device=device),
        "anchor": torch.randint(0, tcfg.vocab_size, (batch,), dtype=torch.int32, device=device),
        "pending": torch.randn(batch, T, dcfg.n_taps, tcfg.hidden_size, device=device, dtype=dtype),
        "pending_n": torch.full((batch,), accepted, dtype=torch.int32, device=device),
        "active": torch.ones(batch, dtype=torch.bool, device=device),
        "step": torch.zeros(1, dtype=torch.int64, device=device),
        "emitted": torch.full((batch, T), -1, dtype=torch.int32, device=device),
        "n_emitted": torch.zeros(batch, dtype=torch.int32, device=device),
        **tree_buffers(batch, T, device),
    }
    state["dlens"] -= accepted
    return tcfg, dcfg, tparams, dparams, state


def state_reset(state: dict):
    """``reset()``: the entries of ``state`` that a decode step advances and reads (``kv_lens``, ``dlens``,
    ``anchor``, ``pending_n``, ``step``) back to their values now, in place (copies kept here), so that timed
    steps repeat the same one."""
    saved = {k: state[k].clone() for k in ("kv_lens", "dlens", "anchor", "pending_n", "step")}

    def reset():
        for k, v in saved.items():
            state[k].copy_(v)
    return reset


def share_routed_experts(params: dict, held: int, layers: int, first_moe: int) -> dict:
    """Routed experts for target layers ``held .. layers - 1`` of ``params``, in place: layer ``i`` gets the very
    expert tensors (keys ``mlp.experts.*``) of MoE layer ``first_moe + (i - first_moe) % (held - first_moe)`` (no
    copy); its other weights are its own. A step still streams every layer's expert bytes from DRAM: the experts
    a layer's tokens touch (hundreds of MB a rank) are far more than the L2 (50 MB on an H100) holds between two
    layers that share them. Returns ``params``."""
    if not first_moe < held <= layers:
        raise ValueError(f"held must own a MoE layer and at most {layers} layers: {first_moe + 1} <= held <= "
                         f"{layers}, got {held}")
    owned = held - first_moe
    for i in range(held, layers):
        src = f"model.layers.{first_moe + (i - first_moe) % owned}."
        dst = f"model.layers.{i}."
        for k in [k for k in params if k.startswith(src + "mlp.experts.")]:
            params[dst + k[len(src):]] = params[k]
    return params


def graph_phases_ms(tparams, tcfg, dp, dcfg, state, budget, sampling, reset, reps, tp) -> dict:
    """Each non-target phase of one step alone in a CUDA graph (ms), on the step's own intermediate
    tensors; the draft and commit phases first restore the lengths they advance."""
    from .model.kimi_k2 import verify
    from .roofline import graph_time_us

    reset()
    dlens0, kv_lens0 = state["dlens"].clone(), state["kv_lens"].clone()

    def draft():
        state["dlens"].copy_(dlens0)
        return draft_phase_(tparams, dp, dcfg, state, budget + 1, tp=tp)

    draft_logits = draft()
    tokens, parents, depth, tree_mask, tree_lens, _ = tree_phase(draft_logits, state["anchor"], budget)
    tcache = {"kv": state["tkv"], "page_table": state["page_table"], "kv_lens": state["kv_lens"]}
    logits, _ = verify(tparams, tcfg, tokens, depth, tree_mask, tcache, tree_lens, taps=tuple(dcfg.target_layer_ids),
                       tp=tp)
    idx, n, _ = accept_phase(tcfg, tokens, parents, tree_lens, logits, state["active"], sampling, state["step"], tp=tp)

    def commit():
        state["kv_lens"].copy_(kv_lens0)
        commit_phase_(state, idx, n)

    fns = {"draft": draft, "tree": lambda: tree_phase(draft_logits, state["anchor"], budget),
           "accept": lambda: accept_phase(tcfg, tokens, parents, tree_lens, logits, state["active"], sampling,
                                          state["step"], tp=tp),
           "commit": commit}
    out = {k: graph_time_us([f], reps=reps) / 1e3 for k, f in fns.items()}
    reset()
    return out


@dataclass(frozen=True)
class _LocalOnly(TPGroup):
    """A group whose collectives are left out: a sum over the ranks returns the rank's own part; a gather puts
    the rank's part in its place and the dtype's lowest value in the other ranks' places, so that picks over a
    gathered vocabulary (the draft's tree, greedy picks) come from the rank's own shard, whose embedding rows the
    rank holds (repeated parts would make 7 in 8 tree tokens other ranks' ids, which embed to zeros here: every
    token would then route to the same experts)."""

    def all_reduce_(self, x):
        return x

    def all_gather(self, x):
        low = torch.finfo(x.dtype).min if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        out = torch.full((self.world, *x.shape), low, dtype=x.dtype, device=x.device)
        out[self.rank] = x
        return out


def without_collectives(tp: TPGroup) -> TPGroup:
    """``tp``'s shard and ranks with every collective left out: the step timed with it, against the
    real one, gives the share of the step spent in collectives. Wrong results by design; timing only."""
    return _LocalOnly(tp.world, tp.rank, tp.group)


def run(layers: int, ctx: int, budget: int, batch: int, reps: int = 20, tp=None, experts: str = "int4",
        auto: bool = False, cost_model=None, profile: bool = False, compile: bool = False,
        own_layers: int | None = None) -> dict:
    """One row of the benchmark (the slice of :func:`build` ``(layers, ..., own_layers=own_layers)``). ``auto``:
    trees of ``budget`` nodes sized each step by ``cost_model`` (default the slice's
    :class:`tritree.budget.AnalyticCost`); the row then has ``tree_nodes_mean``.
    ``host_ms``: the Python time of one eager step (to its return, before the synchronisation: the GPU
    runs behind it); ``profile``: also print a cProfile of ``reps`` eager steps; ``compile``: the step under
    ``torch.compile`` (as ``Engine(compile=True)`` runs it), eager and captured, without the per-phase split."""
    from .roofline import (
        ceilings_source,
        device_ceilings,
        graph_time_us,
        median_event_ms,
        rotation_count,
        verify_mla_counts,
    )

    tcfg, dcfg, tparams, dp, state = build(layers, ctx, budget, batch, tp=tp, experts=experts, own_layers=own_layers)
    reset = state_reset(state)
    sampling = SamplingConfig()

    step_fn, tree_fn, verify_fn = ((torch.compile(f, dynamic=False) for f in (decode_step_, tree_step_, verify_step_))
                                   if compile else (decode_step_, tree_step_, verify_step_))
    auto_step = None
    if auto:  # the engine's auto step: the tree graph, the host read of the size, that size's verify graph
        model = cost_model or AnalyticCost.from_params(tparams, tcfg, dp, dcfg, state["tkv"].element_size(),
                                                       torch.cuda.get_device_name())
        cost = tabulate(model, batch, budget, ctx + budget + 1, state["tkv"].device)
        auto_step = AutoStep((tparams, tcfg, dp, dcfg), state, budget, sampling, cost.trees, auto_sizer(state, cost),
                             graphs=True, tp=slice_group(tp), step_fns=(tree_fn, verify_fn))

    def step(timer=None, group=slice_group(tp)):
        reset()
        if auto_step is not None:
            auto_step.tp = group
            auto_step(None if compile else timer)
            return
        step_fn(tparams, tcfg, dp, dcfg, state, budget=budget, sampling=sampling,
                timer=None if compile else timer, tp=group)

    step()
    torch.cuda.synchronize()
    phases = {}
    eager_ms, host_ms, sizes = [], [], []
    for _ in range(reps):
        timer = PhaseTimer(True, "cuda")
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        step(timer)
        host_ms.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        eager_ms.append(a.elapsed_time(b))
        sizes.extend(state["tree_lens"].tolist())
        for k, v in timer.durations_ms().items():
            phases.setdefault(k, []).append(v)
    med = {k: sorted(v)[len(v) // 2] for k, v in phases.items()}
    if profile:
        text = profile_text(step, reps, 40, ("tottime", "cumulative"))
        print(f"cProfile of {reps} eager steps, {text}", flush=True)
    if auto_step is not None:  # two graphs and a host read a step: timed whole, between events
        def replayed():
            reset()
            auto_step()
        graph_ms = median_event_ms(replayed, reps=reps)
    else:
        graph_ms = graph_time_us([step], reps=reps) / 1e3
    graph_ms_local = None
    if active(tp) and auto_step is None:
        local = without_collectives(tp)
        graph_ms_local = graph_time_us([lambda: step(group=local)], reps=reps) / 1e3
        reset()
    phases_graph = {} if active(tp) or auto else graph_phases_ms(tparams, tcfg, dp, dcfg, state, budget, sampling,
                                                                 reset, reps, slice_group(tp))
    # the verify attention alone at this shape, per layer, called as the model calls it (with tree_lens:
    # without them verify_mla fills a tensor of T's, one more graph node)
    from .kernels import verify_mla
    from .testing import random_verify_inputs
    # Pages as the step's pool holds them (each request's pages in one contiguous run, as PagePool hands
    # a fresh pool's pages out and ``build`` lays them out), and randomly permuted (a fragmented pool)
    # beside it. Timed as bench/verify_sweep times it: calls over input sets rotated past the L2, captured
    # back to back in one graph, as the step's graph runs it among its other kernels. One call a graph
    # replay (reported beside it) also times the replay's own launch.
    T = budget + 1
    attn = {}
    sets_per = rotation_count(batch * (ctx + T) * 576 * 2)
    for fragmented in (False, True):
        fns = []
        for seed in range(sets_per):
            case = random_verify_inputs(batch, T, tcfg.heads, 64, [ctx] * batch, [T] * batch, ("wide",),
                                        torch.bfloat16, seed=seed, fragmented=fragmented, device="cuda")
            args = (case["q"], case["kv"], case["page_table"], case["kv_lens"], case["tree_mask"])
            fns.append(lambda a=args, c=case: verify_mla(*a, sm_scale=tcfg.softmax_scale, tree_lens=c["tree_lens"]))
        attn[fragmented] = graph_time_us(fns)
        if not fragmented:
            attn["one call a replay"] = graph_time_us(fns[:1])
        del fns
    attn_us = attn[False]
    ceil = device_ceilings()
    nbytes, flops = verify_mla_counts(batch, T, tcfg.heads, ctx)
    floor_us, bound = ceil.floor_us(nbytes, flops)
    return dict(layers=layers, ctx=ctx, budget=budget, batch=batch, experts=experts, auto=auto,
                tree_nodes_mean=sum(sizes) / len(sizes) - 1, eager_ms=sorted(eager_ms)[len(eager_ms) // 2],
                host_ms=sorted(host_ms)[len(host_ms) // 2],
                graph_ms=graph_ms, graph_ms_without_collectives=graph_ms_local, phases_ms=med,
                phases_graph_ms=phases_graph, verify_attention_us=attn_us, verify_attention_fragmented_us=attn[True],
                verify_attention_one_replay_us=attn["one call a replay"],
                verify_attention_floor_us=floor_us,
                floor_bound=bound, matmul_tflops=ceil.matmul_tflops, copy_gbps=ceil.copy_gbps,
                ceilings=ceilings_source())


def main(args, tp=None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench decode needs a GPU")
        return 1
    say = print if tp is None or tp.rank == 0 else (lambda *a, **k: None)
    experts = getattr(args, "experts", "int4")
    where = (f"TP{tp.world} rank, collectives included" if active(tp) else "TP8 rank 0, collectives left out") + (
        f", {experts} routed experts")
    rows = []
    for budget in args.budgets:
        per = {}
        auto = budget == "auto"
        size = args.max_budget if auto else budget
        full = kimi_k26().num_hidden_layers
        counts = [args.layers] + ([full] if args.layers < full else [])
        for layers in counts:
            # the full step's layers past args.layers + 1 share the routed experts of its MoE layers (one GPU holds it)
            r = run(layers, args.ctx, size, args.batch, reps=max(5, min(50, args.gen // 8)), tp=tp, experts=experts,
                    auto=auto, cost_model=getattr(args, "cost_model", None),
                    profile=getattr(args, "profile", False) and layers == args.layers,
                    compile=getattr(args, "compile", False), own_layers=min(layers, args.layers + 1))
            per[layers] = r
            rows.append(r)
            ph = ", ".join(f"{k} {v:.3f}" for k, v in r["phases_ms"].items())
            chosen = f"; tree nodes chosen: mean {r['tree_nodes_mean']:.2f} of {size}" if auto else ""
            say(f"budget {budget:>3} layers {layers}: eager {r['eager_ms']:.3f} ms, graph {r['graph_ms']:.3f} ms "
                f"(host overhead {r['eager_ms'] - r['graph_ms']:.3f} ms, host time {r['host_ms']:.3f} ms); phases ms: {ph}{chosen}", flush=True)
            if r["graph_ms_without_collectives"] is not None:
                share = 1 - r["graph_ms_without_collectives"] / r["graph_ms"]
                say(f"budget {budget:>3} layers {layers}: graph without collectives "
                    f"{r['graph_ms_without_collectives']:.3f} ms: collectives {100 * share:.1f}% of the step", flush=True)
        a, f = per[args.layers], per[counts[-1]]
        moe_layer = (f["graph_ms"] - a["graph_ms"]) / max(1, f["layers"] - a["layers"])
        step_ms = f["graph_ms"]
        verify_share = f["layers"] * f["verify_attention_us"] / 1e3
        ph = f["phases_ms"]
        non_target = ph.get("draft", 0) + ph.get("tree", 0) + ph.get("accept", 0) + ph.get("commit", 0)
        say(f"budget {budget:>3}: {f['layers']}-layer step {step_ms:.2f} ms as one graph, eager {f['eager_ms']:.2f} ms "
            f"(host overhead {f['eager_ms'] - step_ms:.2f} ms) ({where}; layers past {args.layers + 1} sharing its MoE "
            f"layers' routed experts); a MoE layer {1e3 * moe_layer:.1f} us (the mean of the {f['layers'] - a['layers']} "
            f"past the {args.layers}-layer step); verify attention "
            f"{f['verify_attention_us']:.1f} us/layer vs floor "
            f"{f['verify_attention_floor_us']:.1f} us ({f['verify_attention_us'] / f['verify_attention_floor_us']:.2f}x, "
            f"{f['floor_bound']}, matmul {f['matmul_tflops']:.0f} TFLOP/s {f['ceilings']}; fragmented pool {f['verify_attention_fragmented_us']:.1f} us; one call a graph "
            f"replay {f['verify_attention_one_replay_us']:.1f} us), {verify_share:.1f} ms "
            f"over {f['layers']} layers; draft+tree+accept+commit {non_target:.2f} ms "
            f"= {100 * non_target / step_ms:.1f}% of the step (eager phases)", flush=True)
        row = dict(budget=budget, experts=experts, moe_layer_ms=moe_layer, step61_ms=step_ms, non_target_ms=non_target)
        pg = f.get("phases_graph_ms") or {}
        if pg:
            non_target_graph = pg["draft"] + pg["tree"] + pg["accept"] + pg["commit"]
            say(f"budget {budget:>3}: each phase alone in a CUDA graph, ms: "
                + ", ".join(f"{k} {v:.3f}" for k, v in pg.items())
                + f" (commit over {f['layers']} layers); draft+tree+accept+commit {non_target_graph:.2f} ms "
                f"= {100 * non_target_graph / step_ms:.1f}% of the step (graph-timed)", flush=True)
            row.update(non_target_graph_ms=non_target_graph)
        rows.append(row)
    if tp is None or tp.rank == 0:
        append_jsonl(args.out, [dict(r, tp=tp.world) for r in rows] if active(tp) else rows)
    return 0


def _calibrate_slice(ctx, batch, static, trees, experts, reps, own_layers) -> tuple[list[float], list[float]]:
    """Timed steps (ms) of the slice of all the target's layers (:func:`build`, the routed experts of layers past
    ``own_layers`` shared): ``(auto, captured)``, ``auto[t]`` the auto step (:class:`AutoStep`: the draft and tree
    graph at ``static`` tree tokens, the host read of the size, the verify graph of ``trees[t]`` tokens; between
    CUDA events), ``captured[t]`` one graph captured at ``trees[t]`` tree tokens (a fixed-budget step, graph-timed,
    each size on a slice of its own). One slice at a time on the GPU."""
    auto = _auto_steps_ms(ctx, batch, static, trees, experts, reps, own_layers)
    captured = []
    for T in trees:
        torch.cuda.empty_cache()  # the previous slice's weights and caches
        captured.append(_captured_step_ms(ctx, batch, T, experts, reps, own_layers))
    torch.cuda.empty_cache()
    return auto, captured


def _slice_and_reset(ctx, batch, T, experts, own_layers):
    """:func:`build` of all the target's layers at tree size ``T``, and the reset of its state's mutable entries."""
    built = build(kimi_k26().num_hidden_layers, ctx, T - 1, batch, experts=experts, own_layers=own_layers)
    return built, state_reset(built[-1])


def _auto_steps_ms(ctx, batch, static, trees, experts, reps, own_layers) -> list[float]:
    from .roofline import median_event_ms

    (tcfg, dcfg, tparams, dp, state), reset = _slice_and_reset(ctx, batch, static, experts, own_layers)
    auto = []
    for j, T in enumerate(trees):
        pick = torch.full((1,), j, dtype=torch.int64, device=state["anchor"].device)
        step = AutoStep((tparams, tcfg, dp, dcfg), state, static - 1, SamplingConfig(), trees,
                        lambda scores, lens, T=T: (torch.clamp(lens, max=T), pick), graphs=True, tp=slice_group())
        auto.append(median_event_ms(lambda: (reset(), step()), reps=reps, warmup=3))
        for g in step.graphs():
            g.reset()
    return auto


def _captured_step_ms(ctx, batch, T, experts, reps, own_layers) -> float:
    from .roofline import graph_time_us

    (tcfg, dcfg, tparams, dp, state), reset = _slice_and_reset(ctx, batch, T, experts, own_layers)
    sampling = SamplingConfig()

    def fixed():
        reset()
        decode_step_(tparams, tcfg, dp, dcfg, state, budget=T - 1, sampling=sampling, tp=slice_group())
    return graph_time_us([fixed], reps=reps) / 1e3


def calibrate(args) -> int:
    """``python -m tritree bench calibrate``: the step-cost table of ``--budget auto`` on this GPU.

    For every (batch, context) of the grid, the slice of :func:`build` with all 61 target layers (the routed experts
    of layers past ``--layers + 1`` shared, as ``bench decode`` measures its step): the auto step (the draft and
    tree graph at the static tree of ``--max-budget + 1`` tokens, the host read of the size, the verify graph of
    each grid size; the sizes of :func:`tritree.budget.tree_buckets` and the root alone by default) timed between
    CUDA events (median), beside each grid size in one graph captured at that size (a fixed-budget step):
    ``step_ms`` and ``captured_ms`` of the table, printed side by side. What is measured: draft, tree build,
    verify (rank 0 of TP8: :func:`build`, no collectives), accept, commit. Written into ``--out`` (default
    :data:`tritree.budget.DEFAULT_COST_PATH`) under this GPU's name, other GPUs' tables kept."""
    from .budget import DEFAULT_COST_PATH, save_cost_table, tree_buckets

    static = args.max_budget + 1
    trees = args.grid_tree or [1, *tree_buckets(args.max_budget)]
    trees = sorted(set(t for t in trees if t <= static) | {static})
    full, own = kimi_k26().num_hidden_layers, args.layers + 1
    reps = max(5, min(50, args.gen // 8))
    batches, ctxs = sorted(set(args.grid_batch)), sorted(set(args.grid_ctx))  # the schema's increasing axes
    grid = []
    for B in batches:
        per_ctx = []
        for L in ctxs:
            row, crow = _calibrate_slice(L, B, static, trees, args.experts, reps, own)
            if any(v < u for u, v in zip(crow, crow[1:])):  # a larger tree never reads fewer bytes
                print(f"batch {B} ctx {L}: warning: the captured step falls with the tree size (timing noise); the "
                      f"sizer reads the table made non-decreasing in the size; --gen sets how many steps are timed",
                      flush=True)
            print(f"batch {B} ctx {L}: {full}-layer step ms at tree " + ", ".join(
                f"{t}: auto {v:.2f}, one graph {c:.2f} ({v / c:.3f}x)" for t, v, c in zip(trees, row, crow)), flush=True)
            per_ctx.append((row, crow))
        grid.append(per_ctx)
    gpu = torch.cuda.get_device_name()
    table = CostTable(gpu, tuple(batches), tuple(ctxs), tuple(trees),
                      tuple(tuple(tuple(r) for r, _ in g) for g in grid), static,
                      f"python -m tritree bench calibrate: Kimi K2.6 TP8 rank-0 slice ({args.experts} experts, "
                      f"no collectives), all {full} target layers (the routed experts of layers past {own} shared); "
                      f"captured_ms: each tree size in one graph; step_ms: the auto step (tree graph at {static} "
                      f"tokens, host read, verify graph of the size)",
                      tuple(tuple(tuple(c) for _, c in g) for g in grid))
    out = args.out or DEFAULT_COST_PATH
    save_cost_table(out, table)
    print(f"wrote the step-cost table for {gpu} to {out}")
    model = dataclasses.replace(slice_cost_model(args.experts, gpu), layer_ms=0.0, scales=(1.0, 1.0, 1.0, 1.0))
    for captured in (True, False):
        fitted, err = fit_cost(model, table, captured=captured)
        print(f"analytic model fitted to the {'captured' if captured else 'auto'} steps (RECORDED_COST_FITS entry): "
              f"({fitted.layer_ms:.4f}, ({', '.join(f'{s:.4f}' for s in fitted.scales)})), largest error "
              f"{100 * err:.1f}%", flush=True)
    return 0


def slice_cost_model(experts: str = "int4", gpu: str | None = None) -> AnalyticCost:
    """The analytic step cost of the whole K2.6 model on rank 0 of TP8 (61 layers; the slice's per-layer shapes),
    from meta tensors."""
    from .model.parallel import local_draft_shapes, local_param_shapes, shard_config, shard_draft_config

    group = slice_group()
    full = kimi_k26(weight_prefix="")
    dfull = kimi_k26_dflash()

    def meta(shapes):
        return {k: torch.empty(s, device="meta", dtype=torch.int32 if k.endswith("_packed") else torch.float32
                               if k.endswith("e_score_correction_bias") else torch.bfloat16) for k, s in shapes.items()}
    tparams = meta(local_param_shapes(full, group, {"int4": "int4", "bf16": "dense"}[experts]))
    return AnalyticCost.from_params(tparams, shard_config(full, group), meta(local_draft_shapes(dfull, group)),
                                    shard_draft_config(dfull, group), 2, gpu)
