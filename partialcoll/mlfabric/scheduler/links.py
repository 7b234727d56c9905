"""The network as MLfabric's scheduler sees it: per-NIC rates (from the
lagged monitor, never the emulator's true rates) and, per NIC, a timeline
of the bandwidth already reserved for transfers scheduled earlier.

Model (the emulator's, ``partialcoll.network``, and the paper's
"congestion-free core", section 7.4): every node has an outgoing and an
incoming NIC; a transfer from ``src`` to ``dst`` crosses exactly two links,
``src``'s outgoing NIC and ``dst``'s incoming one.  A transfer inside one
node crosses none and takes no time.

:class:`Timeline` is one NIC: a capacity ``cap`` (bytes/s) and ``used``, a
step function of time (the sum of the reservations on it)::

    times = [t0,   t1,   t2, ...]      breakpoints, increasing
    used  = [u0,   u1,   u2, ...]      reserved rate on [t_i, t_i+1)
                                       (the last segment runs to +inf, u = 0)

The residual rate is ``max(cap - used, 0)``.  A new capacity from the
monitor replaces ``cap`` and keeps the reservations (a NIC that slowed
down below what was reserved has no residual there: the scheduler does not
re-plan transfers already scheduled).

Transfers follow the paper's time sharing (section 5.1.1, Fig. 4b-c): a
transfer takes, at every instant, all the residual bandwidth of the slower
of its two links ("maximally using bottleneck capacity at any time"), from
its start until its bytes are through (``finish_time()``, the paper's
t_en); reserving it (NetUp) subtracts that profile from both links, so the
bottleneck link has nothing left over the transfer and the other link keeps
the difference.

A *floor* (used to keep the order of commits at a server: a transfer must
not complete before the one before it) is met by starting the transfer
late enough that it completes at the floor (``latest_start()``): the
bytes use the last residual capacity before the floor, leaving the earlier
capacity to others.  When the path has no capacity just before the floor
the bytes are through earlier and the transfer's last byte is held back
until the floor (its completion is the floor).
"""
import math
from bisect import bisect_right
from types import ModuleType

from ...core import env
from ...core.errors import ScheduleError

#: The same loops in C (the extension ``_linkops``, csrc/mlfabric/), bit
#: for bit; None when it is not built or PARTIALCOLL_MLFABRIC_PURE_PYTHON
#: is "1" (the Python loops below are then used).
native: ModuleType | None = None
if env.get(env.MLFABRIC_PURE_PYTHON) != "1":
    try:
        from . import _linkops as native
    except ImportError:             # pragma: no cover - not built
        native = None

INF = math.inf
_TOL = 1e-9          # relative: a residual below cap * _TOL is none


def _tolerance(ca, cb):
    """Residual rates at or below this count as zero (float dust from
    adding and removing reservations)."""
    c = ca if ca < cb else cb
    return c * _TOL if c < INF else 0.0


class Timeline:
    """One NIC direction: ``cap`` and the reserved rate over time.
    Immutable: a reservation makes a new timeline, so forks of a
    :class:`NetworkState` share every link they have not changed."""

    __slots__ = ("cap", "times", "used")

    def __init__(self, cap, start=0.0, times=None, used=None):
        if not cap > 0:
            raise ScheduleError(f"a link's rate must be > 0, got {cap!r}")
        self.cap = float(cap)
        self.times = [float(start)] if times is None else times
        self.used = [0.0] if used is None else used

    def residual(self, t):
        """Residual rate at time ``t``."""
        i = max(bisect_right(self.times, t) - 1, 0)
        return max(self.cap - self.used[i], 0.0)

    def busy_until(self):
        """End of the last reservation (times[0] when there is none)."""
        return self.times[-1]

    def is_clear(self):
        """True when nothing is reserved from times[0] on."""
        return len(self.used) == 1

    def trimmed(self, now, cap=None):
        """This link from ``now`` on (what was reserved before is
        forgotten), with a new capacity if given."""
        i = max(bisect_right(self.times, now) - 1, 0)
        times, used = self.times[i:], self.used[i:]
        times[0] = max(times[0], float(now))
        return Timeline(self.cap if cap is None else cap, times=times,
                        used=used)

    def added(self, points, rates, sign=1.0):
        """A new timeline with a reservation added (``sign`` = 1) or
        removed (-1): ``rates[j]`` on [points[j], points[j+1])."""
        if native is None:
            return self._py_added(points, rates, sign)
        return native.added(self, points, rates, sign)

    def _py_added(self, points, rates, sign=1.0):
        if len(points) < 2 or points[-1] <= points[0]:
            return self
        if points[0] < self.times[0]:
            raise ScheduleError("a reservation cannot start before the "
                                "timeline")
        times, used, cap = self.times, self.used, self.cap
        tol = _tolerance(cap, cap)
        p0, last = points[0], points[-1]
        i = bisect_right(times, p0) - 1          # segment holding p0
        k = bisect_right(times, last) - 1        # segment holding last
        nt, nu = times[:i + 1], used[:i + 1]
        if times[i] < p0:
            nt.append(p0)
            nu.append(used[i])
        ia, j = i, 0
        t, n_t = p0, len(times)
        while t < last:
            u = used[ia] + sign * rates[j]
            if cap - u <= tol:
                u = cap            # exactly full: coalesces, no sliver left
            elif u <= tol:
                u = 0.0
            if nu[-1] == u:
                pass               # same level: coalesce
            elif nt[-1] == t:
                nu[-1] = u
                if len(nu) > 1 and nu[-2] == u:
                    nt.pop()
                    nu.pop()
            else:
                nt.append(t)
                nu.append(u)
            ta = times[ia + 1] if ia + 1 < n_t else INF
            tp = points[j + 1]
            t = ta if ta < tp else tp
            if ta == t:
                ia += 1
            if tp == t:
                j += 1
        u = used[k]
        if nu[-1] != u:
            nt.append(last)
            nu.append(u)
        for q in range(k + 1, n_t):
            if used[q] == nu[-1]:
                continue
            nt.append(times[q])
            nu.append(used[q])
        return Timeline(cap, times=nt, used=nu)

    def __repr__(self):
        segs = ", ".join(f"{t:g}:{u:g}" for t, u in zip(self.times, self.used))
        return f"Timeline(cap={self.cap:g}, used=[{segs}])"


def _walk(a, b, start):
    """Segments of min(residual_a, residual_b) from ``start``: yields
    (t, t_next, rate) forever (the last with t_next = inf)."""
    ta, ua, ca = a.times, a.used, a.cap
    tb, ub, cb = b.times, b.used, b.cap
    ia = max(bisect_right(ta, start) - 1, 0)
    ib = max(bisect_right(tb, start) - 1, 0)
    na, nb, t = len(ta), len(tb), start
    floor = _tolerance(ca, cb)
    while True:
        r = min(ca - ua[ia], cb - ub[ib])
        ea = ta[ia + 1] if ia + 1 < na else INF
        eb = tb[ib + 1] if ib + 1 < nb else INF
        e = ea if ea < eb else eb
        yield t, e, (r if r > floor else 0.0)
        if e == INF:
            return
        t = e
        if ea == e:
            ia += 1
        if eb == e:
            ib += 1


def _py_finish_time(a, b, start, size):
    """t_en (Fig. 4b): when ``size`` bytes started at ``start`` are through
    links ``a`` then ``b`` using all their common residual bandwidth; inf
    when the residual is zero from some time on."""
    return _py_fill(a, b, start, size, record=False)[0]


def _py_latest_start(a, b, earliest, end, size):
    """The latest start >= ``earliest`` from which ``size`` bytes complete
    by ``end`` (filling the residual backwards from ``end``); None when
    [earliest, end] has too little capacity."""
    segs = []
    for t, e, r in _walk(a, b, earliest):
        if t >= end:
            break
        segs.append((t, min(e, end), r))
    left, dust = size, size * _TOL
    for t, e, r in reversed(segs):
        room = r * (e - t)
        if r > 0 and room >= left - dust:
            return max(e - left / r, earliest)
        left -= room
    return None


def _py_fill(a, b, start, size, record=True):
    """(t_en, points, rates): the transfer's profile on the path, the
    residual from ``start`` until its bytes are through; ``record=False``
    only finds t_en (points and rates stay empty).  C's ``walk()`` in
    linkops.c performs the same operations in the same order."""
    if size <= 0:
        return start, [start, start], []
    ta, ua, ca = a.times, a.used, a.cap
    tb, ub, cb = b.times, b.used, b.cap
    ia = bisect_right(ta, start) - 1
    ib = bisect_right(tb, start) - 1
    if ia < 0:
        ia = 0
    if ib < 0:
        ib = 0
    na, nb, t, left = len(ta), len(tb), start, size
    floor, dust = _tolerance(ca, cb), size * _TOL
    points, rates = [], []
    while True:
        ra, rb = ca - ua[ia], cb - ub[ib]
        r = ra if ra < rb else rb
        ea = ta[ia + 1] if ia + 1 < na else INF
        eb = tb[ib + 1] if ib + 1 < nb else INF
        e = ea if ea < eb else eb
        if r > floor:
            if r == INF:
                return t, [t, t], []
            if record and (not rates or rates[-1] != r):
                points.append(t)
                rates.append(r)
            room = r * (e - t)
            if room >= left - dust:
                end = t + left / r
                if end > e:
                    end = e
                if record:
                    points.append(end)
                return end, points, rates
            left -= room
        elif e == INF:
            return INF, [start, start], []
        elif record and rates and rates[-1] != 0.0:
            points.append(t)
            rates.append(0.0)
        t = e
        if ea == e:
            ia += 1
        if eb == e:
            ib += 1


if native is None:
    finish_time, _fill = _py_finish_time, _py_fill
    latest_start = _py_latest_start
else:
    finish_time, _fill = native.finish_time, native.fill
    latest_start = native.latest_start


class Transfer:
    """A reservation: ``size`` bytes from node ``src`` to node ``dst`` on
    [start, end) at the piecewise rates ``rates`` between ``points``.
    ``what`` says what it carries (the scheduler's label)."""

    __slots__ = ("src", "dst", "size", "start", "end", "points", "rates",
                 "what")

    def __init__(self, src, dst, size, start, end, points, rates, what=None):
        self.src, self.dst, self.size = src, dst, size
        self.start, self.end = start, end
        self.points, self.rates, self.what = points, rates, what

    def __repr__(self):
        return (f"Transfer({self.src}->{self.dst}, {self.size:g} B, "
                f"{self.start:g}..{self.end:g}, {self.what!r})")


class NetworkState:
    """NW of the paper's algorithms: every node's outgoing and incoming
    :class:`Timeline`.  ``fork()`` gives an independent copy that shares
    the (immutable) timelines, so the aggregation algorithm can try
    |U| + 1 cases cheaply.

    Args:
        out_rates, in_rates: {node: bytes/s} as the monitor reports them.
        now: where the timelines start.
    """

    def __init__(self, out_rates, in_rates, now=0.0):
        self.now = float(now)
        self.out = {n: Timeline(r, now) for n, r in out_rates.items()}
        self.inn = {n: Timeline(r, now) for n, r in in_rates.items()}

    @property
    def nodes(self):
        return sorted(self.out)

    def fork(self):
        """A copy; reservations on either do not show in the other."""
        v = NetworkState.__new__(NetworkState)
        v.now, v.out, v.inn = self.now, dict(self.out), dict(self.inn)
        return v

    def adopt(self, other):
        """Take ``other``'s state (a fork chosen among several)."""
        self.now, self.out, self.inn = other.now, dict(other.out), \
            dict(other.inn)

    def set_rates(self, now, out_rates, in_rates):
        """A new view of the rates (keeps reservations, forgets the past)."""
        self.now = float(now)
        for table, rates in ((self.out, out_rates), (self.inn, in_rates)):
            for n, r in rates.items():
                table[n] = table[n].trimmed(now, r) if n in table else \
                    Timeline(r, now)

    def finish(self, src, dst, start, size):
        """t_en of ``size`` bytes from ``src`` to ``dst`` started at
        ``start`` (no reservation)."""
        if src == dst:
            return start
        return finish_time(self.out[src], self.inn[dst], start, size)

    def fill(self, src, dst, start, size):
        """(t_en, points, rates) of a transfer, not reserved (see
        :meth:`commit`)."""
        if src == dst:
            return start, None, None
        return _fill(self.out[src], self.inn[dst], start, size)

    def commit(self, src, dst, points, rates, src_too=True):
        """Reserve a profile from :meth:`fill` on ``dst``'s incoming link
        and, unless ``src_too`` is false (a trial that will not use the
        source's link again), on ``src``'s outgoing link."""
        if points is None:
            return
        self.inn[dst] = self.inn[dst].added(points, rates)
        if src_too:
            self.out[src] = self.out[src].added(points, rates)

    def reserve(self, src, dst, start, size, floor=-INF, what=None):
        """NetUp: reserve the transfer and return its :class:`Transfer`.
        With ``floor``, a transfer that would complete before it starts
        late enough to complete at the floor instead."""
        start = max(start, self.now)
        if src == dst:
            end = max(start, floor)
            return Transfer(src, dst, size, end, end, [end, end], [], what)
        a, b = self.out[src], self.inn[dst]
        end, points, rates = _fill(a, b, start, size)
        if end < floor:
            late = latest_start(a, b, start, floor, size)
            if late is not None:
                start = late
                end, points, rates = _fill(a, b, start, size)
            # with no capacity just before the floor the bytes are through
            # earlier: the last one is held back to the floor
            end = max(end, floor)
        if end == INF:
            raise ScheduleError(f"no bandwidth from {src} to {dst} after "
                                f"{start:g}: cannot schedule {size:g} bytes")
        self.out[src] = a.added(points, rates)
        self.inn[dst] = b.added(points, rates)
        return Transfer(src, dst, size, start, end, points, rates, what)

    def release(self, transfer):
        """Undo a reservation (a punted replica transfer, a delayed one)."""
        if transfer.src == transfer.dst:
            return
        self.out[transfer.src] = self.out[transfer.src].added(
            transfer.points, transfer.rates, -1.0)
        self.inn[transfer.dst] = self.inn[transfer.dst].added(
            transfer.points, transfer.rates, -1.0)
