"""What happens when a rank dies, and how this process tells.

Two worlds:

* **No fault-tolerance extensions** (MPICH, or Open MPI started without
  ``--with-ft ulfm``): a process that exits before finalising, or is
  killed, makes ``mpiexec`` end every rank of the job within about a
  second.  partialcoll adds nothing and waits for nothing.
* **Open MPI with its User-Level Failure Mitigation extensions**
  (``mpiexec --with-ft ulfm``): the survivors stay.  Open MPI's failure
  detector notices a dead rank after ``mpi_ft_detector_timeout`` seconds
  (Open MPI's default: 10; ``--mca mpi_ft_detector_timeout 1`` sets 1),
  and any operation that involves it fails.  The first survivor whose
  partialcoll operation fails revokes the library's communicators (the C
  executor for its schedules, :func:`rank_failure` for the library's own
  control collectives), so no survivor waits for a message the dead rank
  will never send: full collectives raise
  :class:`~partialcoll.RankFailedError`, partial collectives carry on over
  the survivors (``LibraryComm.shrink``).

:func:`fault_tolerance` says which world this process is in; the first
library communicator logs it once (INFO, logger ``partialcoll``).
"""
from __future__ import annotations

import os

from mpi4py import MPI

from .errors import RankFailedError

#: Open MPI's failure detector timeout when nothing sets it (seconds)
OPEN_MPI_DETECTOR_DEFAULT = 10.0


def _open_mpi():
    return MPI.get_vendor()[0] == "Open MPI"


def extensions_in_use() -> bool:
    """True when this process runs under Open MPI with the fault-tolerance
    extensions switched on (``mpiexec --with-ft ulfm`` sets
    ``OMPI_MCA_mpi_ft_enable``)."""
    return _open_mpi() and os.environ.get(
        "OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")


def detector_timeout() -> float | None:
    """Open MPI's failure detector timeout in seconds, as this process was
    started with it (None where no detector runs)."""
    if not extensions_in_use():
        return None
    text = os.environ.get("OMPI_MCA_mpi_ft_detector_timeout", "")
    try:
        return float(text) if text else OPEN_MPI_DETECTOR_DEFAULT
    except ValueError:
        return OPEN_MPI_DETECTOR_DEFAULT


def fault_tolerance() -> dict:
    """What happens to this job when one of its ranks dies.

    Returns a dict: ``extensions`` (bool: MPI's fault-tolerance
    extensions are in use), ``detector_timeout`` (seconds, or None),
    ``on_failure`` (one sentence saying what the survivors see)."""
    on = extensions_in_use()
    timeout = detector_timeout()
    if on:
        text = (f"Open MPI's fault-tolerance extensions are in use: if a "
                f"rank dies, about {timeout:g} s after the death (the "
                f"failure detector's timeout) partial collectives carry on "
                f"over the survivors and full collectives raise "
                f"RankFailedError")
    else:
        text = (f"{MPI.get_vendor()[0]} runs without fault-tolerance "
                f"extensions: if a rank dies, mpiexec ends the whole job")
    return {"extensions": on, "detector_timeout": timeout,
            "on_failure": text}


def is_rank_failure(exc: BaseException) -> bool:
    """True when ``exc`` is an mpi4py error saying that a rank failed or a
    communicator was revoked (only with the extensions in use: other MPIs
    give those classes other meanings, or none)."""
    if not isinstance(exc, MPI.Exception) or not _open_mpi():
        return False
    return exc.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED,
                                     MPI.ERR_PROC_FAILED_PENDING)


def failed_ranks(comm) -> tuple[int, ...]:
    """The ranks of ``comm`` this process knows to have failed."""
    try:
        group = comm.Get_failed()
    except (MPI.Exception, NotImplementedError):
        return ()
    try:
        if group.Get_size() == 0:
            return ()
        mine = comm.Get_group()
        try:
            ranks = MPI.Group.Translate_ranks(
                group, list(range(group.Get_size())), mine)
        finally:
            mine.Free()
    finally:
        group.Free()
    return tuple(sorted(int(r) for r in ranks))


def translate(comm, old) -> list[int]:
    """The ranks in ``old`` of ``comm``'s members, in ``comm``'s order."""
    mine, theirs = comm.Get_group(), old.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(
            mine, list(range(mine.Get_size())), theirs)]
    finally:
        mine.Free()
        theirs.Free()


def revoke(comms) -> None:
    """Revoke each communicator of ``comms`` not yet revoked (errors are
    ignored: a communicator being freed, an MPI without the call)."""
    for c in comms:
        try:
            if not c.Is_revoked():
                c.Revoke()
        except (MPI.Exception, NotImplementedError):
            pass


def rank_failure(exc: MPI.Exception, comm, what: str,
                 revoke_too=()) -> RankFailedError:
    """The :class:`RankFailedError` for the mpi4py error ``exc`` of a
    library operation on ``comm`` (``what`` names it), after revoking
    ``comm`` and every communicator of ``revoke_too``."""
    revoke([comm, *revoke_too])
    ranks = failed_ranks(comm)
    who = ("a rank" if not ranks else
           f"rank{'s' if len(ranks) > 1 else ''} "
           + ", ".join(str(r) for r in ranks))
    return RankFailedError(f"{who} of the communicator failed: {what}: "
                           f"{exc.Get_error_string()}", ranks)
