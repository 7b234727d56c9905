"""MLfabric's scheduler time per batch (the paper's section 7.4).

Batches of ``|U|`` updates with deadlines drawn from Uniform(1, ``2|U|``) on a
network of ``|U|/2`` workers (two updates each) with a congestion-free core,
NIC rates drawn from the paper's N1, N2 or N3; ordering, aggregation and
replication (a replica with its own aggregators) for each.  One process
(under mpiexec only rank 0 works).  Reports the median and largest time
per phase over ``--repeat`` batches (each planned ``--runs`` times, the
fastest kept), in wall and in this thread's CPU seconds (on a loaded
machine the CPU time is the scheduler's own cost), with the load average
and whether the link model's C loops were used.
Our targets: <= 30 ms at ``|U|`` = 100 and <= 150 ms at ``|U|`` = 1,000 (the
paper: 30 ms and 1,460 ms).
"""
import os
import sys

from mpi4py import MPI

from ..mlfabric.scheduler import links
from ..mlfabric.scheduler.microbench import N1, N2, N3, scheduler_benchmark
from ._common import add_renamed, cli, emit, listed, whole, writable

NETWORKS = {"N1": N1, "N2": N2, "N3": N3}
TARGETS_MS = {100: 30.0, 1000: 150.0}


def add_args(p):
    p.add_argument("--sizes", type=listed(whole(1)), default="10,100,500,1000",
                   help="comma-separated batch sizes |U|")
    repeat = p.add_mutually_exclusive_group()
    repeat.add_argument("--repeat", type=whole(1), default=5,
                        help="batches (fresh network and updates) per size")
    add_renamed(repeat, "--repeats", "--repeat", "repeat", whole(1), str,
                "N", "batches per size")
    p.add_argument("--runs", type=whole(1), default=3,
                   help="times each batch is planned (the fastest is kept)")
    p.add_argument("--seed", type=whole(0), default=0)
    p.add_argument("--network", choices=sorted(NETWORKS), default="N2")
    p.add_argument("--aggregators", type=whole(0), default=4, help="k")
    p.add_argument("--replica-aggregators", type=whole(0), default=2, help="k'")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


def run(args, comm=MPI.COMM_WORLD):
    if comm.rank != 0:
        return []
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        r = scheduler_benchmark(n, int(args.repeat), args.seed,
                                args.aggregators,
                                args.replica_aggregators,
                                NETWORKS[args.network], runs=args.runs)
        row = {"U": n}
        for phase in ("order", "aggregate", "replicate", "total"):
            row[f"{phase}_cpu_ms"] = 1e3 * r[f"cpu_{phase}"]["median"]
        row["max_cpu_ms"] = 1e3 * r["cpu_total"]["max"]
        row["wall_ms"] = 1e3 * r["total"]["median"]
        row["target_ms"] = TARGETS_MS.get(n, "")
        for key in ("kept", "dropped", "direct", "delayed"):
            row[key] = r[key]
        rows.append(row)
    load = os.getloadavg()[0]
    loops = "Python" if links.native is None else "C"
    emit(rows, list(rows[0]) if rows else [], args,
         f"MLfabric scheduler per batch: {args.network}, k = "
         f"{args.aggregators}, k' = {args.replica_aggregators}", comm,
         legend=[f"{int(args.repeat)} batches per size, each the fastest of "
                 f"{args.runs} runs; medians over batches (max_cpu_ms: the "
                 f"largest)",
                 f"link loops in {loops}; load average {load:.1f} on "
                 f"{os.cpu_count()} CPUs"])
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "mlfabric-sched", argv)
