"""eager-SGD as a DDP communication hook (gloo process group on loopback,
gradients averaged by partialcoll over MPI)."""
import logging
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import torch.distributed as dist  # noqa: E402

import partialcoll as pc  # noqa: E402
import partialcoll.torch as pct  # noqa: E402

# Framework wrappers over the collectives: their subject does not depend on
# P beyond what P = 1..5 cover, and at P = 8 (4 ranks per core) they cost a
# third of the CI run.
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


@pytest.fixture(scope="module")
def gloo():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    # the library's rendezvous: every rank's last MPI message has left
    # before any rank blocks in torch.distributed (OFI's TCP provider
    # moves a message only while its sender calls MPI)
    pct.init_process_group("gloo", timeout=120)
    yield
    dist.destroy_process_group()


def rank0s(a):
    """Rank 0's copy of the array ``a``, through the gloo group as DDP's own
    collectives: an MPI collective between DDP's could leave a rank
    waiting for rank 0 to call MPI (OFI's TCP provider moves messages only
    then) while rank 0 has gone on into DDP's next gloo collective."""
    t = torch.from_numpy(np.array(a, copy=True))
    dist.broadcast(t, 0)
    return t.numpy()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("mode", ["solo", "majority", "sync"])
def test_ddp_hook_loses_nothing_and_replicas_agree(gloo, mode):
    """Plain SGD through DDP with the eager hook, small buckets (several per
    step), random skew: after flush the replicas agree and the total update
    is lr * (sum of every rank's local gradients) / P."""
    torch.manual_seed(RANK)                 # DDP broadcasts rank 0's weights
    model = Net().double()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    hook = pct.EagerHook(ddp, mode=mode)
    ddp.register_comm_hook(hook, pct.eager_comm_hook)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = 0.05
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    # the local gradients of each step, computed on a twin without DDP
    twin = Net().double()
    gsum = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(RANK)
    srng = random.Random(RANK)
    for _ in range(40):
        time.sleep(srng.random() * 0.002)
        x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        twin.load_state_dict(model.state_dict())
        twin.zero_grad()
        twin(x).pow(2).mean().backward()
        for n, p in twin.named_parameters():
            gsum[n] += p.grad
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    hook.close(opt)
    # the checks' collectives on the gloo group (see rank0s)
    for n, p in model.named_parameters():
        total = gsum[n].clone()
        dist.all_reduce(total)
        np.testing.assert_allclose((w0[n] - p.detach()).numpy(),
                                   lr * total.numpy() / P, rtol=1e-9,
                                   atol=1e-11)
        w = p.detach().clone()
        dist.broadcast(w, 0)
        np.testing.assert_allclose(p.detach().numpy(), w.numpy(),
                                   atol=1e-12)
    assert hook.stats()["steps"] == 40
    assert hook.buckets > 1             # the gathering across buckets ran
    if mode != "majority":              # buckets started during backward
        assert hook.stats()["started_early"] >= 40, hook.stats()


def run_ddp_steps(ddp, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()


def test_ddp_hook_starts_buckets_during_backward_same_result(gloo):
    """Sync mode: the hook starts each of its buckets as soon as DDP has
    handed over its gradients (before DDP's last bucket), and the
    parameters are bit for bit those of the hook that starts everything
    at the last bucket."""
    models, hooks, opts = [], [], []
    for overlap in (True, False):
        torch.manual_seed(0)
        model = Net().double()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=0.01)
        hook = pct.EagerHook(ddp, mode="sync", overlap=overlap)
        ddp.register_comm_hook(hook, pct.eager_comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        models.append(model)
        hooks.append(hook)
        opts.append((ddp, opt))
    for (ddp, opt) in opts:
        run_ddp_steps(ddp, opt, 6, RANK)
    for (n, p), (_, q) in zip(models[0].named_parameters(),
                              models[1].named_parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
        w = p.detach().numpy()
        np.testing.assert_array_equal(w, rank0s(w))
    fast, slow = hooks
    assert fast.overlap and not slow.overlap
    assert len(fast.averager._buckets) == 3 and fast.buckets > 1
    # its buckets before the one holding the first layer start early
    assert fast.stats()["started_early"] >= 6 * 2, fast.stats()
    assert slow.stats()["started_early"] == 0
    for hook, (_, opt) in zip(hooks, opts):
        assert hook.close(opt) is None


class WithBatchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.c = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.c(self.bn(self.a(x)))


@pytest.mark.parametrize("mode,buffers,warns", [
    ("solo", True, True), ("majority", True, True), ("sync", True, False),
    ("solo", False, False)])
def test_broadcast_buffers_warning(gloo, mode, buffers, warns, caplog):
    """DDP's broadcast_buffers=True with BatchNorm ties every rank to the
    slowest at each forward: the hook warns in the partial modes, once for
    the job (on rank 0: every rank knows the same)."""
    torch.manual_seed(0)
    # torch 2.13 renamed DDP's broadcast_buffers to forward_sync_buffers
    # (the old name warns); a DDP made without either syncs them
    ddp = torch.nn.parallel.DistributedDataParallel(WithBatchNorm().double())
    ddp.broadcast_buffers = buffers         # an alias in torch 2.13
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        hook = pct.EagerHook(ddp, mode=mode)
    said = [r for r in caplog.records
            if "broadcast_buffers" in r.getMessage()]
    assert len(said) == int(warns and RANK == 0), \
        [r.getMessage() for r in caplog.records]
    if said:
        assert "broadcast_buffers=False" in said[0].getMessage()
    ddp.register_comm_hook(hook, pct.eager_comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    run_ddp_steps(ddp, opt, 3, RANK)
    hook.close(opt)


def test_ddp_hook_compression_fp16_within_float16_rounding(gloo):
    """``compression=pct.Compression.fp16`` (sync): float16 on the wire.
    After a few steps the parameters are within float16's rounding of the
    uncompressed hook's updates, not equal to them, and equal on every
    rank."""
    rtol = 2.0 ** -11 * (2 + P)
    models, hooks, opts = [], [], []
    for compression in (None, pct.Compression.fp16):
        torch.manual_seed(0)
        model = Net()                             # float32
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=0.01)
        hook = pct.EagerHook(ddp, mode="sync", compression=compression)
        ddp.register_comm_hook(hook, pct.eager_comm_hook)
        models.append(model)
        hooks.append(hook)
        opts.append((ddp, torch.optim.SGD(ddp.parameters(), lr=0.05)))
    w0 = torch.cat([p.detach().reshape(-1) for p in models[0].parameters()])
    for ddp, opt in opts:
        gen = torch.Generator().manual_seed(RANK)
        for _ in range(3):
            x = torch.randn(4, 6, generator=gen)
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
    plain, packed = (torch.cat([p.detach().reshape(-1) for p in
                                m.parameters()]) for m in models)
    step = (plain - w0).abs().max().item()
    assert step > 0
    np.testing.assert_allclose(packed.numpy(), plain.numpy(), rtol=0,
                               atol=3 * rtol * step + 1e-7)
    assert not torch.equal(plain, packed)
    np.testing.assert_array_equal(packed.numpy(),
                                  rank0s(packed.numpy()))
    assert hooks[1].averager.compression == "fp16"
    for hook, (_, opt) in zip(hooks, opts):
        assert hook.close(opt) is None


@pytest.mark.parametrize("mode", ["solo", "majority"])
def test_ddp_hook_compresses_in_a_partial_mode(gloo, mode):
    """A partial mode with ``compression="fp16"``: every partial
    collective of the hook carries float16, training runs, and after the
    closing flush the parameters agree on every rank within float16's
    rounding of the updates: each rank applied the same rounds, but a rank
    that took two rounds at once got their float16 sum, rounded once more
    (seen at P = 5: 2.4e-7 apart after updates of about 1e-2)."""
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Net().double(),
                                                    bucket_cap_mb=0.01)
    w0 = torch.cat([p.detach().reshape(-1).clone()
                    for p in ddp.parameters()])
    hook = pct.EagerHook(ddp, mode=mode, compression="fp16")
    ddp.register_comm_hook(hook, pct.eager_comm_hook)
    colls = [c for b in hook.averager._buckets for c in b.colls]
    assert colls and all(c.compression == "fp16" for c in colls)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    run_ddp_steps(ddp, opt, 3, RANK)
    hook.close(opt)
    w = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    assert torch.isfinite(w).all()
    moved = (w - w0).abs().max().item()
    assert moved > 0
    np.testing.assert_allclose(w.numpy(), rank0s(w.numpy()),
                               rtol=0, atol=(P + 3) * 2.0 ** -11 * moved)


def test_ddp_hook_compression_refused_with_sync_mpi(gloo):
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Net())
    with pytest.raises(pc.ScheduleError, match="compression"):
        pct.EagerHook(ddp, mode="sync-mpi", compression="fp16")


def test_hook_bad_argument_on_one_rank_is_refused_on_every_rank():
    """The last rank passes overlap="yes"; the others a valid hook.  Every
    rank raises (the others join the setup agreement and hear of it)
    rather than wait there for ever."""
    if P < 2:
        pytest.skip("needs two ranks")
    overlap = "yes" if RANK == P - 1 else True
    with pytest.raises(pc.ScheduleError, match="overlap must be True or "
                                               "False"):
        pct.EagerHook(Net(), mode="solo", overlap=overlap)
