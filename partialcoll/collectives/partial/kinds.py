"""The three kinds of partial allreduce, by who may start a round (the
activation, see :mod:`.schedule`): solo (any caller), majority (the rank
drawn for the round) and quorum (k callers' arrivals at rank 0)."""
import numbers

from ...core.errors import ArgumentTypeError, ScheduleError
from . import _calls, schedule
from .rounds import Rounds


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

    def arrive(self, rnd, fresh, flushing, wake=True):
        # only the drawn initiator starts a round, with a call that waits for
        # it (fresh: the paper's initiator is active).  A call of the
        # initiator that finds finished rounds returns them and starts
        # nothing; its next call is fresh and starts the round, so the ranks
        # waiting for it wait one of its calls at most.  (Starting the round
        # in the catching-up call, as the original library did, runs rounds
        # ahead of the ranks that wait: NAP 6.7 instead of 16 at P = 32.)
        # While someone flushes, a fresh caller starts its own round.
        # Any other fresh caller runs its own part of the round at once
        # (its snapshot and first exchange: `start` activates no one), so
        # that once the initiator comes only the initiator's data is left
        # to cross the exchange; what each round holds is unchanged.
        if not fresh:
            return
        if flushing or designated(self.seed, rnd, self.size) == self.rank:
            self.fire(self._trigger, rnd, wake)
        else:
            self.fire(self._start, rnd, wake)

    def waits_for(self, rnd):
        return (f"rank {designated(self.seed, rnd, self.size)}, drawn to "
                f"start it")

    def activate(self, s, P, rank, tags, heard=(), book=None):
        if heard:
            # two ranks, the data is the activation: the peer's data starts
            # the round here unless this rank is the one drawn for it and
            # the peer's round is a plain one (csrc/partial/book.c,
            # partial.drawn), so a caller sends its data at once and the
            # initiator's call completes the round
            gate = s.callback(_calls.DRAWN, *book, rank, after=list(heard))
            return schedule.any_rank_activation(s, P, rank, tags, [gate])
        return schedule.any_rank_activation(s, P, rank, tags,
                                            self_start=True)


class QuorumRounds(Rounds):
    kind = "quorum"
    marks_bypass = True

    def arrive(self, rnd, fresh, flushing, wake=True):
        # only fresh data counts towards the quorum; while someone flushes,
        # a fresh caller's arrival starts the round on its own
        if fresh:
            self.fire(self._bypass if flushing else self._trigger, rnd,
                      wake)

    def waits_for(self, rnd):
        if self.quorum == 1:
            return "any rank's call"
        return f"{self.quorum} ranks' calls (arrivals counted at rank 0)"

    def check_quorum(self, quorum):
        if not isinstance(quorum, numbers.Integral) or \
                isinstance(quorum, bool):
            raise ArgumentTypeError(f"quorum must be an int between 1 and "
                                    f"the number of processes "
                                    f"({self.size}), got {quorum!r}")
        if not 1 <= quorum <= self.size:
            raise ScheduleError(f"quorum must be an int between 1 and the "
                                f"number of processes ({self.size}), got "
                                f"{quorum!r}")
        return int(quorum)

    def activate(self, s, P, rank, tags, heard=(), book=None):
        # one arrival is a quorum: any caller starts the round, as solo's
        # do, with no count at rank 0 (nor its hop)
        if self.quorum == 1:
            return schedule.any_rank_activation(s, P, rank, tags, heard)
        return schedule.quorum_activation(s, P, rank, tags, self.quorum,
                                          heard)


KINDS = {"solo": SoloRounds, "majority": MajorityRounds,
         "quorum": QuorumRounds}
