"""Overlap of communication with backward: the step time of
``partialcoll.torch.EagerOptimizer`` with ``overlap=True`` (each bucket's
reduction starts from the post-accumulate-grad hooks, during backward)
against ``overlap=False`` (every reduction starts in ``step()``), in the
same run.

Every rank trains two copies of one MLP with large layers (``--width``,
``--layers``; float32) from the same start on the same batches, one
wrapped each way, same mode, same buckets (``--bucket``: with DDP's 25 MiB
default this model would be one bucket, and one bucket cannot overlap).
Blocks of ``--block`` steps alternate between the two (A B B A A B ...), so
both see the same machine.  A step is ``zero_grad``, forward, backward,
``step()``, timed on each rank.

The link: by default the emulated network (the emulated networks guide)
with its rate set so that one step's reduction, alone, takes ``--rho``
times backward (measured first, without communication, apart from the
forward pass: the regime where overlap matters, communication about as
long as backward;
communication can only hide behind backward, not forward).  The
rate is calibrated: the reduction of the model's buckets (sync, no
compute) is timed at two rates r and 2r, fitted as a + b / rate (a: what
does not depend on the link: copies, sums, the progress thread), and the
rate set to b / (rho x backward - a) (``--quick``: not calibrated, the
ring's bytes over rho x backward).  ``--rate`` sets it by hand
("200 MB/s"), ``--rate off`` keeps the local link as it is (usually far
too fast to show anything).  The ``comm_ms`` column is that reduction
alone at the rate used.

Reported per mode: the median step time of each variant (per rank, then
the slowest rank's), its forward + backward and ``step()`` parts, and
overlap / plain (our target: at most 0.8 in sync and solo when the
communication takes about as long as backward).  In sync mode the two
copies must end bit for bit equal (checked).

Run: ``mpiexec -n 2 partialcoll-bench overlap`` (``--quick``: a few
seconds, a small model, for a smoke test).
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

from ._common import (add_warmup, byte_size, cli, emit, parse_size,
                      progress, real, whole, writable)

VARIANTS = ("overlap", "plain")


#: option -> (default, --quick's default); an option given wins
SIZES = {"width": (1024, 256), "layers": (6, 3), "batch": (512, 16),
         "bucket": ("4M", "64K"), "steps": (40, 4), "block": (5, 2),
         "warmup": (3, 1)}


def add_args(p):
    p.add_argument("--modes", default="sync,solo",
                   help="comma-separated (default sync,solo; majority and "
                        "quorum overlap only from their last gradient)")
    p.add_argument("--width", type=whole(1),
                   help="units per hidden layer (default 1024: 4 MiB of "
                        "float32 weights per layer)")
    p.add_argument("--layers", type=whole(1), help="hidden layers (default 6)")
    p.add_argument("--batch", type=whole(1),
                   help="per rank (default 512: at 64 this MLP computes so "
                        "little per gradient byte that the host-side work "
                        "of communication, not the link, limits overlap on "
                        "a small machine; docs/results.md has both)")
    p.add_argument("--bucket", type=byte_size,
                   help="bucket_bytes of both variants (default 4M)")
    p.add_argument("--steps", type=whole(1),
                   help="timed steps per variant and mode (default 40)")
    p.add_argument("--block", type=whole(1),
                   help="steps per block; blocks alternate (default 5)")
    add_warmup(p, None, "untimed steps per variant first (default 3)")
    p.add_argument("--rho", type=real(0, True), default=1.0,
                   help="communication time / backward time (alone, without "
                        "forward) the emulated link is calibrated for "
                        "(default 1)")
    p.add_argument("--rate", default="auto",
                   help="'auto' (from --rho), a rate such as '200 MB/s', "
                        "or 'off' (no emulated network)")
    p.add_argument("--latency", default="0.1 ms")
    p.add_argument("--threads", type=whole(1), default=1,
                   help="torch threads per rank (default 1)")
    p.add_argument("--quick", action="store_true",
                   help="a few seconds, for a smoke test: defaults of width "
                        "256, 3 layers, batch 16, 64K buckets, 4 steps, "
                        "blocks of 2, 1 warm-up step")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


def _defaults(args):
    for k, (full, quick) in SIZES.items():
        if getattr(args, k) is None:
            setattr(args, k, quick if args.quick else full)
    return args


def make_model(torch, width, layers, seed=0):
    torch.manual_seed(seed)
    mods = [torch.nn.Linear(width, width) for _ in range(layers)]
    body = []
    for m in mods:
        body += [m, torch.nn.Tanh()]
    return torch.nn.Sequential(*body, torch.nn.Linear(width, 1))


class Data:
    """The same batches for both copies: step s of rank r."""

    def __init__(self, torch, width, batch, rank):
        self.torch, self.width, self.batch, self.rank = torch, width, batch, \
            rank

    def __call__(self, step):
        g = self.torch.Generator().manual_seed(7919 * step + self.rank)
        x = self.torch.randn(self.batch, self.width, generator=g)
        return x, self.torch.randn(self.batch, 1, generator=g)


def compute_times(torch, model, data, steps):
    """Median seconds of forward and of backward, no communication."""
    fwd, bwd = [], []
    for s in range(steps):
        x, y = data(s)
        model.zero_grad()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    return float(np.median(fwd)), float(np.median(bwd))


def comm_time(model, bucket, comm, rate, latency, reps):
    """Median seconds of one sync reduction of ``model``'s gradients in
    its buckets, alone, on the emulated link at ``rate`` (None: as it
    is)."""
    from ..eager import EagerAverager
    if rate is not None:
        pc.network.enable({"default": {"out_rate": rate, "in_rate": rate,
                                       "latency": latency}})
    c = comm.Dup()      # a communicator per network (as tictac-allreduce)
    try:
        shapes = [tuple(p.shape) for p in model.parameters()]
        avg = EagerAverager([(s, np.float32) for s in shapes], "sync",
                            comm=c, bucket_bytes=bucket,
                            order=list(reversed(range(len(shapes)))))
        zeros = [np.zeros(s, np.float32) for s in shapes]
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            avg.reduce(zeros)
            times.append(time.perf_counter() - t0)
        avg.close()
    finally:
        c.Free()
        if rate is not None:
            pc.network.disable()
    return comm.allreduce(float(np.median(times)), op=MPI.MAX)


def naive_rate(comm, nbytes, target):
    """The rate at which a ring's traffic per NIC, 2 (P - 1) / P x the
    gradient bytes, takes ``target`` seconds."""
    return 2 * (comm.size - 1) / comm.size * nbytes / target


def calibrate(model, bucket, comm, target, nbytes, latency, reps):
    """A rate (bytes/s) at which the reduction alone takes ``target``
    seconds: timed at r and 2r, fitted as a + b / rate.  Where the fit
    says nothing (noise, or a fixed cost a of about target or more) it
    says so on stderr and returns the naive rate r."""
    r = naive_rate(comm, nbytes, target)
    t1 = comm_time(model, bucket, comm, r, latency, reps)
    t2 = comm_time(model, bucket, comm, 2 * r, latency, reps)
    b = 2 * r * (t1 - t2)                   # t1 - t2 = b / (2r)
    a = t1 - b / r
    if b <= 0 or a < 0 or target - a < 0.2 * target:
        if comm.rank == 0:
            print(f"overlap: calibration says nothing ({1e3 * t1:.1f} ms at "
                  f"{r / 1e6:.0f} MB/s, {1e3 * t2:.1f} ms at twice that): "
                  f"the link is set to {r / 1e6:.0f} MB/s", file=sys.stderr)
        return r
    return b / (target - a)


def one_step(torch, model, opt, batch):
    x, y = batch
    t0 = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    t1 = time.perf_counter()
    opt.step()
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1


def run_mode(torch, pct, mode, args, data, comm):
    """Both variants of one mode, alternating; returns {variant: [(step,
    fwd+bwd, step()) seconds]}."""
    models, opts = {}, {}
    bucketed = mode in ("solo", "sync")
    for v in VARIANTS:
        m = models[v] = make_model(torch, args.width, args.layers)
        opts[v] = pct.EagerOptimizer(
            torch.optim.SGD(m.parameters(), lr=1e-3), m.named_parameters(),
            mode=mode, comm=comm, overlap=v == "overlap",
            bucket_bytes=parse_size(args.bucket) if bucketed else None)
    if not opts["overlap"].overlap:
        raise SystemExit("overlap benchmark: overlap is unavailable here "
                         "(torch < 2.1?)")
    times = {v: [] for v in VARIANTS}
    step = {v: 0 for v in VARIANTS}
    for v in VARIANTS:                       # warm-up, untimed
        for _ in range(args.warmup):
            one_step(torch, models[v], opts[v], data(step[v]))
            step[v] += 1
    blocks = -(-args.steps // args.block)
    for b in range(blocks):
        order = VARIANTS if b % 2 == 0 else VARIANTS[::-1]
        for v in order:
            comm.Barrier()
            for _ in range(min(args.block, args.steps - len(times[v]))):
                times[v].append(one_step(torch, models[v], opts[v],
                                         data(step[v])))
                step[v] += 1
    info = {v: opts[v].stats() for v in VARIANTS}
    for v in VARIANTS:
        opts[v].close()
    if mode == "sync":
        a, b = (torch.cat([p.detach().reshape(-1) for p in
                           models[v].parameters()]) for v in VARIANTS)
        if not torch.equal(a, b):
            raise AssertionError("sync: the overlapped copy's parameters "
                                 "differ from the plain copy's")
    return times, info, opts["plain"].averager.bucket_count


def run(args, comm=MPI.COMM_WORLD):
    import torch
    import partialcoll.torch as pct
    args = _defaults(args)
    torch.set_num_threads(args.threads)
    if comm.size < 2:
        if comm.rank == 0:
            print("overlap needs at least 2 ranks", file=sys.stderr)
        return []
    modes = [m if not m.isdigit() else int(m) for m in args.modes.split(",")]
    data = Data(torch, args.width, args.batch, comm.rank)
    probe = make_model(torch, args.width, args.layers)
    nbytes = 4 * sum(p.numel() for p in probe.parameters())
    times = np.array(compute_times(torch, probe, data,
                                   3 if args.quick else 10))
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    fwd, bwd = times
    reps = 2 if args.quick else 5
    rate = None
    if args.rate == "auto" and args.quick:
        rate = naive_rate(comm, nbytes, args.rho * bwd)
    elif args.rate == "auto":
        rate = calibrate(probe, parse_size(args.bucket), comm,
                         args.rho * bwd, nbytes, args.latency, reps)
    elif args.rate != "off":
        rate = args.rate
    comm_s = comm_time(probe, parse_size(args.bucket), comm, rate,
                       args.latency, reps)
    del probe
    if rate is not None:
        pc.network.enable({"default": {"out_rate": rate, "in_rate": rate,
                                       "latency": args.latency}})
    rows = []
    try:
        c = comm.Dup()
        for mode in progress(modes, comm, "overlap"):
            times, info, buckets = run_mode(torch, pct, mode, args, data, c)
            med = {v: np.median(np.array(times[v]), axis=0) for v in VARIANTS}
            for v in VARIANTS:              # the slowest rank's medians
                comm.Allreduce(MPI.IN_PLACE, med[v], op=MPI.MAX)
            for v in VARIANTS:
                rows.append({
                    "mode": mode, "variant": v, "ranks": comm.size,
                    "MiB": nbytes / 2**20, "buckets": buckets,
                    "forward_ms": 1e3 * fwd, "backward_ms": 1e3 * bwd,
                    "comm_ms": 1e3 * comm_s,
                    "step_ms": 1e3 * med[v][0],
                    "fwd_bwd_ms": 1e3 * med[v][1],
                    "step()_ms": 1e3 * med[v][2],
                    "early": info[v]["started_early"],
                    "ratio": med[v][0] / med["plain"][0]})
        c.Free()
    finally:
        if rate is not None:
            pc.network.disable()
    link = ("local link" if rate is None else
            f"emulated link {rate if isinstance(rate, str) else f'{rate / 1e6:.1f} MB/s'}"
            f", latency {args.latency}")
    emit(rows, ["mode", "variant", "ranks", "MiB", "buckets", "forward_ms",
                "backward_ms", "comm_ms", "step_ms", "fwd_bwd_ms", "step()_ms",
                "early", "ratio"], args,
         f"overlap with backward: {comm.size} ranks, MLP {args.layers} x "
         f"{args.width} (float32), batch {args.batch} per rank", comm,
         legend=[f"buckets {args.bucket}B; {link} (auto: communication = "
                 f"{args.rho} x backward)",
                 f"median of {args.steps} steps per variant, in alternating "
                 f"blocks of {args.block}",
                 "ratio: step time / plain's (target <= 0.8)"])
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "overlap", argv)
