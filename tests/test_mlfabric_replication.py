"""MLfabric's bounded-consistency replication (sections 3.3 and 5.3) and
the scheduler that runs ordering, aggregation and replication per batch
(no MPI): the Eq. 11 bound against real models, a hand-computed delayed
commit, an unmeetable Div_max, and over random runs of batches: the
replica follows the server's order and the divergence never exceeds
Div_max."""
import math
import random

import numpy as np
import pytest

from partialcoll.mlfabric.scheduler.aggregation import Group
from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.scheduler.microbench import scheduler_benchmark
from partialcoll.mlfabric.scheduler.monitor import LinkMonitor
from partialcoll.mlfabric.scheduler.ordering import Update
from partialcoll.mlfabric.scheduler.replication import (DivergenceTracker,
                                                        _Bounds,
                                                        divergence_bound,
                                                        replicate)
from partialcoll.mlfabric.scheduler.batch import Scheduler

INF = math.inf


def test_bound_is_the_square_root_of_eq_11():
    """L = 2: a1..a6 from Eq. 7's coefficients (the printed a6 term is read
    as ||u2||.||h0||)."""
    g, h, u1, u2 = 0.9, 1.3, 0.7, 2.1
    a1, a2, a3 = (g + g * g) ** 2, (1 + g) ** 2, 1.0
    a4, a5, a6 = 2 * (g + g * g) * (1 + g), 2 * (1 + g), 2 * (g + g * g)
    eq11 = math.sqrt(a1 * h * h + a2 * u1 * u1 + a3 * u2 * u2 +
                     a4 * h * u1 + a5 * u1 * u2 + a6 * u2 * h)
    assert divergence_bound(h, [u1, u2], g) == pytest.approx(eq11)
    assert divergence_bound(h, [], g) == 0.0


def momentum_run(w0, h0, updates, gamma):
    """Models after each update applied by Eq. 2 (w_-1 = w0 - h0)."""
    models, prev, w = [w0], w0 - h0, w0
    for u in updates:
        w, prev = w + u + gamma * (w - prev), w
        models.append(w)
    return models


@pytest.mark.parametrize("seed", range(20))
def test_bound_holds_for_real_models(seed):
    """Server at version s, replica at p <= s of the same sequence: the
    bound from norms alone (||h|| kept by its recursion) is at least
    ||w_s - w_p||, only grows with s and only falls with p."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0, 0.95)
    h0 = rng.normal(size=50) * 0.1
    ups = [rng.normal(size=50) * rng.uniform(0.1, 2) for _ in range(12)]
    models = momentum_run(rng.normal(size=50), h0, ups, gamma)
    bounds = _Bounds(np.linalg.norm(h0), [np.linalg.norm(u) for u in ups],
                     gamma)
    for s in range(13):
        for p in range(s + 1):
            real = np.linalg.norm(models[s] - models[p])
            assert real <= bounds(s, p) * (1 + 1e-9) + 1e-12
            if p:
                assert bounds(s, p) <= bounds(s, p - 1) + 1e-12
            if s > p:
                assert bounds(s, p) >= bounds(s - 1, p) - 1e-12


def test_tracker_follows_the_recursion():
    t = DivergenceTracker(0.5, h_norm=2.0)
    t.server_applied([1.0, 3.0])
    assert t.bound() == pytest.approx((0.5 + 0.25) * 2 + 1.5 * 1 + 3)
    t.replica_applied(1)
    assert t.h == pytest.approx(0.5 * 2 + 1)
    assert t.bound() == pytest.approx(0.5 * 2.0 + 3.0)
    with pytest.raises(ValueError):
        DivergenceTracker(1.0)


def two_updates():
    """Server 0 (in 10 MB/s), replica 1 (in 1 MB/s), workers 2 and 3
    (out 10 MB/s); u from 2, v from 3, 1 MB and norm 1 each; the server
    commits u at 0.1 and v at 0.2, both direct."""
    net = NetworkState({0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0},
                       {0: 10.0, 1: 1.0, 2: 10.0, 3: 10.0})
    u, v = Update("u", 2, 1.0, 0, norm=1.0), Update("v", 3, 1.0, 0, norm=1.0)
    groups = [Group(None, [g], [], net.reserve(g.worker, 0, 0.0, 1.0))
              for g in (u, v)]
    assert [grp.end for grp in groups] == pytest.approx([0.1, 0.2])
    return net, u, v, groups


def test_a_server_commit_waits_for_the_replica():
    """gamma = 0, Div_max = 1.5: after v the server would lead by two
    updates (bound 2), so v's commit waits for the replica's copy of u
    (1 MB/s from 0.1: done at 1.1) and goes at 9 MB/s beside v's own
    replica transfer: done at 1.1 + 1/9.  The replica's v (done at 2.0)
    is after T_last: punted to the next batch, its bandwidth released."""
    net, u, v, groups = two_updates()
    tracker = DivergenceTracker(0.0)
    rep = replicate(groups, [], net, 1, [], tracker, div_max=1.5, start=0.0)
    assert rep.delayed == 1 and not rep.unmet
    assert groups[1].forward.start == pytest.approx(1.1)
    assert groups[1].end == pytest.approx(1.1 + 1 / 9)
    assert [[g.uid for g in grp.members] for grp in rep.groups] == [["u"]]
    assert rep.groups[0].end == pytest.approx(1.1)
    assert [g.uid for g in rep.punted] == ["v"]
    assert [b for _, b in rep.checks] == pytest.approx([1.0, 1.0])
    assert net.inn[1].residual(1.5) == pytest.approx(1.0)   # v released
    assert tracker.lead == [1.0] and tracker.h == 1.0


def test_a_large_div_max_delays_nothing():
    """Nothing waits; no replica commit completes by T_last = 0.2, so the
    replica, idle, gets its whole plan (u done at 1.1, v at 2.0), carried
    in flight to the next batch."""
    net, u, v, groups = two_updates()
    tracker = DivergenceTracker(0.0)
    rep = replicate(groups, [], net, 1, [], tracker, div_max=10.0, start=0.0)
    assert rep.delayed == 0 and groups[1].end == pytest.approx(0.2)
    assert [[g.uid for g in grp.members] for grp in rep.groups] == \
        [["u"], ["v"]]
    assert rep.punted == [] and rep.inflight == rep.groups
    assert tracker.lead == [1.0, 1.0]     # neither has ended by T_last


def test_a_replica_slower_than_a_batch_still_follows():
    """The replica's link needs 1 s per update, batches come every 0.1 s
    with one update each: a commit never completes within its batch, yet
    the replica gets one commit whenever its earlier ones end (without
    that it was punted for ever, and a run never drained)."""
    out = {0: 10.0, 1: 10.0, 2: 10.0}
    inn = {0: 10.0, 1: 1.0, 2: 10.0}
    sched = Scheduler(0, [2], LinkMonitor(out, inn, lag=0.0), tau_max=50,
                      aggregators=0, replica=1, replica_aggregators=0,
                      interval=0.1)
    replicated, ends = [], []
    for i in range(40):
        plan = sched.plan(i * 0.1, [Update(i, 2, 1.0, sched.version,
                                           norm=1.0)])
        replicated += [g.uid for grp in plan.replication.groups
                       for g in grp.members]
        ends += [grp.end for grp in plan.replication.groups]
    assert replicated == list(range(len(replicated)))     # in order
    assert len(replicated) >= 10
    assert ends == sorted(ends)
    # one update a second on the replica's link: the plan keeps pace
    assert ends[-1] == pytest.approx(len(ends), abs=1.0)


def test_a_div_max_no_schedule_can_meet_is_reported():
    """Div_max below one update's norm: the first commit alone exceeds it
    and there is nothing to wait for."""
    net, u, v, groups = two_updates()
    rep = replicate(groups, [], net, 1, [], DivergenceTracker(0.0),
                    div_max=0.5, start=0.0)
    assert rep.unmet == [0, 1]


# --- the scheduler over random runs ----------------------------------------

def random_run(seed, batches=6, replica=True):
    rng = random.Random(seed)
    n_workers = rng.randrange(3, 9)
    nodes = list(range(2 + n_workers))
    rates = [1.0, 2.5, 3.3, 5.0, 10.0]
    out = {n: rng.choice(rates) for n in nodes}
    inn = {n: rng.choice(rates) for n in nodes}
    out[0] = inn[0] = out[1] = inn[1] = 10.0
    tau = rng.randrange(2, 12)
    gamma = rng.choice([0.0, 0.5, 0.9])
    div_max = rng.uniform(3, 25)
    sched = Scheduler(0, nodes, LinkMonitor(out, inn, lag=0.2), tau,
                      aggregators=rng.randrange(0, 3),
                      replica=1 if replica else None,
                      replica_aggregators=rng.randrange(0, 3),
                      div_max=div_max, gamma=gamma, interval=0.5, seed=seed)
    plans, uid, now = [], 0, 0.0
    for _ in range(batches):
        ups = []
        for _ in range(rng.randrange(0, 8)):
            ups.append(Update(uid, rng.randrange(2, 2 + n_workers),
                              rng.uniform(0.5, 4),
                              sched.version - rng.randrange(0, tau + 2),
                              norm=rng.uniform(0.2, 2)))
            uid += 1
        plans.append(sched.plan(now, ups))
        now += 0.5
    return sched, plans, div_max, gamma, tau


@pytest.mark.parametrize("seed", range(25))
def test_replica_follows_and_divergence_stays_bounded(seed):
    sched, plans, div_max, gamma, tau = random_run(seed)
    server = [(grp.end, grp.members) for p in plans for grp in p.groups]
    replica = [(grp.end, grp.members) for p in plans
               for grp in p.replication.groups]
    unmet = {p.groups[i].end for p in plans for i in p.replication.unmet}
    assert [t for t, _ in server] == sorted(t for t, _ in server)
    assert [t for t, _ in replica] == sorted(t for t, _ in replica)
    s_order = [g.uid for _, m in server for g in m]
    r_order = [g.uid for _, m in replica for g in m]
    assert r_order == s_order[:len(r_order)]          # same order, a prefix
    norms = [g.norm for _, m in server for g in m]
    bounds = _Bounds(0.0, norms, gamma)
    for t, _ in server:          # commits planned at one instant count
        s = sum(len(m) for st, m in server if st <= t)     # together
        p = sum(len(m) for rt, m in replica if rt <= t)
        assert p <= s                                  # never ahead
        if t not in unmet:
            assert bounds(s, p) <= div_max * (1 + 1e-9)
    # every update is applied at the server or dropped; delays <= tau_max
    for p in plans:
        assert all(d <= tau for d in p.delays.values())


def test_divergence_of_real_models_stays_under_div_max():
    """The same with vectors: the server's and the replica's models
    (momentum per update) at every server commit."""
    checked = 0
    for seed in range(40):
        sched, plans, div_max, gamma, _ = random_run(seed)
        if any(p.replication.unmet for p in plans):
            continue
        server = [(grp.end, grp.members) for p in plans for grp in p.groups]
        replica = [(grp.end, len(grp.members)) for p in plans
                   for grp in p.replication.groups]
        rng = np.random.default_rng(seed)
        ups = []
        for _, members in server:
            for g in members:
                u = rng.normal(size=20)
                ups.append(u / np.linalg.norm(u) * g.norm)
        models = momentum_run(np.zeros(20), np.zeros(20), ups, gamma)
        for t, _ in server:
            s = sum(len(m) for st, m in server if st <= t)
            p = sum(n for rt, n in replica if rt <= t)
            assert np.linalg.norm(models[s] - models[p]) <= div_max + 1e-9
            checked += 1
    assert checked > 50


def test_scheduler_carries_versions_and_order_across_batches():
    sched, plans, _, _, tau = random_run(3, batches=8, replica=False)
    version = 0
    for p in plans:
        assert p.v_init == version and p.replication is None
        version += len(p.order)
    assert sched.version == version
    ends = [grp.end for p in plans for grp in p.groups]
    assert ends == sorted(ends)


def test_mlfabric_s_through_the_scheduler():
    out = {n: 10.0 for n in range(6)}
    sched = Scheduler(0, range(6), LinkMonitor(out, dict(out)), tau_max=4,
                      aggregators=[5])
    ups = [Update(i, i, 1.0, 0) for i in (1, 2, 3, 4)]
    agg, seconds = sched.plan_sync(0.0, ups)
    assert sorted(g.uid for grp in agg.groups for g in grp.members) == \
        [1, 2, 3, 4]
    assert sched.server_floor == agg.cost and seconds >= 0


def test_microbenchmark_runs():
    r = scheduler_benchmark(20, repeats=2)
    assert r["n"] == 20 and r["kept"] + r["dropped"] == 20
    assert 0 < r["cpu_total"]["median"] <= r["cpu_total"]["max"]


def test_bench_subcommand_runs():
    import argparse
    from partialcoll.bench import mlfabric_sched
    p = argparse.ArgumentParser()
    mlfabric_sched.add_args(p)
    rows = mlfabric_sched.run(p.parse_args(["--sizes", "8,12",
                                            "--repeat", "1"]))
    assert [r["U"] for r in rows] == [8, 12]
    assert all(r["total_cpu_ms"] > 0 for r in rows)
