"""PyTorch DistributedDataParallel with partialcoll's eager-SGD
communication hook: keep DDP and your optimizer as they are, and let the
gradient averaging go through a partial allreduce over MPI, so one slow
rank no longer holds up every step.

    mpiexec -n 4 python -m mpi4py examples/ddp_hook.py --steps 200 --mode solo

DDP needs a torch.distributed process group; here it is gloo over TCP,
set up from the MPI ranks by ``pct.init_process_group`` (rank 0 picks the
address and a free port and sends them over MPI), so mpiexec is the only
launcher.  The
gradients themselves do not travel through gloo: the hook hands them to
partialcoll.  The data are generated (a random teacher labels random
points); the last rank sleeps ``--straggler-ms`` before every step.
"""
import argparse
import inspect
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

import partialcoll.torch as pct


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--mode", default="solo",
                   help="sync, solo, majority or an integer quorum "
                        "(default solo)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--straggler-ms", type=float, default=5.0,
                   help="the last rank sleeps this long before every step")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode not in ("sync", "solo", "majority"):
        try:
            args.mode = int(args.mode)
        except ValueError:
            p.error(f"--mode must be sync, solo, majority or an integer, "
                    f"not {args.mode!r}")
    return args


def no_buffer_sync():
    """DDP's keyword that turns off the buffer broadcast before every
    forward pass, in this torch's spelling."""
    ddp_args = inspect.signature(
        torch.nn.parallel.DistributedDataParallel).parameters
    if "forward_sync_buffers" in ddp_args:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 64)
        self.bn = torch.nn.BatchNorm1d(64)     # has buffers: see below
        self.fc2 = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def main():
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    torch.set_num_threads(1)        # several ranks share a machine's cores
    pct.init_process_group("gloo")   # torch.distributed from the MPI ranks

    torch.manual_seed(args.seed)    # the same teacher on every rank ...
    teacher = torch.randn(20, 4)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank)  # ... and
    #                                            different batches per rank
    model = Net()                   # DDP broadcasts rank 0's weights once

    # No buffer broadcast at every forward pass: by default DDP broadcasts
    # rank 0's buffers (BatchNorm's running statistics) before each one, a
    # synchronous collective that ties every rank to the slowest one again
    # and undoes the straggler tolerance.  Buffers are averaged at the end
    # instead (synchronize_model below).  The option is broadcast_buffers=
    # False, called forward_sync_buffers=False in newer torch.
    ddp = torch.nn.parallel.DistributedDataParallel(model, **no_buffer_sync())
    # The hook: DDP hands it each gradient bucket; it averages them over
    # MPI with partialcoll's partial allreduce of the chosen mode.
    hook = pct.EagerHook(ddp, mode=args.mode)
    ddp.register_comm_hook(hook, pct.eager_comm_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    ddp.train()
    for step in range(args.steps):
        if rank == size - 1 and size > 1:
            time.sleep(args.straggler_ms / 1000)     # a straggler
        x = torch.randn(args.batch_size, 20, generator=data)
        y = (x @ teacher).argmax(1)
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()          # DDP calls the hook; .grad is averaged
        optimizer.step()
        if rank == 0 and (step + 1) % args.log_every == 0:
            info = hook.last_step
            print(f"step {step + 1}: loss {loss.item():.4f}, "
                  f"active {info.active}/{size}", flush=True)

    # Collective: the gradients still pending are averaged and applied with
    # one more optimizer.step() on every rank.  Before any other
    # collective: a rank inside a majority or quorum step may be waiting.
    hook.flush(optimizer)
    report = hook.stats()
    # Average the weights and BatchNorm's running statistics over the ranks
    # (collective), so every rank evaluates the same model.
    pct.synchronize_model(model)

    model.eval()
    with torch.no_grad():
        x = torch.randn(1000, 20, generator=torch.Generator().manual_seed(1))
        accuracy = (model(x).argmax(1) == (x @ teacher).argmax(1)).float()
    if rank == 0:
        print(f"accuracy on held-out points: {accuracy.mean().item():.3f}")
        print(f"mode {args.mode}: {report['steps']} steps, "
              f"{report['mean_active']:.2f} of {size} ranks fresh per round")
        if "late_share" in report:       # the straggler report
            late = ", ".join(f"{s:.2f}" for s in report["late_share"])
            print(f"straggler report: slowest rank {report['slowest']}; "
                  f"late share per rank [{late}]", flush=True)
    hook.close(optimizer)            # collective: frees the communication
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
