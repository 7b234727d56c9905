"""The progress engine as a whole: its clock, its counters, the cap on
sends in flight, and the process-wide switches of the transport layer
(the emulated network's model, the timeline recorder).

Everything here acts on the one progress engine of the process, not on a
schedule.  :mod:`partialcoll.transport` configures the emulated network
and reads the timeline through these functions; nothing above ``core``
calls the C extension itself.
"""
from .. import _core
from .errors import ArgumentTypeError, ScheduleError

_C = _core.constants()
#: C-level constants (op kinds, outcomes, timeline event codes ...)
CONSTANTS = _C


def now() -> float:
    """The executor's clock in seconds (CLOCK_MONOTONIC: the same on every
    process of a host), as used by ``Schedule.start_at`` and timelines."""
    return _core.now()


def settle(seconds: float) -> None:
    """Have the progress thread keep MPI moving for ``seconds`` even with
    nothing of the library's in flight (it starts the thread if need be).
    Call it after a blocking exchange on the calling thread: under weak
    progress the last message a rank sent in it may still sit inside MPI
    when the call returns (MPICH over OFI's TCP provider writes it to the
    socket only during a later MPI call), and an application that then
    blocks outside MPI would keep its peers waiting for that message."""
    _core.settle(seconds)


def progress_thread_cputime() -> float:
    """CPU seconds the progress thread has used so far (0 if not started)."""
    return _core.thread_cputime()


def set_send_cap(n: int) -> None:
    """At most ``n`` sends in flight per destination process, the rest
    queued and released lowest ``priority`` first, so priority decides what
    the wire carries first.  0 (the default, or PARTIALCOLL_SEND_CAP)
    removes the cap: nothing queues."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise ArgumentTypeError(f"the send cap must be an int >= 0, got "
                                f"{n!r}")
    if n < 0:
        raise ScheduleError(f"the send cap must be an int >= 0, got {n!r}")
    _core.set_send_cap(n)


def engine_stats() -> dict[str, int]:
    """Counters of the progress engine: ``outstanding`` messages (of every
    kind: idle persistent schedules add none, one control receive per
    peer rank and communicator serves them), ``hot`` (round-bound ones),
    ``sends_left``, ``unclaimed``/``foreign`` stamped messages,
    ``send_cap``, ``control_receives`` (those control receives, of
    the communicators in use) and ``nudges`` (calls into MPI with
    nothing outstanding, for a moment after each of the library's own
    exchanges)."""
    return _core.engine_stats()


# -- the transport layer's switches (partialcoll.transport) --------------
def set_network(description: str) -> None:
    """Install an emulated network (the C model's text form, see
    :mod:`partialcoll.transport.network`); "" goes back to plain MPI."""
    _core.set_network(description)


def network_rate(rank: int, nic: int, t: float) -> tuple[float, float]:
    """The emulated network's rate of ``rank``'s NIC (0 out, 1 in) at
    time ``t`` (bytes/s), and the network's time zero."""
    return _core.network_rate(rank, nic, t)


def record_timeline(on: bool) -> int:
    """Switch the timeline recorder on or off; returns the size in bytes
    of one recorded event (the layout the reader must agree with)."""
    return _core.timeline_enable(bool(on))


def take_timeline() -> bytes:
    """The events recorded since the last call, as raw bytes."""
    return _core.timeline_take()
