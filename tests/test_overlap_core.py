"""Overlap of communication with backward, the framework-agnostic
part: EagerAverager's step in parts (offer, reduce, abandon), at the
running comm size.  The torch side is in test_overlap.py."""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.eager import EagerAverager

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
QUORUM = max(1, P // 2)


# -- the averager's step in parts (NumPy) -------------------------------------
SHAPES = [(5, 3), (7,), (40,), (2, 2), (9,)]


def integer_grads(step):
    """Integer-valued gradients (sums are exact in any order)."""
    return [np.full(s, float((RANK + 1) * (k + 1) + step))
            for k, s in enumerate(SHAPES)]


def exact_average(step):
    return [np.full(s, sum((r + 1) * (k + 1) + step for r in range(P)) / P)
            for k, s in enumerate(SHAPES)]


def test_offers_in_any_order_start_buckets_in_bucket_order():
    """Sync: every rank hands over a different subset of gradients, in a
    different order, before reduce(); buckets still start in one order on
    every rank (else the allreduces would pair up wrongly) and the result
    is the exact average."""
    avg = EagerAverager([np.zeros(s) for s in SHAPES], mode="sync",
                        bucket_bytes=120, order=[4, 3, 2, 1, 0],
                        overlap=True)
    assert len(avg._buckets) >= 3
    assert [m[0] for m in avg._buckets[0].members] == [4, 3]
    rng = random.Random(RANK)
    early = 0
    for step in range(6):
        grads = integer_grads(step)
        some = rng.sample(range(len(SHAPES)), rng.randrange(len(SHAPES) + 1))
        for i in some:
            avg.offer(i, grads[i])
        assert avg.step_open == bool(some)
        early = avg.started_early
        out, info = avg.reduce([None if i in some else g
                                for i, g in enumerate(grads)])
        for o, w in zip(out, exact_average(step)):
            np.testing.assert_array_equal(o, w)
        assert info.active == P and not avg.step_open
    assert avg.stats()["started_early"] == early
    with pytest.raises(pc.ScheduleError, match="handed over twice"):
        avg.offer(0, integer_grads(0)[0])
        avg.offer(0, integer_grads(0)[0])
    avg.abandon()
    avg.close()
    plain = EagerAverager([np.zeros(3)], mode="sync")
    with pytest.raises(pc.ScheduleError, match="overlap=True"):
        plain.offer(0, np.zeros(3))
    plain.close()
    with pytest.raises(pc.ScheduleError, match="sync-mpi"):
        EagerAverager([np.zeros(3)], mode="sync-mpi", overlap=True)
    with pytest.raises(pc.ScheduleError, match="order must name"):
        EagerAverager([np.zeros(3), np.zeros(2)], order=[0, 0])


@pytest.mark.parametrize("mode", ["solo", "majority", QUORUM],
                         ids=["solo", "majority", "quorum"])
def test_abandoned_partial_steps_are_applied_exactly_once(mode):
    """A partial mode cannot take back a deposited gradient: an abandoned
    step's rounds are added to the next step (or flush).  Integer data,
    random skew, random abandons: the sum of everything applied on each
    rank is every rank's gradients over P, exactly."""
    kw = {"bucket_bytes": 120} if mode == "solo" else {}
    avg = EagerAverager([np.zeros(s) for s in SHAPES], mode=mode,
                        order=[4, 3, 2, 1, 0], overlap=True, **kw)
    rng = random.Random(10 + RANK)
    total = [np.zeros(s) for s in SHAPES]
    sent = [np.zeros(s) for s in SHAPES]
    n = 20
    for step in range(n):
        time.sleep(rng.random() * 0.002)
        grads = integer_grads(step)
        for i in range(len(SHAPES)):
            avg.offer(i, grads[i])
            sent[i] += grads[i]
        if rng.random() < 0.3:
            assert avg.abandon()
            continue
        out, info = avg.reduce([None] * len(SHAPES))
        for t, o in zip(total, out):
            t += o
    last = avg.close()
    if last is not None:
        for t, o in zip(total, last[0]):
            t += o
    for t, s in zip(total, sent):
        COMM.Allreduce(MPI.IN_PLACE, s)
        np.testing.assert_allclose(t, s / P, rtol=1e-12)
    assert avg.started_early >= n


def test_host_view_of_a_strided_tensor_is_a_contiguous_copy():
    """A transposed gradient (non-contiguous) reaches NumPy as a contiguous
    array with the same values, not a strided view."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from partialcoll.torch.params import host_view
    t = torch.arange(12.0).reshape(3, 4).t()
    a = host_view(t)
    assert a.flags["C_CONTIGUOUS"] and (a == t.numpy()).all()
