"""Tensors in, tensors out (CPU torch tensors through DLPack): allreduce,
iallreduce, the partial collectives and their function forms, at the
running comm size.  16-bit floats are in test_half.py."""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

torch = pytest.importorskip("torch", reason="needs PyTorch")
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
SIZES = [0, 1, 7, 1000]
KINDS = [("solo", pc.SoloAllreduce, {}),
         ("majority", pc.MajorityAllreduce, {"seed": 3}),
         ("quorum", pc.QuorumAllreduce, {"quorum": max(1, P // 2)})]


def reference(x, op=MPI.SUM):
    a = x.numpy()
    out = np.empty_like(a)
    COMM.Allreduce(np.ascontiguousarray(a), out, op=op)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32,
                                   torch.int64, torch.uint8])
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "ring",
                                       "rabenseifner"])
def test_allreduce_returns_a_tensor_equal_to_mpi(dtype, algorithm):
    gen = torch.Generator().manual_seed(RANK)
    for n in SIZES:
        x = (torch.randint(0, 50, (n,), generator=gen)).to(dtype)
        for op, mop in ((pc.SUM, MPI.SUM), (pc.MAX, MPI.MAX)):
            got = pc.allreduce(x, op=op, algorithm=algorithm)
            assert isinstance(got, torch.Tensor) and got.dtype == dtype
            assert got.shape == x.shape
            assert n == 0 or got.data_ptr() != x.data_ptr()
            assert np.array_equal(got.numpy(), reference(x, mop))
            req = pc.iallreduce(x, op=op, algorithm=algorithm)
            got = req.wait()
            assert isinstance(got, torch.Tensor)
            assert np.array_equal(got.numpy(), reference(x, mop))


def test_shapes_in_place_and_recvbuf_are_kept():
    x = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) + RANK
    want = reference(x)
    out = torch.empty_like(x)
    assert pc.allreduce(x, out) is out and np.array_equal(out.numpy(), want)
    ptr = x.data_ptr()
    y = x.clone()
    assert pc.allreduce(y, y) is y and np.array_equal(y.numpy(), want)
    z = x.clone()
    assert pc.allreduce(MPI.IN_PLACE, z) is z and \
        np.array_equal(z.numpy(), want)
    assert pc.iallreduce(x.clone(), out).wait() is out
    got = pc.allreduce(x)
    assert got.shape == (2, 3, 4) and x.data_ptr() == ptr
    assert np.array_equal(x.numpy(), (torch.arange(24.0).reshape(2, 3, 4)
                                      + RANK).numpy())     # input untouched


def test_mixed_numpy_and_tensor_buffers():
    x = torch.full((5,), float(RANK + 1))
    out = np.empty(5, np.float32)
    assert pc.allreduce(x, out) is out
    assert (out == P * (P + 1) / 2).all()
    t = torch.empty(5)
    assert pc.allreduce(np.full(5, RANK + 1, np.float32), t) is t
    assert (t.numpy() == P * (P + 1) / 2).all()


def test_bad_tensors_raise_clear_errors():
    x = torch.ones(4, 6)
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(x.t())
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(torch.ones(6, 4), x.t())       # never a silent copy
    with pytest.raises(pc.ScheduleError, match="detach"):
        pc.allreduce(torch.ones(3, requires_grad=True))
    with pytest.raises(pc.ScheduleError, match="does not match"):
        pc.allreduce(torch.ones(3), torch.ones(4))
    with pytest.raises(pc.ScheduleError, match="does not match"):
        pc.allreduce(torch.ones(3), torch.ones(3, dtype=torch.float64))
    with pytest.raises(pc.ScheduleError, match="not defined"):
        pc.allreduce(torch.ones(3), op=pc.BAND)
    assert np.array_equal(pc.allreduce(x).numpy(), np.full((4, 6), P))


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=[k[0] for k in KINDS])
def test_partial_objects_take_and_return_tensors_exactly_once(name, cls, kw):
    """Every result is a tensor; over all calls plus flush, a rank receives
    every contribution exactly once (int64, bit for bit)."""
    gen = torch.Generator().manual_seed(RANK)
    rng = random.Random(RANK)
    ar = cls(torch.zeros(2, 3, dtype=torch.int64), **kw)
    assert ar.dtype == np.int64 and ar.shape == (2, 3)
    got, mine = torch.zeros(2, 3, dtype=torch.int64), np.zeros((2, 3),
                                                               np.int64)
    for _ in range(200):
        time.sleep(rng.random() * 0.0003)
        x = torch.randint(-100, 100, (2, 3), generator=gen)
        res = ar(x)
        assert isinstance(res.data, torch.Tensor) and res.data.shape == (2, 3)
        got += res.data
        mine += x.numpy()
    last = ar.flush()
    assert isinstance(last.data, torch.Tensor)
    got += last.data
    total = np.empty_like(mine)
    COMM.Allreduce(mine, total)
    assert np.array_equal(got.numpy(), total)
    assert isinstance(ar.close().data, torch.Tensor)


def test_partial_result_type_follows_the_call():
    """A NumPy-made object answers a tensor call with a tensor and a NumPy
    call with an array; flush answers as ``like``."""
    with pc.SoloAllreduce(np.zeros(3)) as ar:
        assert isinstance(ar(torch.ones(3, dtype=torch.float64)).data,
                          torch.Tensor)
        assert isinstance(ar(np.ones(3)).data, np.ndarray)
        assert isinstance(ar.flush().data, np.ndarray)
        req = ar.start(torch.ones(3, dtype=torch.float64))
        res = req.wait()
        assert req.wait() is res and isinstance(res.data, torch.Tensor)
        with pytest.raises(pc.ScheduleError, match="takes float64"):
            ar(torch.ones(3))


def test_function_forms_with_tensors():
    pc.close_partials(COMM)            # what earlier tests left open
    x = torch.full((4,), 2.0)
    total = torch.zeros(4)
    for _ in range(20):
        res = pc.majority_allreduce(x)
        assert isinstance(res.data, torch.Tensor)
        total += res.data
    out = torch.empty(4)
    res = pc.solo_allreduce(x, out)
    assert res.data is out
    total += out
    for label, res in pc.close_partials(COMM):
        assert isinstance(res.data, torch.Tensor), label
        total += res.data
    assert (total.numpy() == 2.0 * 21 * P).all()


def test_torch_allreduce_sum_and_average():
    import partialcoll.torch as pct
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (RANK + 1)
    before = x.clone()
    avg = pct.allreduce(x)
    assert avg.dtype == torch.float32 and avg.shape == (3, 4)
    assert torch.equal(x, before) and avg.data_ptr() != x.data_ptr()
    assert np.allclose(avg.numpy(), reference(x) / P)
    assert np.array_equal(pct.allreduce(x, op="sum").numpy(), reference(x))
    assert np.array_equal(pct.allreduce(x, average=False).numpy(),
                          reference(x))
    assert np.array_equal(pct.allreduce(x, op=pc.MAX).numpy(),
                          reference(x, MPI.MAX))
    ints = torch.arange(5) * RANK
    assert np.array_equal(pct.allreduce(ints, op="sum").numpy(),
                          reference(ints))
    with pytest.raises(ValueError, match="floating-point"):
        pct.allreduce(ints)
    # a non-contiguous tensor, and one that requires grad, are read as is
    w = torch.ones(4, 3, requires_grad=True)
    assert np.array_equal(pct.allreduce(w.t(), op="sum").detach().numpy(),
                          np.full((3, 4), P, np.float32))


def test_torch_allreduce_average_of_bfloat16_is_rounded_once():
    import partialcoll.torch as pct
    gen = torch.Generator().manual_seed(RANK)
    x = (torch.rand(999, generator=gen) * 4 - 2).to(torch.bfloat16)
    sum32 = pc.allreduce(x.float().numpy())
    want = torch.from_numpy(sum32 / np.float32(P)).to(torch.bfloat16)
    got = pct.allreduce(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


# ------------------------------------------------ CUDA tensors (GPU path)
def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA tensors need a GPU (and CuPy)")
    pytest.importorskip("cupy", reason="the GPU path needs CuPy "
                        "(pip install 'partialcoll[cuda]')")
    return torch.device("cuda", 0)


def test_cuda_tensors_in_cuda_tensors_out():
    """allreduce, iallreduce in place, a partial object and compression,
    on CUDA tensors (every rank on GPU 0 here): results are CUDA tensors,
    equal to the host reference (float16 data under compression)."""
    dev = _cuda_or_skip()
    x = torch.arange(1000, dtype=torch.float32) * (RANK + 1)
    ref = reference(x)
    g = x.to(dev)
    got = pc.allreduce(g)
    assert got.is_cuda and got.dtype == torch.float32
    assert np.array_equal(got.cpu().numpy(), ref)
    y = g.clone()
    pc.iallreduce(y, y).wait()
    assert np.array_equal(y.cpu().numpy(), ref)
    h = pc.allreduce(g, compression="fp16")
    assert h.is_cuda and h.dtype == torch.float32
    np.testing.assert_allclose(h.cpu().numpy(), ref, rtol=(P + 1) * 2 ** -11)
    with pc.SoloAllreduce(g, sync_every=1) as ar:
        res = ar(g)
        assert res.data.is_cuda and np.array_equal(res.data.cpu().numpy(), ref)
    with pc.SoloAllreduce(g, sync_every=1, compression="fp16") as ar:
        res = ar(g)
        assert res.data.is_cuda and res.data.dtype == torch.float32
        np.testing.assert_allclose(res.data.cpu().numpy(), ref,
                                   rtol=(P + 1) * 2 ** -11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_16_bit_tensors_reduce_like_cpu_ones(dtype):
    """bfloat16 (which CuPy has not: its bits as uint16) and float16 CUDA
    tensors: widened to float32 on the GPU, reduced, rounded once; bit
    for bit the CPU tensor's result (the same algorithm, float32 sums),
    in allreduce and in a synchronous partial round."""
    dev = _cuda_or_skip()
    gen = torch.Generator().manual_seed(RANK)
    x = (torch.randn(999, generator=gen) * 100).to(dtype)
    want = pc.allreduce(x)
    got = pc.allreduce(x.to(dev))
    assert got.is_cuda and got.dtype == dtype
    assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
    y = x.to(dev)
    assert pc.allreduce(y, y) is y
    assert torch.equal(y.cpu().view(torch.int16), want.view(torch.int16))
    with pc.SoloAllreduce(x, sync_every=1) as host, \
            pc.SoloAllreduce(x.to(dev), sync_every=1) as gpu:
        a, b = host(x).data, gpu(x.to(dev)).data
        assert b.is_cuda and b.dtype == dtype
        assert torch.equal(b.cpu().view(torch.int16), a.view(torch.int16))


@pytest.mark.parametrize("mode", ["sync", "solo"])
def test_eager_optimizer_on_cuda_parameters(mode):
    """EagerOptimizer on a model on the GPU: the parameters stay CUDA
    tensors, and over the steps and the closing flush they move by lr x
    every rank's gradients / P (nothing lost, in solo too)."""
    dev = _cuda_or_skip()
    import partialcoll.torch as pct
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3).to(dev)
    lr = 0.1
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                             model.named_parameters(), mode=mode)
    w0 = [p.detach().clone() for p in model.parameters()]
    total = [torch.zeros_like(p) for p in model.parameters()]
    for step in range(3):
        opt.zero_grad()
        gen = torch.Generator().manual_seed(10 * step + RANK)
        x = torch.randn(4, 8, generator=gen).to(dev)
        model(x).pow(2).mean().backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad
        opt.step()
    opt.close()                       # applies what is still pending
    for p, p0, t in zip(model.parameters(), w0, total):
        assert p.is_cuda
        exact = COMM.allreduce(t.cpu().numpy().astype(np.float64)) / P
        moved = (p0 - p).detach().cpu().numpy() / lr
        np.testing.assert_allclose(moved, exact, rtol=1e-4, atol=1e-5)


def test_cuda_bfloat16_bits_without_cupys_own_bfloat16():
    """The path for a CuPy without a bfloat16 of its own (before ml_dtypes):
    the tensor's bits read from its DLPack capsule as a uint16 CuPy view,
    the same memory (a write through the view shows in the tensor)."""
    dev = _cuda_or_skip()
    import cupy
    from partialcoll.core import arrays
    t = torch.arange(12, dtype=torch.float32).to(torch.bfloat16).to(dev)
    bits = arrays._bfloat16_bits(t, cupy)
    assert isinstance(bits, cupy.ndarray) and bits.dtype == np.uint16
    assert np.array_equal(cupy.asnumpy(bits),
                          t.cpu().view(torch.int16).numpy().view(np.uint16))
    bits[0] = 0x3F80                                # 1.0 in bfloat16
    assert t[0].item() == 1.0
    assert arrays._bfloat16_bits(torch.ones(2, device=dev), cupy) is None
