"""The state and protocol of a partial allreduce (solo, majority, quorum):
what a call, a flush and a close do with the object's persistent schedule
(:mod:`.schedule` draws it; :mod:`.kinds` says who may start a round).

A call deposits into `pending` under the data lock; the snapshot count read
in the same hold is R, the round that will carry the deposit.  The deposit
is fresh when the call will wait for R itself (no round running, none
waiting to be seen); else it is carried into R as stale data.  The call's
arrival counts for round R only when it is fresh (solo: it starts R;
majority: it starts R when this rank is R's drawn initiator, so the
initiator is always active, as in the paper; quorum: one of the k arrivals
R needs).  If finished rounds are waiting it returns them at once, else it
waits for the next round and takes `acc` under the lock.  So each
contribution is in exactly one round, results are never overwritten while
read (they are copied out under the lock), and a rank that missed rounds
gets them all combined.  The synchronous round (flush, close) is in
:mod:`.synchronous`, what a rank's death does in :mod:`.survival`, the
request a waiting call holds in :mod:`.waiting`, the blocking call in C
in :mod:`.blocking`.

Lifetime.  The user holds a handle
(:class:`~partialcoll.collectives.partial.handles.PartialAllreduce`); the
state here lives in a registry of open objects until a collective close
(``close()``, ``close_partials``, or the exit handler, in creation order on
every rank).  A handle dropped without ``close()`` leaves its state open, so
the other ranks, still calling, are not left waiting for a schedule that
vanished on one rank; it is logged once under the ``partialcoll`` logger.
"""
import logging
import secrets
import warnings

import numpy as np
from mpi4py import MPI

from ...core import arrays, control, devices, env, failures, libcomm, logs
from ...core.errors import (PartialcollError, RankFailedError,
                            ScheduleError, StallWarning)
from ...core.request import Done
from . import schedule, stragglers
from .blocking import Blocking
from .result import PartialResult
from .survival import Survival
from .synchronous import Synchronous
from .waiting import RoundsRequest

log = logging.getLogger("partialcoll")


def refused(name):
    """The start of the message of an argument error at creation."""
    return f"{name} not created"


def refuse(comm, name, problem):
    """Collective over ``comm``, for a rank that found ``problem`` (an
    exception) in its arguments before it could make its :class:`Rounds`:
    joins the agreement the other ranks' objects run at creation, so
    every rank raises the same error, of ``problem``'s kind and naming
    this rank, instead of an error here and a hang there.  Never
    returns."""
    lc = libcomm.library_comm(comm, survivors=True)
    lc.before_collective()
    control.gather_checked(lc.ctl, refused(name), None, problem)
    raise AssertionError("unreachable: the agreement raised")


class Rounds(Synchronous, Survival, Blocking):
    """One partial allreduce's schedule, buffers and protocol (see the
    module docstring).  ``args`` is the handle's checked arguments: kind,
    shape, dtype, op, comm, catch_up, sync_every, quorum, seed, memory
    backend and device.  Creating it is collective over ``comm``.

    Attributes the package uses: ``lc`` (the library communicator),
    ``sched`` (the schedule), ``combine`` (the op's ufunc on the object's
    memory), ``label``, ``closed``."""

    kind: str | None = None
    marks_bypass = False    # flag rounds a flushing caller starts as sync
    _created = 0            # creation order, equal on all ranks

    def __init__(self, n, args, algorithm):
        for k, v in args.items():
            setattr(self, k, v)
        # reduced and delivered in the caller's dtype (no conversion), and
        # flat: what the common call need not do
        self.as_is = self.given is not arrays.BFLOAT16 and \
            self.given == self.dtype
        self._flat = len(self.shape) == 1
        lc = libcomm.library_comm(self.comm, survivors=True)
        self.size, self.rank = lc.size, lc.rank
        try:
            self.quorum, problem = self.check_quorum(self.quorum), None
        except (PartialcollError, TypeError, ValueError) as e:
            problem = e
        lc.before_collective()
        self._check_consistent(lc, algorithm, problem)
        # one executor communicator shared by every object on comm: this
        # object's messages are told apart by its own block of tags
        self._ntags = schedule.tag_block_size(self.size)
        self._tag0 = lc.tags.block(self._ntags)
        self.lc = lc.acquire()
        self._algorithm = algorithm
        self._base = 0          # the schedule's round 0 (see recover)
        self.generation = 0     # recoveries so far
        self.failures = []      # the ranks that died, see stats()
        self._members = list(lc.members)   # ranks of the user's comm
        self._before = None     # the straggler counts before a recovery
        try:
            self._alloc(n)
            self._make_schedule()
        except BaseException:
            self._release()
            raise
        lc.created += 1
        self.id = lc.created              # the same on every rank
        self.label = f"{self.name} #{self.id}"
        self._watch = stragglers.StragglerWatch(self.size, self.rank)
        self._observed = 0                # rounds taken by this rank
        self._calls = 0
        self._epochs = 0                  # synchronous rounds done here
        # seconds a call waits before it says what its round waits for
        self.patience = env.get(env.WAIT_WARN_S, 10.0, float)
        # the C call's wait limit: patience until a long wait was logged
        self._wait_limit = self.patience if self.patience > 0 else -1.0
        self.closed, self._at_close = False, None
        self.orphaned = False             # its handle was dropped
        Rounds._created += 1
        self.order = Rounds._created
        _OPEN[self.order] = self
        self.sched.post()

    # -- construction ---------------------------------------------------
    def check_quorum(self, quorum):
        """The kind's quorum, checked (None: the kind has none)."""
        return None

    def activate(self, s, P, rank, tags, heard=(), book=None):
        """Build the kind's activation into ``s`` (see :mod:`.schedule`);
        ``book``: with ``heard``, the slots of the bookkeeping and of the
        flags the peer's data carries, where a kind's gate reads them."""
        return schedule.any_rank_activation(s, P, rank, tags, heard)

    def _check_consistent(self, lc, algorithm, problem=None):
        """Collective: the same error on every rank when a rank found a
        ``problem`` in its arguments (of its kind, see :func:`refuse`) or
        the ranks' arguments differ."""
        mine = None if problem is not None else {
            "collective": self.kind, "shape": tuple(self.shape),
            "memory": self.mem.name,
            "dtype": str(self.given), "op": self.op.name,
            "quorum": self.quorum, "seed": self.seed,
            "catch_up": self.catch_up, "sync_every": self.sync_every,
            "algorithm": algorithm, "priority": self.priority,
            "compression": self.compression, "on_failure": self.on_failure}
        everyone = control.gather_checked(lc.ctl, refused(self.name), mine,
                                          problem)
        bad = [k for k in mine if any(d[k] != mine[k] for d in everyone)]
        if bad:
            detail = "; ".join(control.per_rank(everyone, k) for k in bad)
            raise ScheduleError(f"{self.name} created with different "
                                f"arguments on different ranks ({detail})")

    def _alloc(self, n):
        ident, mem = self.op.identity(self.dtype), self.mem
        self._pending = mem.full(n, ident, self.dtype)
        # host memory: one element, which resets fill from (schedule.py)
        self._identity = mem.full(1 if mem is devices.HOST else n, ident,
                                  self.dtype)
        self._acc = mem.full(n, ident, self.dtype)
        # latest-only: the rounds passed over, returned by a synchronous one
        self._skipped = None if self.catch_up else \
            mem.full(n, ident, self.dtype)
        self._nskipped = 0
        self.combine = self.op.ufunc(mem.xp)
        # kept only where a survivor may need them (see recover): the last
        # result, and the round's snapshot apart from its exchange (else
        # the snapshot goes straight into the exchange's buffers)
        self._last = self._send = None
        if failures.extensions_in_use():
            self._last = mem.empty(n, self.dtype)
            self._send = mem.empty(n, self.dtype)
        self._meta = schedule.meta_buffers(self.size, self.rank, self.seed)
        self._late_slot = 3 + self.rank

    def _make_schedule(self):
        mem = self.mem
        # the ranks met in _check_consistent, yet meeting again here before
        # the bcast measured faster at 5 ranks on 2 cores (median 14.0 s
        # against 16.5 s for test_eager_ddp + test_forms)
        control.arrive(self.lc.ctl, then_settle=False)
        stamp_id = self.lc.ctl.bcast(secrets.randbits(63)
                                     if self.rank == 0 else None)
        control.settle()
        self.sched, act = schedule.build(schedule.RoundSpec(
            comm=self.lc.comm, size=self.size, rank=self.rank, op=self.op,
            dtype=self.dtype, mem=mem, pending=self._pending,
            identity=self._identity, acc=self._acc, skipped=self._skipped,
            send=self._send, last=self._last, meta=self._meta,
            algorithm=self._algorithm, priority=self.priority,
            stamp_id=stamp_id, tag0=self._tag0, activate=self.activate))
        self._trigger, self._bypass = act.trigger, act.bypass
        self._start = act.start
        self._quick = False
        self._fast = self._make_fast()

    # -- calls ----------------------------------------------------------
    def take_buffer(self, sendbuf, what="sendbuf"):
        """``sendbuf`` (any array or tensor, see
        :mod:`partialcoll.core.arrays`) as :meth:`accept` returns it, after
        checking that it lives where this object's buffers live."""
        self.check_open()
        if type(sendbuf) is np.ndarray and self.mem is devices.HOST and \
                sendbuf.flags.c_contiguous and \
                sendbuf.size == self._pending.size and \
                (sendbuf.dtype is self.given or sendbuf.dtype == self.given):
            # the common case, a plain host array of the object's dtype and
            # size: what the general path below gives it, without its checks
            x = sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
            return (x if self.as_is else
                    arrays.reduced_as(x, self.given, self.dtype), arrays.ARRAY)
        data = arrays.ingest(sendbuf, what)
        x = devices.flat_in_place(data.array, self.mem, self.device, what,
                                  self.name)
        return self.accept(data, x, what)

    def accept(self, data, x, what="sendbuf"):
        """A contribution: ``data`` (:class:`~partialcoll.core.arrays.Data`)
        whose flat view on this object's memory is ``x``, checked against
        the object's dtype and size (raises if closed).  Returns ``x`` as
        the dtype the object reduces in (16-bit floats widened to float32;
        rounded to float16 under compression) and the
        :class:`~partialcoll.core.arrays.ArrayKind` of the caller's
        results."""
        self.check_open()
        if (data.dtype is not self.given and data.dtype != self.given) or \
                x.size != self._pending.size:
            raise ScheduleError(f"{what} is {data.dtype}[{x.size}], this "
                                f"{self.name} takes {self.given}"
                                f"{list(self.shape)}")
        return arrays.reduced_as(x, self.given, self.dtype), data.kind

    def start(self, x, blocking=False):
        """Contribute ``x`` (a flat array on the object's memory); returns a
        request whose ``wait()`` gives a :class:`PartialResult`.
        ``blocking``: the caller waits at once, and runs the round it
        starts on its own thread (the progress thread is not woken)."""
        self.check_open()
        self._calls += 1
        if self.sync_every and self._calls % self.sync_every == 0:
            return Done(self._synchronous_round(x))
        seq, waiting, rnd, fresh, flushing = self._deposit(x)
        self.arrive(rnd, fresh, flushing, wake=not blocking)
        if waiting:                       # finished rounds not yet observed
            return Done(self.take(seq))
        return RoundsRequest(self, self._observed, seq)

    def _deposit(self, x, fresh=None, mark=False, in_sync=None,
                 bypass=False):
        """Add x to the pending data.  Returns (deposit number, finished
        rounds waiting to be observed, the round R that will take x, fresh,
        flushing).

        The deposit is *fresh* (counted in ``active``, the paper's NAP) when
        this call will wait for round R itself: nothing is left to collect
        and no round is running.  Otherwise the call returns an earlier
        round and x is carried into R as stale data, as eager-SGD does.
        *flushing*: some rank is in a synchronous round this rank has not
        finished (see :meth:`_synchronous_round`).  ``mark``: flag round R
        as flush-started (in the same hold as reading R).  ``in_sync``:
        this rank enters (True) or leaves (False) a synchronous round; while
        inside, the rounds it snapshots do not count it as late.
        ``bypass``: mark round R as started by a synchronous round (not a
        plain one)."""
        m = self._meta
        with self.sched.data_lock():
            waiting, rnd = int(m["acc_rounds"][0]), int(m["snaps"][0])
            flushing = int(m["flush_total"][0]) > self.size * self._epochs
            if mark:
                m["flag"][1] = 1
                m["flag"][3 + self.size:] = 1
            if in_sync is not None:
                m["flag"][self._late_slot] = m["reset"][self._late_slot] = \
                    0 if in_sync else 1
            if fresh is None:
                fresh = not waiting and rnd == self._observed
            if bypass or (fresh and flushing and self.marks_bypass):
                m["flag"][2] = 1          # R may miss its quorum: say so
                m["flag"][3 + self.size:] = 1
            if x is not None:
                self._add_pending(x)
                m["dep_seq"][0] += 1
                if fresh:
                    m["flag"][0] = 1
                    m["flag"][self._late_slot] = 0
            return int(m["dep_seq"][0]), waiting, rnd, fresh, flushing

    def _add_pending(self, x):
        """pending op= x.  Device buffers: on the schedule's stream, after
        the caller's work on x; the caller's later work waits for it (so x
        may be reused at once).  The snapshot, queued on the same stream
        after this hold, sees the deposit."""
        mem = self.mem
        if mem is devices.HOST:         # no stream to order: the common case
            self.combine(self._pending, x, out=self._pending)
            return
        stream = self.sched.stream
        mem.wait_for_caller(stream)
        with mem.on(stream):
            self.combine(self._pending, x, out=self._pending)
        mem.caller_waits(stream)

    def arrive(self, rnd, fresh, flushing, wake=True):
        """Solo: a fresh caller starts round `rnd` (the first arrival
        activates everyone).  The other kinds override it.  ``wake``: see
        :meth:`partialcoll.Schedule.fire` (a fresh call waits for `rnd`)."""
        if fresh:
            self.fire(self._trigger, rnd, wake)

    def fire(self, op, rnd, wake=True):
        """Fire ``op`` for round ``rnd`` (counted from the object's first
        round: the schedule counts from its own, see :meth:`recover`)."""
        self.sched.fire(op, round=rnd - self._base, wake=wake)

    def wait_round(self, rnd, timeout=None):
        """Wait until round ``rnd`` completed here (at once for a round
        before the schedule's first: every survivor completed those
        before the schedule was rebuilt, see :meth:`recover`)."""
        if rnd >= self._base:
            self.sched.wait(round=rnd - self._base, timeout=timeout)

    def test_round(self, rnd):
        """Whether round ``rnd`` completed here."""
        return rnd < self._base or self.sched.test(round=rnd - self._base)

    def flush(self):
        """Collective: a synchronous round; see the handle's docstring."""
        self.check_open()
        return self._synchronous_round(None)

    def started(self):
        """Rounds this rank has started (snapshotted) so far."""
        if self.closed:
            return self._final("started")
        return self._deposit(None)[2]

    def _final(self, what):
        """After close: ``what`` as it was when the object was freed (the
        straggler report stays readable)."""
        if self._at_close is None:
            raise ScheduleError(f"this {self.name} is closed")
        value = self._at_close[what]
        return dict(value) if isinstance(value, dict) else value

    def take(self, seq, sync=False):
        """The result of the rounds finished since the last take, for the
        call whose deposit is number ``seq`` (``sync``: of a synchronous
        round, which also returns the rounds a latest-only object passed
        over)."""
        m = self._meta
        with self.sched.data_lock():
            nr = int(m["acc_rounds"][0])
            m["acc_rounds"][0] = 0
            data = self._take_data(sync)
            nums = (int(m["acc_seq"][0]), int(m["acc_lo"][0]),
                    int(m["last_active"][0]),
                    int(m["last_flush"][0]) > 0 or
                    int(m["last_bypass"][0]) > 0)
            stat_rounds = int(m["stat_rounds"][0])
            late = m["late_total"].copy() \
                if self._watch.due(stat_rounds) else None
        return self._taken(data, seq, nr, *nums, stat_rounds, late, sync)

    def _taken(self, data, seq, nr, acc_seq, acc_lo, active, marked,
               stat_rounds, late, sync=False):
        """The :class:`PartialResult` of a take (:meth:`take`, or the C
        call's): ``data`` and the bookkeeping read in the same hold of the
        lock (the rounds taken, the deposits they cover, the last round's
        NAP, whether it was marked synchronous, the straggler counters)."""
        # latest-only: acc held the last of the nr rounds, `skipped` the
        # nr - 1 before it (and any passed over earlier)
        skipped = 0 if self.catch_up else max(nr - 1, 0)
        self._nskipped += skipped
        # catch-up, or a synchronous round: data covers every deposit up to
        # acc_seq not returned before; latest-only: the deposits
        # (acc_lo, acc_seq] only
        included = acc_seq >= seq and (self.catch_up or sync or
                                       seq > acc_lo)
        self._observed += nr
        rounds = nr if self.catch_up else min(nr, 1)
        if sync and not self.catch_up:        # the passed-over rounds too
            rounds, skipped, self._nskipped = rounds + self._nskipped, 0, 0
        if late is not None:
            self._watch.observe(stat_rounds, late, self.label)
        return PartialResult(data if self._flat else
                             data.reshape(self.shape), included,
                             self._observed - 1, active, rounds,
                             bool(sync or marked), skipped)

    def _take_data(self, sync):
        """Under the lock: a copy of acc (with the passed-over rounds for a
        synchronous round), acc reset to the identity."""
        if self.mem is devices.HOST:
            return self._swap_out(sync)
        stream, mem = self.sched.stream, self.mem
        with mem.on(stream):
            data = self._swap_out(sync)
        mem.caller_waits(stream)
        return data

    def _swap_out(self, sync):
        data = self._acc.copy()
        self._acc[...] = self._identity
        if sync and self._skipped is not None:
            self.combine(data, self._skipped, out=data)
            self._skipped[...] = self._identity
        return data

    def stats(self):
        """The straggler report, the same on every rank for the same rounds:
        ``rounds`` (plain rounds completed on this rank: the rounds of
        flush, close and sync_every, which wait for everyone, are not
        counted), ``late_share`` (per rank: the share of those rounds its
        data missed, so that it was carried into a later round),
        ``mean_lag`` (per rank: rounds since its last fresh contribution,
        averaged over rounds; 0 for a rank that is never late),
        ``slowest`` (the rank with the largest late share), ``calls``
        (this rank's calls so far) and ``skipped`` (latest-only: rounds
        passed over and held for the next synchronous round).  After
        ``close()``: the report as it was then."""
        if self.closed:
            return self._final("stats")
        with self.sched.data_lock():
            return stragglers.report(self._meta, self._members, self._calls,
                                     self._nskipped, self._before,
                                     self.failures)

    # -- housekeeping ---------------------------------------------------
    @property
    def rounds(self):
        """Rounds completed by this rank's schedule so far (after
        ``close()``: when it was closed)."""
        if self.closed:
            return self._final("rounds")
        return self._base + self.sched.rounds

    def close(self):
        """Collective: a final synchronous round (its :class:`PartialResult`
        is returned: nothing pending is lost), then free.  Idempotent."""
        if self.closed:
            return None
        try:
            res = self.flush()
        except RankFailedError:
            self._free()        # no round can end: close here alone
            raise
        self._free()
        return res

    def abandon(self):
        """Free this rank's part alone, with no collective: after a
        :class:`~partialcoll.RankFailedError`, when the communicator is
        revoked and no synchronous round can end.  Idempotent."""
        if not self.closed:
            self._free()

    def quiesce_and_free(self):
        """At interpreter exit, collectively over this object's ranks: keep
        every started round going until all ranks agree none is in flight,
        so no send is left that MPI_Finalize would wait for; then free."""
        if self._failed is not None:    # a death it did not carry on past
            self._free()
            return
        try:
            while True:
                flag = np.array([1 if self.sched.busy else 0], np.int64)
                out = np.zeros(1, np.int64)
                control.wait_for(self.lc.ctl.Iallreduce(flag, out,
                                                        op=MPI.MAX),
                                 comm=self.lc.ctl)
                if out[0] == 0:
                    return
        finally:
            self._free()

    def _free(self):
        try:
            self._at_close = {"stats": self.stats(), "rounds": self.rounds,
                              "started": self.started()}
        except PartialcollError:         # a failed schedule: nothing to keep
            self._at_close = None
        self.sched.free()
        self._fast, self._quick = None, False   # its buffers and schedule go
        self._release()
        self.closed = True
        _OPEN.pop(self.order, None)

    def _release(self):
        """Give back the tag block and the library communicator (collective:
        every rank closes objects in the same order)."""
        self.lc.tags.give_back(self._tag0, self._ntags)
        self.lc.release()

    #: set once this object has logged a long wait
    warned_wait = False

    def waits_for(self, rnd):
        """What round ``rnd`` needs before it can start, in words."""
        return "any rank's call"

    def warn_waiting(self, rnd, seconds):
        """Say, once per object, that a call has waited ``seconds`` for
        round ``rnd``, what the round waits for, and the likely cause: in
        the log, or as a :class:`~partialcoll.StallWarning` where the
        program has not configured logging (the wait may never end; a
        level above WARNING on the ``partialcoll`` logger silences
        both)."""
        self.warned_wait = True
        self._wait_limit = -1.0
        text = (f"{self.name}: rank {self.rank} has waited {seconds:g} s "
                f"for round {rnd}, which waits for {self.waits_for(rnd)}. "
                "If a rank it needs has entered another collective (an "
                "mpi4py collective, comm.Barrier(), another library's) "
                "without pc.flush_partials(comm) first, this wait cannot "
                "end: flush the partial collectives before other "
                "collectives (the docs' lifecycle page)")
        if logs.shown(log):
            log.warning("%s", text)
        else:
            warnings.warn(text, StallWarning, stacklevel=2)

    def check_open(self):
        """Raise ScheduleError if the object is closed (RankFailedError if
        a rank died and it does not carry on)."""
        if self._failed is not None:
            raise self._failed
        if self.closed:
            raise ScheduleError(f"this {self.name} is closed")


# creation order -> open Rounds (strong references)
_OPEN: dict[int, Rounds] = {}
_warned = False


def open_rounds(lc=None):
    """The open objects (on library communicator ``lc``, or all), in
    creation order: the same on every rank."""
    return [r for r in _OPEN.values() if lc is None or r.lc is lc]


def dropped(rounds):
    """Finalizer of a handle: its object stays open until a collective
    close; say so (once per process: the warning, then debug lines)."""
    global _warned
    if rounds.closed:
        return
    rounds.orphaned = True
    level = logging.DEBUG if _warned else logging.WARNING
    _warned = True
    logs.for_this_rank(
        log, level, "%s was dropped without close(); it stays open, so the "
        "other ranks can still use it, until a collective close: "
        "pc.close_partials(comm) or interpreter exit. Call close() "
        "(collective) or use it as a context manager.", rounds.label)


@libcomm.register("on_shrink")
def _shrunk(lc, dead, survivors):
    """Ranks of lc died: every open object on it goes on over the survivors
    (:meth:`Rounds.recover`), in creation order, the same on each."""
    for r in open_rounds(lc):
        r.recover(dead, survivors)


@libcomm.register("at_exit")
def quiesce_all():
    """Exit handler: quiesce every open object, in creation order (the same
    on all ranks), then free it."""
    for r in open_rounds():
        r.quiesce_and_free()
