"""Network-aware parameter-server load distribution on one machine (the
experiments of Cai et al., section 5, on the emulated network).

Every rank is a worker with a server beside it; each iteration averages a
gradient of ``--size`` bytes (float32) with :class:`LoadBalancedAllreduce`.
Every NIC (in and out, independently) gets a rate drawn from
``--low``..``--high`` MB/s, redrawn every ``--every`` seconds from a seed,
so every scheme sees the same sequence.  Four parts:

  slices      iteration time against slice size on one fixed draw (the
              paper's Fig. 6: a U shape; --sweep)
  schemes     average (equal shares), aware (measured), oracle (true rates)
              over --redraws redraws each, same trace: iterations per
              second overall and per epoch, speed-up over average, ratio to
              the oracle
  accuracy    during the aware run, the scheduler's throughput estimates
              S_i against the configured min(out_i, in_i), in iterations at
              least --settle seconds after a redraw
  overhead    forecasts and probes against none (the paper's 2.12 %): the
              average scheme on a steady homogeneous network, and the
              oracle on the trace's first draw (an uneven plan: the
              probes of a server planned at share 0 are load on the node
              that sets the call's time)

Compute is left out: an iteration is its aggregation (what the schemes
change).
"""
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (add_renamed, auto_or_count, cli, duration_text, emit,
                      float32_bytes, listed, one_of, parse_size, progress,
                      pyplot, real, save_plot, whole, writable)


def add_args(p):
    gradient = p.add_mutually_exclusive_group()
    gradient.add_argument("--size", type=float32_bytes, default="4MB",
                          help="gradient per rank, bytes of float32 (4MB: "
                               "10^6 elements)")
    add_renamed(gradient, "--mbytes", "--size", "size", real(0, True),
                lambda mb: str(4 * int(mb * 1e6 / 4)), "MB",
                "gradient per rank, MB of float32")
    p.add_argument("--low", type=real(0, True), default=2.0, help="MB/s (2)")
    p.add_argument("--high", type=real(0, True), default=25.0, help="MB/s (25)")
    p.add_argument("--every", type=real(0, True), default=10.0,
                   help="seconds between rate redraws (10)")
    p.add_argument("--redraws", type=whole(1), default=10)
    p.add_argument("--latency", default="1 ms")
    p.add_argument("--message-overhead", type=duration_text, default="0",
                   help="the emulated network's per-message cost (e.g. "
                        "'1 ms': each slice holds its channel that long "
                        "before its bytes move; default 0: the model "
                        "charges nothing per message, and what small "
                        "slices cost is the ranks' own work per message)")
    p.add_argument("--slice", type=whole(1), default=30_000,
                   help="elements per slice for the schemes (default "
                        "30,000: the flat bottom of the measured U for a "
                        "4 MB gradient at 8 ranks; the paper's 1.2e5, the "
                        "library's default, is on its right arm when a "
                        "plan gives a slow node no share, see "
                        "docs/results.md)")
    p.add_argument("--min-probe", default="auto", type=_min_probe,
                   help="elements per probe, at least, for a server planned "
                        "below its probes (default 'auto', the library's: "
                        "slice // 12; 0: every probe has 10,000 elements, as "
                        "in the paper)")
    p.add_argument("--sweep", type=listed(whole(1), empty=True), default="1000,3000,10000,30000,120000,"
                                      "300000,1000000",
                   help="slice sizes for the U-shape ('' to skip)")
    p.add_argument("--sweep-iters", type=whole(1), default=8)
    p.add_argument("--schemes", default="average,aware,aware-paper,oracle",
                   type=one_of(SCHEMES, empty=True),
                   help="comma-separated, of average, aware, aware-paper "
                        "(aware with the paper's fixed probes, whatever "
                        "--min-probe says) and oracle; '' for the slice "
                        "sweep alone (default: all four)")
    p.add_argument("--settle", type=real(0), default=3.0,
                   help="seconds after a redraw before accuracy counts")
    p.add_argument("--overhead-iters", type=whole(0), default=12)
    p.add_argument("--seed", type=whole(0), default=3)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="PNG: throughput over time, and the "
                                  "slice sweep")


#: --schemes name -> LoadBalancedAllreduce's scheme
SCHEMES = {"average": "average", "aware": "aware", "aware-paper": "aware",
           "oracle": "oracle"}


def _min_probe(text):
    """--min-probe: 'auto', 0 (None: the paper's fixed probes) or elements."""
    return auto_or_count(text) or None


def network(args, trace=True):
    rates = list(np.linspace(args.low, args.high,
                             int(args.high - args.low) + 1))
    cfg = {"seed": args.seed, "message_overhead": args.message_overhead,
           "default": {"out_rate": f"{args.high} MB/s",
                       "in_rate": f"{args.high} MB/s",
                       "latency": args.latency}}
    if trace:
        cfg["trace"] = [{"ranks": "all", "nic": "both",
                         "every": args.every,
                         "rates": [f"{r:g} MB/s" for r in rates]}]
    return cfg


def true_S(P):
    return [min(pc.network.nic_rate(i, "out")[0],
                pc.network.nic_rate(i, "in")[0]) for i in range(P)]


def run_scheme(scheme, args, comm, duration, slice_elems, accuracy=None):
    """Iterate for `duration` s on a fresh network (the trace from its
    start); returns [(time since start, iteration seconds)] on rank 0."""
    n = parse_size(args.size) // 4
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    pc.network.enable(network(args))
    _, t0 = pc.network.nic_rate(0)
    lb = pc.LoadBalancedAllreduce(x, scheme=SCHEMES[scheme],
                                  slice_elems=slice_elems,
                                  min_probe=None if scheme == "aware-paper"
                                  else args.min_probe)
    rows, stop = [], False
    while not stop:
        t = pc.now()
        lb(x)
        dt = pc.now() - t
        if comm.rank == 0:
            rows.append((t - t0, dt))
            if accuracy is not None:
                since = (pc.now() - t0) % args.every
                if since > args.settle and lb.calls > lb.window:
                    truth = true_S(comm.size)
                    accuracy.extend(abs(e - s) / s for e, s in
                                    zip(lb.rates["S"], truth))
        stop = comm.bcast(pc.now() - t0 >= duration if comm.rank == 0
                          else None)
    lb.close()
    pc.network.disable()
    return rows


def median_iteration(lb, x, iters, skip=2):
    """Median seconds of `iters` calls, the first `skip` left out."""
    times = []
    for _ in range(iters):
        t = pc.now()
        lb(x)
        times.append(pc.now() - t)
    return float(np.median(times[skip:] or times))


def sweep(args, comm):
    """Median iteration time per slice size, one fixed draw, aware."""
    out = []
    for sl in progress([int(v) for v in args.sweep.split(",") if v], comm,
                       "slice sweep"):
        n = parse_size(args.size) // 4
        x = np.zeros(n, np.float32)
        cfg = network(args)
        cfg["trace"][0]["every"] = 1e5          # one draw for the sweep
        pc.network.enable(cfg)
        lb = pc.LoadBalancedAllreduce(x, scheme="aware", slice_elems=sl,
                                      min_probe=args.min_probe)
        out.append((sl, median_iteration(lb, x, args.sweep_iters)))
        lb.close()
        pc.network.disable()
    return out


def overhead(args, comm, scheme="average"):
    """Forecasts and probes against none: median iteration seconds (with,
    without).  ``average``: equal shares on a steady homogeneous network
    (10 MB/s), where the probes are part of every server's share.
    ``oracle``: the trace's first draw held fixed, where the plan is
    uneven and a server planned at share 0 still aggregates its probes."""
    res = []
    for measure in (True, False):
        n = parse_size(args.size) // 4
        x = np.zeros(n, np.float32)
        if scheme == "average":
            cfg = {"message_overhead": args.message_overhead,
                   "default": {"out_rate": "10 MB/s", "in_rate": "10 MB/s",
                               "latency": args.latency}}
        else:
            cfg = network(args)
            cfg["trace"][0]["every"] = 1e5
        pc.network.enable(cfg)
        lb = pc.LoadBalancedAllreduce(x, scheme=scheme,
                                      slice_elems=args.slice,
                                      measure=measure,
                                      num_probe=2 if measure else 0,
                                      min_probe=args.min_probe)
        res.append(median_iteration(lb, x, args.overhead_iters))
        lb.close()
        pc.network.disable()
    return res


def run(args, comm=MPI.COMM_WORLD):
    if args.low > args.high:        # every rank alike, before any message
        raise SystemExit(f"--low ({args.low:g} MB/s) must not exceed --high "
                         f"({args.high:g} MB/s)")
    duration = args.every * args.redraws
    rows, curves, slices, acc = [], {}, [], []
    if args.sweep:
        slices = sweep(args, comm)
        for sl, t in slices:
            rows.append({"part": "slices", "scheme": "aware", "slice": sl,
                         "value": t, "unit": "s/iteration", "ranks": comm.size})
    schemes = [s for s in args.schemes.split(",") if s]
    for scheme in progress(schemes, comm, "schemes"):
        curve = run_scheme(scheme, args, comm, duration, args.slice,
                           accuracy=acc if scheme == "aware" else None)
        curves[scheme] = curve
        if comm.rank == 0:
            rows.append({"part": "schemes", "scheme": scheme,
                         "slice": args.slice,
                         "value": len(curve) / duration,
                         "unit": "iterations/s", "ranks": comm.size})
    if comm.rank == 0:
        base = {r["scheme"]: r["value"] for r in rows
                if r["part"] == "schemes"}
        for s in ("aware", "aware-paper", "oracle"):
            if s in base and "average" in base:
                rows.append({"part": "schemes", "scheme": f"{s}/average",
                             "slice": args.slice,
                             "value": base[s] / base["average"],
                             "unit": "speed-up", "ranks": comm.size})
        if "aware" in base and "oracle" in base:
            rows.append({"part": "schemes", "scheme": "aware/oracle",
                         "slice": args.slice,
                         "value": base["aware"] / base["oracle"],
                         "unit": "ratio", "ranks": comm.size})
        if acc:
            rows.append({"part": "accuracy", "scheme": "aware",
                         "slice": args.slice,
                         "value": float(np.median(acc)),
                         "unit": "median |S_est - S| / S", "ranks": comm.size})
            rows.append({"part": "accuracy", "scheme": "aware",
                         "slice": args.slice,
                         "value": float(np.mean(np.array(acc) <= 0.10)),
                         "unit": "share within 10 %", "ranks": comm.size})
    for scheme in ("average", "oracle") if args.overhead_iters else ():
        with_, without = overhead(args, comm, scheme)
        rows.append({"part": "overhead", "scheme": scheme, "slice":
                     args.slice, "value": 100 * (with_ - without) / without,
                     "unit": f"% ({with_:.3f} vs {without:.3f} s)",
                     "ranks": comm.size})
    emit(rows, ["part", "scheme", "slice", "value", "unit"], args,
         f"network-aware PS load distribution: {comm.size} ranks, "
         f"{parse_size(args.size) / 1e6:g} MB gradients, NICs "
         f"{args.low:g}-{args.high:g} "
         f"MB/s redrawn every {args.every:g} s", comm)
    if args.plot and comm.rank == 0:
        plot(curves, slices, args)
    return rows


def plot(curves, slices, args):
    plt = pyplot()
    if plt is None:
        return
    panels = (["curves"] if curves else []) + (["slices"] if slices else [])
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8),
                             squeeze=False)
    ax = axes[0][0]
    for scheme, curve in curves.items():
        ends = np.array([t + dt for t, dt in curve])
        edges = np.arange(0, args.every * args.redraws + 1e-9, args.every)
        counts, _ = np.histogram(ends, bins=edges)
        ax.step(edges[:-1], counts / args.every, where="post",
                label=scheme)
    if curves:
        ax.set_xlabel("time (s); rates redrawn at each step")
        ax.set_ylabel("iterations / s")
        ax.set_title("throughput over time, same rate trace")
        ax.legend()
        ax.grid(alpha=0.3)
    if slices:
        ax = axes[0][len(panels) - 1]
        ax.plot([s for s, _ in slices], [t for _, t in slices], "o-")
        ax.set_xscale("log")
        ax.set_xlabel("slice size (elements)")
        ax.set_ylabel("median iteration time (s)")
        ax.set_title("slice granularity (aware, one draw"
                     + (f", {args.message_overhead} per message)"
                        if pc.network.seconds(args.message_overhead) > 0
                        else ")"))
        ax.grid(alpha=0.3)
    save_plot(fig, args.plot)


def main(argv=None):
    return cli(sys.modules[__name__], "aware", argv)
