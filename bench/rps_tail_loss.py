"""RPS's final loss under tail drops, without the service:
``mpiexec -n 4 python bench/rps_tail_loss.py ITERS BUFFERS SEEDS``
(e.g. ``200 "48 KB,16 KB,unlimited" 1``).  The colocated case study's
network (every NIC 4 MB/s, learning traffic in low-priority class 1 with a
BUFFER per sender NIC) and model (hidden 128), the main table's metric
(the average model's loss on the whole training set).  (Issue 16, see
RESULTS.)"""
import argparse
import sys
import time

from mpi4py import MPI

import partialcoll as pc
from partialcoll.bench import rps

COMM = MPI.COMM_WORLD
iters, buffers, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = argparse.ArgumentParser()
rps.add_args(p)
args = p.parse_args(["--iters", iters, "--hidden", "128", "--every", iters])
X, y = rps.digits()
for buffer in buffers.split(","):
    for seed in range(seeds):
        pc.network.enable({"seed": 77,
                           "default": {"out_rate": "4 MB/s",
                                       "in_rate": "4 MB/s"},
                           "class": {"1": {"priority": "low"}},
                           "priority": {"weight": 1, "low_buffer": buffer}})
        t = time.monotonic()
        losses, spread, share = rps.train("rps", None, seed, args, X, y, COMM)
        pc.network.disable()
        if COMM.rank == 0:
            print(f"buffer {buffer:>9} seed {seed}: dropped {1 - share:.3f} "
                  f"loss {losses[-1]:.4f} spread {spread:.4f} "
                  f"({time.monotonic() - t:.0f} s)", flush=True)
