"""The request of a partial allreduce call that waits for its round."""
from ...core.errors import RankFailedError, WaitTimeout
from ...core.request import Request


class RoundsRequest(Request):
    """The request of a call that waits for round ``rnd``."""

    def __init__(self, rounds, rnd, seq):
        self._rounds, self._round, self._seq = rounds, rnd, seq
        self._gen = rounds.generation
        self._res = None

    _gen = 0    # the object's recoveries when the round was last settled

    def test(self):
        """True when the round completed (``wait()`` then returns at once).
        Where a rank died and the object carries on, this joins the
        survivors' recovery first (collective, see :meth:`Rounds.recover`).
        """
        r = self._rounds
        while self._res is None:
            if self._gen != r.generation:
                self._settle()
            if self._round is None:
                return True
            try:
                return r.test_round(self._round)
            except RankFailedError as e:
                r.survive(e)
        return True

    def wait(self, timeout=None):
        """Wait for the round and return the :class:`PartialResult`.  A
        wait with no timeout that lasts ``PARTIALCOLL_WAIT_WARN_S`` seconds
        (10) logs, once per object, what the round waits for."""
        r = self._rounds
        while self._res is None:
            if self._gen != r.generation:
                self._settle()
            if self._round is not None:
                try:
                    self._wait(timeout)
                except RankFailedError as e:
                    r.survive(e)
                    continue
            self._res = r.take(self._seq)
        return self._res

    def _wait(self, timeout):
        r, rnd = self._rounds, self._round
        if timeout is None and r.patience > 0 and not r.warned_wait:
            try:
                r.wait_round(rnd, timeout=r.patience)
            except WaitTimeout:
                r.warn_waiting(rnd, r.patience)
                r.wait_round(rnd)
        else:
            r.wait_round(rnd, timeout=timeout)

    def _settle(self):
        """After the object carried on over the survivors: the round this
        call waits for may have completed here in the recovery (None: take
        it), else the call's deposit is pending again, and it arrives for
        the next round as a fresh call."""
        r = self._rounds
        self._gen = r.generation
        if r.finished_waiting():
            self._round = None
        else:
            self._round = r.rearrive()
