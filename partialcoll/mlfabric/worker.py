"""A worker rank of the end-to-end parameter server (design: :mod:`.roles`).

Per step::

    gradient (real, on the pulled model) -> DELAY op (the compute time,
    s times longer with probability r: a straggler) -> ready notice to the
    scheduler -> pull the model (a receive on the emulated network) -> ...

In the background it runs the batch programs the server sends it (its
sends, and as an aggregator its receives, sums and forwards), keeping
each update until every planned copy (server, replica) has left or the
scheduler dropped it.
"""
import collections

import numpy as np

from ..schedule import Schedule
from .execute import build
from .roles import CTL, PULL_TAG, Stats, _ctl_messages, idle


class Worker:
    """One worker: compute, notify, pull; run what the scheduler says."""

    def __init__(self, cfg, model, optimizer, roles, dcomm, ctl):
        self.cfg, self.model, self.opt = cfg, model, optimizer
        self.dcomm, self.ctl, self.rank = dcomm, ctl, dcomm.rank
        self.params = np.array(model.params, dtype=np.float64).reshape(-1)
        self.n, self.version, self.step = self.params.size, 0, 0
        self.history = optimizer.history(self.n)
        self.copies = 1 + (roles.replica is not None)
        self.held, self.made = {}, collections.Counter()
        self.runs, self.reports, self.stats = [], [], Stats()
        self.rng = np.random.default_rng([cfg.seed, self.rank, 7])
        self.phase, self.stopping, self.finishing = None, False, False
        self._compute_sched()
        self._pull_sched()

    def _compute_sched(self):
        s = Schedule(self.dcomm)
        self.seconds = np.zeros(1)
        s.delay(s.buffer(self.seconds, name="seconds")[0:1])
        self.compute = s.commit()

    def _pull_sched(self):
        s = Schedule(self.dcomm)
        self.pulled = np.zeros(self.n + 2)
        self.pull_op = s.recv(s.buffer(self.pulled), 0, PULL_TAG)
        self.pull = s.commit()

    # -- the loop ---------------------------------------------------------
    def run(self):
        self._start_compute()
        while not (self.finishing and self.phase is None and not self.runs):
            for _, msg in _ctl_messages(self.ctl):
                self._message(msg)
            busy = self._advance()
            self._reap()
            if self.reports and not self.finishing:
                self.ctl.send(("report", self.reports), dest=0, tag=CTL)
                self.reports = []
            if not busy:
                idle()
        for s in (self.compute, self.pull):
            s.free()

    def _message(self, msg):
        if msg[0] == "batch":
            run = build(self.dcomm, msg[1], self.held, self.n)
            for uid in run.dropped:
                self.stats.dropped_here.add(uid)
                self.held.pop(uid, None)
            self.runs.append(run)
        elif msg[0] == "stop":
            self.stopping = True
            if self.phase is None:
                self._stopped()
        elif msg[0] == "finish":
            self.finishing = True

    def _advance(self):
        if self.phase == "compute" and self.compute.test():
            self._computed()
            return True
        if self.phase == "pull" and self.pull.test():
            self._pulled()
            return True
        return False

    def _start_compute(self):
        self.update = self.opt.update(
            self.history, self.model.gradient(self.params, self.rank,
                                              self.step))
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
                       self.opt.norm(self.update), float(self.update.nbytes)),
                      dest=0, tag=CTL)
        self.ctl.send(("pull",), dest=0, tag=CTL)
        self.pull.post()
        self.phase = "pull"

    def _pulled(self):
        t = self.pull.outcomes().t_done[self.pull_op]
        self.params[:] = self.pulled[:-2]
        self.version, sent_at = int(self.pulled[-2]), float(self.pulled[-1])
        if t > sent_at:
            self.reports.append((float(t), 0, self.rank,
                                 float(self.params.nbytes), float(t) - sent_at))
        if self.stopping:
            self._stopped()
        else:
            self._start_compute()

    def _stopped(self):
        self.phase = None
        self.ctl.send(("stopped",), dest=0, tag=CTL)

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
