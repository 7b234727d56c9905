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
  (consistency checks, flush, close), so they never match the user's.
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
import time

from mpi4py import MPI

from .. import _core
from .errors import ScheduleError

log = logging.getLogger("partialcoll")

_lock = threading.RLock()
_owned = []             # every duplicate not yet freed
_live = []              # every LibraryComm not yet released
_exiting = False
_hooks = {"before_collective": [], "on_user_free": [], "on_release": [],
          "at_exit": [], "free_at_exit": []}


def register(event, fn=None):
    """Register ``fn`` for ``event``: ``"before_collective"`` (fn(lc, keep),
    at the start of every library collective on lc; ``keep`` is the caller's
    own token, see :meth:`LibraryComm.before_collective`), ``"on_user_free"`` (fn(lc),
    inside the collective MPI_Comm_free of lc's user communicator),
    ``"on_release"`` (fn(lc), just before lc's duplicates are freed),
    ``"at_exit"`` (fn(), before the progress thread stops: higher modules
    finish what is in flight) or ``"free_at_exit"`` (fn(), after every
    ``at_exit`` hook: the schedules are freed).  Hooks run in
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
        self.pending = False    # a module has work for before_collective
        self.refs = 1           # the user communicator's attribute
        self.attached = True    # the user communicator is not freed yet
        self.freed = False
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
        sets it again), so a plain collective pays one attribute test."""
        if self.pending:
            self.pending = False
            _run_hooks("before_collective", self, keep)

    def tag_block(self, ntags):
        """The first tag of a block of ``ntags`` tags for the next one-shot
        call (see :class:`TagSpace`)."""
        return self.tags.one_shot(ntags)


class TagSpace:
    """The tags of one executor communicator, 0 .. MPI_TAG_UB - 1 (the
    executor keeps MPI_TAG_UB for its control channel).

    * The lower three quarters hold blocks for persistent objects: first
      fit, given back at close().  Exhausting them raises ScheduleError
      with the numbers (see the README's tag budget).
    * The upper quarter rotates among one-shot calls (allreduce): each call
      takes the block after the previous call's, wrapping around.

    Blocks are taken and given back inside collective calls, in the same
    order on every rank, so every rank hands out the same tags.
    """

    def __init__(self, tag_ub, size):
        total = tag_ub                  # MPI_TAG_UB itself is reserved
        self.tag_ub, self.size = tag_ub, size
        self.one_shot_lo = total - total // 4
        self._free = [[0, self.one_shot_lo]]     # sorted [start, end)
        self._next = self.one_shot_lo
        self.held = 0           # tags held by persistent objects
        self.blocks = 0         # blocks held

    def block(self, ntags, what="partial collective object"):
        """The first tag of a free block of ``ntags`` tags (first fit)."""
        for ext in self._free:
            if ext[1] - ext[0] >= ntags:
                base = ext[0]
                ext[0] += ntags
                if ext[0] == ext[1]:
                    self._free.remove(ext)
                self.held += ntags
                self.blocks += 1
                return base
        raise ScheduleError(
            f"out of MPI tags on this communicator: {self.blocks} open "
            f"objects hold {self.held} of the {self.one_shot_lo} tags set "
            f"aside for persistent objects (three quarters of MPI_TAG_UB "
            f"= {self.tag_ub}), and a {what} at P = {self.size} needs "
            f"{ntags}; close() objects you no longer use")

    def give_back(self, base, ntags):
        """Return a block taken with :meth:`block`."""
        self.held -= ntags
        self.blocks -= 1
        end = base + ntags
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < base:
            i += 1
        free.insert(i, [base, end])
        if i + 1 < len(free) and free[i + 1][0] == end:     # merge right
            free[i][1] = free.pop(i + 1)[1]
        if i > 0 and free[i - 1][1] == base:                 # merge left
            free[i - 1][1] = free.pop(i)[1]

    def one_shot(self, ntags):
        """The first tag of the next rotating block of ``ntags`` tags."""
        top = self.tag_ub               # exclusive: MPI_TAG_UB is reserved
        if ntags > top - self.one_shot_lo:
            raise ScheduleError(
                f"a one-shot collective at P = {self.size} needs {ntags} "
                f"tags, more than the {top - self.one_shot_lo} kept for them "
                f"(a quarter of MPI_TAG_UB = {top})")
        if self._next + ntags > top:
            self._next = self.one_shot_lo
        base, self._next = self._next, self._next + ntags
        return base


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
_by_handle = {}


def library_comm(comm):
    """The :class:`LibraryComm` of the user's communicator ``comm``, made on
    first use (then collective: it duplicates ``comm`` twice)."""
    lc = comm.Get_attr(_KEYVAL)
    if lc is None:
        with _lock:
            lc = comm.Get_attr(_KEYVAL)
            if lc is None:
                lc = LibraryComm(comm)
                comm.Set_attr(_KEYVAL, lc)
                _by_handle[comm.handle] = lc
    return lc


def world_ranks(comm):
    """[the MPI_COMM_WORLD rank of each rank of ``comm``] (the emulated
    network and the timelines number ranks in MPI_COMM_WORLD)."""
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return list(MPI.Group.Translate_ranks(
            group, list(range(comm.Get_size())), world))
    finally:
        group.Free()
        world.Free()


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


def live_duplicates():
    """How many duplicate communicators partialcoll holds now."""
    return len(_owned)


def arrive(comm):
    """Wait, sleeping (:func:`wait_for`), until every rank of ``comm`` has
    arrived: an Ibarrier.  A blocking mpi4py collective right after it
    finds every rank there.  Without it, ranks that come early busy-poll
    inside MPICH; with more ranks than cores that took the CPU from the
    slow rank and from the progress threads, and a P = 5 test suite on two
    cores stalled for tens of seconds (bench/RESULTS.md)."""
    wait_for(comm.Ibarrier(), longest=0.001)


def disagreements(comm, mine):
    """Allgather the dict ``mine`` (collective).  Returns (everyone, the
    keys whose values are not the same on every rank)."""
    arrive(comm)
    everyone = comm.allgather(mine)
    bad = [k for k in mine if any(d.get(k) != mine[k] for d in everyone)]
    return everyone, bad


def require_same(lc, what, mine):
    """Collective over lc.ctl: raise the same ScheduleError on every rank
    unless ``mine`` (a dict of creation arguments) is equal everywhere."""
    everyone, bad = disagreements(lc.ctl, mine)
    if bad:
        raise ScheduleError(f"{what} created with different arguments on "
                            f"different ranks (" + "; ".join(
                                per_rank(everyone, k) for k in bad) + ")")


def per_rank(everyone, key):
    """'key: rank 0=..., rank 1=...' for an error message."""
    return f"{key}: " + ", ".join(f"rank {r}={d.get(key)!r}"
                                  for r, d in enumerate(everyone))


def wait_for(req, longest=0.002):
    """Wait for an mpi4py request with Test() and a sleeping back-off (from
    20 us, doubling, up to ``longest`` s): never a busy wait, for control
    collectives that may wait long for a slow rank."""
    delay = 20e-6
    while not req.Test():
        time.sleep(delay)
        delay = min(2 * delay, longest)


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
            except Exception:
                log.exception("partialcoll exit handler failed")
    for fn in _hooks["free_at_exit"]:
        fn()
    stuck = _core.shutdown(5.0)
    if stuck:
        log.warning("%d freed schedule(s) still had sends in flight after "
                    "5 s at exit: their receivers never took them (freed "
                    "or failed schedules); MPI_Finalize may report them",
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
