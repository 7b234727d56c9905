"""A rank dies in the middle of a run: how long until every survivor knows.

Every rank runs ``--steps`` steps of emulated compute (a sleep of
``--compute-ms``) followed by one collective of ``--kind`` (solo,
majority, quorum with k = P/2, the full allreduce, or eager-SGD's
averager in solo or sync mode); rank ``--victim`` (default the last)
leaves with ``os._exit`` at step ``--die-at``.  Just before it leaves it
sends the time (the executor's clock, :func:`partialcoll.now`) to every
survivor.  Each survivor reports when its partialcoll call raised
:class:`~partialcoll.RankFailedError` and at which step; the table gives
the time from the death to each survivor's error (min, median, max) and
the run's time without the failure for scale.  The partial kinds (and
eager-SGD in solo mode) carry on over the survivors instead: the table
then gives the time from the death to each survivor's first call that
returned without the victim, and whether every survivor's contributions
reached every survivor exactly once (each rank adds one to its own
element every step).  ``--kind mlfabric``: MLfabric with a replica
(:func:`partialcoll.mlfabric.train`, a softmax regression for
``--duration`` seconds, on the emulated network with ``--network``); the
server dies after ``--die-at`` updates and the replica takes over; the
table gives the time to the restart, the updates lost and the final loss
against a run without the failure.  With ``--train`` each step is a training step
instead: eager-SGD with the NumPy optimizer on the hyperplane regression
(``partialcoll-bench hyperplane``'s task, ``--dim`` dimensions, 64
samples per rank and step), in the kind's mode (the full allreduce and
eager-sync: sync mode), and the table adds rank 0's final validation MSE
with and without the failure.

Needs Open MPI's fault-tolerance extensions: run it as ``mpiexec
--with-ft ulfm --mca mpi_ft_detector true -n 4 partialcoll-bench failure``
(``--mca mpi_ft_detector_timeout 1 --mca mpi_ft_detector_period 0.25``
for a 1 s detector).  The survivors leave without ``MPI_Finalize``, which
in Open MPI 5 can wait for ever after a rank died.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import cli, emit, real, whole, writable

KINDS = ["solo", "majority", "quorum", "allreduce", "eager-solo",
         "eager-sync", "mlfabric"]
_DIED = 77                     # the tag of the victim's last message


def add_args(p):
    p.add_argument("--kind", choices=KINDS, default="solo",
                   help="the collective each step calls (solo)")
    p.add_argument("--steps", type=whole(2), default=200,
                   help="steps of a run (200)")
    p.add_argument("--die-at", type=whole(1), default=50,
                   help="the step the victim leaves at (50)")
    p.add_argument("--victim", type=whole(0), default=None,
                   help="the rank that dies (default: the last)")
    p.add_argument("--compute-ms", type=real(0), default=1.0,
                   help="emulated compute per step, a sleep (1 ms)")
    p.add_argument("--count", type=whole(1), default=1024,
                   help="float32 elements per collective (1024)")
    p.add_argument("--train", action="store_true",
                   help="train instead: eager-SGD (NumPy) on the hyperplane "
                   "regression of --dim dimensions, in the kind's mode "
                   "(allreduce: sync); the table adds rank 0's final "
                   "validation MSE with and without the failure")
    p.add_argument("--dim", type=whole(1), default=256,
                   help="--train: the hyperplane's dimensions (256)")
    p.add_argument("--duration", type=real(0, True), default=3.0,
                   help="--kind mlfabric: seconds of training (3)")
    p.add_argument("--network", action="store_true",
                   help="--kind mlfabric: on the emulated network, 4 MB/s "
                   "NICs and 0.2 ms of latency")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


class _Training:
    """eager-SGD (NumPy's optimizer) on the hyperplane regression: each
    step is a training step on this rank's shard, in ``kind``'s mode."""

    def __init__(self, kind, args, comm):
        from .hyperplane import Hyperplane
        P = comm.size
        task = Hyperplane(argparse.Namespace(
            dim=args.dim, batch=64 * P, train_samples=4096 * P,
            val_samples=2048, lr=0.05, noise=1.0, seed=0,
            framework="numpy"), comm)
        task.reset()
        mode = {"solo": "solo", "eager-solo": "solo", "majority": "majority",
                "quorum": max(P // 2, 1)}.get(kind, "sync")
        self.task, self.opt = task, task.optimizer(mode, comm)
        self.size = lambda: self.opt.averager.group_size

    def step(self, step, x):
        self.task.step(self.opt, step)

    def final(self):
        self.opt.close()

    def mse(self):
        """Rank 0's validation MSE of its model now (None elsewhere)."""
        if not hasattr(self.task, "Xv"):
            return None
        return self.task.evaluate(self.task.snapshot())["val_mse"]


class _Kind:
    """The collective of each step for ``kind``, fresh: ``call(x)`` returns
    what a step gets (the partial kinds: the reduced data), ``final()`` what
    closing it returns, ``size()`` its ranks now (the survivors once the
    partial kinds carried on)."""

    def __init__(self, kind, x, P):
        self.size = lambda: P
        self.final = lambda: np.zeros(P)
        if kind.startswith("eager-"):
            from ..eager import EagerAverager
            avg = EagerAverager([x], mode=kind[len("eager-"):], op="sum")
            self.call = lambda x: avg.reduce([x])[0][0]
            self.size = lambda: avg.group_size
            self.final = lambda: (avg.close() or [[np.zeros(P)]])[0][0]
        elif kind == "allreduce":
            self.call = lambda x: pc.allreduce(x)
        else:
            kw = {"quorum": max(P // 2, 1)} if kind == "quorum" else {}
            obj = {"solo": pc.SoloAllreduce, "majority": pc.MajorityAllreduce,
                   "quorum": pc.QuorumAllreduce}[kind](x, **kw)
            self.call = lambda x: obj(x).data
            self.size = lambda: obj.size
            self.final = lambda: obj.close().data

    def step(self, step, x):
        return np.asarray(self.call(x))

    def mse(self):
        return None


def _steps(kind, args, comm, victim, notify):
    """Run the steps, each rank adding one to its own element of the vector
    every step; returns a dict: steps done, when a call raised (None if
    none did) and the ranks it named, when the first call that carried on
    without the victim returned (None), the sum of everything received
    (None where a call raised) and the seconds the run took."""
    P = comm.size
    x = np.zeros(max(args.count, P), np.float32)
    coll = _Training(kind, args, comm) if args.train else _Kind(kind, x, P)
    total = np.zeros(P, np.float64)
    out = {"step": args.steps, "error": None, "ranks": [], "resumed": None,
           "total": None}
    t0 = time.perf_counter()
    for step in range(args.steps):
        x[...] = 0
        x[comm.rank] = 1
        if comm.rank == victim and step == args.die_at:
            t = np.array([pc.now()])
            reqs = [notify.Isend(t, r, _DIED) for r in range(comm.size)
                    if r != victim]
            MPI.Request.Waitall(reqs)
            sys.stdout.flush()
            os._exit(3)
        time.sleep(args.compute_ms / 1e3)
        try:
            got = coll.step(step, x)
        except pc.RankFailedError as e:
            out.update(step=step, error=pc.now(), ranks=list(e.ranks))
            break
        if got is not None:
            total += got[:P]
        if out["resumed"] is None and coll.size() < P:
            out["resumed"] = pc.now()
    else:
        got = coll.final()
        if not args.train:
            total += np.asarray(got)[:P]
            out["total"] = total.tolist()
    out["secs"] = time.perf_counter() - t0
    out["mse"] = coll.mse()
    return out


def _death_time(notify, victim):
    """The victim's last message: when it left (None if it never came)."""
    t = np.zeros(1)
    req = notify.Irecv(t, victim, _DIED)
    deadline = time.monotonic() + 5.0
    try:
        while not req.Test():
            if time.monotonic() > deadline:
                req.Cancel()
                return None
            time.sleep(0.001)
    except MPI.Exception:
        return None
    return float(t[0])


def _mlfabric_run(args, comm, notify, die):
    """One MLfabric run with a replica (momentum at the server, Div_max
    10); with ``die`` the server leaves after ``--die-at`` updates,
    sending the time and its count to every other rank first."""
    from ..mlfabric import train
    from ..mlfabric.runtime.models import SoftmaxRegression
    from ..mlfabric.runtime.optim import SGD

    def on_commit(version):
        if die and comm.rank == 0 and version >= args.die_at:
            t = np.array([pc.now(), version], np.float64)
            MPI.Request.Waitall([notify.Isend(t, r, _DIED)
                                 for r in range(1, comm.size)])
            sys.stdout.flush()
            os._exit(3)

    model = SoftmaxRegression(features=64, classes=16, seed=1)
    return train(model, SGD(5.0, 0.9, at="server"), comm=comm,
                 mode="mlfabric", tau_max=comm.size - 1, aggregators=1,
                 duration=args.duration, compute_time=0.02,
                 batch_interval=0.05, initial_rate=4e6, seed=5,
                 replica=True, replica_aggregators=1, div_max=10.0,
                 on_commit=on_commit)


def _mlfabric(args, comm, notify):
    """``--kind mlfabric``: the server dies, the replica takes over."""
    P = comm.size
    if args.network:
        pc.network.enable({"seed": 3, "default": {
            "out_rate": "4 MB/s", "in_rate": "4 MB/s", "latency": "0.2 ms"}},
            comm)
    clean = _mlfabric_run(args, comm, notify, False)
    comm.Barrier()
    res = _mlfabric_run(args, comm, notify, True)
    got = np.zeros(2)
    req = notify.Irecv(got, 0, _DIED)
    while not req.Test():
        time.sleep(0.001)
    died, version = float(got[0]), int(got[1])
    survivors = comm.Shrink()
    if survivors.rank == 0:
        t = res.takeover or {}
        lost = version - t.get("version", 0)
        row = {"kind": "mlfabric", "ranks": P, "victim": 0,
               "died_at_update": version,
               "outcome": f"taken over by rank {t.get('replica')}"
               if t else "not taken over",
               "detect_s": t.get("detected_at", float("nan")) - died,
               "resume_s": t.get("resumed_at", float("nan")) - died,
               "replica_version": t.get("version"),
               "lost_updates": max(lost, 0), "replica_ahead": max(-lost, 0),
               "applied": t.get("version", 0) + res.updates["applied"],
               "applied_without_failure": clean.updates["applied"],
               "loss": res.losses[-1][2],
               "loss_without_failure": clean.losses[-1][2]}
        emit([row], list(row), args,
             "MLfabric: the server dies, the replica takes over",
             comm=survivors, legend={
                 "died_at_update": "updates the server had applied",
                 "detect_s": "seconds from the death to the first "
                             "survivor that knew",
                 "resume_s": "seconds from the death to the restart over "
                             "the survivors (the executor's clock)",
                 "replica_version": "updates the replica had applied: the "
                                    "model training went on from",
                 "lost_updates": "applied by the server, not by the "
                                 "replica",
                 "replica_ahead": "applied by the replica, not yet by the "
                                  "server",
                 "applied*": "updates applied in the whole run (the "
                             "replica's, then the new server's)",
                 "loss*": "the final training loss"})
    survivors.Barrier()
    sys.stdout.flush()
    os._exit(0)


def run(args, comm=MPI.COMM_WORLD):
    ft = pc.fault_tolerance()
    P = comm.size
    mlfabric = args.kind == "mlfabric"
    victim = (0 if mlfabric else P - 1) if args.victim is None \
        else args.victim
    problem = None
    if not ft["extensions"]:
        problem = (f"partialcoll-bench failure needs MPI's fault-tolerance "
                   f"extensions: {ft['on_failure']}. Run it under Open MPI "
                   f"as 'mpiexec --with-ft ulfm --mca mpi_ft_detector true "
                   f"...'")
    elif P < 3 or victim >= P:
        problem = (f"needs at least 3 ranks and a victim below {P} "
                   f"(got {P} ranks, victim {victim})")
    elif args.die_at >= args.steps:
        problem = f"--die-at {args.die_at} must be below --steps {args.steps}"
    elif args.train and (victim == 0 or mlfabric):
        problem = ("--train: rank 0 evaluates the model (choose another "
                   "victim), and MLfabric trains its own")
    elif mlfabric and victim != 0:
        problem = "--kind mlfabric: the server, rank 0, is the victim"
    if problem:
        if comm.rank == 0:
            print(f"partialcoll-bench failure: {problem}", file=sys.stderr)
        raise SystemExit(2)
    notify = comm.Dup()
    notify.Set_errhandler(MPI.ERRORS_RETURN)
    if args.kind == "mlfabric":
        _mlfabric(args, comm, notify)
    # for scale: the same steps without a failure (no rank dies)
    clean = _steps(args.kind, args, comm, -1, notify)
    comm.Barrier()
    mine = _steps(args.kind, args, comm, victim, notify)
    mine.update(rank=comm.rank, died=_death_time(notify, victim))
    survivors = comm.Shrink()
    every = survivors.gather(mine, root=0)
    clean_all = survivors.gather(clean, root=0)
    if survivors.rank == 0:
        _report(args, every, clean_all, P, victim, survivors)
    survivors.Barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)         # not MPI_Finalize: see the module docstring


def _report(args, every, clean_all, P, victim, comm):
    raised = sum(d["error"] is not None for d in every)
    went_on = sum(d["resumed"] is not None and d["step"] == args.steps
                  for d in every)
    when = [(d["error"] if d["error"] is not None else d["resumed"]) -
            d["died"] for d in every if d["died"] is not None and
            (d["error"] is not None or d["resumed"] is not None)]
    totals = [d["total"] for d in every if d["total"] is not None]
    # each survivor's own element of the sum counts its contributions
    # delivered to it: exactly once means every survivor's count is steps
    exact = sum(t[d["rank"]] == args.steps for t in totals for d in every)
    nan = float("nan")
    row = {"kind": args.kind, "ranks": P, "victim": victim,
           "died_at_step": args.die_at,
           "outcome": (f"raised {raised}/{len(every)}" if raised else
                       f"went on {went_on}/{len(every)}"),
           "after_death_min_s": min(when) if when else nan,
           "after_death_median_s": statistics.median(when) if when else nan,
           "after_death_max_s": max(when) if when else nan,
           "named_victim": sum(d["ranks"] == [victim] for d in every),
           "exactly_once": f"{exact}/{len(every) * len(totals)}"
           if totals else "-",
           "victim_delivered": f"{int(totals[0][victim])}/{args.die_at}"
           if totals else "-",
           "steps_done": f"{min(d['step'] for d in every)}-"
                         f"{max(d['step'] for d in every)}",
           "run_without_failure_s": statistics.median(d["secs"]
                                                      for d in clean_all),
           "run_with_failure_s": statistics.median(d["secs"]
                                                   for d in every)}
    if args.train:
        for k in ("exactly_once", "victim_delivered"):
            del row[k]
        row["val_mse"] = every[0]["mse"]
        row["val_mse_without_failure"] = clean_all[0]["mse"]
    legend = {
        "outcome": "survivors whose call raised RankFailedError, or that "
                   "carried on to the last step / survivors",
        "after_death_*": "seconds from the victim's exit to a survivor's "
                         "error, or to the return of its first call that "
                         "carried on (the executor's clock)",
        "named_victim": "survivors whose error named the victim (the others "
                        "saw the revocation first)",
        "exactly_once": "(survivor, receiver) pairs where the receiver got "
                        "that survivor's every contribution exactly once",
        "victim_delivered": "the victim's contributions delivered / made "
                            "before it died",
        "steps_done": "steps the survivors completed",
        "run_*_s": "the steps with and without the failure, median over the "
                   "survivors",
        "val_mse*": "rank 0's validation MSE after the last step (or the "
                    "error), with and without the failure (the best "
                    "possible: 1.0)"}
    for k in (("exactly_once", "victim_delivered") if args.train
              else ("val_mse*",)):
        del legend[k]
    emit([row], list(row), args,
         "a rank dies: when each survivor's call raised RankFailedError, "
         "or returned having carried on without it", comm=comm,
         legend=legend)


def main(argv=None):
    return cli(sys.modules[__name__], "failure", argv)
