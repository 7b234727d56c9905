"""In-network aggregation (MLfabric section 5.2, Algorithm 3) and its
synchronous use, MLfabric-S (section 6).

Given updates in the order they must reach a destination S (the server, or
the replica), k aggregators on worker nodes (pre-assigned to groups 2..k+1
in the order given; the paper draws them at random) and NW, partition the
order into k + 1 groups::

    group 1 (g_1..g_n)          worker ------------------------> S
    group 2 (g_n+1..)           worker --> aggregator 1 --sum--> S
    ...
    group k+1                   worker --> aggregator k --sum--> S

    time --->   S's link:  [g_1][g_2]..[g_n][ sum 1 ][   sum 2   ]..
                agg 1 in:  [g_n+1, g_n+2 ..  ]       (done by t_max)
                agg 2 in:  [g_.. ...                          ]

DetAgg(n): the first n updates go straight to S (the same transfers as
Algorithm 2's schedule); t_max is when S's link is busy until.  Then each
later update joins the current aggregator while it would arrive there no
later than t_max; when one would arrive later, the aggregator's sum is
reserved to S (it starts when its last member arrived, and t_max becomes
its completion) and the next aggregator opens.  Algorithm 3 tries n =
0..|U| and keeps the n whose last transfer reaches S first.

Cases the printed pseudocode leaves open, and what we do (tested in
tests/test_mlfabric_aggregation.py):

* *n = 0, and every new group.*  With t_max = 0 no update can join the
  first aggregator, so the printed loop closes empty groups and sends
  their (empty) sums.  Here the first update of a group always joins it:
  a group is never empty.  t_max starts at the time S's link is committed
  until by earlier batches (or now), so with n = 0 the first aggregator
  collects while S still receives the previous batch.
* *Running out of aggregators.*  The paper partitions into exactly k + 1
  groups, so the last aggregator takes every remaining update, whatever
  its arrival time; the objective then charges the late sum, and the
  enumeration picks a larger n when piling onto the last aggregator is
  slow.  With k = 0 only n = |U| exists.
* *The last group's sum.*  The printed loop ends without reserving the
  open aggregator's transfer to S; we reserve it and count it in t_max.
* *Order of commits.*  (Ordered mode.)  A sum must not reach S before the
  group before it (else its updates would be applied early and the earlier
  ones late, past their deadlines): it starts late enough to complete no
  earlier (a floor; see :mod:`.links`).  MLfabric-S has no order, so no
  floor.
* *Size of a sum*: the largest member's (dense updates of one model).
  Summing costs no time here.
* *Ties* between cases: the smaller n (more aggregation).

Speed (the enumeration stays exact): a case costs at least T_n, when
group 1 is through, which grows with n, and at least LB_n, the time the
other updates' bytes need through the aggregators' links at full rate,
which falls with n.  Cases are tried from where the two cross outwards,
in order of max(T_n, LB_n), until that reaches the best cost found; a
case stops as soon as it cannot beat the best (a transfer of it ends
later, or the bytes left cannot get through the aggregators left in
time).  Trial cases compute only their cost (a worker's link is reserved
only if the case uses it again); the chosen case is run again in full.
"""
import numpy as np

from . import links as _links
from .links import INF, Transfer
from ...core.errors import ScheduleError


class Group:
    """One commit at the destination.

    Attributes:
        aggregator: the node that summed it, or None (a direct update).
        members: the updates in it, in order.
        arrivals: their transfers to the aggregator ([] when direct).
        forward: the transfer that reaches the destination.
    """

    __slots__ = ("aggregator", "members", "arrivals", "forward")

    def __init__(self, aggregator, members, arrivals, forward):
        self.aggregator, self.members = aggregator, members
        self.arrivals, self.forward = arrivals, forward

    @property
    def end(self):
        return self.forward.end

    def __repr__(self):
        via = "direct" if self.aggregator is None else \
            f"via {self.aggregator}"
        return (f"Group({via}, {[g.uid for g in self.members]}, "
                f"end={self.end:g})")


class Aggregation:
    """Algorithm 3's result.

    Attributes:
        groups: commits in order (direct ones first).
        n: the number of updates sent straight to the destination.
        cost: when the last transfer reaches the destination.
        net: NW with every reservation of the chosen case.
        cases: how many values of n were evaluated (after pruning).
    """

    def __init__(self, groups, n, cost, net, cases):
        self.groups, self.n, self.cost = groups, n, cost
        self.net, self.cases = net, cases

    def aggregator_of(self):
        """A(g) of the paper: {uid: aggregator node or None}."""
        return {g.uid: grp.aggregator for grp in self.groups
                for g in grp.members}


def aggregate(order, net, dst, aggregators, start=None, floor=-INF,
              ordered=True, not_before=None):
    """Algorithm 3: groups for ``order`` to ``dst`` through
    ``aggregators``.

    Args:
        order: updates in the order they must reach ``dst`` (O(U)).
        net: NW; not changed (the result holds a fork).
        dst: the destination node.
        aggregators: k nodes, used in this order for groups 2..k+1.
        start: when the updates may start (default ``net.now``).
        floor: when ``dst``'s commits planned earlier end (nothing of this
            batch completes earlier; also where t_max starts).
        ordered: keep commits in order (False: MLfabric-S).
        not_before: {uid: time} a commit holding that update must not
            complete before (the replica follows the server, 5.3).

    Returns an :class:`Aggregation`.
    """
    start = net.now if start is None else float(start)
    order, aggregators = list(order), list(aggregators)
    if dst in aggregators:
        raise ScheduleError(f"the destination {dst} cannot be an aggregator")
    if len(set(aggregators)) != len(aggregators):
        raise ScheduleError(f"aggregators repeat: {aggregators}")
    nb = (lambda g: -INF) if not not_before else \
        (lambda g: not_before.get(g.uid, -INF))
    cases = _Cases(order, net, dst, aggregators, start, floor, ordered, nb)
    best, evaluated = (INF, len(order) + 1), 0
    for n in cases.candidates(lambda: best[0]):
        tie_ok = n < best[1]          # ties go to the smaller n
        lb = cases.lower(n)
        if lb > best[0] or (lb == best[0] and not tie_ok):
            continue
        evaluated += 1
        if n == len(order):
            cost = cases.T[n]
        else:
            cost = cases.trial(n, best[0], tie_ok)
        if cost < best[0] or (cost == best[0] and tie_ok):
            best = (cost, n)
    cost, n = best
    chosen, groups = cases.network(n), []
    if n < len(order):       # the chosen case again, every transfer kept
        again, groups = _det_agg_rest(order[n:], chosen, dst, aggregators,
                                      start, cases.T[n], ordered,
                                      lambda v: False, nb, cases.bounds(n))
        assert again == cost, (again, cost)
    return Aggregation(cases.direct[:n] + groups, n, cost, chosen,
                       evaluated)


class _Cases:
    """The |U| + 1 cases of Algorithm 3, cheapest-looking first.

    Case n costs at least T_n (group 1 is through) and at least the time
    the other updates' bytes need to get through the aggregators' incoming
    links at their full rates, plus one sum's transfer to the destination
    (LB_n; updates that may be local to an aggregator are not counted).
    T_n grows with n and LB_n falls, so cases are tried from where they
    cross outwards, in order of max(T_n, LB_n), until that reaches the
    best cost found: no case left can beat it.  Group 1's transfers are
    reserved once, as n grows, and replayed into each case's network."""

    def __init__(self, order, net, dst, aggregators, start, floor, ordered,
                 nb):
        self.order, self.net, self.dst = order, net, dst
        self.aggs, self.start, self.ordered, self.nb = (aggregators, start,
                                                        ordered, nb)
        self.T = [max(start, floor)]
        self.direct, self._links = [], []
        self._base = net.fork()
        self._lb = _RestBounds(order, net, dst, aggregators, start)
        self._c_args = None

    def _extend(self, n):
        """Reserve group 1's transfers up to g_n (T_n known)."""
        while len(self.T) <= n:
            g, base = self.order[len(self.T) - 1], self._base
            floor = max(self.T[-1] if self.ordered else -INF, self.nb(g))
            tr = base.reserve(g.worker, self.dst, self.start, g.size, floor,
                              g.uid)
            self.direct.append(Group(None, [g], [], tr))
            self._links.append((g.worker, base.out.get(g.worker),
                                base.inn[self.dst]))
            self.T.append(max(self.T[-1], tr.end))

    def network(self, n):
        """NW after group 1 of case n (a fork of the input)."""
        self._extend(n)
        net = self.net.fork()
        for worker, out, _ in self._links[:n]:
            if out is not None:
                net.out[worker] = out
        if n:
            net.inn[self.dst] = self._links[n - 1][2]
        return net

    def bounds(self, n):
        """lower(i, j) for case n (rest[i] is order[n + i])."""
        return lambda i, j: self._lb.bound(n + i, j)

    def trial(self, n, bound, tie_ok, use_c=True):
        """Case n's cost, or inf once it cannot beat ``bound`` (nor tie it
        unless ``tie_ok``): in C when it is built, else in Python."""
        if use_c and _links.native is not None:
            if self._c_args is None:
                self._c_args = _TrialInputs(self)
            net, c = self.network(n), self._c_args
            return _links.native.det_agg_trial(
                c.links(net), len(c.nodes), c.node, c.size, c.nb, n, c.aggs,
                c.dst, net.now, self.start, self.T[n], bound, self.ordered,
                tie_ok, c.suffix, c.capsum, c.fwd_rate, c.smallest)
        over = (lambda v: v > bound) if tie_ok else (lambda v: v >= bound)
        cost, _ = _det_agg_rest(self.order[n:], self.network(n), self.dst,
                                self.aggs, self.start, self.T[n],
                                self.ordered, over, self.nb, self.bounds(n),
                                trial=True)
        return cost

    def lower(self, n):
        self._extend(n)
        if n == len(self.order):
            return self.T[n]
        if not self.aggs:
            return INF
        return max(self.T[n], self._lb.bound(n, 0))

    def candidates(self, best):
        """n in order of lower bound while it is below ``best()``."""
        N = len(self.order)
        lo, hi = 0, N
        while lo < hi:                       # first n with T_n >= LB_n
            mid = (lo + hi) // 2
            self._extend(mid)
            if mid < N and self.T[mid] < self.lower(mid):
                lo = mid + 1
            else:
                hi = mid
        left, right = lo - 1, lo
        while True:
            a = self.lower(left) if left >= 0 else INF
            b = self.lower(right) if right <= N else INF
            if min(a, b) > best():
                return
            if b <= a:
                yield right
                right += 1
            else:
                yield left
                left -= 1


class _TrialInputs:
    """The arguments of the C trial (``_linkops.det_agg_trial``): nodes
    numbered once per :func:`aggregate` call."""

    def __init__(self, cases):
        order, lb = cases.order, cases._lb
        workers = [g.worker for g in order]
        self.nodes = list(dict.fromkeys(workers + cases.aggs + [cases.dst]))
        index = {node: i for i, node in enumerate(self.nodes)}
        self.node = [index[w] for w in workers]
        self.size = [g.size for g in order]
        self.nb = [cases.nb(g) for g in order]
        self.aggs = [index[a] for a in cases.aggs]
        self.dst = index[cases.dst]
        self.suffix = [s.tolist() for s in lb.suffix]
        self.capsum, self.fwd_rate = list(lb.capsum), list(lb.fwd_rate)
        self.smallest = lb.smallest.tolist()

    def links(self, net):
        return [net.out.get(n) for n in self.nodes] + \
            [net.inn.get(n) for n in self.nodes]


class _RestBounds:
    """Lower bounds on a case's cost from the bytes still to aggregate."""

    def __init__(self, order, net, dst, aggregators, start):
        self.start, k = start, len(aggregators)
        sizes = np.array([g.size for g in order] + [0.0])
        workers = [g.worker for g in order]
        self.suffix, self.capsum, self.fwd_rate = [], [], []
        for j in range(k):
            rest = set(aggregators[j:])
            far = sizes.copy()
            far[:-1] *= [w not in rest for w in workers]
            self.suffix.append(np.cumsum(far[::-1])[::-1])
            self.capsum.append(sum(net.inn[a].cap for a in aggregators[j:]))
            self.fwd_rate.append(min(max(net.out[a].cap
                                         for a in aggregators[j:]),
                                     net.inn[dst].cap))
        smallest = np.minimum.accumulate(sizes[:-1][::-1])[::-1] \
            if len(order) else sizes
        self.smallest = np.append(smallest, INF)

    def bound(self, i, j):
        """The cost is at least this once updates i.. are left for
        aggregators j..k-1."""
        return (self.start + self.suffix[j][i] / self.capsum[j] +
                self.smallest[i] / self.fwd_rate[j])


def aggregate_sync(updates, net, dst, aggregators, start=None, floor=-INF):
    """MLfabric-S (section 6): Algorithm 3 on the unordered list of an
    iteration's updates (in the order they became ready); the sum of all of
    them is what ``dst`` needs, so commits keep no order and the cost is
    when the last one arrives."""
    return aggregate(updates, net, dst, aggregators, start, floor,
                     ordered=False)


def _det_agg_rest(rest, net, dst, aggregators, start, t_max, ordered,
                  over, nb, lower, trial=False):
    """DetAgg after its first n direct updates (lines 8-19 of Alg 3) on
    ``net`` (changed).  Returns (cost, groups), or (inf, None) as soon as
    ``over(x)`` holds for a value x the cost cannot be below;
    ``lower(i, j)`` bounds the cost when rest[i:] is left for aggregators
    j..k-1.  A ``trial`` only computes the cost (no groups; a worker's
    outgoing link is reserved only if the case uses it again)."""
    groups, members, arrivals = [], [], []
    k, a, i = len(aggregators), 0, 0
    reused = _reused(rest, aggregators) if trial else None
    if over(lower(0, 0)):
        return INF, None
    while i < len(rest):
        g, node = rest[i], aggregators[a]
        t, points, rates = net.fill(g.worker, node, start, g.size)
        if members and t > t_max and a + 1 < k:
            grp = _close(net, node, dst, members, arrivals, t_max, ordered,
                         nb, trial)
            groups.append(grp)
            t_max = max(t_max, grp.end)
            members, arrivals, a = [], [], a + 1
            if over(t_max) or over(lower(i, a)):
                return INF, None
            continue
        if over(t):                 # it joins: its group's sum is later
            return INF, None
        net.commit(g.worker, node, points, rates,
                   not trial or g.worker in reused)
        arrivals.append(t if trial else Transfer(
            g.worker, node, g.size, start, t, points or [t, t],
            rates or [], g.uid))
        members.append(g)
        i += 1
    if members:
        grp = _close(net, aggregators[a], dst, members, arrivals, t_max,
                     ordered, nb, trial)
        groups.append(grp)
        t_max = max(t_max, grp.end)
        if over(t_max):
            return INF, None
    return t_max, groups


def _reused(rest, aggregators):
    """Nodes whose outgoing link a case uses more than once: workers with
    several updates left, and the aggregators (they forward sums)."""
    seen, again = set(), set(aggregators)
    for g in rest:
        if g.worker in seen:
            again.add(g.worker)
        seen.add(g.worker)
    return again


def _close(net, node, dst, members, arrivals, t_max, ordered, nb, trial):
    """Reserve an aggregator's sum to ``dst`` (lines 11-12 of Alg 3)."""
    ready = max(arrivals) if trial else max(tr.end for tr in arrivals)
    size = max(g.size for g in members)
    floor = max(t_max if ordered else -INF, max(nb(g) for g in members))
    fwd = net.reserve(node, dst, ready, size, floor,
                      ("sum", node, members[0].uid))
    return Group(node, list(members), list(arrivals), fwd)
