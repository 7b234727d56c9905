"""The public schedule API: build a graph of operations, commit it, post it.

A :class:`Schedule` is a DAG of operations (send, recv, reduce, copy, NOP and
application triggers) executed in *rounds* by the C progress thread; see
``csrc/pc_sched.h`` for the exact semantics.  In short:

* ``after=[a, b]`` with ``mode=ALL`` fires when both ``a`` and ``b`` completed
  in this round; ``mode=ANY`` fires on the first of them; ``need=k`` fires
  when k of them have.  Every op runs at
  most once per round (ops are *consumable*): a surplus input of an ANY op
  (a second predecessor completing in the same round) is discarded.
* A round ends when every non-optional op completed.  A persistent schedule
  re-arms itself for the next round with no help from the application.
* Triggers are NOPs that only the application fires: ``fire(t)`` banks one
  fire (consumed by exactly one round, never lost); ``fire(t, round=r)`` only
  fires round ``r`` and is discarded if that round is already past.
* ``stamped=True`` messages carry the round number: a late one (its round is
  over) is discarded, an early one is kept for its round.
* ``locked=True`` (nop, reduce, copy) runs under the schedule's data lock, a
  chain of such ops inside one hold; ``with sched.data_lock():`` takes the
  same lock, so the application can deposit into or read from buffers the
  schedule touches while it runs.
* Device buffers (CuPy arrays): reduce and copy ops on them run on the GPU,
  on the schedule's own stream, which waits for the caller's stream at every
  post.  Sends and receives of device memory go to a CUDA-aware MPI
  directly, or are staged through pinned host memory by copy ops the
  schedule adds itself (see ``partialcoll/devices.py``).  ``fence()``
  completes once the device work queued before it has run.

Example (two ranks exchange and sum a vector)::

    import numpy as np, partialcoll as pc
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    x, tmp = np.full(4, comm.rank + 1.0), np.empty(4)
    s = pc.Schedule(comm)
    bx, bt = s.buffer(x), s.buffer(tmp)
    peer = 1 - comm.rank
    snd = s.send(bx, peer)
    rcv = s.recv(bt, peer)
    s.reduce(bx, bt, pc.SUM, after=[snd, rcv])
    s.post().wait()          # x == [3, 3, 3, 3] on both ranks
"""
import weakref

import numpy as np
from mpi4py import MPI

from .. import _core
from . import descriptors, devices, libcomm
from .errors import ScheduleError, ScheduleFreedError
from .checks import check_comm, require_thread_multiple
from .ops import OPS, as_op, check_op_dtype, dtype_code
from .request import RoundRequest
from .slots import (DEVICE, HOST, BufRef, DataLock, RoundOutcomes, Slot,
                    as_ref, nanoseconds, op_param, op_priority, wait_seconds,
                    whole)

SUM = OPS["SUM"]

_C = _core.constants()
ALL, ANY, ATLEAST = _C["ALL"], _C["ANY"], _C["ATLEAST"]
KIND_NAMES = _C["kinds"]            # op kind code -> name, from the C core
_LIVE = weakref.WeakSet()          # every committed schedule, freed at exit


def _address(peer, tag, traffic_class):
    """A send's or receive's peer, tag and traffic class, checked (the peer
    against the communicator's size when the schedule is committed)."""
    return (whole(peer, "peer"), whole(tag, "tag"),
            whole(traffic_class, "traffic_class", 0, _C["NCLASS"] - 1))


class Schedule:
    """A graph of operations executed asynchronously by the C progress thread.

    Args:
        comm: mpi4py communicator the sends and receives use (default
            ``MPI.COMM_WORLD``).  Collectives give each schedule a duplicate;
            a hand-built schedule uses exactly the communicator it is given.
        persistent: re-arm automatically after every round.
        stamp_id: identity carried by stamped messages, the same on every
            rank; a stamped message with another id (left over from an
            earlier schedule on a communicator with the same context id) is
            dropped.  Collectives draw one at random per object.
        priority: the priority of every op added without one (a collective
            built at priority k puts all its messages there).
        reliable: a message the emulated network loses (told or silent)
            fails the round with :class:`TransportError` instead of ending
            its receive ``dropped``: for schedules that need every message
            (the library's allreduce and partial collectives set it).
            Default False: the receive's outcome says what happened.
    """

    def __init__(self, comm=None, persistent=False, stamp_id=0, priority=0,
                 reliable=False):
        require_thread_multiple()
        self.comm = check_comm(comm)
        self.persistent, self.reliable = bool(persistent), bool(reliable)
        self.stamp_id = int(stamp_id) & 0xFFFFFFFFFFFFFFFF
        self.priority = int(priority)
        self._ops = []          # dicts, in append order
        self._slots = []
        self._arrays = {}       # slot index -> array bound at build time
        self._sched = None
        self._freed = False
        self._backend = self._device_id = self._path = self._stream = None
        self._shadows = {}      # device slot index -> its pinned host Slot

    # -- building -------------------------------------------------------
    def buffer(self, array=None, *, dtype=None, size=None, writable=None,
               name=None, device=False):
        """Declare a buffer slot, optionally binding ``array`` to it now.

        A device array (CuPy) makes it a device slot; ``device=True`` declares
        an unbound device slot on the device of the schedule's other device
        buffers."""
        self._check_building()
        space = DEVICE if device else HOST
        if array is not None:
            backend = devices.backend_of(array)
            if backend is not None:
                arr = devices.flat(backend, array)
                self.use_device(backend, backend.device_id(array))
                space = DEVICE
            else:
                arr = np.asarray(array) if not isinstance(array, np.ndarray) \
                    else array
                if device:
                    raise ScheduleError("device=True needs a device array")
            dtype, size = arr.dtype, arr.size
            if writable is None:
                writable = bool(getattr(arr.flags, "writeable", True))
        if dtype is None or size is None:
            raise ScheduleError("buffer() needs an array or dtype= and size=")
        if space == DEVICE and self._backend is None:
            raise ScheduleError("device=True: the schedule has no device yet "
                                "(bind a device array first or call "
                                "use_device())")
        dtype_code(dtype)
        slot = Slot(len(self._slots), dtype, int(size),
                    True if writable is None else bool(writable),
                    name or f"b{len(self._slots)}", space)
        self._slots.append(slot)
        if array is not None:
            self._arrays[slot.index] = array
        return slot

    def use_device(self, backend, device_id):
        """Tie the schedule to one device (done by the first device buffer).
        Fixes how its device messages reach MPI (:func:`gpu_path`)."""
        self._check_building()
        if self._backend is None:
            self._backend, self._device_id = backend, device_id
            self._path, self._chunk = devices.gpu_path(), devices.chunk_bytes()
        elif (backend, device_id) != (self._backend, self._device_id):
            raise ScheduleError("a schedule's device buffers must all be on "
                                "one device")

    @property
    def gpu_path(self):
        """``"cuda-aware"`` or ``"staged"`` (None without device buffers)."""
        return self._path

    def _add(self, kind, after=(), mode=ALL, optional=False, stamped=False,
             a=None, b=None, op=None, peer=-1, tag=0, priority=None, need=None,
             locked=False, delivered=False, **extra):
        self._check_building()
        deps = [after] if isinstance(after, (int, np.integer)) else list(after)
        deps = list(dict.fromkeys(int(d) if isinstance(d, np.integer) else d
                                  for d in deps))
        for d in deps:
            if not isinstance(d, (int, np.integer)) or not 0 <= d < len(self._ops):
                raise ScheduleError(f"dependency {d!r} is not an op of this "
                                    "schedule (ops can only depend on earlier ops)")
        if need is not None:
            if not 1 <= need <= len(deps):
                raise ScheduleError(f"need={need} but the op has {len(deps)} "
                                    "dependencies")
            mode = ATLEAST
        elif mode not in (ALL, ANY):
            raise ScheduleError("mode must be partialcoll.ALL or partialcoll.ANY")
        if a is not None and b is not None and a.count != b.count:
            raise ScheduleError(f"{a} and {b} have different lengths")
        if a is not None and b is not None and a.slot.dtype != b.slot.dtype:
            raise ScheduleError(f"{a} and {b} have different dtypes")
        if kind == _C["REDUCE"] and a.slot.space != b.slot.space:
            raise ScheduleError(f"a reduction cannot mix host and device "
                                f"buffers ({a} and {b})")
        priority, prio_param = op_priority(self.priority if priority is None
                                         else priority)
        for ref in (a, b, extra.get("param"), prio_param):
            if ref is not None and (ref.slot.index >= len(self._slots) or
                                    self._slots[ref.slot.index] is not ref.slot):
                raise ScheduleError(f"{ref} is a buffer of another schedule")
        self._ops.append(dict(kind=kind, deps=[int(d) for d in deps], mode=mode,
                              optional=optional, stamped=stamped, a=a, b=b,
                              op=op, peer=int(peer), tag=int(tag),
                              priority=priority, prio_param=prio_param,
                              need=need or 0,
                              locked=locked, delivered=bool(delivered),
                              **extra))
        return len(self._ops) - 1

    def nop(self, after=(), mode=ALL, optional=False, need=None, locked=False,
            delivered=False):
        """A no-op: completes as soon as its dependencies allow (all of them,
        any of them, or ``need`` of them).  ``delivered=True`` counts only
        inputs that were delivered (see :meth:`recv`); when too many failed
        for ``need`` to be reached the op ends ``SKIPPED``."""
        return self._add(_C["NOP"], after, mode, optional, need=need,
                         locked=locked, delivered=delivered)

    def trigger(self, optional=False):
        """A NOP that only :meth:`fire` completes (the internal activation)."""
        return self._add(_C["TRIGGER"], (), ALL, optional)

    def send(self, buf=None, peer=0, tag=0, *, after=(), mode=ALL,
             optional=False, stamped=False, priority=None, order=None,
             traffic_class=0, delivered=False):
        """Send ``buf`` (a slot or slot[a:b]) to ``peer``.

        ``stamped=True`` sends no data, only the round number (activation
        messages).  ``priority``: ready ops start lowest number first, and
        when a cap on sends in flight per destination is set
        (:func:`partialcoll.set_send_cap`) queued sends leave lowest number
        first; an int, or an int64 ``slot[i:i+1]`` read each time the op
        becomes ready (any op takes one).  ``order=k`` (an int, or a
        one-element int64 ``slot[i:i+1]`` read each round): the send leaves
        only after this schedule released k earlier ordered sends to
        ``peer`` in the round (a counter gate; number them 0..n-1 per peer).
        ``traffic_class`` picks the emulated network's drop probability
        (:mod:`partialcoll.transport.network`)."""
        a = None if stamped else as_ref(buf)
        peer, tag, traffic_class = _address(peer, tag, traffic_class)
        order, param = op_param(order, np.int64, "order")
        if stamped and (order >= 0 or param is not None):
            raise ScheduleError("a stamped send cannot have an order")
        if a is not None and a.slot.device and self._path == "staged":
            return self._staged(a, True, peer, tag, after, mode, optional,
                                priority, order=order, param=param,
                                tclass=traffic_class)
        return self._add(_C["SEND"], after, mode, optional, stamped, a=a,
                         peer=peer, tag=tag, priority=priority, order=order,
                         param=param, tclass=traffic_class,
                         delivered=delivered)

    def recv(self, buf=None, peer=0, tag=0, *, after=(), mode=ALL,
             optional=False, stamped=False, priority=None, timeout=None,
             traffic_class=0, delivered=False):
        """Receive into ``buf`` from ``peer``.  A stamped receive has no
        dependencies and stays posted for the life of the schedule.

        A receive ends ``DELIVERED``, ``DROPPED`` (the emulated network
        says the message was lost) or ``TIMEDOUT``: ``timeout`` seconds
        after it became ready (default: never).  A reduce, copy or scale
        that depends directly on a receive that was not delivered does
        nothing.  A message that arrives after its receive timed out is
        discarded (``stats["late"]``), never taken by a later round."""
        a = None if stamped else as_ref(buf)
        peer, tag, traffic_class = _address(peer, tag, traffic_class)
        if stamped and after:
            raise ScheduleError("a stamped receive cannot have dependencies")
        if stamped and timeout is not None:
            raise ScheduleError("a stamped receive cannot time out")
        if a is not None and not a.slot.writable:
            raise ScheduleError(f"receive buffer {a} is read-only")
        t = -1 if timeout is None else nanoseconds(timeout, "timeout")
        if a is not None and a.slot.device and self._path == "staged":
            return self._staged(a, False, peer, tag, after, mode, optional,
                                priority, timeout=t, tclass=traffic_class)
        return self._add(_C["RECV"], after, mode, optional, stamped, a=a,
                         peer=peer, tag=tag, priority=priority, timeout=t,
                         tclass=traffic_class, delivered=delivered)

    def delay(self, seconds, *, after=(), mode=ALL, optional=False, need=None,
              delivered=False, priority=None):
        """Completes ``seconds`` after it becomes ready, using no CPU (the
        progress thread sleeps until the earliest deadline): stands in for
        compute.  ``seconds`` is a number, or a one-element float64
        ``slot[i:i+1]`` read when the op becomes ready (a different length
        each round)."""
        value, param = op_param(seconds, np.float64, "seconds")
        return self._add(_C["DELAY"], after, mode, optional, need=need,
                         value=value, param=param, delivered=delivered,
                         priority=priority)

    def start_at(self, when, *, after=(), mode=ALL, optional=False, need=None,
                 delivered=False, priority=None):
        """Completes at the absolute time ``when`` on the executor's clock
        (:func:`partialcoll.now`, the same on every process of a host), or
        at once if that time has passed.  ``when``: a number or a
        one-element float64 ``slot[i:i+1]`` read when the op becomes
        ready."""
        value, param = op_param(when, np.float64, "when")
        return self._add(_C["START_AT"], after, mode, optional, need=need,
                         value=value, param=param, delivered=delivered,
                         priority=priority)

    def gate(self, *, after=(), mode=ALL, optional=False, need=None,
             delivered=False, priority=None):
        """An op that becomes ready by its dependencies but completes only
        when the application opens it: ``op, rnd = s.wait_gate()`` returns
        the next ready gate (blocking, no polling), ``s.open_gate(op, rnd)``
        completes it (e.g. a parameter server applying an update between a
        receive and the next send)."""
        return self._add(_C["GATE"], after, mode, optional, need=need,
                         delivered=delivered, priority=priority)

    def scale(self, buf, count_of, add=0, *, after=(), mode=ALL,
              optional=False, need=None, locked=False, delivered=False):
        """``buf /= (delivered inputs of op count_of this round + add)``:
        averaging over the messages that arrived (float and complex
        buffers).  Does nothing when the divisor is 0."""
        a = as_ref(buf)
        if a.slot.dtype.kind not in "fc":
            raise ScheduleError(f"scale needs a float or complex buffer, {a} "
                                f"is {a.slot.dtype}")
        if not a.slot.writable:
            raise ScheduleError(f"scale target {a} is read-only")
        if not isinstance(count_of, (int, np.integer)) or \
                not 0 <= count_of < len(self._ops):
            raise ScheduleError(f"count_of={count_of!r} is not an op of this "
                                "schedule")
        return self._add(_C["SCALE"], after, mode, optional, a=a, need=need,
                         locked=locked, ref=int(count_of), add=int(add),
                         delivered=delivered)

    def _staged(self, ref, sending, peer, tag, after, mode, optional,
                priority, **extra):
        """A device message through pinned host memory: the slot's host
        mirror takes the same element range.  Cut into pieces, each copied
        (device -> host, then sent; or received, then host -> device) on its
        own, so copying one piece overlaps moving another.  The pieces share
        peer and tag: the executor posts them in order on both sides.
        Returns the op that completes the whole message."""
        host = self._shadows.get(ref.slot.index)
        if host is None:
            host = Slot(len(self._slots), ref.slot.dtype, ref.slot.size, True,
                        f"{ref.slot.name}@host")
            self._slots.append(host)
            self._shadows[ref.slot.index] = host
        step = max(1, self._chunk // ref.slot.dtype.itemsize)
        ends = []
        for lo in range(ref.start, ref.start + max(ref.count, 1), step):
            n = min(step, ref.start + ref.count - lo)
            dev, hst = BufRef(ref.slot, lo, n), BufRef(host, lo, n)
            if sending:
                c = self._add(_C["COPY"], after, mode, optional, a=hst, b=dev)
                ends.append(self._add(_C["SEND"], [c], ALL, optional, a=hst,
                                      peer=peer, tag=tag, priority=priority,
                                      **extra))
            else:
                r = self._add(_C["RECV"], after, mode, optional, a=hst,
                              peer=peer, tag=tag, priority=priority, **extra)
                ends.append(self._add(_C["COPY"], [r], ALL, optional, a=dev,
                                      b=hst))
        if len(ends) == 1:
            return ends[0]
        return self._add(_C["NOP"], ends, ALL, optional)

    def reduce(self, dst, src, op=SUM, *, after=(), mode=ALL, optional=False,
               need=None, locked=False):
        """``dst = dst op src`` elementwise, on the executing thread."""
        op = as_op(op)
        dst, src = as_ref(dst), as_ref(src)
        check_op_dtype(op, dst.slot.dtype)
        if not dst.slot.writable:
            raise ScheduleError(f"reduction target {dst} is read-only")
        if dst.slot is src.slot and dst.start < src.start + src.count and \
                src.start < dst.start + dst.count:
            raise ScheduleError(f"a reduction's buffers must not overlap "
                                f"({dst} and {src}): copy the source first")
        return self._add(_C["REDUCE"], after, mode, optional, a=dst, b=src,
                         op=op, need=need, locked=locked)

    def copy(self, dst, src, *, after=(), mode=ALL, optional=False, need=None,
             locked=False):
        """``dst = src``."""
        dst, src = as_ref(dst), as_ref(src)
        if not dst.slot.writable:
            raise ScheduleError(f"copy target {dst} is read-only")
        return self._add(_C["COPY"], after, mode, optional, a=dst, b=src,
                         need=need, locked=locked)

    def fence(self, after=(), mode=ALL, optional=False):
        """Completes once every device op queued before it has run (at once
        in a schedule without device buffers)."""
        return self._add(_C["FENCE"], after, mode, optional)

    def __len__(self):
        return len(self._ops)

    # -- commit / bind / post -------------------------------------------
    def commit(self):
        """Validate the graph and hand it to the C core (done by post())."""
        if self._sched is not None:
            return self
        self._check_building()
        desc, deps = descriptors.pack(self._ops)
        self._sched = _core.Sched(desc, deps, len(self._slots),
                                  MPI._addressof(self.comm), self.persistent,
                                  self.comm, self.stamp_id)
        if self.reliable:
            self._sched.set_reliable(True)
        self._lock = DataLock(self._sched)
        _LIVE.add(self)
        be = self._backend
        if be is not None:
            self._stream = be.new_stream(self._device_id)
            self._sched.set_device(be.code, be.context(self._device_id),
                                   be.stream_ptr(self._stream),
                                   be.kernels(self._device_id))
            for host in self._shadows.values():
                self._arrays[host.index] = be.pinned(host.size, host.dtype)
        for index, arr in self._arrays.items():
            self.bind(self._slots[index], arr)
        return self

    def bind(self, slot, array, keep=True):
        """Bind ``array`` (C-contiguous, right dtype and size) to ``slot``.
        ``keep=False``: the schedule keeps no reference to a device array
        (it holds its address only; the caller keeps it alive until the
        round is over)."""
        slot = slot if isinstance(slot, Slot) else self._slots[slot]
        backend = devices.backend_of(array)
        if slot.device or backend is not None:
            return self._bind_device(slot, array, backend, keep)
        arr = array if isinstance(array, np.ndarray) else np.asarray(array)
        if arr.dtype != slot.dtype or arr.size < slot.size:
            raise ScheduleError(f"{slot} cannot take a {arr.dtype}[{arr.size}] "
                                "buffer")
        if slot.writable and not arr.flags.writeable:
            raise ScheduleError(f"{slot} is written to but the buffer is "
                                "read-only")
        self.commit()._core_sched().bind(slot.index, arr, slot.writable)
        if keep:
            self._arrays[slot.index] = array

    def unbind(self, slot):
        """Forget the array bound to ``slot`` (between rounds), so the
        schedule no longer keeps it alive."""
        slot = slot if isinstance(slot, Slot) else self._slots[slot]
        self._core_sched().unbind(slot.index)
        self._arrays.pop(slot.index, None)

    def _bind_device(self, slot, array, backend, keep=True):
        if not slot.device:
            raise ScheduleError(f"{slot} is host memory; got a device array")
        if backend is not self._backend or \
                backend.device_id(array) != self._device_id:
            raise ScheduleError(f"{slot} is device memory of this schedule's "
                                f"device; got {type(array).__name__}")
        arr = devices.flat(backend, array)
        if arr.dtype != slot.dtype or arr.size < slot.size:
            raise ScheduleError(f"{slot} cannot take a {arr.dtype}[{arr.size}] "
                                "buffer")
        self.commit()._core_sched().bind_ptr(slot.index, backend.ptr(arr),
                                             arr.nbytes, slot.writable, DEVICE)
        if keep:
            self._arrays[slot.index] = array

    def set_tag_base(self, base):
        """Offset the tag of every message that is not round-stamped by
        ``base`` in the rounds posted from now on (call it between
        rounds): one committed schedule then serves calls that each take a
        fresh block of tags (the library's one-shot collectives)."""
        self.commit()._core_sched().set_tag_base(whole(base, "tag base"))

    def run(self, first, second, tag_base=0):
        """One round of a non-persistent schedule with host array
        ``first`` bound to slot 0 and ``second`` to slot 1, its tags offset
        by ``tag_base``: bind, post, wait and give both buffers back, in
        one call into the C core (the library's blocking allreduce, whose
        slots 0 and 1 are its input and output)."""
        self.commit()._core_sched().run(first, second,
                                        whole(tag_base, "tag base"))

    def runner(self):
        """:meth:`run` as a bare callable ``run(first, second, tag_base)``
        of the committed schedule, for a hot path that has checked its
        arguments once (it skips :meth:`run`'s checks in Python; the C
        core still refuses a busy schedule and buffers that do not fit)."""
        return self.commit()._core_sched().run

    def post(self):
        """Start one round (or, for a persistent schedule, the endless series
        of rounds).  Returns a :class:`Request` for that round.  With device
        buffers, the round's device work follows what the caller queued on
        its current stream before the call."""
        core = self.commit()._core_sched()
        if self._backend is not None:
            self._backend.wait_for_caller(self._stream)
        return RoundRequest(self, core.post())

    def fire(self, trigger, round=None):
        """Fire a trigger op: banked when ``round`` is None, else only for
        that round (discarded if the round is over)."""
        self._core_sched().fire(
            int(trigger), -1 if round is None else
            whole(round, "round", 0, 2**63 - 1))

    def wait(self, round=None, timeout=None):
        """Wait until round number ``round`` (0-based) has completed; the
        default is the last posted round.  Returns the rounds completed."""
        s = self._core_sched()
        upto = s.posted if round is None else \
            whole(round, "round", 0, 2**63 - 2) + 1
        return s.wait(upto, wait_seconds(timeout))

    def test(self, round=None):
        s = self._core_sched()
        return s.test(s.posted if round is None else int(round) + 1)

    def data_lock(self):
        """Context manager holding the data lock that ``locked`` ops take."""
        self._core_sched()
        return self._lock

    def outcomes(self):
        """A :class:`~partialcoll.core.slots.RoundOutcomes` for the last
        completed round."""
        rnd, oc, nok, t, t_arrive, t_wire = self._core_sched().outcomes()
        return RoundOutcomes(rnd, np.frombuffer(oc, np.uint8),
                             np.frombuffer(nok, np.int32),
                             np.frombuffer(t, np.float64),
                             np.frombuffer(t_arrive, np.float64),
                             np.frombuffer(t_wire, np.float64))

    def wait_gate(self, timeout=None):
        """Block (GIL released, no polling) until a :meth:`gate` op of this
        schedule is ready; returns ``(op, round)``.  Raises WaitTimeout."""
        return self._core_sched().wait_gate(wait_seconds(timeout))

    def open_gate(self, op, round):
        """Complete gate op ``op`` of round ``round`` (from wait_gate)."""
        self._core_sched().open_gate(int(op), int(round))

    @property
    def sends_left(self):
        """Sends of this schedule handed to the wire and not complete yet
        (a send completes once its receiver, or a discard receive, took
        it)."""
        return self._core_sched().sends_left

    @property
    def serial(self):
        """Process-local id of the committed schedule (timeline events)."""
        return self._core_sched().serial

    @property
    def rounds(self):
        """Number of rounds completed so far (monotonic)."""
        return self._core_sched().done

    @property
    def posted(self):
        """How many rounds were posted so far (1 for a persistent
        schedule)."""
        return self._core_sched().posted

    @property
    def idle(self):
        """True when every posted round has completed (it may be bound and
        posted again)."""
        core = self._core_sched()
        return core.posted == core.done

    @property
    def busy(self):
        """True while a round is in flight or about to start (the progress
        thread is given one sweep first)."""
        return self._core_sched().busy

    @property
    def stats(self):
        """A dict of the counters since commit.

        ``stale`` (a stamped message or fire whose round is over), ``surplus`` (an op's input beyond what fired it),
        ``dropped`` and ``timedout`` (receive outcomes), ``late`` (messages
        that came after their receive timed out, discarded), ``swallowed``
        (silently lost messages whose receive then timed out).  Stamped
        messages for a schedule that does not exist here are counted by
        :func:`partialcoll.engine_stats` (``unclaimed``, ``foreign``)."""
        return self._core_sched().stats

    @property
    def device_stats(self):
        """Bytes copied host->device (``h2d``), device->host (``d2h``),
        ``d2d`` and ``h2h`` by device-queue copies, and device
        ``reductions`` queued, since the schedule was committed."""
        return self._core_sched().device_stats

    @property
    def stream(self):
        """The schedule's own CUDA stream (None without device buffers)."""
        return self._stream

    def free(self):
        """Cancel pending receives and release the schedule.  Idempotent."""
        if self._sched is not None:
            self._sched.free()
            self._sched = None
        self._freed = True
        self._arrays.clear()
        self._stream = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def _core_sched(self):
        if self._freed:
            raise ScheduleFreedError("the schedule has been freed")
        if self._sched is None:
            raise ScheduleError("the schedule is not committed; call post()")
        return self._sched

    def _check_building(self):
        if self._freed:
            raise ScheduleFreedError("the schedule has been freed")
        if self._sched is not None:
            raise ScheduleError("the schedule is committed; no more ops")

    # -- looking at it ----------------------------------------------------
    def to_dot(self, name="schedule"):
        """The graph in Graphviz DOT.  Dashed boxes fire on ANY input; grey
        ones are optional; edges point from predecessor to successor."""
        from .dot import to_dot
        return to_dot(self._ops, KIND_NAMES, ALL, name)


@libcomm.register("free_at_exit")
def free_all():
    """Free every live schedule (at interpreter exit, after the higher
    modules' exit hooks)."""
    for sched in list(_LIVE):
        sched.free()
