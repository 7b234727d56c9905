"""The load-distribution planner (no MPI): Algorithm 1 against the exact
optimum, shares never negative, N = 2, slice assignment (Algorithm 2), and
NIC throughput from link measurements."""
import math

import numpy as np
import pytest

from partialcoll.loadbalance.plan import (assign_slices, distribute,
                                          equal_shares, link_rates,
                                          node_throughput, node_times,
                                          optimal_shares)


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
    assert owned[0] == 20_000                # only its probes
    for j in (1, 2, 3):                      # within one slice of its share
        assert abs(owned[j] - shares[j]) <= 120_000


def test_short_vectors_shrink_probes():
    sl = assign_slices(10, [5, 5], 4, num_probe=2, size_probe=1000)
    assert sum(c for _, c, _, _ in sl) == 10
    assert all(c == 2 for _, c, _, p in sl if p)
    assert assign_slices(0, [1, 1], 4) == []


def test_nic_rates_from_link_rates():
    """Node 0 sends 2 MB to 1 in 1 s and 1 MB to 2 in 0.5 s: links of 2
    MB/s each, its NIC 4 MB/s; it receives at 4 and 4 MB/s: 8 MB/s."""
    reports = {(0, 1): (2e6, 0.0, 1.0), (0, 2): (1e6, 0.0, 0.5),
               (1, 0): (1e6, 0.0, 0.25), (2, 0): (1e6, 0.5, 0.75)}
    out, inn = link_rates(reports)
    assert out[0] == pytest.approx(4e6) and inn[0] == pytest.approx(8e6)
    assert math.isnan(out[1]) is False and math.isnan(inn[1]) is False
    S = node_throughput(out, inn)
    assert S[0] == pytest.approx(4e6)
    assert all(s > 0 for s in S)
    assert node_throughput([math.nan, 4.0], [math.nan, 2.0]) == [2.0, 2.0]
