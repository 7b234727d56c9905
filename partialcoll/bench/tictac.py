"""TicTac on one machine: a parameter server (rank 0) and 2 to 4 workers
on emulated links, worker compute as DELAY ops following a traced
PyTorch model, and three transfer orders compared in one run::

  none   a fresh seeded random order per worker and iteration (what an
         unscheduled system does)
  tic    TIC's priorities (Algorithm 2), ties broken by a seeded draw
  tac    TAC's priorities (Algorithm 3) with the measured op times and the
         link's transfer times

For each model, task (inference: receive + forward; train: + backward and
gradients back) and target rho (link rate set so the transfers take rho
times the compute), every method runs the same iterations; the figures
(section 3.2) come from the executor's timeline: N, C, T, alpha, U per
worker and iteration, throughput gain over ``none``, the straggler effect
(95th percentile over median of the workers' iteration times) and the
share of transfers that left out of order.  R^2 of iteration time against
alpha is over every sample of a (model, task, rho) row group.

Run: ``mpiexec -n 5 partialcoll-bench tictac`` (4 workers); see
docs/results.md for the commands and what each column means.
"""
import math
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ..tictac import metrics, planner, ps
from ..tictac.graphs import scale_compute
from ._common import (
    add_iters, add_warmup, byte_size, cli, emit, listed, parse_size,
    progress, pyplot, real, save_plot, whole, writable)

METHODS = ("none", "tic", "tac")


def add_args(p):
    p.add_argument("--models", default="resnet50,vgg16,inception_v3,"
                   "transformer", help="traced models (default: resnet50, "
                   "vgg16, inception_v3, transformer)")
    p.add_argument("--tasks", default="inference,train")
    p.add_argument("--rhos", type=listed(real(0, True)), default="0.25,0.5,1,1.5,2",
                   help="target communication/computation ratios")
    p.add_argument("--methods", default=",".join(METHODS))
    add_iters(p, 10, "measured iterations per method (10, as the paper)")
    add_warmup(p, 2, "iterations discarded first (2, as the paper)")
    p.add_argument("--compute", type=real(0, True), default=0.5,
                   help="emulated forward compute per iteration, seconds "
                        "(measured op times scaled to add up to it; "
                        "backward is --backward-factor times more)")
    p.add_argument("--backward-factor", type=real(0), default=2.0)
    p.add_argument("--payload", type=byte_size, default="8M",
                   help="bytes of all parameters per worker (the model's "
                        "sizes scaled to it)")
    p.add_argument("--latency", default="0.1 ms")
    p.add_argument("--batch", type=whole(1), default=8, help="for op timing")
    p.add_argument("--image", type=whole(1), default=None,
                   help="image side for op timing (default: the model's)")
    p.add_argument("--group", choices=("module", "tensor"), default="module",
                   help="one transfer per module (default) or per tensor")
    p.add_argument("--plan-on", choices=("stream", "dataflow"),
                   default="stream", help="graph the planner sees: with "
                   "program-order edges (what the worker runs) or data "
                   "dependencies only (the paper's DAG)")
    p.add_argument("--send-cap", type=whole(0), default=0,
                   help="sends in flight per destination (0: no cap; the "
                   "emulated channel already carries one message at a "
                   "time; 1 also waits for each one's completion, as gRPC)")
    p.add_argument("--seed", type=whole(0), default=1)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="PNG: alpha and throughput gain vs rho")
    p.add_argument("--trace", type=writable, help="Chrome trace of the first model, task "
                   "and rho nearest 1, every method (open in Perfetto)")


def traced_graphs(args, comm):
    """{model: planner graph} traced on rank 0, shared with every rank."""
    graphs = None
    if comm.rank == 0:
        from ..tictac import graphs as g
        graphs = {}
        for name in args.models.split(","):
            module, example = g.model(name, args.batch, args.image)
            graphs[name] = g.trace(module, example, group=args.group,
                                   stream=args.plan_on == "stream")
    return comm.bcast(graphs, root=0)


def plans(graph, rate, seed):
    """{method: order_for(worker, iteration)} for one model and link."""
    timed = graph.with_times(recv_time=lambda op: op.nbytes / rate)
    names = [r.name for r in graph.recvs]
    tic = planner.enforcement(planner.tic(graph), "random", seed)
    tac = planner.tac(timed)
    fixed = {"tic": np.array([tic[n] for n in names]),
             "tac": np.array([tac[n] for n in names])}

    def random_order(w, it):
        return np.random.default_rng([seed, w, it]).permutation(len(names))

    out = {"none": random_order}
    for m, numbers in fixed.items():
        out[m] = (lambda numbers: lambda w, it: numbers)(numbers)
    return out


def summarise(rows, task, base=None):
    """One table row's figures from ps.iterations() rows of one method."""
    alphas = [r["alpha"] for r in rows]
    by_it = {}
    for r in rows:
        by_it.setdefault(r["iteration"], []).append(r)
    if task == "train":     # synchronous: the PS waits for every worker
        iter_t = [max(r["end"] for r in rs) - min(r["start"] for r in rs)
                  for rs in by_it.values()]
    else:
        iter_t = [r["T"] for r in rows]
    strag = [metrics.straggler([r["T"] for r in rs]) for rs in by_it.values()
             if len(rs) > 1]
    xfers = sum(r["transfers"] for r in rows)
    out = {"rho_measured": float(np.median([r["rho"] for r in rows])),
           "alpha_median": float(np.median(alphas)),
           "alpha_iqr": metrics.iqr(alphas),
           "U_median": float(np.median([r["U"] for r in rows])),
           "iter_ms": 1e3 * float(np.mean(iter_t)),
           "straggler": float(np.mean(strag)) if strag else math.nan,
           "out_of_order_%": 100.0 * sum(r["out_of_order"] for r in rows)
           / max(xfers, 1)}
    out["gain_%"] = (100.0 * (base["iter_ms"] / out["iter_ms"] - 1)
                     if base else 0.0)
    return out


def run_rho(args, comm, name, graph, task, rho, seed, trace=None):
    """Every method at one (model, task, rho); rows on rank 0."""
    W = comm.size - 1
    model = ps.WorkerModel(graph, parse_size(args.payload),
                           args.backward_factor)
    C = model.compute_time(task)
    per_worker = model.nbytes * (2 if task == "train" else 1)
    rate = per_worker / (rho * C)
    orders = plans(graph, rate, seed)
    pc.network.enable(ps.links(rate, W, args.latency))
    c = MPI.COMM_WORLD.Dup()
    results = {}
    pc.set_send_cap(args.send_cap)
    try:
        for method in args.methods.split(","):
            res = ps.run(c, model, orders[method], args.warmup + args.iters,
                         task, timeout=max(600.0, 30 * C * (1 + rho)))
            if comm.rank == 0:
                results[method] = ps.iterations(res, model, task, args.warmup)
            if trace:
                _write_trace(res, f"{trace}.{name}.{task}.{method}.json",
                             comm)
    finally:
        pc.set_send_cap(0)
        c.Free()
        pc.network.disable()
    if comm.rank != 0:
        return []
    rows, samples = [], []
    base = None
    for method, its in results.items():
        s = summarise(its, task, base if method != "none" else None)
        if method == "none":
            base = s
        samples += [(r["alpha"], r["T"]) for r in its]
        rows.append(dict({"model": name, "task": task, "rho": rho,
                          "method": method, "workers": W,
                          "transfers": model.n, "bytes": model.nbytes,
                          "rate_MBps": rate / 1e6}, **s))
    r2 = metrics.r_squared([a for a, _ in samples], [t for _, t in samples])
    for r in rows:
        r["R2"] = r2
    if base is None:
        for r in rows:
            r["gain_%"] = math.nan
    return rows


def _write_trace(res, path, comm):
    if comm.rank == 0 and res is not None:
        import json
        with open(path, "w") as f:
            json.dump(pc.timeline.to_chrome(res["timeline"]), f)


def targets(rows):
    """The benchmark's targets, met or not, from the result rows."""
    out = []

    def add(what, value, ok):
        out.append({"target": what, "measured": value,
                    "met": "yes" if ok else "NO"})

    sched = [r for r in rows if r["method"] in ("tic", "tac")]
    base = [r for r in rows if r["method"] == "none"]
    if sched:
        ok = sum(r["alpha_median"] >= 0.9 for r in sched)
        add("median alpha >= 0.9 (TIC/TAC rows)", f"{ok}/{len(sched)}, "
            f"worst {min(r['alpha_median'] for r in sched):.3f}",
            ok == len(sched))
        tighter = sum(r["alpha_iqr"] <= b["alpha_iqr"] for r in sched
                      for b in base if _same(r, b))
        add("alpha IQR below baseline (rows)", f"{tighter}/{len(sched)}",
            tighter == len(sched))
        gains = {}
        for r in sched:
            gains.setdefault((r["model"], r["task"], r["method"]), []).append(
                (r["rho"], r["gain_%"]))
        peaks = [max(g, key=lambda x: x[1]) for g in gains.values()]
        near1 = sum(0.5 <= p[0] <= 1.5 for p in peaks)
        add("gain peaks near rho = 1 (series)", f"{near1}/{len(peaks)}",
            near1 == len(peaks))
        best = max(p[1] for p in peaks)
        add("peak gain in 10..40 %", best, 10 <= best <= 40)
        ooo = max(r["out_of_order_%"] for r in sched)
        add("<= 1 % transfers out of order", ooo, ooo <= 1)
    r2 = [r["R2"] for r in rows if not math.isnan(r["R2"])]
    if r2:
        add("R^2 (T vs alpha) >= 0.9, worst group", min(r2), min(r2) >= 0.9)
    tic = {_key(r): r for r in rows if r["method"] == "tic"}
    tac = {_key(r): r for r in rows if r["method"] == "tac"}
    both = [(tic[k], tac[k]) for k in tic if k in tac]
    if both:
        worst = max(100 * (a["iter_ms"] / b["iter_ms"] - 1) for a, b in both)
        add("TIC within 5 % of TAC (worst, %)", worst, worst <= 5)
    strag = [(b, r) for r in sched for b in base
             if _same(r, b) and r["workers"] >= 4 and r["task"] == "train"]
    if strag:
        f = min((b["straggler"] - 1) / max(r["straggler"] - 1, 1e-9)
                for b, r in strag)
        add("straggler excess >= 2x lower at 4 workers (worst)", f, f >= 2)
    return out


def _key(r):
    return (r["model"], r["task"], r["rho"])


def _same(a, b):
    return _key(a) == _key(b)


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(2, len(tasks), figsize=(6 * len(tasks), 8),
                             squeeze=False)
    for col, task in enumerate(tasks):
        for (model, method) in sorted({(r["model"], r["method"])
                                       for r in rows if r["task"] == task}):
            rs = sorted((r for r in rows if r["task"] == task and
                         r["model"] == model and r["method"] == method),
                        key=lambda r: r["rho"])
            x = [r["rho"] for r in rs]
            style = {"none": ":", "tic": "-", "tac": "--"}.get(method, "-")
            axes[0][col].errorbar(x, [r["alpha_median"] for r in rs],
                                  yerr=[r["alpha_iqr"] / 2 for r in rs],
                                  linestyle=style, marker="o",
                                  label=f"{model} {method}")
            if method != "none":
                axes[1][col].plot(x, [r["gain_%"] for r in rs],
                                  linestyle=style, marker="o",
                                  label=f"{model} {method}")
        axes[0][col].set(title=f"{task}: overlap coefficient",
                         xlabel="rho (target)", ylabel="median alpha (IQR)")
        axes[1][col].set(title=f"{task}: throughput gain over random order",
                         xlabel="rho (target)", ylabel="gain %")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    save_plot(fig, path)


COLUMNS = ["model", "task", "rho", "rho_measured", "method", "alpha_median",
           "alpha_iqr", "U_median", "iter_ms", "gain_%", "straggler",
           "out_of_order_%", "R2"]


def run(args, comm=MPI.COMM_WORLD):
    if not 3 <= comm.size <= 5:
        if comm.rank == 0:
            print("tictac runs at 3 to 5 ranks (a PS and 2 to 4 workers)",
                  file=sys.stderr)
        return []
    t0 = time.monotonic()
    graphs = traced_graphs(args, comm)
    rhos = [float(x) for x in args.rhos.split(",")]
    trace_rho = min(rhos, key=lambda x: abs(x - 1))
    rows, jobs = [], [(m, t, rho) for m in graphs
                      for t in args.tasks.split(",") for rho in rhos]
    if comm.rank == 0:
        for name, g in graphs.items():
            print(f"# {name}: {len(g.recvs)} transfers, "
                  f"{len(g) - len(g.recvs)} compute ops after merging, "
                  f"{sum(r.nbytes for r in g.recvs) / 2**20:.1f} MiB of "
                  f"parameters, {g.compute_time * 1e3:.1f} ms measured "
                  f"compute at batch {args.batch} (CPU)")
        sys.stdout.flush()
    for k, (name, task, rho) in enumerate(progress(jobs, comm, "tictac")):
        g = scale_compute(graphs[name], args.compute)
        first = (name, task) == jobs[0][:2] and rho == trace_rho
        rows += run_rho(args, comm, name, g, task, rho,
                        args.seed + 1000 * k,
                        args.trace if first and args.trace else None)
    title = (f"TicTac: 1 PS + {comm.size - 1} workers, payload "
             f"{args.payload}B per worker, forward compute {args.compute} s "
             f"(DELAY ops), plan on {args.plan_on}, {args.iters} iterations "
             f"after {args.warmup}, host CPU; {time.monotonic() - t0:.0f} s")
    emit(rows, COLUMNS, args, title, comm)
    if comm.rank == 0 and rows:
        emit(targets(rows), ["target", "measured", "met"],
             argparse_free(), "targets", comm)
        if args.plot:
            plot(rows, args.plot)
    return rows


def argparse_free():
    """emit() options for a table written to stdout only."""
    class _A:
        csv = json = None
    return _A()


def main(argv=None):
    return cli(sys.modules[__name__], "tictac", argv)
