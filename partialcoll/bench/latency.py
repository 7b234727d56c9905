"""The eager-SGD paper's Figure 8/9 latency microbenchmark.

Every iteration each rank sleeps a skew (linear: rank r waits r x step ms;
random: uniform in [0, (P-1) x step] ms, drawn per rank and iteration), then
times one call of the collective.  The average latency per call over ranks
and the average number of active processes (NAP: processes whose fresh data
is in the round, averaged over the rounds that ran) are reported for
MPI_Allreduce, partialcoll's full
allreduce, majority, quorum(k) and solo, all in the same run, with each
one's speed-up over MPI_Allreduce.

``--device gpu``: partialcoll's collectives get CuPy buffers, MPI_Allreduce
keeps host buffers of the same size, and NCCL's allreduce
(``cupyx.distributed``) on the device buffers joins the comparison.
"""
import argparse
import random
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (Buffers, across_ranks, add_device_arg, add_iters,
                      add_renamed, add_warmup, cli, emit, float32_bytes,
                      listed, parse_size, progress, pyplot, real, save_plot,
                      settle, whole, writable)

IMPLS = ("MPI_Allreduce", "allreduce", "majority", "quorum", "solo", "nccl")
DEFAULT_IMPLS = IMPLS[:-1]


def add_args(p):
    add_iters(p, 64, "timed calls per implementation")
    add_warmup(p, 4, "untimed calls first")
    p.add_argument("--step-ms", type=real(0), default=1.0,
                   help="skew step in milliseconds (default 1)")
    p.add_argument("--sweep-steps", type=listed(real(0)), default=None,
                   metavar="MS,MS,...",
                   help="run every implementation at each of these skew "
                        "steps (e.g. 0,0.1,1,4) in one run, and plot "
                        "latency against the step (default: --step-ms "
                        "alone)")
    p.add_argument("--skew", choices=["linear", "random"], default="linear",
                   help="linear: rank r waits r x step; random: uniform in "
                        "[0, (P-1) x step] (default linear)")
    message = p.add_mutually_exclusive_group()
    message.add_argument("--size", type=float32_bytes, default="4",
                         help="bytes per call, float32 elements (a "
                              "multiple of 4: 4M is 1,048,576 elements)")
    add_renamed(message, "--count", "--size", "size", whole(1),
                lambda n: str(4 * n), "N", "float32 elements per call")
    p.add_argument("--quorum", type=whole(1), default=None,
                   help="k of the quorum allreduce (default P/2)")
    p.add_argument("--impls", default=None,
                   help=f"comma-separated subset of {','.join(IMPLS)} "
                        f"(default: all; nccl only with --device gpu)")
    add_device_arg(p)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="write a PNG (needs matplotlib)")


def count(args):
    """float32 elements per call, from ``--size``."""
    return parse_size(args.size) // 4


def _skews(args, comm, n):
    step = args.step_ms / 1000.0
    if args.skew == "linear":
        return [comm.rank * step] * n
    rng = random.Random(12345 + comm.rank)
    return [rng.uniform(0, (comm.size - 1) * step) for _ in range(n)]


def _make(impl, comm, count, k, bufs):
    """(call, partial object or None); call(x) runs one collective."""
    y = np.empty(count, np.float32)
    if impl == "MPI_Allreduce":
        return (lambda x: comm.Allreduce(x, y)), None
    y = bufs.array(y)
    if impl == "allreduce":
        return (lambda x: pc.allreduce(x, y, comm=comm)), None
    if impl == "nccl":
        nccl = bufs.nccl()
        if nccl is None:
            raise SystemExit(bufs.nccl_note)
        return (lambda x: nccl(x, y)), None
    ar = make_partial(impl, bufs.array(np.zeros(count, np.float32)), comm, k)
    return ar, ar


def make_partial(kind, like, comm, k):
    """The partial allreduce ``kind`` (solo, majority, quorum) over
    ``comm``, shaped like ``like``; majority's draw seeded with 1, quorum
    with k ranks."""
    return {"majority": lambda: pc.MajorityAllreduce(like, comm=comm, seed=1),
            "quorum": lambda: pc.QuorumAllreduce(like, quorum=k, comm=comm),
            "solo": lambda: pc.SoloAllreduce(like, comm=comm)}[kind]()


def run_one(impl, args, comm, k, bufs):
    """Mean latency per call on this rank, the mean NAP per round, and the
    straggler report of the partial collective (None for the others)."""
    n = count(args)
    call, ar = _make(impl, comm, n, k, bufs)
    # MPI_Allreduce's host buffer is there before the clock starts
    x = np.ones(n, np.float32) if impl == "MPI_Allreduce" else \
        bufs.array(np.ones(n, np.float32))
    for _ in range(args.warmup):
        call(x)
    if ar is not None:
        ar.flush()      # before the barrier: a rank may wait on our arrival
    skews = _skews(args, comm, args.iters)
    lat, nap = [], {}
    first = ar.rounds if ar is not None else 0    # the same on every rank
    comm.Barrier()
    cpu0 = time.process_time()
    for s in progress(skews, comm, impl):
        time.sleep(s)
        t0 = time.perf_counter()
        res = call(x)
        lat.append(time.perf_counter() - t0)
        if ar is not None and res.round >= first:
            nap[res.round] = res.active
    cpu = time.process_time() - cpu0     # gathered after close(): a rank
    # may still wait in its last majority/quorum call for this one
    if ar is None:
        comm.Barrier()
        return (float(np.mean(lat)), float(comm.size), None,
                _cpu_per_call(cpu, len(skews), comm))
    # NAP per round: each round once, from whichever rank saw it, among
    # the rounds started before any rank entered close() (its synchronous
    # round starts rounds on behalf of ranks that have stopped calling)
    entered = ar.started
    report = ar.stats()
    ar.close()
    cpu = _cpu_per_call(cpu, len(skews), comm)
    first_close = comm.allreduce(entered, op=MPI.MIN)
    rounds = {}
    for d in comm.allgather(nap):
        rounds.update(d)
    naps = [a for r, a in rounds.items() if r < first_close]
    return (float(np.mean(lat)), float(np.mean(naps)) if naps else
            float("nan"), report, cpu)


def _cpu_per_call(seconds, calls, comm):
    """(rank 0's, the other ranks' median) process CPU time per call in ms:
    both threads, the progress thread included.  Quorum counts arrivals at
    rank 0, so this is where a hot spot there would show."""
    every = comm.allgather(seconds * 1e3 / max(calls, 1))
    others = every[1:] or every
    return every[0], float(np.median(others))


def run(args, comm=MPI.COMM_WORLD):
    k = args.quorum or max(1, comm.size // 2)
    bufs = Buffers(getattr(args, "device", "host"), comm)
    if args.impls is None:
        impls = list(DEFAULT_IMPLS)
        if bufs.nccl() is not None:
            impls.append("nccl")
    else:
        impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        raise SystemExit(f"unknown implementation(s) {bad}; choose from {IMPLS}")
    sweep = args.sweep_steps is not None
    steps = [float(t) for t in args.sweep_steps.split(",") if t.strip()] \
        if sweep else [args.step_ms]
    settle(comm, count(args))
    rows = []
    for step in steps:
        rows += _one_step(argparse.Namespace(**{**vars(args),
                                                "step_ms": step}),
                          impls, comm, k, bufs)
    cols = ["impl", "avg_ms", "min_ms", "max_ms", "nap", "speedup",
            "slowest", "late", "cpu0_ms", "cpu_ms"]
    emit(rows, (["step_ms"] + cols) if sweep else cols, args,
         f"partial allreduce latency: {comm.size} ranks, {args.skew} skew, "
         f"{'steps ' + args.sweep_steps if sweep else args.step_ms} ms"
         f"{'' if sweep else ' steps'}, {args.iters} iterations, "
         f"{4 * count(args)} bytes, {bufs.device} buffers", comm,
         legend=_legend(bufs))
    if args.plot and comm.rank == 0:
        (plot_sweep if sweep else plot)(rows, args.plot, comm.size)
    return rows


def _one_step(args, impls, comm, k, bufs):
    """One row per implementation at ``args.step_ms``."""
    rows, base = [], None
    for impl in impls:
        mean_lat, nap, report, cpu = run_one(impl, args, comm, k, bufs)
        avg, mn, mx = across_ranks(mean_lat * 1e3, comm)
        if impl == "MPI_Allreduce":
            base = avg
        name = f"quorum(k={k})" if impl == "quorum" else impl
        rows.append({"impl": name, "ranks": comm.size, "skew": args.skew,
                     "step_ms": args.step_ms, "iters": args.iters,
                     "device": bufs.device,
                     "bytes": 4 * count(args), "avg_ms": avg, "min_ms": mn,
                     "max_ms": mx, "nap": nap,
                     "speedup": (base / avg) if base else float("nan"),
                     **_lateness(report), "cpu0_ms": cpu[0],
                     "cpu_ms": cpu[1]})
    return rows


def plot_sweep(rows, path, size):
    """Latency against the skew step, one line per implementation, and
    each one's speed-up over MPI_Allreduce: where partial collectives
    pay."""
    plt = pyplot()
    if plt is None:
        return
    steps = sorted({r["step_ms"] for r in rows})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["impl"] for r in rows):
        mine = sorted((r["step_ms"], r) for r in rows if r["impl"] == name)
        xs = [t for t, _ in mine]
        a1.plot(xs, [r["avg_ms"] for _, r in mine], marker="o", label=name)
        a2.plot(xs, [r["speedup"] for _, r in mine], marker="o", label=name)
    for ax in (a1, a2):
        ax.set_xscale("symlog", linthresh=min([t for t in steps if t > 0],
                                              default=0.1))
        ax.set_xlabel("skew step (ms; rank r waits r x step)"
                      if rows[0]["skew"] == "linear" else
                      "skew step (ms; uniform in [0, (P-1) x step])")
        ax.grid(True, which="both", alpha=0.3)
    a1.set_yscale("log")
    a1.set_ylabel("average latency per call (ms, log)")
    a2.axhline(1, ls="--", c="grey", lw=1)
    a2.set_ylabel("speed-up over MPI_Allreduce")
    a1.legend(fontsize=8)
    fig.suptitle(f"{size} ranks, {rows[0]['skew']} skew, "
                 f"{rows[0]['iters']} iterations per point")
    save_plot(fig, path)


def _lateness(report):
    """The straggler columns from a partial collective's stats()."""
    if not report or report["slowest"] is None:
        return {"slowest": "-", "late": float("nan")}
    r = report["slowest"]
    return {"slowest": r, "late": report["late_share"][r]}


def plot(rows, path, size):
    plt = pyplot()
    if plt is None:
        return
    names = [r["impl"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.bar(names, [r["avg_ms"] for r in rows], color="tab:blue")
    a1.set_yscale("log")
    a1.set_ylabel("average latency per call (ms, log)")
    for i, r in enumerate(rows):
        a1.annotate(f"{r['avg_ms']:.3g}", (i, r["avg_ms"]), ha="center",
                    va="bottom", fontsize=8)
    a2.bar(names, [r["nap"] for r in rows], color="tab:orange")
    a2.axhline(size, ls="--", c="grey", lw=1)
    a2.set_ylabel("active processes (NAP)")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{rows[0]['ranks']} ranks, {rows[0]['skew']} skew, "
                 f"{rows[0]['step_ms']} ms steps, {rows[0]['iters']} iterations")
    save_plot(fig, path)


def _legend(bufs):
    """What the latency table's columns mean."""
    legend = {
        "avg_ms, min_ms, max_ms": "latency per call, averaged over the "
                                  "ranks' means; the fastest and slowest "
                                  "rank's",
        "nap": "processes whose fresh data was in a round (the paper's "
               "number of active processes)",
        "speedup": "MPI_Allreduce's latency / this latency",
        "slowest, late": "the rank late in the most rounds (its data "
                         "carried into a later round) and that share, from "
                         "the partial collective's stats()",
        "cpu0_ms, cpu_ms": "process CPU time per call on rank 0 / the "
                           "median of the others"}
    if bufs.device != "host":
        legend["device"] = (f"partialcoll on {bufs.device} buffers "
                            f"({pc.gpu_path()} MPI path); MPI_Allreduce on "
                            f"host buffers of the same size" +
                            (f"; {bufs.nccl_note}" if bufs.nccl_note and
                             bufs.device == "gpu" else ""))
    return legend


def main(argv=None):
    return cli(sys.modules[__name__], "latency", argv)
