"""MLfabric's aggregation (section 5.2, Algorithm 3) and MLfabric-S
(section 6), no MPI: the paper's Fig. 2 case, the cases its pseudocode
leaves open (n = 0, running out of aggregators, k = 0), hand-computed
groups, and the pruned enumeration against every case tried."""
import math
import random

import pytest

from partialcoll.mlfabric.scheduler.aggregation import (aggregate,
                                                        aggregate_sync)
from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.scheduler.ordering import Update, order_updates

INF = math.inf


def groups_of(agg):
    return [(grp.aggregator, [g.uid for g in grp.members])
            for grp in agg.groups]


def unit_net(n_nodes, server_in=1.0, agg_in=1.0, aggregators=()):
    out = {n: 1.0 for n in range(n_nodes)}
    inn = {n: 1.0 for n in range(n_nodes)}
    inn[0] = server_in
    for a in aggregators:
        inn[a] = agg_in
    return NetworkState(out, inn)


def units(workers):
    return [Update(f"g{w}", w, 1.0, 0) for w in workers]


def test_paper_fig2_two_direct_two_aggregated():
    """Fig. 2: four 1 MB updates, server and aggregator links 1 MB/s.
    Direct they commit at 1, 2, 3, 4; with g3 and g4 summed at A (they
    arrive at 1 and 2, no later than the server's link is busy) the sum
    commits at 3 = t'_3 < t_4."""
    net = unit_net(6)
    agg = aggregate(units([1, 2, 3, 4]), net, 0, [5])
    assert agg.n == 2 and agg.cost == pytest.approx(3.0)
    assert groups_of(agg) == [(None, ["g1"]), (None, ["g2"]),
                              (5, ["g3", "g4"])]
    assert [grp.end for grp in agg.groups] == pytest.approx([1, 2, 3])
    assert agg.aggregator_of() == {"g1": None, "g2": None, "g3": 5, "g4": 5}
    assert net.inn[0].is_clear()       # the input NW is not changed


def test_n_zero_aggregates_while_the_server_finishes_the_last_batch():
    """The server's link is busy with the previous batch until 5 (floor):
    with n = 0 the aggregator (4 MB/s in) has all four updates by 1 and
    its sum commits at 6; any direct update would commit at 6 or later
    and push the sum further."""
    nodes = [0, 1, 2, 3, 4, 5, 9]
    inn = {n: 1.0 for n in nodes}
    inn[5] = 4.0
    net = NetworkState({n: 1.0 for n in nodes}, inn)
    net.reserve(9, 0, 0.0, 5.0)             # the previous batch
    agg = aggregate(units([1, 2, 3, 4]), net, 0, [5], floor=5.0)
    assert agg.n == 0 and agg.cost == pytest.approx(6.0)
    assert groups_of(agg) == [(5, ["g1", "g2", "g3", "g4"])]


def test_n_zero_first_update_always_joins_its_group():
    """With t_max = 0 no update could join the first aggregator under the
    printed rule; here the first update of a group always joins.  n = 0
    with two aggregators: g1 opens A (arrives 1) and is summed to the
    server by 2; g2 arrives at A after t_max = 0, so B opens."""
    net = unit_net(7)
    agg = aggregate(units([1, 2]), net, 0, [5, 6])
    # the case n = 0 is worse than n = 1 here; evaluate it explicitly
    from partialcoll.mlfabric.scheduler.aggregation import _det_agg_rest
    trial = net.fork()
    cost, groups = _det_agg_rest(units([1, 2]), trial, 0, [5, 6], 0.0, 0.0,
                                 True, lambda v: False, lambda g: -INF,
                                 lambda i, j: 0.0)
    assert [(grp.aggregator, [g.uid for g in grp.members])
            for grp in groups] == [(5, ["g1"]), (6, ["g2"])]
    assert [grp.end for grp in groups] == pytest.approx([2.0, 3.0])
    assert cost == pytest.approx(3.0)
    assert agg.n == 1 and agg.cost == pytest.approx(2.0)   # g1, then A: g2


def test_running_out_of_aggregators_the_last_takes_the_rest():
    """Five unit updates, one aggregator: k + 1 = 2 groups, so the
    aggregator takes every update after the direct ones whatever its
    arrival.  n = 1: sum of g2..g5 (arrive 1..4) commits at 5; n = 2:
    g3, g4, g5 arrive 1, 2, 3, sum at 4; n = 3: g4, g5 by 2, the server's
    link is busy until 3: 4 too (a tie: the smaller n wins); n = 4: 5."""
    net = unit_net(7)
    agg = aggregate(units([1, 2, 3, 4, 5]), net, 0, [6])
    assert agg.n == 2 and agg.cost == pytest.approx(4.0)
    assert groups_of(agg) == [(None, ["g1"]), (None, ["g2"]),
                              (6, ["g3", "g4", "g5"])]


def test_two_aggregators_hand_computed():
    """Same updates, aggregators A = 6 and B = 7.  n = 1: g1 direct by 1;
    g2 joins A (arrives 1 <= 1); g3 would arrive at A at 2 > 1, so A's sum
    goes (1..2, t_max = 2) and B, the last, takes g3, g4, g5 (1, 2, 3),
    sum 3..4.  n = 2 also costs 4 and n = 0 costs 5: n = 1 wins."""
    net = unit_net(8)
    agg = aggregate(units([1, 2, 3, 4, 5]), net, 0, [6, 7])
    assert agg.n == 1 and agg.cost == pytest.approx(4.0)
    assert groups_of(agg) == [(None, ["g1"]), (6, ["g2"]),
                              (7, ["g3", "g4", "g5"])]
    assert [grp.end for grp in agg.groups] == pytest.approx([1, 2, 4])


def test_no_aggregators_means_all_direct_and_group1_is_algorithm_2():
    net = unit_net(5)
    ups = units([1, 2, 3, 4])
    o = order_updates(ups, net, 0, tau_max=10, v_init=0)
    agg = aggregate(o.order, net, 0, [])
    assert agg.n == 4 and agg.cost == pytest.approx(4.0)
    assert [grp.forward.end for grp in agg.groups] == \
        pytest.approx(o.finish)
    with pytest.raises(ValueError):
        aggregate(ups, net, 0, [0])
    with pytest.raises(ValueError):
        aggregate(ups, net, 0, [3, 3])


def test_commits_keep_their_order():
    """Fast workers into a fast aggregator, a slow server: in ordered mode
    a sum never reaches the server before the group before it."""
    rng = random.Random(7)
    for _ in range(20):
        net, ups = random_net_and_updates(rng, 12)
        aggs = rng.sample(range(1, 9), 3)
        agg = aggregate(ups, net, 0, aggs)
        ends = [grp.end for grp in agg.groups]
        assert ends == sorted(ends)


def test_mlfabric_s_hand_computed():
    """MLfabric-S: an iteration's four updates in the order they became
    ready; aggregator A's link takes two at once (2 MB/s).  n = 0: all four
    to A (1, 1, 2, 2), sum 2..3; n = 1 also ends at 3: the tie goes to
    n = 0, one transfer into the server instead of two."""
    net = unit_net(6, agg_in=2.0, aggregators=[5])
    agg = aggregate_sync(units([1, 2, 3, 4]), net, 0, [5])
    assert agg.n == 0 and agg.cost == pytest.approx(3.0)
    assert groups_of(agg) == [(5, ["g1", "g2", "g3", "g4"])]


def test_mlfabric_s_needs_no_order_between_commits():
    """A slow direct update (0.5 MB/s: done at 2) and two fast ones summed
    at aggregator 4 (ready at 0.2).  In order the sum must not commit
    before the slow one (it is held to 2); MLfabric-S lets it commit at
    0.2 + 1 / 9.5 (the slow transfer keeps 0.5 of the server's 10 MB/s).
    Both finish the batch at 2."""
    out = {0: 10.0, 1: 0.5, 2: 10.0, 3: 10.0, 4: 10.0}
    inn = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0}
    ups = [Update("slow", 1, 1.0, 0), Update("a", 2, 1.0, 0),
           Update("b", 3, 1.0, 0)]
    ordered = aggregate(ups, NetworkState(out, inn), 0, [4])
    sync = aggregate_sync(ups, NetworkState(out, inn), 0, [4])
    for agg in (ordered, sync):
        assert agg.n == 1 and agg.cost == pytest.approx(2.0)
        assert groups_of(agg) == [(None, ["slow"]), (4, ["a", "b"])]
    assert [grp.end for grp in ordered.groups] == pytest.approx([2.0, 2.0])
    assert [grp.end for grp in sync.groups] == \
        pytest.approx([2.0, 0.2 + 1 / 9.5])


# --- the pruned enumeration against every case ----------------------------

def every_case(order, net, dst, aggs, start, floor, ordered):
    """Algorithm 3 as printed (with our choices), every n evaluated."""
    results = []
    for n in range(len(order) + 1):
        if n < len(order) and not aggs:
            continue
        w, t_max, groups = net.fork(), max(start, floor), []
        for g in order[:n]:
            tr = w.reserve(g.worker, dst, start, g.size,
                           t_max if ordered else -INF)
            t_max = max(t_max, tr.end)
            groups.append((None, [g.uid]))
        a, members, arrivals = 0, [], []

        def close():
            ready = max(tr.end for tr in arrivals)
            size = max(g.size for g in members)
            tr = w.reserve(aggs[a], dst, ready, size,
                           t_max if ordered else -INF)
            groups.append((aggs[a], [g.uid for g in members]))
            return max(t_max, tr.end)

        for g in order[n:]:
            t = w.finish(g.worker, aggs[a], start, g.size)
            if members and t > t_max and a + 1 < len(aggs):
                t_max = close()
                a, members, arrivals = a + 1, [], []
            arrivals.append(w.reserve(g.worker, aggs[a], start, g.size))
            members.append(g)
        if members:
            t_max = close()
        results.append((t_max, n, groups))
    return results


def random_net_and_updates(rng, n_updates, n_nodes=9):
    rates = [1.0, 2.5, 3.3, 5.0, 10.0]
    net = NetworkState({w: rng.choice(rates) for w in range(n_nodes)},
                       {w: rng.choice(rates) for w in range(n_nodes)})
    for _ in range(rng.randrange(3)):
        s, d = rng.sample(range(n_nodes), 2)
        net.reserve(s, d, 0.0, rng.uniform(1, 6))
    ups = [Update(i, rng.randrange(1, n_nodes), rng.choice(
        [1.0, 2.0, rng.uniform(0.5, 4)]), 0) for i in range(n_updates)]
    return net, ups


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("ordered", [True, False])
def test_pruned_enumeration_finds_the_best_case(seed, ordered):
    rng = random.Random(seed)
    net, ups = random_net_and_updates(rng, rng.randrange(1, 16))
    aggs = rng.sample(range(1, 9), rng.randrange(0, 4))
    floor = rng.choice([-INF, 2.0])
    got = aggregate(ups, net, 0, aggs, floor=floor, ordered=ordered)
    cases = every_case(ups, net, 0, aggs, 0.0, floor, ordered)
    best = min(c for c, _, _ in cases)
    assert got.cost == pytest.approx(best, rel=1e-9)
    # the smallest n among exact ties; float dust may break a tie either way
    tied = [n for c, n, _ in cases if c <= best * (1 + 1e-12)]
    assert got.n in tied
    if best == min(c for c, n, _ in cases if n == tied[0]):
        assert got.n == tied[0]
    want = [g for c, n, g in cases if n == got.n][0]
    assert groups_of(got) == want
    assert got.cases <= len(cases)


@pytest.mark.parametrize("seed", range(30))
def test_c_trial_cases_match_python(seed):
    """The C trial (_linkops.det_agg_trial) gives bit for bit the cost of
    the Python one, for every case and for bounds that stop it early."""
    from partialcoll.mlfabric.scheduler import aggregation, links
    if links.native is None:
        pytest.skip("partialcoll.mlfabric.scheduler._linkops is not built")
    rng = random.Random(500 + seed)
    net, ups = random_net_and_updates(rng, rng.randrange(1, 16))
    aggs = rng.sample(range(1, 9), rng.randrange(1, 4))
    floor = rng.choice([-INF, 2.0])
    nb = {g.uid: rng.choice([-INF, rng.uniform(0, 6)]) for g in ups}
    for ordered in (True, False):
        cases = aggregation._Cases(ups, net, 0, aggs, 0.0, floor, ordered,
                                   lambda g: nb[g.uid])
        for n in range(len(ups)):
            full = cases.trial(n, INF, True, use_c=False)
            for bound in (INF, full, full * 0.9, rng.uniform(0, 10)):
                for tie_ok in (True, False):
                    assert cases.trial(n, bound, tie_ok) == \
                        cases.trial(n, bound, tie_ok, use_c=False)
