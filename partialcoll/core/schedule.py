"""The public schedule API: build a graph of operations, commit it, post it.

A :class:`Schedule` is a DAG of operations (send, recv, reduce, copy, NOP and
application triggers) executed in *rounds* by the C progress thread; see
``csrc/sched/pc_sched.h`` for the exact semantics.  In short:

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
* ``callback(name, a, b, arg)`` calls a C function an extension registered
  (never Python: the progress thread does not hold the GIL), once a round.
* ``locked=True`` (nop, reduce, copy, scale, callback) runs under the
  schedule's data lock, a chain of such ops inside one hold; ``with
  sched.data_lock():`` takes the same lock, so the application can
  deposit into or read from buffers the schedule touches while it runs.
* Device buffers (CuPy arrays): reduce and copy ops on them run on the GPU,
  on the schedule's own stream, which waits for the caller's stream at every
  post.  Sends and receives of device memory go to a CUDA-aware MPI
  directly, or are staged through pinned host memory by copy ops the
  schedule adds itself (see :func:`partialcoll.gpu_path`).  ``fence()``
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
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .. import _core
from . import descriptors, devices, libcomm
from .buffers import Buffer
from .checks import check_comm, require_thread_multiple
from .errors import ScheduleError, ScheduleFreedError
from .graph import ALL, ANY, KIND_NAMES, GraphBuilder
from .request import RoundRequest
from .slots import DEVICE, DataLock, RoundOutcomes, Slot, wait_seconds, whole

__all__ = ["ALL", "ANY", "KIND_NAMES", "Schedule", "Slot", "free_all"]

# every committed schedule, freed at exit
_LIVE: weakref.WeakSet[Schedule] = weakref.WeakSet()


class Schedule(GraphBuilder):
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

    def __init__(self, comm: MPI.Comm | None = None, persistent: bool = False,
                 stamp_id: int = 0, priority: int = 0,
                 reliable: bool = False) -> None:
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

    def commit(self) -> Self:
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

    def bind(self, slot: Slot | int, array: Buffer, keep: bool = True) -> None:
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

    def unbind(self, slot: Slot | int) -> None:
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
                                f"device; got a {type(array).__name__} in "
                                f"{devices.place_of(array)}")
        arr = devices.flat(backend, array)
        if arr.dtype != slot.dtype or arr.size < slot.size:
            raise ScheduleError(f"{slot} cannot take a {arr.dtype}[{arr.size}] "
                                "buffer")
        self.commit()._core_sched().bind_ptr(slot.index, backend.ptr(arr),
                                             arr.nbytes, slot.writable, DEVICE)
        if keep:
            self._arrays[slot.index] = array

    def set_tag_base(self, base: int) -> None:
        """Offset the tag of every message that is not round-stamped by
        ``base`` in the rounds posted from now on (call it between
        rounds): one committed schedule then serves calls that each take a
        fresh block of tags (the library's one-shot collectives)."""
        self.commit()._core_sched().set_tag_base(whole(base, "tag base"))

    def run(self, first: npt.NDArray[Any], second: npt.NDArray[Any],
            tag_base: int = 0) -> None:
        """One round of a non-persistent schedule with host array
        ``first`` bound to slot 0 and ``second`` to slot 1, its tags offset
        by ``tag_base``: bind, post, wait and give both buffers back, in
        one call into the C core (the library's blocking allreduce, whose
        slots 0 and 1 are its input and output)."""
        self.commit()._core_sched().run(first, second,
                                        whole(tag_base, "tag base"))

    def runner(self) -> tuple[Callable[[Any, Any, int], None],
                              Callable[[], bool]]:
        """``(run, idle)``: :meth:`run` and the :attr:`idle` test as bare
        callables of a committed non-persistent schedule, for a hot path
        that has checked its arguments once (``run(first, second,
        tag_base)`` skips :meth:`run`'s checks in Python; the C core still
        refuses a busy schedule and buffers that do not fit; ``idle()``
        returns :attr:`idle`)."""
        core = self.commit()._core_sched()
        return core.run, core.idle

    def post(self) -> RoundRequest:
        """Start one round (or, for a persistent schedule, the endless series
        of rounds).  Returns a :class:`Request` for that round.  With device
        buffers, the round's device work follows what the caller queued on
        its current stream before the call."""
        core = self.commit()._core_sched()
        if self._backend is not None:
            self._backend.wait_for_caller(self._stream)
        return RoundRequest(self, core.post())

    def fire(self, trigger: int, round: int | None = None,
             wake: bool = True) -> None:
        """Fire a trigger op: banked when ``round`` is None, else only for
        that round (discarded if the round is over).  ``wake=False``: this
        thread calls :meth:`wait` for the round right away and runs it
        itself, so the progress thread is not woken for it (a wake-up and
        the hand-over between the threads cost more than a small round
        on a busy host)."""
        self._core_sched().fire(
            int(trigger), -1 if round is None else
            whole(round, "round", 0, 2**63 - 1), bool(wake))

    def wait(self, round: int | None = None,
             timeout: float | None = None) -> int:
        """Wait until round number ``round`` (0-based) has completed; the
        default is the last posted round.  Returns the rounds completed."""
        s = self._core_sched()
        upto = s.posted if round is None else \
            whole(round, "round", 0, 2**63 - 2) + 1
        return s.wait(upto, wait_seconds(timeout))

    def test(self, round: int | None = None) -> bool:
        s = self._core_sched()
        return s.test(s.posted if round is None else int(round) + 1)

    def c_object(self) -> Any:
        """The C core's object of this committed schedule, for the
        package's C extensions built on the executor's C API
        (``csrc/capi/pc_capi.h``: the data lock, fire, wait and the
        reductions, the calls this class makes).  Raises if freed."""
        return self._core_sched()

    def data_lock(self) -> DataLock:
        """Context manager holding the data lock that ``locked`` ops take."""
        self._core_sched()
        return self._lock

    def outcomes(self) -> RoundOutcomes:
        """A :class:`~partialcoll.core.slots.RoundOutcomes` for the last
        completed round."""
        rnd, oc, nok, t, t_arrive, t_wire = self._core_sched().outcomes()
        return RoundOutcomes(rnd, np.frombuffer(oc, np.uint8),
                             np.frombuffer(nok, np.int32),
                             np.frombuffer(t, np.float64),
                             np.frombuffer(t_arrive, np.float64),
                             np.frombuffer(t_wire, np.float64))

    def wait_gate(self, timeout: float | None = None) -> tuple[int, int]:
        """Block (GIL released, no polling) until a :meth:`~partialcoll.Schedule.gate` op of this
        schedule is ready; returns ``(op, round)``.  Raises WaitTimeout."""
        return self._core_sched().wait_gate(wait_seconds(timeout))

    def open_gate(self, op: int, round: int) -> None:
        """Complete gate op ``op`` of round ``round`` (from wait_gate)."""
        self._core_sched().open_gate(int(op), int(round))

    @property
    def sends_left(self) -> int:
        """Sends of this schedule handed to the wire and not complete yet
        (a send completes once its receiver, or a discard receive, took
        it)."""
        return self._core_sched().sends_left

    @property
    def serial(self) -> int:
        """Process-local id of the committed schedule (timeline events)."""
        return self._core_sched().serial

    @property
    def rounds(self) -> int:
        """Number of rounds completed so far (monotonic)."""
        return self._core_sched().done

    @property
    def posted(self) -> int:
        """How many rounds were posted so far (1 for a persistent
        schedule)."""
        return self._core_sched().posted

    @property
    def idle(self) -> bool:
        """True when every posted round has completed (it may be bound and
        posted again)."""
        core = self._core_sched()
        return core.posted == core.done

    @property
    def busy(self) -> bool:
        """True while a round is in flight or about to start (the progress
        thread is given one sweep first)."""
        return self._core_sched().busy

    @property
    def stats(self) -> dict[str, int]:
        """A dict of the counters since commit.

        ``stale`` (a stamped message or fire whose round is over), ``surplus`` (an op's input beyond what fired it),
        ``dropped`` and ``timedout`` (receive outcomes), ``late`` (messages
        that came after their receive timed out, discarded), ``swallowed``
        (silently lost messages whose receive then timed out).  Stamped
        messages for a schedule that does not exist here are counted by
        :func:`partialcoll.engine_stats` (``unclaimed``, ``foreign``)."""
        return self._core_sched().stats

    @property
    def device_stats(self) -> dict[str, int]:
        """Bytes copied host->device (``h2d``), device->host (``d2h``),
        ``d2d`` and ``h2h`` by device-queue copies, and device
        ``reductions`` queued, since the schedule was committed."""
        return self._core_sched().device_stats

    @property
    def stream(self) -> Any:
        """The schedule's own CUDA stream (None without device buffers)."""
        return self._stream

    def free(self) -> None:
        """Cancel pending receives and release the schedule.  Idempotent."""
        if self._sched is not None:
            self._sched.free()
            self._sched = None
        self._freed = True
        self._arrays.clear()
        self._stream = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def _core_sched(self) -> _core.Sched:
        if self._freed:
            raise ScheduleFreedError("the schedule has been freed")
        if self._sched is None:
            raise ScheduleError("the schedule is not committed; call post()")
        return self._sched

@libcomm.register("free_at_exit")
def free_all() -> None:
    """Free every live schedule (at interpreter exit, after the higher
    modules' exit hooks)."""
    for sched in list(_LIVE):
        sched.free()
