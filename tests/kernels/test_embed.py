"""``embed_rows`` (a vocabulary shard's rows, zeros for the tokens it does not hold, times a scale, in one launch)
against its reference and against the plain lookup: shard offsets and real-row counts (a padded last shard), tokens
in and out of the shard, token shapes, scales, int32 and int64 ids, poisoned outputs; the ranks' rows summing to the
whole table's; validation; on a GPU K2.x's rows and a graph replay."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritree.kernels.embed import embed_rows, embed_rows_reference

from ..conftest import DEVICE


def _check(table, tokens, start, rows, scale):
    out = torch.full((*tokens.shape, table.shape[1]), float("nan"), dtype=table.dtype, device=table.device)
    assert embed_rows(table, tokens, start=start, rows=rows, scale=scale, out=out) is out
    assert not out.isnan().any()  # every element written
    want = embed_rows_reference(table.cpu(), tokens.cpu(), start, rows, scale)
    # one float32 product rounded once on both sides
    torch.testing.assert_close(out.cpu(), want, atol=0, rtol=0 if table.dtype == torch.float32 else 1e-2)
    r = table.shape[0] if rows is None else rows
    held = ((tokens.cpu() >= start) & (tokens.cpu() < start + r))
    assert (out.cpu()[~held] == 0).all()


@settings(max_examples=30, deadline=None)
@given(R=st.integers(1, 40), pad=st.integers(0, 3), H=st.integers(1, 300), lead=st.sampled_from([(5,), (2, 3), (1,)]),
       start=st.integers(0, 50), scale=st.sampled_from([1.0, 0.5, 83.0]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       ids=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_embed_rows_matches_reference(R, pad, H, lead, start, scale, dtype, ids, seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(R + pad, H, generator=g).to(dtype)
    tokens = torch.randint(0, start + R + pad + 5, lead, generator=g).to(ids)  # below, inside, in the padding, above
    _check(table.to(DEVICE), tokens.to(DEVICE), start, R if pad else None, scale)


def test_embed_rows_of_every_shard_sum_to_the_whole_lookup():
    """Vocabulary parallelism: each rank's rows (its shard of ``ceil(V / world)`` ids, the last one padded) summed
    over the ranks give the plain lookup of the whole table."""
    g = torch.Generator().manual_seed(0)
    V, H, world = 23, 16, 4
    full = torch.randn(V, H, generator=g)
    tokens = torch.randint(0, V, (3, 7), generator=g).to(DEVICE)
    per = -(-V // world)
    total = torch.zeros(3, 7, H, device=DEVICE)
    for r in range(world):
        start = r * per
        rows = min(per, V - start)
        shard = torch.zeros(per, H)
        shard[:rows] = full[start:start + rows]
        total += embed_rows(shard.to(DEVICE), tokens, start=start, rows=rows)
    torch.testing.assert_close(total.cpu(), full[tokens.cpu()], atol=0, rtol=0)


def test_embed_rows_no_tokens_and_strided_table():
    table = torch.randn(8, 32, device=DEVICE)[:, :16]  # a row stride of 32
    assert embed_rows(table, torch.zeros(0, dtype=torch.long, device=DEVICE)).shape == (0, 16)
    tokens = torch.tensor([3, 0, 7], device=DEVICE)
    torch.testing.assert_close(embed_rows(table, tokens), table[tokens], atol=0, rtol=0)
    strided = torch.tensor([[3, 9, 0, 9, 7, 9]], device=DEVICE)[:, ::2]  # ids read through their stride
    torch.testing.assert_close(embed_rows(table, strided), table[strided], atol=0, rtol=0)


def test_embed_rows_is_differentiable_in_the_table():
    table = torch.randn(6, 4, requires_grad=True)
    out = embed_rows(table, torch.tensor([1, 1, 9]), start=0, scale=2.0)
    out.sum().backward()
    assert table.grad[1].tolist() == [4.0] * 4 and table.grad[0].abs().sum() == 0


@pytest.mark.parametrize("kw, match", [
    (dict(table=torch.randn(4)), "table"),
    (dict(table=torch.randn(4, 8).t()), "contiguous"),
    (dict(tokens=torch.zeros(3)), "tokens"),
    (dict(start=-1), "start"),
    (dict(rows=5), "rows"),
    (dict(out=torch.empty(3, 8, dtype=torch.float16)), "out"),
    (dict(out=torch.empty(3, 7)), "out"),
    (dict(out=torch.empty(8, 3).t()), "out"),
])
def test_embed_rows_rejects_bad_input(kw, match):
    args = dict(table=torch.randn(4, 8), tokens=torch.zeros(3, dtype=torch.long), start=0, rows=None, out=None)
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=match):
        embed_rows(args["table"], args["tokens"], start=args["start"], rows=args["rows"], out=args["out"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_k2_rows_and_graph_replay():
    """A TP8 shard of K2.x's vocabulary (20,480 rows of 7,168, bf16), the draft's scale, ids of every rank; equal
    under a CUDA-graph replay."""
    g = torch.Generator().manual_seed(3)
    table = torch.randn(20480, 7168, generator=g).to(torch.bfloat16).cuda()
    tokens = torch.randint(0, 163840, (1, 17), generator=g, dtype=torch.int32).cuda()
    tokens[0, :4] = torch.tensor([20480, 20481, 40959, 40960])  # the shard's edges
    _check(table, tokens, 20480, 20480, 1.0)
    _check(table, tokens, 20480, 20480, 0.25)
    eager = embed_rows(table, tokens, start=20480, scale=0.25)
    out = torch.empty_like(eager)
    embed_rows(table, tokens, start=20480, scale=0.25, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        embed_rows(table, tokens, start=20480, scale=0.25, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
