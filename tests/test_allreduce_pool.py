"""allreduce's schedule pool: busy schedules, bounded size, no user array
kept alive."""
import gc
import time
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.collectives import pool as pool_module

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P = COMM.size


def test_iallreduce_then_allreduce_of_the_same_signature():
    """Legal in MPI; the cached fast path ran its busy schedule and raised
    ScheduleBusyError."""
    x = np.arange(5.0)
    pc.allreduce(x, np.empty(5))                 # caches the fast path
    out1 = np.empty(5)
    if COMM.rank == 0:
        time.sleep(0.05)         # the others' iallreduce is still running
    req = pc.iallreduce(x, out1)
    if COMM.rank == 0:           # idle here, busy elsewhere: both paths
        req.wait()
    out2 = pc.allreduce(x, np.empty(5))          # same size, dtype and op
    assert np.array_equal(out2, x * P)
    assert np.array_equal(req.wait(), x * P) and req.wait() is out1
    assert req.test()


def rss_kib():
    import resource
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


@pytest.mark.max_ranks(4)
def test_pool_stays_bounded_over_1000_distinct_sizes():
    for n in range(1, 201):
        pc.allreduce(np.ones(n))
    before = rss_kib()
    for n in range(201, 1001):
        assert pc.allreduce(np.ones(n))[n - 1] == P
        if n % 2:
            assert pc.iallreduce(np.ones(n)).wait()[0] == P
    grown = rss_kib() - before
    count, nbytes = pool_module.pool_size()
    assert count <= pool_module.POOL_SCHEDULES
    assert nbytes <= pool_module.pool_budget()
    assert grown < 3 * 1024, f"RSS grew by {grown} KiB over 800 sizes"


def test_pool_trims_to_the_byte_budget(monkeypatch):
    monkeypatch.setattr(pool_module, "pool_budget", lambda: 64 * 1024)
    for n in (3000, 3001, 3002, 3003, 3004):          # 24 KiB temp each
        pc.allreduce(np.ones(n))
    assert pool_module.pool_size()[1] <= 64 * 1024
    pc.allreduce(np.ones(20000))      # alone over budget: the newest stays
    assert pool_module.pool_size()[0] == (1 if P > 1 else 0)


@pytest.mark.max_ranks(4)
@pytest.mark.parametrize("inplace", [False, True])
def test_no_user_array_is_kept_alive(inplace):
    def gone(make_call):
        x = np.ones(1000)
        ref = weakref.ref(x)
        out = make_call(x)
        assert out[0] == P
        del x, out
        gc.collect()
        return ref() is None
    if inplace:
        assert gone(lambda x: pc.allreduce(x, x))
        assert gone(lambda x: pc.allreduce(MPI.IN_PLACE, x))
        assert gone(lambda x: pc.iallreduce(x, x).wait())
    else:
        assert gone(lambda x: pc.allreduce(x))
        assert gone(lambda x: pc.allreduce(x, np.empty_like(x)))
        assert gone(lambda x: pc.allreduce(x, np.empty_like(x)))  # fast path
        assert gone(lambda x: pc.iallreduce(x).wait())
    out = np.empty(1000)
    ref = weakref.ref(out)
    req = pc.iallreduce(np.ones(1000), out)
    req.wait()
    del out
    gc.collect()
    assert ref() is not None           # the request returns it from wait()
    del req
    gc.collect()
    assert ref() is None
