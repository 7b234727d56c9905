"""Calibration of the emulated network (partialcoll.network): each row sets
up a small network, moves messages through it with schedules, and compares
what it measured with what the model says::

  one flow        one rank sends N bytes to another over R: takes N / R
  shared in-NIC   two ranks send N bytes each into one rank whose in-NIC is
                  R: each gets R / 2 (needs 3 ranks)
  latency         a chain of K one-element messages over a link of latency
                  L, each sent when the last arrived: takes K x L
  drops           M messages at drop probability p: the number lost lies in
                  the 99 % interval of Binomial(M, p), and a fresh network
                  with the same seed loses exactly the same ones
  trace           a rate redrawn every T from a distribution: the throughput
                  of each epoch matches the rate drawn for it

Run at 2 to 4 ranks: ``mpiexec -n 3 partialcoll-bench netcal``.
"""
import math
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (byte_size, cli, duration_text, emit, parse_size,
                      rate_text, real, whole, writable)


def add_args(p):
    p.add_argument("--size", type=byte_size, default="4M", help="bytes per flow (default 4M)")
    p.add_argument("--rate", type=rate_text, default="10 MB/s",
                   help="link rate (10 MB/s)")
    p.add_argument("--latency", type=duration_text, default="20 ms",
                   help="for the chain (20 ms)")
    p.add_argument("--chain", type=whole(1), default=10, help="messages in it")
    p.add_argument("--messages", type=whole(1), default=2000,
                   help="messages for the drop count")
    p.add_argument("--drop", type=real(0), default=0.05)
    p.add_argument("--seed", type=whole(0), default=11)
    p.add_argument("--every", type=real(0, True), default=0.5,
                   help="trace: seconds between rate draws (0.5)")
    p.add_argument("--epochs", type=whole(1), default=6,
                   help="trace: epochs to stream through (6)")
    p.add_argument("--repeat", type=whole(1), default=3,
                   help="runs per timed row (median reported)")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


class Network:
    """Context manager: the emulated network ``cfg`` on a fresh duplicate
    of COMM_WORLD (collective), plain MPI again at exit."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        pc.network.enable(self.cfg)
        self.comm = MPI.COMM_WORLD.Dup()
        return self.comm

    def __exit__(self, *exc):
        self.comm.Free()
        pc.network.disable()


def start_time(comm, lead=0.05):
    """A start a little ahead, the same on every rank (the executor's clock
    is shared by the processes of a host)."""
    return comm.bcast(pc.now() + lead if comm.rank == 0 else None)


def transfer(comm, pairs, nbytes, clock="delivered"):
    """Each (src, dst) in pairs moves nbytes, all starting together.
    Returns {src: seconds from the start to delivery} on each receiver.

    ``clock``: ``"delivered"`` (when the receiving rank's progress thread
    saw the message: what a program sees, host delays included) or
    ``"arrival"`` (the network model's arrival time, ``t_arrive``: the
    model alone, whatever the host's load)."""
    t0 = start_time(comm)
    s = pc.Schedule(comm)
    at = s.start_at(t0)
    keep, recvs = [], {}
    for src, dst in pairs:
        if comm.rank == src:
            keep.append(np.ones(nbytes // 8))
            s.send(s.buffer(keep[-1], writable=False), dst, tag=src,
                   after=[at])
        if comm.rank == dst:
            keep.append(np.zeros(nbytes // 8))
            recvs[src] = s.recv(s.buffer(keep[-1]), src, tag=src)
    pc.timeline.clear()
    pc.timeline.enable()
    s.post().wait(timeout=120)
    pc.timeline.disable()
    if clock == "arrival":
        t = s.outcomes().t_arrive
        got = {src: float(t[op]) - t0 for src, op in recvs.items()}
    else:
        got = {e["peer"]: e["t"] - t0 for e in pc.timeline.events()
               if e["ev"] == "delivered" and e["sched"] == s.serial}
    s.free()
    return got


def chain(comm, n):
    """n one-element messages 0 -> 1, each after the last; seconds from
    rank 0's start to this rank's end (the same on ranks 0 and 1 but for
    when each saw its last message done).

    The start is rank 0's, on every rank: the ranks leave the barrier at
    different times, and on an oversubscribed host rank 1 can leave it
    milliseconds after rank 0 has sent, so its own clock would start late
    (a 10-hop chain of 20 ms hops once measured 0.1955 s on rank 1).
    ``time.monotonic`` is one clock for every process of the host."""
    s = pc.Schedule(comm)
    b = s.buffer(np.zeros(1))
    prev = []
    for k in range(n):
        if comm.rank == 0:
            prev = [s.send(b, 1, tag=k, after=prev)]
        elif comm.rank == 1:
            prev = [s.recv(b, 0, tag=k, after=prev)]
    comm.Barrier()
    t0 = time.monotonic()
    s.post().wait(timeout=120)
    t1 = time.monotonic()
    s.free()
    quiet_barrier(comm)     # ranks outside the chain must not spin meanwhile
    return t1 - comm.bcast(t0, root=0)


def quiet_barrier(comm):
    """A barrier that sleeps while it waits: MPI_Barrier polls at full speed,
    which on an oversubscribed node takes the cores from ranks still timing
    the emulated network."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def lost_messages(comm, n):
    """n one-element messages 0 -> 1; on rank 1 the indices of those the
    network dropped (told mode), else None."""
    s = pc.Schedule(comm)
    b = s.buffer(np.zeros(1))
    recvs = []
    for k in range(n):
        if comm.rank == 0:
            s.send(b, 1, tag=k % 1000)
        elif comm.rank == 1:
            recvs.append(s.recv(b, 0, tag=k % 1000))
    s.post().wait(timeout=120)
    out = s.outcomes()
    s.free()
    if comm.rank != 1:
        return None
    return [k for k, op in enumerate(recvs) if out.name(op) == "dropped"]


def binomial_interval(n, p, level=0.99):
    """The central interval holding `level` of Binomial(n, p)."""
    cdf, lo = 0.0, None
    for k in range(n + 1):
        cdf += math.comb(n, k) * p ** k * (1 - p) ** (n - k)
        if lo is None and cdf >= (1 - level) / 2:
            lo = k
        if cdf >= 1 - (1 - level) / 2:
            return lo, k
    return lo, n


def epochs(comm, rate, every, factors, probs, seed, nepochs):
    """Rank 0 streams messages to rank 1 while its out-NIC's rate is
    redrawn every `every` seconds; returns [(epoch, drawn rate, measured
    rate)] on rank 0 for the whole epochs the stream covered."""
    cfg = {"seed": seed, "default": {"out_rate": rate},
           "trace": [{"ranks": [0], "nic": "out", "every": every,
                      "factors": factors, "probabilities": probs}]}
    chunk, rows = 100_000, []
    with Network(cfg) as c:
        n = int(nepochs * every * max(factors) * pc.network.rate(rate)
                / chunk) + 1
        s = pc.Schedule(c)
        for k in range(n):
            if c.rank == 0:
                s.send(s.buffer(np.zeros(chunk // 8), writable=False), 1,
                       tag=k)
            elif c.rank == 1:
                s.recv(s.buffer(np.zeros(chunk // 8)), 0, tag=k)
        pc.timeline.clear()
        pc.timeline.enable()
        s.post().wait(timeout=600)
        pc.timeline.disable()
        xs = pc.timeline.Timeline({0: pc.timeline.raw()}).transfers()
        s.free()
        if c.rank == 0:
            _, t0 = pc.network.nic_rate(0)
            busy = {}
            for x in xs:      # bytes on the wire per epoch, split at edges
                a, b = x["wire_start"], x["wire_end"]
                for e in range(int((a - t0) // every),
                               int((b - t0) // every) + 1):
                    lo, hi = max(a, t0 + e * every), min(b, t0 + (e + 1) * every)
                    if hi > lo:
                        busy[e] = busy.get(e, 0) + x["bytes"] * (hi - lo) / (b - a)
            last = int((max(x["wire_end"] for x in xs) - t0) // every)
            for e in sorted(busy):
                if e == min(busy) or e >= last:
                    continue              # partial epochs at the ends
                drawn, _ = pc.network.nic_rate(0, "out", t0 + (e + 0.5) * every)
                rows.append((e, drawn, busy[e] / every))
    return rows


def run(args, comm=MPI.COMM_WORLD):
    if not 2 <= comm.size <= 4:
        if comm.rank == 0:
            print("netcal runs at 2 to 4 ranks", file=sys.stderr)
        return []
    size = parse_size(args.size)
    rate = pc.network.rate(args.rate)
    rows = []

    def add(name, config, expected, measured, unit, ok):
        err = 100 * (measured - expected) / expected if expected else 0.0
        rows.append({"row": name, "config": config, "expected": expected,
                     "measured": measured, "unit": unit, "error %": err,
                     "within": ok, "ranks": comm.size})

    link = {"default": {"out_rate": args.rate, "in_rate": args.rate}}
    with Network(link) as c:
        got = [transfer(c, [(0, 1)], size).get(0) for _ in range(args.repeat)]
    if comm.rank == 1:
        t = float(np.median(got))
        add("one flow", f"{args.size} over {args.rate}", size / rate, t, "s",
            abs(t - size / rate) <= 0.05 * size / rate)
    if comm.size >= 3:
        shared = {"default": {"out_rate": "unlimited", "in_rate": args.rate}}
        with Network(shared) as c:
            runs = [transfer(c, [(1, 0), (2, 0)], size // 2)
                    for _ in range(args.repeat)]
        if comm.rank == 0:
            for src in (1, 2):
                r = (size // 2) / float(np.median([g[src] for g in runs]))
                add(f"shared in-NIC, flow from {src}",
                    f"2 x {size // 2} B into {args.rate}", rate / 2, r, "B/s",
                    abs(r - rate / 2) <= 0.10 * rate / 2)
    lat = pc.network.seconds(args.latency)
    with Network({"default": {"latency": args.latency}}) as c:
        took = float(np.median([chain(c, args.chain)
                                for _ in range(args.repeat)]))
    if comm.rank in (0, 1):
        per = took / args.chain
        if comm.rank == 0:
            add("latency per message", f"chain of {args.chain} at "
                f"{args.latency}", lat, per, "s",
                abs(per - lat) <= 0.10 * lat)
    cfg = {"seed": args.seed, "default": {"drop": args.drop}}
    with Network(cfg) as c:
        lost = lost_messages(c, args.messages)
    with Network(cfg) as c:
        again = lost_messages(c, args.messages)
    if comm.rank == 1:
        lo, hi = binomial_interval(args.messages, args.drop)
        add("drops", f"{args.messages} at p={args.drop} (99 %: {lo}..{hi})",
            args.messages * args.drop, len(lost), "messages",
            lo <= len(lost) <= hi)
        add("drops, same seed again", "identical indices", len(lost),
            len(again), "messages", lost == again)
    for e, drawn, got in epochs(comm, args.rate, args.every,
                                [1, 2.5, 3.3, 5, 10],
                                [0.2, 0.2, 0.2, 0.2, 0.2], args.seed,
                                args.epochs):
        add(f"trace epoch {e}", f"out rate redrawn every {args.every} s",
            drawn, got, "B/s", abs(got - drawn) <= 0.05 * drawn)
    everyone = comm.gather(rows, root=0)
    order = ("one", "shared", "latency", "drops", "trace")
    rows = sorted((r for part in everyone or [] for r in part),
                  key=lambda r: [k for k, w in enumerate(order)
                                 if r["row"].startswith(w)][0])
    emit(rows, ["row", "config", "expected", "measured", "unit", "error %",
                "within"], args,
         f"emulated network calibration: {comm.size} ranks", comm)
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "netcal", argv)
