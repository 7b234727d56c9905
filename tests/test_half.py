"""bfloat16 and float16 reductions and float16 wire compression, at the
running comm size.

The 16-bit contract (partialcoll/collectives/staging.py): the result is,
bit for bit, round_to_nearest_even(float32 allreduce of the widened
inputs).  Two tests hold it:
* data whose float32 sums are exact (so the float32 reference does not
  depend on the order of combination): the result equals the float32 sum of
  every rank's data rounded once by torch's own conversion; the same data
  rounded at every combining step would differ (checked, for P >= 3);
* any data: the result equals partialcoll's float32 allreduce of the
  widened data (same algorithm), rounded once.
"""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.collectives.pool import POOL

torch = pytest.importorskip("torch", reason="needs PyTorch")
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
HALVES = [torch.bfloat16, torch.float16]
ALGORITHMS = ["recursive_doubling", "ring", "rabenseifner"]
OPS = [("SUM", np.add), ("PROD", np.multiply), ("MIN", np.minimum),
       ("MAX", np.maximum)]


def exact_data(dtype, n, op, seed):
    """16-bit values whose float32 sums (and products) over <= 5 ranks are
    exact: magnitudes in [1/8, 8] (products: a few small binary fractions),
    random signs, some (positive) zeros."""
    gen = torch.Generator().manual_seed(seed)
    if op == "PROD":
        choices = torch.tensor([0.5, 0.75, 1.0, 1.5, 2.0])
        x = choices[torch.randint(0, 5, (n,), generator=gen)]
    else:
        x = torch.exp2(torch.rand(n, generator=gen) * 6 - 3)
    x = torch.where(torch.rand(n, generator=gen) < 0.5, -x, x)
    if op != "PROD":        # +0 only: MIN/MAX of -0 and +0 depend on order
        x[torch.rand(n, generator=gen) < 0.05] = 0
    return x.to(dtype)


def bits(t):
    return t.view(torch.int16).numpy()


@pytest.mark.parametrize("dtype", HALVES, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("opname,combine", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exact_against_a_float32_reference_rounded_once(dtype, opname,
                                                        combine, algorithm):
    for n in (0, 1, 7, 1000):
        x = exact_data(dtype, n, opname, seed=10 * RANK + n)
        everyone = COMM.allgather(x.float().numpy())
        ref32 = everyone[0].copy()
        stepwise = torch.from_numpy(everyone[0].copy()).to(dtype)
        for other in everyone[1:]:
            combine(ref32, other, out=ref32)
            stepwise = torch.from_numpy(
                combine(stepwise.float().numpy(), other)).to(dtype)
        want = torch.from_numpy(ref32).to(dtype)     # torch rounds once
        got = pc.allreduce(x, op=getattr(pc, opname), algorithm=algorithm)
        assert got.dtype == dtype and got.shape == x.shape
        assert np.array_equal(bits(got), bits(want)), (opname, n)
        if opname == "SUM" and n == 1000 and P >= 3:
            # the data tell "rounded once" from "rounded at every step"
            assert not np.array_equal(bits(stepwise), bits(want))


@pytest.mark.parametrize("dtype", HALVES, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_any_data_equals_the_float32_allreduce_rounded(dtype, algorithm):
    gen = torch.Generator().manual_seed(RANK)
    x = (torch.randn(3000, generator=gen) *
         torch.exp2(torch.randint(-20, 20, (3000,), generator=gen).float())
         ).to(dtype)
    f32 = pc.allreduce(x.float().numpy(), algorithm=algorithm)
    want = torch.from_numpy(f32).to(dtype)
    got = pc.allreduce(x, algorithm=algorithm)
    assert np.array_equal(bits(got), bits(want))
    got = pc.iallreduce(x, algorithm=algorithm).wait()
    assert np.array_equal(bits(got), bits(want))
    y = x.clone()
    assert pc.allreduce(y, y, algorithm=algorithm) is y
    assert np.array_equal(bits(y), bits(want))
    out = torch.empty_like(x)
    assert pc.allreduce(x, out, algorithm=algorithm) is out
    assert np.array_equal(bits(out), bits(want))


def test_numpy_float16_is_reduced_like_a_float16_tensor():
    x = exact_data(torch.float16, 101, "SUM", seed=RANK)
    got = pc.allreduce(x.numpy())
    assert got.dtype == np.float16
    assert np.array_equal(got.view(np.int16), bits(pc.allreduce(x)))
    out = np.empty(101, np.float16)
    assert pc.iallreduce(x.numpy(), out).wait() is out
    assert np.array_equal(out, got)


def test_16_bit_refuses_only_ops_floats_have_not():
    with pytest.raises(pc.ScheduleError, match="LAND is not defined for "
                                               "bfloat16"):
        pc.allreduce(torch.ones(2, dtype=torch.bfloat16), op=pc.LAND)
    with pytest.raises(pc.ScheduleError, match="does not match"):
        pc.allreduce(torch.ones(2, dtype=torch.bfloat16),
                     torch.ones(2, dtype=torch.float16))


@pytest.mark.parametrize("cls,kw", [(pc.SoloAllreduce, {}),
                                    (pc.QuorumAllreduce, {"quorum": 1})])
def test_partial_bfloat16_exactly_once(cls, kw):
    """Contributions of 0/1: every combined result (<= 256) is exact in
    bfloat16, so what a rank receives adds up to the exact total."""
    rng = random.Random(RANK)
    gen = torch.Generator().manual_seed(RANK)
    ar = cls(torch.zeros(6, dtype=torch.bfloat16), **kw)
    assert ar.dtype == "bfloat16"
    got, mine = np.zeros(6, np.float32), np.zeros(6, np.float32)
    for _ in range(40):
        time.sleep(rng.random() * 0.0003)
        x = torch.randint(0, 2, (6,), generator=gen).to(torch.bfloat16)
        res = ar(x)
        assert res.data.dtype == torch.bfloat16
        got += res.data.float().numpy()
        mine += x.float().numpy()
    got += ar.close().data.float().numpy()
    assert np.array_equal(got, COMM.allreduce(mine))


def test_partial_16_bit_rounds_once_from_float32():
    """A synchronous round of bfloat16 data: float32 sums rounded once
    (the partial path deposits and accumulates in float32)."""
    x = exact_data(torch.bfloat16, 500, "SUM", seed=RANK)
    ref32 = sum(COMM.allgather(x.float().numpy()))
    with pc.MajorityAllreduce(x, sync_every=1) as ar:
        res = ar(x)
        assert res.sync
        assert np.array_equal(bits(res.data),
                              bits(torch.from_numpy(ref32).to(torch.bfloat16)))
    # a function form with a float16 recvbuf (small integers: every
    # combined result is exact in float16, so the results add up exactly)
    h = np.arange(500, dtype=np.float16) % 7 + RANK
    out = np.empty(500, np.float16)
    pc.close_partials(COMM)     # forms an earlier module left open
    res = pc.solo_allreduce(h, out)
    total = res.data.astype(np.float32)
    for _, res in pc.close_partials(COMM):
        assert res.data.dtype == np.float16
        total += res.data
    assert np.array_equal(total, sum(COMM.allgather(h.astype(np.float32))))


# ----------------------------------------------------------- compression
def test_compression_fp16_travels_as_float16_and_returns_float32():
    rng = np.random.default_rng(RANK)
    n = 777 + P                              # a count no other test uses
    x = rng.standard_normal(n).astype(np.float32)
    exact = sum(a.astype(np.float64) for a in COMM.allgather(x))
    absum = sum(np.abs(a.astype(np.float64)) for a in COMM.allgather(x))
    got = pc.allreduce(x, compression="fp16")
    assert got.dtype == np.float32 and got.shape == x.shape
    # float16 rounding of the inputs and at each combining step (<= P)
    assert (np.abs(got - exact) <= (P + 1) * 2.0 ** -11 * absum).all()
    assert not np.array_equal(got, pc.allreduce(x))      # the loss is real
    if P > 1:
        assert any(key[:2] == ("recursive_doubling", n)
                   and key[2] == np.dtype(np.float16).str
                   for key in POOL.signatures())
    if P <= 2:                   # one step: float16(float16(a) + float16(b))
        halves = [a.astype(np.float16) for a in COMM.allgather(x)]
        want = halves[0] if P == 1 else halves[0] + halves[1]
        assert np.array_equal(got, want.astype(np.float32))
    assert np.array_equal(pc.iallreduce(x, compression=pc.Compression.fp16)
                          .wait(), got)
    y = x.copy()
    assert pc.allreduce(y, y, compression="fp16") is y
    assert np.array_equal(y, got)


def test_no_compression_is_unchanged():
    rng = np.random.default_rng(RANK)
    x = rng.standard_normal(100).astype(np.float32)
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    plain = pc.allreduce(x)
    assert np.array_equal(pc.allreduce(x, compression=None), plain)
    assert np.array_equal(pc.allreduce(x, compression="none"), plain)
    assert np.array_equal(pc.allreduce(x, compression=pc.Compression.none),
                          plain)
    if P <= 2:                   # a + b: the same in every order
        assert np.array_equal(plain, ref)


def test_compression_leaves_other_dtypes_and_keeps_each_type():
    ints = np.arange(10, dtype=np.int64) * (RANK + 1)
    assert np.array_equal(pc.allreduce(ints, compression="fp16"),
                          pc.allreduce(ints))
    d = np.full(4, 1.0 + 2 ** -20, np.float64)
    got = pc.allreduce(d, compression="fp16")
    assert got.dtype == np.float64 and (got == P).all()   # 1 + 2^-20 -> 1
    t = torch.full((3,), 1.0 + 2 ** -12)
    got = pc.allreduce(t, compression="fp16")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert (got.numpy() == P).all()
    b = torch.full((3,), 3.0, dtype=torch.bfloat16)
    got = pc.allreduce(b, compression="fp16")
    assert got.dtype == torch.bfloat16 and (got.float().numpy() == 3 * P).all()
    with pytest.raises(pc.ScheduleError, match="unknown compression"):
        pc.allreduce(np.ones(2, np.float32), compression="int8")
