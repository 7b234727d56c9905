"""Full allreduce as schedules: algorithm choice, the schedule pool and the
entry points.

The builders (:mod:`._builders`) append the algorithms to a
:class:`~partialcoll.Schedule` whose slots are ``send`` (slot 0), ``recv``
(slot 1) and ``tmp`` (slot 2).  Data that is not a plain array of an
executor dtype (tensors, 16-bit floats, compression) enters through
:mod:`.staging`.
"""
import collections

import numpy as np
from mpi4py import MPI

from ..core import arrays, libcomm, devices, env
from ..core.buffers import as_array
from ..core.errors import ScheduleBusyError, ScheduleError
from ..core.checks import check_comm, require_thread_multiple
from ..core.ops import OPS, Op, as_op, check_op_dtype
from ..core.schedule import Request, Schedule
from ..core.slots import DEVICE
from . import staging
from ._builders import (BUILDERS, build_rabenseifner,  # noqa: F401
                        build_recursive_doubling, build_ring)

SUM = OPS["SUM"]


#: messages up to this many bytes use recursive doubling (else ring)
DEFAULT_THRESHOLD = 16384
ALGORITHMS = ("recursive_doubling", "ring", "rabenseifner")



_settings = {}


def _setting(name, default=None, cast=str):
    """Environment settings are read once per process (first use)."""
    if name not in _settings:
        _settings[name] = env.get(name, default, cast)
    return _settings[name]


def choose_algorithm(nbytes, count, size, algorithm=None):
    """Pick an algorithm: ``algorithm`` argument, else the
    ``PARTIALCOLL_ALLREDUCE_ALGORITHM`` variable, else recursive doubling up
    to ``PARTIALCOLL_ALLREDUCE_THRESHOLD`` bytes (default 16 KiB); above it
    Rabenseifner when P is a power of two (2 log2 P steps), else the ring
    (2 (P - 1) steps, but no extra full-vector fold step); both need at least
    one element per rank."""
    algo = algorithm or _setting(env.ALLREDUCE_ALGORITHM)
    if algo is not None:
        if algo not in ALGORITHMS:
            raise ScheduleError(f"unknown allreduce algorithm {algo!r}; "
                                f"choose from {', '.join(ALGORITHMS)}")
        return algo
    threshold = _setting(env.ALLREDUCE_THRESHOLD, DEFAULT_THRESHOLD, int)
    if nbytes <= threshold or count < size:
        return "recursive_doubling"
    return "rabenseifner" if size & (size - 1) == 0 else "ring"


#: most schedules the pool keeps (idle ones beyond it are dropped, oldest
#: first); their temporary buffers are bounded by pool_budget()
POOL_SCHEDULES = 64
#: default of PARTIALCOLL_ALLREDUCE_POOL_BYTES
DEFAULT_POOL_BYTES = 64 << 20


def pool_budget():
    """Bytes of temporary buffers the pool may keep in idle schedules
    (``PARTIALCOLL_ALLREDUCE_POOL_BYTES``, default 64 MiB)."""
    return _setting(env.ALLREDUCE_POOL_BYTES, DEFAULT_POOL_BYTES, int)


class _Pool:
    """Committed allreduce schedules, reused by calls of the same signature
    (library communicator, algorithm, count, dtype, op, in-place, device).

    Least recently used first: after each new schedule, idle ones are
    dropped, oldest first, until at most POOL_SCHEDULES remain and their
    temporary buffers fit pool_budget() (the newest stays even if it alone
    is larger).  A busy one is never dropped; a dropped one is not freed
    (a request may still hold it): the last reference frees it.  The
    schedules hold no caller's buffers between calls (see _unbind)."""

    def __init__(self):
        self._by_key = {}                       # (lc, key) -> [Schedule]
        self._lru = collections.OrderedDict()   # Schedule -> ((lc, key), bytes)
        self.nbytes = 0

    def get(self, lc, algo, count, dtype, op, inplace, device=None,
            priority=0):
        """An idle schedule (made if none is idle).  ``device``: (backend,
        device id) for device buffers."""
        path = devices.gpu_path() if device else None
        key = (lc, (algo, count, dtype.str, op.name, inplace,
                    device and (device[0].name, device[1]), path, priority))
        for sched in self._by_key.get(key, ()):
            if _idle(sched._core_sched()):
                self._lru.move_to_end(sched)
                return sched
        sched, nbytes = _build(lc, algo, count, dtype, op, inplace, device,
                               priority)
        self._by_key.setdefault(key, []).append(sched)
        self._lru[sched] = (key, nbytes)
        self.nbytes += nbytes
        self._trim(pool_budget())
        return sched

    def _trim(self, budget):
        for sched in list(self._lru)[:-1]:
            if len(self._lru) <= POOL_SCHEDULES and self.nbytes <= budget:
                return
            if _idle(sched._core_sched()):
                self._forget(sched)

    def _forget(self, sched):
        (lc, key), nbytes = self._lru.pop(sched)
        self.nbytes -= nbytes
        scheds = self._by_key[(lc, key)]
        scheds.remove(sched)
        if not scheds:
            del self._by_key[(lc, key)]
        plans = lc.cache.get("allreduce.plans", {})
        for k in [k for k, plan in plans.items() if plan[3] is sched]:
            del plans[k]

    def drop(self, lc):
        """Forget lc's schedules once their rounds (posted on every rank, so
        they complete) are over: lc's duplicates are about to be freed."""
        for sched in [s for s, ((c, _), _) in self._lru.items() if c is lc]:
            sched.wait()
            self._forget(sched)


def _idle(core):
    return core.posted == core.done


def _build(lc, algo, count, dtype, op, inplace, device, priority=0):
    """A committed schedule for one signature, and its temporary bytes."""
    s = Schedule(lc.comm, priority=priority, reliable=True)
    after = ()
    if device:
        s.use_device(*device)
    send = s.buffer(dtype=dtype, size=count, writable=False, name="send",
                    device=bool(device))
    recv = s.buffer(dtype=dtype, size=count, name="recv", device=bool(device))
    tmp_size = 2 * (count // lc.size + 1) if algo == "ring" else count
    tmp = device[0].empty(tmp_size, dtype) if device else \
        np.empty(tmp_size, dtype)
    tmp_slot = s.buffer(tmp, name="tmp")
    if device:          # MPI may read the caller's data only once it is there
        after = [s.fence()]
    BUILDERS[algo](s, lc.size, lc.rank, send, recv, tmp_slot, op, inplace,
                   after=after)
    s.commit()
    s.ntags = 2 * lc.size + 2
    return s, tmp.nbytes


_pool = _Pool()


def pool_size():
    """(schedules, bytes of temporary buffers) the pool holds now."""
    return len(_pool._lru), _pool.nbytes


@libcomm.register("on_release")
def _drop_pool(lc):
    _pool.drop(lc)


def _unbind(core):
    """Give the caller's buffers back: slots 0 and 1 forget them, so the
    pool keeps no user array alive.  A slot that a newer call has rebound
    (and posted) is that call's to give back."""
    try:
        core.unbind(0)
        core.unbind(1)
    except ScheduleBusyError:
        pass


def _prepare(sendbuf, recvbuf, op, comm):
    require_thread_multiple()
    comm = check_comm(comm)
    if sendbuf is MPI.IN_PLACE or (sendbuf is recvbuf and sendbuf is not None):
        if recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        recv = as_array(recvbuf, "recvbuf")
        send = recv
    else:
        send = as_array(sendbuf, "sendbuf")
        if recvbuf is None:
            shape = sendbuf.shape if isinstance(sendbuf, np.ndarray) else send.shape
            recvbuf = np.empty(shape, send.dtype)
        recv = as_array(recvbuf, "recvbuf")
        if np.shares_memory(send, recv):
            raise ScheduleError("sendbuf and recvbuf overlap; use MPI.IN_PLACE "
                                "or pass the same array for in-place")
    if recv.dtype != send.dtype or recv.size != send.size:
        raise ScheduleError(f"recvbuf ({recv.dtype}[{recv.size}]) does not "
                            f"match sendbuf ({send.dtype}[{send.size}])")
    if not arrays.writeable(recv):
        raise ScheduleError("recvbuf is read-only")
    result = recvbuf if isinstance(recvbuf, np.ndarray) else recv
    op = as_op(op)
    check_op_dtype(op, send.dtype)
    return send, recv, result, op, comm


def _device_of(sendbuf, recvbuf):
    """The backend of device buffers (None for host ones); mixing host and
    device memory is an error."""
    send_be = None if sendbuf is MPI.IN_PLACE else devices.backend_of(sendbuf)
    recv_be = None if recvbuf is None else devices.backend_of(recvbuf)
    if sendbuf is MPI.IN_PLACE or recvbuf is None:
        return send_be or recv_be
    if send_be is not recv_be:
        raise ScheduleError("sendbuf and recvbuf must both be device arrays "
                            "or both host buffers")
    return send_be


def _prepare_device(be, sendbuf, recvbuf, op, comm):
    require_thread_multiple()
    comm = check_comm(comm)
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        if recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        recv = send = devices.flat(be, recvbuf, "recvbuf")
    else:
        send = devices.flat(be, sendbuf, "sendbuf")
        if recvbuf is None:
            recvbuf = be.empty(sendbuf.shape, send.dtype)
        recv = devices.flat(be, recvbuf, "recvbuf")
        if be.device_id(sendbuf) != be.device_id(recvbuf):
            raise ScheduleError("sendbuf and recvbuf are on different devices")
        lo, hi = be.ptr(send), be.ptr(send) + send.nbytes
        if send.nbytes and recv.nbytes and \
                lo < be.ptr(recv) + recv.nbytes and be.ptr(recv) < hi:
            raise ScheduleError("sendbuf and recvbuf overlap; use MPI.IN_PLACE "
                                "or pass the same array for in-place")
    if recv.dtype != send.dtype or recv.size != send.size:
        raise ScheduleError(f"recvbuf ({recv.dtype}[{recv.size}]) does not "
                            f"match sendbuf ({send.dtype}[{send.size}])")
    op = as_op(op)
    check_op_dtype(op, send.dtype)
    return send, recv, recvbuf, op, comm


def _plan(sendbuf, recvbuf, op, comm, algorithm, priority=0):
    """Check everything, then pick the schedule and this call's tag block.
    Returns (send, recv, result, schedule or None when there is nothing to
    communicate, tag base)."""
    be = _device_of(sendbuf, recvbuf)
    if be is not None:
        send, recv, result, op, comm = _prepare_device(be, sendbuf, recvbuf,
                                                       op, comm)
    else:
        send, recv, result, op, comm = _prepare(sendbuf, recvbuf, op, comm)
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ScheduleError(f"unknown allreduce algorithm {algorithm!r}; "
                            f"choose from {', '.join(ALGORITHMS)}")
    if comm.Get_size() == 1 or send.size == 0:
        if send is not recv:
            recv[...] = send
        return send, recv, result, None, 0
    lc = libcomm.library_comm(comm)
    lc.before_collective()
    algo = choose_algorithm(send.nbytes, send.size, lc.size, algorithm)
    sched = _pool.get(lc, algo, send.size, send.dtype, op, send is recv,
                      be and (be, be.device_id(send)), int(priority))
    return send, recv, result, sched, lc.tag_block(sched.ntags)


def iallreduce(sendbuf, recvbuf=None, op=SUM, comm=None, algorithm=None,
               priority=0, compression=None):
    """Start a non-blocking allreduce; ``wait()`` returns the result.

    Args:
        sendbuf: NumPy array, buffer-protocol object, mpi4py spec
            ``[buf, MPI.DOUBLE]``, ``MPI.IN_PLACE``, a tensor or any object
            exporting DLPack (a torch tensor in, a torch tensor out), or a
            CuPy array (then ``recvbuf`` is one too, the reductions run on
            the GPU and the result is a CuPy array; see the README's "GPU
            buffers").  bfloat16 and float16 are reduced in float32 and
            rounded once (``partialcoll/collectives/staging.py``).
        recvbuf: where the result goes (allocated, of the caller's type,
            when None); pass the same object as ``sendbuf`` for an in-place
            reduction.
        op: ``partialcoll.SUM`` etc., or ``MPI.SUM``-style constants.
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
    if staging.plain(sendbuf, recvbuf, compression):
        return _iallreduce(sendbuf, recvbuf, op, comm, algorithm, priority)
    call = staging.Call(sendbuf, recvbuf, op, compression)
    return staging.CallRequest(_iallreduce(call.send, call.recv, call.op,
                                            comm, algorithm, priority), call)


#: compression= of a call made by a staged one: its buffers are the wire's
_STAGED = object()


def _iallreduce(sendbuf, recvbuf, op, comm, algorithm, priority):
    """iallreduce of arrays the executor reduces as they are."""
    send, recv, result, sched, tags = _plan(sendbuf, recvbuf, op, comm,
                                            algorithm, priority)
    if sched is None:
        return _Done(result)
    core = sched._core_sched()
    core.set_tag_base(tags)
    if sched.gpu_path is not None:
        # raw pointers: the request, not the schedule, keeps the arrays
        be = devices.backend_of(send)
        core.bind_ptr(0, be.ptr(send), send.nbytes, False, DEVICE)
        core.bind_ptr(1, be.ptr(recv), recv.nbytes, True, DEVICE)
        return _AllreduceRequest(sched, sched.post()._upto, result,
                                 (send, recv))
    core.bind(0, send, False)
    core.bind(1, recv, True)
    return _AllreduceRequest(sched, core.post(), result, None)


def allreduce(sendbuf, recvbuf=None, op=SUM, comm=None, algorithm=None,
              priority=0, compression=None):
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
    if (type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray
            and type(op) is Op and (compression is None
                                    or compression is _STAGED)):
        plan = _find_plan(comm, (sendbuf.dtype, sendbuf.size, op, algorithm,
                                 sendbuf is recvbuf, priority))
        if (plan is not None and recvbuf.dtype == sendbuf.dtype
                and recvbuf.size == sendbuf.size
                and (sendbuf is recvbuf
                     or not np.may_share_memory(sendbuf, recvbuf))):
            lc, core, ntags, _ = plan
            # busy (an iallreduce of this signature runs): the pool has
            # another.  Checked before taking a tag block: every rank must
            # take exactly one per call, busy or not.  (_idle and
            # lc.tag_block, inlined: this path is the 8-byte latency.)
            if core.posted == core.done:
                if lc.pending:
                    lc.before_collective()
                try:        # run() gives the buffers back when it returns
                    core.run(sendbuf, recvbuf, lc.tags.one_shot(ntags))
                except BaseException:
                    _unbind(core)
                    raise
                return recvbuf
    if compression is not _STAGED and \
            not staging.plain(sendbuf, recvbuf, compression):
        call = staging.Call(sendbuf, recvbuf, op, compression)
        allreduce(call.send, call.recv, call.op, comm, algorithm, priority,
                  _STAGED)
        return call.finish()
    if _device_of(sendbuf, recvbuf) is not None:
        return _iallreduce(sendbuf, recvbuf, op, comm, algorithm,
                           priority).wait()
    send, recv, result, sched, tags = _plan(sendbuf, recvbuf, op, comm,
                                            algorithm, priority)
    if sched is None:
        return result
    core = sched._core_sched()
    try:
        core.run(send, recv, tags)
    finally:
        _unbind(core)
    # (never float16: uncompressed, it is staged through float32)
    if type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray and \
            send.dtype != np.float16:
        lc = libcomm.library_comm(comm)
        lc.cache.setdefault("allreduce.plans", {})[
            (send.dtype, send.size, as_op(op), algorithm, send is recv,
             priority)] = \
            (lc, core, sched.ntags, sched)
    return result


def _find_plan(comm, key):
    """The fast-path plan for ``key`` on ``comm`` (None if there is none or
    ``comm`` is not a usable communicator: the slow path says why)."""
    try:
        lc = libcomm._by_handle.get(comm.handle)      # libcomm.find_fast
    except AttributeError:
        return None
    return lc and lc.cache.get("allreduce.plans", {}).get(key)


class _AllreduceRequest(Request):
    """A posted allreduce round.  Once it is complete (``wait()`` returned
    or ``test()`` said True) the schedule gives the caller's buffers back
    (:func:`_unbind`) and the request drops ``keep`` (device arrays bound by
    address); only the result it returns stays referenced."""

    def __init__(self, sched, upto, result, keep):
        super().__init__(sched, upto, result)
        self._keep, self._bound = keep, True

    def test(self):
        if not self._bound:
            return True
        if not super().test():
            return False
        self._give_back()
        return True

    def wait(self, timeout=None):
        if self._bound:
            super().wait(timeout)
            self._give_back()
        return self._result

    def _give_back(self):
        _unbind(self._sched._core_sched())
        self._keep, self._bound = None, False


class _Done:
    """A request that is already complete (P = 1, empty buffers, a partial
    call that collected finished rounds)."""

    def __init__(self, result):
        self._result = result

    def test(self):
        return True

    def wait(self, timeout=None):
        return self._result
