"""Horovod's ``hvd.allreduce`` of one tensor: the sum or the average."""
import torch as _torch

from ..collectives.allreduce import allreduce as _allreduce
from ..core.checks import check_comm
from ..core.errors import ScheduleError


def allreduce(tensor, op="average", average=None, comm=None,
              compression=None):
    """The sum or average of ``tensor`` over the ranks of ``comm``
    (Horovod's ``hvd.allreduce``): a new tensor of the same shape, dtype
    and device; ``tensor`` is not modified.

    Args:
        tensor: a torch tensor (CPU; CUDA through CuPy, see the docs' GPU
            buffers page).
            A non-contiguous tensor is copied first, and so is a lazily
            conjugated or negated view (``z.conj().imag``); one that
            requires grad is read through ``detach()`` (the result is not
            differentiable).  Other types raise ScheduleError (NumPy arrays:
            :func:`partialcoll.allreduce`).
        op: ``"average"`` (default) or ``"sum"``, or any partialcoll
            reduction (``partialcoll.MAX``, ``MPI.MIN``, ...).  An average
            needs a floating-point tensor.
        average: Horovod's older flag: True for the average, False for the
            sum (then leave ``op`` as it is).
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        compression: None or ``"fp16"`` (float16 on the wire, see
            :func:`partialcoll.allreduce`).

    bfloat16 and float16 tensors are summed in float32 and, for the
    average, divided in float32 too: the result is rounded to 16 bits once.

    Example::

        import partialcoll.torch as pct
        mean_loss = pct.allreduce(loss)                 # average
        total = pct.allreduce(counts, op="sum")
    """
    if not isinstance(tensor, _torch.Tensor):
        raise ScheduleError(f"pct.allreduce takes a torch tensor, not "
                        f"{type(tensor).__name__}: use partialcoll.allreduce "
                        f"for NumPy arrays and other buffers")
    comm = check_comm(comm)
    if average is not None:
        op = "average" if average else "sum"
    name = op.lower() if isinstance(op, str) else None
    # a lazily conjugated or negated view (z.conj(), z.conj().imag) as its
    # values: DLPack has no bit for either
    t = tensor.detach().resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if name != "average":
        return _allreduce(t, op="SUM" if name == "sum" else op, comm=comm,
                          compression=compression)
    if not t.is_floating_point():
        raise ScheduleError(f"an average needs a floating-point tensor, "
                            f"not {t.dtype}: use op='sum'")
    size = comm.Get_size()
    if t.element_size() == 2:              # bfloat16/float16: round once
        total = _allreduce(t.float(), comm=comm, compression=compression)
        return total.div_(size).to(t.dtype)
    return _allreduce(t, comm=comm, compression=compression).div_(size)
