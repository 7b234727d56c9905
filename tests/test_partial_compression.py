"""``compression="fp16"`` on the partial collectives (solo, majority,
quorum) and the eager averager's partial modes, at the running comm size.

What must hold: every result is float16 data (the rounds carried float16)
delivered in the caller's dtype and type; nothing is lost (a rank's
results plus its share of the closing round add up to everyone's
contributions, within float16's rounding); integer data are not
compressed; a setting that differs between ranks fails on every rank.
"""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.eager import EagerAverager

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
KINDS = [(pc.SoloAllreduce, {}), (pc.MajorityAllreduce, {}),
         (pc.QuorumAllreduce, {"quorum": max(1, P // 2)})]
CALLS = 30


def is_float16_data(a):
    """Whether every element of the float array ``a`` is a float16 value."""
    a = np.asarray(a, np.float64)
    return np.array_equal(a.astype(np.float16).astype(np.float64), a)


def run_calls(ar, make, calls=CALLS):
    """``calls`` calls of ``ar`` with random small delays (so rounds carry
    late data), then its close; returns (sum of this rank's results in
    float64, sum of its contributions, the results' data)."""
    rng = random.Random(RANK)
    got, mine, seen = 0.0, 0.0, []
    for k in range(calls):
        time.sleep(rng.random() * 0.0004)
        x = make(k)
        res = ar(x)
        seen.append(res.data)
        got = got + np.asarray(res.data, np.float64)
        mine = mine + np.asarray(x, np.float64)
    res = ar.close()
    seen.append(res.data)
    return got + np.asarray(res.data, np.float64), mine, seen


@pytest.mark.parametrize("cls,kw", KINDS)
def test_float32_rounds_carry_float16_and_lose_nothing(cls, kw):
    n = 40
    gen = np.random.default_rng(RANK)
    data = [gen.standard_normal(n).astype(np.float32) for _ in range(CALLS)]
    ar = cls(np.zeros(n, np.float32), compression="fp16", **kw)
    assert ar.compression == "fp16" and ar.dtype == np.float32
    got, mine, seen = run_calls(ar, lambda k: data[k])
    for d in seen:
        assert d.dtype == np.float32 and d.shape == (n,)
        assert is_float16_data(d)
    total = COMM.allreduce(mine)
    scale = COMM.allreduce(sum(np.abs(d.astype(np.float64)) for d in data))
    # every contribution rounded once when deposited, and each sum it
    # takes part in (combining steps, carrying a late one) once more:
    # a loose bound, float16's 2^-11 per rounding times (P + 3) roundings
    tol = (P + 3) * 2.0 ** -11 * scale
    assert (np.abs(got - total) <= tol).all()
    # and the loss is real: float32 contributions do not survive float16
    assert not np.array_equal(got, total)


def test_compression_keeps_float64_and_tensor_types():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    with pc.SoloAllreduce(np.zeros(5), compression="fp16", sync_every=1) \
            as ar:
        res = ar(np.full(5, 1.0 + 2 ** -20))
        assert res.data.dtype == np.float64
        assert (res.data == P).all()            # 1 + 2^-20 -> 1 in float16
    t = torch.full((3,), 0.1)
    with pc.QuorumAllreduce(t, P, compression=pc.Compression.fp16) as ar:
        res = ar(t)
        assert isinstance(res.data, torch.Tensor)
        assert res.data.dtype == torch.float32
        want = np.float32(P * np.float16(0.1)) if P <= 2 else None
        assert is_float16_data(res.data.numpy())
        if want is not None:
            assert (res.data.numpy() == want).all()
    b = torch.full((4,), 3.0, dtype=torch.bfloat16)
    with pc.MajorityAllreduce(b, compression="fp16", sync_every=1) as ar:
        res = ar(b)
        assert res.data.dtype == torch.bfloat16
        assert (res.data.float().numpy() == 3 * P).all()


def test_integers_are_not_compressed():
    x = np.arange(6, dtype=np.int64) + 2 ** 40 * RANK     # beyond float16
    with pc.SoloAllreduce(x, compression="fp16", sync_every=1) as ar:
        assert ar.compression is None
        res = ar(x)
        assert res.data.dtype == np.int64
        assert np.array_equal(res.data, COMM.allreduce(x))


def test_bad_or_differing_compression_fails_everywhere():
    for like in (np.zeros(3, np.float32), np.zeros(3, np.int64)):
        with pytest.raises(pc.ScheduleError, match="unknown compression"):
            pc.SoloAllreduce(like, compression="int8")
    COMM.Barrier()
    if P == 1:
        return
    with pytest.raises(pc.ScheduleError, match="compression"):
        pc.SoloAllreduce(np.zeros(3, np.float32),
                         compression="fp16" if RANK else None)
    COMM.Barrier()


@pytest.mark.parametrize("mode", ["solo", "majority", 1])
def test_eager_averager_compresses_partial_modes(mode):
    """Sums (op="sum") in float32 that are float16 data, and over the steps
    and the closing flush every gradient is applied once."""
    shapes = [(20,), (3, 4)]
    gen = np.random.default_rng(RANK)
    applied = [np.zeros(s) for s in shapes]
    mine = [np.zeros(s) for s in shapes]
    rng = random.Random(RANK)
    with EagerAverager([(s, np.float32) for s in shapes], mode,
                       bucket_bytes=64 if mode == "solo" else None,
                       op="sum", compression="fp16") as avg:
        assert all(c.compression == "fp16"
                   for b in avg._buckets for c in b.colls)
        for _ in range(12):
            time.sleep(rng.random() * 0.0004)
            grads = [gen.standard_normal(s).astype(np.float32)
                     for s in shapes]
            out, _ = avg.reduce(grads)
            for a, o, m, g in zip(applied, out, mine, grads):
                assert o.dtype == np.float32
                assert is_float16_data(o)
                a += o
                m += g
        flushed = avg.flush()
    for a, f in zip(applied, flushed[0] if flushed else [0, 0]):
        a += f
    total = [COMM.allreduce(m) for m in mine]
    for a, t, m in zip(applied, total, mine):
        scale = COMM.allreduce(np.abs(m)).max()
        np.testing.assert_allclose(a, t, rtol=0,
                                   atol=(P + 3) * 2.0 ** -11 * 12 * scale)
