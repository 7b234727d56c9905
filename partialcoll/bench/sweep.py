"""OSU-style message-size sweep: partialcoll.allreduce vs MPI_Allreduce.

Both run in the same processes, alternating blocks, so noise hits both.  For
each size: ``--repeat`` blocks of ``--iters`` calls each (after ``--warmup``),
a barrier outside every timed block; per-call latency is averaged per block,
the median block is kept, and avg/min/max over ranks are reported.
"""
import sys
import statistics
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import cli, across_ranks, emit, fmt_size, parse_size, progress

DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M"


def add_args(p):
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated message sizes in bytes (K/M suffixes); default {DEFAULT_SIZES}")
    p.add_argument("--iters", type=int, default=None,
                   help="calls per timed block (default: 1000 small ... 20 at 4 MiB)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first")
    p.add_argument("--repeat", type=int, default=5, help="timed blocks per size")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--algorithm", default=None, choices=["recursive_doubling", "ring", "rabenseifner"])
    p.add_argument("--csv")
    p.add_argument("--json")


def _time_block(fn, iters, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    comm.Barrier()
    return dt


def run(args, comm=MPI.COMM_WORLD):
    dtype = np.dtype(args.dtype)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = []
    for nbytes in progress(sizes, comm, "sweep"):
        n = max(nbytes // dtype.itemsize, 1)
        iters = args.iters or max(20, min(1000, (1 << 22) // max(nbytes, 1) * 20))
        warm = args.warmup if args.warmup is not None else max(iters // 10, 5)
        x = np.full(n, comm.rank + 1, dtype)
        y_mpi, y_pc = np.empty_like(x), np.empty_like(x)

        def f_mpi():
            comm.Allreduce(x, y_mpi)

        def f_pc():
            pc.allreduce(x, y_pc, algorithm=args.algorithm)

        for _ in range(warm):
            f_mpi()
            f_pc()
        if not np.array_equal(y_mpi, y_pc):
            raise SystemExit(f"result mismatch at {nbytes} bytes")
        t_mpi, t_pc = [], []
        for _ in range(args.repeat):
            t_mpi.append(_time_block(f_mpi, iters, comm))
            t_pc.append(_time_block(f_pc, iters, comm))
        m_mpi = across_ranks(statistics.median(t_mpi) * 1e6, comm)
        m_pc = across_ranks(statistics.median(t_pc) * 1e6, comm)
        algo = pc.collectives.allreduce.choose_algorithm(
            x.nbytes, x.size, comm.size, args.algorithm)
        rows.append({"bytes": x.nbytes, "size": fmt_size(x.nbytes),
                     "ranks": comm.size, "algorithm": algo,
                     "mpi_avg_us": m_mpi[0], "mpi_min_us": m_mpi[1],
                     "mpi_max_us": m_mpi[2], "pc_avg_us": m_pc[0],
                     "pc_min_us": m_pc[1], "pc_max_us": m_pc[2],
                     "ratio": m_pc[0] / m_mpi[0], "iters": iters})
    emit(rows, ["size", "algorithm", "mpi_avg_us", "pc_avg_us", "pc_min_us",
                "pc_max_us", "ratio"], args,
         f"allreduce sweep: {comm.size} ranks, {dtype}, host buffers, "
         f"ratio = partialcoll / MPI_Allreduce ({MPI.Get_library_version().splitlines()[0]})",
         comm)
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "sweep", argv)
