"""Executor overheads: per-op cost of a long NOP chain and of a chain of tiny
send/recv pairs, post-to-completion latency of a small schedule, and the CPU
time the progress thread uses when idle and when polling a pending receive.

Scale rows: a small blocking allreduce with N idle partial
objects open against none (same run), the progress thread's CPU with them
open, and N objects created and closed in sequence (resident memory and
library communicators before and after).  Timeline rows: the NOP chain and
post-to-completion latency with the timeline recording.
"""
import sys
import statistics
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (across_ranks, add_iters, cli, emit, progress, real,
                      whole, writable)


def add_args(p):
    p.add_argument("--chain", type=whole(1), default=100_000, help="NOP chain length")
    p.add_argument("--pairs", type=whole(1), default=2000, help="send/recv pairs in the chain")
    add_iters(p, 2000, "post-to-completion samples")
    p.add_argument("--idle-seconds", type=real(0), default=2.0)
    p.add_argument("--objects", type=whole(1), default=1000,
                   help="idle partial objects for the scale rows (1000)")
    p.add_argument("--churn", type=whole(1), default=10000,
                   help="objects created and closed in sequence (10000)")
    p.add_argument("--allreduce-iters", type=whole(1), default=20000)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


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


def small_allreduce(comm, iters, blocks=5):
    """Median over blocks of the per-call time of an 8-byte allreduce."""
    x, y = np.ones(1), np.empty(1)
    for _ in range(200):
        pc.allreduce(x, y, comm=comm)
    times = []
    for _ in range(blocks):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters // blocks):
            pc.allreduce(x, y, comm=comm)
        times.append((time.perf_counter() - t0) / (iters // blocks))
    return statistics.median(times)


def rss_mib():
    import resource
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


def churn(comm, n):
    """Create and close n objects in sequence: (RSS growth MiB, library
    duplicates before, after)."""
    from ..core import libcomm
    dups0 = libcomm.live_duplicates()
    ar = pc.SoloAllreduce(np.zeros(4), comm=comm)
    ar.close()
    rss0 = rss_mib()
    for k in progress(range(n), comm, "create/close", total=n):
        ar = pc.SoloAllreduce(np.zeros(4), comm=comm)
        ar(np.ones(4))
        ar.close()
    return rss_mib() - rss0, dups0, libcomm.live_duplicates()


def scale_rows(args, comm, add):
    base = small_allreduce(comm, args.allreduce_iters)
    objs = [pc.SoloAllreduce(np.zeros(1), comm=comm)
            for _ in progress(range(args.objects), comm, "objects",
                              total=args.objects)]
    comm.Barrier()
    time.sleep(0.5)                      # let the progress thread settle
    loaded = small_allreduce(comm, args.allreduce_iters)
    add("8-byte allreduce, no objects open", base * 1e6, "us")
    add(f"8-byte allreduce, {args.objects} idle objects open", loaded * 1e6,
        "us")
    ratio = loaded / base
    add("  ratio (target <= 1.5)", ratio, "x", "<= 1.5")
    add(f"progress thread CPU, {args.objects} idle objects open",
        100 * thread_cpu(args.idle_seconds, False), "% core", "<= 2 %")
    add(f"outstanding messages with {args.objects} objects open",
        pc.engine_stats()["outstanding"], "")
    for ar in objs:
        ar.close()
    grown, d0, d1 = churn(comm, args.churn)
    add(f"RSS growth over {args.churn} objects created and closed", grown,
        "MiB", "flat")
    add("library duplicates before / after the churn", f"{d0} / {d1}", "",
        "flat")


def timeline_rows(args, add):
    pc.timeline.enable()
    add("NOP chain, per op, timeline on", nop_chain(args.chain) * 1e6, "us")
    add("post-to-completion, timeline on", post_latency(args.iters) * 1e6,
        "us")
    pc.timeline.disable()
    pc.timeline.clear()


def run(args, comm=MPI.COMM_WORLD):
    rows = []

    def add(metric, value, unit, target=""):
        if isinstance(value, str):
            rows.append({"metric": metric, "avg": value, "min": "", "max": "",
                         "unit": unit, "target": target, "ranks": comm.size})
            return
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
    timeline_rows(args, add)
    if args.objects or args.churn:
        scale_rows(args, comm, add)
    emit(rows, ["metric", "avg", "min", "max", "unit", "target"], args,
         f"executor overhead: {comm.size} ranks", comm)
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "overhead", argv)
