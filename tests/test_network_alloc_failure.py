"""Allocation failures inside the emulated network (csrc/transport/netem*.c)
fail the round or leave it alone; they never lose a message's completion.

The allocation-failure injection makes the n-th allocation on the progress
path fail, and every one after it until it is reset.  Once the network had
taken a message, a failure in one of its own tables used to drop the
message's completion (or leave the message stuck in the model): its send
never completed and the round hung.  It now makes room for a message's
completion before it takes the message, where a failure is the start's
own error.  Runs as its own mpiexec job (fresh allocation counts)."""

JOB = """
import time, numpy as np, partialcoll as pc
from partialcoll import _core
from mpi4py import MPI
comm = MPI.COMM_WORLD
P, r = comm.size, comm.rank
seen = set()
for n in range(40):                    # every allocation a round makes
    pc.network.enable({"default": {"out_rate": "1 GB/s"}})
    c = comm.Dup()
    s = pc.Schedule(c)
    x, y = np.ones(4), np.zeros(4)
    s.send(s.buffer(x, writable=False), (r + 1) % P, tag=1)
    s.recv(s.buffer(y), (r - 1) % P, tag=1)
    _core.inject_alloc_failure(n)
    try:
        s.post().wait(timeout=10)      # a lost completion: WaitTimeout
        seen.add("ok")
    except MemoryError as e:
        assert "out of memory" in str(e), e
        seen.add("out of memory")
    finally:
        _core.inject_alloc_failure(-1)
    s.free()
    t0 = time.monotonic()              # every send completed: nothing parked
    while _core.reap() and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    assert _core.reap() == 0, n
    pc.network.disable()
    c.Free()
assert seen == {"ok", "out of memory"}, seen
print("ok", flush=True)
"""


def test_allocation_failures_in_the_network_never_hang_a_round(mpi_script):
    rc, out, err, _ = mpi_script(JOB, n=2, timeout=120)
    assert rc == 0, err[-3000:]
    assert out.count("ok") == 2, out
