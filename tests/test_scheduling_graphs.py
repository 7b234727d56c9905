"""Worker graphs traced from PyTorch models (partialcoll.tictac.graphs):
receives per module or tensor, program-order edges, chain merging, and
the planner on them.  Needs torch (torchvision for its models); skips
otherwise.  No MPI."""
import importlib.util

import pytest

from partialcoll.tictac import planner
from partialcoll.tictac.planner import Graph

torch = pytest.importorskip("torch", reason="needs PyTorch")
from partialcoll.tictac import graphs  # noqa: E402


def small_block():
    torch.manual_seed(0)
    return graphs.TransformerBlock(d_model=32, heads=4, ff=64).eval(), \
        torch.randn(1, 8, 32)


def test_transformer_block_receives_and_program_order():
    m, x = small_block()
    g = graphs.trace(m, x, repeats=2)
    names = [r.name for r in g.recvs]
    assert names == [f"recv:{n}" for n in ("norm1", "q", "k", "v", "out",
                                           "norm2", "fc1", "fc2")]
    assert g.recvs[names.index("recv:fc1")].nbytes == (32 * 64 + 64) * 4
    assert g.recvs[0].info["params"] == ["norm1.weight", "norm1.bias"]
    compute = [op for op in g.ops if op.kind == planner.COMPUTE]
    for a, b in zip(compute, compute[1:]):
        assert a.index in b.deps              # one stream, program order
    assert all(op.time > 0 for op in compute)
    # a sequential program: TIC's order is the order of first use
    assert planner.enforcement(planner.tic(g)) == planner.first_use(g)


def test_per_tensor_receives_and_dataflow_only():
    m, x = small_block()
    g = graphs.trace(m, x, group="tensor", stream=False, repeats=1)
    assert len(g.recvs) == 16
    assert g.recvs[0].info["params"] == ["norm1.weight"]
    # without program-order edges, q, k and v read the same norm output
    # and nothing else: none depends on another
    dep = planner.find_dependencies(g)
    by_param = {}
    for op in g.ops:
        for d in op.deps:
            if g.ops[d].name in ("recv:q.weight", "recv:k.weight",
                                 "recv:v.weight"):
                by_param[g.ops[d].name] = op
    assert len(by_param) == 3
    bits = {n: dep[g.index(n)] for n in by_param}
    for n, op in by_param.items():
        others = [m for m in by_param if m != n]
        assert not any(dep[op.index] & bits[m] for m in others), n
    order = planner.tac(g.with_times(recv_time=lambda op: op.nbytes / 1e6))
    assert sorted(order.values()) == list(range(16))


def test_merging_keeps_time_and_dependencies():
    g = Graph()
    w1, w2 = g.recv("w1"), g.recv("w2")
    a = g.compute("a", 1.0, [w1])
    b = g.compute("b", 2.0, [a])            # merges into a
    c = g.compute("c", 3.0, [b])            # merges too
    d = g.compute("d", 1.0, [c, w2])        # has a receive: stays
    g.compute("e", 1.0, [d])                # merges into d
    m = graphs.merge_chains(g)
    assert [op.name for op in m.ops] == ["w1", "w2", "a", "d"]
    assert m.ops[2].time == 6.0 and m.ops[3].time == 2.0
    assert m.compute_time == g.compute_time
    assert planner.properties(m) == planner.properties(g)


def test_a_fork_is_not_merged():
    g = Graph()
    w = g.recv("w")
    a = g.compute("a", 1.0, [w])
    b = g.compute("b", 1.0, [a])
    g.compute("c", 1.0, [a])                # a has two users
    g.compute("d", 1.0, [b])
    assert [op.name for op in graphs.merge_chains(g).ops] == \
        ["w", "a", "b", "c"]


def test_scale_compute():
    m, x = small_block()
    g = graphs.scale_compute(graphs.trace(m, x, repeats=1), 0.5)
    assert g.compute_time == pytest.approx(0.5)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="needs torchvision")
def test_resnet18_from_torchvision():
    m, x = graphs.model("resnet18", batch=1, image=64)
    g = graphs.trace(m, x, repeats=1)
    # 20 convolutions, 20 batch norms, 1 linear layer
    assert len(g.recvs) == 41
    assert sum(r.nbytes for r in g.recvs) == \
        sum(p.numel() * 4 for p in m.parameters())
    order = planner.enforcement(planner.tic(g))
    assert order == planner.first_use(g)
    assert order["recv:conv1"] == 0 and order["recv:fc"] == 40


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        graphs.model("alexnet9000")
