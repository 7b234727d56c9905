"""The link-rate monitor: what the scheduler may know about NIC rates.

The paper's monitor "periodically measures and reports available network
bandwidth to the scheduler" and its reports arrive ``t_lag`` late (0.2 s
by default, section 7).  The scheduler must never read the emulator's true
rates (``partialcoll.network.nic_rate``): that would overstate the gain.
So everything here is a measurement, visible ``lag`` seconds after it was
made:

* ``observe_transfer(t, src, dst, nbytes, seconds)``: a transfer (a
  *flow*) that ended at ``t``, through ``src``'s outgoing and ``dst``'s
  incoming NIC.
* ``report(t, node, nic, rate)``: a direct report of one NIC's rate (a
  NIC's own counters; what the paper's monitor reports).

How flows become estimates (our choice; the paper does not say how its
monitor measures).  The network shares every NIC max-min fairly, so a flow
moves at the rate of its *bottleneck*, one of its two NICs, where the NIC
is saturated and no flow through it moves faster.  A flow's rate alone
does not say which end that was: a 2 MB/s push into a 20 MB/s server may
come from a 2 MB/s worker.  So each NIC holds an estimate that changes
only on evidence, flows taken in the order they ended:

1. *Load*, a lower bound: the bytes of the flows through a NIC that
   overlap a flow ``f`` (``f`` included), over the length of the union of
   their intervals.  At no instant can a NIC carry more than its rate, so
   this never exceeds it, and concurrent flows add up (two 10 MB/s pushes
   at once show a 20 MB/s NIC).  An estimate below a NIC's load is raised
   to it.
2. *Consistent*: ``f``'s *use* of a NIC is the sum, over the flows through
   it, of each one's mean rate times the share of ``f``'s interval it
   overlapped.  If one end's use is within ``slack`` of its estimate, that
   end was saturated and may have been the bottleneck: nothing is lowered.
3. *Contradiction*: both ends had room, so one of them is slower than its
   estimate.  An end cannot be ``f``'s bottleneck if another flow through
   it at the same time moved more than ``1 + slack`` times faster (max-min
   fairness gives the bottlenecked flow the largest share there).  If both
   ends are left, the one whose largest use in the last ``window`` seconds
   before ``f`` ended lies further below its estimate is taken (a server
   that just carried 20 MB/s is not the slow end of a 2 MB/s push; a
   worker whose recent flows all crawled is); with no evidence either way
   (equal, or both ends ruled out), both are.  What is taken is lowered
   to its use.

The load is sound but weak when a long flow overlaps a short one (it
averages over the long one's life), so it only raises; the use can exceed
the true rate (a flow's rate is not constant over its life), so it only
decides and sets a lowered estimate, where erring high is the cautious
side.  So a slow worker never drags the server's estimate down, and a NIC
does not forget its rate because its recent flows were limited elsewhere;
a rate that fell shows at the first flow that contradicts it.

A direct report sets a NIC's estimate.  Before any measurement a NIC has
its ``default`` rate (the nominal rate the job was configured with).  The
estimates follow the measurements visible at the latest ``now`` asked
about: ask at non-decreasing times (an earlier ``now`` gets the latest
estimates).
"""
import logging
import math
from bisect import bisect_left, bisect_right, insort
from ...core.errors import ScheduleError

log = logging.getLogger(__name__)

_KEEP = 512          # flows kept per NIC (to find those a new one overlaps)


class LinkMonitor:
    """Lagged per-NIC rate estimates.

    Args:
        default_out, default_in: {node: bytes/s} before any measurement.
        lag: seconds before a measurement is visible (t_lag).
        window: seconds of a NIC's recent use that decide which end of a
            contradicting flow is lowered (step 3).
        slack: relative tolerance of the saturation and fairness tests
            (measured rates are means over a flow's life).

    Example::

        mon = LinkMonitor({0: 1e7, 1: 1e7}, {0: 1e7, 1: 1e7}, lag=0.2)
        mon.observe_transfer(1.0, 1, 0, 2e6, 0.4)     # 5 MB/s at t = 1 s
        mon.rates(1.1)     # nothing new yet: the defaults
        mon.rates(1.3)     # ({0: 1e7, 1: 5e6}, {0: 5e6, 1: 1e7})
    """

    def __init__(self, default_out, default_in, lag=0.2, window=0.5,
                 slack=0.15):
        if lag < 0 or window <= 0 or not 0 <= slack < 1:
            raise ScheduleError("lag must be >= 0, window > 0 and "
                                "0 <= slack < 1")
        self.lag, self.window, self.slack = float(lag), float(window), \
            float(slack)
        self._est = {}        # (node, nic) -> bytes/s
        for nic, rates in (("out", default_out), ("in", default_in)):
            for node, rate in rates.items():
                self._est[(node, nic)] = float(rate)
        self._pending = []    # [(t, kind, data)] not yet visible
        self._flows = {}      # (node, nic) -> [(end, start, nbytes)]
        self._used = {}       # (node, nic) -> [(end, use)] of taken flows

    def report(self, t, node, nic, rate):
        """A direct measurement of ``node``'s ``nic`` ("out"/"in") at t."""
        if not rate > 0:
            raise ScheduleError(f"a rate must be > 0, got {rate!r}")
        self._pending.append((float(t), 0, ((node, _nic(nic)), float(rate))))

    def observe_transfer(self, t, src, dst, nbytes, seconds):
        """A transfer of ``nbytes`` from ``src`` to ``dst`` that took
        ``seconds`` and ended at ``t``."""
        if seconds <= 0 or nbytes <= 0 or src == dst:
            return
        self._pending.append((float(t), 1, (src, dst, float(nbytes),
                                            float(seconds))))

    def estimate(self, now, node, nic):
        """One NIC's rate as known at ``now``."""
        self._catch_up(now - self.lag)
        return self._est.get((node, _nic(nic)), math.inf)

    def rates(self, now):
        """({node: out rate}, {node: in rate}) as known at ``now``."""
        self._catch_up(now - self.lag)
        nodes = sorted({node for node, _ in self._est})
        return ({n: self._est.get((n, "out"), math.inf) for n in nodes},
                {n: self._est.get((n, "in"), math.inf) for n in nodes})

    def _catch_up(self, seen):
        """Apply the measurements made up to ``seen``, in time order."""
        visible = [m for m in self._pending if m[0] <= seen]
        if not visible:
            return
        self._pending = [m for m in self._pending if m[0] > seen]
        visible.sort(key=lambda m: (m[0], m[1]))
        for t, kind, data in visible:        # every flow first: overlaps
            if kind == 1:
                src, dst, nbytes, seconds = data
                for key in ((src, "out"), (dst, "in")):
                    _keep(self._flows.setdefault(key, []),
                          (t, t - seconds, nbytes))
        for t, kind, data in visible:
            if kind == 0:
                key, rate = data
                self._est[key] = rate
            else:
                self._flow(t, *data)

    def _flow(self, t, src, dst, nbytes, seconds):
        """Steps 1-3 of the module docstring for one flow."""
        start, rate = t - seconds, nbytes / seconds
        ends = ((src, "out"), (dst, "in"))
        use, faster, recent = {}, {}, {}
        for key in ends:
            load, use[key], faster[key] = self._load(key, start, t, rate)
            recent[key] = self._recent(key, t) / self._est.get(key, math.inf)
            _keep(self._used.setdefault(key, []), (t, use[key]))
            if not load <= self._est.get(key, math.inf):
                self._est[key] = load
        est = {k: self._est.get(k, math.inf) for k in ends}
        if any(use[k] >= (1 - self.slack) * est[k] for k in ends):
            return
        taken = [k for k in ends if not faster[k]] or list(ends)
        if len(taken) == 2 and recent[ends[0]] != recent[ends[1]]:
            taken = [min(ends, key=recent.get)]
        for key in taken:
            log.debug("t=%.3f flow %s->%s at %.3g B/s: %s lowered from "
                      "%.3g to %.3g", t, src, dst, rate, key,
                      est[key], use[key])
            self._est[key] = use[key]

    def _load(self, key, start, end, rate):
        """NIC ``key`` over a flow's interval [start, end] at ``rate``:
        (its load, its use, whether an overlapping flow moved more than
        ``1 + slack`` times faster); steps 1-3 of the module docstring."""
        flows = self._flows.get(key, ())
        spans, nbytes, use, faster = [], 0.0, 0.0, False
        first = bisect_right(flows, (start, math.inf))  # ends after start
        for f_end, f_start, f_bytes in flows[first:]:
            if f_start >= end:
                continue
            spans.append((f_start, f_end))
            nbytes += f_bytes
            f_rate = f_bytes / (f_end - f_start)
            use += f_rate * (min(f_end, end) - max(f_start, start))
            # (the flow itself is never more than 1 + slack times faster)
            faster = faster or f_rate > (1 + self.slack) * rate
        use /= end - start
        return max(rate, nbytes / _union(spans)), max(use, rate), faster

    def _recent(self, key, t):
        """The largest use of NIC ``key`` by flows that ended in
        [t - window, t) (0 if none)."""
        used = self._used.get(key, ())
        lo = bisect_left(used, (t - self.window,))
        hi = bisect_left(used, (t,))
        return max((u for _, u in used[lo:hi]), default=0.0)


def _keep(items, item):
    """Insert ``item`` in the sorted list ``items``; keep the last _KEEP."""
    insort(items, item)
    if len(items) > _KEEP:
        del items[0]


def _union(spans):
    """Total length of the union of intervals."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _nic(nic):
    if nic not in ("out", "in"):
        raise ScheduleError(f"nic must be 'out' or 'in', got {nic!r}")
    return nic
