"""The paper's momentum at the server (MLfabric Eq. 2) with aggregation
(partialcoll.mlfabric.runtime.optim, no MPI): a commit's two sums [S, V]
give exactly the updates applied one by one, whatever the grouping, so a
replica that groups differently has the server's model at every common
version; and the programs weigh each member by its position."""
import numpy as np
import pytest

from partialcoll.core.errors import ArgumentTypeError, ScheduleError
from partialcoll.mlfabric.runtime.execute import _own
from partialcoll.mlfabric.runtime.optim import SGD, ServerMomentum
from partialcoll.mlfabric.runtime.program import programs
from partialcoll.mlfabric.scheduler.aggregation import Group
from partialcoll.mlfabric.scheduler.batch import BatchPlan
from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.scheduler.ordering import Update


def one_by_one(w, updates, lr, gamma):
    """Eq. 2 per update: h <- gamma h + u, w <- w - lr h; every model."""
    h, w, out = np.zeros_like(w), w.copy(), [w.copy()]
    for u in updates:
        h = gamma * h + u
        w = w - lr * h
        out.append(w.copy())
    return out


def commit(members, gamma):
    """The message a commit of ``members`` carries: [S, V]."""
    m = len(members)
    return np.concatenate([sum(members),
                           sum(gamma ** (m - 1 - j) * u
                               for j, u in enumerate(members))])


def cuts(rng, n):
    """A random grouping of 0..n-1 into consecutive runs."""
    edges = sorted(rng.choice(np.arange(1, n), rng.integers(0, n),
                              replace=False).tolist())
    return [list(range(a, b)) for a, b in zip([0] + edges, edges + [n])]


@pytest.mark.parametrize("seed", range(10))
def test_two_sums_are_the_updates_one_by_one(seed):
    rng = np.random.default_rng(seed)
    gamma, lr, n = rng.choice([0.0, 0.5, 0.9, 0.99]), 0.3, 40
    ups = [rng.normal(size=7) for _ in range(n)]
    w0 = rng.normal(size=7)
    truth = one_by_one(w0, ups, lr, gamma)
    opt = SGD(lr, gamma, at="server")
    for grouping in (cuts(rng, n), cuts(rng, n), [[i] for i in range(n)]):
        w, mom, done = w0.copy(), ServerMomentum(opt, 7), 0
        for grp in grouping:
            mom.apply(w, commit([ups[i] for i in grp], gamma), len(grp))
            done += len(grp)
            np.testing.assert_allclose(w, truth[done], rtol=1e-10,
                                       atol=1e-10)


def test_one_update_may_come_as_one_half():
    opt = SGD(0.5, 0.9, at="server")
    a, b = ServerMomentum(opt, 3), ServerMomentum(opt, 3)
    wa, wb = np.zeros(3), np.zeros(3)
    for u in (np.ones(3), np.arange(3.0)):
        a.apply(wa, u, 1)
        b.apply(wb, np.concatenate([u, u]), 1)
    np.testing.assert_allclose(wa, wb)
    with pytest.raises(ScheduleError, match="both sums"):
        a.apply(wa, np.ones(3), 2)


def test_one_step_per_iteration_for_the_synchronous_mode():
    opt = SGD(0.5, 0.9, at="server")
    mom, w = ServerMomentum(opt, 2), np.zeros(2)
    mom.step_average(w, np.ones(2))
    mom.step_average(w, np.ones(2))
    np.testing.assert_allclose(w, -0.5 * (1 + 1.9) * np.ones(2))


def test_where_momentum_lives():
    assert SGD(0.1, 0.9).server_gamma == 0.0
    assert SGD(0.1, 0.9, at="server").server_gamma == 0.9
    assert SGD(0.1, 0.9, at="server").wire_width("mlfabric") == 2
    assert SGD(0.1, 0.9, at="server").wire_width("async") == 1
    assert SGD(0.1, 0.9, at="server").wire_width("mlfabric-s") == 1
    assert SGD(0.1, 0.0, at="server").wire_width("mlfabric") == 1
    assert SGD(0.1, 0.9).wire_width("mlfabric") == 1
    g = np.arange(3.0)
    sent = SGD(0.1, 0.9, at="server").update(np.zeros(3), g)
    np.testing.assert_array_equal(sent, g)          # the gradient itself
    with pytest.raises(ScheduleError, match="at must be one of"):
        SGD(0.1, 0.9, at="replica")
    with pytest.raises(ArgumentTypeError):
        SGD(0.1, 0.9, at=1)


def test_programs_weigh_members_by_position():
    """A commit of three through aggregator 2 (worker 2's own update
    summed there) and a direct one: each own update's op carries
    gamma^(m-j); the message is [u, weight * u]."""
    net = NetworkState({n: 10.0 for n in range(5)},
                       {n: 10.0 for n in range(5)})
    ups = [Update(i, w, 1.0, 0) for i, w in enumerate([3, 2, 4, 3])]
    agg = Group(2, ups[:3], [net.reserve(u.worker, 2, 0.0, 1.0)
                             for u in ups[:3]], net.reserve(2, 0, 0.0, 1.0))
    direct = Group(None, [ups[3]], [], net.reserve(3, 0, 0.0, 1.0))
    plan = BatchPlan(dropped=[], groups=[agg, direct], replication=None)
    progs = programs(plan, 0, gamma=0.5)
    weights = {op.what[1]: op.weight for p in progs.values()
               for op in p.ops if op.kind in ("send", "sum")
               and op.what[0] == "update"}
    assert weights == {0: 0.25, 1: 0.5, 2: 1.0, 3: 1.0}
    assert all(op.weight is None for op in programs(plan, 0)[3].ops)
    np.testing.assert_array_equal(_own(np.arange(2.0), 2, 0.25),
                                  [0, 1, 0, 0.25])
    with pytest.raises(ScheduleError, match="weight"):
        _own(np.arange(2.0), 2, None)
