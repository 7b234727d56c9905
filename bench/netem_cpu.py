"""CPU time of a sync reduction over the emulated network.

A rank's CPU time (all its threads: the caller driving progress, the
progress thread) per step of the eager averager's sync reduction of the
overlap benchmark's MLP gradients (6 x 1024 x 1024 float32 and biases,
24 MiB, 4 MB buckets), against the step's wall time, at a given emulated
rate.  What the link does not explain (CPU while the wire carries data)
is what the progress engine's polling costs.

Run: mpiexec -n 2 python bench/netem_cpu.py "173 MB/s" [steps]
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.eager import EagerAverager


def main():
    comm = MPI.COMM_WORLD
    rate = sys.argv[1] if len(sys.argv) > 1 else "173 MB/s"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    shapes = [(1024, 1024), (1024,)] * 6 + [(1, 1024), (1,)]
    pc.network.enable({"default": {"out_rate": rate, "in_rate": rate,
                                   "latency": "0.1 ms"}})
    c = comm.Dup()
    avg = EagerAverager([(s, np.float32) for s in shapes], "sync", comm=c,
                        bucket_bytes=4 << 20,
                        order=list(reversed(range(len(shapes)))))
    grads = [np.zeros(s, np.float32) for s in shapes]
    for _ in range(3):
        avg.reduce(grads)
    comm.Barrier()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        avg.reduce(grads)
    w1, c1 = time.perf_counter(), time.process_time()
    avg.close()
    c.Free()
    pc.network.disable()
    row = np.array([1e3 * (w1 - w0) / steps, 1e3 * (c1 - c0) / steps])
    rows = comm.gather(row, root=0)
    if comm.rank == 0:
        for r, (wall, cpu) in enumerate(rows):
            print(f"rank {r}: {rate}, wall {wall:.1f} ms per step, "
                  f"CPU {cpu:.1f} ms per step ({100 * cpu / wall:.0f} %)")


if __name__ == "__main__":
    main()
