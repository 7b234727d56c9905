"""Horovod's process functions and its optimizer, under Horovod's names, so
that a Horovod PyTorch script ports by changing its import line::

    import partialcoll.torch as hvd       # was: import horovod.torch as hvd
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

and its launcher (``mpiexec -n 4 python -m mpi4py train.py`` for
``horovodrun -np 4 python train.py``).  :func:`init_process_group` gives a
``torch.distributed`` script its process group from the MPI ranks, in one
call."""
from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from ..core import control
from ..core.checks import check_comm, require_thread_multiple
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.ops import OpLike
from .optimizer import EagerOptimizer

if TYPE_CHECKING:
    import torch

_local: MPI.Comm | None = None      # this host's shared-memory comm


def init(comm: None = None) -> None:
    """Horovod's ``hvd.init()``: MPI is initialised by mpi4py when partialcoll
    is imported, so this only checks that it runs with
    ``MPI_THREAD_MULTIPLE`` and finds this host's ranks for
    :func:`local_rank` and :func:`local_size`.  Collective over
    ``MPI.COMM_WORLD``: every rank calls it.  Calling it again does
    nothing.  ``comm`` must be None: partialcoll's calls take their
    communicator as an argument (``comm=``) instead."""
    global _local
    if comm is not None:
        raise ScheduleError("init() takes no communicator: pass comm= to "
                            "each partialcoll call instead (the default is "
                            "MPI.COMM_WORLD)")
    require_thread_multiple()
    if _local is None:
        _local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)


def is_initialized() -> bool:
    """Whether :func:`init` was called."""
    return _local is not None


def rank() -> int:
    """This process's rank in ``MPI.COMM_WORLD`` (``hvd.rank()``)."""
    return MPI.COMM_WORLD.rank


def size() -> int:
    """The number of processes in ``MPI.COMM_WORLD`` (``hvd.size()``)."""
    return MPI.COMM_WORLD.size


def local_rank() -> int:
    """This process's rank among the processes on its host
    (``hvd.local_rank()``): the GPU to pin.  Needs :func:`init`."""
    return _host().rank


def local_size() -> int:
    """The number of processes on this host (``hvd.local_size()``).
    Needs :func:`init`."""
    return _host().size


def _host():
    if _local is None:
        raise ScheduleError("call partialcoll.torch.init() first (on every "
                            "rank: it finds the ranks of each host)")
    return _local


def mpi_threads_supported() -> bool:
    """True: partialcoll runs only with ``MPI_THREAD_MULTIPLE``."""
    return True


def DistributedOptimizer(
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: str | None = None, backward_passes_per_step: int = 1,
        op: OpLike = "average", gradient_predivide_factor: float = 1.0, *,
        comm: MPI.Comm | None = None, num_groups: int = 0,
        groups: None = None, sparse_as_dense: bool = False
        ) -> EagerOptimizer:
    """Horovod's ``hvd.DistributedOptimizer``: synchronous data parallelism,
    the gradients averaged (``op="average"``, or summed: ``"sum"``) by a
    full allreduce every step.  Returns an :class:`EagerOptimizer` in mode
    ``"sync"``; the partial modes, which do not wait for late ranks, are
    chosen by name: ``EagerOptimizer(..., mode="solo")``.

    Arguments as Horovod's, in Horovod's order.  ``compression``: None
    (``Compression.none``) or ``"fp16"`` (``Compression.fp16``).
    ``num_groups``, ``groups`` and ``sparse_as_dense`` are refused unless
    left at their defaults (gradients travel in buckets of about 25 MiB,
    in backward order; sparse gradients are refused)."""
    if num_groups or groups is not None or sparse_as_dense:
        raise ScheduleError("DistributedOptimizer: num_groups, groups and "
                            "sparse_as_dense are not supported (the "
                            "gradients go in buckets: bucket_bytes= of "
                            "EagerOptimizer)")
    return EagerOptimizer(
        optimizer, named_parameters, mode="sync", comm=comm, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        compression=compression)


def init_process_group(backend: str = "gloo", comm: MPI.Comm | None = None,
                       timeout: float | datetime.timedelta | None = None
                       ) -> torch.distributed.ProcessGroup | None:
    """Set up ``torch.distributed``'s default process group over the ranks
    of ``comm`` (default ``MPI.COMM_WORLD``), with no launcher of torch's:
    rank 0 starts the rendezvous store on a port the system picks and
    sends its address and port to the others over MPI.  Collective.  For
    the DDP communication hook (:class:`EagerHook`), which needs a process
    group although its gradients travel over MPI.

    The address is ``MASTER_ADDR`` if rank 0 has it set, else 127.0.0.1
    when every rank runs on one host, else rank 0's fully qualified host
    name (set ``MASTER_ADDR`` where the others cannot resolve it).
    ``timeout``: seconds, or a ``datetime.timedelta`` (torch's default
    when None).  Returns ``torch.distributed``'s default group."""
    import torch.distributed as dist
    comm = check_comm(comm)
    if not isinstance(backend, str):
        raise ArgumentTypeError(f"backend must be a name such as 'gloo', "
                                f"not {type(backend).__name__}")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        if isinstance(timeout, bool) or \
                not isinstance(timeout, (int, float)):
            raise ArgumentTypeError(f"timeout must be a positive number of "
                                    f"seconds or a timedelta, not "
                                    f"{timeout!r}")
        if timeout <= 0:
            raise ScheduleError(f"timeout must be a positive number of "
                                f"seconds or a timedelta, not {timeout!r}")
        timeout = datetime.timedelta(seconds=timeout)
    hosts = comm.allgather(MPI.Get_processor_name())
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    where, store = None, None
    if comm.rank == 0:
        addr = os.environ.get("MASTER_ADDR") or \
            ("127.0.0.1" if len(set(hosts)) == 1 else socket.getfqdn())
        # the store listens on a port the system picks and keeps it: a
        # port found free and closed again could be taken (another rank's
        # network module, another job) before the store bound it
        store = dist.TCPStore(addr, 0, comm.size, True,
                              wait_for_workers=False, **kwargs)
        where = (addr, store.port)
    addr, port = comm.bcast(where, root=0)
    if store is None:
        store = dist.TCPStore(addr, port, comm.size, False, **kwargs)
    # every rank has the address before anyone blocks outside MPI: a
    # network module may move the broadcast only while rank 0 calls MPI
    # (OFI's TCP provider does), and rank 0 is about to wait in
    # torch.distributed for the others to connect
    comm.Barrier()
    control.settle()        # and rank 0's last message of the barrier too
    dist.init_process_group(backend, store=store, rank=comm.rank,
                            world_size=comm.size, **kwargs)
    return dist.group.WORLD
