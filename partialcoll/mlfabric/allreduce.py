"""MLfabric's allreduce as a collective (section 6, "MPI": AllReduce
through push(root, update) and get(root, update) over a dynamically
constructed tree): every call plans a tree from the lagged link monitor's
view (:mod:`.dyntree`) and moves the data in one schedule per rank.

Design constraints:

1. Collective over ``comm``; the data move only in executor schedules on
   a duplicate of it (the emulated network's), built from the plan's hops
   by :func:`build_tree_schedule` with the public Schedule API.
2. One planner (``planner``, rank 0 by default) runs the scheduler: it
   owns the :class:`~.monitor.LinkMonitor`, draws the root and the
   aggregators and plans.  The control plane (every rank's ready time and
   last arrivals to the planner, the plan back) is plain mpi4py on a
   second duplicate, outside the emulated network (the paper's control
   socket, as in the parameter server).
3. The monitor learns only from what ranks measured: each receive's
   arrival time (``t_arrive``) and, on the emulated network, when its
   first byte went on the wire (``t_wire``, a NIC timestamp).  Without
   one, a transfer's start is its planned first byte or, for a forwarded
   sum or a copy of the result, the arrival of the last message it waited
   for, both known to the planner.  Never the emulator's rates.
4. A call is synchronous: it returns when this rank has the sum; the next
   call's plan waits for every rank's ready notice, so nothing of one
   call is in flight in the next.
"""
import random
import time

import numpy as np
from mpi4py import MPI

from ..schedule import Schedule
from .dyntree import PULL, PUSH, plan_tree
from .monitor import LinkMonitor

#: tags of consecutive calls alternate between two ranges (belt and braces:
#: point 4 of the design already keeps calls apart)
TAG_RANGE = 1 << 14


class DynamicTreeAllreduce:
    """MLfabric's allreduce (SUM) over a network-aware tree, re-planned
    every call.

    Args:
        comm: the communicator (duplicated twice: data and control).
        aggregators: k, aggregators drawn at random per call among the
            non-root ranks (the paper's random pre-assignment), or a list.
        root: the rank that sums; None draws it at random per call (the
            paper: "root is randomly chosen among the workers").
        planner: the rank that runs the scheduler.
        monitor_lag, monitor_window: the link monitor (0.2 s, 0.5 s).
        initial_rate: bytes/s assumed on every NIC before any measurement.
        seed: the draws.

    Example::

        ar = DynamicTreeAllreduce(comm, aggregators=2)
        buf = np.arange(8.0) * comm.rank
        ar(buf)             # in place: the sum over the ranks
        ar.plan.parents()   # the tree this call used (every rank has it)
        ar.free()
    """

    def __init__(self, comm, aggregators=2, root=None, planner=0,
                 monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8,
                 seed=0):
        if not 0 <= planner < comm.size:
            raise ValueError(f"planner {planner} is not a rank of the "
                             f"communicator (size {comm.size})")
        if root is not None and not 0 <= root < comm.size:
            raise ValueError(f"root {root} is not a rank (size {comm.size})")
        if isinstance(aggregators, int) and aggregators < 0:
            raise ValueError("aggregators must be >= 0 or a list of ranks")
        self.data, self.ctl = comm.Dup(), comm.Dup()
        self.rank, self.size, self.planner = comm.rank, comm.size, planner
        self.k, self.root = aggregators, root
        self.plan, self.calls, self.cpu = None, 0, []
        self._arrivals = {}
        self._scheduler = None
        if self.rank == planner:
            rates = {r: float(initial_rate) for r in range(self.size)}
            self.monitor = LinkMonitor(dict(rates), dict(rates),
                                       lag=monitor_lag, window=monitor_window)
            self._rng = random.Random(seed)

    def __call__(self, buf, ready=None):
        """Sum ``buf`` (a contiguous float or integer array, the same
        length on every rank) over the ranks, in place; returns it.
        ``ready``: when this rank's data was ready (default: now)."""
        import partialcoll as pc
        buf = np.asarray(buf)
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError("buf must be a writable contiguous array")
        if self.size == 1 or buf.size == 0:
            return buf
        ready = pc.now() if ready is None else float(ready)
        notes = self.ctl.gather((ready, self._arrivals), root=self.planner)
        plan = None
        if self.rank == self.planner:
            plan = self._plan(notes, float(buf.nbytes))
        self.plan = plan = self.ctl.bcast(plan, root=self.planner)
        s, receives = build_tree_schedule(self.data, plan, buf)
        try:
            s.post().wait()
            got = s.outcomes()
            self._arrivals = {h.tag: (float(got.t_arrive[op]),
                                      float(got.t_wire[op]))
                              for op, h in receives}
        finally:
            s.free()
        self.calls += 1
        return buf

    def _plan(self, notes, nbytes):
        c0 = time.thread_time()
        self._observe(notes)
        now = max(t for t, _ in notes)
        order = sorted(range(self.size), key=lambda r: (notes[r][0], r))
        root = self.root if self.root is not None else \
            self._rng.randrange(self.size)
        aggs = self._draw(root)
        out, inn = self.monitor.rates(now)
        base = 1 + (self.calls % 2) * TAG_RANGE
        plan = plan_tree(order, out, inn, root, aggs, nbytes, now, base)
        self.cpu.append(time.thread_time() - c0)
        return plan

    def _draw(self, root):
        if not isinstance(self.k, int):
            return [a for a in self.k if a != root]
        pool = [r for r in range(self.size) if r != root]
        return self._rng.sample(pool, min(self.k, len(pool)))

    def _observe(self, notes):
        """Feed the monitor the last call's transfers (design point 3)."""
        if self.plan is None:
            return
        arrived = {}
        for _, got in notes:
            arrived.update(got)
        for h in self.plan.hops:
            if h.tag is None or h.tag not in arrived:
                continue
            end, begin = arrived[h.tag]
            if not begin > 0:       # no wire time: from when it could start
                waited = [arrived[t][0] for t in h.after if t in arrived]
                begin = max(waited + ([h.start] if h.start is not None
                                      else []), default=None)
            if begin is not None and end > begin:
                self.monitor.observe_transfer(end, h.src, h.dst,
                                              self.plan.size, end - begin)

    def free(self):
        """Free the communicators (collective)."""
        for c in (self.data, self.ctl):
            if c != MPI.COMM_NULL:
                c.Free()
        self.data = self.ctl = MPI.COMM_NULL


def build_tree_schedule(comm, plan, buf):
    """This rank's part of ``plan`` (a :class:`~.dyntree.TreePlan`) as a
    committed one-shot schedule on ``comm``; ``buf`` is this rank's update
    and, once the schedule completed, the sum.  Returns (schedule,
    [(op, hop)] of its receives).

    Ops by role (a rank may have several)::

        worker       [start_at first byte] -> send buf -> parent
        aggregator   recv member -> reduce into acc (chained, plan order;
                     its own update: reduce at once) ... [start_at] ->
                     send acc -> root
        root         recv commit -> reduce into buf (chained) ...
                     -> send buf -> relays and direct workers (priority)
        every other  recv result into buf (after its push ops)
                     -> send buf to its members (a relay)
    """
    me, root = comm.rank, plan.root
    s = Schedule(comm)
    x = s.buffer(buf, name="x")
    acc = None
    if any(h.kind == PUSH and h.dst == me and h.what == "update"
           for h in plan.hops) and me != root:
        acc = s.buffer(np.zeros_like(buf), name="acc")
    pushed, summed, receives = [], [], []
    target = x if me == root else acc
    for h in plan.hops:
        if h.kind != PUSH:
            continue
        if h.src == me and h.dst == me:               # own update, local
            summed.append(s.reduce(acc, x, after=summed[-1:]))
        elif h.dst == me:
            tmp = s.buffer(np.zeros_like(buf))
            got = s.recv(tmp, h.src, h.tag, priority=h.priority)
            receives.append((got, h))
            summed.append(s.reduce(target, tmp, after=[got] + summed[-1:]))
        elif h.src == me:
            after = list(summed) if h.what == "sum" else []
            if h.start is not None:
                after.append(s.start_at(h.start))
            pushed.append(s.send(acc if h.what == "sum" else x, h.dst,
                                 h.tag, after=after, priority=h.priority))
    have = summed if me == root else []
    for h in plan.hops:
        if h.kind == PULL and h.dst == me:
            got = s.recv(x, h.src, h.tag, after=pushed + summed)
            receives.append((got, h))
            have = [got]
    for h in plan.hops:
        if h.kind == PULL and h.src == me:
            s.send(x, h.dst, h.tag, after=have, priority=h.priority)
    s.commit()
    return s, receives


__all__ = ["DynamicTreeAllreduce", "build_tree_schedule"]
