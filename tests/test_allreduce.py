"""allreduce/iallreduce against comm.Allreduce, for every dtype/op pair,
several sizes (0, 1, odd, large), both algorithms, at the running comm size.
Run under ``mpiexec -n N python -m pytest --with-mpi``."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.collectives.algorithm import ALGORITHMS

pytestmark = pytest.mark.mpi

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
        np.uint32, np.uint64]
FLOATS = [np.float32, np.float64]
COMPLEX = [np.complex64, np.complex128]
PAIRS = ([(op, t) for op in ("SUM", "PROD", "MIN", "MAX") for t in INTS + FLOATS]
         + [(op, t) for op in ("SUM", "PROD") for t in COMPLEX]
         + [(op, t) for op in ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")
            for t in INTS])
SIZES = [0, 1, 7, 1000]


def data(dtype, n, rank, op):
    rng = np.random.default_rng(1000 + rank)
    dtype = np.dtype(dtype)
    if op == "PROD":          # small values so products stay exact-ish
        x = rng.integers(1, 3, n)
    elif dtype.kind in "iu":
        x = rng.integers(0, 100, n)
    else:
        x = rng.standard_normal(n)
    x = x.astype(dtype)
    if dtype.kind == "c":
        x = x + 1j * x[::-1].astype(dtype).real
    return np.ascontiguousarray(x.astype(dtype))


def check(res, ref, dtype):
    if np.dtype(dtype).kind in "fc":
        single = dtype in (np.float32, np.complex64)
        # values are O(1) per rank: sums of P of them cancel to near zero in
        # an order that differs from MPICH's, hence an absolute tolerance too
        np.testing.assert_allclose(res, ref, rtol=1e-4 if single else 1e-10,
                                   atol=(1e-5 if single else 1e-12) *
                                   MPI.COMM_WORLD.size)
    else:
        np.testing.assert_array_equal(res, ref)


@pytest.mark.parametrize("opname,dtype", PAIRS,
                         ids=[f"{o}-{np.dtype(t).name}" for o, t in PAIRS])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_mpi_allreduce(opname, dtype, algorithm):
    comm = MPI.COMM_WORLD
    for n in SIZES:
        x = data(dtype, n, comm.rank, opname)
        ref = np.empty_like(x)
        comm.Allreduce(x, ref, op=getattr(MPI, opname))
        res = pc.allreduce(x, op=getattr(pc, opname), algorithm=algorithm)
        check(res, ref, dtype)
        # the result is the same bits on every rank
        allres = comm.allgather(res.tobytes())
        assert all(r == allres[0] for r in allres)


def test_bool_logical_and_bitwise():
    comm = MPI.COMM_WORLD
    x = np.array([comm.rank % 2 == 0, True, False, comm.rank == 0])
    for opname, f in [("LAND", np.logical_and), ("LOR", np.logical_or),
                      ("BAND", np.logical_and), ("BXOR", np.logical_xor)]:
        allx = comm.allgather(x)
        ref = allx[0].copy()
        for y in allx[1:]:
            ref = f(ref, y)
        assert list(pc.allreduce(x, op=getattr(pc, opname))) == list(ref)


def test_large_message_both_algorithms():
    comm = MPI.COMM_WORLD
    x = np.arange(300_001, dtype=np.float64) * (comm.rank + 1)
    ref = np.empty_like(x)
    comm.Allreduce(x, ref)
    for algo in ALGORITHMS:
        check(pc.allreduce(x, algorithm=algo), ref, np.float64)


def test_in_place_and_buffer_forms():
    comm = MPI.COMM_WORLD
    P = comm.size
    x = np.full(5, comm.rank, dtype=np.int64)
    out = pc.allreduce(x, x)                 # recvbuf is sendbuf
    assert out is x and list(x) == [P * (P - 1) // 2] * 5
    y = np.ones(3, np.float32)
    pc.allreduce(MPI.IN_PLACE, y)
    assert list(y) == [P] * 3
    buf = bytearray(np.ones(4, np.float64).tobytes())
    r = pc.allreduce([buf, MPI.DOUBLE])      # mpi4py buffer spec
    assert list(r) == [P] * 4
    r = pc.allreduce(memoryview(np.ones(2, np.int32)), op=MPI.SUM)
    assert list(r) == [P, P]
    r = pc.allreduce(np.float64(comm.rank).reshape(1), op=pc.MAX)
    assert r[0] == P - 1


def test_repeated_calls_of_a_signature_check_and_reduce_each_call():
    """The second and later calls of a signature take the cached plan (at
    one rank a copy): each still reduces its own data, in place or not,
    into a receive buffer of another shape, and refuses what the first
    call refuses, leaving the receive buffer as it was."""
    comm = MPI.COMM_WORLD
    P = comm.size
    total = P * (P - 1) // 2
    out = np.empty(4)
    for step in range(4):
        x = np.arange(4.0) + comm.rank + step
        assert pc.allreduce(x, out) is out
        np.testing.assert_array_equal(out, P * (np.arange(4.0) + step) +
                                      total)
        assert pc.allreduce(x, x) is x
        np.testing.assert_array_equal(x, out)
        y = np.arange(4.0) + comm.rank + step
        assert pc.allreduce(MPI.IN_PLACE, y) is y
        np.testing.assert_array_equal(y, out)
    square = np.empty((2, 2))
    pc.allreduce(np.full(4, 1.0 + comm.rank), square)
    np.testing.assert_array_equal(square, np.full((2, 2), P + total))
    wide = np.arange(8.0)
    before = out.copy()
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(wide[::2], out)
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(np.ones(4), wide[::2])
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only|writable"):
        pc.allreduce(np.ones(4), frozen)
    assert not frozen.any()
    with pytest.raises(pc.ScheduleError, match="overlap"):
        pc.allreduce(wide[:4], wide[2:6])
    for other in (np.zeros(4, np.int64), np.zeros(4, ">f8"), np.zeros(5),
                  np.zeros(4, np.float32)):
        with pytest.raises(pc.ScheduleError, match="does not match"):
            pc.allreduce(np.ones(4), other)
        assert not other.any()
    np.testing.assert_array_equal(out, before)
    np.testing.assert_array_equal(wide, np.arange(8.0))


def test_iallreduce_many_outstanding():
    comm = MPI.COMM_WORLD
    xs = [np.full(17 + i, i + comm.rank, np.int64) for i in range(20)]
    reqs = [pc.iallreduce(x) for x in xs]
    for i, req in enumerate(reqs[::-1]):
        i = len(reqs) - 1 - i
        res = req.wait(timeout=30)
        assert (res == comm.size * i + comm.size * (comm.size - 1) // 2).all()


def test_user_traffic_does_not_match_library_traffic():
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        pytest.skip("needs two ranks")
    peer = (comm.rank + 1) % comm.size
    src = (comm.rank - 1) % comm.size
    r = comm.irecv(source=src, tag=1)          # tag 1 is used by the library too
    res = pc.allreduce(np.ones(4))
    comm.send("hello", dest=peer, tag=1)
    assert r.wait() == "hello" and (res == comm.size).all()


def test_bad_input_raises_clear_errors():
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(np.zeros(10)[::2])
    with pytest.raises(pc.ScheduleError, match="does not match"):
        pc.allreduce(np.zeros(3), np.zeros(4))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only"):
        pc.allreduce(np.zeros(3), ro)
    with pytest.raises(pc.ScheduleError, match="not defined"):
        pc.allreduce(np.zeros(3, np.complex128), op=pc.MAX)
    with pytest.raises(pc.ScheduleError, match="unknown allreduce algorithm"):
        pc.allreduce(np.zeros(3), algorithm="magic")
    with pytest.raises(pc.ScheduleError):
        pc.allreduce("not a buffer")
