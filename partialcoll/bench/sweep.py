"""OSU-style message-size sweep: partialcoll.allreduce vs MPI_Allreduce.

Both run in the same processes, alternating blocks, so noise hits both.
The sizes: ``--sizes`` (a list) or ``-m MIN:MAX`` with ``-f``, as the
``allreduce`` benchmark reads them.  For each size: ``--repeat`` blocks
of ``--iters`` calls each (after ``--warmup``), a barrier outside every
timed block; per-call latency is averaged per block, the median block is
kept, and avg/min/max over ranks are reported.

``--device gpu`` puts partialcoll's buffers on the GPU (CuPy) and adds
``cupyx.distributed.NCCLBackend.all_reduce`` on the same device buffers;
MPI_Allreduce stays on host buffers of the same size.  A device run also
times what a user without a CUDA-aware MPI writes by hand: copy the device
array to the host, ``MPI_Allreduce``, copy the result back
(``cp.asnumpy`` -> ``comm.Allreduce`` -> ``cp.asarray``).  Bandwidth as
nccl-tests reports it: algbw = bytes / time, busbw = algbw * 2 (P - 1) / P.
"""
import sys
import statistics
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from ..collectives.algorithm import choose_algorithm

from ._common import (Buffers, add_device_arg, add_dtype, add_iters,
                      add_size_range, add_warmup, across_ranks, byte_size,
                      cli, emit, fmt_size, listed, parse_size, progress,
                      sizes_between, whole, writable)

DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M"


def add_args(p):
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument("--sizes", type=listed(byte_size), default=None,
                       help=f"comma-separated message sizes in bytes "
                            f"(default {DEFAULT_SIZES})")
    add_size_range(p, "the --sizes list", group=sizes)
    add_iters(p, None, "calls per timed block (default: 1000 small ... 20 "
                       "at 4 MiB)")
    add_warmup(p, None, "untimed calls first (default: a tenth of --iters, "
                        "at least 5)")
    p.add_argument("--repeat", type=whole(1), default=5,
                   help="timed blocks per size (default 5)")
    add_dtype(p, ["float32", "float64", "int32", "int64"])
    p.add_argument("--algorithm", default=None, choices=["recursive_doubling", "ring", "rabenseifner"])
    add_device_arg(p)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


def sizes_of(args):
    """The message sizes in bytes: --sizes, or -m MIN:MAX in steps of -f,
    or the default list."""
    if args.message_size:
        return sizes_between(*args.message_size, args.stepfactor or 2.0)
    if args.stepfactor is not None:
        raise SystemExit("partialcoll-bench sweep: -f is the step of a "
                         "-m MIN:MAX range; with --sizes (or the default "
                         "list) give no -f")
    return [parse_size(s) for s in (args.sizes or DEFAULT_SIZES).split(",")
            if s.strip()]


def _time_block(fn, iters, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    comm.Barrier()
    return dt


def _contenders(x, bufs, nccl, args, comm):
    """name -> (one call, its result on the host) for one message: MPI on
    host buffers, partialcoll on ``bufs``' buffers, and on a device the
    hand-written staging and NCCL (when there is one)."""
    y_mpi = np.empty_like(x)
    dx, y_pc = bufs.array(x), bufs.array(np.empty_like(x))
    calls = {"mpi": (lambda: comm.Allreduce(x, y_mpi), lambda: y_mpi),
             "pc": (lambda: pc.allreduce(dx, y_pc, algorithm=args.algorithm),
                    lambda: bufs.host(y_pc))}
    if bufs.device != "host":
        y_hand, out = np.empty_like(x), [None]

        def hand():
            comm.Allreduce(bufs.host(dx), y_hand)
            out[0] = bufs.array(y_hand)
        calls["hand"] = (hand, lambda: bufs.host(out[0]))
    if nccl:
        y_nccl = bufs.array(np.empty_like(x))
        calls["nccl"] = (lambda: nccl(dx, y_nccl), lambda: bufs.host(y_nccl))
    return calls


def _size_row(nbytes, dtype, bufs, nccl, args, comm):
    """Time every contender at one message size; its table row."""
    n = max(nbytes // dtype.itemsize, 1)
    iters = args.iters or max(20, min(1000, (1 << 22) // max(nbytes, 1) * 20))
    warm = args.warmup if args.warmup is not None else max(iters // 10, 5)
    x = np.full(n, comm.rank + 1, dtype)
    calls = _contenders(x, bufs, nccl, args, comm)
    for _ in range(warm):
        for f, _ in calls.values():
            f()
    want = calls["mpi"][1]()
    if any(not np.array_equal(want, got()) for _, got in calls.values()):
        raise SystemExit(f"result mismatch at {nbytes} bytes")
    times = {name: [] for name in calls}
    for _ in range(args.repeat):
        for name, (f, _) in calls.items():
            times[name].append(_time_block(f, iters, comm))
    nan = (float("nan"),) * 3
    m = {name: across_ranks(statistics.median(times[name]) * 1e6, comm)
         if name in times else nan for name in ("mpi", "pc", "hand", "nccl")}
    bus = 2 * (comm.size - 1) / comm.size
    pc_us = m["pc"][0]
    return {"bytes": x.nbytes, "size": fmt_size(x.nbytes),
            "ranks": comm.size,
            "algorithm": choose_algorithm(x.nbytes, x.size, comm.size,
                                          args.algorithm),
            "mpi_avg_us": m["mpi"][0], "mpi_min_us": m["mpi"][1],
            "mpi_max_us": m["mpi"][2], "pc_avg_us": pc_us,
            "pc_min_us": m["pc"][1], "pc_max_us": m["pc"][2],
            "ratio": pc_us / m["mpi"][0], "iters": iters,
            "device": bufs.device, "nccl_avg_us": m["nccl"][0],
            "nccl_ratio": pc_us / m["nccl"][0],
            "pc_GBps": x.nbytes / pc_us / 1e3,
            "pc_busGBps": bus * x.nbytes / pc_us / 1e3,
            "mpi_GBps": x.nbytes / m["mpi"][0] / 1e3,
            "hand_avg_us": m["hand"][0], "vs_hand": m["hand"][0] / pc_us}


def run(args, comm=MPI.COMM_WORLD):
    dtype = np.dtype(args.dtype)
    bufs = Buffers(getattr(args, "device", "host"), comm)
    nccl = bufs.nccl()
    rows = [_size_row(nbytes, dtype, bufs, nccl, args, comm)
            for nbytes in progress(sizes_of(args), comm, "sweep")]
    cols = ["size", "algorithm", "mpi_avg_us", "pc_avg_us", "pc_min_us",
            "pc_max_us", "ratio"]
    where = "host buffers"
    if bufs.device != "host":
        cols += ["pc_GBps", "pc_busGBps", "mpi_GBps", "hand_avg_us",
                 "vs_hand"] + (["nccl_avg_us", "nccl_ratio"] if nccl else [])
        where = (f"partialcoll on {bufs.device} buffers ({pc.gpu_path()} "
                 f"MPI path), MPI_Allreduce on host buffers"
                 + (f"; {bufs.nccl_note}" if bufs.nccl_note and
                    bufs.device == "gpu" else ""))
    emit(rows, cols, args,
         f"allreduce sweep: {comm.size} ranks, {dtype}, {where}", comm,
         legend={"ratio": "partialcoll's time / MPI_Allreduce's",
                 "nccl_ratio": "partialcoll's time / NCCL's (GPU runs)",
                 "pc_GBps": "algbw: bytes / partialcoll's time",
                 "pc_busGBps": "busbw: algbw * 2 (P - 1) / P",
                 "hand_avg_us": "copy to host, MPI_Allreduce, copy back",
                 "vs_hand": "that time / partialcoll's (above 1: "
                            "partialcoll faster)"})
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "sweep", argv)
