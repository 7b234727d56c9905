"""Partial allreduce: solo, majority and quorum(k).

The objects here are handles: what the user holds.  The schedule, buffers
and protocol live in :mod:`._rounds` (its docstring draws the schedule), in
a registry of open objects, so that a handle dropped without ``close()``
does not pull the schedule from under the other ranks (it stays open until
a collective close, and a warning says so).
"""
import weakref

import numpy as np
from mpi4py import MPI

from .. import _comm, _device
from .._buffers import as_array
from .._errors import ScheduleError, require_thread_multiple
from ..ops import OPS, as_op, check_op_dtype
from . import _rounds
from ._rounds import Result as PartialResult, designated as _designated  # noqa: F401
from ._rounds import tag_block_size  # noqa: F401

SUM = OPS["SUM"]


class PartialAllreduce:
    """Base of the partial allreduce objects.

    Not thread-safe: call one object from one thread.  Creating, ``flush()``
    and ``close()`` are collective over ``comm``.  ``priority``: of its
    messages (see :func:`partialcoll.iallreduce`).  Attributes: ``shape``,
    ``dtype``, ``op``, ``comm``, ``size``, ``rank``, ``catch_up``,
    ``sync_every``, ``seed``, ``quorum``.
    """

    kind = None

    def __init__(self, like, op=SUM, comm=None, catch_up=True, sync_every=None,
                 *, quorum=None, seed=0, algorithm=None, priority=0):
        require_thread_multiple()
        backend = _device.backend_of(like)
        if backend is None:
            like = np.asarray(like)
        op = as_op(op)
        check_op_dtype(op, like.dtype)
        comm = MPI.COMM_WORLD if comm is None else comm
        if sync_every is not None and int(sync_every) < 1:
            raise ScheduleError("sync_every must be a positive integer or None")
        args = {"name": type(self).__name__, "shape": like.shape,
                "dtype": like.dtype, "op": op, "comm": comm,
                "catch_up": bool(catch_up), "seed": int(seed),
                "sync_every": None if sync_every is None else int(sync_every),
                "quorum": quorum, "mem": backend or _device.HOST,
                "priority": int(priority),
                "device": backend and backend.device_id(like)}
        self._rounds = _rounds.KINDS[self.kind](like.size, args, algorithm)
        for k in ("shape", "dtype", "op", "comm", "catch_up", "seed",
                  "sync_every", "quorum", "size", "rank"):
            setattr(self, k, getattr(self._rounds, k))
        self._finalizer = weakref.finalize(self, _rounds.dropped, self._rounds)

    def __call__(self, sendbuf):
        """Contribute ``sendbuf`` and return a :class:`PartialResult`."""
        return self.start(sendbuf).wait()

    def start(self, sendbuf):
        """Non-blocking form: returns a request with ``test()``/``wait()``."""
        r = self._rounds
        r.check_open()
        x = _flat(sendbuf, "sendbuf", r.mem, r.device, r.name)
        if x.dtype != r.dtype or x.size != r._pending.size:
            raise ScheduleError(f"sendbuf is {x.dtype}[{x.size}], this "
                                f"{r.name} takes {r.dtype}{list(r.shape)}")
        return r.start(x)

    def flush(self):
        """A synchronous round that every rank calls: returns everything
        still pending (every rank's deposits, and the rounds this rank has
        not observed) as a :class:`PartialResult`."""
        return self._rounds.flush()

    def close(self):
        """Collective: a final synchronous round (so nothing pending is
        lost: its :class:`PartialResult` is returned), then free everything.
        Idempotent."""
        res = self._rounds.close()
        self._finalizer.detach()
        return res

    @property
    def closed(self):
        """Whether the object is closed."""
        return self._rounds.closed

    @property
    def rounds(self):
        """Rounds completed by this rank's schedule so far."""
        return self._rounds.rounds

    @property
    def started(self):
        """Rounds started on this rank so far (completed, or running)."""
        return self._rounds.started()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
    solo-like, k = P a full synchronous allreduce."""

    kind = "quorum"

    def __init__(self, like, quorum, op=SUM, comm=None, catch_up=True,
                 sync_every=None, *, algorithm=None, priority=0):
        super().__init__(like, op, comm, catch_up, sync_every, quorum=quorum,
                         algorithm=algorithm, priority=priority)


def _flat(buf, what, mem, device, owner):
    """A 1-D view of `buf`, which must live where the object's buffers do."""
    backend = _device.check_place(buf, mem, device, what,
                                  f"this {owner}'s buffers")
    return as_array(buf, what) if backend is None else \
        _device.flat(backend, buf, what)


def _function_form(cls, sendbuf, recvbuf, op, comm, **kw):
    comm = MPI.COMM_WORLD if comm is None else comm
    backend = _device.backend_of(sendbuf)
    mem = backend or _device.HOST
    device = backend and backend.device_id(sendbuf)
    x = _flat(sendbuf, "sendbuf", mem, device, cls.__name__)
    shape = x.shape if backend is None and \
        not isinstance(sendbuf, np.ndarray) else sendbuf.shape
    key = (cls, shape, x.dtype.str, as_op(op).name, mem.name, device,
           tuple(sorted(kw.items())))
    forms = _forms_of(_comm.library_comm(comm))
    ar = forms.get(key)
    if ar is None or ar.closed:
        ar = forms[key] = cls(mem.empty(shape, x.dtype), op=op, comm=comm,
                              **kw)
    res = ar(x)
    if recvbuf is not None:
        out = _flat(recvbuf, "recvbuf", mem, device, cls.__name__)
        out[...] = res.data.reshape(-1)
        res.data = recvbuf
    return res


def _forms_of(lc):
    """The function-form objects of a library communicator, by signature,
    in creation order."""
    return lc.cache.setdefault("partial.forms", {})


@_comm.register("on_user_free")
def _close_forms(lc):
    # inside the user's collective MPI_Comm_free: every rank closes the same
    # objects in the same (creation) order
    forms = lc.cache.pop("partial.forms", {})
    for ar in sorted(forms.values(), key=lambda a: a._rounds.order):
        ar.close()


def solo_allreduce(sendbuf, recvbuf=None, op=SUM, comm=None):
    """Solo allreduce for mpi4py programs; reuses one persistent
    :class:`SoloAllreduce` per (comm, shape, dtype, op).  Returns a
    :class:`PartialResult` (``recvbuf``, if given, receives ``res.data``)."""
    return _function_form(SoloAllreduce, sendbuf, recvbuf, op, comm)


def majority_allreduce(sendbuf, recvbuf=None, op=SUM, comm=None, seed=0):
    """Majority allreduce for mpi4py programs (see :func:`solo_allreduce`)."""
    return _function_form(MajorityAllreduce, sendbuf, recvbuf, op, comm,
                          seed=seed)


def quorum_allreduce(sendbuf, quorum, recvbuf=None, op=SUM, comm=None):
    """Quorum(k) allreduce for mpi4py programs (see :func:`solo_allreduce`)."""
    return _function_form(QuorumAllreduce, sendbuf, recvbuf, op, comm,
                          quorum=quorum)
