"""The public parameter-server training loop (MLfabric-A, plain async PS,
MLfabric-S) on the executor over the emulated network."""
import collections
import math

import numpy as np
from mpi4py import MPI

from ...core import clock, failures
from ...core.checks import check_comm
from ...core.engine import now
from .config import RunConfig
from .optim import SGD
from .roles import CTL, Roles, TrainingError, ctl_messages
from .server import Replica, Server, max_divergence
from .worker import Worker
from ...core.errors import RankFailedError, ScheduleError


class RunResult:
    """What a run returns on every rank.

    Attributes:
        params: the server's final model.
        losses: [(seconds since start, updates applied, loss)].
        time_to_target: seconds until the loss first reached
            ``target_loss`` (None: never, or no target).
        drops: {reason: updates} ("stale", "deadline", "lookahead" ...:
            the scheduler's; "late": over tau_max at the server, never
            expected; "stopped": an iteration cut short by the end).
        delays: {delay: updates applied} (the paper's convention).
        bytes: {(src, dst): bytes sent} over the emulated network.
        scheduler: {"batches", "cpu_mean", "cpu_max"} seconds per batch,
            and "rates": the link monitor's estimates at the end,
            ({node: out bytes/s}, {node: in bytes/s}) (None in mode
            "async", which has no scheduler).
        pulls: {"server": model copies the server sent, "relayed": copies
            relays forwarded, "chained": those of them that the relay had
            itself from a relay (a tree three or more levels deep, as
            "one-copy" builds), "batches": distribution trees (0 without
            ``distributors``)}.
        updates: {"notified", "applied", "dropped"}.
        invariants: {"max_delay", "late", "dropped_sent", "applied_twice",
            "unaccounted"}: the checks of a correct run (all 0 but
            max_delay, which is at most tau_max in mode "mlfabric").
        replica: {"applied", "divergence" (||w_server - w_replica|| at
            the end), "delayed" (server commits the scheduler planned
            later so that the replica keeps up, section 5.3), "unmet"
            (those whose bound no plan could meet), "held" (server
            commits held back at the server until the replica
            came near enough: see :class:`~.server.ReplicaGuard`),
            "held_s" (the seconds they waited), "unmeetable" (commits
            applied over Div_max because they alone move the model
            further, once the replica had everything before them),
            "lead_max", "lead_mean"
            (the updates the server had applied and the replica not, at
            the server's commits, as far as the replica had reported),
            "max_divergence" (the largest ||w_server - w_replica|| during
            the run, with ``record_models``; else None)} or None.
        wall: seconds the run took.
        checkpoints: {"count", "seconds"} the server's checkpoints
            (``checkpoint_every``) took.
        comm: MLfabric-S only: seconds per iteration from planning (all
            updates ready) to the last apply.
        takeover: None, or where the server died and the replica took
            over (see :func:`train`): {"dead" (the server's rank),
            "replica" (the replica's rank, now the server), "version"
            (updates the replica had applied: the model training went on
            from), "detected_at" (when the first survivor learnt of the
            death) and "resumed_at" (when the last one restarted over the
            survivors), on the executor's clock
            (:func:`partialcoll.now`)}; the rest of the result is that of
            the run that went on.
    """

    takeover = None

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        keys = ("updates", "drops", "invariants", "time_to_target")
        return "RunResult(" + ", ".join(
            f"{k}={getattr(self, k)!r}" for k in keys) + ")"


def train(model, optimizer=None, comm=None, mode="mlfabric", on_commit=None,
          **settings):
    """Train ``model`` on a parameter server: rank 0 is the server (and
    the scheduler), the last rank the replica when ``replica=True``, the
    others workers.  Collective over ``comm`` (default COMM_WORLD); run it
    with the emulated network on (:mod:`partialcoll.transport.network`) to see links.

    Args:
        model: ``params`` (1-D float, the start), ``gradient(params,
            worker, step)`` and ``loss(params)`` (see :mod:`.models`).
        optimizer: a :class:`~.optim.SGD`, momentum at the workers or
            at the server (the paper's; default ``SGD(0.1)``).
        mode: "mlfabric" (ordering, aggregation, replication), "async"
            (plain asynchronous PS) or "mlfabric-s" (synchronous
            aggregation, section 6).
        on_commit: None, or ``on_commit(version)``, called on the server
            after each commit it applies, with the updates applied so far
            (progress, or a benchmark's fault injection).
        settings: the run's settings, checked up front: ``tau_max``,
            ``aggregators``, ``distributors``, ``replica``, ``duration``
            and the rest; see :class:`~partialcoll.mlfabric.runtime.config.RunConfig`.
    Returns a :class:`RunResult` on every rank.

    Every setting is checked on every rank before any message, and the
    model's size is compared across ranks (a mismatch raises ValueError
    everywhere).  Every rank starts from rank 0's ``params``.  When the
    model fails during the run (a worker's ``gradient`` raises or returns
    the wrong size, the server's ``loss`` raises) the run stops and
    every rank raises :class:`~.roles.TrainingError` naming the rank and
    its error.

    With ``replica=True``, under MPI's fault-tolerance extensions
    (:func:`partialcoll.fault_tolerance`), a server that dies is replaced:
    the survivors shrink the communicator, the replica becomes the server
    (rank 0 of the survivors) with its model, its momentum and its count
    of applied updates, and training goes on, without a replica, for what
    is left of ``duration`` or ``max_updates``.  The updates the server
    had applied and the replica not (at most what Div_max allows) are
    lost; the workers' updates in flight are dropped.  ``RunResult.takeover``
    says when and from which version.  Any other death raises
    :class:`~partialcoll.RankFailedError` on every survivor.

    Example::

        model = SoftmaxRegression(features=64, classes=8)
        res = train(model, SGD(lr=0.5, momentum=0.5), tau_max=8,
                    aggregators=2, duration=3.0)
        res.losses[-1], res.drops, res.delays
    """
    cfg = RunConfig(mode=mode, **settings)
    optimizer = optimizer or SGD(0.1)
    comm = check_comm(comm)
    return _run(model, optimizer, comm, cfg, settings, on_commit)


def _run(model, optimizer, comm, cfg, settings, on_commit, momentum=None):
    roles = Roles(comm.size, cfg.replica)
    _check_listed_ranks(cfg, roles)
    dcomm, ctl = comm.Dup(), comm.Dup()
    failed = False
    try:
        start = ctl.bcast(check_same_model(ctl, model), root=0)
        model.params = start
        role = _role(comm.rank, roles)(cfg, model, optimizer, roles, dcomm,
                                       ctl, clock.of(comm))
        if momentum is not None and \
                getattr(role, "momentum", None) is not None:
            role.momentum.h[...] = momentum
        if comm.rank == roles.server:
            role.on_commit = on_commit
        t0 = MPI.Wtime()
        try:
            final = role.run()
        except Exception as e:
            if not isinstance(e, RankFailedError) and \
                    not failures.is_rank_failure(e):
                raise
            failed = True
            return _take_over(model, optimizer, comm, cfg, settings,
                              on_commit, role, roles, t0, e)
        return _share_result(ctl, role, roles, cfg, final, MPI.Wtime() - t0)
    finally:
        if not failed:      # a revoked communicator is never freed
            dcomm.Free()
            ctl.Free()


def _take_over(model, optimizer, comm, cfg, settings, on_commit, role, roles,
               t0, error):
    """A rank died during the run (``error``, this rank's first sign):
    collective over the survivors.  The replica goes on as the server (see
    :func:`train`); any other death raises RankFailedError."""
    t_detect = now()
    failures.revoke([role.dcomm, role.ctl])
    try:
        survivors = comm.Shrink()
        survivors.Set_errhandler(MPI.ERRORS_RETURN)
        dead = sorted(set(range(comm.size)) -
                      set(failures.translate(survivors, comm)))
        first = survivors.allreduce(t_detect, op=MPI.MIN)
    except MPI.Exception as e:
        raise failures.rank_failure(e, comm, "the survivors' agreement") \
            from e
    if dead != [roles.server] or roles.replica is None:
        raise RankFailedError(
            f"rank(s) {', '.join(map(str, dead))} died during training: "
            f"only a server with a replica is taken over", tuple(dead)) \
            from error
    me = comm.rank
    new = survivors.Split(0, 0 if me == roles.replica else me + 1)
    new.Set_errhandler(MPI.ERRORS_RETURN)
    state = None
    if me == roles.replica:
        state = {"w": role.w.copy(), "version": role.version,
                 "h": None if role.momentum is None else
                 role.momentum.h.copy()}
    state = new.bcast(state, root=0)
    model.params = state["w"]
    again = dict(settings, replica=False)
    for k in ("replica_aggregators", "div_max"):
        again.pop(k, None)
    used = MPI.Wtime() - t0
    if cfg.duration is not None:
        again["duration"] = max(cfg.duration - used, cfg.batch_interval)
    if cfg.max_updates is not None:
        again["max_updates"] = max(cfg.max_updates - state["version"], 1)
    if isinstance(cfg.aggregators, list):     # worker ranks, renumbered
        old = failures.translate(new, comm)   # new rank -> rank in comm
        again["aggregators"] = [old.index(r) for r in cfg.aggregators]
    resumed = now()
    later = None if on_commit is None else \
        (lambda v: on_commit(state["version"] + v))    # the whole run's
    result = _run(model, optimizer, new, RunConfig(mode=cfg.mode, **again),
                  again, later, state["h"])
    result.takeover = {"dead": roles.server, "replica": roles.replica,
                       "version": state["version"], "detected_at": first,
                       "resumed_at": new.allreduce(resumed, op=MPI.MAX)}
    return result


def _check_listed_ranks(cfg, roles):
    """Aggregators given as a list must be worker ranks."""
    for name in ("aggregators", "replica_aggregators"):
        listed = getattr(cfg, name)
        if isinstance(listed, list) and not set(listed) <= set(roles.workers):
            raise ScheduleError(f"{name} {listed} must be worker ranks "
                                f"({roles.workers})")


def _share_result(ctl, role, roles, cfg, final, wall):
    """Gather every rank's view at rank 0, which makes the
    :class:`RunResult`; every rank returns it (or raises
    :class:`~.roles.TrainingError` when a rank's model failed)."""
    rank = ctl.Get_rank()
    mine = _local(role, rank, roles, final)
    everyone = ctl.gather(mine, root=0)
    result = _result(role, everyone, roles, cfg, wall) if rank == 0 else None
    ctl.Barrier()
    ctl_messages(ctl)               # reports that came after the end
    result = ctl.bcast(result, root=0)
    if result.failures:
        raise TrainingError(result.failures) from \
            getattr(role, "error", None)
    return result


def check_same_model(comm, model):
    """``model.params`` as a 1-D float64 array, checked to have the same
    size on every rank of ``comm`` (collective: one allgather); raises
    ValueError on every rank otherwise."""
    try:
        params = np.asarray(model.params, np.float64).reshape(-1)
        mine = params.size
    except Exception as exc:
        params, mine = None, f"{type(exc).__name__}: {exc}"
    sizes = comm.allgather(mine)
    bad = {r: m for r, m in enumerate(sizes) if isinstance(m, str)}
    if bad:
        raise ScheduleError(f"model.params is not an array of numbers on "
                            f"rank(s) {bad}")
    if len(set(sizes)) > 1:
        raise ScheduleError(f"the model has a different size on different "
                            f"ranks ({dict(enumerate(sizes))} parameters): "
                            f"every rank must build the same model")
    return params


def _role(rank, roles):
    if rank == roles.server:
        return Server
    return Replica if rank == roles.replica else Worker


def _local(role, rank, roles, final):
    st = role.stats
    out = {"rank": rank, "sent": st.sent, "told_drop": st.dropped_here,
           "bytes": st.bytes, "applied": st.applied, "pulls": st.pulls}
    if rank == roles.replica:
        out["params"] = final
        out["models"] = role.models.log
    return out


def _result(server, everyone, roles, cfg, wall):
    st = server.stats
    nbytes, pulls = collections.Counter(), collections.Counter()
    sent, told = set(), set()
    for part in everyone:
        nbytes.update(part["bytes"])
        pulls.update(part["pulls"])
        sent |= part["sent"]
        told |= part["told_drop"]
    dropped = st.dropped_here
    applied = st.applied
    accounted = set(applied) | dropped | st.late
    invariants = {
        "max_delay": max(st.delays, default=0),
        "late": st.drops.get("late", 0),
        "dropped_sent": len(dropped & sent),
        "applied_twice": sum(1 for c in applied.values() if c != 1),
        "unaccounted": len(st.notified - accounted),
        "told_not_dropped": len(told - dropped),
    }
    replica = None
    if roles.replica is not None:
        rep = everyone[roles.replica]
        replica = {"applied": sum(rep["applied"].values()),
                   "divergence": float(np.linalg.norm(server.w -
                                                      rep["params"])),
                   "delayed": server.delayed, "unmet": server.unmet,
                   "held": server.guard.held,
                   "held_s": server.guard.held_s,
                   "unmeetable": server.guard.unmeetable,
                   "lead_max": server.guard.lead_max,
                   "lead_mean": server.guard.lead_sum /
                   max(1, server.guard.commits),
                   "max_divergence": max_divergence(server.models.log,
                                                    rep["models"])
                   if cfg.record_models else None}
    cpu = st.sched_cpu
    rates = None if server.sched is None else \
        server.sched.monitor.rates(server.clock.reference_now())
    return RunResult(
        params=server.w, losses=st.losses,
        time_to_target=server.t_reached, drops=dict(st.drops),
        delays=dict(sorted(st.delays.items())), bytes=dict(nbytes),
        scheduler={"batches": len(cpu),
                   "cpu_mean": float(np.mean(cpu)) if cpu else 0.0,
                   "cpu_max": float(max(cpu, default=0.0)),
                   "rates": rates},
        updates={"notified": len(st.notified),
                 "applied": sum(applied.values()), "dropped": len(dropped)},
        pulls={k: pulls[k] for k in ("server", "relayed", "chained",
                                     "batches")},
        invariants=invariants, replica=replica, wall=wall, comm=st.comm,
        checkpoints={"count": server.checkpoints.count,
                     "seconds": server.checkpoints.seconds},
        mode=cfg.mode, config=cfg, failures=dict(server.failures))


def loss_at(result, seconds):
    """The last loss evaluated at or before ``seconds`` (math.nan before
    the first)."""
    best = math.nan
    for t, _, loss in result.losses:
        if t <= seconds:
            best = loss
    return best


__all__ = ["RunResult", "TrainingError", "train", "loss_at", "CTL"]
