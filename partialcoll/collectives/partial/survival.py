"""What a partial allreduce object does when a rank of its communicator
dies under MPI's fault-tolerance extensions (:mod:`partialcoll.core.failures`):
raise, or carry on over the survivors with every survivor's contributions
delivered exactly once (:meth:`Survival.recover`).  A mixin of
:class:`.rounds.Rounds`: the protocol's state is there."""
import logging

import numpy as np

from ...core import control, devices
from ...core.errors import RankFailedError, ScheduleError
from . import schedule, stragglers

log = logging.getLogger("partialcoll")


class Survival:
    """The recovery half of :class:`.rounds.Rounds`."""

    def survive(self, error):
        """A call met ``error`` (:class:`~partialcoll.RankFailedError`):
        raise it unless this object carries on (``on_failure="continue"``,
        host memory), else go on over the survivors: shrink the library
        communicator, which recovers every open object on it
        (:func:`_shrunk`, collective over the survivors)."""
        if self.on_failure != "continue" or self.mem is not devices.HOST \
                or self.closed:
            raise error
        log.debug("%s: rank %d carries on after: %s", self.label, self.rank,
                  error)
        generation = self.generation
        self.lc.shrink()
        if self.generation == generation:
            raise error         # not recovered

    _failed = None      # the error of an object that could not carry on

    def _completed(self):
        """Rounds completed here so far (taken or waiting to be)."""
        return self._observed + int(self._meta["acc_rounds"][0])

    def finished_waiting(self):
        """Whether completed rounds wait to be taken."""
        return int(self._meta["acc_rounds"][0]) > 0

    def rearrive(self):
        """A call whose round ended with a death arrives again (its deposit
        is pending): returns the round it waits for now."""
        _, _, rnd, _, flushing = self._deposit(None, fresh=True)
        self.arrive(rnd, True, flushing)
        return rnd

    def recover(self, dead, survivors):
        """Collective over the survivors, in creation order on each (the
        ``on_shrink`` hook): rebuild this object over them, so that every
        survivor's contribution is delivered exactly once.

        At the death, on each survivor, round c (its completed rounds so
        far, taken or not) is done and round c + 1 is in flight or not
        started: its snapshot in ``send``, later deposits in ``pending``.
        Completed counts differ by at most one (a round completes only
        with every rank's snapshot, so nobody completes c + 2 while a rank
        has not completed c + 1).  The survivors gather them: hi and lo.

        * hi > lo: some survivors completed hi rounds, others hi - 1; the
          last of those rounds holds every rank's snapshot of it, the dead
          rank's too.  The first
          such rank sends it (``last``, a copy each round keeps where the
          extensions are in use) to the others, which accumulate it as
          that round: their snapshot of it is delivered.
        * every snapshot of a round that did not complete (hi + 1) goes
          back into ``pending``, to the next round.
        * the dead rank's deposits after its snapshot of round hi are lost:
          ``stats()["failures"]`` says so.

        Then the schedule is rebuilt over the survivors, counting rounds
        from hi: everyone has completed exactly hi rounds.  Quorum's k
        becomes min(k, survivors)."""
        self._quick = False      # its C call goes with the schedule
        self.sched.free()        # no op of it runs any more
        if self.on_failure != "continue" or self.mem is not devices.HOST:
            self._failed = RankFailedError(
                f"{self.label}: rank(s) {', '.join(map(str, dead))} died "
                f"and this object does not carry on (on_failure="
                f"{self.on_failure!r})", tuple(dead))
            return
        m, ctl = self._meta, self.lc.ctl
        done, snaps = self._completed(), int(m["snaps"][0])
        counts = np.zeros(self.lc.size, np.int64)
        control.wait_for(ctl.Iallgather(np.array([done], np.int64), counts),
                         longest=0.001, comm=ctl)
        hi, lo = int(counts.max()), int(counts.min())
        log.debug("%s: rank %d completed %d rounds (survivors: %d to %d), "
                  "snapshotted %d", self.label, self.rank, done, lo, hi,
                  snaps)
        if hi - lo > 1:
            raise ScheduleError(f"{self.label}: survivors completed {lo} to "
                                f"{hi} rounds: cannot carry on")
        if hi > lo:
            root = int(np.argmax(counts))
            last = self._last if done == hi else \
                self.mem.empty(self._acc.size, self.dtype)
            nums = np.array([m["last_active"][0], m["last_flush"][0],
                             m["last_bypass"][0]], np.int64)
            control.wait_for(ctl.Ibcast(last.view(np.uint8), root=root),
                             longest=0.001, comm=ctl)
            control.wait_for(ctl.Ibcast(nums, root=root), longest=0.001,
                             comm=ctl)
            if done == lo:       # accumulate round hi as the schedule would
                self._accumulate(last, nums)
                done = hi
        if snaps > done:         # back to pending, for the next round
            self.combine(self._pending, self._send, out=self._pending)
            m["round_seq"][0] = m["prev_seq"][0]
        self._regroup(dead, survivors, hi)

    def _accumulate(self, result, nums):
        m = self._meta
        if self._skipped is None:
            self.combine(self._acc, result, out=self._acc)
        else:
            self.combine(self._skipped, self._acc, out=self._skipped)
            self._acc[...] = result
        m["acc_rounds"][0] += 1
        m["acc_seq"][0] = m["round_seq"][0]
        m["acc_lo"][0] = m["prev_seq"][0]
        m["last_active"][0], m["last_flush"][0], m["last_bypass"][0] = nums

    def _regroup(self, dead, survivors, hi):
        """The bookkeeping and schedule over the survivors, from round hi."""
        old, P = self._meta, self.lc.size
        ranks = self._members
        before = self._before or {"rounds": 0, "late": {}, "lag": {}}
        n = int(old["stat_rounds"][0])
        for i, g in enumerate(ranks):
            for k, key in (("late", "late_total"), ("lag", "lag_total")):
                before[k][g] = before[k].get(g, 0) + int(old[key][i])
        before["rounds"] += n
        self._before = before
        for d in dead:
            self.failures.append({"rank": ranks[d], "rounds": hi})
        self._members = list(self.lc.members)
        self.size, self.rank = P, self.lc.rank
        if self.quorum is not None:
            self.quorum = min(self.quorum, P)
        m = self._meta = schedule.meta_buffers(P, self.rank, self.seed)
        for k in ("dep_seq", "round_seq", "acc_seq", "acc_rounds", "acc_lo",
                  "prev_seq", "last_active", "last_flush", "last_bypass"):
            m[k][0] = old[k][0]
        m["snaps"][0] = hi
        self._late_slot = 3 + self.rank
        if m["dep_seq"][0] > m["round_seq"][0]:    # fresh data is pending
            m["flag"][0], m["flag"][self._late_slot] = 1, 0
        self._epochs = 0              # flush_total is 0 again too
        self._watch = stragglers.StragglerWatch(P, self.rank)
        self._base = hi
        self._make_schedule()
        self.generation += 1
        self.sched.post()
        if self.rank == 0:
            log.warning("%s: rank(s) %s died; %d survivors carry on from "
                        "round %d", self.label,
                        ", ".join(str(ranks[d]) for d in dead), P, hi)
