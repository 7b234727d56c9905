"""Device buffers: allreduce, the partial collectives and hand-built
schedules on device memory, on both MPI paths (CUDA-aware and staged).

Every test runs on two backends:
* ``emulate`` -- host memory that the executor treats as device memory, with
  device work run late and a little at a time (always available);
* ``cupy`` -- real GPU buffers; skipped, with the reason, where CuPy or a GPU
  is missing.
"""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import devices, kernels
from partialcoll.collectives.algorithm import ALGORITHMS
from partialcoll.core.ops import OPS

# Framework wrappers over the collectives: their subject does not depend on
# P beyond what P = 1..5 cover, and at P = 8 (4 ranks per core) they cost a
# third of the CI run.
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
# dtypes CuPy has (no long double)
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "float16", "float32", "float64", "complex64",
          "complex128", "bool"]


def _cupy_or_skip():
    try:
        import cupy
    except ImportError:
        pytest.skip("CuPy is not installed (pip install 'partialcoll[cuda]'); "
                    "the GPU path is covered by the emulated device here")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:       # CUDA driver missing or no GPU
        pytest.skip(f"CuPy is installed but no GPU is usable ({e})")
    return cupy


class Emulated:
    name = "emulate"

    def to(self, x):
        return devices.emulated(x)

    def host(self, x):
        return np.asarray(x).view(np.ndarray)

    def is_device(self, x):
        return isinstance(x, devices.EmulatedArray)


class Cupy:
    name = "cupy"

    def __init__(self):
        self.cp = _cupy_or_skip()
        self.cp.cuda.Device(RANK % self.cp.cuda.runtime.getDeviceCount()).use()

    def to(self, x):
        return self.cp.asarray(x)

    def host(self, x):
        return self.cp.asnumpy(x)

    def is_device(self, x):
        return isinstance(x, self.cp.ndarray)


@pytest.fixture(params=["emulate", "cupy"])
def dev(request):
    return Emulated() if request.param == "emulate" else Cupy()


@pytest.fixture(params=["staged", "cuda-aware"])
def path(request, dev):
    if request.param == "cuda-aware" and dev.name == "cupy" and \
            not devices.mpi_cuda_aware():
        pytest.skip("this MPI is not CUDA-aware: device pointers would crash "
                    "it (PARTIALCOLL_GPU_PATH=cuda-aware forces it anyway)")
    devices.set_gpu_path(request.param)
    yield request.param
    devices.set_gpu_path(None)


def _values(dtype, n, seed):
    rng = np.random.default_rng(seed)
    v = rng.integers(1, 4, n)
    if dtype == "bool":
        return (v % 2).astype(bool)
    if dtype.startswith("complex"):
        return (v + 1j * rng.integers(-2, 3, n)).astype(dtype)
    return v.astype(dtype)


@pytest.mark.parametrize("through_host", [False, True],
                         ids=["device-reductions", "through-host"])
def test_allreduce_equals_numpy_every_op_and_dtype(dev, path, through_host,
                                                  monkeypatch):
    """Device results equal the host (NumPy) results bit for bit, for every
    op/dtype pair, and come back as device arrays: with the reductions on
    the device (every kernel), and through pinned host memory (the staged
    path's small messages)."""
    monkeypatch.setenv("PARTIALCOLL_GPU_HOST_BYTES",
                       str(1 << 20) if through_host else "0")
    checked = 0
    for op in OPS.values():
        for dt in DTYPES:
            if np.dtype(dt) not in op.dtypes:
                continue
            x = _values(dt, 37, 100 * RANK + op.code)
            # float16 reaches the executor's (device) float16 reductions
            # only compressed; plain, it is reduced in float32 (both below)
            for kw in ([{}, {"compression": "fp16"}] if dt == "float16"
                       else [{}]):
                want = pc.allreduce(x.copy(), op=op, **kw)
                got = pc.allreduce(dev.to(x), op=op, **kw)
                assert dev.is_device(got)
                assert np.array_equal(dev.host(got), want), (op, dt, kw)
            checked += 1
    assert checked == len(kernels.kernel_pairs()) == 102
    # and against NumPy directly
    x = np.arange(1000.0) * (RANK + 1)
    got = dev.host(pc.allreduce(dev.to(x)))
    assert np.array_equal(got, np.arange(1000.0) * P * (P + 1) / 2)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_algorithms_chunked_inplace_and_nonblocking(dev, path, algorithm,
                                                    monkeypatch):
    """Every algorithm, with staged messages cut into many 40-byte pieces
    (same peer and tag), in place and non-blocking (none reduced in host
    memory: that is the next test's)."""
    monkeypatch.setenv("PARTIALCOLL_GPU_CHUNK_BYTES", "40")
    monkeypatch.setenv("PARTIALCOLL_GPU_HOST_BYTES", "0")
    for n in (1, 5, 1001):
        x = np.arange(n, dtype=np.float64) + RANK
        want = pc.allreduce(x.copy(), algorithm=algorithm)
        d = dev.to(x)
        assert np.array_equal(
            dev.host(pc.allreduce(d, algorithm=algorithm)), want)
        req = pc.iallreduce(MPI.IN_PLACE, d, algorithm=algorithm)
        assert req.wait() is d
        assert np.array_equal(dev.host(d), want)
        out = dev.to(np.zeros(n))
        assert pc.iallreduce(dev.to(x), out, op=pc.MAX,
                             algorithm=algorithm).wait() is out
        assert np.array_equal(dev.host(out), np.arange(n) + P - 1.0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_small_staged_allreduce_is_reduced_on_the_host(dev, algorithm,
                                                      monkeypatch):
    """A staged allreduce of at most PARTIALCOLL_GPU_HOST_BYTES copies its
    input out once and the result back once and runs no device reduction;
    one byte over, every message is staged and reduced on the device.  The
    results are the host allreduce's, bit for bit, in place and not."""
    if P == 1:
        pytest.skip("one rank communicates nothing")
    devices.set_gpu_path("staged")
    try:
        for limit, n in ((8 * 1001, 1001), (8 * 1001 - 1, 1001), (None, 3)):
            if limit is None:
                monkeypatch.delenv("PARTIALCOLL_GPU_HOST_BYTES",
                                   raising=False)
            else:
                monkeypatch.setenv("PARTIALCOLL_GPU_HOST_BYTES", str(limit))
            mirrored = limit is None or limit >= 8 * n
            x = np.random.default_rng(RANK + n).standard_normal(n)
            want = pc.allreduce(x.copy(), algorithm=algorithm)
            for inplace in (False, True):
                before, sched = None, None
                for _ in range(2):      # the second call reuses the first's
                    d = dev.to(x)
                    req = (pc.iallreduce(MPI.IN_PLACE, d, algorithm=algorithm)
                           if inplace else
                           pc.iallreduce(d, algorithm=algorithm))
                    got = req.wait()
                    assert np.array_equal(dev.host(got), want)
                    if sched is None:
                        sched = req.schedule
                        before = dict(sched.device_stats)
                assert req.schedule is sched
                after = sched.device_stats
                moved = {k: after[k] - before.get(k, 0) for k in after}
                if mirrored:
                    assert moved["reductions"] == 0, moved
                    assert moved["d2h"] == moved["h2d"] == 8 * n, moved
                else:       # (a rank folded out reduces nothing)
                    assert COMM.allreduce(moved["reductions"]) > 0, moved
    finally:
        devices.set_gpu_path(None)


def test_small_blocking_allreduce_runs_on_the_calling_thread(dev, path):
    """On the staged path a blocking allreduce of at most
    PARTIALCOLL_GPU_HOST_BYTES builds no device schedule: the calling
    thread copies the input to pinned host memory, runs the host allreduce
    and copies the result back.  Same bits as the host's, in place and
    into a recvbuf; a larger one, or the CUDA-aware path, takes a device
    schedule."""
    from partialcoll.collectives.pool import POOL

    def device_schedule(count):     # a pooled schedule of count on dev
        return any(sig[1] == count and sig[5] and sig[5][0] == dev.name
                   for sig in POOL.signatures())

    n = 5003                        # a count no other test uses
    x = np.random.default_rng(RANK).standard_normal(n)
    want = pc.allreduce(x.copy())
    d = dev.to(x)
    out = dev.to(np.zeros(n))
    assert pc.allreduce(d, out) is out
    assert np.array_equal(dev.host(out), want)
    assert pc.allreduce(MPI.IN_PLACE, d) is d
    assert np.array_equal(dev.host(d), want)
    assert device_schedule(n) == (path != "staged" and P > 1)
    big = np.ones((256 << 10) // 8 + 1) * RANK
    got = dev.host(pc.allreduce(dev.to(big)))
    assert np.array_equal(got, np.ones(big.size) * P * (P - 1) / 2)
    assert device_schedule(big.size) == (P > 1)


def test_repeated_small_blocking_allreduce_skips_the_checks(dev,
                                                            monkeypatch):
    """A repeated staged call of one signature takes the short path: no
    argument preparation (mocked to fail here), the same bits, 2-D arrays
    and in place (the same array twice) too.  What the short path cannot
    vouch for (overlapping buffers, another dtype, the CUDA-aware path)
    goes the full way and gets its error or its device schedule."""
    from partialcoll.collectives import allreduce as ar
    devices.set_gpu_path("staged")
    try:
        n = 4007                    # a count no other test uses
        x = np.random.default_rng(RANK).standard_normal(n)
        want = pc.allreduce(x.copy())
        out = dev.to(np.zeros(n))
        pc.allreduce(dev.to(x), out)            # the full path, once
        calls = []
        real = ar.prepare_device
        monkeypatch.setattr(ar, "prepare_device",
                            lambda *a: calls.append(1) or real(*a))
        for _ in range(3):
            out = dev.to(np.zeros(n))
            assert pc.allreduce(dev.to(x), out) is out
            assert np.array_equal(dev.host(out), want)
        d = dev.to(x)
        assert pc.allreduce(d, d) is d
        assert np.array_equal(dev.host(d), want)
        assert calls == []
        m = x[:4006].reshape(2, 2003)           # 2-D: its first call full
        want2 = pc.allreduce(m.copy())
        for _ in range(2):
            got = pc.allreduce(dev.to(m), dev.to(np.zeros((2, 2003))))
            assert got.shape == (2, 2003)
            assert np.array_equal(dev.host(got), want2)
        assert calls == [1]
        both = dev.to(np.zeros(n + 1))
        with pytest.raises(pc.ScheduleError, match="overlap"):
            pc.allreduce(both[:n], both[1:])
        with pytest.raises(pc.ScheduleError, match="does not match"):
            pc.allreduce(dev.to(x), dev.to(np.zeros(n, np.float32)))
        assert len(calls) == 3
        # float16: compressed, it is reduced as it is (a mirror of float16
        # now exists); plain, it is widened to float32 and rounded once,
        # never the compressed call's short path (from 3 ranks on, rounding
        # at every step gives other bits: 1 + 2**-11 + 2**-11)
        h = np.where(np.arange(n) % P == RANK, 1.0, 2.0 ** -11)
        h = h.astype(np.float16)
        want_c = pc.allreduce(h.copy(), compression="fp16")
        for _ in range(2):
            got = pc.allreduce(dev.to(h), dev.to(np.zeros(n, np.float16)),
                               compression="fp16")
            assert np.array_equal(dev.host(got), want_c)
        want16 = pc.allreduce(h.copy())
        got = pc.allreduce(dev.to(h), dev.to(np.zeros(n, np.float16)))
        assert np.array_equal(dev.host(got), want16)
    finally:
        devices.set_gpu_path(None)


def _exchange(dev, n):
    """Two-by-two exchange-and-add on device buffers (hand-built)."""
    x = dev.to(np.arange(n, dtype=np.float32) + RANK)
    tmp = dev.to(np.zeros(n, np.float32))
    s = pc.Schedule(COMM)
    bx, bt = s.buffer(x), s.buffer(tmp)
    peer = RANK ^ 1
    f = s.fence()
    snd = s.send(bx, peer, after=[f])
    rcv = s.recv(bt, peer, after=[f])
    s.reduce(bx, bt, pc.SUM, after=[snd, rcv])
    s.post().wait()
    stats = s.device_stats
    s.free()
    return dev.host(x), stats


def test_copies_staged_and_none_when_cuda_aware(dev, path):
    """Staged: each message is copied device->host and host->device once;
    CUDA-aware: no host-device copy at all.  The reduction runs on the
    device queue either way."""
    if P % 2:
        pytest.skip("needs pairs of ranks")
    n = 1000
    got, st = _exchange(dev, n)
    want = 2 * np.arange(n, dtype=np.float32) + RANK + (RANK ^ 1)
    assert np.array_equal(got, want)
    assert st["reductions"] == 1
    if path == "staged":
        assert st["d2h"] == st["h2d"] == 4 * n
    else:
        assert st["d2h"] == st["h2d"] == 0


KINDS = [("solo", pc.SoloAllreduce, {}),
         ("majority", pc.MajorityAllreduce, {"seed": 3}),
         ("quorum", pc.QuorumAllreduce, {"quorum": max(1, P // 2)})]


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=[k[0] for k in KINDS])
def test_partial_device_exactly_once(dev, path, name, cls, kw):
    """Under random skew, with device buffers: every contribution of every
    rank arrives exactly once (int64, bit for bit), every result is a device
    array, and after close all ranks hold the same total."""
    rng = random.Random(RANK)
    vals = np.random.default_rng(RANK)
    ar = cls(dev.to(np.zeros((4, 5), np.int64)), **kw)
    got = np.zeros((4, 5), np.int64)
    mine = np.zeros((4, 5), np.int64)
    for _ in range(60):
        time.sleep(rng.random() * 0.001)
        x = vals.integers(-100, 100, (4, 5))
        mine += x
        res = ar(dev.to(x))
        assert dev.is_device(res.data) and res.data.shape == (4, 5)
        got += dev.host(res.data)
    st = ar._rounds.sched.device_stats
    got += dev.host(ar.close().data)
    total = np.empty_like(mine)
    COMM.Allreduce(mine, total)
    everyone = COMM.allgather(got)
    assert all(np.array_equal(g, total) for g in everyone)
    if P > 1:       # one rank sends no messages at all
        assert (st["d2h"] == st["h2d"] == 0) == (path == "cuda-aware")


def test_partial_function_form_and_recvbuf(dev, path):
    x = dev.to(np.ones(6))
    out = dev.to(np.zeros(6))
    res = pc.solo_allreduce(x, out)
    assert res.data is out and dev.is_device(out)
    assert dev.is_device(pc.solo_allreduce(x).data)
    pc.close_partials(COMM)     # the next module's forms are its own


def test_bad_input_is_refused(dev, path):
    x = dev.to(np.arange(8.0))
    with pytest.raises(pc.ScheduleError, match="both be device arrays"):
        pc.allreduce(x, np.zeros(8))
    with pytest.raises(pc.ScheduleError, match="both be device arrays"):
        pc.allreduce(np.zeros(8), dev.to(np.zeros(8)))
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(dev.to(np.zeros((4, 4)))[:, 1])
    with pytest.raises(pc.ScheduleError, match="does not match"):
        pc.allreduce(x, dev.to(np.zeros(7)))
    with pytest.raises(pc.ScheduleError, match="overlap"):
        big = dev.to(np.zeros(16))
        pc.allreduce(big[:8], big[4:12])
    ar = pc.SoloAllreduce(dev.to(np.zeros(8)))
    with pytest.raises(pc.ScheduleError, match="must be in"):
        ar(np.zeros(8))
    ar.close()
    host = pc.SoloAllreduce(np.zeros(8))
    with pytest.raises(pc.ScheduleError, match="must be in host memory"):
        host(x)
    host.close()
    s = pc.Schedule(COMM)
    a, b = s.buffer(x), s.buffer(np.zeros(8))
    with pytest.raises(pc.ScheduleError, match="cannot mix host and device"):
        s.reduce(a, b)
    with pytest.raises(pc.ScheduleError, match="host memory; got a device"):
        s.bind(b, dev.to(np.zeros(8)))
    s.free()
    # the data is untouched by all this
    assert np.array_equal(dev.host(x), np.arange(8.0))


def test_gpu_path_setting():
    auto = "cuda-aware" if devices.mpi_cuda_aware() else "staged"
    devices.set_gpu_path("auto")
    try:
        assert devices.gpu_path() == auto
        with pytest.raises(pc.ScheduleError, match="gpu path must be"):
            devices.set_gpu_path("fast")
        for p in ("staged", "cuda-aware"):
            devices.set_gpu_path(p)
            assert devices.gpu_path() == p
            s = pc.Schedule(COMM)
            s.buffer(devices.emulated(np.zeros(2)))
            assert s.gpu_path == p
            s.free()
    finally:
        devices.set_gpu_path(None)


@pytest.mark.parametrize("mode", ["solo", "majority", 2, "sync", "sync-mpi"])
def test_eager_averager_on_device(dev, path, mode):
    """eager-SGD's core with device gradients: averages come back as device
    arrays, and over the run (flush included) every rank applies exactly the
    sum of all ranks' gradients divided by P."""
    from partialcoll.eager.core import EagerAverager
    if mode == 2 and P < 2:
        mode = 1
    templates = [dev.to(np.zeros((3, 2))), dev.to(np.zeros(5, np.float32))]
    avg = EagerAverager(templates, mode=mode)
    rng = random.Random(RANK)
    applied = [np.zeros((3, 2)), np.zeros(5)]
    mine = [np.zeros((3, 2)), np.zeros(5)]
    for step in range(30):
        time.sleep(rng.random() * 0.001)
        g = [np.full((3, 2), RANK + step, np.float64),
             np.arange(5, dtype=np.float32) * (RANK + 1)]
        mine = [m + x for m, x in zip(mine, g)]
        out, info = avg.reduce([dev.to(x) for x in g])
        assert all(dev.is_device(o) for o in out)
        applied = [a + dev.host(o) for a, o in zip(applied, out)]
    final = avg.close()
    if final is not None:
        applied = [a + dev.host(o) for a, o in zip(applied, final[0])]
    for a, m in zip(applied, mine):
        total = np.empty_like(m)
        COMM.Allreduce(m, total)
        assert np.allclose(a, total / P, rtol=1e-6)
    with pytest.raises(pc.ScheduleError, match="mix host and device"):
        EagerAverager([dev.to(np.zeros(2)), np.zeros(2)])
