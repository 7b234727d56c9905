"""What MLfabric's scheduler believes about the links (issue 14)

``timeout 300 mpiexec -n 8 python bench/mlfabric_monitor_check.py
[--network N3] [--scheme mlfabric-2N] [--duration 25] [benchmark flags
...]``

Runs one MLfabric scheme of ``partialcoll-bench mlfabric`` (C2
stragglers, seed 0) as the benchmark runs it (any of its flags after
ours; default here: ``--model mlp --lr 4 --server-nic fixed --base-rate
2e6 --distributors 2 --distribution one-copy``, the communication-bound
run of bench/RESULTS.md) and, at every batch the scheduler plans, records
on the server:

* the link monitor's estimate of the server's incoming NIC (with
  ``--server-nic fixed`` its true rate is 10 x base at all times) and of
  the workers' outgoing NICs (true: one of {1, 2.5, 3.3, 5, 10} x base);
* how far ahead of now the last planned commit lies (the next batch's
  transfers are planned to complete after it).

Prints their 10th, 50th and 90th percentiles with the run's notified,
applied and dropped updates and the drop reasons.  A diagnostic: it
wraps :meth:`partialcoll.mlfabric.scheduler.Scheduler.plan` to look, and
changes nothing the scheduler decides.
"""
import argparse
import sys

from mpi4py import MPI

import partialcoll as pc
from partialcoll.bench import mlfabric as bench
from partialcoll.bench._common import limit_blas
from partialcoll.mlfabric.scheduler import batch as scheduler_module

DEFAULTS = ["--model", "mlp", "--lr", "4", "--server-nic", "fixed",
            "--base-rate", "2e6", "--distributors", "2",
            "--distribution", "one-copy"]


def _quantiles(xs):
    xs = sorted(xs)
    return [xs[int(f * (len(xs) - 1))] for f in (0.1, 0.5, 0.9)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--network", default="N3", choices=sorted(bench.NETWORKS))
    p.add_argument("--scheme", default="mlfabric-2N",
                   choices=["mlfabric-N", "mlfabric-2N"])
    mine, rest = p.parse_known_args(argv)
    b = argparse.ArgumentParser()
    bench.add_args(b)
    args = b.parse_args(DEFAULTS + ["--duration", "25"] + rest)
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        raise SystemExit("run under mpiexec with >= 3 ranks")
    seen = {"server_in": [], "worker_out": [], "ahead": []}
    plan = scheduler_module.Scheduler.plan

    def watched(self, now, updates):
        out = plan(self, now, updates)
        o, i = self.monitor.rates(now)
        seen["server_in"].append(i[self.server])
        seen["worker_out"].extend(o[w] for w in self.workers)
        seen["ahead"].append(self.server_floor - now)
        return out

    scheduler_module.Scheduler.plan = watched
    with limit_blas(args.blas_threads, comm):
        pc.network.enable(bench._network(args, mine.network, 0))
        try:
            r = bench._one(args, mine.scheme, bench.STRAGGLERS["C2"], 0,
                           comm)
        finally:
            pc.network.disable()
            scheduler_module.Scheduler.plan = plan
    if comm.rank == 0:
        top = max(bench.FACTORS) * args.base_rate
        print(f"C2-{mine.network}, {mine.scheme}, base rate "
              f"{args.base_rate:g} B/s, {args.duration:g} s: updates "
              f"notified {r['notified']}, applied {r['losses'][-1][1]}, "
              f"dropped {r['drops']} {r['drop_reasons']}")
        q = _quantiles(seen["server_in"])
        print("server's incoming NIC as the monitor sees it, MB/s "
              "(10th/50th/90th percentile): " +
              " / ".join(f"{x / 1e6:.1f}" for x in q) +
              (f" (true: {top / 1e6:g})" if args.server_nic == "fixed"
               else ""))
        q = _quantiles(seen["worker_out"])
        print("workers' outgoing NICs as the monitor sees them, MB/s: " +
              " / ".join(f"{x / 1e6:.1f}" for x in q) + " (true: one of " +
              ", ".join(f"{f * args.base_rate / 1e6:g}"
                        for f in bench.FACTORS) + ")")
        q = _quantiles(seen["ahead"])
        print(f"last planned commit ahead of now, s, over "
              f"{len(seen['ahead'])} batches: " +
              " / ".join(f"{x:.2f}" for x in q))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
