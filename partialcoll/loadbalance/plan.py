"""Planning network-aware load distribution for parameter servers: the
algorithms of Cai et al., "Adaptive load balancing for parameter servers in
distributed machine learning over heterogeneous networks"
(../shared/papers/adaptive-ps-load-balancing.txt), section 3.  No MPI
here: :class:`partialcoll.LoadBalancedAllreduce` runs the plans.

The stored text lost every equation; these are reconstructed from its
prose (the README's "Load balancing" section states them too):

Deployment (3.3).  One server beside each of N workers.  Every worker holds
a gradient of M elements; server i aggregates a share m_i of them
(sum m_i = M).  Its own share never crosses the network.

Load (Eq. 8).  As a worker, node i sends the M - m_i elements other servers
own and receives their M - m_i averages back; as a server it receives m_i
from each of the N - 1 other workers and sends them the m_i averages.  So
each way::

    L_i = (M - m_i) + (N - 1) m_i = M + (N - 2) m_i

Time (Eq. 9): t_i = L_i / S_i, S_i the node's throughput.  Goal (Eq. 10):
minimise max_i t_i subject to sum m_i = M, m_i >= 0.

Algorithm 1 starts from equal shares and repeatedly moves load from the node
with the largest t_i to the one with the smallest until their times are
equal (Eqs. 12-13, solved for the amount moved)::

    delta = (S_min (M + a m_max) - S_max (M + a m_min)) / (a (S_max + S_min))

with a = N - 2, never taking a share below 0; it stops when max t - min t
is within ``threshold`` of max t (the paper's fixed 1 s threshold is made
relative: iterations here last well under a second).  The donor is the
slowest node that still has a share: a node at m_i = 0 is at its floor
M / S_i and cannot give, and may receive again if others become slower.
With N = 2 every split gives L_i = M: the shares do not matter and stay
equal.

Throughput from measurements (our choice; the paper does not say how S_i
comes from the per-link rates s_ij).  A node's traffic leaves through its
outgoing NIC and arrives through its incoming one, and both carry L_i, so
S_i = min(out_i, in_i).  All links move at once in a call, each with its
share of the NICs it crosses, so a NIC's rate is estimated as the sum of
its links' measured rates: out_i = sum_j s_ij, in_i = sum_j s_ji.  (The
bytes over the union of the links' intervals undercounts: one slow peer
stretches every interval.  The sum overcounts when a NIC's links carry
unequal amounts and end at different times; the probe slices, equal on
every link, limit that.)  The scheduler averages the estimates of the last
few calls.

Algorithm 2 (slice assignment).  The vector is cut into slices: first
``num_probe`` probe slices of ``size_probe`` elements for *every* server, a
share of zero included, so that every link keeps being measured; then the
rest in slices of ``slice_elems`` elements, each given to the server with
the most load still unassigned.
"""
import math

import numpy as np


def node_times(M, shares, S):
    """t_i = (M + (N - 2) m_i) / S_i (Eqs. 8-9)."""
    N = len(S)
    return [(M + (N - 2) * m) / s for m, s in zip(shares, S)]


def equal_shares(M, N):
    """The "Average" scheme: m_i = M / N."""
    return [M / N] * N


def distribute(M, S, threshold=0.01, max_moves=100000):
    """Algorithm 1: shares m_i (floats, summing to M) that minimise the
    largest t_i.  ``S``: per-node throughput (> 0).  Returns (shares,
    number of moves).

    Each move takes load from the slowest node that still has some (a node
    at m_i = 0 is at its floor M / S_i and cannot give) to the fastest, so
    that their times become equal; a node emptied on the way may receive
    load again later."""
    N = len(S)
    if any(not s > 0 for s in S):
        raise ValueError(f"throughputs must be > 0, got {S}")
    m = equal_shares(M, N)
    if N <= 2:
        return m, 0
    a = N - 2
    for moves in range(max_moves):
        t = node_times(M, m, S)
        donors = [i for i in range(N) if m[i] > 0]
        imax = max(donors, key=lambda i: t[i])
        imin = min(range(N), key=lambda i: t[i])
        if imax == imin or t[imax] - t[imin] <= threshold * t[imax]:
            return m, moves
        d = (S[imin] * (M + a * m[imax]) - S[imax] * (M + a * m[imin])) / \
            (a * (S[imax] + S[imin]))
        d = min(d, m[imax])
        m[imax] -= d
        m[imin] += d
    return m, max_moves


def optimal_shares(M, S):
    """The exact optimum of Eq. 10 (for checking Algorithm 1): every node
    with a positive share finishes at the same T = M (a + k) / sum S_i over
    those k nodes; nodes that would need a negative share get 0."""
    N = len(S)
    if N <= 2:
        return equal_shares(M, N)
    a, active = N - 2, set(range(N))
    while True:
        T = M * (a + len(active)) / sum(S[i] for i in active)
        neg = [i for i in active if T * S[i] - M < 0]
        if not neg:
            return [(T * S[i] - M) / a if i in active else 0.0
                    for i in range(N)]
        active -= set(neg)


def link_rates(reports):
    """reports: {(i, j): (bytes, t_start, t_end)} measured on link i -> j
    (the paper's s_ij = bytes / (t_end - t_start)).  Returns (out, in): per
    node, the sum of the rates of its outgoing and incoming links (NaN when
    none was measured).  All links of a call move at once, so a NIC's
    links share it and their rates add up to what it carried."""
    s = {ij: b / (e - t) for ij, (b, t, e) in reports.items() if e > t}
    nodes = sorted({n for ij in s for n in ij})
    N = max(nodes) + 1 if nodes else 0
    out = [sum(v for (i, _), v in s.items() if i == n) or math.nan
           for n in range(N)]
    inn = [sum(v for (_, j), v in s.items() if j == n) or math.nan
           for n in range(N)]
    return out, inn


def node_throughput(out, inn, fallback=None):
    """S_i = min(out_i, in_i); unmeasured nodes take ``fallback`` (the
    median of the measured ones by default)."""
    S = [min(o, i) if not (math.isnan(o) or math.isnan(i))
         else (o if math.isnan(i) else i) for o, i in zip(out, inn)]
    known = [s for s in S if not math.isnan(s) and s > 0]
    fb = fallback if fallback is not None else \
        (float(np.median(known)) if known else 1.0)
    return [s if not math.isnan(s) and s > 0 else fb for s in S]


def assign_slices(n, shares, slice_elems, num_probe=2, size_probe=10000):
    """Algorithm 2: the vector's slices as (start, count, owner, probe).

    Probe slices come first: ``num_probe`` of ``size_probe`` elements per
    server, every server included (fewer or smaller when the vector is
    short); then slices of ``slice_elems``, each to the server with the
    most load still unassigned (``shares``, in elements, sum n)."""
    N = len(shares)
    if n == 0:
        return []
    size_probe = min(size_probe, n // max(N * num_probe, 1)) if num_probe \
        else 0
    left = [float(m) for m in shares]
    slices, pos = [], 0
    for j in range(N) if size_probe else ():
        for _ in range(num_probe):
            slices.append((pos, size_probe, j, True))
            left[j] -= size_probe
            pos += size_probe
    while pos < n:
        c = min(slice_elems, n - pos)
        j = max(range(N), key=lambda k: (left[k], -k))
        slices.append((pos, c, j, False))
        left[j] -= c
        pos += c
    return slices
