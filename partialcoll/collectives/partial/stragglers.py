"""The straggler report of a partial allreduce object (Horovod's stall
inspector, for a partial collective): which ranks' data missed rounds.

The counters live in the object's schedule (:mod:`.schedule` counts them
from the meta allreduce, the same on every rank); this module reads them
and warns, once, when a few ranks are late most of the time (on the
object's rank 0 only: every rank has the same counts).
"""
import logging

import numpy as np

from ...core import logs

#: the straggler warning's logger (a benchmark that injects the lateness
#: it measures can silence it alone)
log = logging.getLogger("partialcoll.stragglers")
#: the warning looks at this many recent plain rounds
LATE_WINDOW = 100


class StragglerWatch:
    """Warns once (``partialcoll`` logger) when some ranks, not all, were
    late in most of the last :data:`LATE_WINDOW` rounds.  Fed every
    LATE_WINDOW / 4 rounds with the running per-rank late counts."""

    def __init__(self, size, rank):
        self.size, self.rank = size, rank
        self.seen = []            # (stat_rounds, late_total)
        self.warned = False
        #: :meth:`observe` wants the counts from this many rounds on
        self.next_due = 0

    def due(self, stat_rounds):
        """Whether :meth:`observe` wants the counts at ``stat_rounds``."""
        return stat_rounds >= self.next_due

    def observe(self, stat_rounds, late, label):
        """The per-rank late counts ``late`` after ``stat_rounds`` plain
        rounds of the object called ``label``."""
        seen = self.seen
        seen.append((stat_rounds, late))
        self.next_due = stat_rounds + LATE_WINDOW // 4
        while len(seen) > 1 and stat_rounds - seen[1][0] >= LATE_WINDOW:
            seen.pop(0)
        r0, late0 = seen[0]
        span = stat_rounds - r0
        if span < LATE_WINDOW:
            return
        slow = np.flatnonzero(2 * (late - late0) > span)
        if 0 < slow.size < self.size:
            self.warned = True
            self.next_due = float("inf")
            logs.once(log, self.rank, logging.WARNING,
                      "%s: rank(s) %s were late (their data missed the "
                      "round and was carried into a later one) in most of "
                      "the last %d rounds; stats()['late_share'] has every "
                      "rank's share", label,
                      ", ".join(map(str, slow.tolist())), span)


def report(meta, members, calls, skipped, before=None, failures=()):
    """The straggler report from an object's bookkeeping buffers ``meta``
    (read under its data lock), whose members are the ranks ``members`` of
    the user's communicator: see
    :meth:`~partialcoll.collectives.partial.PartialAllreduce.stats`.
    ``before``: the counts of the rounds before ranks died (``rounds``,
    and ``late`` and ``lag`` by rank), ``failures``: who died when."""
    before = before or {"rounds": 0, "late": {}, "lag": {}}
    late, lag = dict(before["late"]), dict(before["lag"])
    for i, g in enumerate(members):
        late[g] = late.get(g, 0) + int(meta["late_total"][i])
        lag[g] = lag.get(g, 0) + int(meta["lag_total"][i])
    n = int(meta["stat_rounds"][0]) + before["rounds"]
    ranks = range(max(late) + 1)
    share = np.array([late.get(g, 0) / n if n else 0.0 for g in ranks])
    mean_lag = [lag.get(g, 0) / n if n else 0.0 for g in ranks]
    return {"rounds": n, "calls": calls,
            "late_share": [round(float(v), 4) for v in share],
            "mean_lag": [round(float(v), 3) for v in mean_lag],
            "slowest": int(np.argmax(share)) if n else None,
            "skipped": skipped, "failures": [dict(f) for f in failures]}
