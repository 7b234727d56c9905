"""MLfabric's update ordering (section 5.1, Algorithms 1 and 2; no MPI):
the paper's own Fig. 5 case, an order where shortest-job-first by
size/rate differs from t_en with reservations, deadlines (Eq. 9), the
look-ahead drop, and the invariant "no update is applied with a delay
above tau_max" over random batches; the fast implementation against a
literal one."""
import math
import random

import pytest

from partialcoll.mlfabric.scheduler.aggregation import aggregate
from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.scheduler.ordering import (Update, deadline, delays,
                                                     order_updates)

INF = math.inf


def uids(updates):
    return [g.uid for g in updates]


def test_paper_fig5_drops_the_update_that_would_hold_the_link():
    """Fig. 5: dl(g1) = 1, dl(g2) = 5; g1 is behind a 10 Mb/s link and
    takes 10 s, g2 gets the other 90 Mb/s and is through in 1.1 s: g1 is
    dropped at the worker, g2 goes alone (then at the full 100 Mb/s)."""
    net = NetworkState({1: 10.0, 2: 100.0, 0: 100.0},
                       {0: 100.0, 1: 100.0, 2: 100.0})
    g1, g2 = Update("g1", 1, 100.0, 0), Update("g2", 2, 99.0, 4)
    assert deadline(g1, 1, 0) == 1 and deadline(g2, 1, 0) == 5
    o = order_updates([g1, g2], net, server=0, tau_max=1, v_init=0)
    assert uids(o.order) == ["g2"]
    assert o.dropped == [(g1, "lookahead")]
    assert o.finish == [pytest.approx(0.99)]
    assert net.inn[0].is_clear()             # the input NW is not changed


def test_order_is_by_completion_not_by_size_over_rate():
    """Worker 1's link is still busy with an earlier transfer until t = 2:
    its 1 MB update has size/rate 0.1 s but is through at 2.1; worker 2's
    5 MB update (size/rate 0.5 s) is through at 0.5, so it goes first."""
    net = NetworkState({1: 10.0, 2: 10.0, 3: 100.0},
                       {0: 100.0, 3: 10.0})
    net.reserve(1, 3, 0.0, 20.0)            # 1 -> 3 until t = 2
    a, b = Update("a", 1, 1.0, 0), Update("b", 2, 5.0, 0)
    assert a.size / 10.0 < b.size / 10.0    # what SJF by size/rate picks
    o = order_updates([a, b], net, 0, tau_max=10, v_init=0)
    assert uids(o.order) == ["b", "a"]
    assert o.finish == [pytest.approx(0.5), pytest.approx(2.1)]


def test_reservations_change_the_next_pick():
    """Server 10 MB/s.  x (2 MB/s worker, 1.6 MB) is through at 0.8 and
    leaves 8 MB/s meanwhile.  Alone, y (10 MB/s, 9 MB) would be through at
    0.9 and z (8 MB/s, 8.4 MB) at 1.05; beside x, z still gets its 8 but y
    only 8 until 0.8: z at 1.05, y at 1.06 -> after z, 1.9.  Size over rate
    says x, y, z."""
    net = NetworkState({1: 2.0, 2: 10.0, 3: 8.0}, {0: 10.0})
    x, y, z = (Update("x", 1, 1.6, 0), Update("y", 2, 9.0, 0),
               Update("z", 3, 8.4, 0))
    by_size_rate = sorted([x, y, z], key=lambda g: g.size /
                          net.out[g.worker].cap)
    assert uids(by_size_rate) == ["x", "y", "z"]
    o = order_updates([x, y, z], net, 0, tau_max=10, v_init=0)
    assert uids(o.order) == ["x", "z", "y"]
    assert o.finish == pytest.approx([0.8, 1.05, 1.9])


def test_a_deadline_forces_a_pick_and_equal_deadlines_share_positions():
    """dl = v + tau_max - v_init.  Two updates with deadline 2 take
    positions 1 and 2 (the printed rule would wait until i = 2 and miss
    one) although the short one would be through first; the server link is
    the bottleneck, so the short one cannot overtake them (no drop)."""
    net = NetworkState({1: 100.0, 2: 100.0, 3: 100.0}, {0: 10.0})
    short = Update("short", 3, 1.0, 10)
    big1, big2 = Update("big1", 1, 50.0, 0), Update("big2", 2, 60.0, 0)
    o = order_updates([short, big1, big2], net, 0, tau_max=2, v_init=0)
    assert uids(o.order) == ["big1", "big2", "short"]
    assert o.finish == pytest.approx([5.0, 11.0, 11.1])
    assert not o.dropped
    # with room at the server the short one would overtake big2, so big2
    # is dropped at the worker (Alg 2 line 11)
    net = NetworkState({1: 10.0, 2: 10.0, 3: 10.0}, {0: 100.0})
    o = order_updates([short, big1, big2], net, 0, tau_max=2, v_init=0)
    assert uids(o.order) == ["big1", "short"]
    assert o.dropped == [(big2, "lookahead")]


def test_stale_and_missed_deadlines_are_dropped():
    """v_init = 10, tau_max = 3: an update from version 6 has dl = -1
    (stale); three from version 8 have dl = 1 and share one position."""
    net = NetworkState({w: 10.0 for w in range(1, 5)}, {0: 100.0})
    ups = [Update("old", 1, 1.0, 6)] + \
        [Update(f"u{w}", w, float(w), 8) for w in (2, 3, 4)]
    o = order_updates(ups, net, 0, tau_max=3, v_init=10)
    assert uids(o.order) == ["u2"]
    assert set((g.uid, r) for g, r in o.dropped) == {
        ("old", "stale"), ("u3", "deadline"), ("u4", "deadline")}


def test_position_after_a_drop_is_kept_count_plus_one():
    """The printed loop's counter would move past position 1 after g1's
    drop; g3 (deadline 1) must still be placed first."""
    net = NetworkState({1: 1.0, 2: 10.0, 3: 10.0}, {0: 10.0})
    g1 = Update("g1", 1, 10.0, 0)      # dl 1, 10 s
    g3 = Update("g3", 3, 5.0, 0)       # dl 1, 0.5 s
    g2 = Update("g2", 2, 1.0, 5)       # dl 6, fast
    o = order_updates([g1, g2, g3], net, 0, tau_max=1, v_init=0)
    assert uids(o.order)[0] == "g3"
    assert ("g1", "deadline") in [(g.uid, r) for g, r in o.dropped] or \
        ("g1", "lookahead") in [(g.uid, r) for g, r in o.dropped]


def test_floor_keeps_batches_in_order():
    """The last commit of the previous batch ends at 5: nothing of this
    batch completes earlier."""
    net = NetworkState({1: 10.0}, {0: 10.0})
    o = order_updates([Update("a", 1, 10.0, 0)], net, 0, 5, 0, floor=5.0)
    assert o.finish == [pytest.approx(5.0)]
    assert o.transfers[0].start == pytest.approx(4.0)


# --- the fast implementation against the algorithm as printed -------------

def literal_order(updates, net, server, tau_max, v_init, floor=-INF,
                  start=None):
    """Algorithm 2 with our choices, computed the slow way: every t_en
    recomputed at every step, the look-ahead tested at every pick."""
    start = net.now if start is None else start
    work, index = net.fork(), {g.uid: i for i, g in enumerate(updates)}
    dl = {g.uid: g.version + tau_max - v_init for g in updates}
    dropped = {(g.uid, "stale") for g in updates if dl[g.uid] < 1}
    pending = [g for g in updates if dl[g.uid] >= 1]
    order = []

    def t_en(g, nw):
        return nw.finish(g.worker, server, start, g.size)

    def pick(pos, pend, nw):
        live = [g for g in pend if dl[g.uid] >= pos]
        ds = sorted(dl[g.uid] for g in live)
        if any(d - k <= pos - 1 for k, d in enumerate(ds, 1)):
            live = [g for g in live if dl[g.uid] == ds[0]]
        return min(live, key=lambda g: (t_en(g, nw), index[g.uid]))

    while pending:
        pos = len(order) + 1
        dropped |= {(g.uid, "deadline") for g in pending if dl[g.uid] < pos}
        pending = [g for g in pending if dl[g.uid] >= pos]
        if not pending:
            break
        g = pick(pos, pending, work)
        rest = [x for x in pending if x is not g]
        trial = work.fork()
        tr = trial.reserve(g.worker, server, start, g.size, floor)
        nxt = [x for x in rest if dl[x.uid] >= pos + 1]
        pending = rest
        if nxt and t_en(g, work) > t_en(pick(pos + 1, nxt, trial), trial):
            dropped.add((g.uid, "lookahead"))
            continue
        work, floor = trial, tr.end
        order.append(g)
    return uids(order), dropped


def random_case(rng, n_updates, n_workers, reserved=True):
    rates = [1.0, 2.5, 3.3, 5.0, 10.0]
    nodes = range(n_workers + 2)
    net = NetworkState({w: rng.choice(rates) for w in nodes},
                       {w: rng.choice(rates) for w in nodes})
    if reserved:                      # transfers of earlier batches
        for _ in range(rng.randrange(4)):
            s, d = rng.sample(list(nodes), 2)
            net.reserve(s, d, 0.0, rng.uniform(1, 10))
    sizes = [rng.choice([2.0, 4.0, 5.0, rng.uniform(1, 8)])
             for _ in range(n_updates)]
    ups = [Update(i, rng.randrange(1, n_workers + 1), sizes[i],
                  rng.randrange(-n_updates, 3))
           for i in range(n_updates)]
    return net, ups


@pytest.mark.parametrize("seed", range(40))
def test_fast_ordering_matches_the_literal_reference(seed):
    rng = random.Random(seed)
    net, ups = random_case(rng, rng.randrange(1, 14), rng.randrange(1, 7))
    tau = rng.randrange(1, 12)
    floor = rng.choice([-INF, 0.0, 3.0])
    o = order_updates(ups, net, 0, tau, 0, floor=floor)
    want_order, want_dropped = literal_order(ups, net, 0, tau, 0, floor)
    assert uids(o.order) == want_order
    assert {(g.uid, r) for g, r in o.dropped} == want_dropped


def commits_in_arrival_order(groups):
    """The server applies commits as they arrive (stable for ties)."""
    return [grp.members for grp in sorted(groups, key=lambda g: g.end)]


@pytest.mark.parametrize("seed", range(30))
def test_no_update_is_applied_with_a_delay_above_tau_max(seed):
    """Random batches one after the other (versions carried over, the
    network kept): ordering then aggregation; every update kept is applied
    with a delay <= tau_max when commits are applied as they arrive, and
    every update is either applied or dropped."""
    rng = random.Random(1000 + seed)
    tau = rng.randrange(1, 10)
    net, _ = random_case(rng, 0, 6, reserved=False)
    version, floor, now, uid = 0, -INF, 0.0, 0
    for batch in range(5):
        ups = []
        for _ in range(rng.randrange(0, 10)):
            ups.append(Update(uid, rng.randrange(1, 7),
                              rng.uniform(1, 8),
                              version - rng.randrange(0, tau + 3)))
            uid += 1
        o = order_updates(ups, net, 0, tau, version, floor, now)
        assert o.finish == sorted(o.finish)
        assert all(o.finish[k] >= floor for k in range(len(o.finish)))
        agg = aggregate(o.order, net, 0, rng.sample(range(1, 7), 2), now,
                        floor)
        net.adopt(agg.net)
        groups = commits_in_arrival_order(agg.groups)
        got = delays(groups, version)
        assert all(d <= tau for d in got.values()), got
        assert set(got) | {g.uid for g, _ in o.dropped} == \
            {g.uid for g in ups}
        version += len(got)
        if agg.groups:
            floor = max(floor, max(grp.end for grp in agg.groups))
        now += rng.uniform(0.5, 3)
        net.set_rates(now, {n: l.cap for n, l in net.out.items()},
                      {n: l.cap for n, l in net.inn.items()})
