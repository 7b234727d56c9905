"""Does the data plane reach the load model?  (issue 17)

``mpiexec -n P python bench/aware_model_check.py [--seeds 1,2]
[--slices 3000,...] [--mbytes 4] [--iters 4]``

For each seed, one fixed draw of every NIC's out and in rate from
{2, 3, ..., 25} MB/s (independently, as the ``aware`` benchmark draws
them), and for each slice size, the median time of a call (the first left
out) of :class:`partialcoll.LoadBalancedAllreduce` with equal shares
("average") and with Algorithm 1 on the true rates ("oracle"), against the
load model of 3.3: max_i (M + (N - 2) m_i) / S_i over the *planned* shares,
S_i = min(out_i, in_i), and over the shares the servers really get
(Algorithm 2's slices: a server planned at share 0 still aggregates its
probes, up to (N - 2) * num_probe * size_probe / M more load, 12 % at 8
ranks and 4 MB).  Prints one line per (seed, slice size) on rank 0: real
time, then the model over the realized / the planned shares.
"""
import argparse

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.loadbalance import plan


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--slices", default="3000,10000,30000,60000,120000,"
                                       "300000")
    p.add_argument("--mbytes", type=float, default=4.0)
    p.add_argument("--iters", type=int, default=4)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    N = comm.size
    n = int(args.mbytes * 1e6 / 4)
    x = np.ones(n, np.float32)
    for seed in [int(s) for s in args.seeds.split(",")]:
        rng = np.random.default_rng(seed)
        out = rng.integers(2, 26, N).astype(float)
        inn = rng.integers(2, 26, N).astype(float)
        S = list(np.minimum(out, inn) * 1e6 / 4)         # elements/s
        cfg = {"seed": 1, "default": {"latency": "1 ms"},
               "rank": {str(i): {"out_rate": f"{out[i]} MB/s",
                                 "in_rate": f"{inn[i]} MB/s"}
                        for i in range(N)}}
        if comm.rank == 0:
            print(f"seed {seed}: out {out.tolist()} in {inn.tolist()} MB/s")
        for sl in [int(v) for v in args.slices.split(",")]:
            res = {}
            for scheme in ("average", "oracle"):
                pc.network.enable(cfg)
                lb = pc.LoadBalancedAllreduce(x, scheme=scheme,
                                              slice_elems=sl)
                times = []
                for _ in range(args.iters):
                    t = pc.now()
                    lb(x)
                    times.append(pc.now() - t)
                got = [0] * N
                for _, c, owner, _ in plan.assign_slices(n, lb.shares, sl):
                    got[owner] += c
                model = (max(plan.node_times(float(n), got, S)),
                         max(plan.node_times(float(n), lb.shares, S)))
                lb.close()
                pc.network.disable()
                res[scheme] = (float(np.median(times[1:] or times)), model)
            if comm.rank == 0:
                (a, am), (o, om) = res["average"], res["oracle"]
                print(f"  slice {sl:>7}: average {a:.2f} s (model "
                      f"{am[0]:.2f} / {am[1]:.2f})  oracle {o:.2f} s (model "
                      f"{om[0]:.2f} / {om[1]:.2f})  oracle gain {a / o:.2f} "
                      f"(model {am[0] / om[0]:.2f} / {am[1] / om[1]:.2f})",
                      flush=True)


if __name__ == "__main__":
    main()
