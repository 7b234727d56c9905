"""Horovod's allreduce of tensors: ``hvd.allreduce``, the non-blocking
``allreduce_async`` with ``synchronize``/``poll``, and
``grouped_allreduce``: the average by default, or any reduction."""
from __future__ import annotations

import torch as _torch
from mpi4py import MPI

from ..collectives.allreduce import allreduce as _allreduce
from ..collectives.allreduce import iallreduce as _iallreduce
from ..core.checks import check_comm
from ..core.errors import ArgumentTypeError
from ..core.ops import OpLike
from ..core.request import Request


def _prepared(tensor, op, average, comm, what):
    """(tensor as partialcoll reads it, op, comm) for Horovod's arguments."""
    if not isinstance(tensor, _torch.Tensor):
        raise ArgumentTypeError(f"{what} takes a torch tensor, not "
                                f"{type(tensor).__name__}: use "
                                f"partialcoll.allreduce for NumPy arrays "
                                f"and other buffers")
    comm = check_comm(comm)
    if average is not None:
        op = "average" if average else "sum"
    if isinstance(op, str) and op.lower() == "sum":
        op = "SUM"
    # a lazily conjugated or negated view (z.conj(), z.conj().imag) as its
    # values: DLPack has no bit for either
    t = tensor.detach().resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t, op, comm


def allreduce(tensor: _torch.Tensor, op: OpLike = "average",
              average: bool | None = None, comm: MPI.Comm | None = None,
              compression: str | None = None,
              name: str | None = None) -> _torch.Tensor:
    """The average (or another reduction) of ``tensor`` over the ranks of
    ``comm`` (Horovod's ``hvd.allreduce``): a new tensor of the same shape,
    dtype and device; ``tensor`` is not modified.

    Args:
        tensor: a torch tensor (CPU; CUDA through CuPy, see the docs' GPU
            buffers page).
            A non-contiguous tensor is copied first, and so is a lazily
            conjugated or negated view (``z.conj().imag``); one that
            requires grad is read through ``detach()`` (the result is not
            differentiable).  Other types raise ArgumentTypeError, a
            ``TypeError`` (NumPy arrays: :func:`partialcoll.allreduce`).
        op: ``"average"`` (default, :data:`Average`) or ``"sum"``
            (:data:`Sum`), :data:`Min`, :data:`Max`, :data:`Product`, any
            partialcoll reduction (``partialcoll.MAX``, ``MPI.MIN``, ...)
            or a ``torch.distributed.ReduceOp``.  An average needs a
            floating-point (or complex) tensor.
        average: Horovod's older flag: True for the average, False for the
            sum (then leave ``op`` as it is).
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        compression: None or ``"fp16"`` (float16 on the wire, see
            :func:`partialcoll.allreduce`).
        name: accepted for Horovod's signature; not used (partialcoll
            matches calls by their order, as MPI does, not by name).

    bfloat16 and float16 tensors are summed in float32 and, for the
    average, divided in float32 too: the result is rounded to 16 bits once.

    Example::

        import partialcoll.torch as pct
        mean_loss = pct.allreduce(loss)                 # average
        total = pct.allreduce(counts, op=pct.Sum)
    """
    t, op, comm = _prepared(tensor, op, average, comm, "pct.allreduce")
    return _allreduce(t, op=_as_avg(op), comm=comm, compression=compression)


def allreduce_async(tensor: _torch.Tensor, op: OpLike = "average",
                    average: bool | None = None,
                    comm: MPI.Comm | None = None,
                    compression: str | None = None,
                    name: str | None = None) -> Request:
    """Start :func:`allreduce` of ``tensor`` and return its handle at once
    (Horovod's ``hvd.allreduce_async``): :func:`synchronize` waits for it
    and returns the result, :func:`poll` says whether it is done.  The
    tensor must stay unchanged until then.  Same arguments as
    :func:`allreduce`.

    Example::

        handles = [pct.allreduce_async(g) for g in grads]
        ...                                   # overlap other work
        grads = [pct.synchronize(h) for h in handles]
    """
    t, op, comm = _prepared(tensor, op, average, comm, "pct.allreduce_async")
    return _iallreduce(t, op=_as_avg(op), comm=comm, compression=compression)


def synchronize(handle: Request) -> _torch.Tensor:
    """Wait for a handle from :func:`allreduce_async` and return its result
    (Horovod's ``hvd.synchronize``)."""
    return _handle(handle).wait()


def poll(handle: Request) -> bool:
    """Whether the handle's allreduce is done, without waiting: then
    :func:`synchronize` returns at once (Horovod's ``hvd.poll``)."""
    return _handle(handle).test()


def grouped_allreduce(tensors: list[_torch.Tensor] | tuple[_torch.Tensor, ...],
                      op: OpLike = "average", average: bool | None = None,
                      comm: MPI.Comm | None = None,
                      compression: str | None = None,
                      name: str | None = None) -> list[_torch.Tensor]:
    """:func:`allreduce` of each tensor of the list ``tensors``, all in
    flight together; returns the results in order (Horovod's
    ``hvd.grouped_allreduce``).  Every tensor is checked before any is
    sent."""
    if isinstance(tensors, _torch.Tensor) or \
            not isinstance(tensors, (list, tuple)):
        raise ArgumentTypeError(f"grouped_allreduce takes a list of "
                                f"tensors, not {type(tensors).__name__}")
    for t in tensors:
        _prepared(t, op, average, comm, "pct.grouped_allreduce")
    handles = [allreduce_async(t, op, average, comm, compression)
               for t in tensors]
    return [synchronize(h) for h in handles]


def _as_avg(op):
    return "avg" if isinstance(op, str) and op.lower() == "average" else op


def _handle(handle):
    if not (hasattr(handle, "wait") and hasattr(handle, "test")):
        raise ArgumentTypeError(f"not a handle from allreduce_async: "
                                f"{type(handle).__name__} (pass what "
                                f"allreduce_async returned)")
    return handle
