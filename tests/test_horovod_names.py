"""Horovod's names in partialcoll.torch: the process functions, the
synchronous DistributedOptimizer, the non-blocking and grouped allreduce,
the reduction names, and a torch.distributed process group from the MPI
ranks in one call."""
import inspect

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                                            "(pip install 'partialcoll[torch]')")
import partialcoll as pc  # noqa: E402
import partialcoll.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def test_process_functions():
    hvd.init()
    hvd.init()                                    # again: nothing
    assert hvd.is_initialized() and hvd.mpi_threads_supported()
    assert (hvd.rank(), hvd.size()) == (RANK, P)
    host = COMM.Split_type(MPI.COMM_TYPE_SHARED)
    assert (hvd.local_rank(), hvd.local_size()) == (host.rank, host.size)
    host.Free()
    with pytest.raises(pc.ScheduleError, match="pass comm= to each"):
        hvd.init(comm=COMM)


def grads_of(model):
    return [p.grad.clone() for p in model.parameters()]


def test_distributed_optimizer_is_synchronous():
    """Every step applies the average of every rank's gradient of that
    step: after the step, the weights are w0 - lr * mean(grad_r)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters())
    assert opt.mode == "sync"
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(RANK))
    w0 = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    mean = [torch.from_numpy(pc.allreduce(g.numpy()) / P)
            for g in grads_of(model)]
    opt.step()
    for p, w, g in zip(model.parameters(), w0, mean):
        torch.testing.assert_close(p.detach(), w - 0.5 * g)
    opt.close()


def test_distributed_optimizer_refuses_what_it_lacks():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(pc.ScheduleError, match="num_groups"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                 model.named_parameters(), num_groups=2)


def test_eager_optimizer_shows_its_signature():
    params = inspect.signature(hvd.EagerOptimizer).parameters
    assert list(params)[:3] == ["optimizer", "named_parameters", "mode"]


def test_async_poll_synchronize_and_grouped():
    t = torch.arange(6, dtype=torch.float64) + RANK
    h = hvd.allreduce_async(t, name="t")
    while not hvd.poll(h):
        pass
    got = hvd.synchronize(h)
    torch.testing.assert_close(got, torch.arange(6, dtype=torch.float64)
                               + (P - 1) / 2)
    ints = torch.full((3,), RANK + 1)
    s, m = hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)
    torch.testing.assert_close(m, 2 * s)
    assert torch.equal(hvd.allreduce(ints, op=hvd.Max), torch.full((3,), P))
    assert torch.equal(hvd.allreduce(ints, op=hvd.Min),
                       torch.ones(3, dtype=ints.dtype))
    want = int(np.prod(np.arange(1, P + 1)))
    assert torch.equal(hvd.allreduce(ints, op=hvd.Product),
                       torch.full((3,), want))
    with pytest.raises(pc.ScheduleError, match="list of tensors"):
        hvd.grouped_allreduce(t)
    with pytest.raises(pc.ScheduleError, match="not a handle"):
        hvd.synchronize(t)
    with pytest.raises(pc.ScheduleError, match="floating-point"):
        hvd.allreduce(ints)                      # the average of integers


def test_init_process_group_from_mpi():
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    with pytest.raises(pc.ScheduleError, match="timeout"):
        hvd.init_process_group("gloo", timeout=-1)
    hvd.init_process_group("gloo", timeout=60)
    try:
        t = torch.ones(2) * RANK
        dist.all_reduce(t)
        assert t.tolist() == [P * (P - 1) / 2] * 2
        assert dist.get_rank() == RANK and dist.get_world_size() == P
    finally:
        dist.destroy_process_group()
