"""The link-rate monitor: what the scheduler may know about NIC rates.

The paper's monitor "periodically measures and reports available network
bandwidth to the scheduler" and its reports arrive ``t_lag`` late (0.2 s
by default, section 7).  The scheduler must never read the emulator's true
rates (``partialcoll.network.nic_rate``): that would overstate the gain.
So everything here is a measurement, visible ``lag`` seconds after it was
made:

* ``observe_transfer(t, src, dst, nbytes, seconds)``: a transfer's achieved
  rate.  It went through ``src``'s outgoing and ``dst``'s incoming NIC, so
  it is a lower bound of both NICs' rates (the slower end, or sharing,
  limited it).
* ``report(t, node, nic, rate)``: a direct report of one NIC's rate (a
  NIC's own counters; what the paper's monitor reports).

Estimate for a NIC at time ``now`` (our choice; the paper does not say how
its monitor measures): only what happened up to ``now - lag`` counts.  The
latest direct report is taken as is; transfers observed after it give the
*largest* rate among those of the last ``window`` seconds before the most
recent one (one transfer limited by its other end must not drag a fast
NIC's estimate down; a rate that fell shows once the window has passed the
faster transfers).  Before any measurement a NIC has its ``default`` rate
(the nominal rate the job was configured with).
"""
import math
from bisect import bisect_right

_KEEP = 512          # measurements kept per NIC


class LinkMonitor:
    """Lagged per-NIC rate estimates.

    Args:
        default_out, default_in: {node: bytes/s} before any measurement.
        lag: seconds before a measurement is visible (t_lag).
        window: seconds of transfer measurements combined (their max).

    Example::

        mon = LinkMonitor({0: 1e7, 1: 1e7}, {0: 1e7, 1: 1e7}, lag=0.2)
        mon.observe_transfer(1.0, 1, 0, 2e6, 0.4)     # 5 MB/s at t = 1 s
        mon.rates(1.1)     # nothing new yet: the defaults
        mon.rates(1.3)     # ({0: 1e7, 1: 5e6}, {0: 5e6, 1: 1e7})
    """

    def __init__(self, default_out, default_in, lag=0.2, window=0.5):
        if lag < 0 or window <= 0:
            raise ValueError("lag must be >= 0 and window > 0")
        self.lag, self.window = float(lag), float(window)
        self._default = {"out": dict(default_out), "in": dict(default_in)}
        self._flows = {}      # (node, nic) -> ([t], [rate]) sorted by t
        self._reports = {}    # (node, nic) -> ([t], [rate])

    def report(self, t, node, nic, rate):
        """A direct measurement of ``node``'s ``nic`` ("out"/"in") at t."""
        self._add(self._reports, (node, _nic(nic)), t, rate)

    def observe_transfer(self, t, src, dst, nbytes, seconds):
        """A transfer of ``nbytes`` from ``src`` to ``dst`` that took
        ``seconds`` and ended at ``t``."""
        if seconds <= 0 or nbytes <= 0 or src == dst:
            return
        r = nbytes / seconds
        self._add(self._flows, (src, "out"), t, r)
        self._add(self._flows, (dst, "in"), t, r)

    def _add(self, table, key, t, rate):
        if not rate > 0:
            raise ValueError(f"a rate must be > 0, got {rate!r}")
        ts, rs = table.setdefault(key, ([], []))
        i = bisect_right(ts, t)
        ts.insert(i, float(t))
        rs.insert(i, float(rate))
        if len(ts) > _KEEP:
            del ts[:len(ts) - _KEEP], rs[:len(rs) - _KEEP]

    def estimate(self, now, node, nic):
        """One NIC's rate as known at ``now``."""
        nic = _nic(nic)
        seen = now - self.lag
        rate, since = self._default[nic].get(node, math.inf), -math.inf
        ts, rs = self._reports.get((node, nic), ((), ()))
        i = bisect_right(ts, seen)
        if i:
            rate, since = rs[i - 1], ts[i - 1]
        ts, rs = self._flows.get((node, nic), ((), ()))
        j = bisect_right(ts, seen)
        if j and ts[j - 1] > since:
            last = ts[j - 1]
            lo = max(bisect_right(ts, last - self.window), 0)
            lo = max(lo, bisect_right(ts, since))
            rate = max(rs[lo:j])
        return rate

    def rates(self, now):
        """({node: out rate}, {node: in rate}) as known at ``now``."""
        nodes = set(self._default["out"]) | set(self._default["in"])
        nodes |= {n for n, _ in self._flows} | {n for n, _ in self._reports}
        return ({n: self.estimate(now, n, "out") for n in sorted(nodes)},
                {n: self.estimate(now, n, "in") for n in sorted(nodes)})


def _nic(nic):
    if nic not in ("out", "in"):
        raise ValueError(f"nic must be 'out' or 'in', got {nic!r}")
    return nic
