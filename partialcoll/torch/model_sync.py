"""``synchronize_model``: average a model's parameters and buffers across
the ranks (for a model that drifted, or after loading a checkpoint on one
rank)."""
from __future__ import annotations

import torch
from mpi4py import MPI

from ..core import control, libcomm
from ..core.checks import check_comm
from ..core.errors import ScheduleError
from .optimizer import live_optimizers
from .params import host_view


def _tensors(state):
    """(name, tensor) pairs of a module's state dict (or a dict / pairs),
    sorted by name, and a problem found in them (a string) or None.  The
    problem is returned, not raised, so that every rank learns of it in the
    same collective call (a rank raising alone would leave the others
    waiting)."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    try:
        items = list(state.items()) if isinstance(state, dict) \
            else list(state)
    except TypeError:
        return [], (f"synchronize_model takes the module or its "
                    f"state_dict(), not {type(state).__name__}")
    if not all(isinstance(it, tuple) and len(it) == 2 for it in items):
        return [], ("synchronize_model takes the module or its state_dict()"
                    " (or (name, tensor) pairs), not bare tensors such as "
                    "model.parameters(): pass the model")
    for n, t in items:
        if not isinstance(t, torch.Tensor):
            return [], f"{n} is not a tensor ({type(t).__name__})"
    return sorted(items, key=lambda it: it[0]), None


def _check_same(comm, items, problem, what):
    """Raise on every rank when any rank found a problem in its tensors or
    their names, shapes and dtypes differ between ranks (one allgather)."""
    mine = [(n, tuple(t.shape), str(t.dtype)) for n, t in items]
    everyone = comm.allgather((problem, mine))
    rank = comm.Get_rank()
    for r, (their_problem, _) in enumerate(everyone):
        if their_problem is not None:
            where = "this rank" if r == rank else f"rank {r}"
            raise ScheduleError(f"{what}: on {where}, {their_problem}")
    for r, (_, theirs) in enumerate(everyone):
        if theirs != mine:
            a, b = dict((n, s) for n, *s in mine), dict((n, s) for n, *s in theirs)
            diff = sorted(set(a) ^ set(b)) or sorted(
                n for n in a if a[n] != b.get(n))
            raise ScheduleError(f"{what}: the tensors differ between rank "
                                f"{rank} and rank {r} "
                                f"(first differences: {diff[:4]})")


def synchronize_model(model: torch.nn.Module,
                      comm: MPI.Comm | None = None) -> None:
    """Average ``model``'s floating-point parameters and buffers across the
    ranks of ``comm`` (collective).  Integer buffers take rank 0's value.
    bfloat16 and float16 tensors are averaged in float32 and rounded back.

    It first flushes every open :class:`EagerOptimizer` on the same ranks
    (in creation order), so pending gradients are applied and no rank is
    left waiting inside a partial allreduce for this one.  An
    :class:`EagerHook` needs the optimizer to apply what it flushes, so it
    is not flushed here: call ``hook.flush(optimizer)`` first.

    A state that is not all tensors, or that differs between ranks in
    names, shapes or dtypes, raises ``partialcoll.ScheduleError`` on every
    rank.
    """
    comm = check_comm(comm)
    for opt in live_optimizers(comm):
        opt.flush()
    libcomm.library_comm(comm).before_collective()    # flush function forms
    items, problem = _tensors(model)
    _check_same(comm, items, problem, "synchronize_model")
    P = comm.Get_size()
    with torch.no_grad():
        for _, t in items:
            _average_one(comm, t, P)
    control.settle()


def _average_one(comm, t, P):
    """Average one tensor in place over ``comm`` (rank 0's value for an
    integer or bool tensor)."""
    narrow = t.dtype in (torch.bfloat16, torch.float16)
    host = t.detach().to("cpu", torch.float32).numpy() if narrow \
        else host_view(t)
    if t.is_floating_point() or t.is_complex():
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        host /= P
    else:
        comm.Bcast(host, root=0)
    if narrow or host.ctypes.data != t.data_ptr() or t.device.type != "cpu":
        t.copy_(torch.from_numpy(host))
