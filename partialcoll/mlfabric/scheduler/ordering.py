"""Update ordering (MLfabric section 5.1, Algorithms 1 and 2).

Given a batch U of ready updates and the network state NW (rates from the
monitor, bandwidth already reserved), pick the order in which the updates
go to the server S, dropping those that could only be applied with a
delay above tau_max.

**Versions and delays** (the paper's convention, from Eq. 9 and Fig. 1's
caption): the server's version counts the worker updates applied so far;
the update applied as the i-th of a batch produces version v_init + i and
its delay is ``v_init + i - v(g)``, v(g) being the version it was computed
from (an update computed from the current model and applied at once has
delay 1).  Section 2's wording ("the version being updated minus the one
used") would give one less; with the paper's convention the bound below is
the tighter one.  An aggregate of m updates counts m versions, and each of
its updates, applied to the model at version V with the others, has delay
V + 1 - v(g) (at most what its own position would give).

**Deadline (Eq. 9)**, present in the stored text::

    dl(g) = v(g) + tau_max - v_init

the last position (1-based, within the batch) at which g may be applied.
An update with dl(g) < 1 cannot be applied within tau_max at all.

**Algorithm 1** (shortest transfer first): repeatedly pick the update whose
t_en (``links.finish_time()``: the time it would be through using the
remaining, time-varying bandwidth of the slower link of its path, given
the reservations) is smallest, reserve its bandwidth (NetUp), repeat.
This is not shortest-job-first by size/rate: a small update behind a
worker whose link is reserved, or a slow worker limited to a fraction of
the server's link while a faster one can use the rest, changes the order.

**Algorithm 2** adds deadlines and the look-ahead drop.  Where its
pseudocode leaves room we chose (tests in tests/test_mlfabric_order.py):

* *Position.*  The printed loop uses its counter i as the position for the
  deadline test even after ``continue`` dropped an update, so an update
  whose deadline was exactly that iteration would never be forced.  We use
  the number of updates kept so far + 1.
* *Which deadline is due.*  The printed rule ("if some g has dl(g) = i,
  pick it") misses deadlines when two updates share one, and cannot see
  that two updates with deadline i + 1 need position i already.  We force
  a pick when the pending deadlines leave no slack (some j >= i with
  #{pending: dl <= j} >= j - i + 1) and then take the earliest deadline,
  the shortest t_en among equal ones (earliest-deadline-first).  With
  distinct deadlines this is exactly the paper's rule.
* *Look-ahead (line 11).*  For a pick made by shortest-t_en the test can
  never fire (every other update's t_en only grows once bandwidth is
  reserved, so the next one cannot finish earlier), so it is evaluated for
  forced picks only: "current" is dropped when "next" (the pick for the
  next position once current's bandwidth is reserved) would complete
  before it.  An exhaustive reference that tests every pick agrees
  (test_fast_ordering_matches_the_literal_reference).
* *Missed deadlines.*  An update whose deadline has passed (dl(g) below the
  current position: several updates shared too few positions) is dropped.
* *Completion order.*  The server applies updates as they arrive, so a
  transfer must not complete before the one placed before it (after a
  dropped forced pick, the next pick could).  Such a transfer starts late
  enough to complete at that time (a *floor*); the first one of a batch is
  held to the last commit planned by earlier batches.

Every dropped update is dropped before anything is sent: the worker is
told and never sends it.  Invariant (tested over random batches): every
kept update sits at a position <= its deadline, so none is applied with a
delay above tau_max.

Speed: t_en only grows as bandwidth is reserved, so an old t_en is a lower
bound and a lazy heap recomputes only candidates that could be the
minimum.  Candidates are grouped in classes with the same path residual
(one worker's updates; workers whose links have equal rates and nothing
reserved where the server still has room), in which t_en grows with size:
only a class's smallest update is a candidate, so when every t_en moves at
once (the server's link is the bottleneck) the heap recomputes a few
classes, not every worker.
"""
import heapq
from bisect import bisect_left as _bisect_left, bisect_right as _bisect

import numpy as np

from .links import INF, Timeline, finish_time
from ...core.errors import ScheduleError


class Update:
    """A worker's update waiting at the scheduler.

    Args:
        uid: any hashable id, unique in the scheduler's lifetime.
        worker: the node it is on.
        size: bytes.
        version: v(g), the model version it was computed from.
        norm: its L2 norm (for the replica's divergence bound, 5.3).
    """

    __slots__ = ("uid", "worker", "size", "version", "norm")

    def __init__(self, uid, worker, size, version, norm=0.0):
        if size < 0:
            raise ScheduleError(f"update {uid!r}: size must be >= 0")
        self.uid, self.worker, self.size = uid, worker, float(size)
        self.version, self.norm = int(version), float(norm)

    def __repr__(self):
        return (f"Update({self.uid!r}, worker={self.worker}, "
                f"size={self.size:g}, v={self.version})")


def deadline(update, tau_max, v_init):
    """Eq. 9: dl(g) = v(g) + tau_max - v_init."""
    return update.version + tau_max - v_init


class Ordering:
    """Algorithm 2's result.

    Attributes:
        order: kept updates, in the order they reach the server.
        finish: their planned completion times (t_en), non-decreasing.
        transfers: their reservations in ``net``.
        dropped: [(update, reason)]; reason is "stale" (dl < 1),
            "lookahead" (Alg 2 line 11) or "deadline" (its position passed).
        net: NW with the reservations (a fork of the input).
    """

    def __init__(self, order, finish, transfers, dropped, net):
        self.order, self.finish, self.transfers = order, finish, transfers
        self.dropped, self.net = dropped, net

    def positions(self):
        """{uid: position}, 1-based."""
        return {g.uid: i + 1 for i, g in enumerate(self.order)}


class _Deadlines:
    """Pending deadlines; says when a position must take one (EDF when
    no slack is left)."""

    def __init__(self, dls, n):
        self.n = n
        self.dl = dls                       # idx -> deadline
        counts = np.zeros(n + 1, dtype=np.int64)
        for d in dls.values():
            if 1 <= d <= n:
                counts[d] += 1
        # slack[j-1] = #{pending: dl <= j} - j, j = 1..n; deadlines above n
        # never bind (at most n positions)
        self.slack = np.cumsum(counts)[1:] - np.arange(1, n + 1)
        self.buckets = {}
        for i, d in dls.items():
            self.buckets.setdefault(d, set()).add(i)
        self.values, self.low = sorted(self.buckets), 0

    def remove(self, i):
        d = self.dl[i]
        self.buckets[d].discard(i)
        if 1 <= d <= self.n:
            self.slack[d - 1:] -= 1

    def restore(self, i):
        d = self.dl[i]
        self.buckets[d].add(i)
        self.low = min(self.low, _bisect_left(self.values, d))
        if 1 <= d <= self.n:
            self.slack[d - 1:] += 1

    def _first(self, at_least):
        """The smallest pending deadline >= at_least, or None."""
        values, k = self.values, self.low
        while k < len(values) and not self.buckets[values[k]]:
            k += 1
        self.low = k
        while k < len(values) and (values[k] < at_least or
                                   not self.buckets[values[k]]):
            k += 1
        return values[k] if k < len(values) else None

    def missed(self, pos):
        """Pending indices whose deadline is before ``pos`` (removed)."""
        out = []
        for d in self.values[self.low:]:
            if d >= pos:
                break
            out.extend(sorted(self.buckets[d]))
        for i in out:
            self.remove(i)
        return out

    def due(self, pos):
        """Indices that position ``pos`` must choose from (the earliest
        deadline), or () when there is slack."""
        if pos > self.n or self.slack[pos - 1:].max() < 1 - pos:
            return ()
        d = self._first(pos)
        return sorted(self.buckets[d]) if d is not None else ()


class _Class:
    """Pending updates whose paths have the same residual from the start
    (so t_en depends on size alone): a heap of (size, index) and a lower
    bound ``key`` of its smallest one's t_en."""

    __slots__ = ("heap", "key", "stamp", "fresh")

    def __init__(self):
        self.heap, self.key, self.stamp, self.fresh = [], INF, 0, -1


class _Candidates:
    """Pending updates in classes, with a lazy heap over the classes keyed
    by lower bounds of t_en: reservations only lower residual bandwidth, so
    an old t_en is a lower bound of the current one, and only a class at
    the top of the heap is recomputed.

    A worker's updates share a path; so do workers whose outgoing links
    have the same rate and nothing reserved where the server still has
    room (whatever is reserved lies where the server's link is already
    full, so min(worker, server) is the same).  Such workers form one class
    ("clear", rate); the others a class of their own ("worker", node)
    until the server's fully booked prefix covers their reservations."""

    def __init__(self, updates, net, server, start):
        self.updates, self.net = updates, net
        self.server, self.start = server, start
        self.classes, self.where, self.gone = {}, {}, set()
        self.by_worker, self.clear = {}, {}
        self.heap, self.waiting, self.epoch = [], [], 0
        for i, g in enumerate(updates):
            self.by_worker.setdefault(g.worker, []).append(i)
            self._put(i, self._class_of(g.worker), start)

    def link(self, key, net):
        """The outgoing link every update of class ``key`` sees in net."""
        if key[0] == "worker":
            return net.out[key[1]]
        link = self.clear.get(key[1])
        if link is None:
            link = self.clear[key[1]] = Timeline(key[1], self.start)
        return link

    def _full_until(self):
        """End of the server link's fully booked prefix from the start."""
        link = self.net.inn[self.server]
        times, used = link.times, link.used
        k = max(0, _bisect(times, self.start) - 1)
        return times[k + 1] if used[k] >= link.cap and k + 1 < len(times) \
            else self.start

    def _class_of(self, worker):
        link = self.net.out[worker]
        if link.is_clear() or link.busy_until() <= self._full_until():
            return ("clear", link.cap)
        heapq.heappush(self.waiting, (link.busy_until(), worker))
        return ("worker", worker)

    def _put(self, i, key, lower):
        """Update i joins class ``key``; ``lower`` bounds its t_en."""
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = _Class()
        self.where[i] = key
        heapq.heappush(cls.heap, (self.updates[i].size, i))
        if lower < cls.key:
            cls.key, cls.fresh = lower, -1
            cls.stamp += 1
            heapq.heappush(self.heap, (lower, i, key, cls.stamp))
        elif cls.heap[0][1] == i:
            cls.fresh = -1             # new head: recompute before use

    def head(self, cls, key):
        q = cls.heap
        while q and (q[0][1] in self.gone or self.where[q[0][1]] != key):
            heapq.heappop(q)
        return q[0][1] if q else None

    def remove(self, i):
        key = self.where[i]
        cls = self.classes[key]
        if self.head(cls, key) == i:
            cls.fresh = -1             # the key was this update's
        self.gone.add(i)

    def regroup(self, worker, key=None):
        """Put ``worker``'s pending updates in class ``key`` (default: the
        class its link puts it in now)."""
        key = key or self._class_of(worker)
        for i in self.by_worker[worker]:
            if i not in self.gone and self.where[i] != key:
                self._put(i, key, self.classes[self.where[i]].key)

    def reserved(self, net, worker):
        """Bandwidth was reserved for ``worker``'s update in ``net`` (now
        the current network): t_en may have grown, classes changed."""
        self.net, self.epoch = net, self.epoch + 1
        moving = [worker]
        full = self._full_until()
        while self.waiting and self.waiting[0][0] <= full:
            moving.append(heapq.heappop(self.waiting)[1])
        for w in moving:
            self.regroup(w)

    def argmin(self, t_en):
        """(index, t_en) of the pending update with the smallest t_en
        (ties: lower index); ``t_en(link, size)`` computes one exactly."""
        heap = self.heap
        while heap:
            _, _, key, stamp = heap[0]
            cls = self.classes[key]
            i = self.head(cls, key) if stamp == cls.stamp else None
            if i is None:
                heapq.heappop(heap)
                if stamp == cls.stamp:
                    cls.key = INF      # its live entry is gone: next _put
                continue               # pushes one
            if cls.fresh == self.epoch:
                return i, heap[0][0]
            cls.key = t_en(self.link(key, self.net), self.updates[i].size)
            cls.stamp += 1
            cls.fresh = self.epoch
            heapq.heapreplace(heap, (cls.key, i, key, cls.stamp))
        return None, INF

    def any_before(self, net, t_en, bound):
        """Is there a pending update with t_en < bound in ``net`` (a trial
        network: only bandwidth was added to the current one)?  Walks the
        heap in key order without changing it (keys are lower bounds)."""
        heap, todo = self.heap, [(self.heap[0][:2], 0)] if self.heap else []
        while todo:
            k0, k = heapq.heappop(todo)
            if k0[0] >= bound:
                return False
            _, _, key, stamp = heap[k]
            cls = self.classes[key]
            i = self.head(cls, key) if stamp == cls.stamp else None
            if i is not None and \
                    t_en(self.link(key, net), self.updates[i].size) < bound:
                return True
            for c in (2 * k + 1, 2 * k + 2):
                if c < len(heap):
                    heapq.heappush(todo, (heap[c][:2], c))
        return False


def order_updates(updates, net, server, tau_max, v_init, floor=-INF,
                  start=None):
    """Algorithm 2: the order of ``updates`` to ``server``, with drops.

    Args:
        updates: the batch U (:class:`Update`), all ready at ``start``.
        net: NW (:class:`~.links.NetworkState`); not changed (the result
            holds a fork with the reservations).
        tau_max: the delay bound.
        v_init: the server's version once every earlier update is applied.
        floor: the completion time of the last commit planned before this
            batch (this batch's first transfer does not complete earlier).
        start: when the updates may start (default ``net.now``).

    Returns an :class:`Ordering`.

    Example (the paper's Fig. 5: g1 has deadline 1 but a 10 Mb/s link and
    takes 10 s; g2 would be through in 1.1 s beside it: g1 is dropped)::

        net = NetworkState({1: 10, 2: 100, 0: 100}, {0: 100, 1: 100, 2: 100})
        o = order_updates([Update("g1", 1, 100, 0), Update("g2", 2, 99, 4)],
                          net, server=0, tau_max=1, v_init=0)
        [g.uid for g in o.order], o.dropped    # ['g2'], [(g1, 'lookahead')]
    """
    run = _OrderRun(list(updates), net.fork(), server, tau_max, v_init,
                    floor, net.now if start is None else float(start))
    while run.remaining:
        pos = len(run.order) + 1
        run.drop_missed(pos)
        if not run.remaining:
            break
        due = run.deadlines.due(pos)
        run.place(run.pick(due), due, pos)
    return Ordering(run.order, run.finish, run.transfers, run.dropped,
                    run.work)


class _OrderRun:
    """The state of one run of Algorithm 2 (:func:`order_updates`): the
    network with the reservations so far (``work``), the candidates
    grouped by link, the deadlines, and what is ordered and dropped."""

    def __init__(self, updates, work, server, tau_max, v_init, floor, start):
        self.updates, self.work, self.server = updates, work, server
        self.floor, self.start = floor, start
        n = len(updates)
        dls = {i: deadline(g, tau_max, v_init) for i, g in enumerate(updates)}
        self.cands = _Candidates(updates, work, server, start)
        self.dropped = []
        for i in range(n):
            if dls[i] < 1:
                self.cands.remove(i)
                self.dropped.append((updates[i], "stale"))
        self.deadlines = _Deadlines({i: d for i, d in dls.items() if d >= 1},
                                    n)
        self.remaining = n - len(self.dropped)
        self.order, self.finish, self.transfers = [], [], []

    def t_en_in(self, nw):
        """t_en of a size from a link into the server on network ``nw``."""
        server, start = self.server, self.start
        return lambda link, size: finish_time(link, nw.inn[server], start,
                                              size)

    def t_exact(self, i, nw):
        """When update ``i`` would be through on network ``nw``."""
        g = self.updates[i]
        return nw.finish(g.worker, self.server, self.start, g.size)

    def drop_missed(self, pos):
        """Drop the updates whose deadline is before position ``pos``."""
        for i in self.deadlines.missed(pos):
            self.cands.remove(i)
            self.dropped.append((self.updates[i], "deadline"))
            self.remaining -= 1

    def pick(self, due):
        """The update for the next position: among those ``due`` there,
        the one through first; else the candidate with the smallest t_en
        (Alg 2's argmin)."""
        if due:
            return min(due, key=lambda j: (self.t_exact(j, self.work), j))
        return self.cands.argmin(self.t_en_in(self.work))[0]

    def place(self, i, due, pos):
        """Reserve update ``i`` at ``pos``, unless it is due there and the
        update picked for the next position would be through sooner
        without it (the lookahead drop, Alg 2 line 11)."""
        g, work = self.updates[i], self.work
        self.deadlines.remove(i)
        self.cands.remove(i)
        self.remaining -= 1
        if due:                  # its worker's other updates will see the
            self.cands.regroup(g.worker, ("worker", g.worker))  # trial's link
            trial = work.fork()
        else:
            trial = work
        tr = trial.reserve(g.worker, self.server, self.start, g.size,
                           self.floor, g.uid)
        if due and self.remaining and _next_is_sooner(
                pos + 1, self.t_exact(i, work), self.deadlines, self.cands,
                trial, lambda j: self.t_exact(j, trial),
                self.t_en_in(trial)):
            self.dropped.append((g, "lookahead"))
            self.cands.regroup(g.worker)
            return
        self.work = trial
        self.cands.reserved(trial, g.worker)
        self.order.append(g)
        self.finish.append(tr.end)
        self.transfers.append(tr)
        self.floor = tr.end


def _next_is_sooner(pos, t_current, deadlines, cands, trial, t_exact,
                    t_en):
    """Alg 2 line 11: would the update picked for ``pos`` once current's
    bandwidth is reserved (``trial``) complete before ``t_current``?"""
    late = sorted(deadlines.buckets.get(pos - 1, ()))
    for j in late:                 # they would be dropped at pos, not picked
        deadlines.remove(j)
    try:
        due = deadlines.due(pos)
        if due:
            return min(t_exact(j) for j in due) < t_current
        return cands.any_before(trial, t_en, t_current)
    finally:
        for j in late:
            deadlines.restore(j)


def delays(commits, v_init):
    """Delays of updates applied as ``commits`` (in arrival order; each a
    list of updates applied together: one update, or an aggregate) from
    version ``v_init``: every update of a commit applied to version V has
    delay V + 1 - v(g) (the paper's convention), and the commit advances
    the version by its number of updates.  Returns {uid: delay}."""
    out, v = {}, v_init
    for members in commits:
        for g in members:
            out[g.uid] = v + 1 - g.version
        v += len(members)
    return out
