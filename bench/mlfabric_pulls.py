"""Where a worker's step goes in the MLfabric parameter server (issue 14,
section 10.3): pull latency (ready notice to model in hand) and compute per
step, CPU seconds per rank, with and without model distribution.

    mpiexec -n 16 python bench/mlfabric_pulls.py <distributors> mlfabric|async [base_rate [aggregators [distribution]]]

C2-N1 (10 % of steps 4x slower, NICs 10 x base_rate nine times in ten, else
5 x; base_rate 1e7 bytes/s unless given), the tanh MLP (1.18 MB updates),
15 s, 2 aggregators and Algorithm 3's distribution tree unless given.  Instruments the Worker
class by wrapping three of its methods (this script only)."""
import sys, time, numpy as np
from mpi4py import MPI
import partialcoll as pc
from partialcoll.mlfabric import SGD, TanhMLP, train
from partialcoll.mlfabric.runtime import worker as W
from partialcoll.bench._common import limit_blas
d = int(sys.argv[1]); mode = sys.argv[2]
base = float(sys.argv[3]) if len(sys.argv) > 3 else 1e7
aggs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
shape = sys.argv[5] if len(sys.argv) > 5 else "algorithm3"
comm = MPI.COMM_WORLD; N = comm.size - 1
T = {"req": [], "got": [], "cstart": []}
oc, op, osc = W.Worker._computed, W.Worker._pulled, W.Worker._start_compute
def c(self):
    T["req"].append(time.monotonic()); oc(self)
def p(self):
    T["got"].append(time.monotonic()); op(self)
def s(self):
    T["cstart"].append(time.monotonic()); osc(self)
W.Worker._computed, W.Worker._pulled, W.Worker._start_compute = c, p, s
pc.network.enable({"seed": 1000, "default": {"out_rate": base, "in_rate": base, "latency": "0.5 ms"},
   "trace": [{"ranks": "all", "nic": "both", "every": 2.0, "factors": [1, 2.5, 3.3, 5, 10],
              "probabilities": [0, 0, 0, 0.1, 0.9]}]})
t0 = time.process_time()
with limit_blas(1, comm):
    kw = dict(tau_max=2 * N, distributors=d, distribution=shape) if mode == "mlfabric" else {}
    res = train(TanhMLP(1024, 128, 128, seed=0), SGD(8, 0.5), comm, mode=mode,
                aggregators=aggs, batch_interval=0.1, monitor_lag=0.2, initial_rate=5 * base,
                compute_time=0.1, stragglers=(0.1, 4.0), duration=15, seed=0, **kw)
cpu = time.process_time() - t0
pc.network.disable()
n = min(len(T["req"]), len(T["got"]))
pull = np.array(T["got"][:n]) - np.array(T["req"][:n]) if n else np.array([0.0])
comp = np.array(T["req"][:n]) - np.array(T["cstart"][:n]) if n else np.array([0.0])
allp = comm.gather((pull.mean() if n else 0, np.median(pull) if n else 0, comp.mean() if n else 0, n, cpu), root=0)
if comm.rank == 0:
    w = allp[1:]
    print(mode, "d", d, shape, "base", base, "aggs", aggs, "notified", res.updates["notified"], "pull mean ms %.1f median %.1f compute ms %.1f steps/worker %.1f" % (
        1e3*np.mean([a[0] for a in w]), 1e3*np.mean([a[1] for a in w]), 1e3*np.mean([a[2] for a in w]), np.mean([a[3] for a in w])),
        "cpu s server %.1f worker mean %.1f" % (allp[0][4], np.mean([a[4] for a in w])),
        "into0 MB/s %.1f out0 MB/s %.1f" % (
            sum(v for (s, t), v in res.bytes.items() if t == 0) / 15e6,
            sum(v for (s, t), v in res.bytes.items() if s == 0) / 15e6),
        "pulls", res.pulls, flush=True)
