"""A worker rank of the end-to-end parameter server (design: :mod:`.roles`).

Per step::

    gradient (real, on the pulled model) -> DELAY op (the compute time,
    s times longer with probability r: a straggler) -> ready notice to the
    scheduler -> pull the model (a receive on the emulated network) -> ...

With ``distributors`` (section 10.3) the pull waits for the server's word
on where the model comes from (the server or a relay) and, as a relay,
whom to forward it to: the worker forwards its copy as soon as it has it
and computes meanwhile.

In the background it runs the batch programs the server sends it (its
sends, and as an aggregator its receives, sums and forwards), keeping
each update until every planned copy (server, replica) has left or the
scheduler dropped it.
"""
import collections

import numpy as np

from ...core.schedule import Schedule
from .execute import build, link_report
from .roles import CTL, PULL_TAG, Stats, ctl_messages, freed_if_done, idle
from ...core.errors import ScheduleError


#: a relay's forwards leave ahead of its updates' sends (priority offset)
FORWARD = 1000


class Worker:
    """One worker: compute, notify, pull; run what the scheduler says."""

    def __init__(self, cfg, model, optimizer, roles, dcomm, ctl, clock):
        self.cfg, self.model, self.opt = cfg, model, optimizer
        self.dcomm, self.ctl, self.rank = dcomm, ctl, dcomm.rank
        self.clock = clock          # times to and from the server
        self.params = np.array(model.params, dtype=np.float64).reshape(-1)
        self.n, self.version, self.step = self.params.size, 0, 0
        self.history = optimizer.history(self.n)
        self.width = optimizer.wire_width(cfg.mode)   # halves per message
        self.copies = 1 + (roles.replica is not None)
        self.held, self.made = {}, collections.Counter()
        self.runs, self.reports, self.stats = [], [], Stats()
        self.rng = np.random.default_rng([cfg.seed, self.rank, 7])
        self.phase, self.stopping, self.finishing = None, False, False
        self.told_stopped, self.error = False, None
        self.pulls, self.forwards, self.forward_to = {}, [], []
        self._compute_sched()
        self.pull, self.pull_op, self.pulled = self._pull_sched(0)

    def _compute_sched(self):
        s = Schedule(self.dcomm)
        self.seconds = np.zeros(1)
        s.delay(s.buffer(self.seconds, name="seconds")[0:1])
        self.compute = s.commit()

    def _pull_sched(self, src):
        """The persistent receive of a model copy from ``src`` (the server
        or a relay): (schedule, op, buffer)."""
        if src not in self.pulls:
            s = Schedule(self.dcomm)
            buf = np.zeros(self.n + 2)
            op = s.recv(s.buffer(buf), src, PULL_TAG)
            self.pulls[src] = (s.commit(), op, buf)
        return self.pulls[src]

    # -- the loop ---------------------------------------------------------
    def run(self):
        self._start_compute()
        while not (self.finishing and self.phase is None and not self.runs
                   and not self.forwards):
            for _, msg in ctl_messages(self.ctl):
                self._message(msg)
            busy = self._advance()
            self._reap()
            self.forwards = [f for f in self.forwards if not freed_if_done(f)]
            if self.reports and not self.finishing:
                self.ctl.send(("report", self.reports), dest=0, tag=CTL)
                self.reports = []
            if not busy:
                idle()
        self.compute.free()
        for s, _, _ in self.pulls.values():
            s.free()

    def _message(self, msg):
        if msg[0] == "batch":
            run = build(self.dcomm, msg[1], self.held, self.n,
                        clock=self.clock, width=self.width)
            for uid in run.dropped:
                self.stats.dropped_here.add(uid)
                self.held.pop(uid, None)
            self.runs.append(run)
        elif msg[0] == "stop":
            self.stopping = True
            if self.phase is None and not self.told_stopped:
                self._stopped()
        elif msg[0] == "finish":
            self.finishing = True
        elif msg[0] == "model":               # section 10.3: where from
            _, src, self.forward_to = msg
            self.pull, self.pull_op, self.pulled = self._pull_sched(src)
            self.pull_src = src
            self.pull.post()
            self.phase = "pull"

    def _advance(self):
        if self.phase == "compute" and self.compute.test():
            self._computed()
            return True
        if self.phase == "pull" and self.pull.test():
            self._pulled()
            return True
        return False

    def _start_compute(self):
        try:
            grad = check_gradient(self.model.gradient(self.params, self.rank,
                                                      self.step), self.n)
            self.update = self.opt.update(self.history, grad)
        except Exception as exc:           # the user's model: tell rank 0
            self._failed(exc)
            return
        r, s = self.cfg.stragglers
        slow = s if self.rng.random() < r else 1.0
        self.seconds[0] = self.cfg.compute_time * slow
        self.compute.post()
        self.phase = "compute"

    def _computed(self):
        if self.stopping:
            self._stopped()
            return
        uid = (self.rank, self.step)
        self.step += 1
        self.held[uid] = self.update
        self.stats.notified.add(uid)
        self.ctl.send(("ready", uid, self.version,
                       self.opt.norm(self.update),
                       float(self.update.nbytes * self.width)),
                      dest=0, tag=CTL)
        self.ctl.send(("pull",), dest=0, tag=CTL)
        if self.cfg.distributors:
            self.phase = "await"         # the server says where from
            return
        self.pull_src = 0
        self.pull.post()
        self.phase = "pull"

    def _pulled(self):
        self.params[:] = self.pulled[:-2]
        self.version = int(self.pulled[-2])
        sent_at = self.clock.to_local(float(self.pulled[-1]))
        r = link_report(self.pull.outcomes(), self.pull_op, self.pull_src,
                        self.rank, self.params.nbytes, sent_at)
        if r is not None:
            self.reports.append((self.clock.to_reference(r[0]),) + r[1:])
        for i, dst in enumerate(self.forward_to):
            self._forward(dst, i)
            if self.pull_src != 0:   # a copy that came from a relay: the
                self.stats.pulls["chained"] += 1   # tree is 3+ levels deep
        self.forward_to = []
        if self.stopping:
            self._stopped()
        else:
            self._start_compute()

    def _forward(self, dst, priority):
        """Relay the model just received to ``dst`` (a copy, re-stamped:
        the receiver times this link alone)."""
        buf = self.pulled.copy()
        buf[-1] = self.clock.reference_now()
        s = Schedule(self.dcomm)
        s.send(s.buffer(buf), dst, PULL_TAG, priority=priority - FORWARD)
        s.commit()
        s.post()
        self.forwards.append(s)
        self.stats.bytes[(self.rank, dst)] += self.params.nbytes
        self.stats.pulls["relayed"] += 1

    def _stopped(self):
        self.phase = None
        self.told_stopped = True
        self.ctl.send(("stopped",), dest=0, tag=CTL)

    def _failed(self, exc):
        """The gradient failed: report it and stop computing (the batch
        programs already sent here still run, so the run drains)."""
        self.error, self.stopping = exc, True
        self.ctl.send(("failed", f"{type(exc).__name__}: {exc}"), dest=0,
                      tag=CTL)
        self._stopped()

    def _reap(self):
        for run in [r for r in self.runs if r.done()]:
            self.runs.remove(run)
            self.reports.extend(run.reports())
            for what, peer, size in run.sent:
                self.stats.bytes[(self.rank, peer)] += size
                if what[0] == "update":
                    self.stats.sent.add(what[1])
            for what in [w for w, _, _ in run.sent] + run.summed:
                self._made(what)
            run.free()

    def _made(self, what):
        """One copy of an own update made (a send, or the aggregator's
        local sum); once all are, it can go."""
        if what[0] != "update" or what[1] not in self.held:
            return
        self.made[what[1]] += 1
        if self.made[what[1]] >= self.copies:
            self.held.pop(what[1])
            self.made.pop(what[1])


def check_gradient(grad, n):
    """``grad`` as a 1-D float64 array of ``n`` elements (the size of the
    model's ``params``); a clear ValueError otherwise."""
    try:
        g = np.asarray(grad, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"the model's gradient is not an array of numbers "
                            f"({exc})") from None
    if g.shape != (n,):
        raise ScheduleError(f"the model's gradient has shape {g.shape}; it "
                            f"must be 1-D with {n} elements (the size of "
                            f"params)")
    return g
