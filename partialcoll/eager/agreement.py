"""The setup agreement of eager-SGD's wrappers: every rank checks its own
arguments, then one allgather tells every rank what every other found, so
a mistake made on some ranks raises the same error everywhere instead of a
hang."""
from __future__ import annotations

from typing import NoReturn

from mpi4py import MPI

from ..collectives.broadcast import agree as agree_or_raise
from ..core import control, libcomm
from ..core.checks import check_comm
from ..core.errors import ScheduleError
from ._checks import describe_gradient_mismatch


def describe_problem(error):
    """An argument error as the line every rank reports."""
    return str(error) if isinstance(error, ScheduleError) else \
        f"{type(error).__name__}: {error}"


def agree_on_setup(ctl, mine, problem):
    """Collective over ``ctl``: raise the same ScheduleError on every rank
    when a rank found a ``problem`` in its arguments (a string; its
    ``mine`` is then None) or the ranks' ``mine`` dicts differ.  One
    allgather (:func:`partialcoll.broadcast.agree`, root 0 standing for
    "no root")."""
    everyone = agree_or_raise(ctl, "eager-SGD setup refused", 0, mine, problem)
    bad = [k for k in mine if any(d.get(k) != mine[k] for d in everyone)]
    if not bad:
        return
    lines = [describe_gradient_mismatch([d[k] for d in everyone])
             if k == "gradients" else control.per_rank(everyone, k)
             for k in bad]
    raise ScheduleError("eager-SGD set up differently on different ranks: "
                        + "; ".join(lines))


def refuse_setup(comm: MPI.Comm | None, problem: BaseException) -> NoReturn:
    """Collective: for a wrapper that found ``problem`` (an exception) in
    its own arguments before it could make its :class:`EagerAverager`:
    joins the agreement the other ranks' averagers run, so the same
    ScheduleError is raised on every rank instead of a hang.  Never
    returns."""
    comm = check_comm(comm)
    agree_on_setup(libcomm.library_comm(comm).ctl, None, describe_problem(problem))
    raise AssertionError("unreachable: the agreement raised")
