"""pytest-benchmark sweep of verify_mla on a GPU (graph replay, inputs rotated past L2).

    python -m pytest bench/test_bench_verify_mla.py --benchmark-json=bench.json
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [(1, 8, 8, 46000, 64), (1, 16, 8, 46000, 64), (1, 64, 8, 46000, 64), (1, 16, 64, 46000, 64),
         (1, 8, 8, 46000, 1), (4, 16, 8, 16384, 64), (16, 16, 8, 4096, 64), (1, 128, 16, 131072, 64)]


@pytest.fixture(scope="module")
def ceilings():
    from tritree.roofline import device_ceilings
    return device_ceilings()


@pytest.mark.parametrize("variant", ["tritree", "torch"])
@pytest.mark.parametrize("B,T,H,L,P", CASES)
def test_verify_mla(benchmark, ceilings, variant, B, T, H, L, P):
    from bench.verify_sweep import SM_SCALE, build_sets, torch_verify
    from tritree import verify_mla
    from tritree.roofline import verify_mla_counts

    if variant == "torch" and B * T * H * (L + T) * 12 > (8 << 30):
        pytest.skip("dense score tensor too large")
    s = build_sets(B, T, H, L, P, 1, torch.bfloat16, "cuda")[0]
    if variant == "torch":
        fn = lambda: torch_verify(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], SM_SCALE, L + T)  # noqa: E731
    else:
        fn = lambda: verify_mla(s["q"], s["kv"], s["page_table"], s["kv_lens"], s["tree_mask"], sm_scale=SM_SCALE)  # noqa: E731
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()

    def run():
        g.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)
    nbytes, flops = verify_mla_counts(B, T, H, L)
    floor_us, bound = ceilings.floor_us(nbytes, flops)
    median_s = benchmark.stats.stats.median
    benchmark.extra_info.update(floor_us=floor_us, bound=bound, gbps=nbytes / median_s / 1e9,
                                tflops=flops / median_s / 1e12, frac_floor=floor_us * 1e-6 / median_s)
