"""Data-parallel PyTorch training with partialcoll, in the shape of Horovod's
PyTorch example: the same start on every rank (broadcast), an optimizer
wrapper that averages the gradients (here eager-SGD's, which tolerates a
slow rank), checkpoint and resume, and at the end the straggler report.

    mpiexec -n 4 python examples/horovod_style_torch.py --steps 200

    # 100 steps, saved to ckpt.pt; the same again resumes from it
    mpiexec -n 4 python examples/horovod_style_torch.py --checkpoint ckpt.pt
    mpiexec -n 4 python examples/horovod_style_torch.py --checkpoint ckpt.pt

The data are scikit-learn's digits (8x8 images of 0..9) when scikit-learn is
installed, else generated data of the same shape.  The last rank sleeps
``--straggler-ms`` before every step, so the report has someone to name.
The Horovod call each line replaces is in the comments.
"""
import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import partialcoll.torch as pct


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100,
                   help="training steps in this run (default 100)")
    p.add_argument("--mode", default="solo",
                   help="gradient averaging: sync (Horovod's synchronous "
                        "allreduce), solo, majority, or an integer quorum "
                        "(default solo)")
    p.add_argument("--checkpoint", default=None,
                   help="resume from this file if it exists; save to it at "
                        "the end (rank 0 reads and writes it)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05,
                   help="learning rate per rank (scaled by the ranks)")
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--straggler-ms", type=float, default=5.0,
                   help="the last rank sleeps this long before every step")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.mode not in ("sync", "solo", "majority"):
        try:
            args.mode = int(args.mode)      # a quorum: k ranks per round
        except ValueError:
            p.error(f"--mode must be sync, solo, majority or an integer, "
                    f"not {args.mode!r}")
    return args


def load_data(seed):
    """(X_train, y_train, X_test, y_test) as tensors: 64 features, 10
    classes.  scikit-learn's digits if installed, else generated."""
    try:
        from sklearn.datasets import load_digits
        digits = load_digits()
        X, y = digits.data / 16.0, digits.target
    except ImportError:
        # ten noisy prototypes in 64 dimensions: learnable, like the digits
        rng = np.random.default_rng(seed)
        prototypes = rng.random((10, 64))
        y = rng.integers(0, 10, 1797)
        X = prototypes[y] + 0.3 * rng.standard_normal((len(y), 64))
    order = np.random.default_rng(seed).permutation(len(y))  # same everywhere
    X = torch.tensor(X[order], dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.int64)
    cut = len(y) * 4 // 5
    return X[:cut], y[:cut], X[cut:], y[cut:]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    args = parse_args()
    # hvd.init(): nothing to call; mpi4py initialised MPI on import.
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size        # hvd.rank(), hvd.size()
    # several ranks share a machine's cores: one thread each
    torch.set_num_threads(1)
    torch.manual_seed(args.seed + rank)       # different on purpose: the
    #                                           broadcast below fixes it

    X_train, y_train, X_test, y_test = load_data(args.seed)
    # each rank trains on its own shard (Horovod: DistributedSampler)
    X_mine, y_mine = X_train[rank::size], y_train[rank::size]

    model = Net()
    # Horovod scales the learning rate by the number of ranks, since the
    # averaged gradient of P batches is that of a P times larger batch
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size,
                                momentum=args.momentum)
    # hvd.DistributedOptimizer(optimizer, named_parameters=...): step()
    # averages the gradients over the ranks, then steps.  In a partial mode
    # a round does not wait for a slow rank; its gradients are carried into
    # a later round, never dropped.  Still an instance of torch.optim.SGD.
    optimizer = pct.EagerOptimizer(optimizer, model.named_parameters(),
                                   mode=args.mode)

    # Resume: rank 0 alone reads the checkpoint (the others may not even
    # see the file), then everyone gets rank 0's weights, momentum buffers
    # and step counter.
    start = 0
    resumed = None
    if rank == 0 and args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, resumed = state["step"], args.checkpoint
    start = pct.broadcast_object(start, root_rank=0)   # hvd.broadcast_object
    # hvd.broadcast_parameters / hvd.broadcast_optimizer_state: the same
    # start everywhere (also without a checkpoint: the seeds differed)
    pct.broadcast_parameters(model.state_dict(), root_rank=0)
    pct.broadcast_optimizer_state(optimizer, root_rank=0)
    if rank == 0 and resumed:
        print(f"resumed from {resumed} at step {start}", flush=True)

    batches = torch.Generator().manual_seed(args.seed * 1000 + rank)
    model.train()
    for step in range(start, start + args.steps):
        if rank == size - 1 and size > 1:
            time.sleep(args.straggler_ms / 1000)     # a straggler
        idx = torch.randint(len(y_mine), (args.batch_size,),
                            generator=batches)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X_mine[idx]), y_mine[idx])
        loss.backward()
        optimizer.step()        # averaged over the ranks, then applied
        if rank == 0 and (step + 1) % args.log_every == 0:
            info = optimizer.last_step   # active: ranks whose fresh
            #                              gradients made this step's round
            print(f"step {step + 1}: loss {loss.item():.4f}, "
                  f"active {info.active}/{size}", flush=True)

    # Collective: every gradient still in flight is averaged and applied on
    # every rank.  Call it before any other collective (the evaluation's
    # allreduce below, the broadcasts): a rank inside a majority or quorum
    # step may still be waiting for the others.
    optimizer.flush()
    report = optimizer.stats()       # before close(): it frees the rounds

    # Evaluate: each rank scores a slice of the test set; the accuracy is
    # averaged over the ranks (Horovod's metric_average with hvd.allreduce).
    model.eval()
    with torch.no_grad():
        Xt, yt = X_test[rank::size], y_test[rank::size]
        correct = (model(Xt).argmax(1) == yt).sum().float()
    correct = pct.allreduce(correct, op="sum")
    count = pct.allreduce(torch.tensor(float(len(yt))), op="sum")
    accuracy = (correct / count).item()

    # Save on rank 0 only (after flush(): its replica has every gradient).
    end = start + args.steps
    if rank == 0 and args.checkpoint:
        torch.save({"model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "step": end},
                   args.checkpoint)
        print(f"saved checkpoint {args.checkpoint} at step {end}", flush=True)

    if rank == 0:
        print(f"test accuracy after step {end}: {accuracy:.3f}")
        # The straggler report (Horovod's stall inspector): per rank, the
        # share of rounds its gradients missed, and the rounds since its
        # last fresh gradient, on average.  Synchronous modes wait for
        # everyone, so there is nobody to report.
        print(f"mode {args.mode}: {report['steps']} steps, "
              f"{report['mean_active']:.2f} of {size} ranks fresh per "
              f"round on average")
        if "late_share" in report:
            late = ", ".join(f"{s:.2f}" for s in report["late_share"])
            lag = ", ".join(f"{g:.2f}" for g in report["mean_lag"])
            print(f"straggler report: slowest rank {report['slowest']}; "
                  f"late share per rank [{late}]; mean lag [{lag}]",
                  flush=True)
    optimizer.close()        # collective: frees the communication


if __name__ == "__main__":
    main()
