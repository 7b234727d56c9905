"""The setup agreement of eager-SGD's wrappers: every rank checks its own
arguments, then one allgather tells every rank what every other found, so
a mistake made on some ranks raises the same error everywhere, of the
kind the rank that found it saw (a wrong type is an ArgumentTypeError on
every rank), instead of a hang."""
from __future__ import annotations

from typing import NoReturn

from mpi4py import MPI

from ..core import control, libcomm
from ..core.checks import check_comm
from ..core.errors import ScheduleError
from ._checks import describe_gradient_mismatch


def agree_on_setup(ctl, mine, problem):
    """Collective over ``ctl``: raise the same error on every rank when a
    rank found a ``problem`` in its arguments (an exception; its ``mine``
    is then None): of that problem's kind, naming the rank
    (:func:`partialcoll.core.control.gather_checked`); a ScheduleError
    when the ranks' ``mine`` dicts differ.  One allgather."""
    everyone = control.gather_checked(ctl, "eager-SGD setup refused", mine,
                                      problem)
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
    joins the agreement the other ranks' averagers run, so every rank
    raises the same error, of ``problem``'s kind, instead of a hang.
    Never returns."""
    comm = check_comm(comm)
    agree_on_setup(libcomm.library_comm(comm).ctl, None, problem)
    raise AssertionError("unreachable: the agreement raised")
