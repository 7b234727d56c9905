"""Broadcasts for training scripts: any picklable object, and the checks the
torch broadcasts (:mod:`partialcoll.torch.broadcast`) build on.

Each function here is collective over ``comm`` and talks on the library's
control duplicate of it (see :mod:`partialcoll.core.libcomm`), so its
messages never match the program's own.  A mistake made on some ranks
only (a root that is out of range or differs between ranks, inputs that
differ, an object the root cannot pickle) raises the same error on every
rank instead of an error on some and a hang on the rest: every rank's
view of the call is gathered first (one small allgather), and every rank
judges the same list.  An error one rank found in its own arguments keeps
its kind on every rank (a wrong type is an :class:`ArgumentTypeError`
everywhere); the others are :class:`ScheduleError`.
"""
from __future__ import annotations

import numbers
from typing import Any

from mpi4py import MPI

from ..core import control, libcomm
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.checks import check_comm


def control_comm(comm):
    """The control duplicate of ``comm`` (default ``MPI.COMM_WORLD``), after
    flushing the function forms that wait for this collective (collective
    the first time: it duplicates ``comm``)."""
    comm = check_comm(comm)
    lc = libcomm.library_comm(comm)
    lc.before_collective()
    return lc.ctl


def root_argument(root_rank, root):
    """``(root rank, error or None)`` from Horovod's ``root_rank`` and
    partialcoll's older name ``root`` (an alias: give one of them).  The
    error (an exception) is returned, not raised, so that :func:`agree`
    raises it on every rank."""
    if root is not None:
        if root_rank not in (0, root):
            return None, ScheduleError(f"root_rank={root_rank!r} and "
                                       f"root={root!r} disagree: give one "
                                       f"of them")
        root_rank = root
    if isinstance(root_rank, bool) or \
            not isinstance(root_rank, numbers.Integral):
        return None, ArgumentTypeError(f"root_rank must be an int, not "
                                       f"{root_rank!r} "
                                       f"({type(root_rank).__name__})")
    return int(root_rank), None


def agree(ctl, what, root_rank, mine=None, error=None):
    """Collective over ``ctl``: gather every rank's ``(root_rank, mine)``
    and the ``error`` (an exception, or None) it found in its arguments;
    raise the same error on every rank when a rank reported one (of its
    kind, naming the rank: :func:`partialcoll.core.control.gather_checked`),
    and a ScheduleError when the roots differ or are not ranks.  Returns
    the list of every rank's ``mine`` (the caller compares them)."""
    everyone = control.gather_checked(ctl, what, (root_rank, mine), error)
    roots = [r for r, _ in everyone]
    if any(r != roots[0] for r in roots):
        raise ScheduleError(f"{what}: root_rank differs between ranks ("
                            + ", ".join(f"rank {i}={r}" for i, r in
                                        enumerate(roots)) + ")")
    size = ctl.Get_size()
    if not 0 <= roots[0] < size:
        raise ScheduleError(f"{what}: root_rank {roots[0]} is not a rank of "
                            f"a communicator of size {size}")
    return [m for _, m in everyone]


def broadcast_pickled(ctl, obj, root_rank, what):
    """``obj`` from ``root_rank`` to every rank through pickle (collective;
    ``obj`` matters at the root only).  An object the root cannot pickle,
    or a rank cannot unpickle, raises the same ScheduleError everywhere."""
    rank = ctl.Get_rank()
    payload = None
    if rank == root_rank:
        try:
            payload = (True, MPI.pickle.dumps(obj))
        except Exception as e:
            payload = (False, f"{type(e).__name__}: {e}")
    ok, data = ctl.bcast(payload, root=root_rank)
    if not ok:
        raise ScheduleError(f"{what}: rank {root_rank} cannot pickle the "
                            f"object ({data})")
    error = None
    if rank != root_rank:
        try:
            obj = MPI.pickle.loads(data)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    failed = [(r, e) for r, e in enumerate(ctl.allgather(error)) if e]
    control.settle()
    if failed:
        raise ScheduleError(f"{what}: cannot unpickle rank {root_rank}'s "
                            f"object: " + "; ".join(f"rank {r}: {e}"
                                                    for r, e in failed[:4]))
    return obj


def broadcast_object(obj: Any, root_rank: int = 0,
                     comm: MPI.Comm | None = None, *,
                     root: int | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (collective; pickled,
    like Horovod's ``hvd.broadcast_object``).  The root gets its own object
    back; other ranks get a copy.

    Args:
        obj: any picklable object (it matters at the root only).
        root_rank: the rank whose object everyone gets (``root`` is an
            alias).
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).

    Example::

        epoch = pct.broadcast_object(checkpoint.get("epoch", 0) if rank == 0
                                     else None, root_rank=0)
    """
    ctl = control_comm(comm)
    root_rank, error = root_argument(root_rank, root)
    agree(ctl, "broadcast_object", root_rank, error=error)
    return broadcast_pickled(ctl, obj, root_rank, "broadcast_object")
