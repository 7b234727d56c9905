"""A Horovod PyTorch training script, ported to partialcoll by changing two
lines: the import and the launcher.

    -import horovod.torch as hvd
    +import partialcoll.torch as hvd

    -horovodrun -np 4 python train.py
    +mpiexec -n 4 python -m mpi4py examples/horovod_port.py

Everything else below is Horovod's own idiom (init, local_rank, the learning
rate scaled by size, DistributedOptimizer, the two broadcasts, a metric
averaged with allreduce); DistributedOptimizer is synchronous, as
Horovod's.  A linear model learns a random linear map from generated data
(each rank its own batches); rank 0 prints the averaged loss.  To stop
waiting for late ranks, change one name: ``hvd.EagerOptimizer(...,
mode="solo")`` (the docs' eager-SGD page).
"""
import argparse

import torch
import torch.nn.functional as F

import partialcoll.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=20, help="per epoch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(42)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    torch.set_num_threads(1)

    teacher = torch.randn(16, 4)           # the same map on every rank
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.none, op=hvd.Average)

    data = torch.Generator().manual_seed(1000 + hvd.rank())
    for epoch in range(args.epochs):
        total = 0.0
        for _ in range(args.batches):
            x = torch.randn(args.batch_size, 16, generator=data)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), x @ teacher)
            loss.backward()
            optimizer.step()
            total += loss.item()
        avg = hvd.allreduce(torch.tensor(total / args.batches),
                            name="avg_loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {avg.item():.4f} "
                  f"({hvd.size()} ranks, {hvd.local_size()} on this host)",
                  flush=True)
    same = hvd.allreduce(model.weight.detach(), op=hvd.Max)
    if hvd.rank() == 0:
        print(f"replicas agree: {torch.equal(same, model.weight.detach())}")


if __name__ == "__main__":
    main()
