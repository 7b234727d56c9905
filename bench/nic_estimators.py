"""NIC rates from the load balancer's link reports, three ways, against
the configured rates: ``mpiexec -n 8 python bench/nic_estimators.py
[calls] [mbytes] [slice] [seed]``.  One fixed draw of every NIC's in and
out rate from 2..25 MB/s (seeded), the aware scheme, and after every call
rank 0 estimates each NIC from that call's reports (arrival times of each
link's forecast and slices):

  sum       sum of the links' s_ij, each over its own span (before issue 17's
            follow-up)
  union     the links' bytes over the union of their spans
  together  plan.nic_rates: the links' summed rate over the stretch they
            were on the wire together (what the scheduler uses), a slice
            across the stretch's edge split by the NIC's share per link
  by-time   the same, the slice split in proportion to time

Prints per estimator the median |error| of the NIC estimates and of S_i =
min(out, in) taken as the median of the last 3 calls (as the scheduler
does), and the share of S_i within 10 %, from the second call on.
(Issue 17, see RESULTS.)"""
import math
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.loadbalance import plan

COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
calls = int(sys.argv[1]) if len(sys.argv) > 1 else 8
mbytes = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
slice_elems = int(float(sys.argv[3])) if len(sys.argv) > 3 else 120_000
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 11
rng = np.random.default_rng(seed)
out_rate = rng.uniform(2, 25, P).round(1)
in_rate = rng.uniform(2, 25, P).round(1)
pc.network.enable({"default": {"latency": "1 ms"},
                   "rank": {str(r): {"out_rate": f"{out_rate[r]} MB/s",
                                     "in_rate": f"{in_rate[r]} MB/s"}
                            for r in range(P)}})


def by_nic(reports, rate_of):
    """(out, in) per node from a per-NIC function of its links' arrivals."""
    est = np.full((2, P), math.nan)
    for side in (0, 1):
        for n in range(P):
            links = [a for ij, (a, _) in reports.items()
                     if ij[side] == n and len(a) > 1]
            if links:
                est[side, n] = rate_of(links)
    return est


def summed(links):
    return sum(sum(b for _, b in a[1:]) / (a[-1][0] - a[0][0])
               for a in links)


def union(links):
    spans, total, cur = sorted((a[0][0], a[-1][0]) for a in links), 0.0, None
    for lo, hi in spans:
        if cur is None or lo > cur[1]:
            total += cur[1] - cur[0] if cur else 0.0
            cur = [lo, hi]
        else:
            cur[1] = max(cur[1], hi)
    total += cur[1] - cur[0]
    return sum(sum(b for _, b in a[1:]) for a in links) / total


def by_time(links):
    """plan.nic_rates' stretch, a straddling slice split by time (and no
    account of the averages after the slices)."""
    curves = [(np.array([t for t, _ in a]),
               np.cumsum([0.0] + [b for _, b in a[1:]])) for a in links]
    edges = sorted({t[0] for t, _ in curves} | {t[-1] for t, _ in curves})
    best = max(((sum(t[0] <= lo and t[-1] >= hi for t, _ in curves),
                 hi - lo, lo, hi) for lo, hi in zip(edges, edges[1:])),
               default=None)
    if not best or not best[0]:
        return math.nan
    lo, hi = best[2], best[3]
    return sum(np.interp(hi, t, c) - np.interp(lo, t, c)
               for t, c in curves if t[0] <= lo and t[-1] >= hi) / (hi - lo)


ESTIMATORS = {"sum": lambda r: by_nic(r, summed),
              "union": lambda r: by_nic(r, union),
              "together": lambda r: np.array(plan.nic_rates(r, P)),
              "by-time": lambda r: by_nic(r, by_time)}
x = np.full(int(mbytes * 1e6 / 4), float(RANK), np.float32)
lb = pc.LoadBalancedAllreduce(x, scheme="aware", slice_elems=slice_elems)
history = {k: [] for k in ESTIMATORS}
errors = {k: ([], []) for k in ESTIMATORS}
true = np.array([out_rate, in_rate]) * 1e6
for call in range(calls):
    lb(x)
    if RANK == 0 and lb.rates["reports"]:
        for name, estimate in ESTIMATORS.items():
            est = estimate(lb.rates["reports"])
            history[name] = (history[name] + [est])[-3:]
            med = np.nanmedian(np.array(history[name]), axis=0)
            if call >= 1:
                errors[name][0].extend((est / true - 1).ravel())
                errors[name][1].extend(np.fmin(med[0], med[1]) /
                                       true.min(0) - 1)
lb.close()
pc.network.disable()
if RANK == 0:
    print(f"P={P}, {mbytes} MB, slice {slice_elems}, seed {seed}: out "
          f"{out_rate.tolist()} in {in_rate.tolist()} MB/s")
    for name, (nic, S) in errors.items():
        nic, S = np.abs(np.array(nic)), np.abs(np.array(S))
        print(f"  {name:8s} NIC |err| median {100 * np.nanmedian(nic):5.1f} %"
              f"  S_i |err| median {100 * np.nanmedian(S):5.1f} %, within "
              f"10 %: {np.mean(S[~np.isnan(S)] < 0.1):.2f}")
