"""Train a PyTorch model on a parameter server whose updates MLfabric
schedules (network-aware order, in-network aggregation, a delay bound), on
emulated links that change every few seconds, and compare it with a plain
asynchronous parameter server on the same links.

    mpiexec -n 6 python examples/mlfabric_torch.py --duration 20

Rank 0 is the server (and MLfabric's scheduler); the other ranks are
workers.  Every worker's two NICs (out and in) are redrawn every ``--every``
seconds from {1, 2.5, 3.3, 5, 10} x ``--base-rate`` with the paper's N2
probabilities (0, .1, .1, .1, .7); the server's stay at the top rate (the
paper's dedicated server machine).  A worker computes a real gradient of
the model on its own batch, then waits ``--compute-ms`` (four times as
long one step in ten: a straggler), as a GPU step would take.  The data
are generated: a random teacher labels random points.

Each mode in ``--modes`` trains from the same initial weights for
``--duration`` seconds; rank 0 prints the loss it reached, the updates
applied and dropped, the largest delay (never above tau_max in mode
"mlfabric"), the scheduler's time per batch and the bytes through the
server's links.  At the end the server's model is in ``net`` on every
rank.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import partialcoll as pc
from partialcoll.torch.mlfabric import train_torch

MODES = ("mlfabric", "async", "mlfabric-s")


def parse_args(workers):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="mlfabric,async",
                   help="comma-separated, of " + ", ".join(MODES)
                        + " (default mlfabric,async)")
    p.add_argument("--duration", type=float, default=20.0,
                   help="seconds of training per mode")
    p.add_argument("--tau-max", type=int, default=2 * max(workers, 1),
                   help="MLfabric's delay bound (default 2 x workers)")
    p.add_argument("--aggregators", type=int, default=min(2, workers),
                   help="MLfabric's aggregators per batch (default 2)")
    p.add_argument("--base-rate", type=float, default=1e6,
                   help="bytes/s; NICs run at 1..10x this (default 1e6)")
    p.add_argument("--every", type=float, default=2.0,
                   help="seconds between link redraws")
    p.add_argument("--compute-ms", type=float, default=50.0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes takes {', '.join(MODES)}; got {bad or 'none'}")
    if workers < 1:
        p.error("run with at least 2 ranks: the server and a worker")
    for name in ("duration", "base_rate", "every"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.compute_ms < 0:
        p.error("--compute-ms must be >= 0")
    return args


def network(args, size):
    """The emulated links (see partialcoll.network): workers' NICs follow
    an N2 trace, the server's keep the top rate."""
    top = 10 * args.base_rate
    net = {"seed": args.seed, "default": {"out_rate": args.base_rate,
                                          "in_rate": args.base_rate,
                                          "latency": "0.5 ms"},
           "rank": {"0": {"out_rate": top, "in_rate": top}}}
    if size > 1:
        net["trace"] = [{"ranks": list(range(1, size)), "nic": "both",
                         "every": args.every,
                         "factors": [1, 2.5, 3.3, 5, 10],
                         "probabilities": [0, 0.1, 0.1, 0.1, 0.7]}]
    return net


def make_data(seed, features=64, classes=10, batch=32):
    """``data(worker, step)``: a batch of that worker's stream (the same
    teacher everywhere), and a held-out set for the server's loss."""
    teacher = torch.Generator().manual_seed(seed)
    w_true = torch.randn(features, classes, generator=teacher)

    def sample(gen, n):
        x = torch.randn(n, features, generator=gen)
        return x, (x @ w_true).argmax(dim=1)

    def data(worker, step):
        return sample(torch.Generator().manual_seed(
            (seed * 1_000_003 + worker) * 1_000_003 + step), batch)

    return data, sample(torch.Generator().manual_seed(seed + 1), 1024)


def report(mode, res, tau_max):
    _, _, first = res.losses[0]
    t, applied, last = res.losses[-1]
    server_in = sum(b for (src, dst), b in res.bytes.items() if dst == 0)
    server_out = sum(b for (src, dst), b in res.bytes.items() if src == 0)
    dropped = sum(res.drops.values())
    print(f"{mode}: loss {first:.3f} -> {last:.3f} in {t:.1f} s, "
          f"{applied} updates applied, {dropped} dropped"
          + (f" {dict(res.drops)}" if dropped else ""))
    line = f"  largest delay {max(res.delays, default=0)}"
    if mode == "mlfabric":
        line += f" (tau_max {tau_max})"
    if res.scheduler["batches"]:            # async PS has no scheduler
        line += (f"; scheduler {1e3 * res.scheduler['cpu_mean']:.2f} ms "
                 f"per batch over {res.scheduler['batches']} batches")
    print(line)
    # the run's own checks: nothing applied late or twice, no dropped
    # update sent, every notified update applied or dropped
    broken = {k: v for k, v in res.invariants.items()
              if k != "max_delay" and v}
    print(f"  server link: {server_in / 1e6:.1f} MB in, "
          f"{server_out / 1e6:.1f} MB out; run checks: "
          f"{broken or 'all clean'}")


def main():
    comm = MPI.COMM_WORLD
    args = parse_args(comm.size - 1)
    torch.set_num_threads(1)        # several ranks share a machine's cores
    torch.manual_seed(args.seed)    # the same initial weights everywhere
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                              torch.nn.Linear(256, 10))
    start = {k: v.clone() for k, v in net.state_dict().items()}
    data, held_out = make_data(args.seed)
    nbytes = 8 * sum(p.numel() for p in net.parameters())
    if comm.rank == 0:
        print(f"{comm.size - 1} workers, {nbytes / 1e3:.0f} KB updates, "
              f"links {args.base_rate / 1e6:g}-{10 * args.base_rate / 1e6:g}"
              f" MB/s, {args.duration:g} s per mode", flush=True)
    results = {}
    pc.network.enable(network(args, comm.size))
    try:
        for mode in args.modes:
            net.load_state_dict(start)
            opt = torch.optim.SGD(net.parameters(), lr=args.lr,
                                  momentum=args.momentum)
            extra = {"tau_max": args.tau_max} if mode == "mlfabric" else {}
            res = train_torch(
                net, F.cross_entropy, data, opt, mode=mode,
                eval_data=held_out, aggregators=args.aggregators,
                compute_time=args.compute_ms / 1e3, stragglers=(0.1, 4.0),
                duration=args.duration, seed=args.seed, **extra)
            results[mode] = res
            if comm.rank == 0:
                report(mode, res, args.tau_max)
    finally:
        pc.network.disable()
    if comm.rank == 0 and len(results) > 1:
        # one target every mode reached: the highest of their lowest losses
        target = max(min(loss for _, _, loss in r.losses)
                     for r in results.values())
        times = {m: next(t for t, _, loss in r.losses if loss <= target)
                 for m, r in results.items()}
        print(f"time to loss {target:.3f}: " + ", ".join(
            f"{m} {t:.1f} s" for m, t in times.items()))
    # every rank holds the server's last model of the last mode
    with torch.no_grad():
        mine = torch.nn.utils.parameters_to_vector(net.parameters()).numpy()
    agree = comm.allreduce(np.array_equal(comm.bcast(mine, root=0), mine),
                           op=MPI.LAND)
    if comm.rank == 0:
        print(f"every rank holds the server's model: {agree}")


if __name__ == "__main__":
    main()
