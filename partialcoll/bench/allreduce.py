"""Allreduce latency and bandwidth over a range of message sizes, in the
conventions of the OSU micro-benchmarks (``osu_allreduce``) and
nccl-tests (``all_reduce_perf``): MPI_Allreduce, partialcoll's allreduce
and the partial collectives (solo, majority, quorum), out of place and in
place, all in the same processes.

Sizes: ``-m MIN:MAX`` (OSU) or ``-b MIN -e MAX`` (nccl-tests), multiplied
by ``-f`` (default 2) from one to the next; ``8``, ``64K``, ``4M`` (binary,
as those tools), ``4MiB`` or ``4MB`` (decimal).  For each size,
implementation and placement: ``-x`` untimed calls, then ``-i`` timed
calls between two barriers (partial collectives are flushed before each
barrier, as their contract asks); a rank's time is the block's time over
``-i``, and avg/min/max are over the ranks.  The options are spelled as
in every partialcoll benchmark (``-i/--iters``, ``-x/--warmup``,
``-d/--dtype``); OSU's ``--iterations`` and nccl-tests' ``--datatype``
are read too.

Columns: ``algbw`` = size / avg time; ``busbw`` = algbw x 2(n-1)/n, what
each rank's links carried for a bandwidth-optimal allreduce (nccl-tests'
convention; for the partial collectives, as if every rank were in every
round).  ``#wrong``: elements of a checked call's result that are wrong,
summed over ranks (one call after the timed block, on fresh data: rank r
contributes r + 1 everywhere).  A full allreduce must give exactly the
reduction of 1..n; a partial collective's result (sum only) must be the
same everywhere in the buffer, a whole multiple of nothing larger than
its rounds x n(n+1)/2, and hold this rank's own contribution when it says
so (``included``).  ``-c 0`` skips the checks.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (add_dtype, add_iters, add_size_range, add_warmup,
                      byte_size, cli, emit, parse_size, progress, settle,
                      sizes_between, whole, writable)

IMPLS = ("MPI_Allreduce", "allreduce", "solo", "majority", "quorum")
PARTIAL = ("solo", "majority", "quorum")
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
       "avg": None}
DTYPES = ("float32", "float64", "float16", "int32", "int64")


def add_args(p):
    add_size_range(p, "8:1M")
    p.add_argument("-b", "--minbytes", type=byte_size, default=None,
                   help="smallest size, nccl-tests style (default 8)")
    p.add_argument("-e", "--maxbytes", type=byte_size, default=None,
                   help="largest size (default 1M)")
    add_iters(p, 100, "timed calls per size", "--iterations")
    add_warmup(p, 10, "untimed calls first")
    p.add_argument("-o", "--op", choices=list(OPS), default="sum",
                   help="reduction (default sum; avg: MPI_Allreduce sums "
                        "and divides, the partial collectives skip it)")
    add_dtype(p, DTYPES, "float32", "--datatype")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                   help="check each result, #wrong column (default 1)")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help=f"comma-separated subset of {','.join(IMPLS)} "
                        f"(default: all)")
    p.add_argument("--placement", choices=("both", "out", "in"),
                   default="both",
                   help="out of place, in place, or both (default both)")
    p.add_argument("--quorum", type=whole(1), default=None,
                   help="k of the quorum allreduce (default n/2)")
    p.add_argument("--csv", type=writable, help="write every column as CSV")
    p.add_argument("--json", type=writable, help="write every column as "
                                                 "JSON")


def sizes_of(args):
    """The sizes to run, smallest first (both forms of the range checked
    for agreement)."""
    if args.message_size and (args.minbytes or args.maxbytes):
        raise SystemExit("partialcoll-bench allreduce: give -m or -b/-e, "
                         "not both")
    if args.message_size:
        lo, hi = args.message_size
    else:
        lo = parse_size(args.minbytes or "8")
        hi = parse_size(args.maxbytes or "1M")
        if lo > hi:
            raise SystemExit(f"partialcoll-bench allreduce: -b {lo} is "
                             f"larger than -e {hi}")
    return sizes_between(lo, hi, args.stepfactor or 2.0)


def impls_of(args):
    chosen = [t.strip() for t in args.impls.split(",") if t.strip()]
    bad = [t for t in chosen if t not in IMPLS]
    if bad or not chosen:
        raise SystemExit(f"partialcoll-bench allreduce: --impls takes "
                         f"{', '.join(IMPLS)}; not {', '.join(bad) or '(none)'}")
    return chosen


def _caller(impl, op, comm, k, inplace):
    """call(send, recv) running one collective of ``impl``."""
    send_of = (lambda s: MPI.IN_PLACE) if inplace else (lambda s: s)
    if impl == "MPI_Allreduce":
        mop = OPS[op] or MPI.SUM

        def call(s, r):
            comm.Allreduce(send_of(s), r, op=mop)
            if OPS[op] is None:
                r /= comm.size
            return r
        return call
    pop = op if op != "sum" else pc.SUM
    if impl == "allreduce":
        return lambda s, r: pc.allreduce(send_of(s), r, op=pop, comm=comm)
    if impl == "solo":
        return lambda s, r: pc.solo_allreduce(send_of(s), r, op=pop,
                                              comm=comm)
    if impl == "majority":
        return lambda s, r: pc.majority_allreduce(send_of(s), r, op=pop,
                                                  comm=comm, seed=1)
    return lambda s, r: pc.quorum_allreduce(send_of(s), k, r, op=pop,
                                            comm=comm)


def expected(op, dtype, n):
    vals = np.arange(1, n + 1).astype(dtype)
    if op == "avg":
        return vals.astype(np.float64).mean().astype(dtype)
    return {"sum": np.add, "prod": np.multiply, "min": np.minimum,
            "max": np.maximum}[op].reduce(vals, dtype=dtype)


def wrong_full(result, want):
    return int(np.count_nonzero(np.asarray(result) != want))


def wrong_partial(res, rank, n):
    """Elements of a partial result that cannot be right (sum)."""
    data = np.asarray(res.data, dtype=np.float64)
    top = max(res.rounds, 1) * n * (n + 1) / 2
    bad = (data != data.flat[0]) | (data < 0) | (data > top) | \
        (data != np.round(data))
    if res.included and data.size and data.flat[0] < rank + 1:
        bad[:] = True
    return int(np.count_nonzero(bad))


def measure(impl, op, dtype, count, args, comm, k, inplace):
    """(avg, min, max) microseconds per call over ranks, and #wrong."""
    call = _caller(impl, op, comm, k, inplace)
    partial = impl in PARTIAL
    fill = np.full(count, comm.rank + 1, dtype)
    send, recv = fill.copy(), np.empty(count, dtype)
    if inplace:
        recv = send
    for _ in range(args.warmup):
        call(send, recv)
    if partial:
        pc.flush_partials(comm)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        call(send, recv)
    t = (time.perf_counter() - t0) / args.iters * 1e6
    if partial:
        pc.flush_partials(comm)
    wrong = 0
    if args.check:
        send = fill.copy()
        recv = send if inplace else np.empty(count, dtype)
        got = call(send, recv)
        if partial:
            wrong = wrong_partial(got, comm.rank, comm.size)
            pc.flush_partials(comm)
        else:
            wrong = wrong_full(recv, expected(op, dtype, comm.size))
    comm.Barrier()
    times = comm.allgather(t)
    wrong = comm.allreduce(wrong)
    return (float(np.mean(times)), min(times), max(times)), wrong


def run(args, comm=MPI.COMM_WORLD):
    sizes, impls = sizes_of(args), impls_of(args)
    dtype = np.dtype(args.dtype)
    k = args.quorum or max(comm.size // 2, 1)
    if k > comm.size:
        raise SystemExit(f"partialcoll-bench allreduce: --quorum {k} is "
                         f"more than the {comm.size} ranks")
    places = {"both": (False, True), "out": (False,), "in": (True,)}[
        args.placement]
    skipped = [i for i in impls if i in PARTIAL and args.op != "sum"]
    rows = []
    n = comm.size
    settle(comm)        # else the first row pays for the job's start
    for nbytes in progress(sizes, comm, "allreduce"):
        count = max(nbytes // dtype.itemsize, 1)
        for impl in impls:
            if impl in skipped:
                continue
            for inplace in places:
                (avg, lo, hi), wrong = measure(impl, args.op, dtype, count,
                                               args, comm, k, inplace)
                size = count * dtype.itemsize
                algbw = size / avg / 1e3              # GB/s
                rows.append({
                    "size": size, "count": count, "type": dtype.name,
                    "redop": args.op, "impl": impl if impl != "quorum"
                    else f"quorum({k})",
                    "place": "in" if inplace else "out",
                    "time_us": avg, "min_us": lo, "max_us": hi,
                    "algbw": algbw, "busbw": algbw * 2 * (n - 1) / n,
                    "#wrong": wrong if args.check else "N/A",
                    "ranks": n, "iters": args.iters,
                    "warmup": args.warmup})
    pc.close_partials(comm)
    legend = {"time_us": "average over ranks of each rank's time per call "
                         "(min_us, max_us: the fastest and slowest rank)",
              "algbw": "size / time_us, GB/s",
              "busbw": "algbw x 2(n-1)/n, GB/s (nccl-tests' convention)",
              "#wrong": "wrong elements of one checked call, all ranks"}
    lines = [f"{name}: {meaning}" for name, meaning in legend.items()]
    if skipped:
        lines.append(f"not run: {', '.join(skipped)} (partial collectives "
                     f"with -o {args.op}: sum only)")
    emit(rows, ["size", "count", "type", "redop", "impl", "place", "time_us",
                "min_us", "max_us", "algbw", "busbw", "#wrong"], args,
         f"allreduce: {n} ranks, {dtype.name}, op {args.op}, "
         f"{args.iters} iterations after {args.warmup} warm-up",
         comm, legend=lines)
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "allreduce", argv)
