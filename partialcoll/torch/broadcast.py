"""Horovod's broadcasts for PyTorch: the same start on every rank.

::

    import partialcoll.torch as pct
    if rank == 0:
        ckpt = torch.load(path); model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
    pct.broadcast_parameters(model.state_dict(), root_rank=0)
    pct.broadcast_optimizer_state(opt, root_rank=0)

Tensors travel as raw bytes (one ``MPI_Bcast`` each on the library's control
duplicate of the communicator), so every dtype torch has arrives bit for bit,
bfloat16 and bool included.  CUDA and non-contiguous tensors are staged
through a contiguous host copy.  Every function is collective, checks what
each rank passed with one allgather first, and raises the same error on
every rank: a ScheduleError when the ranks disagree, and the kind one
rank found in what it passed when it found a problem there (a wrong type
is an ArgumentTypeError everywhere; see
:mod:`partialcoll.collectives.broadcast`).
They do not flush open
:class:`~partialcoll.torch.EagerOptimizer` objects: like any collective,
call ``opt.flush()`` first if steps were taken (a rank inside a majority or
quorum step may be waiting for you).
"""
from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import TypeAlias

import torch
from mpi4py import MPI

from ..core.errors import ArgumentTypeError, ScheduleError
from ..collectives.broadcast import (agree, broadcast_pickled, control_comm,
                                     root_argument)


# what broadcast_parameters takes (see there)
Parameters: TypeAlias = (Mapping[str, torch.Tensor]
                          | Iterable[tuple[str, torch.Tensor]]
                          | Iterable[torch.Tensor] | torch.nn.Module)


def broadcast_parameters(params: Parameters, root_rank: int = 0,
                         comm: MPI.Comm | None = None, *,
                         root: int | None = None) -> None:
    """Copy ``root_rank``'s tensors into every rank's, in place
    (collective; Horovod's ``hvd.broadcast_parameters``).

    Args:
        params: ``model.state_dict()`` (or any dict of tensors),
            ``model.named_parameters()`` or a list of ``(name, tensor)``
            pairs (taken in name order), a list of tensors (taken in list
            order), or the module itself (its ``state_dict()``).  Every rank
            must pass the same names, shapes and dtypes.
        root_rank: the rank whose values everyone gets (``root`` is an
            alias, partialcoll's older name).
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).

    Example::

        pct.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    ctl = control_comm(comm)
    root_rank, error = root_argument(root_rank, root)
    items = None
    if error is None:
        try:
            items = named_tensors(params)
        except (ScheduleError, TypeError, ValueError) as e:
            error = e
    mine = None if items is None else describe(items)
    everyone = agree(ctl, "broadcast_parameters", root_rank, mine, error)
    _same_tensors("broadcast_parameters", everyone, root_rank)
    assert items is not None            # agree() raised the error otherwise
    with torch.no_grad():
        for _, t in items:
            bcast_tensor(ctl, t, root_rank)


def named_tensors(params):
    """``[(name, tensor)]`` from the forms :func:`broadcast_parameters`
    takes: a dict or pairs sorted by name, bare tensors named by position."""
    if isinstance(params, torch.nn.Module):
        params = params.state_dict()
    if isinstance(params, torch.Tensor):
        raise ArgumentTypeError("params is one tensor: pass a list of "
                                "tensors, a state_dict() or "
                                "named_parameters()")
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        try:
            listed = list(params)
        except TypeError:
            raise ArgumentTypeError(f"params must be a state_dict(), "
                                    f"named_parameters() or a list of "
                                    f"tensors, not "
                                    f"{type(params).__name__}") from None
        pairs = [isinstance(x, tuple) and len(x) == 2 for x in listed]
        if listed and all(pairs):
            items = sorted(listed, key=lambda kv: str(kv[0]))
        elif not any(pairs):
            items = [(f"[{i}]", t) for i, t in enumerate(listed)]
        else:
            raise ScheduleError("params mixes (name, tensor) pairs and bare "
                                "tensors: pass one kind")
    counts = collections.Counter(str(n) for n, _ in items)
    dup = sorted(n for n, c in counts.items() if c > 1)
    if dup:
        raise ScheduleError(f"params repeats names: {dup[:4]}")
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name} is {type(t).__name__}, not a "
                                    f"tensor (broadcast_object carries "
                                    f"other values)")
        if t.layout != torch.strided:
            raise ScheduleError(f"{name} is a {t.layout} tensor: only dense "
                                f"tensors are broadcast")
    return [(str(n), t) for n, t in items]


def describe(items):
    """``[(name, shape, dtype)]``: what every rank must agree on."""
    return [(n, tuple(t.shape), str(t.dtype)) for n, t in items]


def _same_tensors(what, everyone, root_rank):
    """Raise (the same error on every rank) unless every rank's
    ``[(name, shape, dtype)]`` equals the root's."""
    ref = everyone[root_rank]
    differ = [r for r, d in enumerate(everyone) if d != ref]
    if not differ:
        return
    r = differ[0]
    a = {n: (s, d) for n, s, d in ref}
    b = {n: (s, d) for n, s, d in everyone[r]}
    parts = []
    only_root, only_r = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_root:
        parts.append(f"only rank {root_rank} has {_few(only_root)}")
    if only_r:
        parts.append(f"only rank {r} has {_few(only_r)}")
    for n in sorted(n for n in set(a) & set(b) if a[n] != b[n])[:3]:
        parts.append(f"{n} is {a[n][0]} {a[n][1]} on rank {root_rank} but "
                     f"{b[n][0]} {b[n][1]} on rank {r}")
    if not parts:
        parts.append("the same tensors in a different order")
    more = f" (and {len(differ) - 1} other ranks)" if len(differ) > 1 else ""
    raise ScheduleError(f"{what}: the tensors differ between rank "
                        f"{root_rank} (the root) and rank {r}{more}: "
                        + "; ".join(parts))


def _few(names):
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more"
                                   if len(names) > 4 else "")


def bcast_tensor(ctl, t, root_rank):
    """``t`` on ``root_rank`` into ``t`` everywhere, as bytes (collective;
    call under ``torch.no_grad()``)."""
    if t.numel() == 0:
        return
    host = t.detach()
    staged = (host.device.type != "cpu" or not host.is_contiguous()
              or host.is_conj() or host.is_neg())
    if staged:
        host = host.resolve_conj().resolve_neg().cpu().contiguous()
    ctl.Bcast(host.reshape(-1).view(torch.uint8).numpy(), root=root_rank)
    if staged and ctl.Get_rank() != root_rank:
        t.copy_(host)


# -- optimizer state ----------------------------------------------------------
class _TensorSlot:
    """Where a tensor of the root's optimizer ``state_dict()`` goes: its
    place in the broadcast order, shape and dtype (the bytes follow)."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype

    def __getstate__(self):
        return (self.index, self.shape, self.dtype)

    def __setstate__(self, state):
        self.index, self.shape, self.dtype = state


def _strip(value, tensors):
    """``value`` (a state_dict) with every tensor replaced by a
    :class:`_TensorSlot`; the tensors are appended to ``tensors``.  Dicts,
    lists and tuples are rebuilt as plain ones (all ``load_state_dict``
    needs)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_strip(v, tensors) for v in value]
        return tuple(out) if isinstance(value, tuple) else out
    return value


def _fill(value, tensors):
    """The inverse of :func:`_strip`."""
    if isinstance(value, _TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_fill(v, tensors) for v in value]
        return tuple(out) if isinstance(value, tuple) else out
    return value


def _slots(value, out):
    """Every :class:`_TensorSlot` in ``value``, in index order."""
    if isinstance(value, _TensorSlot):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _slots(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _slots(v, out)
    return sorted(out, key=lambda s: s.index)


def _layout(optimizer):
    """What every rank's optimizer must agree on: its class and, per
    parameter group, each parameter's shape and dtype."""
    for attr in ("state_dict", "load_state_dict", "param_groups"):
        if not hasattr(optimizer, attr):
            raise ArgumentTypeError(f"broadcast_optimizer_state takes a "
                                    f"torch.optim.Optimizer (or an "
                                    f"EagerOptimizer), not "
                                    f"{type(optimizer).__name__}")
    inner = getattr(optimizer, "optimizer", optimizer)
    return {"class": type(inner).__name__,
            "groups": [[(tuple(p.shape), str(p.dtype)) for p in g["params"]]
                       for g in optimizer.param_groups]}


def _same_layout(everyone, root_rank):
    ref = everyone[root_rank]
    differ = [r for r, d in enumerate(everyone) if d != ref]
    if not differ:
        return
    r, theirs = differ[0], everyone[differ[0]]
    if theirs["class"] != ref["class"]:
        why = f"{ref['class']} on rank {root_rank}, {theirs['class']} on " \
              f"rank {r}"
    elif len(theirs["groups"]) != len(ref["groups"]):
        why = (f"{len(ref['groups'])} parameter groups on rank {root_rank}, "
               f"{len(theirs['groups'])} on rank {r}")
    else:
        g = next(i for i, (x, y) in enumerate(zip(ref["groups"],
                                                  theirs["groups"])) if x != y)
        x, y = ref["groups"][g], theirs["groups"][g]
        if len(x) != len(y):
            why = (f"parameter group {g} has {len(x)} parameters on rank "
                   f"{root_rank}, {len(y)} on rank {r}")
        else:
            i = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
            why = (f"parameter {i} of group {g} is {x[i][0]} {x[i][1]} on "
                   f"rank {root_rank} but {y[i][0]} {y[i][1]} on rank {r}")
    raise ScheduleError(f"broadcast_optimizer_state: the optimizers differ "
                        f"between rank {root_rank} (the root) and rank {r}: "
                        f"{why}")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer,
                              root_rank: int = 0,
                              comm: MPI.Comm | None = None, *,
                              root: int | None = None) -> None:
    """Make every rank's optimizer state and hyper-parameters ``root_rank``'s,
    bit for bit (collective; Horovod's ``hvd.broadcast_optimizer_state``).

    The root's ``state_dict()`` goes to every rank: its structure and every
    value that is not a tensor (``lr``, ``betas``, ...) pickled, its tensors
    (momentum buffers, Adam's ``exp_avg``, ``exp_avg_sq`` and ``step``) as
    raw bytes; the other ranks then ``load_state_dict()`` it.  So it works
    when only the root loaded a checkpoint: the others' state is replaced,
    created or emptied to match, whatever it was.

    Args:
        optimizer: a ``torch.optim.Optimizer`` or a
            :class:`~partialcoll.torch.EagerOptimizer` (whose state is its
            wrapped optimizer's).  Every rank's must be of the same class,
            with the same parameter groups of the same shapes and dtypes.
        root_rank: the rank whose state everyone gets (``root``: alias).
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).

    Example::

        if rank == 0:
            opt.load_state_dict(torch.load(path)["optimizer"])
        pct.broadcast_parameters(model.state_dict(), root_rank=0)
        pct.broadcast_optimizer_state(opt, root_rank=0)
    """
    ctl = control_comm(comm)
    root_rank, error = root_argument(root_rank, root)
    mine = None
    if error is None:
        try:
            mine = _layout(optimizer)
        except (ScheduleError, TypeError, ValueError) as e:
            error = e
    everyone = agree(ctl, "broadcast_optimizer_state", root_rank, mine,
                     error)
    _same_layout(everyone, root_rank)
    tensors: list[torch.Tensor] = []
    skeleton = None
    if ctl.Get_rank() == root_rank:
        skeleton = _strip(optimizer.state_dict(), tensors)
    skeleton = broadcast_pickled(ctl, skeleton, root_rank,
                                 "broadcast_optimizer_state")
    if ctl.Get_rank() != root_rank:
        tensors = [torch.empty(s.shape, dtype=s.dtype)
                   for s in _slots(skeleton, [])]
    with torch.no_grad():
        for t in tensors:
            bcast_tensor(ctl, t, root_rank)
    if ctl.Get_rank() != root_rank:
        optimizer.load_state_dict(_fill(skeleton, tensors))
