"""Argument checks shared by every layer: the MPI thread level, a
communicator partialcoll can run on, and whole numbers in a range.  Each
raises :class:`~.errors.ScheduleError` (:class:`~.errors.ArgumentTypeError`
for a wrong type) or ThreadLevelError, with a message that names what was
passed."""
import numbers

from .errors import ArgumentTypeError, ScheduleError, ThreadLevelError

_thread_ok = False


def require_thread_multiple():
    """Raise ThreadLevelError unless MPI runs with MPI_THREAD_MULTIPLE."""
    global _thread_ok
    if _thread_ok:
        return
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise ThreadLevelError("MPI is not initialised (or already finalised)")
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        raise ThreadLevelError(
            f"partialcoll needs MPI_THREAD_MULTIPLE, MPI was initialised with "
            f"level {level}; set mpi4py.rc.thread_level = 'multiple' (the "
            f"default) before importing mpi4py.MPI")
    _thread_ok = True


def check_comm(comm):
    """``comm`` (None: ``MPI.COMM_WORLD``) if partialcoll can run on it;
    otherwise a ScheduleError that says why.  Intercommunicators are
    refused: every schedule addresses ranks of the local group."""
    from mpi4py import MPI
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise ArgumentTypeError(f"comm must be an mpi4py communicator "
                                f"(e.g. MPI.COMM_WORLD) or None, got "
                                f"{type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ScheduleError("comm is MPI.COMM_NULL (or was freed): pass a "
                            "valid communicator")
    if comm.Is_inter():
        raise ScheduleError("intercommunicators are not supported: merge it "
                            "first (comm.Merge()) and pass the "
                            "intracommunicator")
    return comm


def check_int(value, what, lo=None, hi=None):
    """``value`` as an int within [lo, hi] (None: unbounded), or a
    ScheduleError naming ``what``: floats are refused, not truncated
    (quorum=1.9 must not become 1)."""
    if type(value) is not int:      # a plain int skips the slow ABC check
        if not isinstance(value, numbers.Integral) or \
                isinstance(value, bool):
            raise ArgumentTypeError(f"{what} must be an int, got {value!r}")
        value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
        raise ScheduleError(f"{what} must be in {span}, got {value}")
    return value
