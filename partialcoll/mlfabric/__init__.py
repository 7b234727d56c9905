"""MLfabric (Viswanathan and Akella, *Network-accelerated Distributed
Machine Learning Using MLfabric*, ``../shared/papers/mlfabric.txt``):
network-aware ordering, aggregation and replication of a parameter
server's updates.

The algorithms, without MPI (testable on their own):

* :mod:`.links`: the network as the scheduler sees it: per-NIC rates and
  a reservation timeline per link; t_en (Fig. 4) and NetUp;
* :mod:`.monitor`: the lagged link-rate monitor, the scheduler's only
  source of rates;
* :mod:`.ordering`: update ordering with deadlines from tau_max and the
  look-ahead drop (section 5.1, Algorithms 1 and 2);
* :mod:`.aggregation`: in-network aggregation (5.2, Algorithm 3) and
  MLfabric-S (section 6);
* :mod:`.replication`: bounded-divergence replication (5.3, Eq. 11);
* :mod:`.scheduler`: the three in sequence per batch;
* :mod:`.dyntree`: the allreduce variant's tree (section 6: Algorithm 3
  to a root, section 10.3's distribution back);
* :mod:`.program`: a batch plan as each rank's sends, receives, sums and
  applies (the first step of the end-to-end server, not built yet);
* :mod:`.microbench`: the scheduler's time per batch (section 7.4).

The end-to-end parameter server on the executor over the emulated network
(MPI): :func:`~partialcoll.mlfabric.training.train` (in ``training``;
ranks' roles in ``roles``, ``server``, ``worker``; a program as a schedule
in ``execute``), the optimizer and where momentum lives (``optim``), a
small model (``models``), the synchronous allreduce baselines and
MLfabric's allreduce (``allreduce_train``; the collective
:class:`~partialcoll.mlfabric.allreduce.DynamicTreeAllreduce` in
``allreduce``), and a torch front end (``partialcoll.torch.mlfabric``:
``train_torch``; needs torch, so not imported here).
"""
from .aggregation import Aggregation, Group, aggregate, aggregate_sync
from .dyntree import TreePlan, plan_tree
from .links import NetworkState, Timeline, Transfer
from .monitor import LinkMonitor
from .ordering import Ordering, Update, deadline, delays, order_updates
from .replication import (DivergenceTracker, Replication, divergence_bound,
                          replicate)
from .scheduler import BatchPlan, Scheduler
from .optim import SGD
from .models import SoftmaxRegression, TanhMLP

__all__ = ["Aggregation", "BatchPlan", "DivergenceTracker", "Group",
           "LinkMonitor", "NetworkState", "Ordering", "Replication",
           "Scheduler", "Timeline", "Transfer", "Update", "aggregate",
           "aggregate_sync", "deadline", "delays", "divergence_bound",
           "order_updates", "replicate", "SGD", "SoftmaxRegression",
           "TanhMLP", "train", "train_allreduce", "RunResult", "TreePlan",
           "plan_tree", "DynamicTreeAllreduce", "TrainingError"]


def __getattr__(name):
    """The MPI parts load on first use (the algorithms need no MPI)."""
    if name in ("train", "RunResult", "TrainingError"):
        from . import training
        return getattr(training, name)
    if name == "train_allreduce":
        from .allreduce_train import train_allreduce
        return train_allreduce
    if name == "DynamicTreeAllreduce":
        from .allreduce import DynamicTreeAllreduce
        return DynamicTreeAllreduce
    raise AttributeError(name)
