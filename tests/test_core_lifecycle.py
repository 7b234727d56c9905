"""Executor lifecycle hardening: freeing and failing with sends in flight,
freeing while another thread waits, the data lock, error reports.

The crash-prone cases run as separate mpiexec jobs (a crash must fail the
test, not kill the test run)."""
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll import _core

CLEAN_ERR = ("leak", "pending", "Warning", "WARNING", "Abort", "Assertion",
             "Segmentation", "AddressSanitizer")


def assert_clean(rc, out, err, n, word="ok"):
    assert rc == 0, err[-3000:]
    assert out.count(word) == n, out
    for w in CLEAN_ERR:
        assert w not in err, err[-3000:]


FREE_WITH_SENDS = """
import time, numpy as np, partialcoll as pc
from mpi4py import MPI
comm = MPI.COMM_WORLD.Dup()
P, r = comm.size, comm.rank
n = 1 << 17                         # 1 MiB of float64: rendezvous size
big = [np.full(n, 10.0 * r + k) for k in (1, 2)]
s = pc.Schedule(comm)
for k, b in enumerate(big):
    s.send(s.buffer(b, writable=False), (r + 1) % P, tag=k + 1)
s.post()
s.test()                            # the progress thread starts the round
time.sleep(0.2)                     # (rendezvous: they cannot complete yet)
s.free()                            # both sends in flight: never cancelled
del big, b                          # the schedule keeps what MPI still reads
time.sleep(0.2)
got = [np.zeros(n), np.zeros(n)]
t = pc.Schedule(comm)
for k, g in enumerate(got):
    t.recv(t.buffer(g), (r - 1) % P, tag=k + 1)
t.post().wait(timeout=30)
left = (r - 1) % P
assert all((g == 10.0 * left + k + 1).all() for k, g in enumerate(got)), got
t.free()
comm.Barrier()
t0 = time.monotonic()               # the progress thread notices the sends'
while pc._core.reap() and time.monotonic() - t0 < 10:   # completion soon
    time.sleep(0.01)
assert pc._core.reap() == 0         # every parked buffer was released
print("ok", flush=True)
"""


@pytest.mark.parametrize("n", [1, 2, 3])
def test_free_with_large_sends_in_flight(mpi_script, n):
    """Freeing a schedule whose rendezvous-size sends are in flight lets
    them complete (MPICH crashes when sends are cancelled) and keeps their
    buffers until they have."""
    assert_clean(*mpi_script(FREE_WITH_SENDS, n=n, timeout=90)[:3], n)


ERROR_WITH_SENDS = """
import numpy as np, partialcoll as pc
from mpi4py import MPI
comm = MPI.COMM_WORLD.Dup()
P, r = comm.size, comm.rank
n = 1 << 17
s = pc.Schedule(comm)
out = [np.ones(n), np.ones(n)]
for k, b in enumerate(out):
    s.send(s.buffer(b, writable=False), (r + 1) % P, tag=k + 1)
s.recv(s.buffer(np.zeros(n)), (r - 1) % P, tag=1)
s.recv(s.buffer(np.zeros(n // 2)), (r - 1) % P, tag=2)    # truncated
try:
    s.post().wait(timeout=30)
except pc.TransportError as e:
    msg = str(e)
    for word in ("truncated", "recv", f"rank {(r - 1) % P}", "tag 2",
                 "round 0", "op 3"):
        assert word in msg, (word, msg)
    print("ok", flush=True)
s.free()
comm.Barrier()
"""


@pytest.mark.parametrize("n", [1, 2, 3])
def test_mpi_error_with_large_sends_in_flight(mpi_script, n):
    """An MPI error in a round with large sends in flight: wait() raises a
    TransportError naming the MPI error, op, kind, peer and tag; nothing
    crashes at free or exit."""
    assert_clean(*mpi_script(ERROR_WITH_SENDS, n=n, timeout=90)[:3], n)


EXIT_WHILE_DAEMON_WAITS = """
import threading, numpy as np, partialcoll as pc
from mpi4py import MPI
s = pc.Schedule(MPI.COMM_SELF)
s.recv(s.buffer(np.zeros(4)), peer=0, tag=3)   # never satisfied
req = s.post()
def waiter():
    try:
        req.wait()
    except pc.ScheduleFreedError:
        pass
threading.Thread(target=waiter, daemon=True).start()
print("ok", flush=True)
"""


def test_interpreter_exit_while_a_daemon_thread_waits(mpi_script):
    assert_clean(*mpi_script(EXIT_WHILE_DAEMON_WAITS, n=1, timeout=60)[:3], 1)


def test_free_while_another_thread_waits():
    s = pc.Schedule(MPI.COMM_SELF)
    s.recv(s.buffer(np.zeros(4)), peer=0, tag=3)    # never satisfied
    req = s.post()
    seen = []

    def waiter():
        try:
            req.wait(timeout=30)
        except pc.ScheduleFreedError as e:
            seen.append(str(e))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    s.free()
    t.join(10)
    assert not t.is_alive()
    assert seen and "freed" in seen[0]


def locked_counter():
    """A persistent schedule: trigger -> locked reduce acc += 1."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=True)
    acc, one = np.zeros(1, np.int64), np.ones(1, np.int64)
    a, o = s.buffer(acc), s.buffer(one, writable=False)
    t = s.trigger()
    s.reduce(a, o, after=[t], locked=True)
    s.post()
    return s, t, acc


def test_application_lock_does_not_stall_other_schedules():
    s, t, acc = locked_counter()
    with s.data_lock():
        s.fire(t)                   # its locked op must wait for us ...
        other = pc.Schedule(MPI.COMM_SELF)
        x, y = np.arange(3.0), np.zeros(3)
        other.send(other.buffer(x, writable=False), 0, tag=1)
        other.recv(other.buffer(y), 0, tag=1)
        other.post().wait(timeout=5)     # ... but nothing else does
        assert (y == x).all()
        assert acc[0] == 0 and s.rounds == 0
        with pytest.raises(pc.ScheduleError, match="data lock"):
            s.wait(round=0, timeout=1)   # would deadlock: refused at once
    s.wait(round=0, timeout=5)
    assert acc[0] == 1
    other.free()
    s.free()


def test_lock_misuse_is_refused():
    s, t, acc = locked_counter()
    with pytest.raises(pc.ScheduleError, match="without lock"):
        s._core_sched().unlock()
    with s.data_lock():
        with pytest.raises(pc.ScheduleError, match="already holds"):
            s._core_sched().lock()
    s.free()


def test_allocation_failure_on_the_progress_path_is_reported():
    """An allocation that fails while a round runs fails that round with
    an error wait() raises; it never leaves the round hanging."""
    s = pc.Schedule(MPI.COMM_SELF)
    bufs = [np.zeros(1) for _ in range(4)]
    for k, b in enumerate(bufs):
        s.recv(s.buffer(b), 0, tag=k)
    _core.inject_alloc_failure(2)   # the third allocation fails
    try:
        with pytest.raises(MemoryError, match="out of memory"):
            s.post().wait(timeout=10)
    finally:
        _core.inject_alloc_failure(-1)
    s.free()


def test_idle_persistent_schedules_post_nothing():
    """Cost follows work: 300 idle schedules waiting for stamped
    activations share the control receive on their communicator (one per
    rank of it: COMM_SELF has one)."""
    comm = MPI.COMM_SELF.Dup()
    before = _core.engine_stats()["outstanding"]
    scheds = []
    for k in range(300):
        s = pc.Schedule(comm, persistent=True, stamp_id=1000 + k)
        trig = s.trigger(optional=True)
        r = s.recv(peer=0, tag=5, stamped=True, optional=True)
        s.send(peer=0, tag=5, stamped=True, optional=True, after=[trig])
        s.nop(after=[trig, r], mode=pc.ANY)
        s.post()
        scheds.append((s, trig))
    deadline = time.monotonic() + 5
    while _core.engine_stats()["outstanding"] != before + 1 and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert _core.engine_stats()["outstanding"] == before + 1
    s, trig = scheds[123]                          # one of them runs
    s.fire(trig, round=0)
    s.wait(round=0, timeout=5)
    assert all(x.rounds == 0 for x, _ in scheds if x is not s)
    for x, _ in scheds:
        x.free()
    assert _core.engine_stats()["outstanding"] == before
    comm.Free()
