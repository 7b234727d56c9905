"""A rank that dies in the middle of partial collectives, under an MPI
without fault-tolerance extensions in use (MPICH, or Open MPI started
without ``--with-ft ulfm``): the job ends at once, and no survivor is left
waiting for the dead rank's messages.  mpiexec ends the other ranks as
soon as one process exits before finalising, whatever its exit status, or
is killed.  With the extensions, test_rank_failure.py."""
import os

import pytest

DIES = '''
import os, signal, sys
import numpy as np
import partialcoll as pc
from mpi4py import MPI

rank, how = MPI.COMM_WORLD.rank, "{how}"
x = np.ones(4, np.float32)
with pc.MajorityAllreduce(x) as maj:
    for step in range(100000):
        if rank == 3 and step == 20:
            print("rank 3 leaves at step 20", flush=True)
            if how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3 if how == "error" else 0)
        pc.solo_allreduce(x)
        maj(x)
print("a survivor finished", rank, flush=True)
'''


@pytest.mark.parametrize("how", ["error", "exit 0", "killed"])
def test_a_rank_that_dies_ends_the_job_at_once(mpi_script, how):
    rc, out, err, secs = mpi_script(DIES.format(how=how), n=4, timeout=60)
    # A rank that leaves with status 0 before finalising still ends the
    # job, but under load hydra may report that 0 for the whole job: it
    # SIGKILLs the others and does not always count their status.
    assert rc != 0 or how == "exit 0", (rc, out, err)
    # (the output says whether rank 3 got as far as leaving, and the
    # survivors' long-wait warnings what they waited for)
    assert rc != 124, (f"the job hung ({how}): " +
                       ("after rank 3 left" if "rank 3 leaves" in out else
                        "before rank 3 left") +
                       f"\n{out[-2000:]}\n{err[-4000:]}")
    assert secs < 20, f"the job ended {secs:.0f} s after rank 3 died"
    assert "a survivor finished" not in out


SAYS = '''
import logging
import numpy as np
import partialcoll as pc
logging.getLogger("partialcoll").setLevel(logging.INFO)
pc.allreduce(np.ones(2))
pc.solo_allreduce(np.ones(2))
print(pc.fault_tolerance())
'''


def test_the_first_collective_says_what_a_death_does(mpi_script):
    rc, out, err, _ = mpi_script(SAYS, n=2, timeout=60)
    assert rc == 0, err
    line = ("runs without fault-tolerance extensions: if a rank dies, "
            "mpiexec ends the whole job")
    # once per process, at its first collective
    assert err.count(line) == 2, err
    assert "'extensions': False" in out, out


def test_the_failure_benchmark_needs_the_extensions():
    from conftest import run_mpi
    here = os.path.dirname(os.path.abspath(__file__))   # not the source tree
    rc, out, err, _ = run_mpi(["python", "-m", "partialcoll.bench",
                               "failure"], n=3, timeout=60, cwd=here)
    assert rc != 0 and rc != 124, (rc, out, err)
    assert "needs MPI's fault-tolerance extensions" in err, err
    assert "mpiexec ends the whole job" in err, err
