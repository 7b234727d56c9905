"""The RPS paper's experiment (its section 6) on one machine: training over
a network that loses messages.

A one-hidden-layer MLP learns scikit-learn's digits (1797 8x8 images, 10
classes); every rank holds a shard and takes plain SGD steps (no momentum,
as the paper) on batches of its own.  For each drop probability p the
emulated network loses each learning message independently (traffic class
1, seeded), and three algorithms train from the same start on the same
batches::

  rps        local step, then RPS model averaging (Algorithm 1)
  gradients  RPS's reduce-scatter/allgather on the gradients, then the step
             (the paper's baseline: gradient averaging under drops)
  allreduce  reliable gradient averaging (partialcoll.allreduce), p = 0

``--colocated`` runs the case study beyond the paper instead (RPS's
learning traffic, low priority with a finite buffer, beside a
latency-sensitive service): see :mod:`.rps_colocated`.

The table reports, per p and algorithm, the final training loss of the
averaged model (mean +- std over seeds), its gap to the reliable allreduce
of the same seed, the spread of the worker models around their mean
(||x_i - mean|| / ||mean||, averaged over ranks), and the delivered share
of averaging messages.  ``--plot`` draws loss against iterations per p.
"""
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (
    add_iters, cli, emit, progress, pyplot, real, save_plot, whole,
    writable)
from .rps_model import digits, train


def add_args(p):
    p.add_argument("--drops", default="0,0.01,0.05,0.1,0.2",
                   help="drop probabilities (comma-separated)")
    p.add_argument("--seeds", type=whole(1), default=3)
    add_iters(p, 600, "training iterations per run")
    p.add_argument("--batch", type=whole(1), default=16, help="per rank")
    p.add_argument("--lr", type=real(0, True), default=0.2)
    p.add_argument("--hidden", type=whole(1), default=32)
    p.add_argument("--every", type=whole(1), default=25,
                   help="evaluate the loss every this many iterations")
    p.add_argument("--drop-mode", choices=["told", "silent"], default="told")
    p.add_argument("--timeout", type=real(0, True), default=0.05,
                   help="receive deadline for silent drops (s)")
    p.add_argument("--algorithms", default="rps,gradients,allreduce")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="write a PNG of loss vs iterations")
    p.add_argument("--colocated", action="store_true",
                   help="the case study beyond the paper: RPS beside a "
                        "latency-sensitive service (see rps_colocated.py)")
    from . import rps_colocated
    rps_colocated.add_args(p)


def run(args, comm=MPI.COMM_WORLD):
    if args.colocated:
        from . import rps_colocated
        return rps_colocated.run(args, comm)
    X, y = digits()
    drops = [float(v) for v in args.drops.split(",")]
    algos = args.algorithms.split(",")
    if any(a not in ("rps", "gradients", "allreduce") for a in algos):
        raise SystemExit("--algorithms: rps, gradients, allreduce")
    runs = {}
    jobs = [(a, p, s) for s in range(args.seeds) for p in drops
            for a in algos if a != "allreduce" or p == 0]
    for a, p, s in progress(jobs, comm, "runs"):
        pc.network.enable({"seed": 1000 + s, "drop_mode": args.drop_mode,
                           "class": {"1": {"drop": p}}})
        runs[a, p, s] = train(a, p, s, args, X, y, comm)
        pc.network.disable()
    rows, curves = [], {}
    for a in algos:
        for p in drops if a != "allreduce" else [0.0]:
            finals = [runs[a, p, s][0][-1] for s in range(args.seeds)]
            gaps = [runs[a, p, s][0][-1] - runs["allreduce", 0.0, s][0][-1]
                    for s in range(args.seeds)] \
                if "allreduce" in algos else [float("nan")]
            rows.append({
                "ranks": comm.size, "p": p, "algorithm": a,
                "loss": float(np.mean(finals)),
                "loss_std": float(np.std(finals)),
                "gap": float(np.mean(gaps)), "gap_std": float(np.std(gaps)),
                "spread": float(np.mean([runs[a, p, s][1]
                                         for s in range(args.seeds)])),
                "delivered": float(np.mean([runs[a, p, s][2]
                                            for s in range(args.seeds)]))})
            curves[a, p] = np.mean([runs[a, p, s][0]
                                    for s in range(args.seeds)], axis=0)
    emit(rows, ["p", "algorithm", "loss", "loss_std", "gap", "gap_std",
                "spread", "delivered"], args,
         f"RPS on digits: {comm.size} ranks, {args.seeds} seeds, "
         f"{args.iters} iterations, drops {args.drop_mode}", comm)
    if args.plot and comm.rank == 0:
        plot(curves, args, comm.size)
    return rows


def plot(curves, args, P):
    plt = pyplot()
    if plt is None:
        return
    algos = [a for a in ("rps", "gradients") if any(k[0] == a for k in curves)]
    fig, axes = plt.subplots(1, len(algos), figsize=(5 * len(algos), 3.8),
                             squeeze=False, sharey=True)
    xs = np.arange(0, args.iters + 1, args.every)
    for ax, a in zip(axes[0], algos):
        for (b, p), ys in sorted(curves.items()):
            if b == a:
                ax.plot(xs, ys, label=f"p = {p:g}")
        if ("allreduce", 0.0) in curves:
            ax.plot(xs, curves["allreduce", 0.0], "k--", lw=1,
                    label="reliable allreduce")
        ax.set_yscale("log")
        ax.set_title({"rps": "RPS (model averaging)",
                      "gradients": "gradient averaging"}[a])
        ax.set_xlabel("iteration")
        ax.set_ylabel("training loss (averaged model)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"digits MLP, {P} ranks, {args.seeds} seeds")
    save_plot(fig, args.plot)


def main(argv=None):
    return cli(sys.modules[__name__], "rps", argv)
