"""TicTac's priorities for allreduce (beyond the paper; ByteScheduler's
observation): data-parallel training with gradient buckets, where the next
forward pass needs the first layers' gradients first, but backward makes
them last.

Every rank emulates one training step after another with a traced model's
op times (sleeps: no CPU), as a framework that overlaps communication with
both passes would run it:

  backward   layers in reverse; once a bucket's last gradient is made, its
             allreduce starts (one collective per part of --partition
             bytes), non-blocking
  forward    layers in order; a layer first waits for the buckets holding
             its parameters (the update is then applied), then computes

The two methods differ only in the buckets' priority, same run, same
buckets and parts:

  fifo       every message priority 0: queued messages leave in the order
             they became ready (backward order)
  priority   a bucket's number is its most urgent parameter's in TicTac's
             first-use order (TIC on the traced graph): first layers first

With one send in flight per destination (``pc.set_send_cap(1)``), queued
messages leave lowest number first.  Reported: the mean step time
(forward start to next forward start) after warm-up, the gain of
priority over fifo, per target rho (link rate set from the ring's traffic:
2 (P - 1) / P x the gradient bytes per step, over rho x compute).

Run: ``mpiexec -n 4 partialcoll-bench tictac-allreduce``.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ..collectives.partial import SoloAllreduce
from ..tictac import planner
from ..tictac.graphs import model as load_model
from ..tictac.graphs import scale_compute, trace
from ._common import (
    add_warmup, byte_size, byte_size_or_0, cli, emit, listed, parse_size,
    progress, real, whole, writable)

METHODS = ("fifo", "priority")


def add_args(p):
    p.add_argument("--model", default="resnet50")
    p.add_argument("--mode", choices=("sync", "solo"), default="sync",
                   help="collective per part: iallreduce (sync) or solo")
    p.add_argument("--rhos", type=listed(real(0, True)), default="0.5,1,1.5")
    p.add_argument("--steps", type=whole(1), default=10)
    add_warmup(p, 2, "steps discarded first")
    p.add_argument("--compute", type=real(0, True), default=0.5,
                   help="emulated forward seconds per step (backward: x2)")
    p.add_argument("--payload", type=byte_size, default="8M",
                   help="gradient bytes per step (the model's, scaled)")
    p.add_argument("--bucket", type=byte_size, default="1M", help="bucket bytes (as DDP's "
                   "bucket_cap, in scaled bytes)")
    p.add_argument("--partition", type=byte_size_or_0, default="256K",
                   help="largest collective, bytes (0: no partitioning)")
    p.add_argument("--latency", default="0.1 ms")
    p.add_argument("--batch", type=whole(1), default=8)
    p.add_argument("--image", type=whole(1), default=None)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


class Layout:
    """Layers (forward seconds, parameter tensors read) and buckets (their
    parts' element ranges, priority, the layer whose backward completes
    them) of one model, the same on every rank."""

    def __init__(self, graph, payload, bucket_bytes, partition_bytes):
        recvs = graph.recvs
        pos = {r.index: k for k, r in enumerate(recvs)}
        total = sum(r.nbytes for r in recvs)
        self.size = [max(1, int(payload * r.nbytes / total / 4))
                     for r in recvs]                      # float32 elements
        self.layers = [(op.time, [pos[d] for d in op.deps if d in pos])
                       for op in graph.ops if op.kind == planner.COMPUTE]
        first = planner.first_use(graph)
        self.urgency = [first[r.name] for r in recvs]
        made_by = {}                       # param -> first layer using it
        for j, (_, reads) in enumerate(self.layers):
            for k in reads:
                made_by.setdefault(k, j)
        # DDP's buckets: parameters in backward order (reverse first use)
        order = sorted(range(len(recvs)),
                       key=lambda k: -made_by.get(k, len(self.layers)))
        self.buckets, cur = [], []
        for k in order:
            if cur and 4 * sum(self.size[i] for i in cur + [k]) > bucket_bytes:
                self.buckets.append(cur)
                cur = []
            cur.append(k)
        self.buckets.append(cur)
        self.ready_after = [min(made_by.get(k, 0) for k in b)
                            for b in self.buckets]
        self.bucket_of = {k: i for i, b in enumerate(self.buckets) for k in b}
        self.priority = [min(self.urgency[k] for k in b) for b in self.buckets]
        self.parts = []
        for b in self.buckets:
            n = sum(self.size[k] for k in b)
            per = max(1, partition_bytes // 4) if partition_bytes else n
            cuts = sorted({min(n, c) for c in range(0, n, per)} | {n})
            self.parts.append(list(zip(cuts, cuts[1:])))

    @property
    def nbytes(self):
        return 4 * sum(self.size)


def emulate(layout, method, mode, steps, comm):
    """Steps of the emulated training loop; returns the start time of each
    forward pass (pc.now())."""
    bufs = [np.ones(sum(layout.size[k] for k in b), np.float32)
            for b in layout.buckets]
    outs = [np.empty_like(x) for x in bufs]
    prio = layout.priority if method == "priority" else \
        [0] * len(layout.buckets)
    solo = None
    if mode == "solo":
        solo = [[SoloAllreduce(bufs[i][lo:hi], comm=comm, priority=prio[i])
                 for lo, hi in layout.parts[i]] for i in range(len(bufs))]
    inflight, starts = {}, []

    def start(i):
        if solo is not None:
            inflight[i] = [c.start(bufs[i][lo:hi]) for c, (lo, hi) in
                           zip(solo[i], layout.parts[i])]
        else:
            inflight[i] = [pc.iallreduce(bufs[i][lo:hi], outs[i][lo:hi],
                                         comm=comm, priority=prio[i])
                           for lo, hi in layout.parts[i]]

    comm.Barrier()
    for _ in range(steps):
        starts.append(pc.now())
        for t, reads in layout.layers:
            for k in reads:
                for r in inflight.pop(layout.bucket_of[k], ()):
                    r.wait(timeout=600)
            time.sleep(t)
        for j in reversed(range(len(layout.layers))):
            time.sleep(2 * layout.layers[j][0])
            for i, after in enumerate(layout.ready_after):
                if after == j:
                    start(i)
    starts.append(pc.now())
    for reqs in inflight.values():
        for r in reqs:
            r.wait(timeout=600)
    if mode == "sync" and not all(np.all(o == comm.size) for o in outs):
        raise AssertionError("an allreduce returned a wrong sum")
    for cs in solo or []:
        for c in cs:
            c.flush()
            c.close()
    return starts


def run(args, comm=MPI.COMM_WORLD):
    if comm.size < 2:
        if comm.rank == 0:
            print("tictac-allreduce needs at least 2 ranks", file=sys.stderr)
        return []
    graph = None
    if comm.rank == 0:
        module, example = load_model(args.model, args.batch, args.image)
        graph = trace(module, example, group="tensor")
    graph = scale_compute(comm.bcast(graph, root=0), args.compute)
    layout = Layout(graph, parse_size(args.payload), parse_size(args.bucket),
                    parse_size(args.partition))
    C = 3 * args.compute
    wire = 2 * (comm.size - 1) / comm.size * layout.nbytes
    rows = []
    pc.set_send_cap(1)
    try:
        for rho in progress([float(x) for x in args.rhos.split(",")], comm,
                            "tictac-allreduce"):
            rate = wire / (rho * C)
            pc.network.enable({"default": {"out_rate": rate, "in_rate": rate,
                                           "latency": args.latency}})
            c = MPI.COMM_WORLD.Dup()
            got = {}
            for method in METHODS:
                starts = emulate(layout, method, args.mode,
                                 args.warmup + args.steps, c)
                step = float(np.mean(np.diff(starts)[args.warmup:]))
                got[method] = comm.allreduce(step, op=MPI.MAX)
            c.Free()
            pc.network.disable()
            for method in METHODS:
                rows.append({"model": args.model, "mode": args.mode,
                             "rho": rho, "method": method,
                             "ranks": comm.size, "bytes": layout.nbytes,
                             "buckets": len(layout.buckets),
                             "parts": sum(map(len, layout.parts)),
                             "step_ms": 1e3 * got[method],
                             "gain_%": 100 * (got["fifo"] / got[method] - 1)})
    finally:
        pc.set_send_cap(0)
    emit(rows, ["model", "mode", "rho", "method", "ranks", "bytes",
                "buckets", "parts", "step_ms", "gain_%"], args,
         f"TicTac priorities for allreduce: {comm.size} ranks, "
         f"{args.payload}B per step in {args.bucket}B buckets", comm,
         legend=[f"parts of {args.partition}B; forward {args.compute} s and "
                 f"backward twice that (sleeps); host CPU",
                 "step_ms: the slowest rank's mean step time"])
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "tictac-allreduce", argv)
