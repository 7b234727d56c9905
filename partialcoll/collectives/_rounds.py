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
  flags [fresh, flush] -> meta, deposit sequence number -> round_seq,
  snapshots += 1.
* meta allreduce (SUM of two int64): [ranks with fresh data, ranks whose
  synchronous round started this round (flush marks)].
* accumulate, under the lock: acc <- acc op result (catch-up) or result,
  rounds-accumulated += 1, acc_seq <- round_seq, last_active <- fresh count,
  last_flush <- flush marks, flush_total += flush marks.

A call deposits into `pending` under the lock; the snapshot count read in the
same hold is R, the round that will carry the deposit.  The deposit is fresh
when the call will wait for R itself (no round running, none waiting to be
seen); else it is carried into R as stale data.  The call's arrival counts for
round R (solo and quorum: when fresh; majority: when this rank is R's drawn
initiator).  If finished rounds are waiting it returns them at once, else it
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

from .. import _comm, _device
from .._errors import ScheduleError
from ..ops import OPS
from ..schedule import Schedule
from .allreduce import (BUILDERS, _Done, build_recursive_doubling,
                        choose_algorithm)

log = logging.getLogger("partialcoll")
SUM = OPS["SUM"]
_UFUNCS = {"SUM": "add", "PROD": "multiply", "MIN": "minimum",
           "MAX": "maximum", "LAND": "logical_and", "LOR": "logical_or",
           "LXOR": "logical_xor", "BAND": "bitwise_and",
           "BOR": "bitwise_or", "BXOR": "bitwise_xor"}
_META = ("flag", "zero", "one", "meta_send", "meta_recv", "dep_seq",
         "round_seq", "acc_seq", "acc_rounds", "last_active", "snaps",
         "prev_seq", "acc_lo", "last_flush", "flush_total")
_META2 = ("flag", "zero", "meta_send", "meta_recv")   # [fresh, flush]


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


def designated(seed, rnd, size):
    """Majority's initiator of round `rnd`: splitmix64 of (seed, round)."""
    z = (seed * 0x9E3779B97F4A7C15 + rnd + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % size


class Result:
    """What one call returns (re-exported as ``partialcoll.PartialResult``).

    Attributes:
        data: the result (an array shaped like ``like``): the latest round, or
            with ``catch_up`` every round this rank had not seen, combined.
        included: whether this call's contribution is in ``data``'s rounds.
        round: index of the last round ``data`` covers (-1 if none).
        active: processes that contributed fresh data in that round (NAP).
        rounds: how many rounds ``data`` combines.
        sync: whether that round was synchronous (flush, close, the
            sync_every-th call) or started by a rank entering one.
    """

    __slots__ = ("data", "included", "round", "active", "rounds", "sync")

    def __init__(self, data, included, round, active, rounds, sync=False):
        self.data, self.included, self.round = data, included, round
        self.active, self.rounds, self.sync = active, rounds, sync

    def __repr__(self):
        return (f"PartialResult(round={self.round}, rounds={self.rounds}, "
                f"active={self.active}, included={self.included}, "
                f"sync={self.sync})")


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
        lc = _comm.library_comm(self.comm)
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
        self.closed = False
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
                "dtype": self.dtype.str, "op": self.op.name,
                "quorum": self.quorum, "seed": self.seed,
                "catch_up": self.catch_up, "sync_every": self.sync_every,
                "algorithm": algorithm, "priority": self.priority}
        everyone, bad = _comm.disagreements(lc.ctl, mine)
        if bad:
            detail = "; ".join(_comm.per_rank(everyone, k) for k in bad)
            raise ScheduleError(f"{self.name} created with different "
                                f"arguments on different ranks ({detail})")

    def _build(self, n, algorithm):
        P, rank = self.size, self.rank
        ident, mem = self.op.identity(self.dtype), self.mem
        self._pending = mem.full(n, ident, self.dtype)
        self._identity = mem.full(n, ident, self.dtype)
        self._acc = mem.full(n, ident, self.dtype)
        send, recv = mem.empty(n, self.dtype), mem.empty(n, self.dtype)
        self._combine = getattr(mem.xp, _UFUNCS[self.op.name])
        self._meta = {k: np.zeros(2 if k in _META2 else 1, np.int64)
                      for k in _META}
        self._meta["one"][0] = 1
        lc = self._lc
        stamp_id = lc.ctl.bcast(secrets.randbits(63) if rank == 0 else None)
        s = self._sched = Schedule(lc.comm, persistent=True, stamp_id=stamp_id,
                                   priority=self.priority)
        b = {k: s.buffer(v, name=k) for k, v in self._meta.items()}
        pend, idb, acc = (s.buffer(self._pending, name="pending"),
                          s.buffer(self._identity, name="identity"),
                          s.buffer(self._acc, name="acc"))
        bs, br = s.buffer(send, name="send"), s.buffer(recv, name="recv")
        mtmp = s.buffer(np.zeros(2, np.int64), name="meta_tmp")
        algo = choose_algorithm(send.nbytes, n, P, algorithm)
        tmp = s.buffer(mem.empty(2 * (n // P + 1) if algo == "ring" else n,
                                 self.dtype), name="tmp")
        tags = _tag_layout(P, self._tag0)
        act = self._build_activation(s, tags)
        c = s.copy(bs, pend, after=[act], locked=True)
        c = s.copy(pend, idb, after=[c], locked=True)
        c = s.copy(b["meta_send"], b["flag"], after=[c], locked=True)
        c = s.copy(b["flag"], b["zero"], after=[c], locked=True)
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
            c = s.copy(acc, br, after=[done], locked=True)
        c = s.reduce(b["acc_rounds"], b["one"], SUM, after=[c], locked=True)
        c = s.copy(b["acc_seq"], b["round_seq"], after=[c], locked=True)
        # this round holds the deposits numbered (prev_seq, round_seq]
        c = s.copy(b["acc_lo"], b["prev_seq"], after=[c], locked=True)
        c = s.copy(b["last_active"], b["meta_recv"][0:1], after=[c],
                   locked=True)
        c = s.copy(b["last_flush"], b["meta_recv"][1:2], after=[c],
                   locked=True)
        s.reduce(b["flush_total"], b["meta_recv"][1:2], SUM, after=[c],
                 locked=True)

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
        """``sendbuf`` as a flat array where this object's buffers live,
        checked against its dtype and size (raises if closed)."""
        self.check_open()
        x = _device.flat_in_place(sendbuf, self.mem, self.device, what,
                                  self.name)
        if x.dtype != self.dtype or x.size != self._pending.size:
            raise ScheduleError(f"{what} is {x.dtype}[{x.size}], this "
                                f"{self.name} takes {self.dtype}"
                                f"{list(self.shape)}")
        return x

    def start(self, x):
        """Contribute ``x`` (a flat array on the object's memory); returns a
        request whose ``wait()`` gives a :class:`Result`."""
        self.check_open()
        self._calls += 1
        if self.sync_every and self._calls % self.sync_every == 0:
            return _Done(self._synchronous_round(x))
        seq, waiting, rnd, fresh, flushing = self._deposit(x)
        self._arrive(rnd, fresh, flushing)
        if waiting:                       # finished rounds not yet observed
            return _Done(self._take(seq))
        return _Request(self, self._observed, seq)

    def _deposit(self, x, fresh=None, mark=False):
        """Add x to the pending data.  Returns (deposit number, finished
        rounds waiting to be observed, the round R that will take x, fresh,
        flushing).

        The deposit is *fresh* (counted in ``active``, the paper's NAP) when
        this call will wait for round R itself: nothing is left to collect
        and no round is running.  Otherwise the call returns an earlier
        round and x is carried into R as stale data, as eager-SGD does.
        *flushing*: some rank is in a synchronous round this rank has not
        finished (see :meth:`_synchronous_round`).  ``mark``: flag round R
        as flush-started (in the same hold as reading R)."""
        core, m = self._sched._core_sched(), self._meta
        core.lock()
        try:
            waiting, rnd = int(m["acc_rounds"][0]), int(m["snaps"][0])
            flushing = int(m["flush_total"][0]) > self.size * self._epochs
            if mark:
                m["flag"][1] = 1
            if fresh is None:
                fresh = not waiting and rnd == self._observed
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
           it, so every started round is finished everywhere.
        5. Deposit x, barrier, and all start round M+1: it holds every
           rank's x and everything still pending, and nothing else.
        6. Take the result, barrier: no rank leaves (and starts a round with
           its next call) before every rank has taken its result, so a
           later round never leaks into a slower rank's synchronous result.
        """
        ctl = self._lc.ctl
        entry = self._deposit(None, mark=True)[2]
        self._sched.fire(self._bypass, round=entry)
        ids = np.array([self.id, -self.id], np.int64)
        seen = np.zeros(2, np.int64)
        _comm.wait_for(ctl.Iallreduce(ids, seen, op=MPI.MAX), longest=0.001)
        if seen[0] != -seen[1]:
            raise ScheduleError(f"flush()/close() of different objects at "
                                f"the same time on different ranks (object "
                                f"ids {-seen[1]}..{seen[0]}; this rank: "
                                f"{self.id}): flush and close in the same "
                                f"order everywhere")
        last = ctl.allreduce(self.started(), op=MPI.MAX)
        self._sched.fire(self._bypass, round=last)
        self._sched.wait(round=last)
        seq = self._deposit(x, fresh=x is not None)[0]
        ctl.Barrier()
        self._sched.fire(self._bypass, round=last + 1)
        self._sched.wait(round=last + 1)
        res = self._take(seq)
        res.sync = True
        self._epochs += 1
        ctl.Barrier()
        return res

    def started(self):
        """Rounds this rank has started (snapshotted) so far."""
        return self._deposit(None)[2]

    def _take(self, seq):
        core, m = self._sched._core_sched(), self._meta
        core.lock()
        try:
            stream, mem = self._sched.stream, self.mem
            with mem.on(stream):
                data = self._acc.copy()
                self._acc[...] = self._identity
            mem.caller_waits(stream)
            nr = int(m["acc_rounds"][0])
            m["acc_rounds"][0] = 0
            # catch-up: data covers every deposit up to acc_seq not taken
            # before; latest-only: just the deposits (acc_lo, acc_seq]
            included = int(m["acc_seq"][0]) >= seq and (
                self.catch_up or seq > int(m["acc_lo"][0]))
            active = int(m["last_active"][0])
            sync = int(m["last_flush"][0]) > 0
        finally:
            core.unlock()
        self._observed += nr
        return Result(data.reshape(self.shape), included,
                      self._observed - 1, active, nr, sync)

    # -- housekeeping ---------------------------------------------------
    @property
    def rounds(self):
        """Rounds completed by this rank's schedule so far."""
        return self._sched.rounds

    def close(self):
        """Collective: a final synchronous round (its :class:`Result` is
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
                _comm.wait_for(self._lc.ctl.Iallreduce(flag, out, op=MPI.MAX))
                if out[0] == 0:
                    return
        finally:
            self._free()

    def _free(self):
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
        """Wait for the round and return the :class:`Result`."""
        if self._res is None:
            self._rounds._sched.wait(round=self._round, timeout=timeout)
            self._res = self._rounds._take(self._seq)
        return self._res


class SoloRounds(Rounds):
    kind = "solo"


class MajorityRounds(Rounds):
    kind = "majority"

    def _arrive(self, rnd, fresh, flushing):
        # the drawn initiator's arrival starts its round even when it is
        # collecting older rounds, or ranks waiting on it could stall;
        # while someone flushes, a fresh caller starts its own round
        if designated(self.seed, rnd, self.size) == self.rank or \
                (fresh and flushing):
            self._sched.fire(self._trigger, round=rnd)


class QuorumRounds(Rounds):
    kind = "quorum"

    def _arrive(self, rnd, fresh, flushing):
        # only fresh data counts towards the quorum; while someone flushes,
        # a fresh caller's arrival starts the round on its own
        if fresh:
            self._sched.fire(self._bypass if flushing else self._trigger,
                             round=rnd)

    def _check_quorum(self, quorum):
        if quorum is None or not 1 <= int(quorum) <= self.size:
            raise ScheduleError(f"quorum must be between 1 and the number of "
                                f"processes ({self.size}), got {quorum!r}")
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


@_comm.register("at_exit")
def quiesce_all():
    """Exit handler: quiesce every open object, in creation order (the same
    on all ranks), then free it."""
    for r in open_rounds():
        r.quiesce_and_free()
