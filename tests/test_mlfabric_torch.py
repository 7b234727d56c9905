"""The torch front end of MLfabric's parameter server without MPI: the
flat buffer's mapping onto a module's parameters (shapes, dtypes, order),
gradients from torch's backward, and which torch optimizers map onto the
workers' momentum and which are refused."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install partialcoll[torch])")
from partialcoll.mlfabric import SGD  # noqa: E402
from partialcoll.torch.mlfabric import (ParamMap, TorchModel, sgd_from_torch)  # noqa: E402


def net(dtype=torch.float32):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                            torch.nn.Linear(4, 2, bias=False))
    return m.to(dtype)


def test_flatten_order_and_round_trip():
    m = net()
    pmap = ParamMap(m)
    assert pmap.size == 3 * 4 + 4 + 4 * 2
    flat = pmap.flatten()
    assert flat.dtype == np.float64 and flat.shape == (pmap.size,)
    want = np.concatenate([p.detach().double().reshape(-1).numpy()
                           for p in m.parameters()])
    assert np.array_equal(flat, want)
    new = np.arange(pmap.size, dtype=np.float64)
    pmap.unflatten(new)
    params = list(m.parameters())
    assert params[0].dtype == torch.float32
    assert params[0].shape == (4, 3)
    assert torch.equal(params[0], torch.arange(12.).reshape(4, 3))
    assert torch.equal(params[1], torch.arange(12., 16.))
    assert torch.equal(params[2], torch.arange(16., 24.).reshape(2, 4))
    assert np.array_equal(pmap.flatten(), new)


def test_mixed_dtypes_and_errors():
    m = net()
    m[2].to(torch.float64)
    pmap = ParamMap(m)
    x = np.linspace(-1, 1, pmap.size)
    pmap.unflatten(x)
    assert list(m.parameters())[2].dtype == torch.float64
    assert np.allclose(pmap.flatten(), x, atol=1e-7)
    with pytest.raises(ValueError, match="values for"):
        pmap.unflatten(x[:-1])
    with pytest.raises(ValueError, match="no parameters"):
        ParamMap(torch.nn.Tanh())


def test_gradient_is_torch_backward():
    m = net(torch.float64)
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0,
                                                                 1])
    model = TorchModel(m, torch.nn.functional.cross_entropy,
                       lambda worker, step: (x, y))
    w = model.params + 0.1
    g = model.gradient(w, worker=1, step=0)
    ref = net(torch.float64)
    ParamMap(ref).unflatten(w)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    assert np.allclose(g, ParamMap(ref).flatten_grads(), rtol=1e-12)
    # a second step starts from zero gradients, not accumulated ones
    assert np.allclose(model.gradient(w, 1, 1), g, rtol=1e-12)
    loss = model.loss(w)
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(
        ref(x), y).detach()))


def test_unused_parameter_has_zero_gradient_and_decay():
    m = net(torch.float64)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 0, 1])

    def loss_fn(out, target):       # the last layer's weight unused
        return out.sum() * 0 + m[0](x).pow(2).mean()

    model = TorchModel(m, loss_fn, [(x, y)], weight_decay=0.5)
    w = model.params.copy()
    g = model.gradient(w, 0, 0)
    last = slice(16, 24)
    assert np.allclose(g[last], 0.5 * w[last])


def test_iterable_data_restarts():
    m = net(torch.float64)
    batches = [(torch.randn(2, 3, dtype=torch.float64), torch.tensor([0, 1]))
               for _ in range(2)]
    model = TorchModel(m, torch.nn.functional.cross_entropy, batches)
    got = [model.batch(0, s)[0] for s in range(3)]
    assert got[0] is batches[0][0] and got[2] is batches[0][0]


def test_sgd_mapping():
    m = net()
    opt, wd = sgd_from_torch(torch.optim.SGD(m.parameters(), lr=0.3,
                                             momentum=0.9,
                                             weight_decay=1e-4))
    assert (opt.lr, opt.momentum, wd) == (0.3, 0.9, 1e-4)
    mine = SGD(0.2, 0.5)
    assert sgd_from_torch(mine) == (mine, 0.0)


@pytest.mark.parametrize("make, match", [
    (lambda p: torch.optim.Adam(p, lr=0.1), "Adam is not supported"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
     "nesterov"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
     "dampening"),
    (lambda p: torch.optim.SGD(p, lr=0.1, maximize=True), "maximize"),
])
def test_unsupported_optimizers_are_refused(make, match):
    m = net()
    with pytest.raises((TypeError, ValueError), match=match):
        sgd_from_torch(make(m.parameters()))


def test_groups_with_different_settings_are_refused():
    m = net()
    opt = torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},
                           {"params": m[2].parameters(), "lr": 0.2}], lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        sgd_from_torch(opt)
