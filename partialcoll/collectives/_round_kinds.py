"""The three kinds of partial allreduce, by who may start a round (the
activation, see :mod:`._rounds`): solo (any caller), majority (the rank
drawn for the round) and quorum (k callers' arrivals at rank 0)."""
import numbers

from ..core.errors import ScheduleError
from ._rounds import Rounds


def designated(seed, rnd, size):
    """Majority's initiator of round `rnd`: splitmix64 of (seed, round)."""
    z = (seed * 0x9E3779B97F4A7C15 + rnd + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % size


class SoloRounds(Rounds):
    kind = "solo"


class MajorityRounds(Rounds):
    kind = "majority"

    marks_bypass = True

    def _arrive(self, rnd, fresh, flushing):
        # only the drawn initiator starts a round, with a call that waits for
        # it (fresh: the paper's initiator is active).  A call of the
        # initiator that finds finished rounds returns them and starts
        # nothing; its next call is fresh and starts the round, so the ranks
        # waiting for it wait one of its calls at most.  (Starting the round
        # in the catching-up call, as the original library did, runs rounds
        # ahead of the ranks that wait: NAP 6.7 instead of 16 at P = 32.)
        # While someone flushes, a fresh caller starts its own round.
        if fresh and (flushing or
                      designated(self.seed, rnd, self.size) == self.rank):
            self._sched.fire(self._trigger, round=rnd)


class QuorumRounds(Rounds):
    kind = "quorum"
    marks_bypass = True

    def _arrive(self, rnd, fresh, flushing):
        # only fresh data counts towards the quorum; while someone flushes,
        # a fresh caller's arrival starts the round on its own
        if fresh:
            self._sched.fire(self._bypass if flushing else self._trigger,
                             round=rnd)

    def _check_quorum(self, quorum):
        if not isinstance(quorum, numbers.Integral) or \
                isinstance(quorum, bool) or not 1 <= quorum <= self.size:
            raise ScheduleError(f"quorum must be an int between 1 and the "
                                f"number of processes ({self.size}), got "
                                f"{quorum!r}")
        return int(quorum)

    def _build_activation(self, s, tags):
        """Arrivals go to rank 0; its activation needs `quorum` of them and
        is broadcast on the same circulant trees as solo's.  A second
        trigger (the bypass: synchronous rounds, flush-started rounds and
        callers while someone flushes) sends a flush arrival instead, and
        any one flush arrival activates on its own::

            rank 0:  count = k of (T, arrivals 1..P-1)        (optional)
                     act   = ANY(count, bypass, flush arrivals 1..P-1)
        """
        P, rank, tag0 = self.size, self.rank, tags["activation"]
        self._trigger = s.trigger(optional=True)
        self._bypass = s.trigger(optional=True)
        dims = [j for j in range(P.bit_length()) if (1 << j) < P]
        arrive_tag, flush_tag = tags["arrive"], tags["flush_arrive"]
        if rank == 0:
            arrivals = [s.recv(peer=p, tag=arrive_tag, stamped=True,
                               optional=True) for p in range(1, P)]
            flushes = [s.recv(peer=p, tag=flush_tag, stamped=True,
                              optional=True) for p in range(1, P)]
            count = s.nop(after=[self._trigger] + arrivals, need=self.quorum,
                          optional=True)
            act = s.nop(after=[count, self._bypass] + flushes, mode=1)
            for j in dims:
                s.send(peer=1 << j, tag=tag0 + j, stamped=True, optional=True,
                       after=[act])
            return act
        s.send(peer=0, tag=arrive_tag, stamped=True, optional=True,
               after=[self._trigger])
        s.send(peer=0, tag=flush_tag, stamped=True, optional=True,
               after=[self._bypass])
        recvs = [s.recv(peer=(rank - (1 << j)) % P, tag=tag0 + j, stamped=True,
                        optional=True) for j in dims]
        for j in dims[1:]:
            s.send(peer=(rank + (1 << j)) % P, tag=tag0 + j, stamped=True,
                   optional=True, after=recvs[:j], mode=1)
        return s.nop(after=recvs, mode=1)


KINDS = {"solo": SoloRounds, "majority": MajorityRounds,
         "quorum": QuorumRounds}
