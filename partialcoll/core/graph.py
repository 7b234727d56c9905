"""The building half of :class:`~.schedule.Schedule`: buffer slots and the
ops added to a schedule before it is committed (the semantics of every op
kind are in :mod:`.schedule`'s docstring and the C core's header)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .. import _core
from . import devices
from .errors import (ArgumentTypeError, ScheduleError,
                     ScheduleFreedError)
from .buffers import Buffer
from .ops import OPS, OpLike, as_op, check_op_dtype, dtype_code
from .slots import (DEVICE, HOST, BufRef, Slot, as_ref, nanoseconds,
                    op_param, op_priority, whole)

SUM = OPS["SUM"]
_C = _core.constants()
ALL, ANY, ATLEAST = _C["ALL"], _C["ANY"], _C["ATLEAST"]
KIND_NAMES = _C["kinds"]            # op kind code -> name, from the C core

#: the most data bytes a round-stamped message carries
STAMP_DATA_MAX = _C["STAMP_DATA_MAX"]

#: an op's dependencies: one op (the int an op method returns) or several
After: TypeAlias = int | Iterable[int]
#: an op's buffer operand: a slot, or ``slot[a:b]``
Operand: TypeAlias = Slot | BufRef
#: an int parameter of an op, or one int64 ``slot[i:i+1]`` read each round
IntParam: TypeAlias = int | Slot | BufRef


def _address(peer, tag, traffic_class):
    """A send's or receive's peer, tag and traffic class, checked (the peer
    against the communicator's size when the schedule is committed)."""
    return (whole(peer, "peer"), whole(tag, "tag"),
            whole(traffic_class, "traffic_class", 0, _C["NCLASS"] - 1))


def _stamped_ref(buf):
    """The data a stamped send or receive carries: None (only the round
    number), or ``buf`` checked: host memory, and no more than
    :data:`STAMP_DATA_MAX` bytes."""
    if buf is None:
        return None
    a = as_ref(buf)
    nbytes = a.count * a.slot.dtype.itemsize
    if a.slot.device:
        raise ScheduleError(f"a stamped message carries host memory only, "
                            f"not {a}")
    if nbytes > STAMP_DATA_MAX:
        raise ScheduleError(f"a stamped message carries at most "
                            f"{STAMP_DATA_MAX} bytes, not {nbytes} ({a})")
    return a


class GraphBuilder:
    """Slots and ops of a schedule being built (see :class:`~.schedule.
    Schedule`, which adds committing and running it).  ``self._sched`` is
    the C handle once committed (None before); building then stops."""

    # set by Schedule.__init__ (and use_device)
    comm: MPI.Comm
    priority: int
    _ops: list[dict[str, Any]]
    _slots: list[Slot]
    _arrays: dict[int, Any]
    _sched: _core.Sched | None
    _freed: bool
    _backend: Any
    _device_id: int | None
    _path: str | None
    _chunk: int
    _shadows: dict[int, Slot]

    def buffer(self, array: Buffer = None, *,
               dtype: npt.DTypeLike | None = None, size: int | None = None,
               writable: bool | None = None, name: str | None = None,
               device: bool = False) -> Slot:
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

    def use_device(self, backend: Any, device_id: int) -> None:
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
    def gpu_path(self) -> str | None:
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
            if not isinstance(d, (int, np.integer)):
                raise ArgumentTypeError(f"dependency {d!r} must be an op "
                                        f"(the int an op method returns), "
                                        f"not {type(d).__name__}")
            if not 0 <= d < len(self._ops):
                raise ScheduleError(f"dependency {d!r} is not an op of this "
                                    "schedule (ops can only depend on "
                                    "earlier ops)")
        if need is not None:
            if not 1 <= need <= len(deps):
                raise ScheduleError(f"need={need} but the op has {len(deps)} "
                                    "dependencies")
            mode = ATLEAST
        elif mode not in (ALL, ANY):
            raise ScheduleError("mode must be partialcoll.ALL or partialcoll.ANY")
        same = a is not None and b is not None and kind != _C["CALLBACK"]
        if same and a.count != b.count and not extra.get("fill"):
            raise ScheduleError(f"{a} and {b} have different lengths")
        if same and a.slot.dtype != b.slot.dtype:
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

    def nop(self, after: After = (), mode: int = ALL, optional: bool = False,
            need: int | None = None, locked: bool = False,
            delivered: bool = False) -> int:
        """A no-op: completes as soon as its dependencies allow (all of them,
        any of them, or ``need`` of them).  ``delivered=True`` counts only
        inputs that were delivered (see :meth:`recv`); when too many failed
        for ``need`` to be reached the op ends ``SKIPPED``."""
        return self._add(_C["NOP"], after, mode, optional, need=need,
                         locked=locked, delivered=delivered)

    def trigger(self, optional: bool = False) -> int:
        """A NOP that only :meth:`fire` completes (the internal activation)."""
        return self._add(_C["TRIGGER"], (), ALL, optional)

    def send(self, buf: Operand | None = None, peer: int = 0, tag: int = 0, *,
             after: After = (), mode: int = ALL, optional: bool = False,
             stamped: bool = False, priority: IntParam | None = None,
             order: IntParam | None = None, traffic_class: int = 0,
             delivered: bool = False) -> int:
        """Send ``buf`` (a slot or slot[a:b]) to ``peer``.

        ``stamped=True`` sends the round number (activation messages) on
        the executor's control channel, and ``buf`` with it if given (host
        memory, at most ``STAMP_DATA_MAX`` (224) bytes), which a stamped
        receive of the same size takes.  ``priority``: ready ops start
        lowest number first, and when a cap on sends in flight per
        destination is set (:func:`partialcoll.set_send_cap`) queued sends
        leave lowest number first; an int, or an int64 ``slot[i:i+1]`` read
        each time the op becomes ready (any op takes one).  ``order=k``
        (an int, or a one-element int64 ``slot[i:i+1]`` read each round):
        the send leaves only after this schedule released k earlier
        ordered sends to ``peer`` in the round (a counter gate; number them
        0..n-1 per peer).
        ``traffic_class`` picks the emulated network's drop probability
        (:mod:`partialcoll.transport.network`)."""
        a = _stamped_ref(buf) if stamped else as_ref(buf)
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

    def recv(self, buf: Operand | None = None, peer: int = 0, tag: int = 0, *,
             after: After = (), mode: int = ALL, optional: bool = False,
             stamped: bool = False, priority: IntParam | None = None,
             timeout: float | None = None, traffic_class: int = 0,
             delivered: bool = False) -> int:
        """Receive into ``buf`` from ``peer``.  A stamped receive has no
        dependencies and stays posted for the life of the schedule; with a
        ``buf`` (host memory, at most ``STAMP_DATA_MAX`` (224) bytes) it
        takes the data of the peer's stamped send of the same round,
        written into ``buf`` as soon as the round has started and the
        message is there (so nothing else of the round may use ``buf``
        before the receive completes).

        A receive ends ``DELIVERED``, ``DROPPED`` (the emulated network
        says the message was lost) or ``TIMEDOUT``: ``timeout`` seconds
        after it became ready (default: never).  A reduce, copy or scale
        that depends directly on a receive that was not delivered does
        nothing.  A message that arrives after its receive timed out is
        discarded (``stats["late"]``), never taken by a later round."""
        a = _stamped_ref(buf) if stamped else as_ref(buf)
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

    def delay(self, seconds: float | Operand, *, after: After = (),
              mode: int = ALL, optional: bool = False,
              need: int | None = None, delivered: bool = False,
              priority: IntParam | None = None) -> int:
        """Completes ``seconds`` after it becomes ready, using no CPU (the
        progress thread sleeps until the earliest deadline): stands in for
        compute.  ``seconds`` is a number, or a one-element float64
        ``slot[i:i+1]`` read when the op becomes ready (a different length
        each round)."""
        value, param = op_param(seconds, np.float64, "seconds")
        return self._add(_C["DELAY"], after, mode, optional, need=need,
                         value=value, param=param, delivered=delivered,
                         priority=priority)

    def start_at(self, when: float | Operand, *, after: After = (),
                 mode: int = ALL, optional: bool = False,
                 need: int | None = None, delivered: bool = False,
                 priority: IntParam | None = None) -> int:
        """Completes at the absolute time ``when`` on the executor's clock
        (:func:`partialcoll.now`, the same on every process of a host), or
        at once if that time has passed.  ``when``: a number or a
        one-element float64 ``slot[i:i+1]`` read when the op becomes
        ready."""
        value, param = op_param(when, np.float64, "when")
        return self._add(_C["START_AT"], after, mode, optional, need=need,
                         value=value, param=param, delivered=delivered,
                         priority=priority)

    def gate(self, *, after: After = (), mode: int = ALL,
             optional: bool = False, need: int | None = None,
             delivered: bool = False,
             priority: IntParam | None = None) -> int:
        """An op that becomes ready by its dependencies but completes only
        when the application opens it: ``op, rnd = s.wait_gate()`` returns
        the next ready gate (blocking, no polling), ``s.open_gate(op, rnd)``
        completes it (e.g. a parameter server applying an update between a
        receive and the next send)."""
        return self._add(_C["GATE"], after, mode, optional, need=need,
                         delivered=delivered, priority=priority)

    def scale(self, buf: Operand, count_of: int, add: int = 0, *,
              after: After = (), mode: int = ALL, optional: bool = False,
              need: int | None = None, locked: bool = False,
              delivered: bool = False) -> int:
        """``buf /= (delivered inputs of op count_of this round + add)``:
        averaging over the messages that arrived (float and complex
        buffers).  Does nothing when the divisor is 0."""
        a = as_ref(buf)
        if a.slot.dtype.kind not in "fc":
            raise ScheduleError(f"scale needs a float or complex buffer, {a} "
                                f"is {a.slot.dtype}")
        if not a.slot.writable:
            raise ScheduleError(f"scale target {a} is read-only")
        if not isinstance(count_of, (int, np.integer)):
            raise ArgumentTypeError(f"count_of must be an op (the int an op "
                                    f"method returns), not "
                                    f"{type(count_of).__name__}")
        if not 0 <= count_of < len(self._ops):
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

    def reduce(self, dst: Operand, src: Operand, op: OpLike = SUM, *,
               after: After = (), mode: int = ALL, optional: bool = False,
               need: int | None = None, locked: bool = False) -> int:
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

    def copy(self, dst: Operand, src: Operand, *, after: After = (),
             mode: int = ALL, optional: bool = False,
             need: int | None = None, locked: bool = False) -> int:
        """``dst = src``."""
        dst, src = as_ref(dst), as_ref(src)
        if not dst.slot.writable:
            raise ScheduleError(f"copy target {dst} is read-only")
        return self._add(_C["COPY"], after, mode, optional, a=dst, b=src,
                         need=need, locked=locked)

    def fill(self, dst: Operand, value: Operand, *, after: After = (),
             mode: int = ALL, optional: bool = False,
             need: int | None = None, locked: bool = False) -> int:
        """Every element of ``dst`` set to the one element of ``value`` (a
        one-element slot range of the same dtype, read when the op runs):
        resetting a buffer to a reduction's identity without a buffer of
        identities to copy from.  Host buffers only."""
        dst, value = as_ref(dst), as_ref(value)
        if not dst.slot.writable:
            raise ScheduleError(f"fill target {dst} is read-only")
        if value.count != 1:
            raise ScheduleError(f"a fill's value must be one element, not "
                                f"{value.count} ({value})")
        if dst.slot.space != HOST or value.slot.space != HOST:
            raise ScheduleError(f"a fill needs host buffers ({dst} and "
                                f"{value})")
        return self._add(_C["COPY"], after, mode, optional, a=dst, b=value,
                         need=need, locked=locked, fill=True)

    def callback(self, name: str, a: Operand, b: Operand, arg: int = 0, *,
                 after: After = (), mode: int = ALL, optional: bool = False,
                 need: int | None = None, locked: bool = False) -> int:
        """A native function called once per round with ``a``, ``b`` (host
        buffers, slots or ranges of slots, of any dtypes and lengths; it
        may write both) and the int ``arg``.  ``name`` is the name a C
        extension registered the function under, through the executor's
        C API (``register_callback``): a Python callable cannot be one,
        since the progress thread never holds the GIL.  A collective
        folds many small steps into one op this way (the partial
        collectives' bookkeeping).  Like a reduce, it may be ``locked``
        and does nothing when a direct receive input was not delivered.
        It may decline (return ``PC_CAPI_DECLINE``): the op then ends
        skipped, so a successor made with ``delivered=True`` does not
        count it (a gate on a path, decided each round from what the
        function reads); an error it returns fails the schedule with its
        message."""
        if not isinstance(name, str):
            raise ArgumentTypeError(f"a callback's name must be a str, not "
                                    f"{type(name).__name__}")
        cid = _core.callback_id(name)
        if cid is None:
            raise ScheduleError(f"no native callback is registered as "
                                f"{name!r}")
        a, b = as_ref(a), as_ref(b)
        for ref in (a, b):
            if ref.slot.space != HOST:
                raise ScheduleError(f"a callback takes host buffers, not "
                                    f"{ref}")
            if not ref.slot.writable:
                raise ScheduleError(f"a callback may write {ref}, which is "
                                    f"read-only")
        return self._add(_C["CALLBACK"], after, mode, optional, a=a, b=b,
                         need=need, locked=locked, callback=cid, name=name,
                         arg=whole(arg, "arg", -2**63, 2**63 - 1))

    def fence(self, after: After = (), mode: int = ALL,
              optional: bool = False) -> int:
        """Completes once every device op queued before it has run (at once
        in a schedule without device buffers)."""
        return self._add(_C["FENCE"], after, mode, optional)

    def __len__(self) -> int:
        return len(self._ops)

    # -- commit / bind / post -------------------------------------------
    def _check_building(self):
        if self._freed:
            raise ScheduleFreedError("the schedule has been freed")
        if self._sched is not None:
            raise ScheduleError("the schedule is committed; no more ops")

    # -- looking at it ----------------------------------------------------
    def to_dot(self, name: str = "schedule") -> str:
        """The graph in Graphviz DOT.  Dashed boxes fire on ANY input; grey
        ones are optional; edges point from predecessor to successor."""
        from .dot import to_dot
        return to_dot(self._ops, KIND_NAMES, ALL, name)
