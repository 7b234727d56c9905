"""``compression=`` of the eager optimizer (Horovod's
``hvd.DistributedOptimizer(..., compression=hvd.Compression.fp16)``), at
the running comm size: float16 on the wire, results within float16's
rounding of the uncompressed run, anything else refused up front."""
import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import partialcoll as pc  # noqa: E402
import partialcoll.torch as pct  # noqa: E402
from partialcoll.eager import (SGD, EagerAverager,  # noqa: E402
                               EagerOptimizer)

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
torch.set_num_threads(1)
#: float16 keeps 11 significant bits; each of the algorithm's combining
#: steps (about log2 P, P - 1 for the ring) rounds once more
RTOL = 2.0 ** -11 * (2 + P)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 30), torch.nn.Tanh(),
                               torch.nn.Linear(30, 1))


def backward(model, step):
    """This rank's loss of ``step`` (different data on every rank)."""
    g = torch.Generator().manual_seed(100 * step + RANK)
    model(torch.randn(5, 6, generator=g)).pow(2).mean().backward()


def averaged_grads(model, opt, step):
    opt.zero_grad()
    backward(model, step)
    opt.synchronize()
    return [p.grad.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("compression", [
    "fp16", pct.Compression.fp16, pc.Compression.fp16])
@pytest.mark.parametrize("overlap", [False, True])
def test_fp16_averages_are_the_uncompressed_ones_within_float16_rounding(
        compression, overlap):
    """Several buckets (sync, with and without overlap): every averaged
    gradient is within float16's rounding of the uncompressed average,
    and not equal to it (the wire did carry float16)."""
    models = [make_model(), make_model()]
    opts = [pct.EagerOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                               m.named_parameters(), mode="sync",
                               bucket_bytes=1024, overlap=overlap,
                               compression=c)
            for m, c in zip(models, (None, compression))]
    assert len(opts[1].averager._buckets) > 2
    assert opts[1].averager.compression == "fp16"
    assert opts[0].averager.compression is None
    for step in range(3):
        plain, packed = (averaged_grads(m, o, step)
                         for m, o in zip(models, opts))
        for a, b in zip(plain, packed):
            assert b.dtype == np.float32
            scale = np.abs(a).max()
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=RTOL * scale)
        assert any(not np.array_equal(a, b) for a, b in zip(plain, packed))
        for o in opts:
            with o.skip_synchronize():
                o.step()
    w = torch.cat([p.detach().reshape(-1) for p in models[1].parameters()])
    np.testing.assert_array_equal(w.numpy(), COMM.bcast(w.numpy()))
    for o in opts:
        o.close()


@pytest.mark.parametrize("compression", [None, "none", pct.Compression.none])
def test_no_compression_changes_nothing(compression):
    a, b = make_model(), make_model()
    opts = [pct.EagerOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                               m.named_parameters(), mode="sync",
                               compression=c)
            for m, c in zip((a, b), (None, compression))]
    for x, y in zip(averaged_grads(a, opts[0], 0),
                    averaged_grads(b, opts[1], 0)):
        np.testing.assert_array_equal(x, y)
    for o in opts:
        o.close()


def test_wrong_compression_is_refused_up_front():
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    for bad in ("fp32", "bf16", "FP 16", 16, True, torch.float16):
        with pytest.raises(pc.ScheduleError,
                           match="compression must be None or 'fp16'"):
            pct.EagerOptimizer(inner, named, mode="sync", compression=bad)
    with pytest.raises(pc.ScheduleError,
                       match="does not work with mode='sync-mpi'"):
        pct.EagerOptimizer(inner, named, mode="sync-mpi", compression="fp16")
    with pytest.raises(pc.ScheduleError, match="mode='sync-mpi'"):
        EagerAverager([np.zeros(4, np.float32)], "sync-mpi",
                      compression="fp16")
    COMM.Barrier()


def test_compression_that_differs_between_ranks_fails_everywhere():
    if P == 1:
        pytest.skip("needs two ranks to differ")
    model = make_model()
    with pytest.raises(pc.ScheduleError, match="compression: rank 0=None"):
        pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           model.named_parameters(), mode="sync",
                           compression="fp16" if RANK else None)
    COMM.Barrier()


def test_numpy_averager_compresses_float32_and_float64():
    """The framework-agnostic core: float32 and float64 buckets come back
    in their dtype, within float16's rounding of the exact average."""
    rng = np.random.default_rng(RANK)
    for dtype in (np.float32, np.float64):
        grads = [rng.standard_normal(n).astype(dtype) for n in (0, 7, 300)]
        exact = [COMM.allreduce(g) / P for g in grads]
        with EagerAverager(grads, "sync", bucket_bytes=512,
                           compression="fp16") as avg:
            out, _ = avg.reduce(grads)
        for o, e in zip(out, exact):
            assert o.dtype == dtype and o.shape == e.shape
            np.testing.assert_allclose(o, e, rtol=RTOL, atol=RTOL * 4)


def test_numpy_optimizer_takes_compression():
    w = np.zeros(50, np.float32)
    g = np.random.default_rng(RANK).standard_normal(50).astype(np.float32)
    exact = COMM.allreduce(g) / P
    with EagerOptimizer(SGD([w], lr=1.0), "sync",
                        compression=pc.Compression.fp16) as opt:
        opt.step([g])
    np.testing.assert_allclose(-w, exact, rtol=RTOL, atol=RTOL * 4)
    with pytest.raises(pc.ScheduleError, match="mode='sync-mpi'"):
        EagerOptimizer(SGD([w], lr=1.0), "sync-mpi", compression="fp16")


def test_torch_optimizer_compresses_in_solo():
    """A partial mode: the gradients applied over the steps and the closing
    flush add up to the uncompressed ones within float16's rounding."""
    model = make_model()
    w0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                             model.named_parameters(), mode="solo",
                             compression="fp16")
    assert all(c.compression == "fp16"
               for b in opt.averager._buckets for c in b.colls)
    total, absum = 0, 0
    for step in range(4):
        opt.zero_grad()
        backward(model, step)
        g = torch.cat([p.grad.detach().reshape(-1).clone()
                       for p in model.parameters()]).numpy().astype(float)
        total, absum = total + g, absum + np.abs(g)
        opt.step()
    opt.close()                           # applies what is still pending
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    exact = COMM.allreduce(total) / P     # every rank's gradients, once
    moved = (w0 - w).numpy().astype(float)
    # float16: each gradient rounded when deposited and at each sum it is
    # in; float32: the parameter updates
    tol = (P + 3) * 2.0 ** -11 * COMM.allreduce(absum) / P + \
        1e-6 * (1 + np.abs(w0.numpy()))
    assert (np.abs(moved - exact) <= tol).all()
