"""eager-SGD for PyTorch (partialcoll.torch), at the running comm size."""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import partialcoll as pc  # noqa: E402
import partialcoll.torch as pct  # noqa: E402

# Framework wrappers over the collectives: their subject does not depend on
# P beyond what P = 1..5 cover, and at P = 8 (4 ranks per core) they cost a
# third of the CI run.
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
MODES = ["solo", "majority", max(1, P // 2), "sync"]
IDS = ["solo", "majority", "quorum", "sync"]
torch.set_num_threads(1)


class TwoHeads(torch.nn.Module):
    """head_b only gets a gradient on some steps (on some ranks)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(6, 8)
        self.head_a = torch.nn.Linear(8, 1)
        self.head_b = torch.nn.Linear(8, 1)

    def forward(self, x, use_b):
        h = torch.tanh(self.body(x))
        return self.head_a(h) + (self.head_b(h) if use_b else 0)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                     ).double().numpy()


def make_model(seed):
    torch.manual_seed(seed)
    m = TwoHeads().double()
    return m


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_sgd_replicas_identical_and_updates_sum_to_grads_over_P(mode):
    """Plain SGD, catch-up, random skew, a parameter without gradient on some
    steps: after flush all replicas are identical and w_end - w_start equals
    -lr * (sum of every rank's gradients) / P."""
    model = make_model(RANK)                       # different on purpose
    pct.broadcast_parameters(model.state_dict(), root=0)
    w0 = flat(model)
    assert np.array_equal(COMM.bcast(w0, root=0), w0)
    lr = 0.01
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                             model.named_parameters(), mode=mode)
    gsum = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(RANK)
    srng = random.Random(RANK)
    for step in range(120):
        time.sleep(srng.random() * 0.002)
        x = torch.randn(5, 6, generator=gen, dtype=torch.float64)
        use_b = (step + RANK) % 3 != 0
        opt.zero_grad()
        model(x, use_b).pow(2).mean().backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                gsum[n] += p.grad
        opt.step()
    opt.flush()
    for n, p in model.named_parameters():
        total = gsum[n].numpy().copy()
        COMM.Allreduce(MPI.IN_PLACE, total)
        got = p.detach().numpy()
        start = w0_by_name(w0, model)[n]
        np.testing.assert_allclose(start - got, lr * total / P,
                                   rtol=1e-9, atol=1e-11)
    w = flat(model)
    np.testing.assert_allclose(w, COMM.bcast(w, root=0), rtol=0, atol=1e-12)
    assert opt.stats()["steps"] == 120
    opt.close()


def w0_by_name(w0, model):
    out, off = {}, 0
    for n, p in model.named_parameters():
        out[n] = w0[off:off + p.numel()].reshape(p.shape)
        off += p.numel()
    return out


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01)], ids=["momentum", "adam"])
def test_sync_mode_equals_the_optimizer_on_averaged_gradients(make):
    a, b = make_model(0), make_model(0)
    opt = pct.EagerOptimizer(make(a.parameters()), a.named_parameters(),
                             mode="sync")
    ref = make(b.parameters())
    gen = torch.Generator().manual_seed(RANK)
    for step in range(15):
        x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        use_b = step % 2 == 0
        for m, o in ((a, opt), (b, ref)):
            o.zero_grad()
            m(x, use_b).pow(2).mean().backward()
        for p in b.parameters():
            g = (p.grad.numpy().copy() if p.grad is not None
                 else np.zeros(tuple(p.shape)))
            COMM.Allreduce(MPI.IN_PLACE, g)
            p.grad = torch.from_numpy(g / P)
        opt.step()
        ref.step()
    np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    opt.close()


@pytest.mark.parametrize("mode", ["solo", "majority"])
@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.02)], ids=["momentum", "adam"])
def test_stateful_optimizers_train_and_synchronize_model(make, mode):
    """Momentum and Adam under eager-SGD: the loss falls on every rank; an
    LR scheduler and state_dict work through the wrapper; and
    synchronize_model (which flushes the open optimizer first) leaves equal
    weights everywhere."""
    model, X, Y = regression_setup(seed=3)
    opt = pct.EagerOptimizer(make(model.parameters()),
                             model.named_parameters(), mode=mode)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    first = loss_of(model, X, Y)
    train(model, opt, X, Y, 150, sched=sched)
    assert opt.param_groups[0]["lr"] < opt.optimizer.defaults["lr"]
    sd = opt.state_dict()
    assert len(sd["state"]) == len(list(model.parameters()))
    opt.load_state_dict(sd)             # lands in the wrapped optimizer
    assert opt.state is opt.optimizer.state and len(opt.optimizer.state)
    with pytest.raises(pc.ScheduleError, match="parameter group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    pct.synchronize_model(model)
    w = flat_lin(model)
    np.testing.assert_allclose(w, COMM.bcast(w, root=0), rtol=1e-6, atol=1e-6)
    last = loss_of(model, X, Y)
    losses = COMM.allgather((first, last))
    assert all(b < 0.2 * a for a, b in losses), losses
    opt.close()


def regression_setup(seed, n=64, d=8):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(d, 1, generator=g)
    X = torch.randn(n, d, generator=g)
    Y = X @ w_true + 0.01 * torch.randn(n, 1, generator=g)
    torch.manual_seed(0)
    return torch.nn.Linear(d, 1), X, Y


def flat_lin(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                     ).numpy()


def loss_of(model, X, Y):
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(X), Y))


def train(model, opt, X, Y, steps, sched=None, batch=8):
    """Each rank takes its own shard; one rank per step is a bit slower."""
    g = torch.Generator().manual_seed(RANK)
    for step in range(steps):
        if step % P == RANK:
            time.sleep(0.001)
        idx = torch.randint(0, X.shape[0], (batch,), generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        opt.step()
        if sched is not None:
            sched.step()


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_end_to_end_reaches_loss_threshold(mode):
    """A small linear regression trained with eager-SGD in every mode gets
    below the threshold on every rank (after the final flush)."""
    model, X, Y = regression_setup(seed=5)
    pct.broadcast_parameters(model.state_dict())
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), mode=mode)
    start = loss_of(model, X, Y)
    train(model, opt, X, Y, 200)
    opt.close()
    final = COMM.allgather(loss_of(model, X, Y))
    assert start > 0.5 and max(final) < 0.01, (start, final)


def test_misuse_is_refused_with_clear_errors():
    model = make_model(0)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(pc.ScheduleError, match="wraps a torch.optim"):
        pct.EagerOptimizer(object(), model.named_parameters())
    with pytest.raises(pc.ScheduleError, match="does not name"):
        pct.EagerOptimizer(inner, list(model.named_parameters())[:2])
    with pytest.raises(pc.ScheduleError, match="repeats names"):
        named = list(model.named_parameters())
        pct.EagerOptimizer(inner, named + [named[0]])
    with pytest.raises(pc.ScheduleError, match="name, tensor"):
        pct.EagerOptimizer(inner, list(model.parameters()))
    with pytest.raises(pc.ScheduleError, match="mode must be"):
        pct.EagerOptimizer(inner, model.named_parameters(), mode="eager")
    bf = torch.nn.Linear(2, 2).to(torch.bfloat16)
    with pytest.raises(pc.ScheduleError, match="bfloat16"):
        pct.EagerOptimizer(torch.optim.SGD(bf.parameters(), lr=0.1))
    with pytest.raises(pc.ScheduleError, match="root"):
        pct.broadcast_parameters(model.state_dict(), root=P)
    ok = pct.EagerOptimizer(inner, model.named_parameters())
    with pytest.raises(pc.ScheduleError, match="already an EagerOptimizer"):
        pct.EagerOptimizer(ok, model.named_parameters())
    ok.close()


def test_different_models_on_different_ranks_fail_everywhere():
    if P == 1:
        pytest.skip("needs two ranks to differ")
    model = (torch.nn.Linear(4, 2) if RANK == 0 else torch.nn.Linear(4, 3))
    with pytest.raises(pc.ScheduleError, match="differently on different ranks"):
        pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           model.named_parameters())
    with pytest.raises(pc.ScheduleError, match="differ between rank"):
        pct.broadcast_parameters(model.state_dict())
    COMM.Barrier()


def test_parameters_frozen_or_not_in_the_step():
    """Frozen parameters are not averaged; a parameter with no gradient on
    any rank ends up with a zero gradient (and plain SGD leaves it)."""
    model = make_model(0)
    model.head_b.weight.requires_grad_(False)
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), mode="solo")
    names = [n for n, _ in opt._named]
    assert "head_b.weight" not in names and "head_b.bias" in names
    before = model.head_b.bias.detach().clone()
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(3, 6, dtype=torch.float64), False).sum().backward()
        opt.step()
    opt.close()
    assert torch.equal(model.head_b.bias.detach(), before)
    assert torch.count_nonzero(model.head_b.bias.grad) == 0


@pytest.mark.parametrize("mode", ["sync", "solo"])
@pytest.mark.parametrize("how", ["unfrozen", "inner_group"])
def test_a_parameter_outside_the_averaged_set_is_refused(mode, how):
    """A parameter frozen when the optimizer was wrapped and unfrozen
    later, or added to the wrapped optimizer after wrapping, would be
    updated with this rank's own gradient: step() refuses on every rank
    and updates nothing; the optimizer goes on working."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    if how == "unfrozen":
        model[0].requires_grad_(False)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        inner = torch.optim.SGD(model[1].parameters(), lr=0.1)
    opt = pct.EagerOptimizer(inner, model.named_parameters(), mode=mode)
    if how == "unfrozen":
        model[0].requires_grad_(True)
    else:
        inner.add_param_group({"params": model[0].parameters()})
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    model(torch.randn(4, 2)).pow(2).sum().backward()
    with pytest.raises(pc.ScheduleError, match="0.weight has a gradient but "
                                               "is not averaged"):
        opt.step()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    model[0].requires_grad_(False)
    opt.zero_grad()
    model(torch.randn(4, 2)).pow(2).sum().backward()
    opt.step()
    opt.close()
    assert not torch.equal(model[1].weight.detach(), before[2])
