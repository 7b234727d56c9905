"""MLfabric's scheduler: the paper's algorithms, without MPI.

Per batch of updates (:class:`~.batch.Scheduler`): order them
with deadlines from tau_max and drop what cannot make it (:mod:`.ordering`,
section 5.1), aggregate them in the network where that finishes sooner
(:mod:`.aggregation`, 5.2), and replicate them to the replica within a
divergence bound (:mod:`.replication`, 5.3), all against the network as
the scheduler sees it (:mod:`.links`: per-NIC rates from the lagged
:mod:`.monitor`, a reservation timeline per link).
"""
from .batch import BatchPlan, Scheduler

__all__ = ["BatchPlan", "Scheduler"]
