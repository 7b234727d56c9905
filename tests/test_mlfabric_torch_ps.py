"""The torch front end end to end (MPI, P = 4: a server and three
workers; the mapping does not depend on P, test_mlfabric_ps.py covers the
server at P = 4 and 8): a torch module trained by MLfabric's parameter
server on the emulated network, gradients from torch's backward on the
workers.  The loss falls, the run's invariants hold (no delay above
tau_max, nothing applied twice, no dropped update sent) and every rank's
module ends holding the server's model."""
import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install partialcoll[torch])")
from partialcoll.torch.mlfabric import ParamMap, train_torch  # noqa: E402

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(MPI.COMM_WORLD.size != 4,
                                 reason="end to end at P = 4 only")]
COMM = MPI.COMM_WORLD


def problem():
    """A linear teacher on 16 features, 4 classes; batches of 32 drawn
    from (worker, step), the same on every rank."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)

    def data(worker, step):
        idx = torch.randint(0, 1024, (32,), generator=torch.Generator()
                            .manual_seed(1000 * worker + step))
        return x[idx], y[idx]

    return data, (x[:256], y[:256])


@pytest.mark.parametrize("mode", ["mlfabric", "mlfabric-s"])
def test_train_torch(net, mode):
    torch.set_num_threads(1)
    net({"seed": 3, "default": {"out_rate": "4 MB/s", "in_rate": "4 MB/s",
                                "latency": "0.2 ms"},
         "trace": [{"ranks": "all", "nic": "both", "every": "0.5 s",
                    "factors": [1, 2.5, 3.3, 5, 10],
                    "probabilities": [0, 0.1, 0.1, 0.1, 0.7]}]})
    data, held_out = problem()
    torch.manual_seed(0)
    module = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(module.parameters(), lr=0.5, momentum=0.5)
    loss_fn = torch.nn.functional.cross_entropy
    with torch.no_grad():
        start = float(loss_fn(module(held_out[0]), held_out[1]))
    res = train_torch(module, loss_fn, data, opt, mode=mode, tau_max=6,
                      aggregators=2, eval_data=held_out, duration=2.5,
                      compute_time=0.03, batch_interval=0.05,
                      stragglers=(0.1, 3.0), initial_rate=4e6, seed=5)
    inv = res.invariants
    assert inv["late"] == 0 and inv["dropped_sent"] == 0, inv
    assert inv["applied_twice"] == 0 and inv["unaccounted"] == 0, inv
    if mode == "mlfabric":
        assert max(res.delays) <= 6, res.delays
    assert res.updates["applied"] >= 4, res
    assert res.losses[-1][2] < start - 0.05, (start, res.losses)
    # every rank's module holds the server's final model
    mine = ParamMap(module).flatten()
    assert np.allclose(mine, res.params, rtol=1e-6, atol=1e-7)
    got = COMM.allgather(mine)
    assert all(np.array_equal(got[0], m) for m in got)
    with torch.no_grad():
        assert float(loss_fn(module(held_out[0]), held_out[1])) == \
            pytest.approx(res.losses[-1][2], rel=1e-5)
