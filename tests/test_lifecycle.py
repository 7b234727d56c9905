"""Process-level behaviour: exit with a posted schedule, thread level."""
import pytest

EXIT_WITH_POSTED = """
import numpy as np, partialcoll as pc
from mpi4py import MPI
comm = MPI.COMM_WORLD
s = pc.Schedule(comm.Dup(), persistent=True)
t = s.trigger(optional=True)
r = s.recv(peer=(comm.rank + 1) % comm.size, tag=1, stamped=True, optional=True)
s.nop(after=[t, r], mode=pc.ANY)
s.post()
x = pc.iallreduce(np.ones(1000))     # one in flight as well
x.wait()
pending = pc.Schedule(comm.Dup())
pending.recv(pending.buffer(np.zeros(3)), peer=0, tag=77)
pending.post()                        # never satisfied
print("exiting", comm.rank, flush=True)
"""


@pytest.mark.parametrize("n", [1, 2, 3])
def test_exit_with_posted_schedules_is_prompt_and_clean(mpi_script, n):
    rc, out, err, secs = mpi_script(EXIT_WITH_POSTED, n=n, timeout=60)
    assert rc == 0, err
    assert out.count("exiting") == n
    assert secs < 30
    for word in ("leak", "pending", "Warning", "WARNING", "Abort"):
        assert word not in err, err


THREAD_LEVEL = """
import mpi4py
mpi4py.rc.thread_level = "single"
import numpy as np, partialcoll as pc
try:
    pc.allreduce(np.ones(2))
except pc.ThreadLevelError as e:
    print("refused:", e)
"""


def test_thread_level_below_multiple_is_refused(mpi_script):
    rc, out, err, _ = mpi_script(THREAD_LEVEL, n=1)
    assert rc == 0, err
    assert "refused:" in out and "MPI_THREAD_MULTIPLE" in out


EXIT_WITH_ROUNDS_IN_FLIGHT = """
import time, numpy as np, partialcoll as pc
from mpi4py import MPI
rank = MPI.COMM_WORLD.rank
solo = pc.SoloAllreduce(np.zeros(10000))
maj = pc.MajorityAllreduce(np.zeros(10))
for i in range(20):
    time.sleep(0.001 * rank)
    solo(np.ones(10000))
maj.start(np.ones(10))          # may wait for an initiator that never comes
print("exiting", rank, flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_exit_with_partial_rounds_in_flight(mpi_script, n):
    rc, out, err, secs = mpi_script(EXIT_WITH_ROUNDS_IN_FLIGHT, n=n, timeout=60)
    assert rc == 0, err
    assert out.count("exiting") == n and secs < 30
    for word in ("leak", "pending", "Warning", "WARNING", "Abort"):
        assert word not in err, err


DROPPED_ON_ONE_RANK = """
import gc, logging, time, numpy as np, partialcoll as pc
from mpi4py import MPI
logging.basicConfig(format="%(name)s %(levelname)s %(message)s")
rank = MPI.COMM_WORLD.rank
ar = pc.SoloAllreduce(np.zeros(1000))
later = pc.MajorityAllreduce(np.zeros(3))      # created after it
if rank == 0:
    ar(np.ones(1000))
    del ar                        # dropped without close(), on rank 0 only
    gc.collect()
    time.sleep(0.3)
    other = pc.SoloAllreduce(np.zeros(2)); del other; gc.collect()
else:
    total = 0.0
    for i in range(200):          # rank 0's schedule must keep serving
        total += ar(np.ones(1000)).data[0]
    other = pc.SoloAllreduce(np.zeros(2)); del other; gc.collect()
print("exiting", rank, flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_object_dropped_on_one_rank_keeps_serving_and_exit_is_clean(
        mpi_script, n):
    rc, out, err, secs = mpi_script(DROPPED_ON_ONE_RANK, n=n, timeout=60)
    assert rc == 0, err
    assert out.count("exiting") == n and secs < 30
    # one warning per process, however many objects it dropped (the
    # straggler report may also name rank 0, which stopped calling)
    assert err.count("was dropped without close()") == n, err
    assert "SoloAllreduce" in err and "dropped without close()" in err
    for word in ("leak", "pending", "Abort", "Traceback"):
        assert word not in err, err


MAJORITY_LOOP_THEN_BARRIER = """
import random, sys, time, numpy as np, partialcoll as pc
from mpi4py import MPI
comm = MPI.COMM_WORLD
got = np.zeros(4)
for seed in (0, 1, 2):
    rng = random.Random(seed * 100 + comm.rank)
    def loop():
        global got
        for i in range(40):
            time.sleep(rng.random() * 0.003)
            got += pc.majority_allreduce(np.ones(4), seed=seed).data
    if sys.argv[1] == "flush":
        loop()
        final = pc.flush_partials(comm)
    else:
        with pc.partials(comm) as scope:
            loop()
        final = scope.results
    for label, res in final:
        got += res.data
    comm.Barrier()      # hung in 2 of 3 seeds without the flush
totals = comm.gather(int(got[0]))
if comm.rank == 0:
    print("totals", *totals, flush=True)
"""


@pytest.mark.parametrize("how", ["flush", "context"])
def test_majority_loop_then_barrier_does_not_hang(tmp_path, how):
    from conftest import run_mpi
    script = tmp_path / "loop.py"
    script.write_text(MAJORITY_LOOP_THEN_BARRIER)
    rc, out, err, secs = run_mpi(["python", str(script), how], n=3,
                                 timeout=60)
    assert rc == 0, err
    assert f"totals {' '.join(['360'] * 3)}" in out, out     # 3 x 40 x 3


STALLS = """
import time, numpy as np, partialcoll as pc
from mpi4py import MPI
from partialcoll.collectives.partial.kinds import designated
comm = MPI.COMM_WORLD
x = np.ones(4)
with pc.MajorityAllreduce(x, seed=11) as ar:
    if comm.rank == designated(11, 0, comm.size):
        time.sleep(1.5)           # the rank drawn to start round 0 is late
    ar(x)
print("done", comm.rank, flush=True)
"""


def test_a_long_wait_says_why_without_logging_configured(tmp_path):
    """A program that configured no logging (the library's logger has only
    its NullHandler) still hears of a wait that may never end: the waiting
    rank issues one StallWarning on its console."""
    from conftest import run_mpi
    script = tmp_path / "stalls.py"
    script.write_text(STALLS)
    rc, out, err, _ = run_mpi(["python", str(script)], n=2, timeout=60,
                              env={"PARTIALCOLL_WAIT_WARN_S": "0.3"})
    assert rc == 0, err
    assert out.count("done") == 2, out
    assert err.count("StallWarning") == 1, err
    assert "has waited 0.3 s for round 0, which waits for rank" in err, err
    assert "pc.flush_partials(comm)" in err, err
