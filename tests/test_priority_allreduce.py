"""Priorities for allreduce (TicTac beyond the paper): collectives built
at a priority, eager-SGD buckets with priorities and partitions, and the
torch wrapper's numbers from the planner."""
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.eager import EagerAverager

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def test_schedule_priority_is_the_default_of_its_ops():
    s = pc.Schedule(MPI.COMM_SELF, priority=7)
    b = s.buffer(np.zeros(2))
    s.send(b, 0)
    s.recv(b, 0, priority=1)
    s.nop()
    assert [o["priority"] for o in s._ops] == [7, 1, 7]
    s.free()


@pytest.mark.skipif(not 2 <= P <= 4 or os.environ.get("PARTIALCOLL_SANITIZED"),
                    reason="timing: 2 to 4 ranks, no sanitizer")
def test_an_urgent_allreduce_overtakes_queued_ones():
    """Eight 256 KB allreduces are queued (one send in flight per
    destination), then a small one starts: at priority 0 like the rest it
    waits behind them; at a lower number than theirs it leaves next.  Each
    pattern runs twice, the second timed (the first builds the pool's
    schedules, which takes long enough for the queue to drain)."""
    pc.network.enable({"default": {"out_rate": "20 MB/s",
                                   "in_rate": "20 MB/s"}})
    comm = COMM.Dup()
    pc.set_send_cap(1)
    took = {}
    try:
        for name, (bulk, urgent) in [("fifo", (0, 0)), ("fifo", (0, 0)),
                                     ("priority", (5, 1)),
                                     ("priority", (5, 1))]:
            parts = [np.full(32768, 1.0) for _ in range(8)]
            small = np.full(1000, 2.0)
            comm.Barrier()
            reqs = [pc.iallreduce(x, comm=comm, priority=bulk) for x in parts]
            t0 = time.monotonic()
            r = pc.iallreduce(small, comm=comm, priority=urgent)
            assert np.all(r.wait(timeout=60) == 2.0 * P)
            took[name] = time.monotonic() - t0
            for q in reqs:
                assert np.all(q.wait(timeout=60) == P)
    finally:
        pc.set_send_cap(0)
        comm.Free()
        pc.network.disable()
    worst = COMM.allreduce(took["priority"] / took["fifo"], op=MPI.MAX)
    assert worst < 0.6, took


@pytest.mark.parametrize("mode", ["sync", "solo"])
def test_eager_buckets_with_priorities_and_parts_sum_right(mode):
    """Integer-valued gradients: sync is exact each step; solo's steps
    plus flush apply every gradient, whatever the parts and order."""
    shapes = [(5, 3), (7,), (40,), (2, 2)]
    grads = [np.full(s, float(RANK + 1 + k)) for k, s in enumerate(shapes)]
    avg = EagerAverager([np.zeros(s) for s in shapes], mode=mode,
                        bucket_bytes=200, priorities=[3, 0, 2, 1],
                        partition_bytes=64)
    b = avg._buckets
    assert sum(len(x.parts) for x in b) > len(b)          # cut into parts
    assert [x.priority for x in b] == [0, 2, 1]       # most urgent member
    total = [np.zeros(s) for s in shapes]
    for _ in range(3):
        out, _ = avg.reduce(grads)
        for t, o in zip(total, out):
            t += o
    last = avg.close()
    if last is not None:
        for t, o in zip(total, last[0]):
            t += o
    want = [3 * sum(RANK_ + 1 + k for RANK_ in range(P)) / P
            for k in range(len(shapes))]
    for t, w in zip(total, want):
        np.testing.assert_allclose(t, w)


def test_priorities_are_checked():
    with pytest.raises(pc.ScheduleError, match="one number per gradient"):
        EagerAverager([np.zeros(3)], mode="sync", priorities=[1, 2])
    with pytest.raises(pc.ScheduleError, match="'solo' and 'sync'"):
        EagerAverager([np.zeros(3)], mode="majority", priorities=[1])


def test_torch_wrapper_takes_numbers_from_the_planner():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    import partialcoll.torch as pct
    from partialcoll.tictac.graphs import parameter_priorities
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2))
    prio = parameter_priorities(model, torch.randn(3, 4))
    assert prio == {"0.weight": 0, "0.bias": 1, "2.weight": 2, "2.bias": 3}
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), mode="sync",
                             bucket_bytes=64, priorities=prio,
                             partition_bytes=32)
    assert min(b.priority for b in opt.averager._buckets) == 0
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.close()
    with pytest.raises(pc.ScheduleError, match="does not average"):
        pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           model.named_parameters(), mode="sync",
                           priorities={"nope": 1})
