"""What one call of lag costs in the load model (issue 17; no MPI).

``python bench/aware_lag_model.py [--ranks 6,7,8] [--mbytes 4,8]
[--every 30] [--draws 200] [--seed 1] [--min-probe -1]``

The ``aware`` benchmark's trace in the load model of 3.3: every NIC's out
and in rate drawn from {2, ..., 25} MB/s, redrawn every ``--every`` s; a
call takes max_i (M + (N - 2) m_i) / S_i with S_i = min(out_i, in_i) at
the call's start, over the shares the servers really get (Algorithm 2's
slices, probes included: with ``--min-probe 0`` every probe has the
paper's 10,000 elements; by default a server planned below its probes gets
probes of its share's size, at least slice // 12 elements (2,500 at the
default 30,000), as the library does).  Three planners:

  average   equal shares
  oracle    Algorithm 1 on the rates of this call (no lag)
  lagged    Algorithm 1 on the rates of the call before (what a scheme that
            plans from the previous call's measurements can do at best:
            exact estimates, one call late)

Prints throughput (calls per second over the whole trace) relative to
average.  The real data plane adds its own overheads (the measured aware
calls reach about 0.97 of this model's figure; bench/RESULTS.md), so the
``lagged`` column is a ceiling for the measured aware scheme.
"""
import argparse

import numpy as np

from partialcoll.loadbalance import plan


def call_time(n, shares, S, slice_elems, min_probe):
    got = [0] * len(S)
    for _, c, owner, _ in plan.assign_slices(n, shares, slice_elems,
                                             min_probe=min_probe):
        got[owner] += c
    return max(plan.node_times(float(n), got, S))


def throughput(scheme, n, draws, every, slice_elems, min_probe=None):
    N = len(draws[0])
    t, calls, before = 0.0, 0, None
    while t < every * len(draws):
        S = draws[int(t // every)]
        if scheme == "average":
            shares = plan.equal_shares(float(n), N)
        else:
            basis = S if scheme == "oracle" or before is None else before
            shares = plan.distribute(float(n), basis, 0.01)[0]
        before = S
        t += call_time(n, shares, S, slice_elems, min_probe)
        calls += 1
    return calls / t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="6,7,8")
    p.add_argument("--mbytes", default="4,8")
    p.add_argument("--every", type=float, default=30.0)
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--slice", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-probe", type=int, default=-1,
                   help="-1 (default): slice // 12, as the library's "
                        "'auto'; 0: the paper's fixed probes")
    args = p.parse_args()
    mp = plan.auto_min_probe(args.slice) if args.min_probe < 0 else \
        args.min_probe or None
    print(" N  MB  oracle/average  lagged/average  lagged/oracle")
    for N in [int(v) for v in args.ranks.split(",")]:
        for mb in [float(v) for v in args.mbytes.split(",")]:
            n = int(mb * 1e6 / 4)
            rng = np.random.default_rng(args.seed)
            draws = [list(np.minimum(rng.integers(2, 26, N),
                                     rng.integers(2, 26, N)) * 1e6 / 4)
                     for _ in range(args.draws)]
            r = {s: throughput(s, n, draws, args.every, args.slice, mp)
                 for s in ("average", "oracle", "lagged")}
            print(f"{N:>2} {mb:>3g}  {r['oracle'] / r['average']:14.3f}  "
                  f"{r['lagged'] / r['average']:14.3f}  "
                  f"{r['lagged'] / r['oracle']:13.3f}", flush=True)


if __name__ == "__main__":
    main()
