"""The server rank (with the scheduler) and the replica rank of the
end-to-end parameter server (design: ``partialcoll.mlfabric.runtime.roles``).

Server loop, each pass::

    control messages   ready notices -> the next batch; pulls -> model
                       sends; link reports -> the monitor; stopped
    commits            the oldest batch's gates: check delays, apply
    every interval     Scheduler.plan(now, ready) -> each rank's Program
    stop / finish      when the run's limit is reached, then drained

Modes: "mlfabric" (MLfabric-A: ordering, aggregation, replication),
"async" (no scheduler: each update is sent as soon as it is computed and
applied on arrival) and "mlfabric-s" (synchronous: an iteration's updates
aggregated by Algorithm 3 in the order they became ready, then every
worker pulls the new model).
"""
import collections
import math
import os

import numpy as np

from ...core.engine import now
from ..scheduler.batch import BatchPlan, Scheduler
from ..scheduler.dyntree import choose_relays, plan_distribution, plan_relayed
from ..scheduler.monitor import LinkMonitor
from ..scheduler.ordering import Update
from ..scheduler.replication import DivergenceTracker, divergence_bound
from .execute import build
from .optim import ServerMomentum
from .program import Op
from .roles import (CTL, Applier, DataTags, Stats, async_programs,
                    ctl_messages, freed_if_done, idle, plan_programs,
                    send_pull)


class Server:
    """Rank 0: the model, the scheduler, the applies."""

    on_commit = None    # on_commit(version) after each commit (train())

    def __init__(self, cfg, model, optimizer, roles, dcomm, ctl, clock):
        self.cfg, self.model, self.opt, self.roles = cfg, model, optimizer, \
            roles
        self.dcomm, self.ctl = dcomm, ctl
        # the scheduler plans on the reference clock (roles, point 8); the
        # loop's own timing stays on this rank's clock
        self.clock = clock
        self.w = np.array(model.params, dtype=np.float64).reshape(-1)
        self.version, self.stats = 0, Stats()
        self.ready, self.held_pulls, self.pulls = [], {}, []
        self.last_version = {}                 # worker -> its last notice's
        self.stopped, self.stopping = set(), False
        self.failures, self.error = {}, None   # rank -> message; own
        self.width = optimizer.wire_width(cfg.mode)
        self.momentum = ServerMomentum(optimizer, self.w.size) \
            if optimizer.at == "server" else None
        self.iter_sum = np.zeros(self.w.size)
        self.guard = ReplicaGuard(optimizer.server_gamma, cfg.div_max) \
            if roles.replica is not None else None
        self.applier = Applier(self._apply, ordered=cfg.mode != "async",
                               allow=self.guard and self.guard.allow)
        self.tags, self.iteration = DataTags(), []
        self.batches, self.t_reached = 0, None
        self.delayed = self.unmet = 0   # replication: the plans' counts
        self.sched = self._scheduler() if cfg.mode != "async" else None
        self.models = Models(cfg.record_models, self.w, clock)
        self.checkpoints = Checkpoints(cfg.checkpoint_every,
                                       cfg.checkpoint_path)

    def _scheduler(self):
        nodes = [self.roles.server] + self.roles.workers + \
            ([self.roles.replica] if self.roles.replica is not None else [])
        rate = {r: self.cfg.initial_rate for r in nodes}
        mon = LinkMonitor(dict(rate), dict(rate), lag=self.cfg.monitor_lag,
                          window=self.cfg.monitor_window)
        return Scheduler(self.roles.server, self.roles.workers, mon,
                         tau_max=self.cfg.tau_max or 1,
                         aggregators=self.cfg.aggregators,
                         replica=self.roles.replica,
                         replica_aggregators=self.cfg.replica_aggregators,
                         div_max=self.cfg.div_max,
                         gamma=self.opt.server_gamma,
                         interval=self.cfg.batch_interval,
                         seed=self.cfg.seed)

    # -- the loop ---------------------------------------------------------
    def run(self):
        self.t0 = now()
        t_batch, t_eval = self.t0 + self.cfg.batch_interval, self.t0
        while True:
            for src, msg in ctl_messages(self.ctl):
                self._message(src, msg)
            self._serve_pulls()
            busy = self.applier.step(IDLE_WAIT)
            self._observe(self.applier.reports)
            self.pulls = [s for s in self.pulls if not freed_if_done(s)]
            t = now()
            if t >= t_eval:
                self._evaluate(t)
                t_eval = t + self.cfg.eval_every
            if t >= t_batch:
                self._batch(t)
                t_batch = max(t_batch + self.cfg.batch_interval, t)
            if not self.stopping and self._limit_reached(t):
                self._stop()
            if self.stopping and self._drained():
                break
            if not busy and not self.applier.waited:
                idle()
        self._evaluate(now())
        for r in range(1, self.ctl.size):
            self.ctl.send(("finish",), dest=r, tag=CTL)
        return self.w

    def _limit_reached(self, t):
        c = self.cfg
        if c.duration is not None and t - self.t0 >= c.duration:
            return True
        if c.max_updates is not None and \
                sum(self.stats.applied.values()) >= c.max_updates:
            return True
        return self.t_reached is not None

    def _stop(self):
        self.stopping = True
        for r in self.roles.workers:
            self.ctl.send(("stop",), dest=r, tag=CTL)

    def _drained(self):
        """All workers stopped, every notified update committed or
        dropped, nothing in flight.  In mode "mlfabric-s" an iteration
        the stop cut short never completes: its waiting pulls get the
        model as it is and its updates are dropped ("stopped")."""
        if self.cfg.mode == "mlfabric-s":
            self._serve_pulls(force=True)
        if len(self.stopped) < len(self.roles.workers) or self.pulls or \
                self.held_pulls:
            return False
        if self.cfg.mode == "mlfabric-s" and \
                0 < len(self.ready) < len(self.roles.workers):
            self._drop(self.ready, "stopped")
            self.ready = []
        backlog = self.sched is not None and self.sched.backlog
        return not self.ready and self.applier.empty() and not backlog

    # -- control messages ---------------------------------------------------
    def _message(self, src, msg):
        kind = msg[0]
        if kind == "ready":
            _, uid, version, norm, size = msg
            self.stats.notified.add(uid)
            self.last_version[src] = version
            g = Update(uid, src, size, version, norm)
            if self.cfg.mode == "async":
                self._async(g)
            else:
                self.ready.append(g)
        elif kind == "pull":
            self.held_pulls.setdefault(src, now())   # in the order asked
        elif kind == "report":
            self._observe(msg[1])
        elif kind == "replicated":           # the replica's applied count
            self.guard.replicated(msg[1])
        elif kind == "stopped":
            self.stopped.add(src)
        elif kind == "failed":               # the worker stopped itself
            self.failures[src] = msg[1]
            if not self.stopping:
                self._stop()

    def _observe(self, reports):
        if self.sched is not None:
            for t, s, d, nbytes, secs in reports:
                self.sched.monitor.observe_transfer(t, s, d, nbytes, secs)
        del reports[:]

    def _serve_pulls(self, force=False):
        """Send the model to the workers that asked.  With
        ``distributors``, pulls that come while the server's last copies
        are still on their way wait, and go out together as one
        distribution tree (section 10.3) once those copies have arrived,
        or once the oldest waiting pull has waited one batch interval.

        The bound is our choice.  A copy to a worker behind a slow
        incoming link (0.6 s for 1.2 MB at 2 MB/s) uses little of the
        server's outgoing link, yet without the bound it held every later
        pull until it arrived.  The bound is the run's own batch interval,
        the period at which the scheduler collects updates: not an
        estimate from the link monitor, so batching does not depend on
        what the monitor believes about the server's link."""
        waiting = [w for w in self.held_pulls
                   if force or self.cfg.mode != "mlfabric-s" or
                   self.version > self.last_version.get(w, -1)]
        if not waiting:                  # mlfabric-s: the iteration's model
            return
        if self.cfg.distributors:
            if not self.pulls or force or now() - min(
                    self.held_pulls[w] for w in waiting) >= \
                    self.cfg.batch_interval:
                self._distribute_model(waiting)
            return
        for w in sorted(waiting):
            del self.held_pulls[w]
            self.pulls.append(send_pull(self.dcomm, self.w, self.version, w,
                                        self.clock))
            self._sent_model(0, w)

    def _sent_model(self, src, dst):
        if src == self.roles.server:     # a relay counts its own
            self.stats.bytes[(src, dst)] += self.w.nbytes
            self.stats.pulls["server"] += 1
        net = self.sched.net if self.sched is not None else None
        if net is not None:
            net.reserve(src, dst, self.clock.reference_now(),
                        float(self.w.nbytes))

    def _distribute_model(self, waiting):
        """One batch of pulls over a distribution tree: the relays are the
        requesters whose slower link the monitor reports fastest
        (:func:`.dyntree.choose_relays`: at most ``distributors``, fewer
        than the requesters); each requester is told where its copy comes
        from and, as a relay, where to forward it."""
        t = self.clock.reference_now()
        out, inn = self.sched.monitor.rates(t)
        relays = choose_relays(waiting, out, inn, self.roles.server,
                               self.cfg.distributors)
        plan = (waiting, out, inn, self.roles.server, relays,
                float(self.w.nbytes + 16), t)
        if self.cfg.distribution == "algorithm3":
            hops = plan_distribution(*plan)
        else:
            hops = plan_relayed(
                *plan, server_sends=self.cfg.distribution == "earliest")
        source, forward = {}, {w: [] for w in waiting}
        for i, (src, dst, prio) in enumerate(hops):
            source[dst] = src
            if src == self.roles.server:
                self.pulls.append(send_pull(self.dcomm, self.w, self.version,
                                            dst, self.clock,
                                            priority=i - len(hops) - 1))
            else:
                forward[src].append(dst)
            self._sent_model(src, dst)
        self.stats.pulls["batches"] += 1
        for w in waiting:
            del self.held_pulls[w]
            self.ctl.send(("model", source[w], forward[w]), dest=w, tag=CTL)

    # -- planning -----------------------------------------------------------
    def _batch(self, t):
        if self.cfg.mode == "async":
            return
        t_plan = self.clock.to_reference(t)
        if self.cfg.mode == "mlfabric-s":
            if len(self.ready) < len(self.roles.workers):
                return
            agg, wall = self.sched.plan_sync(t_plan, self.ready)
            self.t_full = t
            plan = BatchPlan(dropped=[], groups=agg.groups, replication=None)
            self.stats.sched_cpu.append(wall)
        else:
            if not self.ready and not self.sched.backlog:
                return
            plan = self.sched.plan(t_plan, self.ready)
            self.stats.sched_cpu.append(plan.cpu["total"])
            if plan.replication is not None:
                self.delayed += plan.replication.delayed
                self.unmet += len(plan.replication.unmet)
            self._drop([g for g, _ in plan.dropped],
                       None, [r for _, r in plan.dropped])
        self.ready, self.batches = [], self.batches + 1
        self._distribute(plan)

    def _drop(self, updates, reason, reasons=None):
        for i, g in enumerate(updates):
            self.stats.drops[reasons[i] if reasons else reason] += 1
            self.stats.dropped_here.add(g.uid)
        if reason == "stopped":          # tell the workers (no plan does)
            by = collections.defaultdict(list)
            for g in updates:
                by[g.worker].append(Op("drop", what=("update", g.uid)))
            for w, ops in by.items():
                self.ctl.send(("batch", ops, {}), dest=w, tag=CTL)

    def _distribute(self, plan):
        gamma = self.opt.momentum if self.width == 2 else None
        progs, members = plan_programs(plan, self.roles, self.tags, gamma)
        for rank, prog in progs.items():
            mine = members.get(rank, {})
            if rank == self.roles.server:
                run = build(self.dcomm, prog, {}, self.w.size,
                            clock=self.clock, width=self.width)
                self.applier.add(run, mine)
            else:
                self.ctl.send(("batch", prog.ops, mine), dest=rank, tag=CTL)

    def _async(self, g):
        tag = next(self.tags)
        send, recv = async_programs(g.uid, g.worker, g.size, tag)
        self.ctl.send(("batch", send.ops, {}), dest=g.worker, tag=CTL)
        run = build(self.dcomm, recv, {}, self.w.size, clock=self.clock)
        self.applier.add(run, {0: [g]})

    # -- applying -----------------------------------------------------------
    def _apply(self, buf, members):
        """One commit: checks every member's delay (the paper's convention:
        V + 1 - v(g)), then w <- w - lr * buf."""
        V, st = self.version, self.stats
        delays = [V + 1 - g.version for g in members]
        if self.cfg.mode == "mlfabric" and max(delays) > self.cfg.tau_max:
            st.drops["late"] += len(members)       # never, as planned
            st.late.update(g.uid for g in members)
            return
        if self.cfg.mode == "mlfabric-s":
            n_workers = len(self.roles.workers)
            if self.momentum is None:
                self.opt.apply(self.w, buf, 1.0 / n_workers)
            else:                  # one momentum step per iteration
                self.iter_sum += buf
            self.iteration.extend(members)
            if len(self.iteration) >= n_workers:
                if self.momentum is not None:
                    self.momentum.step_average(self.w,
                                               self.iter_sum / n_workers)
                    self.iter_sum[:] = 0
                self.version, self.iteration = self.version + 1, []
                st.comm.append(now() - self.t_full)
        else:
            if self.momentum is None:
                self.opt.apply(self.w, buf)
            else:
                self.momentum.apply(self.w, buf, len(members))
            self.version += len(members)
            if self.guard is not None:
                self.guard.applied(members)
            self.models.record(self.w)
            self.checkpoints.after(self.version, self.w, self.momentum)
            if self.on_commit is not None:
                self.on_commit(self.version)
        for g, d in zip(members, delays):
            st.applied[g.uid] += 1
            st.delays[d if self.cfg.mode != "mlfabric-s" else 0] += 1

    def _evaluate(self, t):
        if self.failures:                # the run is ending in an error
            return
        try:
            loss = float(self.model.loss(self.w))
        except Exception as exc:         # the user's model: stop the run
            self.error = exc
            self.failures[self.roles.server] = f"{type(exc).__name__}: {exc}"
            if not self.stopping:
                self._stop()
            return
        applied = sum(self.stats.applied.values())
        self.stats.losses.append((t - self.t0, applied, loss))
        target = self.cfg.target_loss
        if target is not None and loss <= target and self.t_reached is None:
            self.t_reached = t - self.t0


IDLE_WAIT = 0.002


class Replica:
    """The replica: applies its commits in its plan's order."""

    def __init__(self, cfg, model, optimizer, roles, dcomm, ctl, clock):
        self.cfg, self.opt, self.dcomm, self.ctl = cfg, optimizer, dcomm, ctl
        self.clock = clock
        self.w = np.array(model.params, dtype=np.float64).reshape(-1)
        self.stats, self.version = Stats(), 0
        self.width = optimizer.wire_width(cfg.mode)
        self.momentum = ServerMomentum(optimizer, self.w.size) \
            if optimizer.at == "server" else None
        self.applier = Applier(self._apply)
        self.models = Models(cfg.record_models, self.w, clock)

    def _apply(self, buf, members):
        if self.momentum is None:
            self.opt.apply(self.w, buf)
        else:
            self.momentum.apply(self.w, buf, len(members))
        self.version += len(members)
        self.models.record(self.w)
        for g in members:
            self.stats.applied[g.uid] += 1
        # the server's guard holds its commits until the replica is near
        # enough: say how far the replica is, at once
        self.ctl.send(("replicated", self.version), dest=0, tag=CTL)

    def run(self):
        finishing = False
        while not (finishing and self.applier.empty()):
            for _, msg in ctl_messages(self.ctl):
                if msg[0] == "batch":
                    run = build(self.dcomm, msg[1], {}, self.w.size,
                                clock=self.clock, width=self.width)
                    self.applier.add(run, msg[2])
                elif msg[0] == "finish":
                    finishing = True
            busy = self.applier.step(IDLE_WAIT)
            if self.applier.reports and not finishing:
                self.ctl.send(("report", list(self.applier.reports)), dest=0,
                              tag=CTL)
                del self.applier.reports[:]
            if not busy and not self.applier.waited:
                idle()
        return self.w


class ReplicaGuard:
    """Div_max enforced where the models live: the server applies a commit
    only once the replica has applied enough of the server's order that
    the Eq. 11 bound
    (:mod:`partialcoll.mlfabric.scheduler.replication`) after the commit
    is at most Div_max, or, when no replica progress could bring it under
    (one commit alone moves the model further), once the replica has
    everything the server applied before it.

    The scheduler plans for the same bound, so in a run whose links behave
    as the link monitor believes the guard never waits; it holds the
    server when they do not (a replica's link slower than measured, a
    loaded machine).  The replica reports its applied count after every
    commit (a "replicated" control message)."""

    def __init__(self, gamma, div_max):
        self.tracker = DivergenceTracker(gamma)
        self.div_max, self.replica, self.reported = float(div_max), 0, 0
        self.server = 0
        self.held, self.held_s, self._since = 0, 0.0, None
        self.unmeetable = 0
        self.lead_max, self.lead_sum, self.commits = 0, 0, 0

    def allow(self, members):
        """May the server apply a commit of ``members`` now?  Counts the
        commits held back (``held``), the seconds they waited
        (``held_s``), and the commits applied over Div_max because they
        alone move the model further (``unmeetable``: the replica had
        everything before them)."""
        t = self.tracker
        if self.div_max == math.inf:
            return True
        bound = divergence_bound(t.h, t.lead + [g.norm for g in members],
                                 t.gamma)
        ok = not t.lead or bound <= self.div_max
        if ok and bound > self.div_max:   # the commit alone is too far
            self.unmeetable += 1
        if not ok and self._since is None:
            self.held, self._since = self.held + 1, now()
        elif ok and self._since is not None:
            self.held_s += now() - self._since
            self._since = None
        return ok

    def applied(self, members):
        self.tracker.server_applied(g.norm for g in members)
        self.server += len(members)
        self._sync()
        lead = self.server - self.replica
        self.lead_max = max(self.lead_max, lead)
        self.lead_sum, self.commits = self.lead_sum + lead, self.commits + 1

    def replicated(self, count):
        """The replica has applied the first ``count`` updates."""
        self.reported = max(self.reported, count)
        self._sync()

    def _sync(self):
        """The replica's lead as far as the server has applied (a replica
        commit may complete before the server's of the same updates)."""
        new = min(self.reported, self.server) - self.replica
        if new > 0:
            self.tracker.replica_applied(new)
            self.replica += new


class Models:
    """(time on the reference clock, model) after every commit, when
    ``record_models`` is on (to measure the real divergence)."""

    def __init__(self, on, w, clock):
        self.on, self.clock = on, clock
        self.log = [(clock.reference_now(), w.copy())] if on else []

    def record(self, w):
        if self.on:
            self.log.append((self.clock.reference_now(), w.copy()))


def max_divergence(server_log, replica_log):
    """The largest ||w_s(t) - w_r(t)|| over the times either changed
    (each side's last model at or before t)."""
    events = sorted([(t, 0, w) for t, w in server_log] +
                    [(t, 1, w) for t, w in replica_log], key=lambda e: e[:2])
    cur, worst = [None, None], 0.0
    for _, side, w in events:
        cur[side] = w
        if cur[0] is not None and cur[1] is not None:
            worst = max(worst, float(np.linalg.norm(cur[0] - cur[1])))
    return worst


class Checkpoints:
    """The server's model saved every ``every`` updates (None: never) to
    ``path``: written to a file beside it, flushed to disk, renamed over
    it, in the server's loop (the run waits, as an MPI job's checkpoint
    does).  ``count`` and ``seconds`` say what it cost."""

    def __init__(self, every, path):
        self.every, self.path = every, path
        self.count, self.seconds, self.next = 0, 0.0, every

    def after(self, version, w, momentum):
        if self.every is None or version < self.next:
            return
        t0 = now()
        state = w if momentum is None else np.concatenate([w, momentum.h])
        tmp = self.path + ".part"
        with open(tmp, "wb") as f:
            np.save(f, state)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.count += 1
        self.seconds += now() - t0
        self.next = (version // self.every + 1) * self.every
