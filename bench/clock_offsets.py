"""Clock offsets across emulated hosts: each rank's estimated offset to
rank 0's clock against the true one (the time namespace's, read from
/proc/self/timens_offsets), its error bound, and what an estimate costs;
the first estimate and two re-estimates.  Run it on the cluster in a box:

    cd tests && python cluster.py --hosts 2 --per-host 2 --netmod ucx -- \\
        python ../bench/clock_offsets.py
"""
import time

from mpi4py import MPI

from partialcoll.core import clock

c = MPI.COMM_WORLD


def truth():
    """This process's CLOCK_MONOTONIC offset (its time namespace's)."""
    with open("/proc/self/timens_offsets") as f:
        for line in f:
            k, s, ns = line.split()
            if k in ("monotonic", "1"):
                return int(s) + int(ns) * 1e-9
    return 0.0


t = truth()
tru = c.allgather(t)
for k in range(3):
    t0 = time.perf_counter()
    clk = clock.reestimate(c) if k else clock.of(c)
    took = time.perf_counter() - t0
    dev = abs(clk.offset - (tru[c.rank] - tru[0]))
    rows = c.gather((c.rank, clk.offset, clk.error, dev, took), root=0)
    if c.rank == 0:
        for r in rows:
            print(f"rank {r[0]} offset {r[1]:.6f} s error {r[2] * 1e6:.1f} us "
                  f"|est-true| {r[3] * 1e6:.2f} us estimate took "
                  f"{r[4] * 1e3:.2f} ms")
