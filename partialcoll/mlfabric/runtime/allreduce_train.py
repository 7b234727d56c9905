"""Synchronous data-parallel baselines for the MLfabric comparison: every
worker computes (a DELAY op, stragglers as in the parameter server), then
the updates are summed by a ring allreduce (``pc.allreduce``,
``algorithm="ring"``: the paper's RR-Sync) or a binary-tree reduce and
broadcast built here as one schedule (Tr-Sync), or, ``algorithm=
"mlfabric"``, MLfabric's own allreduce (section 6: push to a root over a
tree planned every iteration from the lagged link monitor, then get;
:mod:`partialcoll.mlfabric.runtime.allreduce`), all on the emulated network.
The same workers as the parameter server (rank 0 and the replica
rank sit out), the same model, optimizer and seeds.

Binary tree over the workers (sub-communicator ranks), per iteration::

    reduce:    leaves -> parent (recv, SUM) ... -> 0
    broadcast: 0 -> children -> ... -> leaves

The stop decision rides on the sum: one extra element, set by worker 0
when the run is over, so every worker stops after the same iteration.  A
second extra element counts the workers whose gradient failed this
iteration (they send zeros), so all stop together and every rank raises
:class:`~.roles.TrainingError` naming them.
"""
import numpy as np
from mpi4py import MPI

from ...collectives.allreduce import allreduce
from ...core.checks import check_comm
from ...core.engine import now
from ...core.schedule import Schedule
from .allreduce import DynamicTreeAllreduce
from .config import check_aggregators, check_run, check_seed
from .roles import Roles, TrainingError
from .training import check_same_model
from .worker import check_gradient
from ...core.errors import ScheduleError

ALGORITHMS = ("ring", "tree", "mlfabric")


def tree_schedule(comm, buf):
    """A persistent binary-tree allreduce (sum) of ``buf`` on ``comm``."""
    r, size = comm.rank, comm.size
    s = Schedule(comm, persistent=False)
    x = s.buffer(buf, name="x")
    kids = [c for c in (2 * r + 1, 2 * r + 2) if c < size]
    tmps = [s.buffer(np.zeros_like(buf)) for _ in kids]
    reds = []
    for c, t in zip(kids, tmps):
        got = s.recv(t, c, tag=1)
        reds.append(s.reduce(x, t, after=[got]))
    if r > 0:
        up = s.send(x, (r - 1) // 2, tag=1, after=reds)
        down = s.recv(x, (r - 1) // 2, tag=2, after=[up])
        reds = [down]
    for c in kids:
        s.send(x, c, tag=2, after=reds)
    return s.commit()


def train_allreduce(model, optimizer, comm=None, algorithm="ring",
                    compute_time=0.1, stragglers=(0.0, 1.0), duration=None,
                    max_iterations=None, target_loss=None, eval_every=0.1,
                    seed=0, replica=False, aggregators=2, root=None,
                    monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8):
    """Synchronous SGD over the parameter server's worker ranks.

    Args:
        model, optimizer: as for :func:`~.training.train` (a torch model
            through :mod:`partialcoll.torch.mlfabric`).
        algorithm: "ring" (``pc.allreduce``, RR-Sync), "tree" (a binary
            tree, Tr-Sync) or "mlfabric" (MLfabric's allreduce, section 6:
            a tree re-planned every iteration from the lagged link monitor,
            :class:`~.allreduce.DynamicTreeAllreduce`).
        aggregators, root, monitor_lag, monitor_window, initial_rate:
            "mlfabric" only (see :class:`~.allreduce.DynamicTreeAllreduce`;
            the scheduler runs on the first worker).
        compute_time, stragglers, duration: as for train.
        target_loss, eval_every, seed, replica: as for train.
        max_iterations: stop after this many iterations (give it or
            ``duration``, or both; every setting is checked on every rank
            before any message).

    Every worker starts from rank 0's ``params`` (the model's size is
    checked to be the same on every rank first).  A gradient that raises
    or has the wrong size on one worker stops the run: every rank raises
    :class:`~.roles.TrainingError` naming it.

    Returns {"losses": [(t, updates, loss)], "iterations", "comm": [seconds
    per iteration in the allreduce], "time_to_target", "params",
    "scheduler": {"plans", "cpu_mean", "cpu_max", "trees"} ("mlfabric";
    trees: distinct trees used)} on every rank.

    Example::

        out = train_allreduce(SoftmaxRegression(), SGD(0.5, 0.5),
                              algorithm="mlfabric", aggregators=2,
                              max_iterations=50)
        out["losses"][-1], out["scheduler"]["trees"]
    """
    if algorithm not in ALGORITHMS:
        raise ScheduleError(f"algorithm must be one of {ALGORITHMS}")
    check_run(compute_time, stragglers, duration, max_iterations,
              target_loss, eval_every, monitor_lag, monitor_window,
              initial_rate, max_name="max_iterations")
    aggregators = check_aggregators(aggregators, "aggregators")
    seed = check_seed(seed)
    comm = check_comm(comm)
    roles = Roles(comm.size, replica)
    _check_worker_ranks(len(roles.workers), root, aggregators)
    model.params = comm.bcast(check_same_model(comm, model), root=0)
    member = comm.rank in roles.workers
    sub = comm.Split(0 if member else MPI.UNDEFINED, comm.rank)
    out = None
    if member:
        tree = dict(aggregators=aggregators, root=root,
                    monitor_lag=monitor_lag, monitor_window=monitor_window,
                    initial_rate=initial_rate, seed=seed)
        out = _run_workers(model, optimizer, sub, algorithm, tree,
                           (compute_time, stragglers, duration,
                            max_iterations, target_loss, eval_every, seed))
    error = out.pop("error") if out is not None else None
    out = comm.bcast(out, root=roles.workers[0])
    failures = out.pop("failures")
    if failures:            # worker ranks of the sub-communicator -> comm's
        raise TrainingError({roles.workers[r]: m
                             for r, m in failures.items()}) from error
    return out


def _check_worker_ranks(n_workers, root, aggregators):
    """``root`` and listed ``aggregators`` are ranks of the workers'
    communicator (the allreduce's ranks: 0..n_workers - 1)."""
    for name, ranks in (("root", [] if root is None else [root]),
                        ("aggregators", aggregators
                         if isinstance(aggregators, list) else [])):
        if any(not 0 <= r < n_workers for r in ranks):
            raise ScheduleError(f"{name} {ranks} must be ranks of the "
                                f"{n_workers} workers' communicator "
                                f"(0..{n_workers - 1})")


def _run_workers(model, optimizer, sub, algorithm, tree, loop):
    """The workers' training loop over their communicator ``sub`` (freed
    here); ``tree``: DynamicTreeAllreduce's options, ``loop``: the loop's
    settings."""
    reducer = _Reducer(sub, algorithm, np.asarray(model.params).size + 2,
                       tree)
    try:
        out = _worker_loop(model, optimizer, sub, reducer, *loop)
        out["scheduler"] = reducer.stats()
        return out
    finally:
        reducer.free()
        sub.Free()


class _Reducer:
    """One synchronous sum per iteration, by the chosen algorithm."""

    def __init__(self, sub, algorithm, n, tree_options):
        self.buf = np.zeros(n)
        self.sub, self.algorithm = sub, algorithm
        self.tcomm = self.tree = self.dynamic = None
        self.shapes = set()
        if algorithm == "tree":
            self.tcomm = sub.Dup()
            self.tree = tree_schedule(self.tcomm, self.buf)
        elif algorithm == "mlfabric":
            self.dynamic = DynamicTreeAllreduce(sub, **tree_options)

    def __call__(self, ready):
        if self.tree is not None:
            self.tree.post().wait()
        elif self.dynamic is not None:
            self.dynamic(self.buf, ready=ready)
            self.shapes.add(self.dynamic.plan.shape())
        else:
            self.buf[:] = allreduce(self.buf, comm=self.sub,
                                    algorithm="ring")

    def stats(self):
        if self.dynamic is None:
            return None
        cpu = self.sub.bcast(self.dynamic.cpu, root=self.dynamic.planner)
        return {"plans": len(cpu), "trees": len(self.shapes),
                "cpu_mean": float(np.mean(cpu)) if cpu else 0.0,
                "cpu_max": float(max(cpu, default=0.0))}

    def free(self):
        if self.tree is not None:
            self.tree.free()
            self.tcomm.Free()
        if self.dynamic is not None:
            self.dynamic.free()


def _worker_loop(model, opt, sub, reducer, compute_time, stragglers,
                 duration, max_iterations, target_loss, eval_every, seed):
    n, N = np.asarray(model.params).size, sub.size
    w = np.array(model.params, dtype=np.float64).reshape(-1)
    h, buf = opt.history(n), reducer.buf
    rng = np.random.default_rng([seed, sub.rank, 7])
    delay = Schedule(sub)
    seconds = np.zeros(1)
    delay.delay(delay.buffer(seconds)[0:1])
    delay.commit()
    t0 = t_eval = now()
    losses, comm_times, t_reached, it = [(0.0, 0, model.loss(w))], [], None, 0
    failed = None
    while True:
        try:
            buf[:n] = opt.update(h, check_gradient(
                model.gradient(w, sub.rank, it), n))
        except Exception as exc:          # the user's model: tell the rest
            failed, buf[:n] = exc, 0.0
        buf[n + 1] = float(failed is not None)
        r, s = stragglers
        seconds[0] = compute_time * (s if rng.random() < r else 1.0)
        delay.post().wait()
        t = now()
        buf[n] = float(sub.rank == 0 and _over(t - t0, it, duration,
                                               max_iterations, t_reached))
        reducer(t)
        if buf[n + 1] > 0:                # someone failed: all stop here
            break
        comm_times.append(now() - t)
        opt.apply(w, buf[:n], 1.0 / N)
        it += 1
        if sub.rank == 0 and now() >= t_eval:
            losses.append((now() - t0, it * N, model.loss(w)))
            t_eval = now() + eval_every
            if target_loss is not None and losses[-1][2] <= target_loss \
                    and t_reached is None:
                t_reached = losses[-1][0]
        if buf[n] > 0:
            break
    delay.free()
    said = sub.allgather(None if failed is None else
                         f"{type(failed).__name__}: {failed}")
    failures = {rank: m for rank, m in enumerate(said) if m is not None}
    if sub.rank == 0 and not failures:
        losses.append((now() - t0, it * N, model.loss(w)))
    return {"losses": losses, "iterations": it, "comm": comm_times,
            "time_to_target": t_reached, "params": w, "failures": failures,
            "error": failed}


def _over(elapsed, it, duration, max_iterations, t_reached):
    return (duration is not None and elapsed >= duration) or \
        (max_iterations is not None and it + 1 >= max_iterations) or \
        t_reached is not None
