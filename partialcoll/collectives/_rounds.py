"""The state and protocol of a partial allreduce (solo, majority, quorum):
one persistent schedule per object, re-armed by the executor every round::

    activation ──> snapshot (locked) ──> allreduce(data, op) ──┐
        │                           └──> allreduce(flag, SUM) ──┴─> accumulate (locked)

* activation: who may start a round.
  - solo: every rank's trigger T (stamped with the round) starts it; the
    activation spreads through a union of binomial trees on the circulant
    graph x -> x + 2^j (mod P): the send on dimension j fires on ANY(T, a
    receive on a lower dimension), so any P works and simultaneous initiators
    give one round (consumable ops + round-stamped messages).
  - majority: the same graph, but only the rank drawn for the round (a hash
    of a seed shared by all ranks and the round number) fires T.
  - quorum(k): every caller sends a stamped arrival to rank 0, whose
    activation NOP needs k of the P arrivals, then broadcasts.
* snapshot, under the schedule's data lock: send <- pending, pending <- identity,
  flags [fresh, flush, bypass, late_0 .. late_P-1, mark_0 .. mark_P-1] ->
  meta (then reset: late is 1 in this rank's own slot unless it is inside a
  synchronous round; a flush or bypass mark sets every mark_i),
  deposit sequence number -> round_seq, snapshots += 1.
* meta allreduce (SUM of 3 + 2P int64): [ranks with fresh data, ranks whose
  synchronous round started this round (flush marks), ranks that started it
  while someone was flushing (bypass marks), then per rank: 1 if it was late,
  then the marks again, P times (a vector, to mask the late flags)].
* accumulate, under the lock: acc <- acc op result (catch-up), or
  skipped <- skipped op acc; acc <- result (latest only: nothing is lost,
  a synchronous round returns `skipped`), rounds-accumulated += 1,
  acc_seq <- round_seq, last_active <- fresh count, last_flush <- flush
  marks, last_bypass <- bypass marks, flush_total += flush marks; the
  straggler counters count plain rounds only (no mark: plain <- 1 LXOR
  marks, late <- late * plain): late_total += late, lag <- (lag + late) *
  late (consecutive rounds late), lag_total += lag, stat_rounds += plain.

A call deposits into `pending` under the lock; the snapshot count read in the
same hold is R, the round that will carry the deposit.  The deposit is fresh
when the call will wait for R itself (no round running, none waiting to be
seen); else it is carried into R as stale data.  The call's arrival counts for
round R only when it is fresh (solo: it starts R; majority: it starts R when
this rank is R's drawn initiator, so the initiator is always active, as in
the paper; quorum: one of the k arrivals R needs).  If finished rounds are waiting it returns them at once, else it
waits for the next round and takes `acc` under the lock.  So each
contribution is in exactly one round, results are never overwritten while
read (they are copied out under the lock), and a rank that missed rounds
gets them all combined.

Lifetime.  The user holds a handle (:class:`~.partial.PartialAllreduce`);
the state here lives in a registry of open objects until a collective close
(``close()``, ``close_partials``, or the exit handler, in creation order on
every rank).  A handle dropped without ``close()`` leaves its state open, so
the other ranks, still calling, are not left waiting for a schedule that
vanished on one rank; it is logged once under the ``partialcoll`` logger.
"""
import logging
import secrets

import numpy as np
from mpi4py import MPI

from ..core import arrays, libcomm, devices
from ..core.errors import PartialcollError, ScheduleError
from ..core.ops import OPS
from ..core.schedule import Schedule
from ._builders import BUILDERS, build_recursive_doubling
from .allreduce import _Done, choose_algorithm
from ._result import PartialResult

log = logging.getLogger("partialcoll")
SUM = OPS["SUM"]
_UFUNCS = {"SUM": "add", "PROD": "multiply", "MIN": "minimum",
           "MAX": "maximum", "LAND": "logical_and", "LOR": "logical_or",
           "LXOR": "logical_xor", "BAND": "bitwise_and",
           "BOR": "bitwise_or", "BXOR": "bitwise_xor"}
_META = ("flag", "reset", "one", "meta_send", "meta_recv", "dep_seq",
         "round_seq", "acc_seq", "acc_rounds", "last_active", "snaps",
         "prev_seq", "acc_lo", "last_flush", "last_bypass", "flush_total",
         "stat_rounds", "late_total", "lag", "lag_total", "plain", "late",
         "ones")
_FLAGS = ("flag", "reset", "meta_send", "meta_recv")   # 3 + 2P: see above
_PER_RANK = ("late_total", "lag", "lag_total", "plain", "late", "ones")
LATE_WINDOW = 100       # straggler warning: late in most of the last N rounds


def _tag_layout(P, tag0):
    """Where an object's tags start, by use, in its block from ``tag0``:
    the data allreduce (any builder: the ring uses 2P - 2 tags, recursive
    doubling and Rabenseifner at most 2 log2 P + 2), the meta allreduce
    (recursive doubling: bit_length(P) + 1), one activation tag per
    circulant dimension, quorum's arrivals and flush arrivals."""
    data, meta = 2 * P + 2, P.bit_length() + 1
    act = max(1, (P - 1).bit_length())
    return {"data": tag0, "meta": tag0 + data,
            "activation": tag0 + data + meta,
            "arrive": tag0 + data + meta + act,
            "flush_arrive": tag0 + data + meta + act + 1,
            "end": tag0 + data + meta + act + 2}


def tag_block_size(P):
    """Tags one partial collective object holds on its communicator:
    2P + bit_length(P) + max(1, bit_length(P - 1)) + 5 (README: tag
    budget)."""
    return _tag_layout(P, 0)["end"]


class Rounds:
    """One partial allreduce's schedule, buffers and protocol (see the
    module docstring).  ``args`` is the handle's checked arguments: kind,
    shape, dtype, op, comm, catch_up, sync_every, quorum, seed, memory
    backend and device.  Creating it is collective over ``comm``."""

    kind = None
    _created = 0                      # creation order, equal on all ranks

    def __init__(self, n, args, algorithm):
        for k, v in args.items():
            setattr(self, k, v)
        lc = libcomm.library_comm(self.comm)
        self.size, self.rank = lc.size, lc.rank
        self.quorum = self._check_quorum(self.quorum)
        lc.before_collective()
        self._check_consistent(lc, algorithm)
        # one executor communicator shared by every object on comm: this
        # object's messages are told apart by its own block of tags
        self._ntags = tag_block_size(self.size)
        self._tag0 = lc.tags.block(self._ntags)
        self._lc = lc.acquire()
        try:
            self._build(n, algorithm)
        except BaseException:
            self._release()
            raise
        lc.created += 1
        self.id = lc.created              # the same on every rank
        self.label = f"{self.name} #{self.id}"
        self._observed = 0                # rounds taken by this rank
        self._calls = 0
        self._epochs = 0                  # synchronous rounds done here
        self.closed, self._at_close = False, None
        self.orphaned = False             # its handle was dropped
        Rounds._created += 1
        self.order = Rounds._created
        _OPEN[self.order] = self
        self._sched.post()

    # -- construction ---------------------------------------------------
    def _check_quorum(self, quorum):
        return None

    def _check_consistent(self, lc, algorithm):
        mine = {"collective": self.kind, "shape": tuple(self.shape),
                "memory": self.mem.name,
                "dtype": str(self.given), "op": self.op.name,
                "quorum": self.quorum, "seed": self.seed,
                "catch_up": self.catch_up, "sync_every": self.sync_every,
                "algorithm": algorithm, "priority": self.priority,
                "compression": self.compression}
        everyone, bad = libcomm.disagreements(lc.ctl, mine)
        if bad:
            detail = "; ".join(libcomm.per_rank(everyone, k) for k in bad)
            raise ScheduleError(f"{self.name} created with different "
                                f"arguments on different ranks ({detail})")

    def _build(self, n, algorithm):
        P, rank = self.size, self.rank
        ident, mem = self.op.identity(self.dtype), self.mem
        self._pending = mem.full(n, ident, self.dtype)
        self._identity = mem.full(n, ident, self.dtype)
        self._acc = mem.full(n, ident, self.dtype)
        # latest-only: the rounds passed over, returned by a synchronous one
        self._skipped = None if self.catch_up else \
            mem.full(n, ident, self.dtype)
        self._nskipped = 0
        send, recv = mem.empty(n, self.dtype), mem.empty(n, self.dtype)
        self._combine = getattr(mem.xp, _UFUNCS[self.op.name])
        self._meta = {k: np.zeros(3 + 2 * P if k in _FLAGS else
                                  P if k in _PER_RANK else 1, np.int64)
                      for k in _META}
        self._meta["one"][0] = 1
        self._meta["ones"][...] = 1
        self._late_slot = 3 + rank
        for k in ("flag", "reset"):         # late until a fresh deposit
            self._meta[k][self._late_slot] = 1
        self._late_seen = []                # (stat_rounds, late_total)
        self._late_warned = False
        lc = self._lc
        # the ranks met in _check_consistent, yet meeting again here before
        # the bcast measured faster at 5 ranks on 2 cores (median 14.0 s
        # against 16.5 s for test_eager_ddp + test_forms)
        libcomm.arrive(lc.ctl)
        stamp_id = lc.ctl.bcast(secrets.randbits(63) if rank == 0 else None)
        s = self._sched = Schedule(lc.comm, persistent=True, stamp_id=stamp_id,
                                   priority=self.priority, reliable=True)
        b = {k: s.buffer(v, name=k) for k, v in self._meta.items()}
        pend, idb, acc = (s.buffer(self._pending, name="pending"),
                          s.buffer(self._identity, name="identity"),
                          s.buffer(self._acc, name="acc"))
        bs, br = s.buffer(send, name="send"), s.buffer(recv, name="recv")
        mtmp = s.buffer(np.zeros(3 + 2 * P, np.int64), name="meta_tmp")
        algo = choose_algorithm(send.nbytes, n, P, algorithm)
        tmp = s.buffer(mem.empty(2 * (n // P + 1) if algo == "ring" else n,
                                 self.dtype), name="tmp")
        tags = _tag_layout(P, self._tag0)
        act = self._build_activation(s, tags)
        c = s.copy(bs, pend, after=[act], locked=True)
        c = s.copy(pend, idb, after=[c], locked=True)
        c = s.copy(b["meta_send"], b["flag"], after=[c], locked=True)
        c = s.copy(b["flag"], b["reset"], after=[c], locked=True)
        c = s.copy(b["prev_seq"], b["round_seq"], after=[c], locked=True)
        c = s.copy(b["round_seq"], b["dep_seq"], after=[c], locked=True)
        snap = s.reduce(b["snaps"], b["one"], SUM, after=[c], locked=True)
        first = len(s)
        BUILDERS[algo](s, P, rank, bs, br, tmp, self.op, False, after=[snap],
                       tag0=tags["data"])
        build_recursive_doubling(s, P, rank, b["meta_send"], b["meta_recv"],
                                 mtmp, SUM, False, after=[snap],
                                 tag0=tags["meta"])
        done = s.nop(after=list(range(first, len(s))))
        if self.catch_up:
            c = s.reduce(acc, br, self.op, after=[done], locked=True)
        else:
            skipped = s.buffer(self._skipped, name="skipped")
            c = s.reduce(skipped, acc, self.op, after=[done], locked=True)
            c = s.copy(acc, br, after=[c], locked=True)
        c = s.reduce(b["acc_rounds"], b["one"], SUM, after=[c], locked=True)
        c = s.copy(b["acc_seq"], b["round_seq"], after=[c], locked=True)
        # this round holds the deposits numbered (prev_seq, round_seq]
        c = s.copy(b["acc_lo"], b["prev_seq"], after=[c], locked=True)
        c = s.copy(b["last_active"], b["meta_recv"][0:1], after=[c],
                   locked=True)
        c = s.copy(b["last_flush"], b["meta_recv"][1:2], after=[c],
                   locked=True)
        c = s.copy(b["last_bypass"], b["meta_recv"][2:3], after=[c],
                   locked=True)
        c = s.reduce(b["flush_total"], b["meta_recv"][1:2], SUM, after=[c],
                     locked=True)
        # straggler counters (the same on every rank: from the meta sums),
        # over plain rounds only (no flush or bypass mark)
        plain, late = b["plain"], b["late"]
        c = s.copy(plain, b["ones"], after=[c], locked=True)
        c = s.reduce(plain, b["meta_recv"][3 + P:], OPS["LXOR"], after=[c],
                     locked=True)
        c = s.copy(late, b["meta_recv"][3:3 + P], after=[c], locked=True)
        c = s.reduce(late, plain, OPS["PROD"], after=[c], locked=True)
        c = s.reduce(b["late_total"], late, SUM, after=[c], locked=True)
        c = s.reduce(b["lag"], late, SUM, after=[c], locked=True)
        c = s.reduce(b["lag"], late, OPS["PROD"], after=[c], locked=True)
        c = s.reduce(b["lag_total"], b["lag"], SUM, after=[c], locked=True)
        s.reduce(b["stat_rounds"], plain[0:1], SUM, after=[c], locked=True)

    def _build_activation(self, s, tags):
        """Solo/majority activation: returns the index of the activation NOP.
        The trigger also starts synchronous and flush-started rounds."""
        P, rank, tag0 = self.size, self.rank, tags["activation"]
        self._trigger = self._bypass = s.trigger(optional=True)
        dims = [j for j in range(P.bit_length()) if (1 << j) < P]
        recvs = [s.recv(peer=(rank - (1 << j)) % P, tag=tag0 + j, stamped=True,
                        optional=True) for j in dims]
        for j in dims:
            s.send(peer=(rank + (1 << j)) % P, tag=tag0 + j, stamped=True,
                   optional=True, after=[self._trigger] + recvs[:j], mode=1)
        return s.nop(after=[self._trigger] + recvs, mode=1)

    # -- calls ----------------------------------------------------------
    def take_buffer(self, sendbuf, what="sendbuf"):
        """``sendbuf`` (any array or tensor, see :mod:`partialcoll.core.arrays`) as a flat
        array where this object's buffers live, checked against its dtype
        and size (raises if closed), as the dtype it reduces in (16-bit
        floats widened to float32; rounded to float16 under compression);
        and the :class:`~partialcoll.core.arrays.ArrayKind` of the caller's results."""
        self.check_open()
        data = sendbuf if isinstance(sendbuf, arrays.Data) else \
            arrays.ingest(sendbuf, what)
        x = devices.flat_in_place(data.array, self.mem, self.device, what,
                                  self.name)
        if (data.dtype is not self.given and data.dtype != self.given) or \
                x.size != self._pending.size:
            raise ScheduleError(f"{what} is {data.dtype}[{x.size}], this "
                                f"{self.name} takes {self.given}"
                                f"{list(self.shape)}")
        return arrays.reduced_as(x, self.given, self.dtype), data.kind

    def start(self, x):
        """Contribute ``x`` (a flat array on the object's memory); returns a
        request whose ``wait()`` gives a :class:`PartialResult`."""
        self.check_open()
        self._calls += 1
        if self.sync_every and self._calls % self.sync_every == 0:
            return _Done(self._synchronous_round(x))
        seq, waiting, rnd, fresh, flushing = self._deposit(x)
        self._arrive(rnd, fresh, flushing)
        if waiting:                       # finished rounds not yet observed
            return _Done(self._take(seq))
        return _Request(self, self._observed, seq)

    marks_bypass = False    # flag rounds a flushing caller starts as sync

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
        core, m = self._sched._core_sched(), self._meta
        core.lock()
        try:
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
                # device buffers: on the schedule's stream, after the
                # caller's work on x; the caller's later work waits for it
                # (so x may be reused at once).  The snapshot, queued on the
                # same stream after this hold, sees the deposit.
                stream, mem = self._sched.stream, self.mem
                mem.wait_for_caller(stream)
                with mem.on(stream):
                    self._combine(self._pending, x, out=self._pending)
                mem.caller_waits(stream)
                m["dep_seq"][0] += 1
                if fresh:
                    m["flag"][0] = 1
                    m["flag"][self._late_slot] = 0
            return int(m["dep_seq"][0]), waiting, rnd, fresh, flushing
        finally:
            core.unlock()

    def _arrive(self, rnd, fresh, flushing):
        """Solo: a fresh caller starts round `rnd` (the first arrival
        activates everyone)."""
        if fresh:
            self._sched.fire(self._trigger, round=rnd)

    def flush(self):
        """Collective: a synchronous round; see the handle's docstring."""
        self.check_open()
        return self._synchronous_round(None)

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
        3. Wait until every rank is here: a non-blocking allreduce of this
           object's id (a mismatch means ranks flush different objects:
           an error on every rank), waited for with Test() and sleeps.
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
        ctl = self._lc.ctl
        entry = self._deposit(None, mark=True, in_sync=True)[2]
        self._sched.fire(self._bypass, round=entry)
        ids = np.array([self.id, -self.id], np.int64)
        seen = np.zeros(2, np.int64)
        libcomm.wait_for(ctl.Iallreduce(ids, seen, op=MPI.MAX), longest=0.001)
        if seen[0] != -seen[1]:
            raise ScheduleError(f"flush()/close() of different objects at "
                                f"the same time on different ranks (object "
                                f"ids {-seen[1]}..{seen[0]}; this rank: "
                                f"{self.id}): flush and close in the same "
                                f"order everywhere")
        started = np.array([self.started()], np.int64)
        libcomm.wait_for(ctl.Iallreduce(MPI.IN_PLACE, started, op=MPI.MAX),
                       longest=0.001)
        last = int(started[0])
        if last > 0:
            # the bypass mark goes to this rank's pending round: make it
            # `last` (every earlier round is snapshotted once it completed).
            # Then whoever fires `last` first has marked it; without this
            # wait a rank behind marked an earlier round, and `last`,
            # fired by another rank and snapshotted here before the mark,
            # could end up marked by no one (counted as a plain round)
            self._sched.wait(round=last - 1)
        self._deposit(None, bypass=True)
        self._sched.fire(self._bypass, round=last)
        self._sched.wait(round=last)
        seq = self._deposit(x, fresh=x is not None, bypass=True)[0]
        libcomm.arrive(ctl)
        self._sched.fire(self._bypass, round=last + 1)
        self._sched.wait(round=last + 1)
        res = self._take(seq, sync=True)
        self._epochs += 1
        self._deposit(None, in_sync=False)    # before anyone leaves
        libcomm.arrive(ctl)
        return res

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

    def _take(self, seq, sync=False):
        """The result of the rounds finished since the last take (``sync``:
        of a synchronous round, which also returns the rounds a
        latest-only object passed over)."""
        core, m = self._sched._core_sched(), self._meta
        core.lock()
        try:
            stream, mem = self._sched.stream, self.mem
            nr = int(m["acc_rounds"][0])
            m["acc_rounds"][0] = 0
            # latest-only: acc holds the last of the nr rounds, `skipped`
            # the nr - 1 before it (and any passed over earlier)
            skipped = 0 if self.catch_up else max(nr - 1, 0)
            self._nskipped += skipped
            with mem.on(stream):
                data = self._acc.copy()
                self._acc[...] = self._identity
                if sync and self._skipped is not None:
                    self._combine(data, self._skipped, out=data)
                    self._skipped[...] = self._identity
            mem.caller_waits(stream)
            # catch-up, or a synchronous round: data covers every deposit up
            # to acc_seq not returned before; latest-only: just the deposits
            # (acc_lo, acc_seq]
            included = int(m["acc_seq"][0]) >= seq and (
                self.catch_up or sync or seq > int(m["acc_lo"][0]))
            active = int(m["last_active"][0])
            marked = sync or int(m["last_flush"][0]) > 0 or \
                int(m["last_bypass"][0]) > 0
            stat_rounds = int(m["stat_rounds"][0])
            late = None
            if not self._late_warned and (not self._late_seen or stat_rounds
                                          - self._late_seen[-1][0] >=
                                          LATE_WINDOW // 4):
                late = m["late_total"].copy()
        finally:
            core.unlock()
        self._observed += nr
        rounds = nr if self.catch_up else min(nr, 1)
        if sync and not self.catch_up:        # the passed-over rounds too
            rounds, skipped, self._nskipped = rounds + self._nskipped, 0, 0
        if late is not None:
            self._watch_stragglers(stat_rounds, late)
        return PartialResult(data.reshape(self.shape), included,
                      self._observed - 1, active, rounds, marked, skipped)

    # -- the straggler report ---------------------------------------------
    def _watch_stragglers(self, stat_rounds, late):
        """Warn once (``partialcoll`` logger) when some ranks, not all, were
        late in most of the last LATE_WINDOW rounds.  Called every
        LATE_WINDOW / 4 rounds with the running per-rank late counts."""
        seen = self._late_seen
        seen.append((stat_rounds, late))
        while len(seen) > 1 and stat_rounds - seen[1][0] >= LATE_WINDOW:
            seen.pop(0)
        r0, late0 = seen[0]
        span = stat_rounds - r0
        if span < LATE_WINDOW:
            return
        slow = np.flatnonzero(2 * (late - late0) > span)
        if 0 < slow.size < self.size:
            self._late_warned = True
            log.warning("%s: rank(s) %s were late (their data missed the "
                        "round and was carried into a later one) in most of "
                        "the last %d rounds; stats()['late_share'] has every "
                        "rank's share", self.label,
                        ", ".join(map(str, slow.tolist())), span)

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
        core, m = self._sched._core_sched(), self._meta
        core.lock()
        try:
            n = int(m["stat_rounds"][0])
            late, lag = m["late_total"].copy(), m["lag_total"].copy()
        finally:
            core.unlock()
        share = late / n if n else np.zeros(self.size)
        mean_lag = lag / n if n else np.zeros(self.size)
        return {"rounds": n, "calls": self._calls,
                "late_share": [round(float(v), 4) for v in share],
                "mean_lag": [round(float(v), 3) for v in mean_lag],
                "slowest": int(np.argmax(share)) if n else None,
                "skipped": self._nskipped}

    # -- housekeeping ---------------------------------------------------
    @property
    def rounds(self):
        """Rounds completed by this rank's schedule so far (after
        ``close()``: when it was closed)."""
        if self.closed:
            return self._final("rounds")
        return self._sched.rounds

    def close(self):
        """Collective: a final synchronous round (its :class:`PartialResult` is
        returned: nothing pending is lost), then free.  Idempotent."""
        if self.closed:
            return None
        res = self.flush()
        self._free()
        return res

    def quiesce_and_free(self):
        """At interpreter exit, collectively over this object's ranks: keep
        every started round going until all ranks agree none is in flight,
        so no send is left that MPI_Finalize would wait for; then free."""
        try:
            core = self._sched._core_sched()
            while True:
                flag = np.array([1 if core.busy else 0], np.int64)
                out = np.zeros(1, np.int64)
                libcomm.wait_for(self._lc.ctl.Iallreduce(flag, out, op=MPI.MAX))
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
        self._sched.free()
        self._release()
        self.closed = True
        _OPEN.pop(self.order, None)

    def _release(self):
        """Give back the tag block and the library communicator (collective:
        every rank closes objects in the same order)."""
        self._lc.tags.give_back(self._tag0, self._ntags)
        self._lc.release()

    def check_open(self):
        if self.closed:
            raise ScheduleError(f"this {self.name} is closed")


class _Request:
    """The request of a call that waits for round ``rnd``."""

    def __init__(self, rounds, rnd, seq):
        self._rounds, self._round, self._seq, self._res = rounds, rnd, seq, None

    def test(self):
        """True when the round completed (``wait()`` then returns at once)."""
        return self._res is not None or \
            self._rounds._sched.test(round=self._round)

    def wait(self, timeout=None):
        """Wait for the round and return the :class:`PartialResult`."""
        if self._res is None:
            self._rounds._sched.wait(round=self._round, timeout=timeout)
            self._res = self._rounds._take(self._seq)
        return self._res


_OPEN = {}              # creation order -> open Rounds (strong references)
_warned = False


def open_rounds(lc=None):
    """The open objects (on library communicator ``lc``, or all), in
    creation order: the same on every rank."""
    return [r for r in _OPEN.values() if lc is None or r._lc is lc]


def dropped(rounds):
    """Finalizer of a handle: its object stays open until a collective
    close; say so (once per process: the warning, then debug lines)."""
    global _warned
    if rounds.closed:
        return
    rounds.orphaned = True
    level = logging.DEBUG if _warned else logging.WARNING
    _warned = True
    log.log(level, "%s was dropped without close(); it stays open, so the "
            "other ranks can still use it, until a collective close: "
            "pc.close_partials(comm) or interpreter exit. Call close() "
            "(collective) or use it as a context manager.", rounds.label)


@libcomm.register("at_exit")
def quiesce_all():
    """Exit handler: quiesce every open object, in creation order (the same
    on all ranks), then free it."""
    for r in open_rounds():
        r.quiesce_and_free()
