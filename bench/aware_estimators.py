"""Iteration time on fixed rate draws: equal shares, the oracle, and the
aware scheme with two NIC estimators (both timed by arrival times):
``mpiexec -n P python bench/aware_estimators.py MB SLICE SEEDS [iters]``
(SEEDS comma-separated).  Every NIC's in and out rate is drawn from
2..25 MB/s per seed and held; each scheme runs ``iters`` calls and the
median of the calls after the third is printed.

  aware-sum       S_i from sum_j s_ij (each over its link's own span), the
                  estimator before issue 17's follow-up; swapped in for
                  this comparison by replacing plan.nic_rates
  aware-together  plan.nic_rates (what the scheduler uses)
(Issue 17, see RESULTS.)"""
import math
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.loadbalance import plan

COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
mbytes, slice_elems = float(sys.argv[1]), int(float(sys.argv[2]))
seeds = [int(s) for s in sys.argv[3].split(",")]
iters = int(sys.argv[4]) if len(sys.argv) > 4 else 8
together = plan.nic_rates


def summed(reports, N=None):
    s = plan.link_rates(reports)
    N = N or max(max(ij) for ij in s) + 1
    return ([sum(v for (i, _), v in s.items() if i == n) or math.nan
             for n in range(N)],
            [sum(v for (_, j), v in s.items() if j == n) or math.nan
             for n in range(N)])


x = np.full(int(mbytes * 1e6 / 4), float(RANK), np.float32)
for seed in seeds:
    rng = np.random.default_rng(seed)
    out_rate = rng.uniform(2, 25, P).round(1)
    in_rate = rng.uniform(2, 25, P).round(1)
    net = {"default": {"latency": "1 ms"},
           "rank": {str(r): {"out_rate": f"{out_rate[r]} MB/s",
                             "in_rate": f"{in_rate[r]} MB/s"}
                    for r in range(P)}}
    times = {}
    for name in ("average", "oracle", "aware-sum", "aware-together"):
        pc.network.enable(net)
        plan.nic_rates = summed if name == "aware-sum" else together
        lb = pc.LoadBalancedAllreduce(x, scheme=name.split("-")[0],
                                      slice_elems=slice_elems)
        took = []
        for _ in range(iters):
            COMM.Barrier()
            t = pc.now()
            lb(x)
            took.append(pc.now() - t)
        lb.close()
        pc.network.disable()
        times[name] = float(np.median(took[3:] or took))
    plan.nic_rates = together
    if RANK == 0:
        print(f"P={P}, {mbytes} MB, slice {slice_elems}, seed {seed}: " +
              ", ".join(f"{k} {v:.3f} s" for k, v in times.items()),
              flush=True)
