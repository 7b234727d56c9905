"""Executor overheads: per-op cost of a long NOP chain and of a chain of tiny
send/recv pairs, post-to-completion latency of a small schedule, and the CPU
time the progress thread uses when idle and when polling a pending receive.
"""
import sys
import statistics
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import cli, across_ranks, emit


def add_args(p):
    p.add_argument("--chain", type=int, default=100_000, help="NOP chain length")
    p.add_argument("--pairs", type=int, default=2000, help="send/recv pairs in the chain")
    p.add_argument("--iters", type=int, default=2000, help="post-to-completion samples")
    p.add_argument("--idle-seconds", type=float, default=2.0)
    p.add_argument("--csv")
    p.add_argument("--json")


def nop_chain(n):
    s = pc.Schedule(MPI.COMM_SELF)
    prev = s.nop()
    for _ in range(n - 1):
        prev = s.nop(after=prev)
    s.commit()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        s.post().wait()
        times.append((time.perf_counter() - t0) / n)
    s.free()
    return statistics.median(times)


def sendrecv_chain(n, comm):
    """Ranks in pairs (0-1, 2-3, ...): a chain of n ping-pong exchanges."""
    peer = comm.rank ^ 1
    if peer >= comm.size:
        peer = comm.rank                    # odd rank out talks to itself
    s = pc.Schedule(comm)
    b = s.buffer(np.zeros(1, np.int8))
    prev = []
    r = s.buffer(np.zeros(1, np.int8))
    for i in range(n):       # send and receive side by side, then the next
        snd = s.send(b, peer, tag=i % 1000, after=prev)
        rcv = s.recv(r, peer, tag=i % 1000, after=prev)
        prev = [snd, rcv]
    s.commit()
    times = []
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        s.post().wait()
        times.append((time.perf_counter() - t0) / (2 * n))
    s.free()
    return statistics.median(times)


def post_latency(iters):
    s = pc.Schedule(MPI.COMM_SELF)
    s.nop()
    s.commit()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        s.post().wait()
        t.append(time.perf_counter() - t0)
    s.free()
    return statistics.median(t)


def thread_cpu(seconds, pending):
    """Fraction of a core the progress thread uses over `seconds`."""
    s = None
    if pending:                             # a receive that never completes
        s = pc.Schedule(MPI.COMM_SELF, persistent=True)
        s.recv(peer=0, tag=4242, stamped=True, optional=True)
        s.nop(after=[s.trigger()])
        s.post()
    time.sleep(0.2)
    c0, w0 = pc.progress_thread_cputime(), time.monotonic()
    time.sleep(seconds)
    frac = (pc.progress_thread_cputime() - c0) / (time.monotonic() - w0)
    if s is not None:
        s.free()
    return frac


def run(args, comm=MPI.COMM_WORLD):
    rows = []

    def add(metric, value, unit, target=""):
        avg, mn, mx = across_ranks(value, comm)
        rows.append({"metric": metric, "avg": avg, "min": mn, "max": mx,
                     "unit": unit, "target": target, "ranks": comm.size})

    add("NOP chain, per op", nop_chain(args.chain) * 1e6, "us", "<= 1 us")
    add("send/recv chain, per op", sendrecv_chain(args.pairs, comm) * 1e6, "us")
    add("post-to-completion, 1-NOP schedule", post_latency(args.iters) * 1e6, "us")
    comm.Barrier()
    add("progress thread CPU, idle", 100 * thread_cpu(args.idle_seconds, False),
        "% core", "< 1 %")
    comm.Barrier()
    add("progress thread CPU, polling a pending recv",
        100 * thread_cpu(args.idle_seconds, True), "% core")
    emit(rows, ["metric", "avg", "min", "max", "unit", "target"], args,
         f"executor overhead: {comm.size} ranks", comm)
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "overhead", argv)
