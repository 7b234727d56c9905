"""RPS beyond its paper: learning traffic sent unreliably beside a
latency-sensitive service (the RPS paper's section 7 case study, on the
emulated network instead of a packet simulator).

Every rank's NIC carries two kinds of traffic:

  service    small messages (``--service-bytes``) from every rank to random
             peers at Poisson times (``--service-rate`` per rank, the same
             plan for every setting), reliable, high priority (class 2);
  learning   RPS's averaging messages, low priority (class 1); a sender's
             NIC holds at most ``--buffers`` bytes of them, the rest is
             dropped (tail drop), and RPS trains on what arrives.

The knob is the learning buffer: the smaller it is, the more learning
traffic drops and the less of it shares the NICs with the service.  For
each weight w (a service flow's share of a NIC against a learning flow's:
1 is fair, larger prioritises the service; default 1 only) and each buffer,
``--seeds`` training runs of ``--iters`` RPS iterations with the service
running beside them.  Reported per setting:

  service latency   p50, p99 and mean over every service message planned
                    while training ran, pooled over the seeds: from the
                    send's hand-over to the network (the timeline's
                    ``released``) to its arrival in the network model
                    (the receive's ``RoundOutcomes.t_arrive``): both on the
                    emulated network's clock, so a rank the oversubscribed
                    host did not schedule in time does not show up as
                    latency;
  hand-over late    the p99 of how late the service's sends were handed
                    to the network against their plan: the host's share.
                    Messages handed over late together queue behind each
                    other in the model, so a large value here (a loaded
                    host) inflates the latencies too;
  learning dropped  the share of RPS's messages lost (mean over seeds);
  loss              the final training loss of the average of the workers'
                    models on the whole training set (mean +- std over
                    seeds): the metric of the main ``rps`` table
                    (:func:`.rps_model.evaluate`).

``--plot`` draws service latency (p50 and p99) against final loss, one
point per buffer; ``--from-csv`` redraws it from a CSV this mode wrote.
"""
import copy
import csv
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from . import rps_model
from ._common import (byte_size, emit, parse_size, progress, pyplot, real,
                      save_plot)

COLUMNS = ["weight", "buffer", "service_p50_ms", "service_p99_ms",
           "service_mean_ms", "messages", "handover_late_p99_ms",
           "learning_dropped", "loss", "loss_std"]


def add_args(p):
    p.add_argument("--weights", default="1",
                   help="service weights (comma-separated; 'strict' too)")
    p.add_argument("--buffers", default="16 KB,32 KB,48 KB,64 KB,unlimited",
                   help="learning data a sender's NIC holds (comma-separated"
                        "; the sweep's knob)")
    p.add_argument("--rate", default="4 MB/s", help="every NIC, both ways")
    p.add_argument("--service-bytes", type=byte_size, default="2K",
                   help="bytes per service message")
    p.add_argument("--service-rate", type=real(0, True), default=400.0,
                   help="service messages per second per rank")
    p.add_argument("--horizon", type=real(0, True), default=None,
                   help="seconds of service plan (default: measured)")
    p.add_argument("--from-csv",
                   help="only draw --plot from a CSV written by this mode")


def service_plan(P, rate, horizon, seed):
    """Every rank's service messages: (planned time, src, dst), sorted."""
    rng = np.random.default_rng([seed, 31])
    plan = []
    for src in range(P):
        t = rng.exponential(1 / rate)
        while t < horizon:
            dst = int(rng.integers(P - 1))
            plan.append((t, src, dst + (dst >= src)))
            t += rng.exponential(1 / rate)
    return sorted(plan)


def service_schedule(comm, plan, nbytes):
    """One schedule running this rank's part of the plan: a send at its
    planned time, a receive posted shortly before each expected arrival.
    The times are read from ``when`` (absolute, filled in by the caller
    just before posting: building thousands of ops takes a while).
    Returns (schedule, {send op: plan index}, {recv op: plan index},
    when)."""
    r = comm.rank
    s = pc.Schedule(comm)
    when = np.zeros(len(plan))
    at_ = s.buffer(when, name="when")
    out = s.buffer(np.zeros(nbytes, np.uint8), writable=False)
    mine = [k for k, (_, src, dst) in enumerate(plan) if dst == r]
    inbox = s.buffer(np.zeros(max(len(mine), 1) * nbytes, np.uint8))
    slot = {k: j for j, k in enumerate(mine)}
    sends, recvs = {}, {}
    for k, (t, src, dst) in enumerate(plan):
        if src == r:
            at = s.start_at(at_[k:k + 1])
            sends[s.send(out, dst, tag=k, after=[at], traffic_class=2)] = k
        elif dst == r:
            at = s.start_at(at_[k:k + 1])      # 50 ms early (see below)
            j = slot[k]
            recvs[s.recv(inbox[j * nbytes:(j + 1) * nbytes], src, tag=k,
                         after=[at], traffic_class=2)] = k
    s.commit()
    return s, sends, recvs, when


def arm_plan(when, plan, t0, rank):
    """Absolute start times: sends at t0 + t, receives 50 ms before."""
    for k, (t, src, _) in enumerate(plan):
        when[k] = t0 + t - (0 if src == rank else 0.05)


def network(weight, buffer, rate):
    """The emulated network of one setting (learning class 1 low, service
    class 2 high)."""
    return {"seed": 77, "drop_mode": "told",
            "default": {"out_rate": rate, "in_rate": rate},
            "class": {"1": {"priority": "low"}, "2": {"priority": "high"}},
            "priority": {"weight": "strict" if weight == "strict"
                         else float(weight), "low_buffer": buffer}}


def service_latencies(svc, sends, recvs, plan, t0, t_end, comm):
    """For the service messages planned before t_end, on every rank: the
    seconds from each one's hand-over to the network (the sender's
    timeline) to its arrival in the network model (the receiver's
    t_arrive), and how late each was handed over against its plan (the
    host's doing: a late progress thread hands several over at once, and
    they then queue in the model)."""
    released = {sends[e["op"]]: e["t"] for e in pc.timeline.events()
                if e["ev"] == "released" and e["sched"] == svc.serial and
                e["op"] in sends}
    out = svc.outcomes()
    arrived = {k: float(out.t_arrive[op]) for op, k in recvs.items()
               if out.name(op) == "ok"}
    released = {k: v for part in comm.allgather(released)
                for k, v in part.items()}
    arrived = {k: v for part in comm.allgather(arrived)
               for k, v in part.items()}
    keep = [k for k in sorted(arrived)
            if k in released and t0 + plan[k][0] < t_end]
    return ([arrived[k] - released[k] for k in keep],
            [released[k] - (t0 + plan[k][0]) for k in keep])


def run_setting(weight, buffer, seed, args, X, y, comm):
    """One training run with the service beside it; returns (service
    latencies in s, their hand-overs' lateness in s, learning drop share,
    final loss)."""
    pc.network.enable(network(weight, buffer, args.rate))
    plan = service_plan(comm.size, args.service_rate, args.horizon, seed=5)
    nbytes = parse_size(args.service_bytes)
    svc, sends, recvs, when = service_schedule(comm, plan, nbytes)
    t0 = comm.bcast(pc.now() + 0.2 if comm.rank == 0 else None)
    arm_plan(when, plan, t0, comm.rank)
    pc.timeline.clear()
    pc.timeline.enable()
    req = svc.post()
    while pc.now() < t0:
        time.sleep(0.01)
    losses, _, share = rps_model.train("rps", None, seed, args, X, y, comm)
    t_end = comm.allreduce(pc.now(), op=MPI.MAX)
    req.wait(timeout=args.horizon + 60)
    pc.timeline.disable()
    lat, late = service_latencies(svc, sends, recvs, plan, t0, t_end, comm)
    pc.timeline.clear()
    svc.free()
    pc.network.disable()
    if t_end - t0 > args.horizon and comm.rank == 0:
        print(f"warning: training outlasted the service plan "
              f"({t_end - t0:.1f} s > --horizon {args.horizon} s)")
    return lat, late, 1 - share, losses[-1]


def estimate_horizon(args, X, y, comm):
    """Service plan length: 1.5 x the measured training time + 1 s, from
    a short run with learning traffic alone and no buffer limit (the most
    learning traffic any setting sends)."""
    short = copy.copy(args)
    short.iters, short.every = 20, 20
    pc.network.enable(network(1, "unlimited", args.rate))
    t = time.monotonic()
    rps_model.train("rps", None, 0, short, X, y, comm)
    per_iter = comm.allreduce(time.monotonic() - t, op=MPI.MAX) / 20
    pc.network.disable()
    return 1.5 * per_iter * args.iters + 1.0


def block_bytes(args, P):
    """Bytes of one RPS block (the message size) for this model and P."""
    n = sum(a.size for a in rps_model.MLP(args.hidden, 0).params)
    return -(-n // P) * 8


def run(args, comm=MPI.COMM_WORLD):
    if args.from_csv:
        rows = read_csv(args.from_csv)
        if args.plot and comm.rank == 0:
            plot(rows, args.plot, f"from {args.from_csv}")
        return rows
    X, y = rps_model.digits()
    if args.horizon is None:
        args.horizon = estimate_horizon(args, X, y, comm)
    settings = [(w, b.strip()) for w in args.weights.split(",")
                for b in args.buffers.split(",")]
    jobs = [(w, b, s) for w, b in settings for s in range(args.seeds)]
    runs = {}
    for w, b, s in progress(jobs, comm, "runs"):
        runs[w, b, s] = run_setting(w, b, s, args, X, y, comm)
    rows = [summarise(w, b, [runs[w, b, s] for s in range(args.seeds)],
                      comm.size) for w, b in settings]
    setting = (f"{comm.size} ranks, NICs {args.rate}, RPS blocks "
               f"{block_bytes(args, comm.size)} B, {args.iters} iterations, "
               f"{args.seeds} seeds")
    emit(rows, COLUMNS, args,
         f"RPS beside a service: {setting}, "
         f"{parse_size(args.service_bytes)} B service "
         f"messages at {args.service_rate:g}/s per rank; latency on the "
         f"network's clock, loss of the average model", comm)
    if args.plot and comm.rank == 0:
        plot(rows, args.plot, setting)
    return rows


def summarise(weight, buffer, runs, P):
    """One row from a setting's runs (one per seed)."""
    lat = [x for run in runs for x in run[0]]
    late = [x for run in runs for x in run[1]]
    losses = [run[3] for run in runs]
    return {"ranks": P, "weight": weight, "buffer": buffer,
            "service_p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "service_p99_ms": 1e3 * float(np.percentile(lat, 99)),
            "service_mean_ms": 1e3 * float(np.mean(lat)),
            "messages": len(lat),
            "handover_late_p99_ms": 1e3 * float(np.percentile(late, 99)),
            "learning_dropped": float(np.mean([run[2] for run in runs])),
            "loss": float(np.mean(losses)), "loss_std": float(np.std(losses))}


def read_csv(path):
    """Rows as written by ``--csv`` (numbers back to floats)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in COLUMNS[2:]:
            r[k] = float(r[k])
    return rows


def plot(rows, path, setting):
    """Service latency (p50 and p99) against final loss, one point per
    buffer (labelled with it and its drop share), a pair of lines per
    weight."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for w in dict.fromkeys(r["weight"] for r in rows):
        mine = [r for r in rows if r["weight"] == w]
        xs = [r["loss"] for r in mine]
        err = [r["loss_std"] for r in mine]
        for col, style, name in (("service_p50_ms", "o-", "p50"),
                                 ("service_p99_ms", "^--", "p99")):
            ax.errorbar(xs, [r[col] for r in mine], xerr=err, fmt=style,
                        capsize=3, label=f"service {name}, weight {w}")
        for r in mine:
            ax.annotate(f"{r['buffer']}\n{100 * r['learning_dropped']:.0f} %"
                        " dropped", (r["loss"], r["service_p99_ms"]),
                        textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    ax.set_yscale("log")
    ax.margins(x=0.12, y=0.2)          # room for the labels
    ax.set_xlabel("final training loss (average model, mean over seeds)")
    ax.set_ylabel("service latency (ms, network clock)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"RPS beside a service, learning buffer swept\n{setting}",
                 fontsize=9)
    save_plot(fig, path)


def main(argv=None):
    from ._common import cli
    return cli(sys.modules[__name__], "rps --colocated", argv)
