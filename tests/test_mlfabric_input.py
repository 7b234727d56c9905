"""Bad input to MLfabric's training loops and allreduce is refused clearly
on every rank, never a hang or a silently wrong run: seeds and infinite
settings (checked before any message), SGD's lr and momentum, a model
whose size differs across ranks, a gradient that raises or has the wrong
size on one worker (the run stops and every rank raises TrainingError
naming it), train_allreduce starting every worker from the same model,
DynamicTreeAllreduce's arguments and a call's ``ready``, and a torch
optimizer that does not own exactly the module's trainable parameters.

The unit tests need no MPI; the MPI ones run at P = 4 and 8 (the parameter
server needs a server and workers).  A hang is a failure too: mpiexec's
timeout ends it."""
import math
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.mlfabric import SGD, SoftmaxRegression, TanhMLP
from partialcoll.mlfabric.runtime.config import RunConfig, check_run

COMM = MPI.COMM_WORLD
P = COMM.size
needs_ps = pytest.mark.skipif(P not in (4, 8),
                              reason="the parameter server at P = 4 and 8")


# -- checked before any message (no MPI needed) ------------------------------
@pytest.mark.parametrize("seed, error", [(None, TypeError), (-1, ValueError),
                                         (1.5, TypeError), (True, TypeError)])
def test_seed_refused(seed, error):
    with pytest.raises(error, match="seed"):
        RunConfig(tau_max=2, duration=1.0, seed=seed)


@pytest.mark.parametrize("setting, match", [
    ({"compute_time": math.inf}, "compute_time"),
    ({"compute_time": math.nan}, "compute_time"),
    ({"stragglers": (1.0, math.inf)}, "stragglers s"),
    ({"stragglers": (math.nan, 2.0)}, "stragglers r"),
    ({"stragglers": 3}, "pair"),
    ({"batch_interval": math.inf}, "batch_interval"),
    ({"batch_interval": math.nan}, "batch_interval"),
    ({"eval_every": math.inf}, "eval_every"),
    ({"monitor_lag": math.inf}, "monitor_lag"),
    ({"monitor_window": math.inf}, "monitor_window"),
])
def test_infinite_settings_refused(setting, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(tau_max=2, duration=1.0, **setting)


@pytest.mark.parametrize("setting, match", [
    ({"checkpoint_every": 5}, "needs checkpoint_path"),
    ({"checkpoint_every": 0, "checkpoint_path": "x.npy"}, "checkpoint_every"),
    ({"checkpoint_every": 2.5, "checkpoint_path": "x.npy"},
     "checkpoint_every"),
    ({"checkpoint_every": 5, "checkpoint_path": ""}, "checkpoint_path"),
])
def test_bad_checkpoint_settings_refused(setting, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(tau_max=2, duration=1.0, **setting)


def test_check_run_refuses_infinite_compute():
    """train_allreduce's settings go through the same check."""
    with pytest.raises(ValueError, match="compute_time"):
        check_run(math.inf, (0.0, 1.0), None, 10, None, 0.1, 0.2, 0.5, 1e8)


def test_finite_settings_accepted():
    cfg = RunConfig(tau_max=2, duration=1.0, compute_time=0, seed=3,
                    stragglers=(1, 4.0), batch_interval=0.01)
    assert cfg.stragglers == (1.0, 4.0) and cfg.seed == 3


@pytest.mark.parametrize("kw, error", [
    ({"lr": math.nan}, ValueError), ({"lr": math.inf}, ValueError),
    ({"lr": 0}, ValueError), ({"lr": -1}, ValueError),
    ({"lr": "0.1"}, TypeError), ({"lr": 0.1, "momentum": math.nan},
                                 ValueError),
    ({"lr": 0.1, "momentum": 1.0}, ValueError),
    ({"lr": 0.1, "momentum": None}, TypeError)])
def test_sgd_refuses(kw, error):
    with pytest.raises(error, match="lr|momentum"):
        SGD(**kw)


# -- torch: the optimizer must own exactly the trainable parameters -----------
def _frozen_net():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for p in net[0].parameters():
        p.requires_grad_(False)
    return torch, net


def test_sgd_over_other_module_refused():
    torch, net = _frozen_net()
    from partialcoll.torch.mlfabric import sgd_from_torch
    other = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="trainable parameters"):
        sgd_from_torch(torch.optim.SGD(other.parameters(), lr=0.1), net)


def test_sgd_missing_trainable_parameter_refused():
    torch, net = _frozen_net()
    from partialcoll.torch.mlfabric import sgd_from_torch
    with pytest.raises(ValueError, match="not in it"):
        sgd_from_torch(torch.optim.SGD([net[1].weight], lr=0.1), net)


def test_sgd_listing_frozen_parameters_accepted():
    """torch's step skips a frozen parameter it lists: so do we."""
    torch, net = _frozen_net()
    from partialcoll.torch.mlfabric import sgd_from_torch
    sgd, decay = sgd_from_torch(torch.optim.SGD(net.parameters(), lr=0.1,
                                                weight_decay=0.1), net)
    assert sgd.lr == 0.1 and decay == 0.1


def test_frozen_layer_not_decayed():
    """Weight decay applies to what the optimizer trains only: a frozen
    layer's gradient entries stay 0 (it changed before)."""
    torch, net = _frozen_net()
    from partialcoll.torch.mlfabric import TorchModel, sgd_from_torch
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad],
                          lr=0.1, weight_decay=0.5)
    sgd, decay = sgd_from_torch(opt, net)
    assert decay == 0.5
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1])
    model = TorchModel(net, torch.nn.functional.cross_entropy,
                       lambda w, s: (x, y), weight_decay=decay)
    grad = model.gradient(model.params, 1, 0)
    frozen = sum(p.numel() for p in net[0].parameters())
    assert np.all(grad[:frozen] == 0)
    assert np.any(grad[frozen:] != 0)


# -- MPI: the parameter server -------------------------------------------------
def _train(model, **kw):
    from partialcoll.mlfabric import train
    opts = dict(tau_max=P - 1, aggregators=1, duration=0.6,
                compute_time=0.01, batch_interval=0.02, seed=1)
    opts.update(kw)
    return train(model, SGD(0.5), **opts)


class _Failing(SoftmaxRegression):
    """A model whose gradient goes wrong on one rank from its 3rd step."""

    def __init__(self, bad_rank, how):
        super().__init__(features=8, classes=4, seed=1)
        self.bad_rank, self.how = bad_rank, how

    def gradient(self, params, worker, step):
        g = super().gradient(params, worker, step)
        if worker != self.bad_rank or step < 2:
            return g
        if self.how == "raise":
            raise RuntimeError("disk on fire")
        return g[:-1]                     # one element short


@pytest.mark.mpi
@needs_ps
@pytest.mark.parametrize("how, match", [("raise", "disk on fire"),
                                        ("short", "shape")])
@pytest.mark.parametrize("mode", ["mlfabric", "async", "mlfabric-s"])
def test_train_worker_failure_raises_everywhere(how, match, mode):
    from partialcoll.mlfabric import TrainingError
    bad = 2
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=match) as info:
        _train(_Failing(bad, how), mode=mode, duration=30.0)
    assert list(info.value.failures) == [bad]
    assert f"rank {bad}" in str(info.value)
    assert time.monotonic() - t0 < 20        # stopped, not run out
    COMM.Barrier()


@pytest.mark.mpi
@needs_ps
def test_train_server_loss_failure_raises_everywhere():
    from partialcoll.mlfabric import TrainingError

    class BadLoss(SoftmaxRegression):
        def loss(self, params):
            raise ArithmeticError("no loss here")

    with pytest.raises(TrainingError, match="rank 0: ArithmeticError"):
        _train(BadLoss(features=8, classes=4), duration=30.0)


@pytest.mark.mpi
@needs_ps
def test_train_model_size_differs():
    model = SoftmaxRegression(features=8 + (COMM.rank == 1), classes=4)
    with pytest.raises(ValueError, match="different size"):
        _train(model)


@pytest.mark.mpi
@needs_ps
def test_train_still_runs():
    res = _train(SoftmaxRegression(features=8, classes=4, seed=1))
    assert res.failures == {} and res.updates["applied"] > 0


# -- MPI: train_allreduce ----------------------------------------------------
class _Seen(TanhMLP):
    def gradient(self, params, worker, step):
        self.seen = params.copy()
        return super().gradient(params, worker, step)


@pytest.mark.mpi
@needs_ps
@pytest.mark.parametrize("algorithm", ["ring", "tree", "mlfabric"])
def test_allreduce_workers_start_alike(algorithm):
    """Each rank builds a different start (seed = rank): every worker
    trains rank 0's model, so all hold the same model at every step
    (they diverged by 3.56 before)."""
    from partialcoll.mlfabric import train_allreduce
    model = _Seen(features=8, classes=4, hidden=4, seed=COMM.rank)
    start0 = COMM.bcast(model.params.copy(), root=0)
    out = train_allreduce(model, SGD(0.5), algorithm=algorithm,
                          max_iterations=5, compute_time=0.0)
    seen = [s for s in COMM.allgather(getattr(model, "seen", None))
            if s is not None]
    assert len(seen) == P - 1
    for s in seen:
        np.testing.assert_array_equal(s, seen[0])
    assert out["iterations"] == 5
    first = _Seen(features=8, classes=4, hidden=4, seed=0)
    np.testing.assert_array_equal(first.params, start0)


@pytest.mark.mpi
@needs_ps
def test_allreduce_model_size_differs():
    from partialcoll.mlfabric import train_allreduce
    model = SoftmaxRegression(features=8 + (COMM.rank == 2), classes=4)
    with pytest.raises(ValueError, match="different size"):
        train_allreduce(model, SGD(0.5), max_iterations=3, compute_time=0)


@pytest.mark.mpi
@needs_ps
@pytest.mark.parametrize("algorithm", ["ring", "mlfabric"])
def test_allreduce_worker_failure_raises_everywhere(algorithm):
    """The gradient's ``worker`` is the workers' own rank: 1 is rank 2."""
    from partialcoll.mlfabric import TrainingError, train_allreduce
    with pytest.raises(TrainingError, match="rank 2: RuntimeError") as info:
        train_allreduce(_Failing(1, "raise"), SGD(0.5), algorithm=algorithm,
                        max_iterations=50, compute_time=0.0)
    assert list(info.value.failures) == [2]


@pytest.mark.mpi
@needs_ps
@pytest.mark.parametrize("seed", [None, -1, 1.5])
def test_allreduce_seed_refused(seed):
    from partialcoll.mlfabric import train_allreduce
    with pytest.raises((TypeError, ValueError), match="seed"):
        train_allreduce(SoftmaxRegression(features=8, classes=4), SGD(0.5),
                        max_iterations=3, seed=seed)


# -- MPI: DynamicTreeAllreduce -----------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("kw, error", [
    ({"aggregators": [P + 3]}, ValueError),
    ({"aggregators": 2.0}, TypeError),
    ({"aggregators": [1, 1]}, ValueError),
    ({"initial_rate": 0}, ValueError),
    ({"initial_rate": math.inf}, ValueError),
    ({"monitor_window": 0}, ValueError),
    ({"monitor_lag": math.nan}, ValueError),
    ({"root": P}, ValueError),
    ({"planner": 0.0}, ValueError),
    ({"seed": None}, TypeError)])
def test_tree_allreduce_arguments_refused(kw, error):
    from partialcoll.mlfabric import DynamicTreeAllreduce
    with pytest.raises(error):
        DynamicTreeAllreduce(COMM, **kw)
    COMM.Barrier()


def _bad_ready(kind):
    if kind == "nan":
        return math.nan
    if kind == "wall clock":
        return time.time()
    return "soon"


@pytest.mark.mpi
@pytest.mark.skipif(P < 2, reason="one rank alone raises locally")
@pytest.mark.parametrize("kind, match", [("nan", "finite"),
                                         ("wall clock", "future"),
                                         ("text", "time in seconds")])
def test_tree_allreduce_bad_ready_raises_everywhere(kind, match):
    """Only the last rank passes a bad ready: every rank raises, naming
    it, and the object still works afterwards."""
    from partialcoll.mlfabric import DynamicTreeAllreduce
    ar = DynamicTreeAllreduce(COMM, aggregators=1)
    try:
        ready = _bad_ready(kind) if COMM.rank == P - 1 else pc.now()
        with pytest.raises(ValueError, match=match) as info:
            ar(np.ones(5), ready=ready)
        assert f"rank {P - 1}" in str(info.value)
        out = ar(np.ones(5), ready=pc.now())
        np.testing.assert_array_equal(out, np.full(5, float(P)))
    finally:
        ar.free()


@pytest.mark.mpi
@pytest.mark.skipif(P < 2, reason="needs two ranks")
def test_tree_allreduce_mismatched_buffers_raise_everywhere():
    from partialcoll.mlfabric import DynamicTreeAllreduce
    ar = DynamicTreeAllreduce(COMM)
    try:
        with pytest.raises(ValueError, match="same length"):
            ar(np.ones(4 + (COMM.rank == 1)))
        with pytest.raises(ValueError, match="same length"):
            ar(np.ones(0 if COMM.rank == 0 else 3))
        assert ar(np.ones(0)).size == 0         # empty everywhere: fine
    finally:
        ar.free()


# -- MPI: train_torch ----------------------------------------------------------
@pytest.mark.mpi
@needs_ps
def test_train_torch_bad_data_on_one_worker_raises_everywhere():
    torch = pytest.importorskip("torch")
    from partialcoll.mlfabric import TrainingError
    from partialcoll.torch.mlfabric import train_torch
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 3)
    good = (torch.randn(16, 8), torch.randint(0, 3, (16,)))
    bad = (torch.randn(16, 10), good[1])        # the wrong width

    def data(worker, step):
        return bad if worker == 1 and step >= 1 else good

    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(TrainingError, match="rank 1: RuntimeError"):
        train_torch(net, torch.nn.functional.cross_entropy, data, opt,
                    eval_data=good, tau_max=P - 1, aggregators=1,
                    duration=30.0, compute_time=0.01, batch_interval=0.02)
