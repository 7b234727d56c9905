"""MLfabric's allreduce (section 6: push to a root over a tree planned
from the lagged link monitor, then get) under MPI, on the emulated
network: the sum equals a plain allreduce of the same data exactly (small
integers), whatever the tree, at any P; the tree follows the link rates
the monitor measured; train_allreduce(algorithm="mlfabric") trains."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.mlfabric.runtime.allreduce import DynamicTreeAllreduce

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P = COMM.size


def fair(rate="8 MB/s", ranks=None):
    cfg = {"seed": 3, "default": {"out_rate": rate, "in_rate": rate,
                                  "latency": "0.2 ms"}}
    if ranks:
        cfg["rank"] = {str(r): v for r, v in ranks.items()}
    return cfg


@pytest.mark.parametrize("count", [1, 7, 1000])
@pytest.mark.parametrize("root", [None, P - 1])
def test_sum_is_exact(net, count, root):
    net({"seed": 3, "default": {"out_rate": "8 MB/s", "in_rate": "8 MB/s",
                                "latency": "0.2 ms"},
         "trace": [{"ranks": "all", "nic": "both", "every": "0.05 s",
                    "factors": [1, 2.5, 3.3, 5, 10],
                    "probabilities": [0, 0.1, 0.1, 0.1, 0.7]}]})
    ar = DynamicTreeAllreduce(COMM, aggregators=2, root=root,
                              monitor_lag=0.01, initial_rate=8e6, seed=1)
    try:
        for it in range(6):
            rng = np.random.default_rng([it, COMM.rank])
            x = rng.integers(-100, 100, count).astype(np.float64)
            want = COMM.allreduce(x)
            assert ar(x) is x
            assert np.array_equal(x, want), (it, ar.plan and ar.plan.hops)
            ints = rng.integers(-100, 100, count, dtype=np.int64)
            want = COMM.allreduce(ints)
            ar(ints)
            assert np.array_equal(ints, want)
        if P > 1:
            assert ar.plan.root == (root if root is not None
                                    else ar.plan.root)
            assert COMM.allgather(ar.plan.shape()) == [ar.plan.shape()] * P
    finally:
        ar.free()


def test_empty_and_single():
    ar = DynamicTreeAllreduce(COMM)
    try:
        x = np.zeros(0)
        assert ar(x).size == 0
        y = np.full(3, float(COMM.rank))
        ar(y)
        assert np.array_equal(y, np.full(3, P * (P - 1) / 2))
    finally:
        ar.free()


def _gets_nothing(plan, rank):
    """No update other than its own travels into ``rank``."""
    return all(h.dst != rank or h.src == rank or h.kind != "push"
               for h in plan.hops)


@pytest.mark.skipif(P < 4, reason="needs a root and three workers")
def test_tree_follows_the_rates_the_monitor_reports(net):
    """The planner's monitor hears (direct NIC reports, lag 0: what a
    NIC's own counters would say) that rank 1's incoming NIC is slow,
    later that rank 2's is instead: the next
    plan gives the slow one no other rank's update, and the tree changes;
    the sum stays exact.  Root 0 receives at 1 MB/s, so aggregating pays
    (aggregators 1 and 2)."""
    net(fair("8 MB/s", ranks={0: {"in_rate": "1 MB/s"}}))
    ar = DynamicTreeAllreduce(COMM, aggregators=[1, 2], root=0,
                              monitor_lag=0.0, initial_rate=8e6)
    x = np.zeros(2000)
    shapes = []
    try:
        for slow, fast in ((1, 2), (2, 1)):
            # every rank's receives of the last call have arrived, so the
            # reports below are newer than any transfer the planner hears
            # of (a later transfer's measurement would replace them)
            COMM.Barrier()
            if COMM.rank == 0:       # every NIC, newer than any transfer
                t = pc.now()
                for r in range(P):
                    ar.monitor.report(t, r, "out", 8e6)
                    ar.monitor.report(t, r, "in", {0: 1e6, slow: 1e4}.get(
                        r, 8e6))
            # after the reports: the planner sees the monitor as of then
            ready = COMM.bcast(pc.now())
            x[:] = COMM.rank
            # one ready time for every rank: on a loaded host the ranks
            # enter the call far apart, and Alg 3 then rightly sends each
            # update straight to the idle root (nothing to aggregate)
            ar(x, ready=ready)
            assert np.all(x == P * (P - 1) / 2)
            assert _gets_nothing(ar.plan, slow), ar.plan.hops
            assert not _gets_nothing(ar.plan, fast), ar.plan.hops
            shapes.append(ar.plan.shape())
        assert shapes[0] != shapes[1]
    finally:
        ar.free()


@pytest.mark.skipif(P < 3, reason="needs a root and two workers")
def test_monitor_measures_a_slow_nic(net):
    """End to end, measurements only: every rank receives the result each
    call, so every incoming NIC is timed; the rank behind a 100 kB/s NIC
    (20 kB messages: 0.2 s, against 20 ms at 1 MB/s) ends with the
    lowest estimate, and the sums stay exact."""
    net(fair("1 MB/s", ranks={1: {"in_rate": "100 kB/s"}}))
    ar = DynamicTreeAllreduce(COMM, aggregators=1, root=0, monitor_lag=0.0,
                              initial_rate=1e6)
    x = np.zeros(2500)
    try:
        for _ in range(3):
            x[:] = COMM.rank
            ar(x)
            assert np.all(x == P * (P - 1) / 2)
        if COMM.rank == 0:
            seen = ar.monitor.rates(pc.now())[1]
            assert seen[1] < 0.2e6, seen
            assert seen[1] < min(seen[r] for r in range(2, P)), seen
    finally:
        ar.free()


@pytest.mark.skipif(P < 3, reason="a server rank sits out: two workers")
def test_train_allreduce_mlfabric(net):
    from partialcoll.mlfabric import SGD, SoftmaxRegression, train_allreduce
    net(fair("4 MB/s"))
    model = SoftmaxRegression(features=64, classes=16, seed=1)
    start = model.loss(model.params)
    out = train_allreduce(model, SGD(5.0, 0.5), algorithm="mlfabric",
                          compute_time=0.02, stragglers=(0.1, 3.0),
                          max_iterations=12, seed=5, monitor_lag=0.05,
                          initial_rate=4e6)
    assert out["iterations"] == 12
    assert out["losses"][-1][2] < start - 0.05
    assert out["scheduler"]["plans"] == 12
    assert out["scheduler"]["trees"] >= 1
    ws = COMM.allgather(out["params"])
    assert all(np.array_equal(ws[0], w) for w in ws)
    # the same updates summed by the ring give the same model
    ring = train_allreduce(SoftmaxRegression(features=64, classes=16,
                                             seed=1),
                           SGD(5.0, 0.5), algorithm="ring",
                           compute_time=0.0, max_iterations=12, seed=5)
    assert np.allclose(ring["params"], out["params"], rtol=1e-12,
                       atol=1e-12)
