"""The full allreduce: ``allreduce`` and ``iallreduce``, on pooled
schedules (:mod:`.pool`) built by the algorithm :mod:`.algorithm` picks.

Data that is not a plain array of an executor dtype (tensors, 16-bit
floats, compression) enters through :mod:`.staging`; the buffers are
checked by :mod:`.arguments`.  A blocking call of NumPy arrays whose
signature was seen before takes a cached :class:`Plan`: a few checks and
one call into C.
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core import devices, libcomm
from ..core.buffers import Buffer, apart, as_array
from ..core.checks import check_comm
from ..core.errors import ScheduleError
from ..core.ops import OPS, Op, OpLike, as_op, is_average
from ..core.request import Done, Request, RoundRequest
from . import staging
from .algorithm import check_algorithm, choose_algorithm
from .arguments import device_of, prepare, prepare_device
from .pool import POOL

SUM = OPS["SUM"]


class Plan:
    """What a repeated blocking call of one signature needs: the library
    communicator, the pooled schedule (``entry``) and its runner."""

    __slots__ = ("lc", "entry", "run", "idle", "ntags")

    def __init__(self, lc, entry):
        self.lc, self.entry, self.ntags = lc, entry, entry.ntags
        self.run, self.idle = entry.schedule.runner()


class _OneRankPlan:
    """:class:`Plan` of a communicator of one rank: the result is the
    input, copied unless in place (no schedule; its ``entry`` is itself,
    with nothing to give back)."""

    __slots__ = ("lc", "entry", "ntags")

    def __init__(self, lc):
        self.lc, self.entry, self.ntags = lc, self, 0

    @staticmethod
    def idle():
        return True

    def give_back(self):
        pass

    @staticmethod
    def run(send, recv, tag_base):
        if send is recv:
            return
        into = recv.flags
        if not (into.c_contiguous and into.writeable and
                send.flags.c_contiguous and send.shape == recv.shape):
            # the checks of the first call (arguments.prepare) that depend
            # on the buffers: the C runner makes them at more ranks
            send, recv = as_array(send, "sendbuf"), as_array(recv, "recvbuf")
            if not into.writeable:
                raise ScheduleError("recvbuf is read-only")
        recv[...] = send


def _one_rank(sendbuf, recvbuf, send, recv, op, comm, algorithm, priority):
    """After a blocking call of NumPy arrays at one rank: later calls of
    its signature take the cached copy (:class:`_OneRankPlan`)."""
    if (type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray
            and send.size and send.dtype != np.float16):
        lc = libcomm.library_comm(check_comm(comm))
        _keep(lc, _OneRankPlan(lc), send, recv, op, algorithm, priority)


def _keep(lc, plan, send, recv, op, algorithm, priority):
    """Cache ``plan`` for the blocking calls of this signature on ``lc``."""
    lc.cache.setdefault("allreduce.plans", {})[
        (send.dtype, send.size, as_op(op), algorithm, send is recv,
         priority)] = plan


def _select(sendbuf, recvbuf, op, comm, algorithm, priority=0):
    """Check everything, then pick the pooled schedule and this call's tag
    block.  Returns (send, recv, result, lc, pooled entry or None when
    there is nothing to communicate, tag base)."""
    be = device_of(sendbuf, recvbuf)
    if be is not None:
        send, recv, result, op, comm = prepare_device(be, sendbuf, recvbuf,
                                                      op, comm)
    else:
        send, recv, result, op, comm = prepare(sendbuf, recvbuf, op, comm)
    check_algorithm(algorithm)
    if comm.Get_size() == 1 or send.size == 0:
        if send is not recv:
            recv[...] = send
        return send, recv, result, None, None, 0
    lc = libcomm.library_comm(comm)
    lc.before_collective()
    algo = choose_algorithm(send.nbytes, send.size, lc.size, algorithm)
    entry = POOL.get(lc, algo, send.size, send.dtype, op, send is recv,
                     be and (be, be.device_id(send)), int(priority))
    return send, recv, result, lc, entry, lc.tag_block(entry.ntags)


def iallreduce(sendbuf: Buffer, recvbuf: Buffer = None, op: OpLike = SUM,
               comm: MPI.Comm | None = None, algorithm: str | None = None,
               priority: int = 0, compression: str | None = None) -> Request:
    """Start a non-blocking allreduce; ``wait()`` returns the result.

    Args:
        sendbuf: NumPy array, buffer-protocol object, mpi4py spec
            ``[buf, MPI.DOUBLE]``, ``MPI.IN_PLACE``, a tensor or any object
            exporting DLPack (a torch tensor in, a torch tensor out), or a
            CuPy array (then ``recvbuf`` is one too, the reductions run on
            the GPU and the result is a CuPy array; see the GPU buffers
            guide).  bfloat16 and float16 are reduced in float32 and rounded
            once (``partialcoll.collectives.staging``).
        recvbuf: where the result goes (allocated, of the caller's type,
            when None); pass the same object as ``sendbuf`` for an in-place
            reduction.
        op: ``partialcoll.SUM`` etc., ``MPI.SUM``-style constants,
            ``torch.distributed.ReduceOp`` members, or the average:
            ``"avg"`` (also ``"average"``, ``ReduceOp.AVG``): the sum
            divided by the number of ranks, for floating-point and complex
            data (16-bit floats summed and divided in float32, rounded
            once).
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        algorithm: ``"recursive_doubling"``, ``"ring"`` or
            ``"rabenseifner"``.  Default: ``PARTIALCOLL_ALLREDUCE_ALGORITHM``
            if set, else recursive doubling up to
            ``PARTIALCOLL_ALLREDUCE_THRESHOLD`` bytes (16 KiB) and above
            it Rabenseifner when P is a power of two, else the ring.
        priority: the priority of its messages: with a cap on sends in
            flight (:func:`partialcoll.set_send_cap`), queued messages of
            concurrent collectives leave lowest number first.
        compression: None, or ``"fp16"`` (:class:`partialcoll.Compression`):
            float data travels as float16, at float16's precision, and
            comes back in its own dtype.

    As with ``MPI_Allreduce``, every rank must pass the same count, dtype,
    op and algorithm: a one-shot call does not spend a message to check
    (a mismatch can hang or give wrong data, as in MPI).  The persistent
    objects (:class:`SoloAllreduce` and the others) do check, once, when
    made.

    The buffers must stay untouched until ``wait()`` returns (or ``test()``
    says True); from then on partialcoll holds no reference to them.

    Example::

        req = partialcoll.iallreduce(np.ones(1000))
        ...                      # overlap computation
        total = req.wait()
    """
    divide = None
    if is_average(op):
        op, divide = SUM, check_comm(comm).Get_size()
    elif staging.plain(sendbuf, recvbuf, compression):
        return _iallreduce(sendbuf, recvbuf, op, comm, algorithm, priority)
    call = staging.Call(sendbuf, recvbuf, op, compression, divide)
    return staging.CallRequest(_iallreduce(call.send, call.recv, call.op,
                                            comm, algorithm, priority), call)


#: compression= of a call made by a staged one: its buffers are the wire's
#: (a private sentinel, typed Any to pass where a compression name goes)
_STAGED: Any = object()


def _iallreduce(sendbuf, recvbuf, op, comm, algorithm, priority):
    """iallreduce of arrays the executor reduces as they are."""
    send, recv, result, _, entry, tags = _select(sendbuf, recvbuf, op, comm,
                                                 algorithm, priority)
    if entry is None:
        return Done(result)
    s = entry.schedule
    s.set_tag_base(tags)
    # device arrays are bound by address: the request, not the schedule,
    # keeps them alive
    s.bind(0, send, keep=False)
    s.bind(1, recv, keep=False)
    return AllreduceRequest(entry, s.post(), result,
                            (send, recv) if s.gpu_path else None)


def allreduce(sendbuf: Buffer, recvbuf: Buffer = None, op: OpLike = SUM,
              comm: MPI.Comm | None = None, algorithm: str | None = None,
              priority: int = 0, compression: str | None = None) -> Any:
    """Blocking allreduce on the executor; returns the result (an array, or
    an object of the caller's type: a torch tensor for a torch tensor).

    Same arguments as :func:`iallreduce`.  Example::

        total = partialcoll.allreduce(np.arange(4.0))   # elementwise sum
        total = partialcoll.allreduce(torch.ones(4, dtype=torch.bfloat16))

    Repeated calls with NumPy arrays of the same size, dtype and op take a
    cached plan (kept with the communicator's library state): no validation
    beyond a few checks, one call into C.  Its schedule may be busy (an
    ``iallreduce`` of the same signature still running): then the call
    takes another one from the pool, as MPI allows.
    """
    if comm is None:
        comm = MPI.COMM_WORLD
    if sendbuf is MPI.IN_PLACE and type(recvbuf) is np.ndarray:
        sendbuf = recvbuf       # the same call (prepare takes both as in place)
    if (type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray
            and type(op) is Op and (compression is None
                                    or compression is _STAGED)):
        plan = _find_plan(comm, (sendbuf.dtype, sendbuf.size, op, algorithm,
                                 sendbuf is recvbuf, priority))
        # apart: one dtype and size, recvbuf writable, no overlap (else the
        # checked path below says what is wrong)
        if (plan is not None and (sendbuf is recvbuf
                                  or apart(sendbuf, recvbuf))
                # busy (an iallreduce of this signature runs): the pool has
                # another.  Checked before taking a tag block: every rank
                # must take exactly one per call, busy or not.
                and plan.idle()):
            # the blocking fast path (the 8-byte latency): one call into C
            lc = plan.lc
            if lc.pending:
                lc.before_collective()
            try:        # run() gives the buffers back when it returns
                plan.run(sendbuf, recvbuf, lc.tags.one_shot(plan.ntags))
            except BaseException:
                plan.entry.give_back()
                raise
            return recvbuf
    if (type(sendbuf) is type(recvbuf) and type(op) is Op and
            compression is None and _MIRRORS):
        done = _through_host_again(sendbuf, recvbuf, op, comm, algorithm,
                                   priority)
        if done is not None:
            return done
    divide = None
    if compression is not _STAGED and is_average(op):
        op, divide = SUM, check_comm(comm).Get_size()
    if divide or compression is not _STAGED and \
            not staging.plain(sendbuf, recvbuf, compression):
        call = staging.Call(sendbuf, recvbuf, op, compression, divide)
        allreduce(call.send, call.recv, call.op, comm, algorithm, priority,
                  _STAGED)
        return call.finish()
    be = device_of(sendbuf, recvbuf)
    if be is not None:
        if _through_host(sendbuf, recvbuf):
            return _allreduce_through_host(be, sendbuf, recvbuf, op, comm,
                                           algorithm, priority)
        return _iallreduce(sendbuf, recvbuf, op, comm, algorithm,
                           priority).wait()
    send, recv, result, lc, entry, tags = _select(sendbuf, recvbuf, op, comm,
                                                  algorithm, priority)
    if entry is None:       # one rank, or nothing to reduce
        _one_rank(sendbuf, recvbuf, send, recv, op, comm, algorithm, priority)
        return result
    try:
        entry.schedule.run(send, recv, tags)
    finally:
        entry.give_back()
    # (never float16: uncompressed, it is staged through float32)
    if type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray and \
            send.dtype != np.float16:
        _keep(lc, Plan(lc, entry), send, recv, op, algorithm, priority)
    return result


def _through_host(sendbuf, recvbuf):
    """Whether a blocking allreduce of these device buffers goes through
    pinned host memory on the calling thread: the staged path, and at most
    ``PARTIALCOLL_GPU_HOST_BYTES``."""
    data = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
    nbytes = getattr(data, "nbytes", None)
    return nbytes is not None and devices.reduced_on_host(nbytes)


class _Mirror:
    """Pinned host buffers of one signature of :func:`_allreduce_through_host`
    (``key``: array type, dtype, count, op, algorithm, priority, device)."""

    __slots__ = ("key", "be", "h_in", "h_out", "nbytes")

    def __init__(self, key, be, count, dtype):
        self.key, self.be = key, be
        self.h_in, self.h_out = be.pinned(count, dtype), be.pinned(count, dtype)
        self.nbytes = self.h_in.nbytes

    def run(self, send, recv, op, comm, algorithm, priority):
        self.be.copy_to_host(send, self.h_in)
        # reduced as it is (_STAGED): the device call's data is the wire's
        # already (float16 only when compressed)
        allreduce(self.h_in, self.h_out, op, comm, algorithm, priority,
                  _STAGED)
        self.be.copy_from_host(self.h_out, recv)


#: idle _Mirror by key, least recently used first (at most _MIRRORS_KEPT); a
#: call takes its mirror out while it runs, so another thread makes its own
_MIRRORS: collections.OrderedDict = collections.OrderedDict()
_MIRRORS_KEPT = 16


def _mirror_key(sendbuf, op, algorithm, priority, be):
    return (type(sendbuf), sendbuf.dtype, sendbuf.size, op, algorithm,
            priority, be.device_id(sendbuf))


def _give_back(mirror):
    _MIRRORS[mirror.key] = mirror
    _MIRRORS.move_to_end(mirror.key)
    while len(_MIRRORS) > _MIRRORS_KEPT:
        _MIRRORS.popitem(last=False)


def _through_host_again(sendbuf, recvbuf, op, comm, algorithm, priority):
    """A repeated small blocking allreduce of device buffers, checked in a
    few steps (what the first call of the signature checked in full that
    does not depend on these buffers holds): the result, or None where
    the full path must decide."""
    be = devices.backend_of(sendbuf)
    if be is None:
        return None
    mirror = _MIRRORS.pop(_mirror_key(sendbuf, op, algorithm, priority, be),
                          None)
    if mirror is None:
        return None
    # (float16 is reduced in float32 unless compressed: never this path's)
    if (recvbuf.dtype == sendbuf.dtype and recvbuf.size == sendbuf.size
            and sendbuf.dtype != np.float16 and sendbuf.flags.c_contiguous and recvbuf.flags.c_contiguous
            and be.device_id(recvbuf) == mirror.key[-1]
            and (recvbuf is sendbuf or
                 not devices.overlap(be, sendbuf, recvbuf))
            and devices.reduced_on_host(mirror.nbytes)):
        try:
            mirror.run(sendbuf, recvbuf, op, comm, algorithm, priority)
        finally:
            _give_back(mirror)
        return recvbuf
    _give_back(mirror)
    return None


def _allreduce_through_host(be, sendbuf, recvbuf, op, comm, algorithm,
                            priority):
    """A small blocking allreduce of device buffers on the staged path, on
    the calling thread: the input copied into pinned host memory (on the
    caller's current stream, after the work queued there, and waited for),
    the host allreduce (its cached fast path), the result copied back
    (waited for).  Two device copies and no hand-over: through the
    executor, every device operation of the round would be seen complete
    only when the progress thread next polls it.  The result is the host
    algorithm's, the same bits as the device's.  Repeated calls of the
    signature take :func:`_through_host_again`."""
    send, recv, result, op, comm = prepare_device(be, sendbuf, recvbuf, op,
                                                  comm)
    key = _mirror_key(send, op, algorithm, priority, be)
    mirror = _MIRRORS.pop(key, None) or _Mirror(key, be, send.size,
                                                send.dtype)
    try:
        mirror.run(send, recv, op, comm, algorithm, priority)
    finally:
        _give_back(mirror)
    return result


def _find_plan(comm, key):
    """The fast-path plan for ``key`` on ``comm`` (None if there is none or
    ``comm`` is not a usable communicator: the slow path says why)."""
    try:
        lc = libcomm.find_fast(comm)
    except AttributeError:
        return None
    plans = lc and lc.cache.get("allreduce.plans")
    return plans.get(key) if plans else None


class AllreduceRequest(RoundRequest):
    """A posted allreduce round.  Once it is complete (``wait()`` returned
    or ``test()`` said True) the pooled schedule gives the caller's buffers
    back and the request drops ``keep`` (device arrays bound by address);
    only the result it returns stays referenced."""

    def __init__(self, entry: Any, posted: RoundRequest, result: Any,
                 keep: Any) -> None:
        super().__init__(posted.schedule, posted.upto, result)
        self._entry, self._keep, self._bound = entry, keep, True

    def test(self) -> bool:
        if not self._bound:
            return True
        if not super().test():
            return False
        self._give_back()
        return True

    def wait(self, timeout: float | None = None) -> Any:
        if self._bound:
            super().wait(timeout)
            self._give_back()
        return self._result

    def _give_back(self):
        self._entry.give_back()
        self._keep, self._bound = None, False
