"""Library communicators: what partialcoll keeps per user communicator.

Identity.  Everything partialcoll keeps for a user's communicator hangs off
an MPI attribute on that communicator (a keyval with a delete callback),
never off a dict keyed by its handle: MPICH reuses a freed communicator's
handle for the next one, and a handle-keyed cache handed a new 4-rank
communicator the duplicates of a freed 2-rank one (an allreduce summed over
2 ranks instead of 4).

What is kept, a :class:`LibraryComm`, is shared by every collective on the
user's communicator:

* ``comm``: a duplicate for executor traffic (the schedules' sends and
  receives).  Collectives on it are kept apart by tags (:class:`TagSpace`).
* ``ctl``: a duplicate for the library's own mpi4py collectives
  (consistency checks, flush, close: :mod:`.control`), so they never
  match the user's.
* ``cache``: state that higher modules keep per communicator.

Lifetime: reference counted.  The attribute on the user's communicator holds
one reference and every open persistent object one.  MPI_Comm_free of the
user's communicator is collective and runs the delete callback on every
rank: the ``on_user_free`` hooks run there (function forms are closed,
collectively, in creation order), then the attribute's reference is dropped.
The duplicates are freed with the last reference, after the ``on_release``
hooks; every acquire and release is a step of a collective call, so this
happens at the same point on every rank.

Hooks: this module imports no collective.  Higher modules register here,
atexit style, what must happen before a library collective, when a user's
communicator is freed, when a library communicator goes, and at exit.
"""
import atexit
import logging
import threading
from typing import Any, Callable

from mpi4py import MPI

from .. import _core
from . import failures, logs
from .errors import RankFailedError
from .tags import TagSpace

log = logging.getLogger("partialcoll")

_lock = threading.RLock()
_owned: list[MPI.Comm] = []     # every duplicate not yet freed
_live: list["LibraryComm"] = []  # every LibraryComm not yet released
_exiting = False
_told = False       # the first library communicator logged what a death does
_hooks: dict[str, list[Callable[..., Any]]] = {
    "before_collective": [], "on_user_free": [], "on_release": [],
    "at_exit": [], "free_at_exit": [], "on_shrink": []}
_revoked: list[MPI.Comm] = []   # replaced by shrink(): never freed (a free
                                # may wait for the dead rank)


def register(event, fn=None):
    """Register ``fn`` for ``event``: ``"before_collective"`` (fn(lc, keep),
    at the start of every library collective on lc; ``keep`` is the caller's
    own token, see :meth:`LibraryComm.before_collective`), ``"on_user_free"`` (fn(lc),
    inside the collective MPI_Comm_free of lc's user communicator),
    ``"on_release"`` (fn(lc), just before lc's duplicates are freed),
    ``"at_exit"`` (fn(), before the progress thread stops: higher modules
    finish what is in flight) or ``"free_at_exit"`` (fn(), after every
    ``at_exit`` hook: the schedules are freed) or ``"on_shrink"`` (fn(lc,
    dead, survivors), inside :meth:`LibraryComm.shrink`, on every
    survivor: ``dead`` and ``survivors`` are ranks of lc's communicator
    before it shrank, ``survivors`` in the new order).  Hooks run in
    registration order.  Without ``fn``, a decorator that registers."""
    if fn is None:
        return lambda f: register(event, f)
    _hooks[event].append(fn)
    return fn


def _run_hooks(event, *args):
    for fn in _hooks[event]:
        fn(*args)


class LibraryComm:
    """The duplicates and state partialcoll keeps for one user communicator
    (see the module docstring).  Made by :func:`library_comm`."""

    def __init__(self, comm):
        self.comm = _dup(comm)
        self.ctl = _dup(comm)
        self.size, self.rank = self.comm.Get_size(), self.comm.Get_rank()
        self.tags = TagSpace(self.comm.Get_attr(MPI.TAG_UB) or 32767,
                             self.size)
        self.created = 0        # persistent objects made on it (the same
                                # count on every rank: creation is collective)
        self.cache = {}
        # work for before_collective: False (none), True, or the token of
        # the one caller whose own work alone waits (see before_collective)
        self.pending = False
        self.refs = 1           # the user communicator's attribute
        self.attached = True    # the user communicator is not freed yet
        self.freed = False
        # the ranks of the user's communicator that are members now, and
        # those that died (see shrink)
        self.members = list(range(self.size))
        self.lost: tuple[int, ...] = ()
        _live.append(self)

    def acquire(self):
        """One more reference (an open persistent object)."""
        with _lock:
            self.refs += 1
        return self

    def release(self):
        """Drop a reference; the last one frees the duplicates (collective:
        call it at the same step on every rank)."""
        with _lock:
            self.refs -= 1
            last = self.refs == 0 and not self.freed
        if last:
            try:
                _run_hooks("on_release", self)
            finally:
                self._free()

    def _free(self):
        self.freed = True
        self.cache.clear()
        if self in _live:
            _live.remove(self)
        for c in (self.comm, self.ctl):
            _free_dup(c)

    def before_collective(self, keep=None):
        """Call at the start of every library collective on this
        communicator: runs the ``before_collective`` hooks (function forms
        flush there).  ``keep``: an opaque token the hooks pass over (a
        function form's own signature).  The hooks run only while a module
        has set ``lc.pending`` (cleared here first; a hook that leaves work
        sets it again), so a plain collective pays one attribute test.  A
        module whose only work left belongs to one caller sets ``pending``
        to that caller's token instead of True: that caller's own
        collectives (``keep`` equal to it) then run no hook, anyone
        else's do; a module that finds ``pending`` set to another token
        sets it to True."""
        pending = self.pending
        if pending and pending != keep:
            self.pending = False
            _run_hooks("before_collective", self, keep)

    def shrink(self):
        """Collective over the survivors, after a rank died (MPI's
        fault-tolerance extensions): revoke both duplicates, replace them
        by duplicates of the survivors (MPIX_Comm_shrink, which keeps
        their order), run the ``on_shrink`` hooks (partial collectives
        rebuild over the survivors) and return the ranks of the user's
        communicator that died (all of them so far).  The old duplicates
        are kept, never freed.  Full collectives on the user's communicator
        raise :class:`RankFailedError` from then on (:func:`library_comm`).
        """
        failures.revoke([self.comm, self.ctl])
        old = self.comm
        try:
            comm = old.Shrink()
            comm.Set_errhandler(MPI.ERRORS_RETURN)
            ctl = _dup(comm)
        except MPI.Exception as e:
            raise failures.rank_failure(e, old, "shrinking the library's "
                                        "communicator") from e
        survivors = failures.translate(comm, old)
        dead = [r for r in range(self.size) if r not in set(survivors)]
        with _lock:
            for c in (self.comm, self.ctl):
                if c in _owned:
                    _owned.remove(c)
                _revoked.append(c)
            _owned.append(comm)
        self.comm, self.ctl = comm, ctl
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.tags.size = self.size
        self.lost = tuple(sorted(self.lost + tuple(self.members[r]
                                                   for r in dead)))
        self.members = [self.members[r] for r in survivors]
        _run_hooks("on_shrink", self, dead, survivors)
        return self.lost

    def tag_block(self, ntags):
        """The first tag of a block of ``ntags`` tags for the next one-shot
        call (see :class:`TagSpace`)."""
        return self.tags.one_shot(ntags)


def _user_comm_freed(comm, keyval, lc):
    """Delete callback of the attribute: runs inside the user's collective
    MPI_Comm_free, on every rank.  Never raises (MPI would fail the free)."""
    _by_handle.pop(comm.handle, None)
    if lc.freed or _exiting:
        return
    lc.attached = False
    try:
        _run_hooks("on_user_free", lc)
    except Exception:
        log.exception("cleaning up after a freed communicator failed")
    finally:
        try:
            lc.release()
        except Exception:
            log.exception("freeing the library's duplicates failed")


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_user_comm_freed)
# The same map by the user communicator's handle, for the blocking fast
# paths (an attribute lookup through MPI costs about 0.8 us, a third of an
# 8-byte allreduce).  Exact: the handle leaves it in the delete callback,
# before MPI can reuse it.
_by_handle: dict[int, LibraryComm] = {}


def library_comm(comm, survivors=False):
    """The :class:`LibraryComm` of the user's communicator ``comm``, made on
    first use (then collective: it duplicates ``comm`` twice).  Once ranks
    of ``comm`` have died and the survivors went on without them
    (:meth:`LibraryComm.shrink`), raises :class:`RankFailedError` unless
    ``survivors``: only partial collectives carry on over the survivors."""
    lc = comm.Get_attr(_KEYVAL)
    if lc is not None and lc.lost and not survivors:
        raise RankFailedError(
            f"rank(s) {', '.join(map(str, lc.lost))} of this communicator "
            f"died; partial collectives (solo, majority, quorum) carry on "
            f"over the survivors, full collectives need a communicator "
            f"without them (comm.Shrink())", lc.lost)
    if lc is None:
        with _lock:
            lc = comm.Get_attr(_KEYVAL)
            if lc is None:
                global _told
                if not _told:       # once per process: see failures.py
                    _told = True
                    log.info("%s", failures.fault_tolerance()["on_failure"])
                lc = LibraryComm(comm)
                comm.Set_attr(_KEYVAL, lc)
                _by_handle[comm.handle] = lc
    return lc


def find(comm):
    """The :class:`LibraryComm` of ``comm`` if it has one, else None (never
    collective)."""
    return comm.Get_attr(_KEYVAL)


def find_fast(comm):
    """:func:`find` for a valid mpi4py communicator, without asking MPI."""
    return _by_handle.get(comm.handle)


def live():
    """The library communicators not yet released, oldest first."""
    return list(_live)


def owned():
    """Every duplicate communicator partialcoll holds now (a copy)."""
    with _lock:
        return list(_owned)


def live_duplicates():
    """How many duplicate communicators partialcoll holds now."""
    return len(_owned)


def _dup(comm):
    c = comm.Dup()
    c.Set_errhandler(MPI.ERRORS_RETURN)
    with _lock:
        _owned.append(c)
    return c


def _free_dup(c):
    with _lock:
        if c not in _owned:
            return
        _owned.remove(c)
    if not MPI.Is_finalized():
        c.Free()


@atexit.register
def _shutdown():
    # Runs before mpi4py finalises MPI: let higher modules finish what is in
    # flight (at_exit hooks: partial objects quiesce, the timeline is
    # written), free every schedule (receives cancelled, sends left to
    # complete), stop the progress thread after draining those sends for a
    # bounded time, free every duplicate communicator.
    global _exiting
    _exiting = True
    alive = MPI.Is_initialized() and not MPI.Is_finalized()
    if alive:
        for fn in _hooks["at_exit"]:
            try:
                fn()
            except RankFailedError as e:    # already raised to the program
                log.info("partialcoll exit handler: %s", e)
            except Exception:
                log.exception("partialcoll exit handler failed")
    for fn in _hooks["free_at_exit"]:
        fn()
    stuck = _core.shutdown(5.0)
    if stuck:
        logs.for_this_rank(
            log, logging.WARNING, "%d freed schedule(s) still had sends in "
            "flight after 5 s at exit: their receivers never took them "
            "(freed or failed schedules); MPI_Finalize may report them",
            stuck)
    for lc in list(_live):
        lc.freed = True
        lc.cache.clear()
    _live.clear()
    if alive:
        for c in _owned:
            try:
                c.Free()
            except MPI.Exception:
                pass
    _owned.clear()
