"""One rank's failure ends the job: an uncaught exception is printed once,
with the rank that raised it, and MPI_Abort ends every rank at once.

Without this, the ranks that did not fail wait in their next collective for
the one that did, until the launcher's time limit: MPI gives no rank a way
to notice that another has left.  ``python -m mpi4py script.py`` does the
same for a whole script; :func:`abort_on_error` is for programs started
some other way (an entry point, a notebook kernel under mpiexec), and
``partialcoll-bench`` calls it first thing."""
import sys
import threading
import traceback

from .errors import ArgumentTypeError, ScheduleError

_installed = False


def abort_on_error(code: int = 1) -> None:
    """From now on an exception that nothing catches, in the main thread or
    in any Python thread, prints its traceback to stderr under a line that
    names this rank, then calls ``MPI.COMM_WORLD.Abort(code)``: mpiexec
    ends every rank of the job at once and exits non-zero.  ``SystemExit``
    is left alone (a script's own ``sys.exit``).  Calling it again does
    nothing.

    Use it (or launch with ``python -m mpi4py``) in any program whose ranks
    may fail apart, e.g. on an optional import one host lacks."""
    global _installed
    if isinstance(code, bool) or not isinstance(code, int):
        raise ArgumentTypeError(f"code must be an exit status in 1..255 "
                                f"(an int), got {code!r}")
    if not 1 <= code <= 255:
        raise ScheduleError(f"code must be an exit status in 1..255, got "
                            f"{code!r}")
    if _installed:
        return
    sys.excepthook = lambda kind, value, tb: _abort(kind, value, tb, code)
    threading.excepthook = lambda a: _abort(
        a.exc_type, a.exc_value, a.exc_traceback, code,
        f" in thread {a.thread.name!r}" if a.thread is not None else "")
    _installed = True


def _abort(kind, value, tb, code, where=""):
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank if MPI.Is_initialized() else "?"
    text = "".join(traceback.format_exception(kind, value, tb))
    sys.stderr.write(f"partialcoll: rank {rank} failed{where}; ending "
                     f"every rank of the job (MPI_Abort)\n{text}")
    sys.stderr.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)
