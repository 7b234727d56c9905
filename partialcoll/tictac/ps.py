"""A parameter server and its workers on schedules, with TicTac's
enforcement (section 5.1): the PS hands each worker's parameter transfers
to the wire in the planner's order.

Rank ``ps`` (default 0) holds the parameters; every other rank is a worker
that receives all of them each iteration, computes, and (task ``"train"``)
sends a gradient per parameter back.  One persistent schedule per rank;
one round = one iteration::

    worker w                         PS
    trigger (banked: one per iteration)
    send token ------------------->  recv token(w)
                                     gate(w): the PS writes this round's
                                       numbers for w into its order slots
    recv param k  <----------------  send param k to w, order = slot[w][k]
    forward: one DELAY per compute     (counter gate: number j leaves after
      op, in program order, each       j others to w; the emulated
      after its parameters             network's channel carries them one
    [train] backward: DELAYs in        after another, in that order)
      reverse, x backward_factor
    [train] send grad k ----------->  recv grad(w, k); param k += grad once
                                     every worker has param k of this round

Design constraints:

1. The order is enforced at the sender by numbers, not by graph
   dependencies between transfers (which the paper rejects: each transfer
   would wait for the previous one to complete, no pipelining).  Numbers
   are a permutation 0..n-1 per worker and iteration (the counter gate's
   contract), written by the application at the worker's gate, so a
   baseline can draw a fresh random order every iteration without
   rebuilding anything.
2. Compute costs no CPU: DELAY ops in one chain in program order (PyTorch
   runs a forward pass node after node), so many ranks fit on few cores.
3. The data is real and checked: workers must end with the PS's values
   (and, training, the sum of every worker's gradients per iteration).

Use :func:`run` (collective over ``comm``); it returns, on the PS rank,
the merged timeline and the numbers used, for :func:`iterations`.

Why it is not built on the other parameter servers (MLfabric's in
:mod:`partialcoll.mlfabric.runtime`, the load balancer's in
:mod:`partialcoll.loadbalance.allreduce`): what they share is the
executor's Schedule API, which each uses directly.  Here one persistent
schedule per rank is one iteration and the server's loop is the gate
handshake above (wait_gate, write the order, open_gate); MLfabric's
server is an asynchronous loop of control messages and one-shot
schedules per batch; the load balancer has no server loop at all (every
rank is worker and server inside one collective schedule per call).  A
common server loop would fit one of the three and be bent for the other
two.
"""
import logging
import math

import numpy as np
from mpi4py import MPI

from ..core import control
from ..core.checks import check_int
from ..core.schedule import Schedule
from ..transport import timeline as _timeline
from . import metrics
from .planner import COMPUTE
from ..core.errors import ScheduleError

log = logging.getLogger("partialcoll.tictac")

TASKS = ("inference", "train")


class WorkerModel:
    """What one worker does per iteration, from a planner graph: the
    transfers (elements of float64 each) and the compute ops in program
    order (seconds, the transfers each reads).

    ``payload_bytes``: the bytes all transfers add up to (each parameter's
    share of the model's bytes, at least one element): the model's bytes
    scaled, so the emulated link, not memory copies, sets the pace."""

    def __init__(self, graph, payload_bytes, backward_factor=2.0):
        recvs = graph.recvs
        total = sum(r.nbytes for r in recvs) or len(recvs)
        self.names = [r.name for r in recvs]
        self.elements = [max(1, int(round(payload_bytes * (r.nbytes or 1)
                                          / total / 8))) for r in recvs]
        pos = {r.index: k for k, r in enumerate(recvs)}
        self.ops = [(op.time, sorted(pos[d] for d in op.deps if d in pos))
                    for op in graph.ops if op.kind == COMPUTE]
        self.backward_factor = float(backward_factor)

    @property
    def n(self):
        return len(self.names)

    @property
    def nbytes(self):
        return 8 * sum(self.elements)

    def compute_time(self, task):
        """C of one iteration: forward (and backward for training)."""
        fwd = sum(t for t, _ in self.ops)
        return fwd * (1 + self.backward_factor) if task == "train" else fwd

    def grad_after(self):
        """For each transfer, the forward op whose backward completes its
        gradient (its first user; None: unused, sent at the end)."""
        first = [None] * self.n
        for j, (_, reads) in enumerate(self.ops):
            for k in reads:
                if first[k] is None:
                    first[k] = j
        return first


def links(rate, workers, latency="0 ms", ps=0):
    """An emulated network description (for :func:`partialcoll.transport.network.enable`)
    where each worker's link runs at ``rate`` (bytes/s or "10 MB/s") both
    ways and the PS's NIC carries all of them at once (``workers`` x
    rate), so workers do not slow each other down."""
    from ..transport.network import rate as _rate
    r = _rate(rate)
    return {"default": {"out_rate": r, "in_rate": r, "latency": latency},
            "rank": {str(ps): {"out_rate": r * workers,
                               "in_rate": r * workers}}}


def _worker_schedule(comm, model, task, ps, bufs):
    n = model.n
    s = Schedule(comm, persistent=True)
    trig = s.trigger()
    s.send(s.buffer(bufs["token"], writable=False), ps, tag=2 * n,
           after=[trig])
    recvs = [s.recv(s.buffer(b), ps, tag=k)
             for k, b in enumerate(bufs["param"])]
    prev, fwd = None, []
    for t, reads in model.ops:
        prev = s.delay(t, after=[recvs[k] for k in reads] +
                       ([] if prev is None else [prev]))
        fwd.append(prev)
    if task == "train":
        bwd = [None] * len(model.ops)
        for j in reversed(range(len(model.ops))):
            prev = s.delay(model.backward_factor * model.ops[j][0],
                           after=[] if prev is None else [prev])
            bwd[j] = prev
        grads = [s.buffer(g, writable=False) for g in bufs["grad"]]
        for k, j in enumerate(model.grad_after()):
            after = bwd[j] if j is not None else prev
            s.send(grads[k], ps, tag=n + k,
                   after=[] if after is None else [after])
    return s, trig


def _ps_schedule(comm, model, task, workers, bufs):
    n = model.n
    s = Schedule(comm, persistent=True)
    params = [s.buffer(b) for b in bufs["param"]]
    gates, sends = {}, {}
    for w in workers:
        tok = s.recv(s.buffer(bufs["token"][w]), w, tag=2 * n)
        g = s.gate(after=[tok])
        gates[g] = w
        slot = s.buffer(bufs["order"][w])
        sends[w] = [s.send(params[k], w, tag=k, after=[g],
                           order=slot[k:k + 1]) for k in range(n)]
    if task == "train":
        for k in range(n):
            everyone_has_it = [sends[v][k] for v in workers]
            for w in workers:
                g = s.buffer(bufs["grad"][w][k])
                r = s.recv(g, w, tag=n + k)
                s.reduce(params[k], g, after=[r] + everyone_has_it)
    return s, gates


def _buffers(model, rank, ps, workers, task):
    init = [np.full(e, float(k + 1)) for k, e in enumerate(model.elements)]
    if rank == ps:
        return {"param": init,
                "token": {w: np.zeros(1) for w in workers},
                "order": {w: np.arange(model.n, dtype=np.int64)
                          for w in workers},
                "grad": {w: [np.zeros(e) for e in model.elements]
                         for w in workers}}
    return {"param": [np.zeros(e) for e in model.elements],
            "token": np.zeros(1),
            "grad": [np.full(e, float(rank)) for e in model.elements]}


def run(comm, model, order_for, iterations, task="inference", ps=0,
        timeout=600.0):
    """Run ``iterations`` iterations of the PS and its workers (collective
    over ``comm``; every rank passes the same model and arguments).

    ``iterations``: a whole number >= 1; ``ps``: a rank of ``comm``.

    ``order_for(worker, iteration)``: the numbers (a permutation of
    0..n-1, one per transfer of ``model``) the PS enforces for that
    worker in that iteration; called on the PS rank only, for every
    iteration and worker (in that order) before anything is sent, so a
    wrong one (not a permutation, or raising) makes every rank raise
    ValueError at once.

    Returns, on the PS rank, ``{"timeline": {rank: events}, "orders":
    {(worker, iteration): numbers}}`` (None elsewhere).  Raises
    ``AssertionError`` if a worker did not get the right data."""
    if task not in TASKS:
        raise ScheduleError(f"task must be one of {TASKS}")
    iterations = check_int(iterations, "iterations", 1)
    rank, size = comm.Get_rank(), comm.Get_size()
    ps = check_int(ps, f"ps (a rank of the communicator of size {size})",
                   0, size - 1)
    workers = [r for r in range(size) if r != ps]
    if not workers:
        raise ScheduleError("a parameter server needs at least one worker")
    orders = _orders(comm, model, order_for, iterations, ps, workers)
    bufs = _buffers(model, rank, ps, workers, task)
    if rank == ps:
        s, gates = _ps_schedule(comm, model, task, workers, bufs)
    else:
        s, trig = _worker_schedule(comm, model, task, ps, bufs)
    s.commit()
    _timeline.clear()
    _timeline.enable()
    comm.Barrier()
    s.post()
    if rank == ps:
        for _ in range(iterations * len(workers)):
            op, rnd = s.wait_gate(timeout=timeout)
            bufs["order"][gates[op]][:] = orders[(gates[op], rnd)]
            s.open_gate(op, rnd)
    else:
        for _ in range(iterations):
            s.fire(trig)
    s.wait(round=iterations - 1, timeout=timeout)
    _timeline.disable()
    comm.Barrier()          # every rank done: round `iterations` is idle
    s.free()
    _check(bufs, model, rank, ps, workers, task, iterations)
    events = comm.gather((MPI.COMM_WORLD.Get_rank(), _timeline.raw()), root=ps)
    _timeline.clear()
    if rank != ps:
        return None
    return {"timeline": dict(events), "orders": orders,
            "ps": MPI.COMM_WORLD.Get_rank(), "world_of": _world_ranks(comm)}


def _orders(comm, model, order_for, iterations, ps, workers):
    """Every (worker, iteration)'s numbers, drawn and checked on the PS
    before any message; the verdict is broadcast, so a wrong order makes
    every rank raise instead of workers waiting out the timeout."""
    orders, problem = {}, None
    if comm.Get_rank() == ps:
        try:
            for rnd in range(iterations):
                for w in workers:
                    orders[(w, rnd)] = _numbers(order_for, w, rnd, model.n)
        except Exception as exc:
            problem = str(exc) if isinstance(exc, ValueError) else \
                f"order_for raised {type(exc).__name__}: {exc}"
    problem = comm.bcast(problem, root=ps)
    if problem is not None:
        raise ScheduleError(problem)
    return orders


def _numbers(order_for, w, rnd, n):
    """order_for(w, rnd) as int64 numbers, checked to be a permutation."""
    try:
        numbers = np.array(order_for(w, rnd), dtype=np.int64).reshape(-1)
        ok = sorted(numbers.tolist()) == list(range(n))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ScheduleError(f"order_for({w}, {rnd}) is not a permutation of "
                            f"0..{n - 1}")
    return numbers


def _world_ranks(comm):
    """comm rank -> MPI_COMM_WORLD rank (timelines are by world rank)."""
    return dict(enumerate(control.world_ranks(comm)))


def _check(bufs, model, rank, ps, workers, task, iterations):
    if rank == ps:
        return
    G = float(sum(workers)) if task == "train" else 0.0
    for k, got in enumerate(bufs["param"]):
        want = k + 1 + (iterations - 1) * G
        if not np.all(got == want):
            raise AssertionError(f"worker {rank}: transfer {k} holds "
                                 f"{got[:3]}..., expected {want}")


def iterations(result, model, task, warmup=0):
    """One dict per (worker, iteration) after ``warmup`` iterations, from
    :func:`run`'s result: ``worker``, ``iteration``, ``T`` (first parameter
    on the wire, or first compute, to the last compute, or in training the
    last gradient delivered), ``N`` (time the worker's transfers were on
    the emulated wire, union), ``C`` (time its DELAY ops ran), ``rho``,
    ``alpha``, ``U``, ``start``/``end`` and ``out_of_order`` (transfers to
    it that left before one with a lower number)."""
    per_rank = result["timeline"]
    world_of, ps = result["world_of"], result["ps"]
    tl = _timeline.Timeline(per_rank)
    n = model.n
    params, grads = {}, {}
    for x in tl.transfers():
        if x["src"] == ps and x["tag"] < n:
            params.setdefault((x["dst"], x["round"]), []).append(x)
        elif x["dst"] == ps and n <= x["tag"] < 2 * n:
            grads.setdefault((x["src"], x["round"]), []).append(x)
    compute = _compute_spans(per_rank)
    rows = []
    for (w_comm, rnd), numbers in sorted(result["orders"].items()):
        w = world_of[w_comm]
        if rnd < warmup or (w, rnd) not in params:
            continue
        xs, gs = params[(w, rnd)], grads.get((w, rnd), [])
        spans = compute.get((w, rnd), [])
        start = min([x["released"] for x in xs] + [a for a, _ in spans])
        end = max([b for _, b in spans] +
                  ([x["delivered"] for x in gs] if task == "train" else []))
        N = metrics.busy([(x["wire_start"], x["wire_end"]) for x in xs + gs])
        C = sum(b - a for a, b in spans)
        T = end - start
        alpha = metrics.overlap(N, C, T)
        rho = N / C if C > 0 else math.nan
        bad = metrics.out_of_order([x["released"] for x in xs],
                                   [int(numbers[x["tag"]]) for x in xs])
        rows.append({"worker": w, "iteration": rnd, "start": start,
                     "end": end, "T": T, "N": N, "C": C, "rho": rho,
                     "alpha": alpha, "U": metrics.utilisation(rho, alpha)
                     if not math.isnan(alpha) else math.nan,
                     "transfers": len(xs), "out_of_order": bad})
    return rows


def _compute_spans(per_rank):
    """{(rank, round): [(start, complete)]} of every DELAY op."""
    ev_code = {v: k for k, v in _timeline.EVENT_NAMES.items()}
    delay = list(_timeline.KIND_NAMES).index("delay")
    start_ev, done_ev = ev_code["start"], ev_code["complete"]
    out = {}
    for rank, ev in per_rank.items():
        ev = ev[ev["kind"] == delay]
        starts = {}
        for e in ev:
            key = (int(e["sched"]), int(e["op"]), int(e["round"]))
            if e["ev"] == start_ev:
                starts[key] = float(e["t"])
            elif e["ev"] == done_ev and key in starts:
                out.setdefault((rank, key[2]), []).append(
                    (starts.pop(key), float(e["t"])))
    return out
