"""The test harness itself: a failure on one rank under mpiexec aborts every
rank at once and its report reaches the log."""
import os
import shutil

from conftest import run_mpi

FAILING_ON_ONE_RANK = '''
import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi


@pytest.mark.mpi_xfail
def test_expected_failure_does_not_abort():
    assert False


def test_fails_on_the_last_rank():
    comm = MPI.COMM_WORLD
    assert comm.rank != comm.size - 1, "deliberate failure on the last rank"
    comm.Barrier()          # the other ranks wait here for the failed one
'''


def test_failure_on_one_rank_aborts_all_and_is_reported(tmp_path):
    shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"),
                tmp_path / "conftest.py")
    (tmp_path / "test_one_rank_fails.py").write_text(FAILING_ON_ONE_RANK)
    rc, out, err, secs = run_mpi(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--with-mpi", "-m", "mpi", "test_one_rank_fails.py"],
        n=3, timeout=60, cwd=str(tmp_path))
    assert rc not in (0, 124), (rc, out, err)      # 124: timed out (hung)
    assert secs < 45, f"took {secs:.0f} s: the other ranks were not aborted"
    assert "test_one_rank_fails.py::test_fails_on_the_last_rank FAILED" in err
    assert "deliberate failure on the last rank" in err
    assert "test_expected_failure_does_not_abort" not in err
