"""MLfabric's scheduler (section 4): every batch of ready updates goes
through ordering (5.1), aggregation (5.2) and replication (5.3), on the
network as the lagged monitor reports it.

Design constraints:

1. Pure algorithm: no MPI, no clocks of its own; the caller passes ``now``
   and the updates, and turns the plan into transfers.
2. It sees rates only through a :class:`~.monitor.LinkMonitor`.
3. Reservations outlive a batch: a transfer planned by one batch still
   holds its bandwidth when the next is planned (the network state is kept
   and trimmed, its rates refreshed from the monitor).
4. Versions are planned ahead: v_init of a batch counts every update kept
   by earlier batches, applied or not yet; a batch's commits complete no
   earlier than the last commit planned before it, so the server applies
   batches in order.
"""
import random
import time

from .aggregation import aggregate, aggregate_sync
from .links import INF, NetworkState
from .ordering import delays, order_updates
from .replication import DivergenceTracker, replicate
from ...core.errors import ScheduleError


class BatchPlan:
    """The scheduler's decisions for one batch.

    Attributes:
        now, v_init: when it was planned, and the version before it.
        order: kept updates, in the order the server applies them.
        dropped: [(update, reason)]; never sent (see ordering).
        groups: the server's commits (:class:`~.aggregation.Group`).
        aggregators: the k nodes drawn for this batch.
        replication: a :class:`~.replication.Replication` or None.
        delays: {uid: planned delay} (the paper's convention).
        timings: wall seconds spent in "order", "aggregate", "replicate",
            "total"; cpu: the same in this thread's CPU seconds (robust to
            a loaded machine).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def direct(self):
        """uids sent straight to the server."""
        return [g.uid for grp in self.groups if grp.aggregator is None
                for g in grp.members]


class Scheduler:
    """The scheduler of one parameter server.

    Args:
        server: the server's node.
        workers: the worker nodes (aggregators are drawn from them).
        monitor: a :class:`~.monitor.LinkMonitor` (the only rate source).
        tau_max: the delay bound.
        aggregators: k, drawn at random per batch (the paper), or a list
            of nodes used in that order.
        replica: the replica's node, or None.
        replica_aggregators: k' (drawn apart from the k when possible) or a
            list.
        div_max: Div_max for the replica.
        gamma: the server's momentum (for the divergence bound).
        interval: seconds between batches (the paper: 100 ms).
        seed: for the aggregator draws.

    Example::

        mon = LinkMonitor(out, inn, lag=0.2)
        s = Scheduler(0, [1, 2, 3, 4], mon, tau_max=8, aggregators=2)
        plan = s.plan(now, [Update(...), ...])
        plan.order, plan.dropped, plan.groups
    """

    def __init__(self, server, workers, monitor, tau_max, aggregators=2,
                 replica=None, replica_aggregators=1, div_max=INF,
                 gamma=0.0, interval=0.1, seed=0):
        if tau_max < 1:
            raise ScheduleError(f"tau_max must be >= 1, got {tau_max!r}")
        self.server, self.replica = server, replica
        self.workers = [w for w in workers if w not in (server, replica)]
        self.monitor, self.tau_max = monitor, int(tau_max)
        self.k, self.k_replica = aggregators, replica_aggregators
        self.div_max, self.interval = float(div_max), float(interval)
        self.rng = random.Random(seed)
        self.net = None
        self.version = 0               # v_init of the next batch
        self.server_floor = -INF       # the last planned server commit
        self.replica_floor = -INF
        self.backlog, self.server_time = [], {}
        self.inflight = []             # replica commits frozen, not ended
        self.tracker = DivergenceTracker(gamma)

    def _network(self, now):
        out, inn = self.monitor.rates(now)
        if self.net is None:
            self.net = NetworkState(out, inn, now)
        else:
            self.net.set_rates(now, out, inn)
        return self.net

    def _draw(self, spec, avoid=()):
        if not isinstance(spec, int):
            return list(spec)
        pool = [w for w in self.workers if w not in avoid]
        if len(pool) < spec:
            pool = list(self.workers)
        return self.rng.sample(pool, min(spec, len(pool)))

    def plan(self, now, updates):
        """Plan one batch of ready updates (MLfabric-A)."""
        clock = _Clock()
        net, v_init = self._network(now), self.version
        ordering = order_updates(updates, net, self.server, self.tau_max,
                                 v_init, self.server_floor, now)
        clock.lap("order")
        aggs = self._draw(self.k)
        agg = aggregate(ordering.order, net, self.server, aggs, now,
                        self.server_floor)
        net.adopt(agg.net)
        clock.lap("aggregate")
        rep = self._replicate(now, agg.groups, aggs)
        clock.lap("replicate")
        order = [g for grp in agg.groups for g in grp.members]
        self.version += len(order)
        if agg.groups:
            self.server_floor = agg.groups[-1].end
        return BatchPlan(
            now=now, v_init=v_init, order=order, dropped=ordering.dropped,
            groups=agg.groups, aggregators=aggs, replication=rep,
            delays=delays([grp.members for grp in agg.groups], v_init),
            timings=clock.wall, cpu=clock.cpu)

    def _replicate(self, now, groups, aggs):
        if self.replica is None:
            return None
        rep = replicate(groups, self.backlog, self.net, self.replica,
                        self._draw(self.k_replica, avoid=aggs),
                        self.tracker, self.div_max, self.server_time, now,
                        self.replica_floor, horizon=now + self.interval,
                        inflight=self.inflight)
        self.inflight = rep.inflight
        for grp in groups:
            for g in grp.members:
                self.server_time[g.uid] = grp.end
        for grp in rep.groups:
            for g in grp.members:
                self.server_time.pop(g.uid, None)
        if rep.groups:
            self.replica_floor = rep.groups[-1].end
        self.backlog = rep.punted
        return rep

    def plan_sync(self, now, updates):
        """MLfabric-S: aggregation of one synchronous iteration's updates
        (in the order they became ready); no ordering, no drops."""
        clock = _Clock()
        net = self._network(now)
        agg = aggregate_sync(updates, net, self.server, self._draw(self.k),
                             now)
        net.adopt(agg.net)
        self.server_floor = max(self.server_floor, agg.cost)
        clock.lap("aggregate")
        return agg, clock.wall["total"]


class _Clock:
    """Wall and thread-CPU seconds per phase, and their totals."""

    def __init__(self):
        self.wall, self.cpu = {"total": 0.0}, {"total": 0.0}
        self._w, self._c = time.perf_counter(), time.thread_time()

    def lap(self, phase):
        w, c = time.perf_counter(), time.thread_time()
        self.wall[phase], self.cpu[phase] = w - self._w, c - self._c
        self.wall["total"] += w - self._w
        self.cpu["total"] += c - self._c
        self._w, self._c = w, c
