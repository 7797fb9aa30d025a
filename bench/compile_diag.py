"""Which op breaks torch.compile of the model's verify? Compares compiled against eager with parts
swapped for their PyTorch references (a diagnostic run, GPU)."""

import torch

from tritree import tree_mask_from_parents
from tritree.kernels import kv_cache, moe
from tritree.model import kimi_k2
from tritree.model.config import kimi_tiny
from tritree.testing import paged_layout, random_trees


def case():
    cfg = kimi_tiny()
    params = kimi_k2.init_params(cfg, seed=0, device="cuda")
    B, T, L = 2, 8, 20
    pt, n_pages = paged_layout([L + T] * B, B, 8)
    kv = torch.randn(cfg.num_hidden_layers, n_pages, 8, cfg.latent_dim, device="cuda")
    cache = {"kv": kv, "page_table": pt.cuda(), "kv_lens": torch.full((B,), L, dtype=torch.int32, device="cuda")}
    parents = random_trees(B, T).cuda()
    mask, depth = tree_mask_from_parents(parents)
    tokens = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    return cfg, params, cache, tokens, depth, mask


def check(name):
    torch._dynamo.reset()
    cfg, params, cache, tokens, depth, mask = case()
    eager = kimi_k2.verify(params, cfg, tokens, depth, mask, cache)[0]
    fn = torch.compile(lambda t: kimi_k2.verify(params, cfg, t, depth, mask, cache)[0])
    got = fn(tokens)
    print(f"{name:40s} max |compiled - eager| = {(got - eager).abs().max().item():.3g}", flush=True)


check("as shipped")
orig_re, orig_kw = kimi_k2.routed_experts, kimi_k2.kv_write_
kimi_k2.routed_experts = lambda x, i, w, g, u, d: moe.moe_reference(x, i, w, g, u, d)
check("MoE -> moe_reference")
kimi_k2.routed_experts = orig_re
kimi_k2.kv_write_ = lambda kv, pt, lens, new, tl=None: kv_cache.kv_write_reference(kv, pt, lens, new, tl)
check("kv_write_ -> reference")
kimi_k2.routed_experts = lambda x, i, w, g, u, d: moe.moe_reference(x, i, w, g, u, d)
check("both")
kimi_k2.routed_experts, kimi_k2.kv_write_ = orig_re, orig_kw

# the pieces alone
torch._dynamo.reset()
x = torch.randn(10, 48, device="cuda")
E, I = 8, 32
idx = torch.randint(0, E, (10, 2), device="cuda")
w = torch.rand(10, 2, device="cuda")
wg, wu, wd = torch.randn(E, I, 48, device="cuda"), torch.randn(E, I, 48, device="cuda"), torch.randn(E, 48, I, device="cuda")
a = moe.routed_experts(x, idx, w, wg, wu, wd)
b = torch.compile(moe.routed_experts)(x, idx, w, wg, wu, wd)
print(f"{'routed_experts alone':40s} max diff {(a - b).abs().max().item():.3g}", flush=True)
torch._dynamo.reset()
cfg, params, cache, tokens, depth, mask = case()
pool = cache["kv"].clone()
new = torch.randn(2, 8, cfg.latent_dim, device="cuda")
kv_cache.kv_write_(pool[1], cache["page_table"], cache["kv_lens"], new)
pool2 = cache["kv"].clone()
torch.compile(lambda p, n: kv_cache.kv_write_(p[1], cache["page_table"], cache["kv_lens"], n))(pool2, new)
print(f"{'kv_write_ on a layer view alone':40s} max diff {(pool - pool2).abs().max().item():.3g}", flush=True)
