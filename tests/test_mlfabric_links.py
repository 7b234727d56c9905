"""MLfabric's link model (no MPI): t_en over time-varying residual
bandwidth, reservations (NetUp) and their release, floors, forks, and the
lagged monitor the scheduler gets its rates from."""
import math
import random

import pytest

from partialcoll.mlfabric.scheduler.links import (NetworkState, Timeline,
                                                  finish_time, latest_start)
from partialcoll.mlfabric.scheduler.monitor import LinkMonitor


def net_of(out, inn, now=0.0):
    return NetworkState(out, inn, now)


def test_t_en_uses_the_time_varying_residual():
    """Fig. 4b's shape: 30 MB at t = 0 on a 6 MB/s link with 4 MB/s
    reserved until t = 3: 6 MB by t = 3, the other 24 MB at 6 MB/s, done at
    t = 7."""
    net = net_of({1: 100.0, 9: 100.0}, {0: 6.0, 9: 100.0})
    net.reserve(9, 0, 0.0, 12.0)            # a fast sender takes it all
    assert net.inn[0].residual(1.0) == pytest.approx(0.0)
    net = net_of({1: 100.0, 9: 4.0}, {0: 6.0, 9: 100.0})
    net.reserve(9, 0, 0.0, 12.0)            # 9's own link: 4 MB/s for 3 s
    assert net.inn[0].residual(1.0) == pytest.approx(2.0)
    assert net.finish(1, 0, 0.0, 30.0) == pytest.approx(7.0)


def test_t_en_takes_the_slower_link_at_every_instant():
    """The path's residual is min(worker out, server in) over time."""
    net = net_of({1: 2.0, 2: 10.0}, {0: 10.0})
    assert net.finish(1, 0, 0.0, 10.0) == pytest.approx(5.0)   # worker-bound
    net.reserve(2, 0, 0.0, 90.0)            # server full until 9
    assert net.finish(1, 0, 0.0, 10.0) == pytest.approx(14.0)
    assert net.finish(1, 1, 0.0, 10.0) == 0.0                  # local


def test_reservation_leaves_the_other_link_the_difference():
    """Fig. 4c: a 2 MB/s worker into a 10 MB/s server leaves 8 MB/s on the
    server while it sends; the worker's link is then full."""
    net = net_of({1: 2.0, 2: 10.0}, {0: 10.0})
    tr = net.reserve(1, 0, 0.0, 10.0)
    assert (tr.start, tr.end) == (0.0, pytest.approx(5.0))
    assert net.inn[0].residual(2.0) == pytest.approx(8.0)
    assert net.out[1].residual(2.0) == pytest.approx(0.0)
    assert net.inn[0].residual(5.0) == pytest.approx(10.0)
    # the fast worker now gets 8 MB/s until 5, then 10
    assert net.finish(2, 0, 0.0, 48.0) == pytest.approx(5.8)


def test_release_restores_the_link():
    net = net_of({1: 3.0, 2: 7.0}, {0: 5.0})
    before = (list(net.inn[0].times), list(net.inn[0].used))
    a = net.reserve(1, 0, 0.0, 9.0)
    b = net.reserve(2, 0, 1.0, 4.0)
    net.release(a)
    net.release(b)
    assert (net.inn[0].times, net.inn[0].used) == before
    assert net.out[1].is_clear() and net.out[2].is_clear()


def test_random_reservations_released_in_any_order_leave_nothing():
    rng = random.Random(3)
    nodes = range(6)
    net = net_of({n: rng.choice([1, 2.5, 5, 10]) for n in nodes},
                 {n: rng.choice([1, 2.5, 5, 10]) for n in nodes})
    transfers = []
    for _ in range(40):
        s, d = rng.sample(list(nodes), 2)
        transfers.append(net.reserve(s, d, rng.uniform(0, 5),
                                     rng.uniform(0.1, 20),
                                     floor=rng.choice([-math.inf, 8.0])))
        for link in list(net.out.values()) + list(net.inn.values()):
            assert all(0 <= u <= link.cap for u in link.used)
            assert link.times == sorted(link.times)
    rng.shuffle(transfers)
    for tr in transfers:
        net.release(tr)
    for link in list(net.out.values()) + list(net.inn.values()):
        assert link.is_clear(), link


def test_floor_makes_a_transfer_complete_at_the_floor():
    """A transfer that would be through at 2 but must not complete before
    5 starts late (3) and uses the capacity just before the floor."""
    net = net_of({1: 10.0}, {0: 10.0})
    tr = net.reserve(1, 0, 0.0, 20.0, floor=5.0)
    assert (tr.start, tr.end) == (pytest.approx(3.0), pytest.approx(5.0))
    assert net.inn[0].residual(1.0) == 10.0
    assert latest_start(net.out[1], net.inn[0], 0.0, 2.0, 30.0) is None


def test_forks_do_not_see_each_other():
    net = net_of({1: 1.0, 2: 1.0}, {0: 1.0})
    a = net.fork()
    a.reserve(1, 0, 0.0, 1.0)
    b = net.fork()
    assert net.finish(2, 0, 0.0, 1.0) == b.finish(2, 0, 0.0, 1.0) == 1.0
    assert a.finish(2, 0, 0.0, 1.0) == 2.0
    net.reserve(2, 0, 0.0, 3.0)
    assert a.finish(2, 0, 0.0, 1.0) == 2.0 and b.finish(2, 0, 0.0, 1.0) == 1.0


def test_new_rates_keep_the_reservations_and_forget_the_past():
    net = net_of({1: 10.0}, {0: 10.0})
    net.reserve(1, 0, 0.0, 30.0)             # [0, 3) full
    net.set_rates(1.0, {1: 5.0}, {0: 20.0})
    link = net.inn[0]
    assert link.times[0] == 1.0 and link.cap == 20.0
    assert link.residual(2.0) == pytest.approx(10.0)
    assert net.finish(1, 0, 1.0, 5.0) == pytest.approx(4.0)   # out is full


def test_a_link_must_have_a_rate():
    with pytest.raises(ValueError):
        Timeline(0.0)
    net = net_of({1: 1.0}, {0: 1.0})
    assert finish_time(net.out[1], net.inn[0], 0.0, 0.0) == 0.0


def test_monitor_reports_only_after_the_lag():
    mon = LinkMonitor({0: 10.0, 1: 10.0}, {0: 10.0, 1: 10.0}, lag=0.2)
    mon.observe_transfer(1.0, 1, 0, 2.0, 0.4)        # 5 B/s
    assert mon.rates(1.1) == ({0: 10.0, 1: 10.0}, {0: 10.0, 1: 10.0})
    assert mon.rates(1.2) == ({0: 10.0, 1: 5.0}, {0: 5.0, 1: 10.0})


def test_monitor_a_slow_other_end_does_not_drag_a_nic_down():
    """Server 0's incoming NIC carries 20 B/s from worker 1; then worker
    2, whose own NIC is slow (its flows to 3 show 2 B/s), pushes at 2 B/s
    for a long time: the server keeps 20, worker 2 gets 2."""
    mon = LinkMonitor({n: 100.0 for n in range(4)},
                      {n: 100.0 for n in range(4)}, lag=0.0)
    mon.observe_transfer(1.0, 1, 0, 20.0, 1.0)        # 1 -> 0 at 20
    mon.observe_transfer(1.0, 1, 3, 20.0, 1.0)        # 1 -> 3 at 20 (both)
    mon.observe_transfer(2.0, 2, 3, 2.0, 1.0)         # 2 -> 3 at 2
    for k in range(10):                               # 2 -> 0 at 2, for 10 s
        mon.observe_transfer(3.0 + k, 2, 0, 2.0, 1.0)
    out, inn = mon.rates(13.0)
    assert inn[0] == 20.0 and out[2] == 2.0
    assert out[1] == 40.0            # its two flows at once add up


def test_monitor_adds_up_concurrent_flows():
    """Two 10 B/s flows into 0 at the same time show a 20 B/s NIC, and a
    short flow beside a long one is not counted twice (the load is the
    bytes over the union of their intervals)."""
    mon = LinkMonitor({}, {0: 100.0}, lag=0.0)
    mon.observe_transfer(1.0, 1, 0, 10.0, 1.0)
    mon.observe_transfer(1.0, 2, 0, 10.0, 1.0)
    assert mon.estimate(1.0, 0, "in") == 20.0
    mon = LinkMonitor({}, {0: 1.0}, lag=0.0)         # (an estimate too low)
    mon.observe_transfer(1.5, 2, 0, 1.0, 0.1)        # 1.4-1.5 at 10
    mon.observe_transfer(2.0, 1, 0, 19.0, 1.0)       # 1.0-2.0, 19 on average
    assert mon.estimate(2.0, 0, "in") == pytest.approx(20.0)


def test_monitor_fairness_rules_out_an_end():
    """Flows into 0 at 18 and at 2 at the same time: under max-min
    fairness 0 cannot be the 2 B/s flow's bottleneck (a flow there moved
    faster), so its sender 2 is the slow end, however stale its estimate."""
    mon = LinkMonitor({1: 100.0, 2: 100.0}, {0: 100.0}, lag=0.0)
    mon.observe_transfer(1.0, 2, 0, 2.0, 1.0)
    mon.observe_transfer(1.0, 1, 0, 18.0, 1.0)
    out, inn = mon.rates(1.0)
    assert out[2] == 2.0 and out[1] == 18.0 and inn[0] == 20.0


def test_monitor_a_rate_that_fell_shows_at_the_first_contradiction():
    """Server 0's incoming NIC at 20 (its last use at t = 1), worker 1's
    outgoing at 20 (fully used until t = 3.8, a flow to 3); at t = 4 the
    1 -> 0 flow moves at 5: both ends had room, and the one not used to
    its estimate in the last 0.5 s (the server's) is lowered."""
    mon = LinkMonitor({}, {}, lag=0.0, window=0.5)
    mon.observe_transfer(1.0, 2, 0, 20.0, 1.0)
    mon.observe_transfer(3.8, 1, 3, 20.0, 1.0)
    mon.observe_transfer(4.0, 1, 0, 1.0, 0.2)
    assert mon.estimate(4.0, 0, "in") == 5.0
    assert mon.estimate(4.0, 1, "out") == 20.0
    mon.observe_transfer(9.0, 4, 5, 20.0, 1.0)        # 4 -> 5 at 20
    mon.observe_transfer(10.0, 4, 5, 5.0, 1.0)        # no recent use:
    assert mon.rates(10.0)[0][4] == 5.0               # both lowered
    assert mon.rates(10.0)[1][5] == 5.0
    mon.report(10.5, 0, "in", 6.0)                    # a direct report wins
    assert mon.estimate(10.5, 0, "in") == 6.0


def test_monitor_takes_late_measurements_in_time_order():
    """Measurements reported out of order are applied in the order they
    were made, once visible; asking at an earlier time changes nothing."""
    mon = LinkMonitor({0: 10.0, 1: 10.0}, {0: 10.0, 1: 10.0}, lag=0.5)
    mon.observe_transfer(2.0, 0, 1, 3.0, 1.0)        # reported first
    mon.observe_transfer(1.0, 0, 1, 8.0, 1.0)        # made first
    assert mon.estimate(1.4, 0, "out") == 10.0       # neither visible yet
    assert mon.estimate(2.5, 0, "out") == 3.0        # 8, then 3
    assert mon.estimate(1.0, 0, "out") == 3.0


def test_monitor_never_reads_the_true_rates():
    """Nothing but its own inputs: an unknown NIC without measurements
    has no rate (inf), and a bad measurement or setting is refused."""
    mon = LinkMonitor({}, {}, lag=0.0)
    assert mon.estimate(5.0, 3, "in") == math.inf
    with pytest.raises(ValueError):
        mon.report(0.0, 1, "up", 1.0)
    with pytest.raises(ValueError):
        mon.report(0.0, 1, "out", 0.0)
    with pytest.raises(ValueError):
        LinkMonitor({}, {}, slack=1.0)


# --- the C loops against the Python ones ----------------------------------

def random_timelines(rng, count=8):
    """Timelines shaped by random reservations and releases (Python)."""
    links = []
    for _ in range(count):
        link = Timeline(rng.choice([1.0, 2.5, 10.0, math.inf]), 0.0)
        for _ in range(rng.randrange(6)):
            a = rng.uniform(0, 5)
            pts = sorted({a, a + rng.uniform(0.01, 4), rng.uniform(0, 9)})
            if pts[0] < 0 or len(pts) < 2:
                continue
            cap = link.cap if link.cap < math.inf else 50.0
            rates = [rng.uniform(0, cap / 2) for _ in pts[:-1]]
            link = link._py_added(pts, rates, rng.choice([1.0, 1.0, -1.0])
                                  if rng.random() < 0.2 else 1.0)
        links.append(link)
    return links


def test_c_loops_match_python_bit_for_bit():
    from partialcoll.mlfabric.scheduler import links
    if links.native is None:
        pytest.skip("partialcoll.mlfabric.scheduler._linkops is not built")
    rng = random.Random(11)
    for _ in range(300):
        a, b = rng.sample(random_timelines(rng, 4), 2)
        start = rng.choice([0.0, rng.uniform(0, 8)])
        size = rng.choice([0.0, rng.uniform(0.01, 40)])
        assert links.native.finish_time(a, b, start, size) == \
            links._py_finish_time(a, b, start, size)
        c_fill = links.native.fill(a, b, start, size)
        assert c_fill == links._py_fill(a, b, start, size)
        end = start + rng.uniform(0, 10)
        assert links.native.latest_start(a, b, start, end, size) == \
            links._py_latest_start(a, b, start, end, size)
        end, points, rates = c_fill
        if end < math.inf and rates:
            for sign in (1.0, -1.0):
                for link in (a, b):
                    want = link._py_added(points, rates, sign)
                    got = link.added(points, rates, sign)
                    assert type(got) is Timeline and got.cap == link.cap
                    assert (got.times, got.used) == (want.times, want.used)
    with pytest.raises(ValueError):
        links.native.added(Timeline(1.0, 5.0), [1.0, 2.0], [0.5], 1.0)


def test_pure_python_plans_the_same_as_c():
    """The whole scheduler with the Python loops (a fresh interpreter with
    PARTIALCOLL_MLFABRIC_PURE_PYTHON=1) plans exactly what it plans with
    the C ones."""
    import json
    import os
    import subprocess
    import sys
    from partialcoll.mlfabric.scheduler import links
    if links.native is None:
        pytest.skip("partialcoll.mlfabric.scheduler._linkops is not built")
    code = ("import json, numpy as np\n"
            "from partialcoll.mlfabric.scheduler.microbench import random_batch\n"
            "from partialcoll.mlfabric.scheduler.monitor import LinkMonitor\n"
            "from partialcoll.mlfabric.scheduler import Scheduler\n"
            "from partialcoll.mlfabric.scheduler import links\n"
            "out, inn, ups, tau = random_batch(60, np.random.default_rng(5))\n"
            "s = Scheduler(0, sorted(out), LinkMonitor(out, inn), tau, 3, 1,"
            " 2, div_max=8.0, gamma=0.9)\n"
            "p = s.plan(0.0, ups)\n"
            "print(json.dumps([links.native is None, [[g.uid for g in grp.members]"
            " for grp in p.groups], [grp.end for grp in p.groups],"
            " [grp.end for grp in p.replication.groups]]))\n")
    env = dict(os.environ, PARTIALCOLL_MLFABRIC_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    pure = json.loads(out.strip().splitlines()[-1])
    env.pop("PARTIALCOLL_MLFABRIC_PURE_PYTHON")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    fast = json.loads(out.strip().splitlines()[-1])
    assert pure[0] is True and fast[0] is False
    assert pure[1:] == fast[1:]
