"""A rank's :class:`~.program.Program` for one batch as one one-shot
:class:`~partialcoll.core.schedule.Schedule` on the emulated network (step 3
of the end-to-end server's design, in :mod:`.roles`).

Op by op::

    send   [start_at first byte] -> send(buffer, peer, tag, priority)
    recv   recv(fresh buffer, peer, tag, priority)
    sum    reduce(the sum's accumulator, member's buffer, SUM)
           (after the member's receive; at once for the aggregator's own)
    apply  gate(after the commit's receive and the previous apply): the
           rank's loop applies the commit, then opens the gate

A sum's accumulator is the buffer its ``("sum", name)`` send reads: the
sums are found from that send's ``after`` list.  Only public Schedule
API is used.

Times: a program's start times come from the server, on the reference
clock (:mod:`partialcoll.core.clock`); :func:`build` converts them to this
rank's clock, and the link reports go back on the reference clock.
"""
import numpy as np

from ...core.errors import ScheduleError
from ...core.schedule import Schedule


class BatchRun:
    """One rank's posted schedule for one batch.

    Attributes:
        schedule: the :class:`Schedule` (None when the program had no op
            to run, e.g. only drops).
        gates: {gate op: (commit, buffer)} in commit order.
        recvs: [(op index, peer, bytes, planned start, this rank)] for
            link reports (the planned start on this rank's clock).
        clock: the :class:`~partialcoll.core.clock.Clock` of the run.
        sent: [(what, peer, bytes)] of this rank's sends.
        summed: own updates this rank summed locally (as an aggregator).
        dropped: uids the scheduler dropped (never sent).
    """

    def __init__(self, clock):
        self.clock = clock
        self.schedule, self.gates, self.recvs = None, {}, []
        self.sent, self.dropped, self.request = [], [], None
        self.summed = []

    def done(self):
        """True once every op of the schedule completed."""
        return self.schedule is None or self.schedule.test()

    def reports(self):
        """[(t_end, src, dst, bytes, seconds)] of this run's receives, once
        done: see :func:`link_report`; ``t_end`` on the reference clock."""
        if self.schedule is None or not self.recvs:
            return []
        got = self.schedule.outcomes()
        out = []
        for op, peer, size, start, me in self.recvs:
            r = link_report(got, op, peer, me, size, start)
            if r is not None:
                out.append((self.clock.to_reference(r[0]),) + r[1:])
        return out

    def free(self):
        if self.schedule is not None:
            self.schedule.free()
            self.schedule = None


def link_report(outcomes, op, src, dst, size, start=None):
    """A receive's link measurement for the monitor: (t_end, src, dst,
    bytes, seconds), or None, on this rank's clock (as ``start`` must be).
    On the emulated network, from the message's
    first byte on the wire to its arrival (``t_wire``, ``t_arrive``: what
    NIC timestamps see, without the time it waited to be sent or queued
    behind earlier messages of its channel); elsewhere from ``start``
    (e.g. the planned first byte; None: no report) to the completion."""
    end, begin = float(outcomes.t_arrive[op]), float(outcomes.t_wire[op])
    if not begin > 0:
        if start is None:
            return None
        end, begin = float(outcomes.t_done[op]), float(start)
    if outcomes.name(op) != "ok" or not end > begin:
        return None
    return (end, src, dst, float(size), end - begin)


def build(comm, program, held, length, dtype=np.float64, *, clock,
          width=1):
    """Post ``program`` (this rank's ops for one batch) as a schedule.

    Args:
        comm: the data-plane communicator (the emulated network's).
        program: a :class:`~.program.Program` (or its ``ops`` list).
        held: {uid: array} of updates this rank holds (its own).
        length, dtype: every update's shape.
        clock: the run's :class:`~partialcoll.core.clock.Clock`; the
            program's start times are on its reference clock.
        width: 2 when every message carries two sums (server momentum,
            :mod:`.optim`): an own update goes as [u, weight * u], its
            op's ``weight``; 1: as [u].
    Returns a :class:`BatchRun` (its schedule posted, or None).

    Buffers are per stream: an update sent to the server and to the
    replica (with different weights), or received by one aggregator for
    both, has one buffer in each.
    """
    ops = program.ops if hasattr(program, "ops") else program
    run, me = BatchRun(clock), getattr(program, "rank", comm.rank)
    local = {i: clock.to_local(float(op.start)) for i, op in enumerate(ops)
             if op.start is not None}
    run.dropped = [op.what[1] for op in ops if op.kind == "drop"]
    if not any(op.kind != "drop" for op in ops):
        return run
    s = Schedule(comm)
    slots, arrays = {}, {}

    def slot(op, what=None, fresh=False):
        what = op.what if what is None else what
        key = (op.stream, what)
        if key not in slots:
            if what[0] == "update" and what[1] in held and not fresh:
                arrays[key] = _own(held[what[1]], width, op.weight)
            else:
                arrays[key] = np.zeros(length * width, dtype)
            slots[key] = s.buffer(arrays[key])
        return slots[key]

    target = {}
    for op in ops:
        if op.kind == "send" and op.what[0] == "sum":
            for i in op.after:
                target[i] = op.what
    index = {}
    for i, op in enumerate(ops):
        after = [index[a] for a in op.after]
        if op.kind == "send":
            if op.start is not None:
                after.append(s.start_at(local[i]))
            index[i] = s.send(slot(op), op.peer, op.tag, after=after,
                              priority=int(op.priority))
            run.sent.append((op.what, op.peer, op.size))
        elif op.kind == "recv":
            index[i] = s.recv(slot(op, fresh=True), op.peer, op.tag,
                              priority=int(op.priority))
            run.recvs.append((index[i], op.peer, op.size, local.get(i), me))
        elif op.kind == "sum":
            if op.what[0] == "update" and op.what[1] in held:
                run.summed.append(op.what)
            index[i] = s.reduce(slot(op, target[i]), slot(op), after=after)
        elif op.kind == "apply":
            index[i] = s.gate(after=after)
            run.gates[index[i]] = (op.commit, arrays[(op.stream, op.what)])
    s.commit()
    run.schedule, run.request = s, s.post()
    run.arrays = arrays
    return run


def _own(update, width, weight):
    """An own update's message: [u] or [u, weight * u]."""
    if width == 1:
        return update
    if weight is None:
        raise ScheduleError("a two-sum message needs its member's weight")
    out = np.empty(update.size * 2, update.dtype)
    out[:update.size] = update
    np.multiply(update, weight, out=out[update.size:])
    return out


def start_times(programs):
    """Give every receive the planned first byte of its send (matched by
    tag), so receivers can time links; in place."""
    starts = {op.tag: op.start for prog in programs.values()
              for op in prog.ops if op.kind == "send"}
    for prog in programs.values():
        for op in prog.ops:
            if op.kind == "recv":
                op.start = starts.get(op.tag)
