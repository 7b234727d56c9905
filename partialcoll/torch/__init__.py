"""``import partialcoll.torch as pct``: every PyTorch-facing part of
partialcoll.

* :class:`EagerOptimizer` (``optimizer``, with ``overlap``,
  ``accumulation`` and ``params``): eager-SGD's optimizer wrapper;
* :class:`EagerHook` / :func:`eager_comm_hook` (``ddp``): the DDP comm
  hook;
* Horovod's names (``horovod``): :func:`init`, :func:`rank`,
  :func:`local_rank`, ..., :class:`DistributedOptimizer` (synchronous),
  :func:`init_process_group` for torch.distributed;
* Horovod's broadcasts (``broadcast``) and its allreduce of tensors
  (``allreduce``): :func:`allreduce`, :func:`allreduce_async`,
  :func:`synchronize`, :func:`poll`, :func:`grouped_allreduce`;
* :class:`RPSOptimizer` (``rps``): training over lossy links;
* ``partialcoll.torch.mlfabric``: a torch model on MLfabric's parameter
  server (imported on first use).

Needs torch (``pip install partialcoll[torch]``).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:            # pragma: no cover - depends on the env
    raise ImportError("partialcoll.torch needs PyTorch: pip install "
                      "'partialcoll[torch]' (or your own torch build)") from e

from ..collectives.broadcast import broadcast_object  # noqa: E402
from ..collectives.staging import Compression  # noqa: E402
from ..eager import StepInfo  # noqa: E402
from .allreduce import (allreduce, allreduce_async,  # noqa: E402
                        grouped_allreduce, poll, synchronize)
from .broadcast import (broadcast_optimizer_state,  # noqa: E402
                        broadcast_parameters)
from .ddp import EagerHook, eager_comm_hook  # noqa: E402
from .model_sync import synchronize_model  # noqa: E402
from .horovod import (DistributedOptimizer, init,  # noqa: E402
                      init_process_group, is_initialized, local_rank,
                      local_size, mpi_threads_supported, rank, size)
from .optimizer import EagerOptimizer  # noqa: E402
from .rps import RPSOptimizer  # noqa: E402

#: Horovod's names of the reductions: ``Average`` and ``Sum`` for the
#: optimizers' ``op=``; all of them for :func:`allreduce`.
Average, Sum, Min, Max, Product = "average", "sum", "min", "max", "prod"

__all__ = ["EagerOptimizer", "EagerHook", "eager_comm_hook",
           "broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "synchronize_model", "StepInfo",
           "RPSOptimizer", "Average", "Sum", "Min", "Max", "Product",
           "Compression", "allreduce", "allreduce_async", "synchronize",
           "poll", "grouped_allreduce", "init", "is_initialized", "rank",
           "size", "local_rank", "local_size", "mpi_threads_supported",
           "DistributedOptimizer", "init_process_group"]
