"""The aware scheme call by call on the ``aware`` benchmark's trace (issue 17):
``mpiexec -n 8 python bench/aware_calls.py SEED FROM TO SLICE OUT.json``.

Runs the aware scheme on the benchmark's rates (every NIC 2..25 MB/s,
redrawn every 30 s, seed SEED; a 4 MB gradient) until TO seconds, and for
the calls that start after FROM prints and saves, per call: its start and
length, the shares it ran with, the scheduler's NIC estimates after it
(what the next call is planned from), and the true NIC rates at its end.
"""
import json
import sys
import types

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.bench import aware


def main():
    comm = MPI.COMM_WORLD
    seed, t_from, t_to = int(sys.argv[1]), float(sys.argv[2]), \
        float(sys.argv[3])
    slice_elems, out_path = int(sys.argv[4]), sys.argv[5]
    args = types.SimpleNamespace(low=2.0, high=25.0, every=30.0,
                                 latency="1 ms", message_overhead="0",
                                 seed=seed)
    n = 1_000_000
    x = np.ones(n, np.float32)
    pc.network.enable(aware.network(args))
    _, t0 = pc.network.nic_rate(0)
    lb = pc.LoadBalancedAllreduce(x, scheme="aware", slice_elems=slice_elems)
    rows = []
    while True:
        t, shares = pc.now(), [m / n for m in lb.shares]
        lb(x)
        dt = pc.now() - t
        if comm.rank == 0 and t - t0 >= t_from:
            mb = [[pc.network.nic_rate(i, nic)[0] / 1e6
                   for i in range(comm.size)] for nic in ("out", "in")]
            rows.append({"t": t - t0, "dt": dt, "shares": shares,
                         "est_out": [v / 1e6 for v in lb.rates.get("out", [])],
                         "est_in": [v / 1e6 for v in lb.rates.get("in", [])],
                         "bound": lb.rates.get("bound"),
                         "true_out": mb[0], "true_in": mb[1]})
        if comm.bcast(pc.now() - t0 >= t_to if comm.rank == 0 else None):
            break
    lb.close()
    pc.network.disable()
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
        for r in rows:
            print(f"t={r['t']:.1f} s  call {r['dt']:.2f} s  shares "
                  f"{[round(v, 2) for v in r['shares']]}")
            for nic in ("out", "in"):
                print(f"   {nic:>3}: estimated "
                      f"{[round(v, 1) for v in r['est_' + nic]]}  true "
                      f"{[round(v, 1) for v in r['true_' + nic]]}")


if __name__ == "__main__":
    main()
