"""Horovod's broadcasts (partialcoll.torch.broadcast_parameters,
broadcast_optimizer_state, broadcast_object), at the running comm size."""
import io

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import partialcoll as pc  # noqa: E402
import partialcoll.torch as pct  # noqa: E402
from partialcoll.collectives.broadcast import broadcast_object  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
LAST = P - 1
torch.set_num_threads(1)


def raw(t):
    """A tensor's bytes, whatever its dtype (bit-exact comparisons)."""
    t = t.detach().contiguous().cpu()
    return bytes(t.reshape(-1).view(torch.uint8).numpy())


def assert_same_as(root, values):
    """``values`` (a list of tensors) are bit for bit ``root``'s."""
    got = [raw(v) for v in values]
    everyone = COMM.allgather(got)
    for r, theirs in enumerate(everyone):
        assert theirs == everyone[root], f"rank {r} differs from rank {root}"


def assert_same_error_everywhere(excinfo):
    msgs = COMM.allgather(str(excinfo.value))
    assert all(m == msgs[0] for m in msgs), msgs
    return msgs[0]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.fc = torch.nn.Linear(12, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def make_net(seed):
    torch.manual_seed(seed)
    net = Net()
    net.bn.running_mean.uniform_()              # buffers differ per rank too
    net.bn.num_batches_tracked.fill_(seed)      # an int64 buffer
    return net


@pytest.mark.parametrize("form", ["state_dict", "named_parameters",
                                  "pairs", "tensors", "module"])
def test_broadcast_parameters_takes_horovods_forms(form):
    """Every rank starts different; after it, every rank's values are the
    root's (the last rank here) bit for bit."""
    net = make_net(seed=10 + RANK)
    params = {"state_dict": lambda: net.state_dict(),
              "named_parameters": lambda: net.named_parameters(),
              "pairs": lambda: list(net.named_parameters()),
              "tensors": lambda: list(net.parameters()),
              "module": lambda: net}[form]()
    before = raw(net.fc.weight)
    pct.broadcast_parameters(params, root_rank=LAST)
    covered = (list(net.state_dict().values())
               if form in ("state_dict", "module") else
               list(net.parameters()))
    assert_same_as(LAST, covered)
    if RANK != LAST:
        assert raw(net.fc.weight) != before
    if form in ("state_dict", "module"):
        assert int(net.bn.num_batches_tracked) == 10 + LAST


def test_root_is_an_alias_and_odd_tensors_travel_as_bytes():
    """``root=`` (the old name) still works; bfloat16, bool, complex, empty,
    0-d and non-contiguous tensors arrive bit for bit."""
    g = torch.Generator().manual_seed(RANK)
    base = torch.randn(4, 6, generator=g, dtype=torch.float64)
    tensors = {"bf16": torch.randn(7, generator=g).to(torch.bfloat16),
               "half": torch.randn(5, generator=g).half(),
               "mask": torch.rand(9, generator=g) > 0.5,
               "cplx": torch.randn(3, generator=g, dtype=torch.complex64),
               "empty": torch.zeros(0, 3),
               "scalar": torch.tensor(float(RANK)),
               "strided": base.t()}
    pct.broadcast_parameters(tensors, root=LAST)
    assert_same_as(LAST, list(tensors.values()))
    assert_same_as(LAST, [base])        # written through the transposed view
    assert float(tensors["scalar"]) == LAST


def test_bad_input_raises_the_same_error_on_every_rank():
    net = make_net(seed=0)
    with pytest.raises(pc.ScheduleError, match="root_rank") as e:
        pct.broadcast_parameters(net.state_dict(), root_rank=P)
    assert "not a rank of a communicator of size" in \
        assert_same_error_everywhere(e)
    with pytest.raises(pc.ScheduleError, match="disagree"):
        pct.broadcast_parameters(net.state_dict(), root_rank=1, root=0)
    with pytest.raises(pc.ScheduleError, match="not a tensor"):
        pct.broadcast_parameters({"w": net.fc.weight, "lr": 0.1})
    with pytest.raises(pc.ScheduleError, match="mixes"):
        pct.broadcast_parameters([net.fc.weight, ("b", net.fc.bias)])
    with pytest.raises(pc.ScheduleError, match="one tensor"):
        pct.broadcast_parameters(net.fc.weight)
    with pytest.raises(pc.ScheduleError, match="root_rank must be an int"):
        pct.broadcast_object(1, root_rank="0")
    with pytest.raises(pc.ScheduleError, match="optimizer"):
        pct.broadcast_optimizer_state(net)
    COMM.Barrier()


def test_ranks_that_disagree_get_the_same_error_not_a_hang():
    if P == 1:
        pytest.skip("needs two ranks to differ")
    net = torch.nn.Linear(4, 2 if RANK == 0 else 3)
    with pytest.raises(pc.ScheduleError, match="differ between rank") as e:
        pct.broadcast_parameters(net.state_dict(), root_rank=0)
    msg = assert_same_error_everywhere(e)
    assert "weight is (2, 4) torch.float32 on rank 0 but (3, 4)" in msg
    # only one rank passes something bad: every rank raises, naming it
    params = list(net.parameters()) if RANK else [net.weight, 5]
    with pytest.raises(pc.ScheduleError, match="rank 0: .* not a tensor") as e:
        pct.broadcast_parameters(params)
    assert_same_error_everywhere(e)
    with pytest.raises(pc.ScheduleError, match="root_rank differs") as e:
        pct.broadcast_object("x", root_rank=RANK)
    assert_same_error_everywhere(e)
    opt = (torch.optim.SGD if RANK else torch.optim.Adam)(
        torch.nn.Linear(4, 2).parameters(), lr=0.1)
    with pytest.raises(pc.ScheduleError, match="Adam on rank 0, SGD") as e:
        pct.broadcast_optimizer_state(opt)
    assert_same_error_everywhere(e)
    COMM.Barrier()


def test_broadcast_object():
    mine = {"rank": RANK, "w": torch.arange(3.0) * RANK, "tag": "r%d" % RANK}
    got = pct.broadcast_object(mine, root_rank=LAST)
    assert got["rank"] == LAST and got["tag"] == f"r{LAST}"
    assert torch.equal(got["w"], torch.arange(3.0) * LAST)
    if RANK == LAST:
        assert got is mine
    assert pct.broadcast_object(None) is None
    assert broadcast_object(RANK, root=LAST) == LAST
    assert broadcast_object(RANK, root_rank=np.int64(LAST)) == LAST
    # the root cannot pickle a lambda: every rank raises, none hangs
    with pytest.raises(pc.ScheduleError, match="cannot pickle") as e:
        pct.broadcast_object(lambda: RANK, root_rank=0)
    assert_same_error_everywhere(e)
    COMM.Barrier()


# -- optimizer state after a checkpoint loaded on rank 0 only -----------------
OPTIMIZERS = {
    "sgd-momentum": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9,
                                                   weight_decay=1e-4),
    "adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr, betas=(0.8, 0.95)),
}


def batch(step, seed):
    g = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn(8, 2, 6, generator=g), torch.randn(8, 2, generator=g)


def train(net, opt, steps, seed):
    for step in range(steps):
        x, y = batch(step, seed)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def optimizer_tensors(opt):
    """Every tensor of the state (in parameter order) and the
    hyper-parameters of every group, as bytes and values."""
    sd = opt.state_dict()
    out = []
    for idx in sorted(sd["state"]):
        for key in sorted(sd["state"][idx]):
            v = sd["state"][idx][key]
            out.append(v if isinstance(v, torch.Tensor) else
                       torch.tensor(v, dtype=torch.float64))
    groups = [{k: v for k, v in g.items() if k != "params"}
              for g in sd["param_groups"]]
    return out, groups


@pytest.mark.parametrize("wrap", ["plain", "eager"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_optimizer_state_after_a_rank0_checkpoint_is_the_same_everywhere(
        kind, wrap):
    """Train, checkpoint on rank 0; fresh model and optimizer everywhere
    (different seeds and learning rates), rank 0 alone loads the
    checkpoint, then broadcast parameters and optimizer state: every
    rank's state (momentum / exp_avg, exp_avg_sq, step) and hyper-
    parameters equal rank 0's bit for bit, and the replicas stay identical
    through further synchronous training."""
    make = OPTIMIZERS[kind]

    def build(seed, lr, stale=False):
        net = make_net(seed)
        opt = make(net.parameters(), lr)
        if stale:
            train(net, opt, 1, seed=99)     # state of its own
        if wrap == "eager":
            opt = pct.EagerOptimizer(opt, net.named_parameters(),
                                     mode="sync")
        return net, opt

    net, opt = build(seed=1, lr=0.05)
    train(net, opt, 3, seed=RANK)               # states differ per rank
    buf = io.BytesIO()
    if RANK == 0:
        torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    saved = optimizer_tensors(opt)
    if wrap == "eager":
        opt.close()

    net, opt = build(seed=50 + RANK, lr=0.5 + RANK, stale=RANK == 1)
    if RANK == 0:
        buf.seek(0)
        ckpt = torch.load(buf)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
    pct.broadcast_parameters(net.state_dict(), root_rank=0)
    pct.broadcast_optimizer_state(opt, root_rank=0)

    tensors, groups = optimizer_tensors(opt)
    n_params = len(list(net.parameters()))
    per_param = {"sgd-momentum": 1, "adam": 3}[kind]
    assert len(tensors) == n_params * per_param
    assert_same_as(0, tensors)
    assert_same_as(0, list(net.state_dict().values()))
    everyone = COMM.allgather(groups)
    assert all(g == everyone[0] for g in everyone)
    assert groups[0]["lr"] == 0.05
    if RANK == 0:
        assert all(torch.equal(a, b) for a, b in zip(tensors, saved[0]))
    # the wrapper still reads the state it was given
    if wrap == "eager":
        assert opt.state is opt.optimizer.state
    # same data on every rank from here: replicas stay identical (bit for
    # bit with a plain optimizer; the allreduce may round differently)
    train(net, opt, 2, seed=7)
    if wrap == "plain":
        assert_same_as(0, list(net.parameters()))
    else:
        w = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        np.testing.assert_allclose(w.numpy(), COMM.bcast(w.numpy()),
                                   rtol=0, atol=1e-6)
        opt.close()


def test_optimizer_state_from_an_empty_root_empties_the_others():
    net = make_net(seed=3)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    if RANK != 0:
        train(net, opt, 1, seed=RANK)
    pct.broadcast_optimizer_state(opt, root_rank=0)
    assert len(opt.state) == 0
    assert COMM.allgather(opt.param_groups[0]["lr"]) == [0.01] * P


def test_different_optimizer_layouts_fail_everywhere():
    if P == 1:
        pytest.skip("needs two ranks to differ")
    net = torch.nn.Linear(4, 2)
    extra = [] if RANK == 0 else [torch.nn.Parameter(torch.zeros(3))]
    opt = torch.optim.SGD(list(net.parameters()) + extra, lr=0.1)
    with pytest.raises(pc.ScheduleError, match="group 0 has 2 parameters "
                       "on rank 0, 3 on rank 1") as e:
        pct.broadcast_optimizer_state(opt)
    assert_same_error_everywhere(e)
    COMM.Barrier()


def test_the_values_arrive_exactly():
    """A guard on the test helpers: ``raw`` tells different bit patterns of
    equal floats apart (+0.0 and -0.0)."""
    assert raw(torch.tensor([0.0])) != raw(torch.tensor([-0.0]))
    assert np.array_equal(np.frombuffer(raw(torch.tensor([1.5])), np.float32),
                          [1.5])
