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
5. Times cross ranks on the communicator's reference clock
   (:mod:`partialcoll.core.clock`, rank 0's): every rank's ready time and
   arrivals go to the planner converted to it, the planner's monitor and
   plan (its hops' start times) are on it, and each rank converts a
   hop's start back to its own clock for its START_AT.  Ranks on hosts
   whose clocks differ by days still plan and start together.
6. Bad input is refused on every rank: the constructor's arguments are
   the same everywhere and checked before any message; what only a call
   knows (``buf``, ``ready``) rides in the ready notice, the planner
   judges it, and every rank raises the same ValueError (a rank raising
   alone left the others waiting for the plan).
"""
import random
import time

import numpy as np
from mpi4py import MPI

from ...core import clock
from ...core.checks import check_int
from ...core.engine import now
from ...core.schedule import Schedule
from .config import check_aggregators, check_real, check_seed
from ..scheduler.dyntree import PULL, PUSH, plan_tree
from ..scheduler.monitor import LinkMonitor
from ...core.errors import ScheduleError

#: tags of consecutive calls alternate between two ranges (belt and braces:
#: point 4 of the design already keeps calls apart)
TAG_RANGE = 1 << 14
#: seconds a call's ``ready`` may lie ahead of pc.now() (the ranks of a
#: host share the clock; more is a time from another clock)
READY_SLACK = 1.0


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
        seed: the draws (a whole number >= 0).

    Every argument is checked on every rank before any message (ValueError
    or TypeError everywhere, never a hang).  Creating it is collective (it
    estimates the ranks' clock offsets the first time on ``comm``,
    :func:`partialcoll.core.clock.of`).

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
        size = comm.size
        for name, value in (("planner", planner), ("root", root)):
            if value is not None:
                check_int(value, f"{name} (a rank of the communicator of "
                                 f"size {size})", 0, size - 1)
        aggregators = check_aggregators(aggregators, "aggregators")
        if isinstance(aggregators, list) and \
                any(not 0 <= a < size for a in aggregators):
            raise ScheduleError(f"aggregators {aggregators} must be ranks of "
                                f"the communicator (0..{size - 1})")
        check_real(monitor_lag, "monitor_lag (seconds)", 0)
        check_real(monitor_window, "monitor_window (seconds)", 0,
                   open_low=True)
        initial_rate = check_real(initial_rate, "initial_rate (bytes/s)", 0,
                                  open_low=True)
        seed = check_seed(seed)
        self.data, self.ctl = comm.Dup(), comm.Dup()
        self.clock = clock.of(comm)
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
        length and dtype on every rank) over the ranks, in place; returns
        it.

        ``ready``: when this rank's data was ready, on its executor's
        clock (``partialcoll.now()``, CLOCK_MONOTONIC; default: now).  A
        ready that is not a finite number or lies more than
        ``READY_SLACK`` seconds in the future (``time.time()`` passed by
        mistake) is refused.  Every rank raises the same ValueError when
        any rank's ``buf`` or ``ready`` is wrong (design point 6)."""
        buf = np.asarray(buf)
        problem = None
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            problem = "buf must be a writable contiguous array"
        ready, late = _ready_time(ready, now())
        problem = problem or late
        if self.size == 1:
            if problem:
                raise ScheduleError(problem)
            return buf
        if ready is not None:
            ready = self.clock.to_reference(ready)
        notes = self.ctl.gather((ready, self._arrivals, buf.size,
                                 buf.dtype.str, problem), root=self.planner)
        plan = None
        if self.rank == self.planner:
            plan = _refusal(notes) or (
                "empty" if buf.size == 0 else
                self._plan(notes, float(buf.nbytes)))
        plan = self.ctl.bcast(plan, root=self.planner)
        if isinstance(plan, str):
            if plan == "empty":
                return buf
            raise ScheduleError(plan)
        self.plan = plan
        s, receives = build_tree_schedule(self.data, plan, buf, self.clock)
        try:
            s.post().wait()
            got = s.outcomes()
            self._arrivals = {h.tag: (self._reference(got.t_arrive[op]),
                                      self._reference(got.t_wire[op]))
                              for op, h in receives}
        finally:
            s.free()
        self.calls += 1
        return buf

    def _reference(self, t):
        """An outcome's time on the reference clock (0, none, stays 0)."""
        return self.clock.to_reference(float(t)) if t > 0 else 0.0

    def _plan(self, notes, nbytes):
        c0 = time.thread_time()
        self._observe(notes)
        latest = max(note[0] for note in notes)
        order = sorted(range(self.size), key=lambda r: (notes[r][0], r))
        root = self.root if self.root is not None else \
            self._rng.randrange(self.size)
        aggs = self._draw(root)
        out, inn = self.monitor.rates(latest)
        base = 1 + (self.calls % 2) * TAG_RANGE
        plan = plan_tree(order, out, inn, root, aggs, nbytes, latest, base)
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
        for note in notes:
            arrived.update(note[1])
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


def _ready_time(ready, now):
    """(ready as a float, None) or (None, why it is refused)."""
    if ready is None:
        return now, None
    try:
        if isinstance(ready, bool):
            raise TypeError
        t = float(ready)
    except (TypeError, ValueError):
        return None, f"ready must be a time in seconds, got {ready!r}"
    if not np.isfinite(t):
        return None, f"ready must be finite, got {ready!r}"
    if t > now + READY_SLACK:
        return None, (f"ready={t!r} lies {t - now:.3g} s in the future: "
                      f"give it on partialcoll.now()'s clock "
                      f"(CLOCK_MONOTONIC), not time.time()")
    return t, None


def _refusal(notes):
    """The planner's verdict on every rank's notice: a message naming
    the ranks whose call was wrong, or None."""
    bad = {r: note[4] for r, note in enumerate(notes) if note[4]}
    if bad:
        return "; ".join(f"rank {r}: {why}" for r, why in bad.items())
    shapes = {r: (note[2], note[3]) for r, note in enumerate(notes)}
    if len(set(shapes.values())) > 1:
        return (f"buf must have the same length and dtype on every rank, "
                f"got {{rank: (length, dtype)}} {shapes}")
    return None


def build_tree_schedule(comm, plan, buf, clock=None):
    """This rank's part of ``plan`` (a :class:`~.dyntree.TreePlan`) as a
    committed one-shot schedule on ``comm``; ``buf`` is this rank's update
    and, once the schedule completed, the sum.  ``clock``: the
    :class:`~partialcoll.core.clock.Clock` whose reference the plan's times
    are on (None: they are on this rank's clock).  Returns (schedule,
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
                after.append(s.start_at(
                    h.start if clock is None else clock.to_local(h.start)))
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
