"""Library communicators and clean shutdown.

Every collective object works on its own duplicate of the user's
communicator, so library traffic never matches user traffic or another
collective's.  One-shot collectives (``allreduce``) share one duplicate per
user communicator and separate concurrent calls by tag blocks taken from a
counter that advances identically on every rank (collectives are called in
the same order everywhere, as in MPI).
"""
import atexit
import threading

from mpi4py import MPI

from . import _core

_lock = threading.Lock()
_dups = {}          # handle of user comm -> LibraryComm
_owned = []         # every duplicate we made, freed at exit


class LibraryComm:
    """A duplicate of a user communicator plus a deterministic tag counter."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        _owned.append(self.comm)
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()
        self.tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self._next_tag = 0

    def tag_block(self, ntags):
        """The first tag of a block of ``ntags`` tags for the next call."""
        if ntags > self.tag_ub + 1:
            raise ValueError("tag space too small for this schedule")
        if self._next_tag + ntags > self.tag_ub + 1:
            self._next_tag = 0
        base, self._next_tag = self._next_tag, self._next_tag + ntags
        return base


def library_comm(comm):
    """The shared duplicate of ``comm`` for one-shot collectives."""
    key = MPI._handleof(comm)
    with _lock:
        lc = _dups.get(key)
        if lc is None:
            lc = _dups[key] = LibraryComm(comm)
        return lc


def disagreements(comm, mine):
    """Allgather the dict ``mine`` (collective).  Returns (everyone, the
    keys whose values are not the same on every rank)."""
    everyone = comm.allgather(mine)
    bad = [k for k in mine if any(d.get(k) != mine[k] for d in everyone)]
    return everyone, bad


def per_rank(everyone, key):
    """'key: rank 0=..., rank 1=...' for an error message."""
    return f"{key}: " + ", ".join(f"rank {r}={d.get(key)!r}"
                                  for r, d in enumerate(everyone))


def dup(comm):
    """A private duplicate of ``comm`` (for persistent collective objects)."""
    c = comm.Dup()
    c.Set_errhandler(MPI.ERRORS_RETURN)
    _owned.append(c)
    return c


def release(comm):
    """Free a duplicate made by :func:`dup` (idempotent)."""
    if comm in _owned:
        _owned.remove(comm)
        if not MPI.Is_finalized():
            comm.Free()


@atexit.register
def _shutdown():
    # Runs before mpi4py finalises MPI: stop the progress thread, cancel
    # every pending request, free every schedule and duplicate communicator.
    from .collectives import partial
    from .schedule import free_all
    if MPI.Is_initialized() and not MPI.Is_finalized():
        partial.quiesce_all()
    _core.shutdown()
    free_all()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for c in _owned:
            try:
                c.Free()
            except MPI.Exception:
                pass
    _owned.clear()
    _dups.clear()
    from .collectives import allreduce, partial
    allreduce._plans.clear()
    partial._objects.clear()
