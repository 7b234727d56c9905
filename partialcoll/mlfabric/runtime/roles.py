"""The end-to-end asynchronous parameter server: what each rank does
(the documentation's MLfabric page describes a run).

Design constraints:

1. Ranks: 0 is the server and runs the scheduler (in its own loop, every
   ``batch_interval``); the last rank is the replica when there is one;
   the others are workers, any of which may be drawn as an aggregator.
2. Control plane: ready notices, decisions (each rank's
   :class:`~.program.Program`), link reports, stop and finish are pickled
   messages on a duplicate communicator with plain mpi4py, outside the
   emulated network (the paper's control socket).
3. Data plane: updates, sums and model pulls move only in schedules on the
   data communicator (the emulated network), built by :mod:`.execute`;
   compute is a DELAY op (no CPU), the gradient itself is real.
4. The scheduler sees rates only through the :class:`~.monitor.LinkMonitor`
   fed by what receivers measured (planned first byte to arrival).
5. A dropped update is decided by the scheduler before anything is sent:
   its worker gets a "drop" op and never a send.  The server still checks
   every commit's delays before applying it: one over tau_max is dropped
   and counted ("late"); tests assert this never happens.
6. Momentum at the server (the paper's) or at the workers (see
   :mod:`.optim`): either way a commit is exactly its members applied one
   by one, so the replica's model, whatever its grouping, equals the
   server's once both applied the same updates.  The server applies a
   commit only while the replica's reported progress keeps Div_max
   (:class:`~.server.ReplicaGuard`).
7. Loops poll without spinning: a rank waits on a gate or sleeps 1 ms
   when nothing is ready.
8. Times cross ranks on the reference clock (the server's, rank 0's:
   :mod:`partialcoll.core.clock`): the programs' start times, the link
   reports and the sending time a model copy carries.  Each rank converts
   them from and to its own clock, so the ranks may run on hosts whose
   clocks differ by days.

The server loop, channels and pulls here are MLfabric's own; TicTac's
parameter server (:mod:`partialcoll.tictac.ps`) and the load balancer
(:mod:`partialcoll.loadbalance.allreduce`) share the executor's Schedule
API with it, not a server loop (see :mod:`partialcoll.tictac.ps` for why).
"""
import collections
import itertools
import time

import numpy as np
from mpi4py import MPI

from ...core.errors import ScheduleError, WaitTimeout
from ...core.schedule import Schedule
from .execute import start_times
from .program import Op, Program, programs

CTL = 7            # control-plane tag (its own communicator)
PULL_TAG = 1       # model pulls, server -> worker
FIRST_TAG = 1000   # data tags: FIRST_TAG + a counter (mod TAG_SPAN)
TAG_SPAN = 1 << 22
IDLE = 0.001       # seconds a loop sleeps or waits when nothing is ready


class TrainingError(RuntimeError):
    """A rank's model failed during a run (its gradient or loss raised,
    or a gradient had the wrong size); raised on every rank.

    Attributes:
        failures: {rank: "ExceptionType: message"}.
    """

    def __init__(self, failures):
        self.failures = dict(failures)
        said = "; ".join(f"rank {r}: {m}" for r, m in
                         sorted(self.failures.items()))
        super().__init__(f"training stopped: the model failed on "
                         f"{said}")


class Roles:
    """Which rank is what, for a communicator of ``size`` ranks."""

    def __init__(self, size, replica):
        if size < 2 or (replica and size < 3):
            raise ScheduleError(f"needs a server and a worker (and a replica): "
                                f"P = {size} is too small")
        self.server = 0
        self.replica = size - 1 if replica else None
        self.workers = [r for r in range(1, size) if r != self.replica]


class Stats:
    """Counters one rank keeps during a run (merged at the server)."""

    def __init__(self):
        self.bytes = collections.Counter()      # (src, dst) -> bytes sent
        self.sent = set()                       # uids this rank sent
        self.dropped_here = set()               # uids it was told to drop
        self.applied = collections.Counter()    # uid -> times applied
        self.delays = collections.Counter()     # delay -> updates
        self.drops = collections.Counter()      # reason -> updates
        self.sched_cpu, self.losses = [], []
        self.comm = []      # MLfabric-S: per iteration, planned to applied
        self.notified, self.late = set(), set()
        self.pulls = collections.Counter()      # model copies: "server",
        #                               "relayed", "chained", "batches"


def ctl_messages(ctl):
    """Every control message waiting for this rank: [(source, message)]."""
    out, status = [], MPI.Status()
    while ctl.Iprobe(MPI.ANY_SOURCE, CTL, status):
        src = status.Get_source()
        out.append((src, ctl.recv(source=src, tag=CTL)))
    return out


class Applier:
    """Commits arriving in batch runs, applied in plan order (the oldest
    run's gates first; a run's gates are chained) or, ``ordered=False``,
    whichever arrives first."""

    def __init__(self, apply, ordered=True, allow=None):
        self.runs, self.apply, self.ordered = collections.deque(), apply, \
            ordered
        self.allow = allow      # allow(members): may it be applied now?
        self.reports = []
        self.waited = False     # the last step spent its wait on a gate

    def add(self, run, members):
        run.members, run.opened, run.pending = members, 0, None
        if run.schedule is not None and run.gates:
            self.runs.append(run)

    def step(self, wait):
        """Apply what is ready; returns the number of commits applied.

        Ordered: the runs' gates in plan order.  A run whose gates are all
        open (its sends may still be leaving) is passed over, so the next
        run's commits need not wait for them; the first run with a closed
        gate is waited on, up to ``wait`` seconds when nothing was applied
        yet.  ``waited`` tells whether the step blocked for its wait: when
        it applied nothing without waiting (unordered, or every run's
        gates open while sends finish), the caller must back off itself."""
        done, self.waited = 0, False
        if self.ordered:
            for run in list(self.runs):
                if run.opened == len(run.gates):
                    continue
                done += self._drain(run, 0.0 if done else wait)
                if run.opened < len(run.gates):
                    break                       # later runs come after it
        else:
            for run in list(self.runs):
                done += self._drain(run, 0.0)
        while self.runs and self.runs[0].opened == len(self.runs[0].gates) \
                and self.runs[0].done():
            self._retire(self.runs.popleft())
        if not self.ordered:
            for run in [r for r in self.runs
                        if r.opened == len(r.gates) and r.done()]:
                self.runs.remove(run)
                self._retire(run)
        return done

    def _drain(self, run, wait):
        done = 0
        while run.opened < len(run.gates):
            if run.pending is not None:   # arrived, held back by allow
                op, rnd = run.pending
            else:
                try:
                    op, rnd = run.schedule.wait_gate(timeout=wait)
                except WaitTimeout:       # nothing ready yet
                    self.waited = wait > 0
                    return done
            commit, buf = run.gates[op]
            members = run.members.get(commit, [])
            if self.allow is not None and not self.allow(members):
                run.pending = (op, rnd)   # try again at the next step
                return done
            run.pending = None
            self.apply(buf, members)
            run.schedule.open_gate(op, rnd)
            run.opened, done, wait = run.opened + 1, done + 1, 0.0
        return done

    def _retire(self, run):
        self.reports.extend(run.reports())
        run.free()

    def empty(self):
        return not self.runs


class DataTags:
    """The server's data tags: FIRST_TAG + a counter, modulo TAG_SPAN (a
    tag is reused only long after its message was taken)."""

    def __init__(self):
        self._count = itertools.count()

    def __iter__(self):
        return self

    def __next__(self):
        return FIRST_TAG + next(self._count) % TAG_SPAN


def pull_buffer(params, version, clock):
    """A model pull's payload: the parameters, their version and the
    sending time on ``clock``'s reference clock (the receiver times the
    link from it)."""
    out = np.empty(params.size + 2)
    out[:-2], out[-2], out[-1] = params, version, clock.reference_now()
    return out


def freed_if_done(s):
    """Free a one-shot schedule (a model copy's send) once it is complete;
    True if it was."""
    if s.test():
        s.free()
        return True
    return False


def send_pull(dcomm, params, version, worker, clock, priority=-1):
    """Post the model to ``worker``; returns the one-shot schedule."""
    s = Schedule(dcomm)
    s.send(s.buffer(pull_buffer(params, version, clock)), worker, PULL_TAG,
           priority=priority)
    s.commit()
    s.post()
    return s


def async_programs(uid, worker, size, tag, server=0):
    """Plain asynchronous PS: the worker's send and the server's receive
    and apply of one update, with no scheduler (applied on arrival)."""
    send, recv = Program(worker), Program(server)
    send.add(Op("send", server, tag, ("update", uid), size))
    r = recv.add(Op("recv", worker, tag, ("update", uid), size))
    recv.add(Op("apply", what=("update", uid), after=[r], commit=0))
    return send, recv


def plan_programs(plan, roles, tags, gamma=None):
    """{rank: Program} of a batch plan, receives stamped with their
    planned start (for link reports), and each rank's commit members.
    ``gamma``: the server's momentum when messages carry two sums."""
    progs = programs(plan, roles.server, roles.replica, tags, gamma)
    start_times(progs)
    members = {roles.server: {k: grp.members
                              for k, grp in enumerate(plan.groups)}}
    rep = getattr(plan, "replication", None)
    if roles.replica is not None and rep is not None:
        members[roles.replica] = {k: grp.members
                                  for k, grp in enumerate(rep.groups)}
    return progs, members


def idle():
    time.sleep(IDLE)
