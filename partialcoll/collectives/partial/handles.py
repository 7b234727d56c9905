"""Partial allreduce: solo, majority and quorum(k).

The objects here are handles: what the user holds.  The state and protocol
live in :mod:`.rounds` (the schedule in :mod:`.schedule`, the three kinds
in :mod:`.kinds`), in a registry of open objects, so that a handle dropped
without ``close()`` does not pull the schedule from under the other ranks
(it stays open until a collective close, and a warning says so).
"""
from __future__ import annotations

import weakref
from typing import Any, Self

import numpy as np
from mpi4py import MPI

from ...core import arrays, devices
from ...core.buffers import Buffer
from ...core.checks import check_comm, check_int, require_thread_multiple
from ...core.errors import PartialcollError, RankFailedError, ScheduleError
from ...core.ops import OPS, Op, OpLike, as_op
from ...core.request import Request
from ..staging import check_compression, wire_dtype
from .rounds import dropped, refuse
from .kinds import KINDS
from .result import PartialResult

SUM = OPS["SUM"]
#: what a partial allreduce object does when a rank of its communicator
#: dies (MPI's fault-tolerance extensions in use): carry on over the
#: survivors, or raise RankFailedError
ON_FAILURE = ("continue", "raise")


def make_rounds(kind, name, like, op=SUM, comm=None, catch_up=True,
                sync_every=None, quorum=None, seed=0, algorithm=None,
                priority=0, compression=None, on_failure="continue"):
    """Check the arguments and make the state of a partial allreduce object
    (:class:`.rounds.Rounds`) shaped like ``like`` (collective).  A bad
    argument on some ranks raises the same error on every rank, of the
    kind those ranks found (:func:`.rounds.refuse`)."""
    require_thread_multiple()
    comm = check_comm(comm)
    try:
        if like is MPI.IN_PLACE:
            raise ScheduleError("MPI.IN_PLACE is not a buffer here (pass "
                                "an array like the contributions)")
        if not isinstance(like, arrays.Data):
            like = arrays.ingest(like if hasattr(like, "__dlpack__") or
                                 devices.backend_of(like) is not None or
                                 hasattr(like, "__cuda_array_interface__")
                                 else np.asarray(like), "like")
        backend = like.backend
        op = as_op(op)
        arrays.check_op(op, like.dtype)
        if sync_every is not None:
            sync_every = check_int(sync_every, "sync_every", 1)
        seed = check_int(seed, "seed", 0)
        if on_failure not in ON_FAILURE:
            raise ScheduleError(f"on_failure must be one of "
                                f"{', '.join(map(repr, ON_FAILURE))}, got "
                                f"{on_failure!r}")
        priority = check_int(priority, "priority", -2**31, 2**31 - 1)
        # What is deposited, reduced and accumulated, as allreduce stages
        # it: 16-bit floats in float32, rounded once when a result is
        # delivered (see deliver); under compression floating data in
        # float16, widened back when delivered; anything else as it is
        # (not compressed, as Horovod's)
        compression = check_compression(compression)
        if like.dtype.kind != "f":
            compression = None
        dtype = wire_dtype(like.dtype, compression) or like.dtype
        arrays.check_op(op, dtype)
    except (PartialcollError, TypeError, ValueError) as e:
        refuse(comm, name, e)
    args = {"name": name, "shape": like.shape, "given": like.dtype,
            "dtype": dtype, "compression": compression,
            "array_kind": like.kind, "op": op,
            "comm": comm, "catch_up": bool(catch_up), "seed": int(seed),
            "sync_every": None if sync_every is None else int(sync_every),
            "quorum": quorum, "mem": backend or devices.HOST,
            "priority": int(priority), "on_failure": on_failure,
            "device": backend and backend.device_id(like.array)}
    return KINDS[kind](like.array.size, args, algorithm)


def deliver(rounds, res, kind=None):
    """``res`` (a :class:`PartialResult` of ``rounds``, or None) with its
    data as the caller's results are: of ``kind``'s type (default: like
    the object's ``like``) and of the object's dtype (16-bit floats,
    accumulated in float32, are rounded here, once; under compression the
    float16 result is converted here)."""
    kind = kind or rounds.array_kind
    if res is not None and not (kind is arrays.ARRAY and rounds.as_is):
        res.data = arrays.deliver(res.data, rounds.given, kind)
    return res


class PartialAllreduce:
    """Base of the partial allreduce objects.

    Not thread-safe: call one object from one thread.  Creating, ``flush()``
    and ``close()`` are collective over ``comm``.  ``priority``: of its
    messages (see :func:`partialcoll.iallreduce`).  ``compression``: None
    or ``"fp16"`` (:class:`partialcoll.Compression`), as for
    :func:`partialcoll.allreduce`: floating data is rounded to float16 when
    deposited and travels, is reduced and is carried from round to round as
    float16 (float16's precision, rounded at every combining step and at
    every round a late contribution is added to), and results come back in
    the object's dtype; other dtypes are not compressed.  A rank that
    takes several rounds at once gets their sum rounded to float16, so
    ranks that took the same rounds in different groups hold results that
    differ by float16's rounding (without compression: by float32's, or
    the dtype's).

    ``on_failure``: what a rank's death does, where MPI's fault-tolerance
    extensions are in use (:func:`partialcoll.fault_tolerance`).
    ``"continue"`` (the default): the survivors carry on without it.  The
    call that meets the death (or the next call, on a rank that was
    computing) joins the survivors' recovery, collective over them, and
    returns as usual: every survivor's contributions are delivered to
    every survivor exactly once, and the dead rank's up to the last round
    that completed anywhere; ``stats()["failures"]`` names the dead rank
    and that round (its later deposits are lost).  ``size`` and ``rank``
    are then the object's among the survivors, and a quorum larger than
    their number becomes their number.  ``"raise"``: its calls raise
    :class:`~partialcoll.RankFailedError`, as full collectives do.  Host
    memory only: device objects always raise.

    Attributes: ``shape``, ``dtype``, ``op``, ``comm``, ``size``,
    ``rank``, ``catch_up``, ``sync_every``, ``seed``, ``quorum``,
    ``compression``, ``on_failure``.
    """

    kind: str | None = None
    shape: tuple[int, ...]
    dtype: Any          # a NumPy dtype, or core.arrays.BFLOAT16
    op: Op
    comm: MPI.Comm
    catch_up: bool
    seed: int
    sync_every: int | None
    compression: str | None
    on_failure: str

    def __init__(self, like: Buffer, op: OpLike = SUM,
                 comm: MPI.Comm | None = None, catch_up: bool = True,
                 sync_every: int | None = None, *, quorum: int | None = None,
                 seed: int = 0, algorithm: str | None = None,
                 priority: int = 0, compression: str | None = None,
                 on_failure: str = "continue") -> None:
        if self.kind is None:
            raise TypeError("PartialAllreduce is the base class: make a "
                            "SoloAllreduce, MajorityAllreduce or "
                            "QuorumAllreduce")
        self._rounds = make_rounds(self.kind, type(self).__name__, like, op,
                                   comm, catch_up, sync_every, quorum, seed,
                                   algorithm, priority, compression,
                                   on_failure)
        for k in ("shape", "op", "comm", "catch_up", "seed", "sync_every",
                  "compression", "on_failure"):
            setattr(self, k, getattr(self._rounds, k))
        self.dtype = self._rounds.given
        # a handle still alive at exit is not "dropped": the exit handler
        # closes what is open, so the finalizer does not run then
        self._finalizer = weakref.finalize(self, dropped, self._rounds)
        self._finalizer.atexit = False

    def __call__(self, sendbuf: Buffer) -> PartialResult:
        """Contribute ``sendbuf`` and return a :class:`PartialResult`
        whose ``data`` is of ``sendbuf``'s type (a torch tensor for a torch
        tensor) and of this object's dtype."""
        r = self._rounds
        res = r.quick(sendbuf)
        if res is not None:
            return res
        x, kind = r.take_buffer(sendbuf)
        return deliver(r, r.call(x), kind)

    def start(self, sendbuf: Buffer) -> Request:
        """Non-blocking form: returns a request with ``test()``/``wait()``."""
        return self._start(sendbuf, blocking=False)

    def _start(self, sendbuf, blocking):
        r = self._rounds
        x, kind = r.take_buffer(sendbuf)
        return _Delivering(r, r.start(x, blocking=blocking), kind)

    def flush(self) -> PartialResult:
        """A synchronous round that every rank calls: returns everything
        still pending (every rank's deposits, and the rounds this rank has
        not observed) as a :class:`PartialResult` (``data`` of ``like``'s
        type)."""
        return deliver(self._rounds, self._rounds.flush())

    def close(self) -> PartialResult | None:
        """Collective: a final synchronous round (so nothing pending is
        lost: its :class:`PartialResult` is returned), then free everything.
        Idempotent."""
        res = deliver(self._rounds, self._rounds.close())
        self._finalizer.detach()
        return res

    def stats(self) -> dict[str, Any]:
        """The straggler report (Horovod's stall inspector, for a partial
        collective): every round records which ranks' data was fresh, so
        this returns ``rounds`` (plain rounds completed here; the rounds
        of flush, close and sync_every wait for everyone and are not
        counted), ``late_share`` (per rank: the share of those rounds its
        data missed and was carried into a later one), ``mean_lag``
        (per rank: rounds since its last fresh contribution, averaged over
        rounds), ``slowest`` (the rank with the largest late share),
        ``failures`` (one dict per rank that died, where the object
        carried on: ``rank``, of ``comm``, and ``rounds``: the first
        ``rounds`` rounds hold its data, its later deposits are lost),
        ``calls`` (this rank's) and ``skipped`` (``catch_up=False``: rounds
        passed over, held for the next synchronous round).  The per-rank
        lists are the same on every rank for the same rounds.  A warning is
        logged once (``partialcoll`` logger) when some ranks were late in
        most of the last 100 rounds.  After :meth:`close` it still returns
        the report as it was then (so do ``rounds`` and ``started``)."""
        return self._rounds.stats()

    @property
    def size(self) -> int:
        """The number of ranks (the survivors, after a death)."""
        return self._rounds.size

    @property
    def rank(self) -> int:
        """This rank's place among the object's ranks."""
        return self._rounds.rank

    @property
    def quorum(self) -> int | None:
        """The quorum (None but for QuorumAllreduce)."""
        return self._rounds.quorum

    @property
    def closed(self) -> bool:
        """Whether the object is closed."""
        return self._rounds.closed

    @property
    def rounds(self) -> int:
        """Rounds completed by this rank's schedule so far."""
        return self._rounds.rounds

    @property
    def label(self) -> str:
        """This object's name in :func:`~partialcoll.flush_partials` and
        :func:`~partialcoll.close_partials` results and in warnings
        (default ``"SoloAllreduce #3"``: the kind and the object's number
        on its communicator, the same on every rank); assignable."""
        return self._rounds.label

    @label.setter
    def label(self, value: object) -> None:
        self._rounds.label = str(value)

    @property
    def started(self) -> int:
        """Rounds started on this rank so far (completed, or running)."""
        return self._rounds.started()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if isinstance(value, RankFailedError):
            # the communicator is revoked: a closing round could not end,
            # and its error would hide the one that is leaving the block
            self._rounds.abandon()
            self._finalizer.detach()
            return
        self.close()


class _Delivering(Request):
    """A call's request: its result is delivered (the caller's type and
    dtype) once, when the round is taken."""

    def __init__(self, rounds, request, kind):
        self._rounds, self._request, self._kind = rounds, request, kind
        self._res = None

    def test(self) -> bool:
        """True when the round completed (``wait()`` then returns at once)."""
        return self._res is not None or self._request.test()

    def wait(self, timeout: float | None = None) -> PartialResult:
        """Wait for the round and return the :class:`PartialResult`."""
        if self._res is None:
            self._res = deliver(self._rounds, self._request.wait(timeout),
                                self._kind)
        return self._res


class SoloAllreduce(PartialAllreduce):
    """Wait-free partial allreduce: the first caller starts the round and
    activates everyone; late callers' data goes into the next round.

    Example::

        ar = pc.SoloAllreduce(np.zeros(10))
        res = ar(grad)            # res.data, res.included, res.active
        ar.flush(); ar.close()
    """

    kind = "solo"


class MajorityAllreduce(PartialAllreduce):
    """Partial allreduce whose round starts when a randomly drawn rank (the
    same on every rank, from ``seed`` and the round number) arrives: on
    average half the processes contribute fresh data."""

    kind = "majority"


class QuorumAllreduce(PartialAllreduce):
    """Partial allreduce whose round starts once ``quorum`` processes have
    arrived: at least k fresh contributions per round, guaranteed.  k = 1 is
    solo's activation (any caller starts a round; no arrivals counted at
    rank 0), k = P a full synchronous allreduce."""

    kind = "quorum"

    def __init__(self, like: Buffer, quorum: int, op: OpLike = SUM,
                 comm: MPI.Comm | None = None, catch_up: bool = True,
                 sync_every: int | None = None, *,
                 algorithm: str | None = None, priority: int = 0,
                 compression: str | None = None,
                 on_failure: str = "continue") -> None:
        super().__init__(like, op, comm, catch_up, sync_every, quorum=quorum,
                         algorithm=algorithm, priority=priority,
                         compression=compression, on_failure=on_failure)
