"""The load-distribution planner (no MPI): Algorithm 1 against the exact
optimum, shares never negative, N = 2, slice assignment (Algorithm 2), and
NIC rates from link measurements (arrival stamps per link), which of them
the scheduler believes, and how it follows them from call to call."""
import math

import numpy as np
import pytest

from partialcoll.loadbalance.plan import (assign_slices, binding,
                                          integer_shares,
                                          distribute, follow,
                                          held_estimates, link_rates,
                                          nic_rates, node_throughput,
                                          node_times, optimal_shares,
                                          probe_sizes)


def test_equal_throughputs_keep_equal_shares():
    m, moves = distribute(12.0, [5.0] * 4)
    assert m == [3.0] * 4 and moves == 0


def test_small_hand_case():
    """N = 3, M = 12, S = (1, 1, 2): a = 1, every node finishes at
    T = 12 (1 + 3) / 4 = 12 with m = (0, 0, 12)."""
    assert optimal_shares(12.0, [1, 1, 2]) == pytest.approx([0, 0, 12])
    m, _ = distribute(12.0, [1, 1, 2], threshold=1e-9)
    assert m == pytest.approx([0, 0, 12], abs=1e-6)
    assert max(node_times(12.0, m, [1, 1, 2])) == pytest.approx(12)


def test_a_node_too_slow_for_any_share_gets_none():
    """S = (0.5, 4, 4, 4), M = 10: node 0 needs 10 / 0.5 = 20 even with no
    share; the others split M: T = 10 (2 + 3) / 12, m = 10/3 each."""
    S = [0.5, 4, 4, 4]
    want = optimal_shares(10.0, S)
    assert want == pytest.approx([0, 10 / 3, 10 / 3, 10 / 3])
    m, _ = distribute(10.0, S, threshold=1e-9)
    assert min(m) >= 0 and sum(m) == pytest.approx(10)
    assert m == pytest.approx(want, abs=1e-6)


def test_two_nodes_shares_do_not_matter():
    assert distribute(8.0, [1.0, 9.0]) == ([4.0, 4.0], 0)
    t = node_times(8.0, [1.0, 7.0], [1.0, 9.0])
    assert t == node_times(8.0, [4.0, 4.0], [1.0, 9.0])


@pytest.mark.parametrize("seed", range(20))
def test_algorithm_1_reaches_the_optimum(seed):
    rng = np.random.default_rng(seed)
    N = int(rng.integers(3, 9))
    S = list(rng.uniform(2, 25, N))
    M = 1e6
    m, moves = distribute(M, S, threshold=0.01)
    assert min(m) >= 0 and sum(m) == pytest.approx(M)
    best = max(node_times(M, optimal_shares(M, S), S))
    got = max(node_times(M, m, S))
    assert best <= got <= best * 1.01 + 1e-9
    assert moves < 1000


def test_slices_cover_the_vector_with_probes_for_every_server():
    shares = [0, 600_000, 300_000, 100_000]
    sl = assign_slices(1_000_000, shares, 120_000, num_probe=2,
                       size_probe=10_000)
    pos = 0
    for start, count, owner, probe in sl:
        assert start == pos and count > 0
        pos += count
    assert pos == 1_000_000
    probes = [s for s in sl if s[3]]
    assert [s[2] for s in probes] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert probes == sorted(probes) and sl[:8] == probes   # probes first
    owned = [sum(c for _, c, o, _ in sl if o == j) for j in range(4)]
    assert all(c <= 120_000 for _, c, _, _ in sl)
    # server 0 holds its probes (20,000 over its share); the others get their
    # shares, the last server filled giving up what server 0 holds: worked
    # by hand, left after the probes -20k / 580k / 280k / 80k, then
    # 120k to 1, 1, 1, 2, 1, 2; 100k to 1; 80k to 3; the last 20k to 2
    assert owned == [20_000, 600_000, 280_000, 100_000]


def test_slices_give_servers_their_exact_shares():
    # 4 MB of float32 at 8 ranks: 8 equal-size slices would give seven
    # servers 140,000 and one 20,000 (its probes); the plan is 125,000 each
    sl = assign_slices(1_000_000, [125_000.0] * 8, 120_000)
    owned = [sum(c for _, c, o, _ in sl if o == j) for j in range(8)]
    assert owned == [125_000] * 8
    assert [c for _, c, _, p in sl if not p] == [105_000] * 8   # after probes
    shares = [0.1, 333_333.4, 333_333.3, 333_333.2]      # not whole
    sl = assign_slices(1_000_000, shares, 120_000, num_probe=0)
    owned = [sum(c for _, c, o, _ in sl if o == j) for j in range(4)]
    assert owned == [0, 333_334, 333_333, 333_333]
    assert sum(owned) == 1_000_000


def test_small_shares_get_small_probes():
    """min_probe: a server planned below num_probe * size_probe gets probes
    of its share split over them, at least min_probe; the others keep
    size_probe.  Worked by hand: shares 0 / 15,000 / 985,000 (sum 1M)."""
    shares = [0, 15_000, 985_000]
    assert probe_sizes(1_000_000, shares, 2, 10_000) == [10_000] * 3
    assert probe_sizes(1_000_000, shares, 2, 10_000, 1_000) == \
        [1_000, 7_500, 10_000]
    assert probe_sizes(1_000_000, shares, 0, 10_000, 1_000) == [0, 0, 0]
    assert probe_sizes(1_000_000, shares, 2, 500, 1_000) == [500] * 3
    # a short vector caps every probe first (10 // (3 * 2) = 1)
    assert probe_sizes(10, [0, 2, 8], 2, 10_000, 1_000) == [1, 1, 1]
    sl = assign_slices(1_000_000, shares, 120_000, 2, 10_000, min_probe=1_000)
    probes = [(c, o) for _, c, o, p in sl if p]
    assert probes == [(1_000, 0)] * 2 + [(7_500, 1)] * 2 + [(10_000, 2)] * 2
    owned = [sum(c for _, c, o, _ in sl if o == j) for j in range(3)]
    # server 0 holds its 2,000 probe elements, the last one filled gives
    # them up; server 1 gets exactly its share
    assert owned == [2_000, 15_000, 983_000]
    assert sum(owned) == 1_000_000
    # what it is for: at 8 ranks and 4 MB, a share-0 node's load over its
    # floor M is (N - 2) * its probe elements / M: 12 % with the paper's
    # fixed probes, 1.2 % with min_probe = 1,000
    M, N = 1_000_000, 8
    shares = [0] + [M / 7] * 7
    for mp, over in ((None, 0.12), (1_000, 0.012)):
        sl = assign_slices(M, shares, 30_000, 2, 10_000, min_probe=mp)
        got = sum(c for _, c, o, _ in sl if o == 0)
        assert (N - 2) * got / M == pytest.approx(over)


def test_integer_shares():
    assert integer_shares(10, [2.5, 2.5, 5.0]) == [3, 2, 5]
    assert integer_shares(7, [1.0, 1.0, 1.0]) == [3, 2, 2]   # rescaled
    assert integer_shares(5, [0.0, 0.0]) == [3, 2]
    assert integer_shares(4, [-1.0, 4.0]) == [0, 4]


def test_short_vectors_shrink_probes():
    sl = assign_slices(10, [5, 5], 4, num_probe=2, size_probe=1000)
    assert sum(c for _, c, _, _ in sl) == 10
    assert all(c == 2 for _, c, _, p in sl if p)
    assert assign_slices(0, [1, 1], 4) == []


def link(*arrivals, until=None, resume=None):
    """A link's report: its arrivals, when its last message came (by
    default its last slice: no averages came back after) and when its
    averages went on the wire (by default: straight after its slices)."""
    return (list(arrivals), arrivals[-1][0] if until is None else until,
            resume)


def test_link_rates_are_bytes_over_the_span():
    """s_ij: slice bytes (not the forecast's) from the forecast's arrival
    to the last slice's; a link with no span is left out."""
    reports = {(0, 1): link((1.0, 0), (1.5, 1e6), (2.0, 1e6), until=3.0),
               (2, 1): link((1.0, 0), (1.25, 5e5)),
               (3, 1): link((1.0, 0))}
    assert link_rates(reports) == {(0, 1): 2e6, (2, 1): 2e6}


# Node 0's outgoing NIC carries 2 MB/s; both its links start at t = 0.  The
# link to 2 carries 1 MB and ends at t = 1 (1 MB/s, half the NIC); the link
# to 1 then has the whole NIC: 1 MB in [0, 1], 2 MB in [1, 2].
SPLIT = {(0, 1): link((0.0, 0), (0.5, 5e5), (1.0, 5e5), (1.5, 1e6),
                      (2.0, 1e6)),
         (0, 2): link((0.0, 0), (0.5, 5e5), (1.0, 5e5))}


def test_summing_link_rates_overcounts_a_nic_whose_links_end_apart():
    s = link_rates(SPLIT)
    assert s == {(0, 1): 1.5e6, (0, 2): 1e6}      # 2.5 MB/s: 25 % over


def test_nic_rate_over_the_stretch_its_links_shared():
    """Over [0, 1], where both links were on the wire: 2 MB in 1 s.  The
    receivers' NICs each saw one link: its rate over its own span (what
    they carried: a lower bound)."""
    out, inn = nic_rates(SPLIT)
    assert out[0] == pytest.approx(2e6)
    assert inn[1] == pytest.approx(1.5e6) and inn[2] == pytest.approx(1e6)
    assert math.isnan(inn[0]) and math.isnan(out[1]) and math.isnan(out[2])
    out, inn = nic_rates(SPLIT, N=4)
    assert len(out) == len(inn) == 4 and math.isnan(out[3])


def test_links_kept_apart_by_a_late_start():
    """Node 3's incoming NIC (1 MB/s): the link from 0 ran alone before the
    others started; those from 1 and 2 shared the NIC (0.5 MB/s each) over
    [0.2, 0.3] only.  The sum of s_ij counts each link's time alone as if
    all were at once (2.33 MB/s); the stretch with the most links on the
    wire gives the NIC's rate."""
    reports = {(0, 3): link((0.0, 0), (0.1, 1e5)),
               (1, 3): link((0.15, 0), (0.2, 5e4), (0.3, 5e4)),
               (2, 3): link((0.2, 0), (0.3, 5e4), (0.35, 5e4))}
    assert sum(link_rates(reports).values()) == pytest.approx(7e6 / 3)
    _, inn = nic_rates(reports)
    assert inn[3] == pytest.approx(1e6)


def test_a_straggling_link_does_not_dilute_the_nic():
    """Node 0 (2 MB/s out) sends to 1 and to 2, whose own NIC holds its
    link to 0.2 MB/s: max-min fair, the link to 1 gets 1.8 MB/s.  Bytes
    over the union of the spans (2.4 MB in 3 s) would undercount; the
    stretch both were on the wire gives 2 MB/s."""
    reports = {(0, 1): link((0.0, 0), (1.0, 1.8e6)),
               (0, 2): link((0.0, 0), (1.0, 2e5), (2.0, 2e5), (3.0, 2e5))}
    out, _ = nic_rates(reports)
    assert out[0] == pytest.approx(2e6)


def test_a_slice_across_the_stretch_edge_is_split_by_nic_share():
    """Node 2's incoming NIC (2 MB/s) limits both its links.  The link from
    0 runs alone at 2 MB/s from t = 0, the one from 1 joins at 0.5 (1 MB/s
    each), the first ends at 1.5 and the second runs alone to 2.  Each
    carries one 2 MB slice, so the stretch they shared, [0.5, 1.5], cuts
    both.  Split by time, 4/3 MB of each would fall inside (2.67 MB/s);
    split by the NIC's share per flow (1 alone, 1/2 together), 1 MB each:
    2 MB/s."""
    reports = {(0, 2): link((0.0, 0), (1.5, 2e6)),
               (1, 2): link((0.5, 0), (2.0, 2e6))}
    _, inn = nic_rates(reports)
    assert inn[2] == pytest.approx(2e6)


def test_averages_after_the_slices_still_share_the_nic():
    """Node 2's incoming NIC (2 MB/s): the links from 0 and 1 start
    together at 1 MB/s each; 0's slices end at t = 1, but its averages then
    come on the same link until t = 2, so the one 2 MB slice from 1 keeps
    half the NIC: 1 MB before t = 1, 1 MB after.  Counting the link from 0
    as gone at t = 1 would put only 2/3 MB of that slice before it."""
    reports = {(0, 2): link((0.0, 0), (1.0, 1e6), until=2.0),
               (1, 2): link((0.0, 0), (2.0, 2e6))}
    _, inn = nic_rates(reports)
    assert inn[2] == pytest.approx(2e6)
    reports[(0, 2)] = link((0.0, 0), (1.0, 1e6))
    assert nic_rates(reports)[1][2] == pytest.approx(5e6 / 3)


def test_a_link_idle_until_its_averages_is_no_flow():
    """Node 2's incoming NIC (2 MB/s): the links from 0 and 1 start
    together at 1 MB/s each; 0's one 0.5 MB slice ends at t = 0.5, and its
    averages go on the wire only at t = 3 (until 4).  The link from 1 has
    the whole NIC from 0.5: its 1.5 MB slice, arriving at 1, carried 0.5 MB
    in the stretch [0, 0.5].  Counted as a flow through its idle gap, the
    link from 0 would halve 1's share after 0.5 and put 0.75 MB of that
    slice in the stretch: 2.5 MB/s."""
    reports = {(0, 2): link((0.0, 0), (0.5, 5e5), until=4.0, resume=3.0),
               (1, 2): link((0.0, 0), (1.0, 1.5e6))}
    assert nic_rates(reports)[1][2] == pytest.approx(2e6)
    reports[(0, 2)] = link((0.0, 0), (0.5, 5e5), until=4.0)
    assert nic_rates(reports)[1][2] == pytest.approx(2.5e6)


def test_node_throughput_is_the_slower_nic():
    out, inn = [4e6, 3e6, math.nan], [8e6, 1e6, math.nan]
    assert node_throughput(out, inn) == [4e6, 1e6, 2.5e6]   # median fills
    assert node_throughput([math.nan, 4.0], [math.nan, 2.0]) == [2.0, 2.0]
    assert node_throughput([math.nan, 4.0], [3.0, math.nan]) == [3.0, 4.0]


# Three nodes, node ``slow`` at 2 MB/s both ways, the others at 20 (the P = 3
# test's network).  Every link on the wire over [0, 1] at its max-min rate:
# a link from or to the slow node 1 MB/s (its NIC split over 2 flows), a
# link between the fast ones 19 MB/s (the rest of their NICs).
def three(slow, **moved):
    reports = {}
    for i in range(3):
        for j in range(3):
            if i != j:
                rate = 1e6 if slow in (i, j) else 19e6
                t0, t1 = moved.get(f"l{i}{j}", (0.0, 1.0))
                reports[(i, j)] = link((t0, 0), ((t0 + t1) / 2, rate *
                                                 (t1 - t0) / 2),
                                       (t1, rate * (t1 - t0) / 2))
    return reports


NAN3 = ([math.nan] * 3, [math.nan] * 3)


def test_binding_from_max_min_shares():
    """Slow node 0: its flows are below the largest at the fast ends, so
    both its NICs bind (its reading is its rate); the flows between the
    fast nodes get the largest share at both ends and no reading dropped:
    both ends bind too."""
    (out, inn), floors, bound = held_estimates(three(0), NAN3, 3)
    assert out == pytest.approx([2e6, 20e6, 20e6])
    assert inn == pytest.approx([2e6, 20e6, 20e6])
    assert bound == ([True] * 3, [True] * 3)
    assert floors == (out, inn)


def test_a_fast_receiver_fed_only_by_the_slow_sender_is_held():
    """The P = 3 swing (docs/results.md): one call in which fast
    server 2's incoming NIC was on the wire only with the link from slow
    node 0 (2 MB/s out over 2 flows), the link from 1 over before it
    began (here: after it ended).  Its reading is 1.0 MB/s, the sender's
    share, not the 20 it has; the link is at out_0's largest share and
    out_0's reading did not drop, so out_0 explains it: in_2 keeps its
    floor of 20 MB/s.  The mirror, out_1 on the wire only with its link to
    slow node 0 (1 MB/s), is held at 20 the same way."""
    swing = three(0, l12=(1.05, 1.1))
    out, inn = nic_rates(swing)
    assert inn[2] == pytest.approx(1e6) and out[0] == pytest.approx(2e6)
    assert out[1] == pytest.approx(1e6)
    _, floors, _ = held_estimates(three(0), NAN3, 3)
    (out, inn), after, bound = held_estimates(swing, floors, 3)
    assert not bound[1][2] and bound[0][0]
    assert inn[2] == pytest.approx(20e6) and after[1][2] == floors[1][2]
    assert not bound[0][1] and out[1] == pytest.approx(20e6)
    assert out[0] == pytest.approx(2e6) and inn[0] == pytest.approx(2e6)
    assert min(out[2], inn[2]) == pytest.approx(20e6)      # S_2 stays fast
    # without a floor (the first call) there is nothing to hold it to
    assert held_estimates(swing, NAN3, 3)[0][1][2] == pytest.approx(1e6)


def test_a_binding_nic_shared_with_unmeasured_averages_is_held():
    """From a failed P = 3 run (in_0 estimated at 1.03 MB/s, true 2): slow
    node 0's incoming NIC is on the wire with the pushes from 2 only, the
    pushes from 1 having ended before they began, while 1's averages still
    come on that link.  The flow from 2 is below the largest out of 2, so
    in_0 binds, but its reading (1 MB/s) misses the averages' half: it is
    not all the NIC carried, and the floor of 2 MB/s stays."""
    late = three(0)
    late[(1, 0)] = link((0.0, 0), (0.15, 1.5e5), (0.3, 1.5e5), until=1.2)
    late[(2, 0)] = link((0.35, 0), (0.7, 3.5e5), (1.05, 3.5e5))
    assert nic_rates(late)[1][0] == pytest.approx(1e6)
    _, floors, _ = held_estimates(three(0), NAN3, 3)
    (out, inn), after, bound = held_estimates(late, floors, 3)
    assert not bound[1][0] and inn[0] == pytest.approx(2e6)
    assert after[1][0] == floors[1][0]


def test_a_real_drop_is_believed_at_once():
    """Node 0 slow, then node 1 slow instead: node 1's flows are below
    the largest at the fast ends, so its NICs bind and the drop from 20 to
    2 MB/s is believed the call it is measured; node 0's rise is a higher
    reading, always believed."""
    _, floors, _ = held_estimates(three(0), NAN3, 3)
    (out, inn), _, bound = held_estimates(three(1), floors, 3)
    assert out == pytest.approx([20e6, 2e6, 20e6])
    assert inn == pytest.approx([20e6, 2e6, 20e6])
    assert bound[0][1] and bound[1][1]


def test_binding_hand_cases():
    """Flow 0 -> 1: held at 1 (in_1 binds) when out_0 gave another flow
    more, held at 0 (out_0 binds) when in_1 gave another flow more; at the
    largest share at both ends, the end whose reading dropped does not
    bind, and when both dropped neither does."""
    no = ([False] * 3, [False] * 3)
    f = {(0, 1): (1.0, 1.0), (0, 2): (5.0, 5.0)}
    assert binding(f, no) == ([True, False, False], [False, True, True])
    assert binding({(0, 1): (1.0, 1.0), (0, 2): (1.0, 1.0)}, no)[1] == \
        [False, True, True]
    f = {(0, 1): (1.0, 1.0), (2, 1): (5.0, 5.0)}
    assert binding(f, no) == ([True, False, True], [False, True, False])
    one = {(0, 1): (1.0, 1.0)}
    assert binding(one, ([False] * 3, [False, True, False])) == \
        ([True, False, False], [False] * 3)
    assert binding(one, ([True, False, False], [False] * 3)) == \
        ([False] * 3, [False, True, False])
    assert binding(one, ([True, False, False], [False, True, False])) == no
    assert binding({(0, 1): (None, 1.0)}, no) == no      # one end unseen


def test_follow_keeps_a_window_of_steady_estimates():
    """Within a factor 1.25 of the record's median: appended, the last 3
    kept; the median drops one call's outlier of 20 %."""
    rec = []
    for value in (10.0, 11.0, 9.0, 10.5):
        rec = follow(rec, value, window=3, jump=1.25)
    assert rec == [11.0, 9.0, 10.5]
    rec = follow(rec, 12.5, window=3, jump=1.25)     # 12.5 / 10.5 < 1.25
    assert rec == [9.0, 10.5, 12.5] and np.median(rec) == 10.5


def test_follow_restarts_on_a_changed_rate():
    """A redraw from 10 to 2 (or to 30): the record restarts from the new
    value, so the next plan uses it; a median of the last 3 would still
    say 10 (two more calls of the old plan)."""
    rec = [10.0, 10.0, 10.0]
    assert follow(rec, 2.0) == [2.0]
    assert follow(rec, 30.0) == [30.0]
    # (the plain median of the last 3 would be 10.0)
    assert follow([2.0], 2.1) == [2.0, 2.1]             # then it settles


def test_follow_keeps_the_record_when_unmeasured():
    assert follow([4.0, 5.0], math.nan) == [4.0, 5.0]
    assert follow([], math.nan) == []
    assert follow([], 7.0) == [7.0]


@pytest.mark.parametrize("seed", range(20))
def test_slice_count_stays_within_the_tag_block(seed):
    # LoadBalancedAllreduce reserves N * num_probe + ceil(n / slice) + N
    # tags per direction: the exact rests add at most one slice per server
    rng = np.random.default_rng(seed)
    N = int(rng.integers(2, 9))
    n = int(rng.integers(1, 2_000_000))
    sl_elems = int(rng.integers(1_000, 200_000))
    shares = list(rng.dirichlet(np.ones(N)) * n)
    shares[int(rng.integers(N))] = 0.0
    sl = assign_slices(n, shares, sl_elems)
    assert sum(c for _, c, _, _ in sl) == n
    assert len(sl) <= N * 2 + -(-n // sl_elems) + N
