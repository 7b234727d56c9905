"""Buffer slots, op parameters and round outcomes of a schedule, and the
checks of the values ops take (:mod:`.schedule` builds on them)."""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .errors import ArgumentTypeError, ScheduleError
from .checks import check_int

_C = _core.constants()
HOST, DEVICE = _C["HOST"], _C["DEVICE"]
#: how an op ended in a round (Schedule.outcomes)
OUTCOMES = {_C["OC_NONE"]: "none", _C["OC_OK"]: "ok",
            _C["OC_DROPPED"]: "dropped", _C["OC_TIMEDOUT"]: "timedout",
            _C["OC_SKIPPED"]: "skipped"}

class Slot:
    """A named buffer of a schedule.  ``slot[a:b]`` selects elements."""

    index: int
    dtype: np.dtype[Any]
    size: int
    writable: bool
    name: str
    space: int

    def __init__(self, index: int, dtype: npt.DTypeLike, size: int,
                 writable: bool, name: str, space: int = HOST) -> None:
        self.index, self.dtype, self.size = index, np.dtype(dtype), size
        self.writable, self.name, self.space = writable, name, space

    @property
    def device(self) -> bool:
        """True when the slot holds device (GPU) memory."""
        return self.space == DEVICE

    def __getitem__(self, key: slice) -> BufRef:
        if not isinstance(key, slice):
            raise ArgumentTypeError(f"select buffer elements with "
                                    f"slot[a:b], not slot[{key!r}]")
        if key.step not in (None, 1):
            raise ScheduleError(f"select buffer elements with slot[a:b]: "
                                f"no step ({key.step!r})")
        start, stop, _ = key.indices(self.size)
        return BufRef(self, start, max(stop - start, 0))

    def __repr__(self) -> str:
        where = " (device)" if self.device else ""
        return f"<Slot {self.name} {self.dtype}[{self.size}]{where}>"


class BufRef:
    """``count`` elements of a slot starting at element ``start``."""

    def __init__(self, slot: Slot, start: int, count: int) -> None:
        self.slot, self.start, self.count = slot, start, count

    def __repr__(self) -> str:
        return f"{self.slot.name}[{self.start}:{self.start + self.count}]"


def as_ref(buf: object) -> BufRef:
    """``buf`` (a Slot, or ``slot[a:b]``) as a :class:`BufRef`."""
    if isinstance(buf, Slot):
        return BufRef(buf, 0, buf.size)
    if isinstance(buf, BufRef):
        return buf
    raise ArgumentTypeError(f"expected a Slot (from Schedule.buffer()) or "
                            f"slot[a:b], got {type(buf).__name__}")


def whole(value: int, what: str, lo: int = 0,
          hi: int = 2**31 - 1) -> int:
    """``value`` as an int in [lo, hi] (the C core keeps it in a C int),
    or a clear ScheduleError."""
    return check_int(value, what, lo, hi)


def wait_seconds(timeout: float | None) -> float:
    """A wait's timeout for the C core: None (or inf) waits for ever (-1);
    otherwise a number of seconds >= 0."""
    if timeout is None:
        return -1.0
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"timeout must be None or a number of "
                                f"seconds, got {timeout!r}") from None
    if not t >= 0:                       # negative or NaN
        raise ScheduleError(f"timeout must be None or >= 0 seconds, got "
                            f"{timeout!r}")
    return -1.0 if t == float("inf") else t


def nanoseconds(seconds: float, what: str) -> int:
    """A duration for the C core: ``seconds`` (>= 0, at most 1e9) in
    nanoseconds, or a ScheduleError naming ``what``."""
    try:
        t = float(seconds)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{what} must be a number of seconds, got "
                                f"{seconds!r}") from None
    if not t >= 0 or t > 1e9:
        raise ScheduleError(f"{what} must be >= 0 seconds, got {seconds!r}")
    return int(round(t * 1e9))


def op_param(value: float | Slot | BufRef | None, dtype: type[np.generic],
             what: str) -> tuple[int, BufRef | None]:
    """An op parameter: a constant, or one element of a slot read each time
    the op becomes ready.  Returns (constant or -1/0, BufRef or None)."""
    if value is None:
        return -1, None
    if isinstance(value, (Slot, BufRef)):
        ref = as_ref(value)
        if ref.count != 1 or ref.slot.dtype != np.dtype(dtype) or \
                ref.slot.device:
            raise ScheduleError(f"{what} from a buffer takes one host "
                                f"{np.dtype(dtype)} element, e.g. slot[i:i+1]")
        return (0 if dtype is np.float64 else -1), ref
    if dtype is np.float64:
        if not isinstance(value, (int, float, np.integer, np.floating)) \
                or isinstance(value, bool):
            raise ArgumentTypeError(f"{what} must be a number or "
                                    f"slot[i:i+1], got {value!r}")
        v = float(value)
        if not abs(v) <= 1e9 or (what == "seconds" and v < 0):
            raise ScheduleError(f"{what} must be a finite number of seconds"
                                f"{' >= 0' if what == 'seconds' else ''} "
                                f"(at most 1e9), got {value!r}")
        return int(round(v * 1e9)), None
    if not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{what} must be an int >= 0 or "
                                f"slot[i:i+1], got {value!r}")
    if value < 0:
        raise ScheduleError(f"{what} must be an int >= 0 or slot[i:i+1], "
                            f"got {value!r}")
    return int(value), None


def op_priority(value: int | Slot | BufRef
                ) -> tuple[int, BufRef | None]:
    """An op's priority: an int, or one int64 element of a slot read each
    time the op becomes ready (a different start order every round).
    Returns (constant, BufRef or None)."""
    if isinstance(value, (Slot, BufRef)):
        ref = as_ref(value)
        if ref.count != 1 or ref.slot.dtype != np.dtype(np.int64) or \
                ref.slot.device:
            raise ScheduleError("priority from a buffer takes one host int64 "
                                "element, e.g. slot[i:i+1]")
        return 0, ref
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ArgumentTypeError(f"priority must be an int or slot[i:i+1], "
                                f"got {value!r}")
    return whole(value, "priority", -2**31, 2**31 - 1), None


class RoundOutcomes:
    """How every op of a schedule ended in its last completed round.

    Attributes: ``round`` (-1 before the first), ``outcome`` (uint8 per op;
    :meth:`name` spells one out), ``delivered`` (int32 per op: inputs that were
    delivered, e.g. how many blocks arrived at a NOP joining receives),
    ``t_done`` (float64 per op: when a send, receive, timed op, gate or
    fence completed, on the executor's clock :func:`partialcoll.now`; 0 for
    local ops and ops that did not run) and ``t_arrive`` (float64 per op:
    for a receive that took a message, delivered or dropped, when the
    message arrived by the transport's account, on the same clock; 0 for
    other ops).  On the emulated network ``t_arrive`` is the model's
    arrival time (last byte off the wire, plus the latency), which a busy
    host's late progress thread does not shift, the way a NIC's hardware
    receive timestamp is not; ``t_done`` is when this rank noticed.  Over
    plain MPI, which gives no arrival time, ``t_arrive`` equals ``t_done``.
    ``t_wire`` (float64 per op): on the emulated network, for such a
    receive, when the message's first byte went on the sender's wire (after
    any wait behind earlier messages of its channel); 0 elsewhere.  Time a
    link with ``t_arrive`` (and, where it is not 0, ``t_wire``: ``t_arrive -
    t_wire`` is the message's time on the wire plus the latency)."""

    def __init__(self, round: int, outcome: npt.NDArray[np.uint8],
                 delivered: npt.NDArray[np.int32],
                 t_done: npt.NDArray[np.float64] | None = None,
                 t_arrive: npt.NDArray[np.float64] | None = None,
                 t_wire: npt.NDArray[np.float64] | None = None) -> None:
        self.round, self.outcome, self.delivered = round, outcome, delivered
        self.t_done, self.t_arrive, self.t_wire = t_done, t_arrive, t_wire

    def name(self, op: int) -> str:
        """'ok', 'dropped', 'timedout', 'skipped' or 'none' for op."""
        return OUTCOMES[int(self.outcome[op])]

    def __repr__(self) -> str:
        names = [OUTCOMES[int(x)] for x in self.outcome]
        counts = {n: names.count(n) for n in sorted(set(names))}
        return f"RoundOutcomes(round={self.round}, {counts})"


class DataLock:
    """Context manager of a schedule's data lock (the lock that
    ``locked=True`` ops take): ``with sched.data_lock(): ...``."""

    def __init__(self, core: _core.Sched) -> None:
        self._core = core

    def __enter__(self) -> None:
        self._core.lock()

    def __exit__(self, *exc: object) -> None:
        self._core.unlock()
