"""16-bit floats and tensors without MPI: the executor's float16
reductions against NumPy's float16 arithmetic on every float16 value; the
rounding to bfloat16/float16 against torch's; reading and writing tensors
through DLPack."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import arrays

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


# ------------------------------------------- conversions and tensors (no MPI)
def _float32_patterns():
    """Random float32 bit patterns, plus the edges of the rounding: every
    bfloat16 tie (low 16 bits 0x8000) and its neighbours, NaNs,
    infinities, subnormals, zeros."""
    rng = np.random.default_rng(7)
    u = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    hi = rng.integers(0, 1 << 16, 4096, dtype=np.uint64).astype(np.uint32)
    edges = np.concatenate([(hi << 16) | low for low in
                            (0x8000, 0x7FFF, 0x8001, 0, 0xFFFF)])
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                        0xFFC00001, 0x7F800001, 0x00000001, 0x807FFFFF,
                        0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF, 0x477FF000,
                        0x477FEFFF, 0x33000000, 0x33000001],
                       np.uint64).astype(np.uint32)
    return np.concatenate([u, edges.astype(np.uint32), special])


def test_bfloat16_rounding_is_torchs():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    f = _float32_patterns().view(np.float32)
    got = arrays.narrow(f, arrays.BFLOAT16)
    want = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy()
    nan = np.isnan(f)           # any NaN stays a NaN (payloads may differ)
    assert np.array_equal(got.view(np.int16)[~nan], want[~nan])
    assert ((got[nan] & 0x7FFF) > 0x7F80).all()
    # widening back is exact on every bfloat16 value
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    wide = arrays.widen(every, arrays.BFLOAT16)
    want = torch.from_numpy(every.view(np.int16)).view(torch.bfloat16) \
        .float().numpy()
    assert np.array_equal(wide.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(arrays.narrow(wide, arrays.BFLOAT16)[
        ~np.isnan(wide)], every[~np.isnan(wide)])


def test_float16_rounding_is_torchs():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    f = _float32_patterns().view(np.float32)
    got = arrays.narrow(f, arrays.FLOAT16)
    want = torch.from_numpy(f).to(torch.float16).numpy()
    assert same_bits(got, want)


def test_bfloat16_tensors_are_read_and_written_in_place():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    data = arrays.ingest(t)
    assert data.dtype == arrays.BFLOAT16 and data.dtype == "bfloat16"
    assert data.array.dtype == np.uint16 and data.shape == (3, 4)
    assert data.array.ctypes.data == t.data_ptr()
    data.array[1, 2] = 0x3F80                  # bfloat16 1.0
    assert t[1, 2].item() == 1.0
    obj, storage = data.kind.new((2, 5))
    assert obj.dtype == torch.bfloat16 and obj.shape == (2, 5)
    assert storage.ctypes.data == obj.data_ptr()
    del data, storage
    assert t.sum().item() == sum(range(12)) - 6 + 1     # still alive, intact
    for bad in (t.t(), t[:, ::2]):
        with pytest.raises(pc.ScheduleError, match="C-contiguous"):
            arrays.ingest(bad)
    assert arrays.ingest(torch.zeros(0, dtype=torch.bfloat16)).array.size == 0
    assert arrays.ingest(t[1:]).array.ctypes.data == t[1:].data_ptr()


def test_results_are_of_the_callers_type():
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    t = torch.ones(3, dtype=torch.float64)
    data = arrays.ingest(t)
    assert data.array.ctypes.data == t.data_ptr()       # zero-copy
    a = np.arange(3.0)
    wrapped = data.kind.wrap(a)
    assert isinstance(wrapped, torch.Tensor) and wrapped.data_ptr() == \
        a.ctypes.data
    half = arrays.deliver(np.float32([1, 2, 3]), arrays.BFLOAT16,
                           arrays.ingest(t.to(torch.bfloat16)).kind)
    assert half.dtype == torch.bfloat16 and half.tolist() == [1, 2, 3]
    assert arrays.deliver(a, a.dtype, arrays.ARRAY) is a
    assert arrays.ingest(bytearray(8)).array.dtype == np.uint8

    class NoNamespace:                  # a DLPack exporter of unknown type
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    data = arrays.ingest(NoNamespace(a))
    assert data.kind is arrays.ARRAY and data.array.ctypes.data == \
        a.ctypes.data
