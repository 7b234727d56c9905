"""Which links RPS's tail drops hit: ``mpiexec -n 4 python
bench/rps_tail_links.py [BUFFER] [CALLS]``.  The colocated case study's
network (every NIC 4 MB/s, learning traffic in low-priority class 1, a
BUFFER of low-priority data per sender NIC, default 48 KB) and a vector the
size of its model (hidden 128: 9,610 float64, blocks of 19.2 KB at P = 4),
averaged CALLS times (default 40) with no service beside it.  Prints, per
phase, the share of calls in which the block from src reached dst (counted
at dst from the timeline's delivered/dropped receive events), and how many
blocks each owner's average took.  (Issue 16, see RESULTS.)"""
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc

buffer = sys.argv[1] if len(sys.argv) > 1 else "48 KB"
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 40
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
pc.network.enable({"seed": 77, "drop_mode": "told",
                   "default": {"out_rate": "4 MB/s", "in_rate": "4 MB/s"},
                   "class": {"1": {"priority": "low"}},
                   "priority": {"weight": 1, "low_buffer": buffer}})
n = 64 * 128 + 128 + 128 * 10 + 10
x = np.zeros(n)
over = []
pc.timeline.clear()
pc.timeline.enable()
with pc.RPSAverage(x, seed=0) as avg:
    for _ in range(calls):
        x[:] = RANK
        over.append(avg(x).averaged_over)
pc.timeline.disable()
got = {}
for e in pc.timeline.events():
    if e["ev"] in ("delivered", "dropped"):     # only RPS receives here
        key = (e["tag"], e["peer"])
        got[key] = got.get(key, 0) + (e["ev"] == "delivered")
tags = sorted({t for t, _ in got})
table = COMM.gather({(ph, src): got.get((t, src), 0) / calls
                     for ph, t in enumerate(tags) for src in range(P)}, root=0)
over = COMM.gather(float(np.mean(over)), root=0)
if RANK == 0:
    print(f"{P} ranks, low buffer {buffer}, {calls} calls: share of calls in "
          "which src's block reached dst")
    for ph, name in enumerate(("reduce-scatter", "allgather")):
        print(f"{name:>15}  " + "  ".join(f"dst {d}" for d in range(P)))
        for s in range(P):
            print(f"{'src ' + str(s):>15}  " + "  ".join(
                "    -" if d == s else f"{table[d].get((ph, s), 0):5.2f}"
                for d in range(P)))
    print("blocks in an owner's average (mean per rank): " +
          " ".join(f"{v:.2f}" for v in over))
pc.network.disable()
