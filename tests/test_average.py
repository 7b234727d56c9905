"""The average as an allreduce op: ``op="avg"`` (or ``"average"``, or
``torch.distributed.ReduceOp.AVG``) gives the sum over the ranks divided by
their number, blocking and not, in place or not; 16-bit floats rounded
once; integers refused on every rank before anything is sent; and
torch.distributed's other ReduceOp members taken as their reductions."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core.arrays import FLOAT16

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def mine(n=7, dtype=np.float64):
    return (np.arange(n) * 0.25 + RANK).astype(dtype)


def want(n=7, dtype=np.float64):
    total = sum((np.arange(n) * 0.25 + r) for r in range(P))
    return (total / P).astype(dtype)


@pytest.mark.parametrize("op", ["avg", "AVG", "average"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_average_of_floats(op, dtype):
    x = mine(dtype=dtype)
    np.testing.assert_allclose(pc.allreduce(x, op=op), want(dtype=dtype),
                               rtol=1e-6)
    np.testing.assert_allclose(pc.iallreduce(x, op=op).wait(),
                               want(dtype=dtype), rtol=1e-6)
    assert np.array_equal(x, mine(dtype=dtype))     # not modified


def test_average_in_place_and_into_recvbuf():
    y = mine()
    assert pc.allreduce(MPI.IN_PLACE, y, op="avg") is y
    np.testing.assert_allclose(y, want())
    out = np.empty(7)
    pc.allreduce(mine(), out, op="avg")
    np.testing.assert_allclose(out, want())
    req = pc.iallreduce(mine(), out, op="avg")
    assert req.wait() is out
    np.testing.assert_allclose(out, want())


def test_float16_average_is_rounded_once():
    """The float32 sum divided in float32, then rounded to float16: not the
    float16 sum (rounded) divided again."""
    x = (np.arange(64) * 0.013 + RANK / 3).astype(FLOAT16)
    total = pc.allreduce(x.astype(np.float32))
    assert np.array_equal(pc.allreduce(x, op="avg"),
                          (total / np.float32(P)).astype(FLOAT16))


def test_integers_are_refused_on_every_rank():
    with pytest.raises(pc.ScheduleError, match="the average needs "
                                               "floating-point"):
        pc.allreduce(np.arange(4), op="avg")
    # nothing was left half done: the next call is exact
    assert np.array_equal(pc.allreduce(np.arange(4)), np.arange(4) * P)


def test_the_average_is_not_an_op_of_the_partial_collectives():
    with pytest.raises(pc.ScheduleError, match="allreduce and iallreduce "
                                               "only"):
        pc.as_op("avg")


def test_torch_reduce_ops():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    t = torch.arange(5, dtype=torch.float32) + RANK
    got = pc.allreduce(t, op=dist.ReduceOp.AVG)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), np.arange(5) + (P - 1) / 2)
    assert torch.equal(pc.allreduce(t, op=dist.ReduceOp.MAX),
                       torch.arange(5, dtype=torch.float32) + P - 1)
    assert torch.equal(pc.allreduce(t, op=dist.ReduceOp.SUM),
                       pc.allreduce(t, op=pc.SUM))
    assert pc.as_op(dist.ReduceOp.PRODUCT) is pc.PROD
    with pytest.raises(pc.ScheduleError, match="unknown reduction"):
        pc.as_op(dist.ReduceOp.PREMUL_SUM)
