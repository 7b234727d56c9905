"""A rank that dies in the middle of partial collectives, under an MPI
without fault-tolerance extensions (MPICH): the job ends at once, and no
survivor is left waiting for the dead rank's messages.  mpiexec ends the
other ranks as soon as one process exits before finalising, whatever its
exit status, or is killed.  (Survivors that carry on need an MPI with
such extensions: not supported yet.)"""
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
    assert rc != 0, (rc, out, err)
    assert rc != 124, f"the job hung after rank 3 died ({how})"
    assert secs < 20, f"the job ended {secs:.0f} s after rank 3 died"
    assert "a survivor finished" not in out
