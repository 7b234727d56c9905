"""The exception hierarchy.  The C core returns codes; each maps to one class.

PartialcollError (partialcoll.Error)
    ScheduleError (also ValueError)     misuse: bad graph, buffers, values
        ArgumentTypeError (also TypeError)  an argument of the wrong type
        ScheduleBusyError               rebinding/reposting while a round runs
        ScheduleFreedError              using a freed schedule
    ThreadLevelError                    MPI below MPI_THREAD_MULTIPLE
    TransportError (also RuntimeError)  MPI failed on the progress thread
        RankFailedError                 a rank of the communicator died
    WaitTimeout (also TimeoutError)     wait(timeout=...) ran out
    DeviceError (also RuntimeError)     CUDA failed, or no usable GPU

An error one rank finds in a collective's setup is raised on every rank
with its kind: :func:`portable` is what that rank sends (a name and a
message), :func:`agreed_kind` the class every rank makes of the names.
"""
from __future__ import annotations

from collections.abc import Iterable

from .. import _core


class PartialcollError(Exception):
    """Base class of every error raised by partialcoll."""


#: The documented short name of the base class: ``except partialcoll.Error``
#: catches partialcoll's own errors.
Error = PartialcollError


class ScheduleError(PartialcollError, ValueError):
    """The schedule, a buffer or an argument is invalid (a usage error)."""


class ArgumentTypeError(ScheduleError, TypeError):
    """An argument of the wrong type: a ``TypeError``, and a
    :class:`ScheduleError` too (``except ScheduleError`` still catches
    it)."""


class ScheduleBusyError(ScheduleError):
    """The operation is not allowed while a round of the schedule runs."""


class ScheduleFreedError(ScheduleError):
    """The schedule was freed."""


class ThreadLevelError(PartialcollError, RuntimeError):
    """MPI was not initialised with MPI_THREAD_MULTIPLE."""


class TransportError(PartialcollError, RuntimeError):
    """MPI reported an error while the schedule was executing."""


class RankFailedError(TransportError):
    """A rank of the communicator failed, and the collective cannot end.

    Raised only under an MPI with the fault-tolerance extensions in use
    (Open MPI started with ``mpiexec --with-ft ulfm``; see
    :func:`partialcoll.fault_tolerance`): without them a rank that dies
    ends the whole job.  The rank that first sees the failure revokes the
    library's communicators, so every survivor's pending and later
    partialcoll calls on that communicator raise this too, instead of
    waiting for the dead rank's messages.

    ``ranks``: the ranks of the communicator this rank knows to have
    failed (a tuple, perhaps empty where only the revocation reached this
    rank)."""

    def __init__(self, message: str = "",
                 ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(int(r) for r in ranks)


class WaitTimeout(PartialcollError, TimeoutError):
    """A wait() with a timeout expired before the round completed."""


class DeviceError(PartialcollError, RuntimeError):
    """The GPU (CUDA) reported an error, or device buffers cannot be used."""


class StallWarning(UserWarning):
    """A partial collective's call has waited long for its round
    (``PARTIALCOLL_WAIT_WARN_S``, 10 s), most likely because a rank the
    round needs entered another collective without flushing the partial
    collectives first: a wait that may never end.  Issued with
    ``warnings`` (so it reaches the console) when the program has not
    configured logging; otherwise the ``partialcoll`` logger says it."""


#: partialcoll's errors by name: the kinds one rank may report to the
#: others in a setup agreement.  Only the name travels, and only these
#: names are turned back into a class; nothing else is rebuilt from what
#: another rank sent.
_KINDS: dict[str, type[PartialcollError]] = {c.__name__: c for c in (
    PartialcollError, ScheduleError, ArgumentTypeError, ScheduleBusyError,
    ScheduleFreedError, ThreadLevelError, TransportError, RankFailedError,
    WaitTimeout, DeviceError)}


def portable(error: BaseException) -> tuple[str, str]:
    """``(kind, text)`` of an error one rank found, to send to the others
    (:func:`partialcoll.core.control.gather_checked`): ``kind`` names the
    nearest of partialcoll's classes (a builtin ``TypeError`` travels as
    :class:`ArgumentTypeError`, a ``ValueError`` as :class:`ScheduleError`,
    anything else as :class:`PartialcollError`); ``text`` is the message,
    after the builtin's name when the error is not partialcoll's own."""
    for cls in type(error).__mro__:
        if _KINDS.get(cls.__name__) is cls:
            return cls.__name__, str(error)
    kind = ArgumentTypeError if isinstance(error, TypeError) else \
        ScheduleError if isinstance(error, ValueError) else PartialcollError
    return kind.__name__, f"{type(error).__name__}: {error}"


def agreed_kind(kinds: Iterable[str]) -> type[PartialcollError]:
    """The class every rank raises for the ``kinds`` (names from
    :func:`portable`, one per rank that found a problem): the most
    specific of partialcoll's classes that each of them is, so that every
    rank's own kind still catches it when all agree (``ArgumentTypeError``
    and ``ScheduleError`` give ``ScheduleError``).  A name that is not
    one of partialcoll's counts as :class:`PartialcollError`."""
    classes = [_KINDS.get(k, PartialcollError) if isinstance(k, str)
               else PartialcollError for k in kinds]
    if not classes:
        return PartialcollError
    for cls in classes[0].__mro__:
        if _KINDS.get(cls.__name__) is cls and \
                all(issubclass(c, cls) for c in classes):
            return cls
    return PartialcollError


_C = _core.constants()
_core.set_exceptions({
    _C["EINVAL"]: ScheduleError,
    _C["EBUSY"]: ScheduleBusyError,
    _C["EMPI"]: TransportError,
    _C["ETIMEOUT"]: WaitTimeout,
    _C["ENOMEM"]: MemoryError,
    _C["EFREED"]: ScheduleFreedError,
    _C["ETHREAD"]: ThreadLevelError,
    _C["EDEVICE"]: DeviceError,
    _C["EFAILED"]: RankFailedError,
})
