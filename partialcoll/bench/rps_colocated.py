"""RPS beyond its paper: learning traffic sent unreliably beside a
latency-sensitive service (the RPS paper's section 7 case study, on the
emulated network instead of a packet simulator).

Every rank's NIC carries two kinds of traffic:

  service    small messages (``--service-bytes``) from every rank to random
             peers at Poisson times (``--service-rate`` per rank, the same
             plan for every weight), reliable, high priority (class 2);
  learning   RPS's averaging messages, low priority (class 1); a sender's
             NIC holds at most ``--buffer`` bytes of them, the rest is
             dropped (tail drop), and RPS trains on what arrives.

For each weight w (a service flow's share of a NIC against a learning
flow's: 1 is fair, larger prioritises the service), one training run of
``--iters`` RPS iterations with the service running beside it.  Reported:
the service messages' mean and 99th-percentile latency (planned send time to
delivery, for messages planned while training ran), the share of learning
messages dropped, and the final training loss of the averaged model.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from . import rps
from ._common import emit, progress


def add_args(p):
    p.add_argument("--weights", default="1,2,4,8,16,strict")
    p.add_argument("--rate", default="4 MB/s", help="every NIC, both ways")
    p.add_argument("--buffer", default="48 KB",
                   help="learning data a sender's NIC holds")
    p.add_argument("--service-bytes", type=int, default=2048)
    p.add_argument("--service-rate", type=float, default=400.0,
                   help="service messages per second per rank")
    p.add_argument("--horizon", type=float, default=None,
                   help="seconds of service plan (default: measured)")


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
    just before posting: building thousands of ops takes a while)."""
    r = comm.rank
    s = pc.Schedule(comm)
    when = np.zeros(len(plan))
    at_ = s.buffer(when, name="when")
    out = s.buffer(np.zeros(nbytes, np.uint8), writable=False)
    mine = [k for k, (_, src, dst) in enumerate(plan) if dst == r]
    inbox = s.buffer(np.zeros(max(len(mine), 1) * nbytes, np.uint8))
    slot = {k: j for j, k in enumerate(mine)}
    recvs = {}
    for k, (t, src, dst) in enumerate(plan):
        if src == r:
            at = s.start_at(at_[k:k + 1])
            s.send(out, dst, tag=k, after=[at], traffic_class=2)
        elif dst == r:
            at = s.start_at(at_[k:k + 1])      # 50 ms early (see below)
            j = slot[k]
            recvs[s.recv(inbox[j * nbytes:(j + 1) * nbytes], src, tag=k,
                         after=[at], traffic_class=2)] = k
    s.commit()
    return s, recvs, when


def arm_plan(when, plan, t0, rank):
    """Absolute start times: sends at t0 + t, receives 50 ms before."""
    for k, (t, src, _) in enumerate(plan):
        when[k] = t0 + t - (0 if src == rank else 0.05)


def run_weight(w, args, X, y, comm):
    """One training run with the service beside it at weight w; returns
    (service latencies in s, learning drop share, final loss)."""
    P = comm.size
    pc.network.enable({
        "seed": 77, "drop_mode": "told",
        "default": {"out_rate": args.rate, "in_rate": args.rate},
        "class": {"1": {"priority": "low"}, "2": {"priority": "high"}},
        "priority": {"weight": "strict" if w == "strict" else float(w),
                     "low_buffer": args.buffer}})
    horizon = args.horizon
    plan = service_plan(P, args.service_rate, horizon, seed=5)
    svc, recvs, when = service_schedule(comm, plan, args.service_bytes)
    t0 = comm.bcast(pc.now() + 0.2 if comm.rank == 0 else None)
    arm_plan(when, plan, t0, comm.rank)
    pc.timeline.clear()
    pc.timeline.enable()
    req = svc.post()
    while pc.now() < t0:
        time.sleep(0.01)
    losses, _, share = rps.train("rps", None, 0, args, X, y, comm)
    t_end = comm.allreduce(pc.now(), op=MPI.MAX)
    req.wait(timeout=horizon + 60)
    pc.timeline.disable()
    got = {recvs[e["op"]]: e["t"] for e in pc.timeline.events()
           if e["ev"] == "delivered" and e["sched"] == svc.serial and
           e["op"] in recvs}
    lat = [got[k] - (t0 + plan[k][0]) for k in got if t0 + plan[k][0] < t_end]
    lat = [x for part in comm.allgather(lat) for x in part]
    svc.free()
    pc.network.disable()
    if t_end - t0 > horizon and comm.rank == 0:
        print(f"warning: training outlasted the service plan "
              f"({t_end - t0:.1f} s > --horizon {horizon} s)")
    return lat, 1 - share, losses[-1]


def estimate_horizon(args, X, y, comm):
    """Service plan length: 1.5 x the measured training time + 1 s, from
    a short run with learning traffic alone at the lowest weight."""
    import copy
    short = copy.copy(args)
    short.iters, short.every = 20, 20
    pc.network.enable({"default": {"out_rate": args.rate,
                                   "in_rate": args.rate},
                       "class": {"1": {"priority": "low"}},
                       "priority": {"low_buffer": args.buffer}})
    t = time.monotonic()
    rps.train("rps", None, 0, short, X, y, comm)
    per_iter = comm.allreduce(time.monotonic() - t, op=MPI.MAX) / 20
    pc.network.disable()
    return 1.5 * per_iter * args.iters + 1.0


def run(args, comm=MPI.COMM_WORLD):
    X, y = rps.digits()
    if args.horizon is None:
        args.horizon = estimate_horizon(args, X, y, comm)
    rows = []
    for w in progress(args.weights.split(","), comm, "weights"):
        lat, dropped, loss = run_weight(w, args, X, y, comm)
        rows.append({"ranks": comm.size, "weight": w,
                     "service_ms": 1e3 * float(np.mean(lat)),
                     "service_p99_ms": 1e3 * float(np.percentile(lat, 99)),
                     "messages": len(lat), "learning_dropped": dropped,
                     "loss": loss})
    emit(rows, ["weight", "service_ms", "service_p99_ms", "messages",
                "learning_dropped", "loss"], args,
         f"RPS beside a service: {comm.size} ranks, NICs {args.rate}, "
         f"learning buffer {args.buffer}, {args.service_bytes} B service "
         f"messages at {args.service_rate:g}/s per rank", comm)
    return rows


def main(argv=None):
    from ._common import cli
    return cli(sys.modules[__name__], "rps --colocated", argv)
