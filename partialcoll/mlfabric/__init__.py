"""MLfabric (Viswanathan and Akella, *Network-accelerated Distributed
Machine Learning Using MLfabric*): network-aware ordering, aggregation
and replication of a parameter server's updates.

Two halves, the second built on the first:

* :mod:`.scheduler` -- the paper's algorithms, without MPI (testable on
  their own): the network as the scheduler sees it (``links``), the
  lagged link monitor (``monitor``), update ordering (``ordering``,
  section 5.1), in-network aggregation (``aggregation``, 5.2),
  bounded-divergence replication (``replication``, 5.3), the three in
  sequence per batch (``batch``:
  :class:`~partialcoll.mlfabric.scheduler.batch.Scheduler`), the allreduce
  variant's tree (``dyntree``) and the scheduler's time per batch
  (``microbench``).
* :mod:`.runtime` -- running them over MPI on the executor and the
  emulated network: the end-to-end parameter server
  (:func:`~partialcoll.mlfabric.runtime.training.train`; ranks' roles in
  ``roles``, ``server``, ``worker``; a batch plan as each rank's ops in
  ``program`` and as a schedule in ``execute``), MLfabric's allreduce
  (:class:`~partialcoll.mlfabric.runtime.allreduce.DynamicTreeAllreduce`,
  and the synchronous baselines in ``allreduce_train``), the run's
  settings (``config``), the optimizer and where momentum lives
  (``optim``) and small models (``models``).

A torch front end is ``partialcoll.torch.mlfabric`` (``train_torch``).
"""
from .scheduler.aggregation import (Aggregation, Group, aggregate,
                                    aggregate_sync)
from .scheduler.dyntree import TreePlan, plan_tree
from .scheduler.links import NetworkState, Timeline, Transfer
from .scheduler.monitor import LinkMonitor
from .scheduler.ordering import (Ordering, Update, deadline, delays,
                                 order_updates)
from .scheduler.replication import (DivergenceTracker, Replication,
                                    divergence_bound, replicate)
from .scheduler.batch import BatchPlan, Scheduler
from .runtime.optim import SGD
from .runtime.models import SoftmaxRegression, TanhMLP

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
        from .runtime import training
        return getattr(training, name)
    if name == "train_allreduce":
        from .runtime.allreduce_train import train_allreduce
        return train_allreduce
    if name == "DynamicTreeAllreduce":
        from .runtime.allreduce import DynamicTreeAllreduce
        return DynamicTreeAllreduce
    raise AttributeError(name)
