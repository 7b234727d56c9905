"""The exception hierarchy.  The C core returns codes; each maps to one class.

PartialcollError (partialcoll.Error)
    ScheduleError (also ValueError)     misuse: bad graph, buffers, values
        ArgumentTypeError (also TypeError)  an argument of the wrong type
        ScheduleBusyError               rebinding/reposting while a round runs
        ScheduleFreedError              using a freed schedule
    ThreadLevelError                    MPI below MPI_THREAD_MULTIPLE
    TransportError (also RuntimeError)  MPI failed on the progress thread
    WaitTimeout (also TimeoutError)     wait(timeout=...) ran out
    DeviceError (also RuntimeError)     CUDA failed, or no usable GPU
"""
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


class WaitTimeout(PartialcollError, TimeoutError):
    """A wait() with a timeout expired before the round completed."""


class DeviceError(PartialcollError, RuntimeError):
    """The GPU (CUDA) reported an error, or device buffers cannot be used."""


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
})
