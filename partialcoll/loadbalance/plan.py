"""Planning network-aware load distribution for parameter servers: the
algorithms of Cai et al., "Adaptive load balancing for parameter servers in
distributed machine learning over heterogeneous networks", section 3.
No MPI
here: :class:`partialcoll.LoadBalancedAllreduce` runs the plans.

The stored text lost every equation; these are reconstructed from its
prose (the documentation's load-balancing page states them too):

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
S_i = min(out_i, in_i).  A NIC's rate is estimated as the summed rate of
its links *while they were on the wire together*: for node i's outgoing
NIC, the links i -> j over the stretch from the latest forecast arrival to
the earliest last-slice arrival, each link's bytes inside it from its
slices' arrival stamps, a slice that straddles an edge split by the NIC's
share per flow over its time on the wire (in_j likewise, over the links
i -> j).
Inside that stretch the NIC carries a fixed set of flows, and only pushes
(a server's averages for worker j queue behind the pushes on the FIFO link
to j, and a link ends with its last push), so when the NIC is the
bottleneck of any of them the sum is its rate.  When a late start kept the
links apart (a sender whose progress thread ran late by more than a short
link lasts), the stretch is the longest one in which the most of them were
on the wire together, over which the NIC's set of flows is constant too.
Two simpler estimators are biased:

* the sum of the s_ij, each over its link's own interval, overcounts: a
  link that ends after its NIC's other links has the whole NIC from then
  on, so its average is more than its share (links to a server with a small
  share end early; and a link that starts before the others has the NIC to
  itself until they start).  On two 8-rank draws of the benchmark's rates,
  with exact arrival times, 14 % and 73 % of its S_i were within 10 %, of
  this estimator's 100 % and 89 % (docs/results.md);
* the bytes over the union of the intervals undercount: a link that a slow
  receiver holds stretches the union while the NIC is idle.

What no passive measurement gives: the rate of a NIC that is not saturated
(all its flows are held back elsewhere); the estimate is then what the NIC
carried, a lower bound.  One case recurs: a server with a small share gets
probes only, from senders whose NICs are busy with larger flows, so its
incoming NIC may never be saturated; it is measured low, and Algorithm 1
keeps its share small (a fast node can stay at a share near 0; the sum of
the s_ij overcounted such short links and hid this).  It costs little
while some node is too slow for any share: the iteration then lasts that
node's floor M / S_min, the other nodes finish earlier, and a fast node
planned too little stays under the floor (the load model's replay in
docs/results.md).

Lower readings (our choice; the paper averages a node's throughput record
and is silent on this).  A reading lower than the NIC's last estimate is
believed only when the NIC was the binding limit of some measured flow in
the call (:func:`binding`); otherwise the estimate is max(reading, the
NIC's last estimate from a call where it bound), since a NIC that limited
none of its flows carried only what the other ends let through.  Which NIC
holds a flow follows from max-min fairness: the one at which the flow gets
the largest share.  A flow i -> j clearly below the largest flow out of i
(a fifth) was held at j; clearly below the largest into j, at i.  A flow at
the largest share at both ends (i -> j at out_i's rate over its flows:
"sender-limited", and nothing more than a lower bound on in_j) is
explained by the end whose reading did not drop; if neither dropped both
bind (their readings agree with what was believed), if both dropped
neither does.  Without this, at P = 3 a fast server's incoming NIC fed in
one call only by a slow sender (2 MB/s over 2 flows) read 1.0 MB/s instead
of 20, and a scheduler that believed it gave 97 % of M to the slow node.
A NIC binds only where its measured flows were all it carried over its
stretch: when a link's pushes ended before the others began, its averages
(unmeasured) still share the NIC, and the reading misses them (at P = 3
the slow node's incoming NIC read 1.03 MB/s of its 2 so).  Higher
readings are always believed (a reading is a lower bound).

Following the rates (our choice; the paper keeps "the average value of the
throughput record" and replans every iteration).  Per NIC the scheduler
plans with the median of its estimates since the rate last changed, at
most ``window`` of them (:func:`follow`): an estimate more than ``jump``
times above or below that median starts the NIC's record afresh.  A plain
median of the last three calls drops one call's outlier but believes a
new rate only once two calls have seen it, so after every change the plan
ran one call later than the one-call lag of measuring and planning (on
the benchmark's trace the second call after a redraw took 1.49 times the
oracle's plan, in the load model).  The records take the held estimates
above: a restart on one call's reading is safe only because a lower
reading counts only where its NIC bound (with plain readings, 3 of six
4-call trials at P = 3 swung on the false drop described above).

Algorithm 2 (slice assignment).  The vector is cut into slices: first
``num_probe`` probe slices of ``size_probe`` elements for *every* server, a
share of zero included, so that every link keeps being measured; then the
rest in slices of ``slice_elems`` elements, each given to the server with
the most load still unassigned.  Our addition: a server planned below
``num_probe * size_probe`` gets probes of its share's size, at least
``min_probe`` elements (:func:`probe_sizes`): the paper's fixed probes
weigh on exactly the node that sets the call's time.
"""
import math

import numpy as np
from ..core.errors import ScheduleError


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
        raise ScheduleError(f"throughputs must be > 0, got {S}")
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
    """The paper's per-link rates (3.2): s_ij = bytes / (t_end - t_start),
    from the forecast's arrival to the last slice's.

    reports: {(i, j): (arrivals, until[, resume])} for link i -> j:
    ``arrivals`` in order, [(t_arrive, bytes), ...], the forecast first
    (its bytes are not counted), then every slice; ``until``, when the
    link's last message of the call arrived (the averages coming back,
    after the slices: they share the NICs but are not measured);
    ``resume``, when the first of those averages went on the wire (the
    link carried nothing between its last slice's arrival and then;
    None or left out: the link counts as on the wire all through).
    Returns {(i, j): s_ij} for the links with a positive span.  Readable
    by users; the planner estimates NICs with :func:`nic_rates`."""
    out = {}
    for ij, rep in reports.items():
        arr = rep[0]
        span = arr[-1][0] - arr[0][0]
        if len(arr) > 1 and span > 0:
            out[ij] = sum(b for _, b in arr[1:]) / span
    return out


def _together_rate(links):
    """The summed rate of one NIC's links over the longest stretch of time
    in which the most of them were on the wire together (all of them,
    unless a late start kept them apart): their slices' bytes inside it
    over its length; each link's own rate inside it (None for a link not
    on the wire all through it); and whether those links were all the NIC
    carried then (False when a link's unmeasured averages shared it).
    ``links``: [(arrivals, until)] as reported.  (NaN, all None, False)
    when no stretch has a positive length.

    A slice that straddles an edge of the stretch is split in proportion to
    the NIC's share per flow over its time on the wire, 1/n(t) with n(t)
    flows on the NIC (a link is one from its forecast to its last slice,
    and again while its averages are on the wire): when the NIC is their bottleneck they
    share it equally (max-min), so a link's rate falls as others join.
    Split in proportion to time instead, a short stretch whose links had
    started alone and fast counted too much (up to +50 % in one call).  A
    link is no flow between its last slice and ``resume`` (when its
    averages went on the wire): counted as one there, it took share from
    the others, and a NIC fed only probes, whose averages came back long
    after, read up to 15 % over its rate at P = 8."""
    curves, ends, resumes = [], [], []
    for rep in links:
        arr, until = sorted(rep[0]), rep[1]
        t = np.array([a for a, _ in arr], float)
        c = np.cumsum([0.0] + [float(b) for _, b in arr[1:]])
        curves.append((t, c))
        ends.append(max(float(until), t[-1]))
        resume = rep[2] if len(rep) > 2 and rep[2] is not None else t[-1]
        resumes.append(min(max(float(resume), t[-1]), ends[-1]))
    spans = [(t[0], t[-1]) for t, _ in curves]
    edges = np.array(sorted({x for sp in spans for x in sp} | set(ends)
                            | set(resumes)))
    pairs = list(zip(edges, edges[1:]))
    on = [sum(1 for lo, hi in spans if lo <= a and hi >= b) for a, b in pairs]
    if not any(on):
        return math.nan, [None] * len(links), False
    k = max(range(len(on)), key=lambda i: (on[i], pairs[i][1] - pairs[i][0]))
    a, b = pairs[k]
    # share time: the integral of 1/n(t) over the flows on the NIC
    flows = [sum(1 for (lo, hi), r, e in zip(spans, resumes, ends)
                 if (lo <= x and hi >= y) or (r <= x and e >= y))
             for x, y in pairs]
    share = np.concatenate([[0.0], np.cumsum(
        [(y - x) / n if n else 0.0 for (x, y), n in zip(pairs, flows)])])
    ws = [np.interp(x, edges, share) for x in (a, b)]
    each = []
    for t, c in curves:
        if t[0] <= a and t[-1] >= b:
            wt = np.interp(t, edges, share)
            each.append(float(np.interp(ws[1], wt, c) -
                              np.interp(ws[0], wt, c)) / (b - a))
        else:
            each.append(None)
    return sum(r for r in each if r is not None), each, flows[k] == on[k]


def nic_readings(reports, N=None):
    """One call's readings of every NIC, and of the flows inside them:
    (out, in, flows, whole): (out, in) as :func:`nic_rates` gives them,
    ``flows[(i, j)] = (rate in out_i's stretch, rate in in_j's stretch)``,
    None where the link was not on the wire all through that stretch, and
    ``whole`` = (out, in), per NIC whether its measured flows were all it
    carried over its stretch (no link's averages on it then)."""
    links = {ij: rep for ij, rep in reports.items() if len(rep[0]) > 1}
    if N is None:
        N = max((max(ij) for ij in links), default=-1) + 1
    out, inn = [math.nan] * N, [math.nan] * N
    whole = ([False] * N, [False] * N)
    flows = {ij: [None, None] for ij in links}
    for n in range(N):
        for side, readings in ((0, out), (1, inn)):
            mine = [ij for ij in links if ij[side] == n]
            if not mine:
                continue
            readings[n], each, whole[side][n] = _together_rate(
                [links[ij] for ij in mine])
            for ij, rate in zip(mine, each):
                flows[ij][side] = rate
    return out, inn, {ij: tuple(r) for ij, r in flows.items()}, whole


def nic_rates(reports, N=None):
    """(out, in): per node, the rate of its outgoing and of its incoming NIC
    estimated from one call's reports (see :func:`link_rates` for their
    form): the summed rate of the NIC's links over the longest stretch in
    which the most of them were on the wire together (the module docstring
    says why).  NaN where a NIC has no measured link.  ``N``: nodes
    (default: the highest one reported + 1)."""
    return tuple(nic_readings(reports, N)[:2])


def binding(flows, dropped, close=0.8):
    """Which NICs were the binding limit of some measured flow in one call:
    (out, in), lists of bools per node.  ``flows``: as from
    :func:`nic_readings`; ``dropped``: (out, in), per NIC whether its
    reading fell more than the jump below its last binding estimate.

    Max-min fairness: a flow is held by the NIC at which it gets the
    largest share.  So a flow i -> j below ``close`` times the largest flow
    out of i in out_i's stretch was held at j (out_i gave another flow
    more): in_j binds; likewise below the largest into j, out_i binds.  A
    flow at the largest share at both ends (a link i -> j at out_i's rate
    over its flows, say) cannot say which NIC held it: if only one end's
    reading dropped, the other end explains the flow and binds; if neither
    dropped, both readings agree with what was believed and both bind; if
    both dropped, neither does (a fast server fed only by a slow sender
    would otherwise take the sender's rate)."""
    N = len(dropped[0])
    bind = ([False] * N, [False] * N)
    top = ({}, {})
    for (i, j), rates in flows.items():
        for side, n in ((0, i), (1, j)):
            if rates[side] is not None:
                top[side][n] = max(top[side].get(n, 0.0), rates[side])
    for (i, j), (r_out, r_in) in flows.items():
        if r_out is None or r_in is None:
            continue
        held_at_j = r_out < close * top[0][i]
        held_at_i = r_in < close * top[1][j]
        if held_at_j != held_at_i:
            bind[1 if held_at_j else 0][j if held_at_j else i] = True
        elif not held_at_j:
            d_out, d_in = dropped[0][i], dropped[1][j]
            bind[0][i] |= not d_out
            bind[1][j] |= not d_in
    return bind


def held_estimates(reports, floors, N, jump=1.25, close=0.8):
    """One call's NIC estimates, lower readings held unless the NIC bound:
    ((out, in), new floors, (bound out, bound in)).  ``floors``: (out, in)
    per NIC, its last estimate from a call in which it bound (NaN: none).

    A reading is believed when its NIC bound some flow (:func:`binding`)
    and its measured flows were all it carried over its stretch (a link's
    averages, unmeasured, may share it after the link's pushes end), when
    it is no lower than the floor, or when there is no floor yet;
    otherwise the NIC carried less than it can only because its flows were
    held elsewhere, the reading is a lower bound, and the estimate is
    max(reading, floor) = the floor.  A believed reading becomes the NIC's
    floor.  NaN readings (NIC not measured) leave the floor as it is."""
    out, inn, flows, whole = nic_readings(reports, N)
    readings = (out, inn)
    dropped = tuple([r < f / jump for r, f in zip(rs, fs)]
                    for rs, fs in zip(readings, floors))
    bind = tuple([b and w for b, w in zip(bs, ws)]
                 for bs, ws in zip(binding(flows, dropped, close), whole))
    est, new = ([], []), ([], [])
    for side in (0, 1):
        for r, f, b in zip(readings[side], floors[side], bind[side]):
            if math.isnan(r):
                est[side].append(r)
                new[side].append(f)
            elif b or math.isnan(f) or r >= f:
                est[side].append(r)
                new[side].append(r)
            else:
                est[side].append(f)
                new[side].append(f)
    return est, new, bind


def follow(record, estimate, window=3, jump=1.25):
    """One NIC's record of rate estimates after one more call's
    ``estimate`` (NaN: not measured, the record stays): the last ``window``
    estimates since the rate changed.  A change is an estimate more than
    ``jump`` times above or below the record's median; the record then
    starts again from it, so the plan follows a new rate the call after
    it is measured.  The scheduler plans with the record's median."""
    if math.isnan(estimate):
        return list(record)
    if record:
        mid = float(np.median(record))
        if not mid / jump <= estimate <= mid * jump:
            return [estimate]
    return (list(record) + [estimate])[-window:]


def node_throughput(out, inn, fallback=None):
    """S_i = min(out_i, in_i); unmeasured nodes take ``fallback`` (the
    median of the measured ones by default)."""
    S = [min(o, i) if not (math.isnan(o) or math.isnan(i))
         else (o if math.isnan(i) else i) for o, i in zip(out, inn)]
    known = [s for s in S if not math.isnan(s) and s > 0]
    fb = fallback if fallback is not None else \
        (float(np.median(known)) if known else 1.0)
    return [s if not math.isnan(s) and s > 0 else fb for s in S]


def integer_shares(n, shares):
    """``shares`` (floats summing to about ``n``; negatives count as 0) as
    whole elements summing to exactly ``n``: each rounded down, the rest
    one by one to the largest remainders (ties to the lower index)."""
    clamped = [max(float(m), 0.0) for m in shares]
    total = sum(clamped)
    scaled = [m * n / total if total > 0 else n / len(shares)
              for m in clamped]
    out = [int(math.floor(v)) for v in scaled]
    order = sorted(range(len(out)), key=lambda k: (out[k] - scaled[k], k))
    for k in order[:n - sum(out)]:
        out[k] += 1
    return out


def assign_slices(n, shares, slice_elems, num_probe=2, size_probe=10000,
                  min_probe=None):
    """Algorithm 2: the vector's slices as (start, count, owner, probe).

    Probe slices come first: ``num_probe`` of ``size_probe`` elements per
    server, every server included (fewer or smaller when the vector is
    short); then slices of at most ``slice_elems``, each to the server with
    the most load still unassigned (``shares``, in elements, sum n).

    ``min_probe`` (our addition; None: every probe has ``size_probe``
    elements, as in the paper): a server planned below ``num_probe *
    size_probe`` gets probes of its share's size instead (its share split
    over its probes), but not below ``min_probe`` elements.  A probe is
    load on its server like any slice it owns: a server planned at share 0
    still receives its probes from N - 1 workers and sends the averages
    back, (N - 2) * num_probe * size_probe elements more each way.  That
    node is the slow one, and in most draws the slowest node sets the
    call's time (its floor M / S_i), so at the paper's sizes and a 4 MB
    gradient on 8 ranks its probes lengthened the call by 12 %
    (:func:`probe_sizes`).

    Our choice (the paper cuts the whole vector into equal slices): a
    server whose unassigned load is less than a slice gets a slice of
    exactly that load, so the servers get the plan's shares in whole
    elements (:func:`integer_shares`), except that a server planned below
    its probes still holds them and the last server filled gives that up.
    With equal slices a server's load is off by up to a slice: at the
    paper's model sizes (1.2e5-element slices of 5e6 to 6e7 parameters)
    under 3 % of M, but a 4 MB gradient is 8 such slices, and the shares
    were off by up to 12 % of M (docs/results.md)."""
    N = len(shares)
    if n == 0:
        return []
    left = integer_shares(n, shares)
    sizes = probe_sizes(n, left, num_probe, size_probe, min_probe)
    slices, pos = [], 0
    for j in range(N):
        for _ in range(num_probe if sizes[j] else 0):
            slices.append((pos, sizes[j], j, True))
            left[j] -= sizes[j]
            pos += sizes[j]
    while pos < n:                    # sum(left) == n - pos: max(left) >= 1
        j = max(range(N), key=lambda k: (left[k], -k))
        c = min(slice_elems, n - pos, left[j])
        slices.append((pos, c, j, False))
        left[j] -= c
        pos += c
    return slices


def auto_min_probe(slice_elems):
    """``min_probe="auto"``: the paper's ratio of probe to slice (10,000 to
    1.2e5) applied to ``slice_elems``."""
    return max(1, int(slice_elems) // 12)


def probe_sizes(n, shares, num_probe=2, size_probe=10000, min_probe=None):
    """Elements per probe slice for each server (0: no probes), as
    :func:`assign_slices` cuts them.  ``shares``: whole elements per
    server, summing to ``n``.  Every probe has ``size_probe`` elements
    (fewer when the vector is too short for ``num_probe`` of them per
    server); with ``min_probe``, a server planned below its probes gets
    probes of floor(share / num_probe) elements, at least ``min_probe``
    (at most ``size_probe``)."""
    N = len(shares)
    if not num_probe:
        return [0] * N
    cap = min(size_probe, n // max(N * num_probe, 1))
    if min_probe is None or cap == 0:
        return [cap] * N
    low = max(1, min(min_probe, cap))
    return [min(cap, max(low, int(m) // num_probe)) for m in shares]
