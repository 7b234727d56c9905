"""The end-to-end server's pieces that need no MPI: where momentum lives
(an aggregate equals its members applied one by one, in any grouping; the
exact server-momentum identity the choice avoids), settings checked up
front, roles, receive start times, the plain-async programs."""
import math

import numpy as np
import pytest

from partialcoll.mlfabric.runtime.config import RunConfig, check_run
from partialcoll.mlfabric.runtime.execute import start_times
from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.runtime.models import SoftmaxRegression, TanhMLP
from partialcoll.mlfabric.runtime.optim import SGD
from partialcoll.mlfabric.scheduler.ordering import Update
from partialcoll.mlfabric.runtime.program import programs
from partialcoll.mlfabric.runtime.roles import Roles, async_programs
from partialcoll.mlfabric.scheduler.batch import Scheduler
from partialcoll.mlfabric.scheduler.monitor import LinkMonitor


def test_worker_momentum_makes_grouping_irrelevant():
    """Server w <- w - lr * sum: any grouping of the same updates gives
    the same model (what lets the replica group differently)."""
    rng = np.random.default_rng(0)
    opt = SGD(lr=0.3, momentum=0.9)
    us = [rng.normal(size=5) for _ in range(6)]
    one = np.zeros(5)
    for u in us:
        opt.apply(one, u)
    grouped = np.zeros(5)
    for grp in ([0, 1, 2], [3], [4, 5]):
        opt.apply(grouped, sum(us[i] for i in grp))
    np.testing.assert_allclose(one, grouped, rtol=0, atol=1e-12)


def test_server_momentum_depends_on_grouping_unless_two_sums():
    """Why not server momentum: one step per aggregate differs from one
    step per update; the exact form needs two weighted sums."""
    rng = np.random.default_rng(1)
    gamma, lr, us = 0.9, 0.1, [rng.normal(size=3) for _ in range(4)]
    w, h = np.zeros(3), np.zeros(3)
    for u in us:                          # Eq. 1-2, one step per update
        h = gamma * h + u
        w = w - lr * h
    h2 = gamma * np.zeros(3) + sum(us)    # the aggregate as one step
    assert not np.allclose(w, -lr * h2)
    m = len(us)                           # the exact identity
    a = sum(gamma ** (m - j) * us[j - 1] for j in range(1, m + 1))
    b = sum((1 - gamma ** (m - j + 1)) / (1 - gamma) * us[j - 1]
            for j in range(1, m + 1))
    np.testing.assert_allclose(h, a, atol=1e-12)
    np.testing.assert_allclose(w, -lr * b, atol=1e-12)


def test_worker_history():
    opt = SGD(lr=0.5, momentum=0.5)
    h = opt.history(2)
    assert np.array_equal(opt.update(h, np.array([1.0, 2.0])), [1, 2])
    u = opt.update(h, np.array([1.0, 0.0]))
    assert np.array_equal(u, [1.5, 1.0]) and u is not h
    assert math.isclose(opt.norm(np.array([3.0, 4.0])), 2.5)
    with pytest.raises(ValueError):
        SGD(lr=0)
    with pytest.raises(ValueError):
        SGD(momentum=1.0)


@pytest.mark.parametrize("kw", [
    dict(mode="nope", duration=1), dict(mode="mlfabric"),
    dict(mode="mlfabric", duration=1), dict(mode="mlfabric", tau_max=0,
                                            duration=1),
    dict(mode="async", replica=True, duration=1),
    dict(mode="async", stragglers=(2, 1), duration=1),
    dict(mode="async", batch_interval=0, duration=1),
    dict(mode="async", aggregators=-1, duration=1),
    dict(mode="async", aggregators=[1, 1], duration=1),
    dict(mode="mlfabric", tau_max=4, replica_aggregators=-1, duration=1),
    dict(mode="async", duration=-1), dict(mode="async", duration=0),
    dict(mode="async", duration=math.inf),
    dict(mode="async", max_updates=0),
    dict(mode="mlfabric", tau_max=4, div_max=-1, duration=1),
    dict(mode="mlfabric", tau_max=4, div_max=math.nan, duration=1),
    dict(mode="async", monitor_lag=-0.1, duration=1),
    dict(mode="async", monitor_window=0, duration=1),
    dict(mode="async", initial_rate=0, duration=1),
    dict(mode="async", target_loss=math.nan, duration=1)])
def test_config_refuses(kw):
    """Each rank checks the settings before any message: bad ones are
    refused everywhere at once (a check on the server alone, as the
    aggregator draw's was, left the workers waiting)."""
    with pytest.raises(ValueError):
        RunConfig(**kw)


@pytest.mark.parametrize("kw", [
    dict(mode="async", aggregators=1.5, duration=1),
    dict(mode="mlfabric", tau_max=2.5, duration=1),
    dict(mode="async", max_updates=2.0)])
def test_config_refuses_counts_that_are_not_whole(kw):
    with pytest.raises(TypeError):
        RunConfig(**kw)


def test_check_run_names_the_loop_s_own_stop():
    ok = dict(compute_time=0.1, stragglers=(0.1, 2.0), duration=None,
              max_updates=5, target_loss=None, eval_every=0.1,
              monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8)
    assert check_run(**ok) == (0.1, 2.0)
    with pytest.raises(ValueError, match="max_iterations"):
        check_run(**dict(ok, max_updates=None), max_name="max_iterations")
    with pytest.raises(ValueError, match="max_iterations"):
        check_run(**dict(ok, max_updates=0), max_name="max_iterations")
    with pytest.raises(ValueError):
        check_run(**dict(ok, compute_time=math.nan))


def test_config_keeps_what_it_checked():
    c = RunConfig(mode="mlfabric", tau_max=np.int64(4), aggregators=[2, 3],
                  replica_aggregators=np.int32(1), max_updates=10)
    assert c.tau_max == 4 and type(c.tau_max) is int
    assert c.aggregators == [2, 3] and c.replica_aggregators == 1


def test_roles():
    r = Roles(5, replica=True)
    assert (r.server, r.replica, r.workers) == (0, 4, [1, 2, 3])
    assert Roles(2, replica=False).workers == [1]
    with pytest.raises(ValueError):
        Roles(2, replica=True)
    with pytest.raises(ValueError):
        Roles(1, replica=False)


def test_receives_get_their_sends_start():
    mon = LinkMonitor({n: 1e6 for n in range(4)}, {n: 1e6 for n in range(4)})
    s = Scheduler(0, [1, 2, 3], mon, tau_max=8, aggregators=[1])
    plan = s.plan(0.0, [Update(("w", i), i, 1e4, 0) for i in (1, 2, 3)])
    progs = programs(plan, 0)
    start_times(progs)
    sends = {op.tag: op.start for p in progs.values() for op in p.ops
             if op.kind == "send"}
    recvs = [op for p in progs.values() for op in p.ops if op.kind == "recv"]
    assert recvs and all(op.start == sends[op.tag] for op in recvs)
    assert all(op.start is not None and op.start >= 0.0 for op in recvs)


def test_async_programs_match():
    send, recv = async_programs("u", 3, 800.0, 1005)
    (s,) = send.ops
    assert (s.kind, s.peer, s.tag, s.what, s.start) == \
        ("send", 0, 1005, ("update", "u"), None)
    r, a = recv.ops
    assert (r.kind, r.peer, r.tag) == ("recv", 3, 1005)
    assert a.kind == "apply" and a.after == [0] and a.commit == 0


def test_softmax_model_descends():
    m = SoftmaxRegression(features=16, classes=4, samples=256, seed=2)
    w, l0 = m.params.copy(), m.loss(m.params)
    for step in range(50):
        w -= 0.5 * m.gradient(w, 1, step)
    assert m.loss(w) < l0 - 0.1
    assert np.array_equal(m.gradient(w, 1, 3), m.gradient(w, 1, 3))
    assert w.size == 64 and NetworkState is not None


def test_tanh_mlp_gradient_matches_finite_differences():
    m = TanhMLP(features=6, classes=3, hidden=4, samples=64, batch=5,
                seed=3)
    assert m.params.size == 6 * 4 + 4 * 3
    w = m.params + 0.1 * np.random.default_rng(0).normal(size=m.params.size)
    idx = np.random.default_rng([m.seed, 2, 7]).integers(0, len(m.y), 5)
    x, y = m.x[idx], m.y[idx]

    def batch_loss(v):
        p = m._probs(v, x)
        return -np.mean(np.log(p[np.arange(len(y)), y]))

    e = 1e-6
    numeric = [(batch_loss(w + e * d) - batch_loss(w - e * d)) / (2 * e)
               for d in np.eye(w.size)]
    assert np.allclose(m.gradient(w, 2, 7), numeric, atol=1e-8)


def test_tanh_mlp_descends_and_repeats():
    m = TanhMLP(features=16, classes=4, hidden=8, samples=256, seed=2)
    w, l0 = m.params.copy(), m.loss(m.params)
    for step in range(100):
        w -= 0.5 * m.gradient(w, 1, step)
    assert m.loss(w) < l0 - 0.1
    assert np.array_equal(m.gradient(w, 1, 3), m.gradient(w, 1, 3))
    assert not np.array_equal(m.gradient(w, 1, 3), m.gradient(w, 2, 3))


class _Gateless:
    """A stand-in for a built run: ``gates`` commits, the first ``ready``
    of them ready (in order), the others not yet."""

    def __init__(self, gates=1, ready=0):
        from partialcoll import WaitTimeout
        self.gates = {i: (i, None) for i in range(gates)}
        self.timeouts, self.ready = [], list(range(ready))

        class Sched:
            def wait_gate(s, timeout):
                self.timeouts.append(timeout)
                if not self.ready:
                    raise WaitTimeout("not ready")
                return self.ready.pop(0), 0

            def open_gate(s, op, rnd):
                pass
        self.schedule = Sched()

    def done(self):
        return False


def test_applier_says_when_its_step_did_not_block():
    """The server backs off (sleeps) after a pass that applied nothing
    unless the pass already blocked on a gate: an unordered applier (plain
    async) polls each run without waiting, and an ordered one whose oldest
    run has every gate open waits on nothing.  Before, both made the
    server's loop spin while updates were in flight."""
    from partialcoll.mlfabric.runtime.roles import Applier
    ordered = Applier(lambda buf, members: None)
    run = _Gateless()
    ordered.add(run, {})
    assert ordered.step(0.002) == 0 and ordered.waited
    assert run.timeouts == [0.002]
    ordered = Applier(lambda buf, members: None)
    sending = _Gateless()                  # gates open, sends in flight
    ordered.add(sending, {})
    sending.opened = len(sending.gates)
    assert ordered.step(0.002) == 0 and not ordered.waited
    assert not ordered.empty()
    assert sending.timeouts == []
    unordered = Applier(lambda buf, members: None, ordered=False)
    runs = [_Gateless(), _Gateless()]
    for r in runs:
        unordered.add(r, {})
    assert unordered.step(0.002) == 0 and not unordered.waited
    assert [r.timeouts for r in runs] == [[0.0], [0.0]]


def test_ordered_applier_passes_a_run_whose_sends_are_leaving():
    """Plan order across runs: the second run's commits wait for the
    first run's gates, not for its sends; the third run's wait for the
    second's closed gate."""
    from partialcoll.mlfabric.runtime.roles import Applier
    applied = []
    ordered = Applier(lambda buf, members: applied.append(members))
    first, second, third = _Gateless(1, 1), _Gateless(2, 1), _Gateless(1, 1)
    for i, run in enumerate((first, second, third)):
        ordered.add(run, {c: [(i, c)] for c in range(len(run.gates))})
    assert ordered.step(0.002) == 2 and not ordered.waited
    assert applied == [[(0, 0)], [(1, 0)]]        # third waits for second
    assert first.timeouts == [0.002] and second.timeouts == [0.0, 0.0]
    assert third.timeouts == []
    second.ready.append(1)
    assert ordered.step(0.002) == 2
    assert applied[2:] == [[(1, 1)], [(2, 0)]]
    assert len(ordered.runs) == 3                 # none done: all kept
