"""The synchronous round of a partial allreduce object (``flush()``,
``close()``, every ``sync_every``-th call): a mixin of
:class:`.rounds.Rounds`, whose protocol state it drives."""
import numpy as np
from mpi4py import MPI

from ...core import control
from ...core.errors import RankFailedError, ScheduleError


class Synchronous:
    """The synchronous half of :class:`.rounds.Rounds`."""

    def _synchronous_round(self, x):
        """Every rank calls this (flush, close, the sync_every-th call).

        Waiting here for a slow rank must cost that rank (nearly) nothing:
        no round is fired on a timer (each one runs the whole allreduce on
        every rank's progress thread; 163 rounds of 8 MiB ran while one rank
        computed for 1 s), and this rank waits with Test() and a sleeping
        back-off.  Yet ranks still inside a majority or quorum call may be
        waiting for this rank's arrival, and ranks still calling must not
        start waiting for it.  So:

        1. Mark and start one round: the one pending at entry, R_e (the
           mark is taken by R_e's snapshot here; the meta allreduce sums
           marks, so every rank learns R_e was flush-started).  Any call
           waiting for a round <= R_e is released: R_e starts, earlier
           rounds have already started (this rank snapshotted them).
        2. A rank that has seen a marked round complete and has not
           finished this synchronous round itself is *flushing*: its fresh
           calls start their own rounds (majority: whoever is drawn;
           quorum: through the flush arrivals that bypass the k-of-n count)
           until then, so a call after R_e never waits for a rank in here.
           Every rank marks exactly one round per synchronous round, so the
           marks seen reach P * (synchronous rounds done here) exactly when
           everyone's marked round of this one has completed.
        3. Wait until every rank is here (:meth:`_meet`).
        4. The rounds anyone may still need are those before M = max of the
           snapshot counts (>= every R_e): all start round M and wait for
           it, so every started round is finished everywhere.  Each rank
           first waits for round M - 1, so its bypass mark lands on M: M
           is always marked, whoever fires it first.
        5. Deposit x, barrier, and all start round M+1: it holds every
           rank's x and everything still pending, and nothing else.
        6. Take the result, barrier: no rank leaves (and starts a round with
           its next call) before every rank has taken its result, so a
           later round never leaks into a slower rank's synchronous result.
        """
        sync = {"seq": None, "last": None, "res": None}
        while True:
            try:
                return self._synchronous_once(x, sync)
            except RankFailedError as e:
                self.survive(e)
            # carried on over the survivors (recover): the round that held
            # everyone's x may have completed on some rank, and then came
            # here too; else the whole synchronous round again, x once
            if sync["res"] is not None:
                return sync["res"]
            if sync["last"] is not None and \
                    self._completed() >= sync["last"] + 2:
                res = self.take(sync["seq"], sync=True)
                self._deposit(None, in_sync=False)
                return res
            if sync["seq"] is not None:
                x = None

    def _synchronous_once(self, x, sync):
        """One try of :meth:`_synchronous_round`; ``sync`` records how far
        it got (x deposited as number ``seq``, the round that carries it
        ``last`` + 1, the result ``res``)."""
        ctl = self.lc.ctl
        entry = self._deposit(None, mark=True, in_sync=True)[2]
        self.fire(self._bypass, entry)
        last = self._meet(ctl)
        if last > 0:
            # the bypass mark goes to this rank's pending round: make it
            # `last` (every earlier round is snapshotted once it completed).
            # Then whoever fires `last` first has marked it; without this
            # wait a rank behind marked an earlier round, and `last`,
            # fired by another rank and snapshotted here before the mark,
            # could end up marked by no one (counted as a plain round)
            self.wait_round(last - 1)
        self._deposit(None, bypass=True)
        self.fire(self._bypass, last, wake=False)    # waited for here
        self.wait_round(last)
        seq = self._deposit(x, fresh=x is not None, bypass=True)[0]
        if sync["seq"] is None:
            sync["seq"] = seq
        control.arrive(ctl, then_settle=False)   # the last arrive settles
        sync["last"] = last
        self.fire(self._bypass, last + 1, wake=False)
        self.wait_round(last + 1)
        res = sync["res"] = self.take(sync["seq"], sync=True)
        self._epochs += 1
        self._deposit(None, in_sync=False)    # before anyone leaves
        control.arrive(ctl)
        return res

    def _meet(self, ctl):
        """Step 3 of a synchronous round: wait until every rank is in it (a
        non-blocking allreduce, MAX, of this object's id, its negation and
        the rounds this rank has started, waited for with Test() and
        sleeps; ids that differ mean ranks flush different objects: an
        error on every rank).  Returns M, the largest snapshot count: each
        rank's count is read after its step 1, so it is at least that
        rank's R_e."""
        mine = np.array([self.id, -self.id, self.started()], np.int64)
        seen = np.zeros(3, np.int64)
        control.wait_for(ctl.Iallreduce(mine, seen, op=MPI.MAX),
                         longest=0.001, comm=ctl)
        if seen[0] != -seen[1]:
            raise ScheduleError(f"flush()/close() of different objects at "
                                f"the same time on different ranks (object "
                                f"ids {-seen[1]}..{seen[0]}; this rank: "
                                f"{self.id}): flush and close in the same "
                                f"order everywhere")
        return int(seen[2])
