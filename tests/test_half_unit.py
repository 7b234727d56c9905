"""16-bit floats without MPI: the executor's float16 reductions against
NumPy's float16 arithmetic, on every float16 value."""
import numpy as np
from mpi4py import MPI

import partialcoll as pc

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16) \
    .view(np.float16)


def executor_reduce(a, b, op):
    s = pc.Schedule(MPI.COMM_SELF)
    out = a.copy()
    x, y = s.buffer(out), s.buffer(b.copy())
    s.reduce(x, y, op)
    s.post().wait()
    s.free()
    return out


def same_bits(x, y):
    """Equal bit for bit, any NaN matching any NaN."""
    nan = np.isnan(x)
    return np.array_equal(nan, np.isnan(y)) and \
        np.array_equal(x[~nan].view(np.uint16), y[~nan].view(np.uint16))


def test_float16_sum_and_prod_of_every_value_round_to_nearest_even():
    partners = [0.0, 1.0, -1.0, 0.5, 3.0, 1e-3, -6e-8, 65504.0, 2.0 ** -24,
                1.0009765625, -0.0]
    for p in partners:
        b = np.full(ALL_HALVES.size, p, np.float16)
        with np.errstate(over="ignore", invalid="ignore"):
            for op, ref in (("SUM", np.add), ("PROD", np.multiply)):
                assert same_bits(executor_reduce(ALL_HALVES, b, op),
                                 ref(ALL_HALVES, b)), (op, p)


def test_float16_scale_divides_and_rounds():
    s = pc.Schedule(MPI.COMM_SELF)
    x = np.array([1.0, 3.0, 65504.0, 2.0 ** -24], np.float16)
    buf = s.buffer(x)
    s.scale(buf, count_of=s.nop(), add=3)
    s.post().wait()
    s.free()
    want = (np.array([1.0, 3.0, 65504.0, 2.0 ** -24], np.float32) / 3) \
        .astype(np.float16)
    assert same_bits(x, want)
