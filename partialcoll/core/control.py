"""Control collectives: the library's own mpi4py collectives (consistency
checks at creation, flush and close), waited for without busy-polling.

They run on a library communicator's ``ctl`` duplicate (:mod:`.libcomm`),
so they never match the program's own messages.
"""
import os
import time

from mpi4py import MPI

from . import engine, failures, libcomm
from .errors import ScheduleError, agreed_kind, portable

#: seconds the progress thread keeps MPI moving after a control exchange
SETTLE_S = 0.1


def _ranks_on_this_host():
    """The launcher's count of this job's processes on this host (MPICH's
    Hydra: MPI_LOCALNRANKS; Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE), or
    None where it says nothing."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return None


def _polling_seconds():
    """:data:`SPIN_S` for this process: 0.5 ms where the launcher says
    this host runs no more of the job's ranks than it has CPUs, else 0."""
    ranks = _ranks_on_this_host()
    return 500e-6 if ranks is not None and ranks <= (os.cpu_count() or 1) \
        else 0.0


#: seconds a control wait polls (Test, then yield the core) before it
#: sleeps, where every rank on this host has a core of its own: a small
#: control collective ends in that time when every rank is there.  With
#: more ranks than cores, or a launcher that does not say, it sleeps from
#: the first test: polling ranks there take the CPU from the ranks they
#: wait for (a run of the test suite at 5 ranks on 2 cores took twice as
#: long, its stalls in single tests grown to minutes).
SPIN_S = _polling_seconds()


def settle():
    """After a control exchange on the calling thread: the progress thread
    keeps MPI moving for ``SETTLE_S`` (``engine.settle``), so that
    this rank's last messages of it leave the process even when the
    application next blocks outside MPI (a gloo collective, a socket).
    Over MPICH's OFI module with the TCP provider, an mpi4py allreduce
    followed by such a wait hung at once without it: a rank's last
    message stayed inside MPI, the rank blocked elsewhere, and a peer
    waited in the allreduce for ever.  Nothing without
    MPI_THREAD_MULTIPLE (no progress thread may call MPI then)."""
    if MPI.Query_thread() == MPI.THREAD_MULTIPLE and not MPI.Is_finalized():
        engine.settle(SETTLE_S)


def wait_for(req, longest=0.002, comm=None):
    """Wait for an mpi4py request with Test(): for ``SPIN_S`` yielding the
    core between tests (a control collective whose ranks are all there
    ends in that time; only where the ranks on this host have a core
    each), then with a sleeping back-off (from 20 us, doubling, up to
    ``longest`` s): never a busy wait, for control collectives that may
    wait long for a slow rank.  A sleep costs at least the kernel's timer
    slack (50 us by default), so sleeping from the first test makes a
    control exchange cost 100 us or more even with every rank there.

    When MPI says a rank failed (fault-tolerance extensions in use,
    :mod:`.failures`), every library communicator is revoked and
    :class:`~partialcoll.RankFailedError` raised (its ranks those of
    ``comm``, the request's communicator, when given)."""
    delay, spin_until = 20e-6, SPIN_S and time.perf_counter() + SPIN_S
    while True:
        try:
            if req.Test():
                return
        except MPI.Exception as e:
            if not failures.is_rank_failure(e):
                raise
            owned = libcomm.owned()
            raise failures.rank_failure(
                e, comm if comm is not None else MPI.COMM_NULL,
                "a library control collective ended", owned) from e
        if spin_until and time.perf_counter() < spin_until:
            os.sched_yield()
            continue
        spin_until = 0
        time.sleep(delay)
        delay = min(2 * delay, longest)


def arrive(comm, then_settle=True):
    """Wait, sleeping (:func:`wait_for`), until every rank of ``comm`` has
    arrived: an Ibarrier.  A blocking mpi4py collective right after it
    finds every rank there.  Without it, ranks that come early busy-poll
    inside MPICH; with more ranks than cores that took the CPU from the
    slow rank and from the progress threads, and a P = 5 test suite on two
    cores stalled for tens of seconds (docs/results.md).  Settles
    (:func:`settle`) unless ``then_settle`` is False: for a caller whose
    own exchange follows and settles."""
    wait_for(comm.Ibarrier(), longest=0.001, comm=comm)
    if then_settle:
        settle()


def gather_checked(comm, what, mine, problem=None):
    """Collective over ``comm``: allgather every rank's ``mine`` and the
    ``problem`` (an exception, or None) it found in its own arguments.
    When any rank found one, every rank raises the same error: of the
    kind they reported (:func:`.errors.agreed_kind`: a wrong type on one
    rank is an ArgumentTypeError, a ``TypeError``, everywhere), with a
    message that starts with ``what`` and names each rank that found a
    problem and what it was.  Only the kind's name and the message
    travel.  Returns every rank's ``mine``."""
    arrive(comm, then_settle=False)
    everyone = comm.allgather(
        (mine, None if problem is None else portable(problem)))
    settle()
    found = [(r, p) for r, (_, p) in enumerate(everyone) if p is not None]
    if found:
        error = agreed_kind(kind for _, (kind, _) in found)(
            f"{what}: " + "; ".join(f"rank {r}: {text}"
                                    for r, (_, text) in found[:4])
            + (f"; and {len(found) - 4} more ranks" if len(found) > 4
               else ""))
        if problem is not None:
            raise error from problem
        raise error
    return [m for m, _ in everyone]


def disagreements(comm, mine):
    """Allgather the dict ``mine`` (collective).  Returns (everyone, the
    keys whose values are not the same on every rank)."""
    arrive(comm, then_settle=False)
    everyone = comm.allgather(mine)
    settle()
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
