"""The blocking call of a partial allreduce in C, where it applies: the
extension ``_calls`` (``csrc/partial/calls.c``) runs the protocol of
:mod:`.rounds` (deposit, arrival, wait, take) on the object's own
buffers in one call, on the executor's C API.  A mixin of
:class:`.rounds.Rounds`: the protocol's state is there."""
import numpy as np

from ...core import devices, ops
from ...core.errors import RankFailedError, ScheduleError, WaitTimeout
from . import _calls
from .waiting import RoundsRequest

#: the bookkeeping buffers the C call takes after pending, acc and
#: identity, in its order (csrc/partial/calls.c)
CALL_META = ("acc_rounds", "snaps", "flush_total", "flag", "dep_seq",
             "acc_seq", "acc_lo", "last_active", "last_flush", "last_bypass",
             "stat_rounds", "late_total")
#: the kinds' codes there
CALL_KINDS = {"solo": 0, "majority": 1, "quorum": 2}


class Blocking:
    """The blocking-call half of :class:`.rounds.Rounds`."""

    _fast = None        # the C call of the current schedule, or None

    def _make_fast(self):
        """The blocking call in C (:mod:`._calls`, the same protocol on the
        same buffers) where it applies: host memory, and a dtype the C
        core reduces as NumPy does (float16, rounded by NumPy here, stays
        on the Python path, as do device buffers).  None: the Python
        path (:meth:`start`)."""
        dtype = np.dtype(self.dtype)
        if self.mem is not devices.HOST or \
                dtype == np.float16 or self.kind not in CALL_KINDS:
            return None
        try:
            code = ops.dtype_code(dtype)
            ops.check_op_dtype(self.op, dtype)
        except ScheduleError:
            return None
        self._late = np.zeros(self.size, np.int64)
        m = self._meta
        return _calls.Calls(
            self.sched.c_object(),
            (self._pending, self._acc, self._identity) +
            tuple(m[k] for k in CALL_META),
            self.size, self.rank, CALL_KINDS[self.kind], self.marks_bypass,
            self.seed & (2**64 - 1), self._trigger, self._bypass,
            self._base, self._pending.size, dtype.itemsize, code,
            self.op.code)

    def call(self, x):
        """The blocking call, ``start(x, blocking=True).wait()``: in C where
        it applies (:meth:`_make_fast`).  A wait there that meets a rank's
        death or outlasts ``patience`` goes on as the request's does."""
        self.check_open()
        fast = self._fast
        if fast is None or (self.sync_every and
                            (self._calls + 1) % self.sync_every == 0):
            return self.start(x, blocking=True).wait()
        self._calls += 1
        rnd = self._observed
        warn = self.patience > 0 and not self.warned_wait
        out = np.empty_like(self._acc)
        try:
            seq, nr, *nums, stat_rounds = fast.call(
                x, rnd, self._epochs, self.patience if warn else -1.0, out,
                self._late)
        except WaitTimeout:
            self.warn_waiting(rnd, self.patience)
            return RoundsRequest(self, rnd, fast.seq).wait()
        except RankFailedError as e:
            if fast.seq < 0:
                raise
            # made before the recovery, the request settles what the
            # recovery did to its round
            request = RoundsRequest(self, rnd, fast.seq)
            self.survive(e)
            return request.wait()
        late = self._late.copy() if self._watch.due(stat_rounds) else None
        return self._taken(out, seq, nr, *nums, stat_rounds, late)
