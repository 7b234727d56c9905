"""The blocking call of a partial allreduce in C, where it applies: the
extension ``_calls`` (``csrc/partial/calls.c``) runs the protocol of
:mod:`.rounds` (deposit, arrival, wait, take) on the object's own
buffers in one call, on the executor's C API.  A mixin of
:class:`.rounds.Rounds`: the protocol's state is there."""
import numpy as np

from ...core import devices, ops
from ...core.errors import RankFailedError, ScheduleError, WaitTimeout
from . import _calls
from .result import PartialResult
from .waiting import RoundsRequest

#: the bookkeeping buffers the C call takes after pending, acc and
#: identity, in its order (csrc/partial/calls.c)
CALL_META = ("acc_rounds", "snaps", "flush_total", "flag", "dep_seq",
             "acc_seq", "acc_lo", "last_active", "last_flush", "last_bypass",
             "stat_rounds", "late_total", "round_seq")
#: the kinds' codes there
CALL_KINDS = {"solo": 0, "majority": 1, "quorum": 2}


class Blocking:
    """The blocking-call half of :class:`.rounds.Rounds`."""

    _fast = None        # the C call of the current schedule, or None
    _quick = False      # whether quick() applies

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
        self._n = self._pending.size
        self._quick = self.as_is and self.catch_up and not self.sync_every
        m = self._meta
        return _calls.Calls(
            self.sched.c_object(),
            (self._pending, self._acc, self._identity) +
            tuple(m[k] for k in CALL_META),
            self.size, self.rank, CALL_KINDS[self.kind], self.marks_bypass,
            self.seed & (2**64 - 1), self._trigger, self._bypass,
            self._start, self._base, self._pending.size, dtype.itemsize, code,
            self.op.code, not self.op.truth_valued)

    def call(self, x):
        """The blocking call, ``start(x, blocking=True).wait()``: in C where
        it applies (:meth:`_make_fast`).  A wait there that meets a rank's
        death or outlasts ``patience`` goes on as the request's does."""
        self.check_open()
        fast = self._fast
        if fast is None or (self.sync_every and
                            (self._calls + 1) % self.sync_every == 0):
            return self.start(x, blocking=True).wait()
        got = self._in_c(fast, x)
        if type(got) is not tuple:
            return got
        out, seq, nr, acc_seq, acc_lo, active, marked, stat_rounds = got
        late = self._late.copy() if self._watch.due(stat_rounds) else None
        return self._taken(out, seq, nr, acc_seq, acc_lo, active, marked,
                           stat_rounds, late)

    def quick(self, a, out=None):
        """The whole blocking call for the common argument: ``a`` a
        C-contiguous NumPy array of the object's dtype and size, on an
        open object whose results need no conversion, that catches up and
        has no ``sync_every`` (:data:`_quick`, set with the C call, unset
        when the object is closed or its schedule freed).  What
        :meth:`take_buffer`, :meth:`call`, :meth:`_taken` and the
        handle's delivery do, less the steps that do nothing here.
        ``out``: None, or a C-contiguous, writable NumPy array of ``a``'s
        dtype and size (the caller checked) that takes the result (it may
        be ``a``: the deposit comes first).  None: not that case (the
        caller takes the general path)."""
        if not self._quick or type(a) is not np.ndarray or \
                a.dtype is not self.given or a.size != self._n or \
                not a.flags.c_contiguous:
            return None
        self._calls += 1
        rnd = self._observed
        flat = np.empty(self._n, self.dtype) if out is None else \
            out.reshape(-1)
        try:
            seq, nr, acc_seq, _, active, marked, stat_rounds = \
                self._fast.call(a if a.ndim == 1 else a.reshape(-1), rnd,
                                self._epochs, self._wait_limit, flat,
                                self._late)
        except (WaitTimeout, RankFailedError) as e:
            return self._went_on(e, rnd)
        if stat_rounds >= self._watch.next_due:
            self._watch.observe(stat_rounds, self._late.copy(), self.label)
        self._observed = observed = rnd + nr
        if out is None:
            out = flat if self._flat else flat.reshape(self.shape)
        return PartialResult(out, acc_seq >= seq, observed - 1, active, nr,
                             marked > 0)

    def _in_c(self, fast, x):
        """The C call of ``x`` (flat, of the object's dtype): the result
        array and the numbers of the take, as a tuple; or, where its wait
        met a rank's death or outlasted ``patience``, the
        :class:`PartialResult` of the request that went on."""
        self._calls += 1
        rnd = self._observed
        out = np.empty(self._n, self.dtype)
        try:
            return (out,) + fast.call(x, rnd, self._epochs, self._wait_limit,
                                      out, self._late)
        except (WaitTimeout, RankFailedError) as e:
            return self._went_on(e, rnd)

    def _went_on(self, error, rnd):
        """The C call waiting for round ``rnd`` raised ``error``: its wait
        outlasted ``patience`` (warn, and wait on) or met a rank's death
        (the survivors' recovery, where the object carries on); the
        :class:`PartialResult` of the request that goes on."""
        fast = self._fast
        if isinstance(error, WaitTimeout):
            self.warn_waiting(rnd, self.patience)
            return RoundsRequest(self, rnd, fast.seq).wait()
        if fast.seq < 0:
            raise error
        # made before the recovery, the request settles what the recovery
        # did to its round
        request = RoundsRequest(self, rnd, fast.seq)
        self.survive(error)
        return request.wait()
