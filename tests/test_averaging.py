"""RPS training wrappers (NumPy and torch): without drops both modes are
synchronous SGD; with drops, model averaging keeps the replicas together
and gradient averaging lets them drift."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.rps.optim import RPSOptimizer
from partialcoll.eager import SGD

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def quadratic_grads(params, rng):
    """Gradient of 0.5 ||p - t_rank||^2 plus noise: ranks pull apart."""
    return [p - (RANK + 1.0) + 0.1 * rng.standard_normal(p.shape)
            for p in params]


def run(average, steps, p_drop=None, seed=0):
    if p_drop is not None:
        pc.network.enable({"seed": 5, "class": {"1": {"drop": p_drop}}})
    params = [np.zeros((3, 4)), np.zeros(5)]
    rng = np.random.default_rng([seed, RANK])
    opt = RPSOptimizer(SGD(params, lr=0.1), average=average, seed=seed)
    for _ in range(steps):
        opt.step(quadratic_grads(params, rng))
    stats = opt.stats()
    opt.close()
    if p_drop is not None:
        pc.network.disable()
    return params, stats


def reference(steps, seed=0):
    """Synchronous SGD on averaged gradients (mpi4py Allreduce)."""
    params = [np.zeros((3, 4)), np.zeros(5)]
    rng = np.random.default_rng([seed, RANK])
    for _ in range(steps):
        for p, g in zip(params, quadratic_grads(params, rng)):
            avg = np.empty_like(g)
            COMM.Allreduce(g, avg)
            p -= 0.1 * avg / P
    return params


@pytest.mark.parametrize("average", ["model", "gradients"])
def test_without_drops_both_modes_are_synchronous_sgd(average):
    got, stats = run(average, 20)
    want = reference(20)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    if P > 1:
        assert stats["rs_delivered_share"] == stats["ag_delivered_share"] == 1


def spread(params):
    flat = np.concatenate([p.ravel() for p in params])
    mean = np.empty_like(flat)
    COMM.Allreduce(flat, mean)
    mean /= P
    return COMM.allreduce(float(np.linalg.norm(flat - mean)), op=MPI.MAX)


def test_model_averaging_keeps_replicas_closer_than_gradient_averaging():
    if P < 2:
        pytest.skip("needs two ranks")
    model, st = run("model", 60, p_drop=0.3)
    grads, _ = run("gradients", 60, p_drop=0.3)
    assert 0.5 < st["rs_delivered_share"] < 0.9       # drops did happen
    assert spread(model) < 0.5 * spread(grads), (spread(model),
                                                 spread(grads))


def test_bad_mode_and_parameters():
    with pytest.raises(pc.ScheduleError, match="average must be"):
        RPSOptimizer(SGD([np.zeros(2)], lr=0.1), average="both")
    with pytest.raises(pc.ScheduleError, match="float"):
        RPSOptimizer(SGD([np.zeros(2, np.int32)], lr=0.1))


@pytest.mark.max_ranks(4)
def test_torch_wrapper_without_drops_is_synchronous_sgd():
    torch = pytest.importorskip("torch")
    import partialcoll.torch as pct
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    ref = torch.nn.Linear(4, 3).double()
    ref.load_state_dict(model.state_dict())
    opt = pct.RPSOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(RANK)
    for _ in range(10):
        x = torch.randn(8, 4, generator=gen, dtype=torch.float64)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
        for p in ref.parameters():          # the reference averages grads
            g = p.grad.numpy().copy()
            COMM.Allreduce(MPI.IN_PLACE, g)
            p.grad = torch.from_numpy(g / P)
        opt.step()
        ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                                   rtol=1e-10, atol=1e-12)
    opt.close()


def test_non_contiguous_numpy_parameters_are_averaged():
    """A transposed (non-contiguous) parameter is averaged in place like a
    contiguous one: the replicas, different at the start, end equal (model
    averaging without drops, lr 0)."""
    base = np.arange(12.0).reshape(3, 4) + RANK      # different per rank
    params = [base.T, np.full(5, float(RANK))]       # base.T: a view
    assert not params[0].flags.c_contiguous
    opt = RPSOptimizer(SGD(params, lr=0.1), average="model", seed=0)
    opt.step([np.zeros_like(p) for p in params])
    opt.close()
    mean = (P - 1) / 2
    np.testing.assert_allclose(params[0], np.arange(12.0).reshape(3, 4).T
                               + mean, rtol=1e-12)
    np.testing.assert_allclose(base, np.arange(12.0).reshape(3, 4) + mean,
                               rtol=1e-12)
    np.testing.assert_allclose(params[1], np.full(5, mean), rtol=1e-12)


@pytest.mark.max_ranks(4)
def test_torch_wrapper_averages_channels_last_parameters():
    """A channels-last convolution's weight is not contiguous: model
    averaging still pulls the replicas to their mean."""
    torch = pytest.importorskip("torch")
    import partialcoll.torch as pct
    torch.manual_seed(RANK)                 # different replicas
    conv = torch.nn.Conv2d(2, 3, 3).double().to(
        memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    start = [p.detach().clone() for p in conv.parameters()]
    opt = pct.RPSOptimizer(torch.optim.SGD(conv.parameters(), lr=0.0),
                           average="model", seed=0)
    opt.zero_grad()
    conv(torch.randn(1, 2, 4, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    opt.close()
    for p, p0 in zip(conv.parameters(), start):
        mean = sum(COMM.allgather(p0)) / P
        np.testing.assert_allclose(p.detach().numpy(), mean.numpy(),
                                   rtol=1e-12, atol=1e-12)
