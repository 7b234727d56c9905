"""eager-SGD on a small CNN against DDP over gloo: steps per second, the
final loss, and whether the replicas agree after ``flush()``.

Every rank trains the same small CNN (two 3x3 convolutions of 16 and 32
channels, ReLU, a linear layer; 10 classes) on its own shard of
scikit-learn's 8x8 digits (bundled with scikit-learn: nothing is
downloaded), plain SGD (``--lr``, no momentum), ``--batch`` images a step,
from the same start (the same seed on every rank) and on the same batches
in every variant:

* each of ``--modes`` with :class:`partialcoll.torch.EagerOptimizer`
  (``sync``, ``solo``, ``majority`` or a quorum k), then ``flush()``;
* ``torch.nn.parallel.DistributedDataParallel`` over gloo (``ddp``).

``--device cuda`` (the default where torch sees a GPU) puts the model and
the batches on the GPU (rank r on GPU r mod the count: ranks share a GPU
when there are fewer GPUs than ranks, which wants MPS); ``--device cpu``
keeps them on the host.

Reported per variant: steps per second (the slowest rank's, timed after
``--warmup`` steps, the device synchronized at both ends), that over DDP's,
the mean training loss of the last 10 steps (rank 0's batches), and
``max_diff``: the largest difference, over every parameter and rank, from
rank 0's model at the end.  With plain SGD every rank applies the same
averaged rounds, only possibly at different steps, so the replicas agree
up to the rounding of summing the same updates in another order: 0 in
``sync`` and ``ddp``, about float32's epsilon times the step count in the
partial modes.  The run fails if it exceeds ``--tolerance``.

Run: ``mpiexec -n 2 partialcoll-bench cnn``.
"""
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from ._common import add_warmup, cli, emit, real, whole, writable
from ._train import check_modes

#: the partial modes' bound on max_diff, relative to the parameters' size
DEFAULT_TOLERANCE = 1e-5


def add_args(p):
    p.add_argument("--modes", default="sync,solo",
                   help="eager-SGD modes to run, comma-separated: sync, "
                        "sync-mpi, solo, majority or a quorum k (default "
                        "sync,solo); DDP over gloo runs after them")
    p.add_argument("--steps", type=whole(1), default=300,
                   help="timed steps per variant (default 300)")
    add_warmup(p, 10, "untimed steps first (default 10)")
    p.add_argument("--batch", type=whole(1), default=32,
                   help="images per rank per step (default 32)")
    p.add_argument("--lr", type=real(0, positive=True), default=0.05,
                   help="SGD's learning rate (default 0.05)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"],
                   default="auto",
                   help="where the model trains (default: cuda where torch "
                        "sees a GPU, else cpu)")
    p.add_argument("--no-ddp", action="store_true",
                   help="leave DDP over gloo out")
    p.add_argument("--tolerance", type=real(0), default=DEFAULT_TOLERANCE,
                   help="largest max_diff accepted, relative to the largest "
                        f"parameter (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


def _data(comm):
    """This rank's shard of the digits: (images N x 1 x 8 x 8, labels)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    return x[comm.rank::comm.size], y[comm.rank::comm.size]


def _model(torch):
    torch.manual_seed(0)                  # the same start on every rank
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 6 * 6, 10))


def _batches(n, batch, count, rank):
    """The indices of ``count`` batches: the same in every variant."""
    rng = np.random.default_rng(1000 + rank)
    return [rng.integers(0, n, batch) for _ in range(count)]


def _train(torch, variant, args, data, device, comm):
    """Train one variant; returns (steps/s of this rank, the last 10
    losses, the flat parameters on the host)."""
    import partialcoll.torch as pct
    x, y = (torch.from_numpy(a).to(device) for a in data)
    model = _model(torch).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr)
    if variant == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = sgd
    else:
        net = model
        opt = pct.EagerOptimizer(sgd, model.named_parameters(),
                                 mode=variant, comm=comm)
    order = _batches(len(y), args.batch, args.warmup + args.steps, comm.rank)
    losses = []
    sync = (torch.cuda.synchronize if device.type == "cuda"
            else (lambda: None))
    for i, idx in enumerate(order):
        if i == args.warmup:
            if variant != "ddp":
                opt.flush()     # no partial round pending across the barrier
            sync()
            comm.Barrier()
            t0 = time.perf_counter()
        idx = torch.from_numpy(idx).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sync()
    rate = args.steps / (time.perf_counter() - t0)
    if variant != "ddp":
        opt.flush()                      # every pending round applied
        opt.close()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return rate, losses[-10:], flat.cpu().numpy().astype(np.float64)


def _gloo(torch, comm):
    """torch.distributed over gloo on the MPI ranks (rank 0 picks a free
    TCP port on this host and tells the others)."""
    import torch.distributed as dist
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.rank, world_size=comm.size)
    return dist


def run(args, comm=MPI.COMM_WORLD):
    import torch
    modes = check_modes(args.modes, comm.size)
    want = args.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("partialcoll-bench cnn: --device cuda, but "
                             "torch sees no GPU")
        device = torch.device("cuda", comm.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    data = _data(comm)
    variants = modes + ([] if args.no_ddp else ["ddp"])
    dist = None
    rows, bad = [], []
    for v in variants:
        if v == "ddp" and dist is None:
            dist = _gloo(torch, comm)
        rate, losses, flat = _train(torch, v, args, data, device, comm)
        ref = comm.bcast(flat if comm.rank == 0 else None)
        diff = comm.allreduce(float(np.max(np.abs(flat - ref))), op=MPI.MAX)
        scale = float(np.max(np.abs(ref)))
        rows.append({"variant": str(v), "ranks": comm.size, "device": str(device),
                     "steps_per_s": comm.allreduce(rate, op=MPI.MIN),
                     "final_loss": float(np.mean(losses)),
                     "max_diff": diff, "max_param": scale,
                     "steps": args.steps, "batch": args.batch})
        if diff > args.tolerance * scale:
            bad.append(f"{v}: max_diff {diff:.3g} > {args.tolerance:g} x "
                       f"{scale:.3g}")
    if dist is not None:
        dist.destroy_process_group()
    ddp = next((r["steps_per_s"] for r in rows if r["variant"] == "ddp"),
               None)
    for r in rows:
        r["vs_ddp"] = r["steps_per_s"] / ddp if ddp else float("nan")
    emit(rows, ["variant", "device", "steps_per_s", "vs_ddp", "final_loss",
                "max_diff"], args,
         f"CNN on the digits, {comm.size} ranks, {args.steps} steps of "
         f"{args.batch} images per rank, plain SGD (lr {args.lr:g})", comm,
         legend={"vs_ddp": "steps per second over DDP's (gloo)",
                 "max_diff": "largest difference from rank 0's model after "
                             "flush()"})
    if bad:
        raise SystemExit("partialcoll-bench cnn: the replicas disagree: "
                         + "; ".join(bad))
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "cnn", argv)
