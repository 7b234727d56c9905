"""Drop-tolerant averaging over an unreliable network: RPS.

Algorithm 1 of Yu et al., "Distributed learning over unreliable networks"
(section 4.1), the
Reliable Parameter Server's averaging step.  Every message may be lost
(independently, probability p); nothing is ever resent::

    P = 3; this iteration's owners (a fresh permutation drawn without
    replacement from a seed every rank shares): block 0 -> rank 2,
    block 1 -> rank 0, block 2 -> rank 1

    reduce-scatter   every rank sends block j straight to owner(j) (no ring:
                     a drop would propagate); the owner averages the blocks
                     that arrived, its own included, dividing by their
                     number, not by P
    allgather        owner(j) sends the averaged block j to every rank; a rank
                     that does not receive it keeps its own block j

Send order: a rank's P - 1 sends of a phase all become ready at once, and
the order they leave in decides which are lost when the drops come from a
finite buffer (the emulated network's tail drop: the last ones do not fit).
A fixed order (peer 0 first) would make every rank lose the same links every
call: with P = 4 and room for two of three blocks, rank 3 received nothing,
ever, and trained alone while pulling the others towards it
(docs/results.md).  So every call draws, per rank and per phase, a fresh
order of the peers (``RPSAverage.send_order``, seeded by (seed, call,
rank): the same in every run), which the schedule reads as its sends'
priorities.  With independent drops (the paper's model) the order changes
nothing but the timing.

Implementation: one non-persistent schedule per rank, posted by every call.
Its peers never change: rank r always averages *slot* r.  A call copies
block perm^-1(q) of the vector into slot q of a staging buffer (slots of
ceil(n / P) elements, zero padding), so the owners change every iteration
while the schedule stays the same, and copies the result back.  The
averaging is the executor's: receives end delivered, dropped or timed out;
a reduce fed by a receive that was not delivered does nothing; a SCALE op
divides by the number of delivered blocks + 1.

Drops come from the emulated network (:mod:`partialcoll.transport.network`): the
messages travel in traffic class ``traffic_class`` (default 1), so
``[class.1] drop = p`` loses exactly them.  When the network tells the
receiver (``drop_mode = "told"``) no deadline is needed; when it does not
(``"silent"``), each reduce-scatter receive waits ``timeout`` seconds after
the call posts it, each allgather receive twice that: no receive ever waits
forever.  A message that comes after its receive gave up is discarded.
"""
from __future__ import annotations

import logging
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..core import control, libcomm
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.checks import check_comm, check_int
from ..core.ops import OPS
from ..core.schedule import Schedule

log = logging.getLogger("partialcoll")
# objects not closed yet, in creation order
_open: list[RPSAverage] = []


class RPSRound:
    """What one call did.

    Attributes:
        round: the call's index (0, 1, ...).
        owners: owners[j] is the rank that averaged block j.
        averaged_over: blocks in this rank's average (delivered + its own).
        received: averaged blocks this rank received from their owners.
        kept: blocks it kept its own values for (not received).
    """

    __slots__ = ("round", "owners", "averaged_over", "received", "kept")

    round: int
    owners: npt.NDArray[np.int64]
    averaged_over: int
    received: int
    kept: int

    def __init__(self, round: int, owners: npt.NDArray[np.int64],
                 averaged_over: int, received: int, kept: int) -> None:
        self.round, self.owners = round, owners
        self.averaged_over, self.received, self.kept = (averaged_over,
                                                         received, kept)

    def __repr__(self) -> str:
        return (f"RPSRound(round={self.round}, averaged_over="
                f"{self.averaged_over}, received={self.received}, "
                f"kept={self.kept})")


class RPSAverage:
    """Average a vector over all ranks through drop-tolerant reduce-scatter
    and allgather (RPS); see the module docstring.

    Args:
        like: an array with the vector's size and float dtype.
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        seed: the block owners' seed, the same on every rank.
        timeout: seconds a reduce-scatter receive waits (allgather: twice
            that); needed when the network drops silently.
        traffic_class: the emulated network's class of these messages.

    Creating it and ``close()`` are collective.  Example::

        avg = pc.RPSAverage(model, seed=0)
        for step in range(steps):
            sgd_step(model)
            info = avg(model)       # model now averaged (in place)
        avg.close()
    """

    def __init__(self, like: npt.ArrayLike, comm: MPI.Comm | None = None,
                 seed: int = 0, timeout: float | None = None,
                 traffic_class: int = 1) -> None:
        like = np.asarray(like)
        if like.dtype.kind != "f":
            raise ScheduleError(f"RPSAverage averages float arrays, not "
                                f"{like.dtype}")
        if timeout is not None:
            try:
                positive = float(timeout) > 0
            except (TypeError, ValueError):
                raise ArgumentTypeError(f"timeout must be None or a number "
                                        f"of seconds > 0 (inf: none), got "
                                        f"{timeout!r}") from None
            if not positive:
                raise ScheduleError(f"timeout must be None or a number of "
                                    f"seconds > 0 (inf: none), got "
                                    f"{timeout!r}")
        seed = check_int(seed, "seed", 0)
        traffic_class = check_int(traffic_class, "traffic_class", 0, 15)
        comm = check_comm(comm)
        self.dtype, self.n = like.dtype, like.size
        self.seed, self.tclass = int(seed), traffic_class
        self.timeout = None if timeout is None or \
            float(timeout) == float("inf") else float(timeout)
        lc = self._lc = libcomm.library_comm(comm)
        lc.before_collective()
        mine = {"collective": "RPSAverage", "n": self.n,
                "dtype": self.dtype.str, "seed": self.seed,
                "timeout": self.timeout, "traffic_class": traffic_class}
        control.require_same(lc, "RPSAverage", mine)
        net = _network()
        if net and net["drop_mode"] == "silent" and self.timeout is None:
            raise ScheduleError("the emulated network drops silently: give "
                                "RPSAverage a timeout, or a lost message "
                                "would be waited for forever")
        self.size, self.rank = lc.size, lc.rank
        P = self.size
        self.counts = [self.n // P + (1 if i < self.n % P else 0)
                       for i in range(P)]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(int)
        self.width = max(self.counts) if self.n else 0
        self._tag0 = lc.tags.block(2, "RPS average")
        lc.acquire()
        self._round, self._closed = 0, False
        self.totals = {"rounds": 0, "averaged_over": 0, "received": 0}
        self._sched = self._build() if P > 1 and self.n else None
        _open.append(self)

    # -- the schedule ---------------------------------------------------
    def _build(self):
        P, r, b, tag = self.size, self.rank, self.width, self._tag0
        self._work = np.zeros(P * b, self.dtype)
        s = Schedule(self._lc.comm)
        work = s.buffer(self._work, name="work")
        rs = s.buffer(np.zeros(P * b, self.dtype), name="rs_in")
        ag = s.buffer(np.zeros(P * b, self.dtype), name="ag_in")
        mine = work[r * b:(r + 1) * b]
        self._prio = np.zeros(2 * P, np.int64)   # send order, per call
        prio = s.buffer(self._prio, name="send_order")
        t_rs = None if self.timeout is None else self.timeout
        t_ag = None if self.timeout is None else 2 * self.timeout
        sent, recvs, reds = {}, [], []
        for q in range(P):                       # reduce-scatter
            if q == r:
                continue
            sent[q] = s.send(work[q * b:(q + 1) * b], q, tag=tag,
                             traffic_class=self.tclass,
                             priority=prio[q:q + 1])
            rv = s.recv(rs[q * b:(q + 1) * b], q, tag=tag, timeout=t_rs,
                        traffic_class=self.tclass)
            recvs.append(rv)
            reds.append(s.reduce(mine, rs[q * b:(q + 1) * b], OPS["SUM"],
                                 after=[rv]))
        self._rs_join = s.nop(after=recvs)
        avg = s.scale(mine, count_of=self._rs_join, add=1,
                      after=reds + [self._rs_join])
        got = []
        for q in range(P):                       # allgather
            if q == r:
                continue
            s.send(mine, q, tag=tag + 1, after=[avg],
                   traffic_class=self.tclass, priority=prio[P + q:P + q + 1])
            rv = s.recv(ag[q * b:(q + 1) * b], q, tag=tag + 1, timeout=t_ag,
                        traffic_class=self.tclass)
            got.append(rv)
            s.copy(work[q * b:(q + 1) * b], ag[q * b:(q + 1) * b],
                   after=[rv, sent[q]])
        self._ag_join = s.nop(after=got)
        s.commit()
        return s

    def owners(self, rnd: int) -> npt.NDArray[np.int64]:
        """owners[j]: the rank that averages block j in call ``rnd`` (a
        permutation drawn from (seed, rnd), the same on every rank)."""
        return np.random.default_rng([self.seed, rnd]).permutation(self.size)

    def send_order(self, rnd: int) -> tuple[npt.NDArray[np.int64],
                                            npt.NDArray[np.int64]]:
        """(reduce-scatter, allgather): the peers this rank sends to in call
        ``rnd``, in the order its sends leave; two permutations drawn from
        (seed, rnd, rank), the same in every run (see the module
        docstring)."""
        rng = np.random.default_rng([self.seed, rnd, 1, self.rank])
        peers = np.array([q for q in range(self.size) if q != self.rank],
                         dtype=int)
        return rng.permutation(peers), rng.permutation(peers)

    def _set_send_order(self, rnd):
        """Priorities -(P - 1) .. -1 in send order: before the receives
        (priority 0), as the fixed order had them."""
        P = self.size
        for phase, order in enumerate(self.send_order(rnd)):
            for k, q in enumerate(order):
                self._prio[phase * P + q] = k - (P - 1)

    # -- calls ----------------------------------------------------------
    def __call__(self, x: npt.NDArray[np.floating[Any]]) -> RPSRound:
        """Average ``x`` (a float array of the object's size) in place over
        the ranks; returns an :class:`RPSRound`."""
        if self._closed:
            raise ScheduleError("this RPSAverage is closed")
        flat = _flat(x, self.n, self.dtype)
        owners = self.owners(self._round)
        info = RPSRound(self._round, owners, 1, 0, 0)
        if self._sched is not None:
            self._lc.before_collective()
            self._set_send_order(self._round)
            b, work, off = self.width, self._work, self.offsets
            for j, q in enumerate(owners):       # block j -> slot owner(j)
                c = self.counts[j]
                work[q * b:q * b + c] = flat[off[j]:off[j + 1]]
                work[q * b + c:(q + 1) * b] = 0
            self._sched.post().wait()
            for j, q in enumerate(owners):
                flat[off[j]:off[j + 1]] = work[q * b:q * b + self.counts[j]]
            out = self._sched.outcomes()
            info.averaged_over = int(out.delivered[self._rs_join]) + 1
            info.received = int(out.delivered[self._ag_join])
            info.kept = self.size - 1 - info.received
        self._round += 1
        for k in self.totals:
            self.totals[k] += 1 if k == "rounds" else getattr(info, k)
        return info

    def stats(self) -> dict[str, float]:
        """Totals over the calls: rounds, blocks averaged over, averaged
        blocks received, and the delivered shares."""
        t: dict[str, float] = dict(self.totals)
        P = self.size
        n = max(t["rounds"], 1)
        t["rs_delivered_share"] = (t["averaged_over"] - n) / (n * (P - 1)) \
            if P > 1 else 1.0
        t["ag_delivered_share"] = t["received"] / (n * (P - 1)) \
            if P > 1 else 1.0
        return t

    def close(self) -> None:
        """Collective: wait until every rank's messages were taken (a late
        one by its discard receive), then free.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        _open.remove(self)
        lc = self._lc
        if self._sched is not None:
            import time
            req, pause = lc.ctl.Ibarrier(), 1e-4
            while self._sched.sends_left or not req.Test():
                time.sleep(pause)        # the progress thread drains
                pause = min(2 * pause, 0.01)
            self._sched.free()
        lc.tags.give_back(self._tag0, 2)
        lc.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _flat(x, n, dtype):
    if not isinstance(x, np.ndarray):
        raise ArgumentTypeError(f"RPSAverage needs a C-contiguous NumPy "
                                f"array, not {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ScheduleError("RPSAverage needs a C-contiguous NumPy array, "
                            "got a non-contiguous one (it averages in "
                            "place: pass a contiguous array)")
    if x.size != n or x.dtype != dtype:
        raise ScheduleError(f"got {x.dtype}[{x.size}], this RPSAverage "
                            f"takes {dtype}[{n}]")
    if not x.flags.writeable:
        raise ScheduleError("the array is read-only (RPSAverage averages in "
                            "place)")
    return x.reshape(-1)


def _network():
    from ..transport import network
    return network.current()


@libcomm.register("at_exit")
def _close_all():
    """Exit: close what is still open, in creation order on every rank."""
    for obj in list(_open):
        try:
            obj.close()
        except Exception:
            log.exception("closing an RPSAverage at exit failed")
