"""The overhead benchmark's send/recv chain on its own, repeated:
``mpiexec -n 2 python bench/srchain.py [pairs] [calls] [--after-nops]``
prints the median per-op time over ``calls`` calls in one launch (used to
compare two builds, alternating launches; see RESULTS, issue 11)."""
import statistics
import sys

from mpi4py import MPI

from partialcoll.bench.overhead import nop_chain, sendrecv_chain

args = [a for a in sys.argv[1:] if not a.startswith("--")]
pairs = int(args[0]) if args else 2000
calls = int(args[1]) if len(args) > 1 else 5
if "--after-nops" in sys.argv:
    nop_chain(100_000)              # as the overhead benchmark runs it
t = [sendrecv_chain(pairs, MPI.COMM_WORLD) for _ in range(calls)]
if MPI.COMM_WORLD.rank == 0:
    print("send/recv chain per op: median %.3f us (%s)" % (
        statistics.median(t) * 1e6, " ".join("%.3f" % (x * 1e6) for x in t)))
