"""Bounded-consistency replication (MLfabric sections 3.3 and 5.3).

Workers also send their updates to a replica R, through k' aggregators of
its own, in the server's order and in the bandwidth the server's transfers
leave; the scheduler keeps ||w_s - w_r|| <= Div_max at all times.

**The bound (Eqs. 7 and 11).**  With momentum (Eq. 2), if the server has
applied L updates u_1..u_L beyond the replica's state w_0 (history h_0)::

    w_L - w_0 = (gamma + .. + gamma^L) h_0
                + sum_j (1 + gamma + .. + gamma^(L-j)) u_j

(Eq. 7 is L = 2).  The triangle inequality gives the bound used here::

    div <= a_0 ||h_0|| + sum_j a_j ||u_j||,
    a_0 = sum_{i=1..L} gamma^i,   a_j = sum_{i=0..L-j} gamma^i

which is the square root of Eq. 11 (its cross terms are 2 a_i a_j ||x_i||
||x_j||; the printed last term ``a6 ||u1||.||h0||`` repeats a4's pair and
we read it as ``||u2||.||h0||``).  It needs only the norms the workers
send with their updates and a bound of ||h|| at the replica's version,
kept as ||h_v|| <= gamma ||h_(v-1)|| + ||u_v||.

The bound only grows when the server commits and only shrinks when the
replica commits, as long as the replica never runs ahead of the server.
So it is checked at every server commit (the paper checks once, at the
batch's last commit T_last; a batch's earlier commits could exceed it),
and a replica commit never completes before the server commit of its
last update (a floor, :mod:`.links`).

**The algorithm** (5.3), per batch:

1. The replica's list: updates the server applied (or will) that the
   replica has not, in the server's order: those punted by earlier batches,
   then this batch's.  Tentative replica schedule: Algorithm 3 to R through
   the k' aggregators, on NW with the server's transfers reserved.
2. Walk the server's commits in order.  Where the bound would exceed
   Div_max, find the first replica commit a_e after which it would not,
   and delay that server commit to start after a_e completes (the paper
   delays only the last one); later server commits, and replica commits
   whose floor moved, are re-reserved after it.
3. Freeze the replica commits that complete by T_last (the last server
   commit); the rest are punted to the next batch (their reservations
   released; the workers keep those updates).  Ours: when none completes
   by then and the replica's earlier commits end by then too, the whole
   tentative replica schedule is frozen.  Otherwise a replica whose link
   needs more than a batch interval for one commit would be punted for
   ever (and a server that waits for it, Div_max, with it); freezing only
   its first commit, a direct copy, left such a replica without
   aggregation (1.07x less data than every update on its own, against
   4-5x with the whole plan frozen, in the replication benchmark).

Where the paper is silent (tested in tests/test_mlfabric_replication.py):
the unit frozen or punted is a whole replica commit (a direct update, or a
sum with all its members' transfers); a server commit waits only for
replica commits made of updates the server committed before it; when even
that is not enough (Div_max below what one commit alone moves the model:
no schedule can meet it, server and replica would have to commit at the
same instant), the commit waits for the replica to reach the commit
before it and is listed in ``Replication.unmet``.

An end-to-end server (:mod:`partialcoll.mlfabric.runtime`) applies the
bound's model exactly: with momentum at the server every commit carries
two sums, so a commit is its updates applied one by one and the replica,
whatever its grouping, holds the server's model at every version both
reached (:mod:`partialcoll.mlfabric.runtime.optim`).
"""
import numpy as np

from .aggregation import aggregate
from .links import INF
from ...core.errors import ScheduleError


def divergence_bound(h_norm, lead_norms, gamma):
    """The Eq. 11 bound of ||w_s - w_r|| when the server leads the replica
    by updates with norms ``lead_norms`` (oldest first) and the replica's
    history has norm ``h_norm``."""
    L = len(lead_norms)
    a0 = sum(gamma ** i for i in range(1, L + 1))
    return a0 * h_norm + sum(
        sum(gamma ** i for i in range(L - j)) * n
        for j, n in enumerate(lead_norms))


class DivergenceTracker:
    """Norms of the updates the server applied beyond the replica, and a
    bound of the replica's history norm.

    Args:
        gamma: the server's momentum (Eq. 2).
        h_norm: ||h|| at the replica now (exact, e.g. reported by it).
    """

    def __init__(self, gamma, h_norm=0.0):
        if not 0 <= gamma < 1:
            raise ScheduleError(f"momentum must be in [0, 1), got {gamma!r}")
        self.gamma, self.h, self.lead = float(gamma), float(h_norm), []

    def server_applied(self, norms):
        self.lead.extend(float(n) for n in norms)

    def replica_applied(self, count):
        for n in self.lead[:count]:
            self.h = self.gamma * self.h + n
        del self.lead[:count]

    def bound(self):
        return divergence_bound(self.h, self.lead, self.gamma)


class _Bounds:
    """bound(s, p) for a sequence of norms: the server has applied the
    first s, the replica the first p <= s (O(s - p) each)."""

    def __init__(self, h0, norms, gamma):
        n = len(norms)
        self.norms = np.asarray(norms, dtype=np.float64)
        powers = gamma ** np.arange(n + 1)
        self.G = np.cumsum(powers)                 # G[d] = sum_{i<=d}
        self.A0 = np.concatenate(([0.0], np.cumsum(powers[1:])))
        self.H = np.empty(n + 1)
        self.H[0] = h0
        for v in range(n):
            self.H[v + 1] = gamma * self.H[v] + self.norms[v]

    def __call__(self, s, p):
        L = s - p
        if L <= 0:
            return 0.0
        return float(self.A0[L] * self.H[p] +
                     np.dot(self.G[L - 1::-1], self.norms[p:s]))


class Replication:
    """Section 5.3's result for one batch.

    Attributes:
        groups: frozen replica commits (in order).
        punted: updates left for the next batch, in order.
        server_groups: the server's commits, some possibly delayed.
        delayed: how many server commits were moved.
        unmet: server commits (indices) whose bound could not be met.
        checks: [(time, bound)] at every server commit.
        inflight: frozen replica commits (of this batch or earlier ones)
            that end after this batch's T_last: the next batch's walk
            counts them at their end.
    """

    def __init__(self, groups, punted, server_groups, delayed, unmet,
                 checks, inflight=()):
        self.groups, self.punted = groups, punted
        self.server_groups, self.delayed = server_groups, delayed
        self.unmet, self.checks = unmet, checks
        self.inflight = list(inflight)


def replicate(server_groups, backlog, net, replica, aggregators, tracker,
              div_max, server_time=None, start=None, floor=-INF,
              horizon=-INF, inflight=()):
    """Section 5.3 for one batch.

    Args:
        server_groups: this batch's server commits (Algorithm 3's groups,
            reserved in ``net``), in order; delayed here when needed.
        backlog: updates committed by the server in earlier batches that
            the replica has not, in the server's order (not those of
            ``inflight``).
        net: NW with the server's reservations; gets the frozen replica
            reservations (and the server's moved ones).
        replica, aggregators: the replica's node and its k' aggregators.
        tracker: a :class:`DivergenceTracker` whose lead is the norms of
            ``inflight``'s members, then the backlog's; advanced to the
            state after this batch.
        div_max: Div_max.
        server_time: {uid: server commit time} for the backlog.
        start: when transfers may start (default ``net.now``).
        floor: when the replica's earlier commits end.
        horizon: replica commits that end by max(T_last, horizon) are
            frozen (the paper: T_last; a scheduler passes its next batch
            time so that an idle server does not stall the replica).
        inflight: replica commits frozen by earlier batches that had not
            ended by their T_last (``Replication.inflight``), in order.

    Returns a :class:`Replication`.
    """
    start = net.now if start is None else float(start)
    inflight = list(inflight)
    batch = [g for grp in server_groups for g in grp.members]
    order = list(backlog) + batch
    ahead = [g for grp in inflight for g in grp.members]
    times = dict(server_time or {})
    for grp in server_groups:
        for g in grp.members:
            times[g.uid] = grp.end
    if len(tracker.lead) != len(ahead) + len(backlog):
        raise ScheduleError("the tracker's lead must be the in-flight "
                            "commits' and the backlog's norms")
    agg = aggregate(order, net, replica, aggregators, start, floor,
                    ordered=True, not_before=times)
    net.adopt(agg.net)
    rgroups = inflight + agg.groups
    bounds = _Bounds(tracker.h, tracker.lead + [g.norm for g in batch],
                     tracker.gamma)
    walk = _Walk(net, server_groups, rgroups, times, bounds, div_max)
    walk.run(len(ahead) + len(backlog))
    t_last = max([grp.end for grp in server_groups] + [horizon])
    frozen = len(inflight)
    while frozen < len(rgroups) and rgroups[frozen].end <= t_last:
        frozen += 1
    if frozen == 0 and rgroups and floor <= t_last:
        frozen = len(rgroups)   # the replica would idle: its plan goes
    for grp in rgroups[max(frozen, len(inflight)):]:
        net.release(grp.forward)
        for tr in grp.arrivals:
            net.release(tr)
    kept = rgroups[len(inflight):max(frozen, len(inflight))]
    count = sum(len(grp.members) for grp in kept)
    final = inflight + kept
    done = 0
    while done < len(final) and final[done].end <= t_last:
        done += 1
    tracker.server_applied(g.norm for g in batch)
    tracker.replica_applied(sum(len(grp.members) for grp in final[:done]))
    return Replication(kept, order[count:], server_groups, walk.delayed,
                       walk.unmet, walk.checks, final[done:])


class _Walk:
    """Step 2 of 5.3: the server's commits in order, each checked against
    the replica commits complete by then, delayed when over Div_max.

    A replica commit is *final* once the server has committed all of its
    updates: it is then re-reserved, if needed, to follow them (and the
    replica commit before it).  A server commit is re-reserved when the one
    before it moved, or when it must wait for the replica.  So each commit
    moves at most twice, whatever the number of violations."""

    def __init__(self, net, server_groups, rgroups, times, bounds, div_max):
        self.net, self.server, self.rep = net, server_groups, rgroups
        self.times, self.bounds, self.div_max = times, bounds, div_max
        self.P = np.cumsum([len(g.members) for g in rgroups]).tolist()
        self.final = 0       # replica commits final so far
        self.counted = 0     # final replica commits complete by the sweep
        self.delayed, self.unmet, self.checks = 0, [], []

    def run(self, s_prev):
        floor = -INF
        for grp in self.server:
            if grp.forward.end < floor:
                self._move(grp, grp.forward.start, floor)
            s_c = s_prev + len(grp.members)
            self._finalize(s_prev)
            b = self.bounds(s_c, self._replica_count(grp.end))
            if b > self.div_max:
                e = self._first_enough(s_prev, s_c)
                if e is not None and self.rep[e].end > grp.forward.start:
                    self._move(grp, self.rep[e].end, floor)
                    self.delayed += 1
                b = self.bounds(s_c, self._replica_count(grp.end))
            self.checks.append((grp.end, b))
            floor, s_prev = grp.end, s_c
        self._finalize(INF)

    def _move(self, grp, start, floor):
        old = grp.forward
        self.net.release(old)
        grp.forward = self.net.reserve(old.src, old.dst,
                                       max(old.start, start), old.size,
                                       floor, old.what)
        for g in grp.members:
            self.times[g.uid] = grp.forward.end

    def _finalize(self, s_limit):
        while self.final < len(self.rep) and self.P[self.final] <= s_limit:
            e, grp = self.final, self.rep[self.final]
            need = max([self.rep[e - 1].end if e else -INF] +
                       [self.times.get(g.uid, -INF) for g in grp.members])
            if grp.forward.end < need:
                old = grp.forward
                self.net.release(old)
                grp.forward = self.net.reserve(old.src, old.dst, old.start,
                                               old.size, need, old.what)
            self.final += 1

    def _replica_count(self, t):
        """Updates the replica has applied by time t, counting only final
        commits (the sweep's times never decrease)."""
        while self.counted < self.final and self.rep[self.counted].end <= t:
            self.counted += 1
        return self.P[self.counted - 1] if self.counted else 0

    def _first_enough(self, s_prev, s_c):
        """The first final replica commit (made of updates committed before
        this one) after which the bound holds (bisection: the bound only
        falls as the replica advances); else the last such commit, with
        this commit listed as unmet."""
        hi = self.final
        while hi and self.P[hi - 1] > s_prev:
            hi -= 1
        if not hi:
            self.unmet.append(len(self.checks))
            return None
        if self.bounds(s_c, self.P[hi - 1]) > self.div_max:
            self.unmet.append(len(self.checks))
            return hi - 1
        lo = 0
        while lo < hi - 1:
            mid = (lo + hi - 1) // 2
            if self.bounds(s_c, self.P[mid]) <= self.div_max:
                hi = mid + 1
            else:
                lo = mid + 1
        return lo
