"""The test harness itself: under mpiexec only rank 0 writes to the
console, the other ranks to per-rank log files; a failure on one rank
aborts every rank at once and its report reaches the console."""
import mmap
import os
import shutil
import uuid

import pytest

from conftest import run_mpi
from shm_segments import segments, stale

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


PASSING = '''
import sys

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi


def test_passes_and_says_so(capsys):
    with capsys.disabled():
        print(f"rank {MPI.COMM_WORLD.rank} says hello")
        print(f"rank {MPI.COMM_WORLD.rank} to stderr", file=sys.stderr)
'''


def run_pytest_under_mpiexec(tmp_path, name, text, n=3):
    here = os.path.dirname(__file__)
    for helper in ("conftest.py", "shm_segments.py"):
        shutil.copy(os.path.join(here, helper), tmp_path / helper)
    (tmp_path / name).write_text(text)
    return run_mpi(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--with-mpi", "-m", "mpi", name],
                   n=n, timeout=60, cwd=str(tmp_path))


def test_failure_on_one_rank_aborts_all_and_is_reported(tmp_path):
    before = segments()
    rc, out, err, secs = run_pytest_under_mpiexec(
        tmp_path, "test_one_rank_fails.py", FAILING_ON_ONE_RANK)
    # the aborted job's shared-memory segment is gone, not left behind
    assert not stale(segments() - before)
    assert rc not in (0, 124), (rc, out, err)      # 124: timed out (hung)
    assert secs < 45, f"took {secs:.0f} s: the other ranks were not aborted"
    # the last rank writes to its log, yet its failure reaches the console
    log = tmp_path / "logs" / "P3" / "rank2.log"
    assert "test_one_rank_fails.py::test_fails_on_the_last_rank FAILED" in err
    assert "deliberate failure on the last rank" in err
    assert f"aborting all ranks; its whole output is in {log}" in err
    assert "test_expected_failure_does_not_abort" not in err
    assert "deliberate failure on the last rank" in log.read_text()


def test_only_rank_0_writes_to_the_console(tmp_path):
    rc, out, err, _ = run_pytest_under_mpiexec(
        tmp_path, "test_passing.py", PASSING)
    assert rc == 0, (out, err)
    assert "rank 0 says hello" in out and "rank 0 to stderr" in err
    assert out.count("1 passed") == 1, out
    for rank in (1, 2):
        assert f"rank {rank}" not in out + err, (out, err)
        log = (tmp_path / "logs" / "P3" / f"rank{rank}.log").read_text()
        assert f"rank {rank} says hello" in log
        assert f"rank {rank} to stderr" in log and "1 passed" in log
    assert not (tmp_path / "logs" / "P3" / "rank0.log").exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_segment_clean_up_spares_segments_still_mapped():
    """After a failed job the harness unlinks its MPICH segments; one that
    a live process still maps (a job running beside it) must be spared."""
    name = f"mpich_shm_pctest_{uuid.uuid4().hex}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb+") as f:
        f.truncate(4096)
        try:
            m = mmap.mmap(f.fileno(), 4096)
            try:
                assert stale({name}) == set()
            finally:
                m.close()
            assert stale({name}) == {name}
        finally:
            os.unlink(path)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_run_sh_clears_what_a_failed_suite_left(tmp_path):
    """tests/run.sh lists the segments before each suite and, when the
    suite fails, clears the new ones that no process maps."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "shm_segments.py")
    before = tmp_path / "before.txt"
    before.write_text(subprocess.run([sys.executable, script, "list"],
                                     capture_output=True, text=True,
                                     check=True).stdout)
    left, kept = (f"mpich_shm_pctest_{uuid.uuid4().hex}" for _ in range(2))
    paths = [os.path.join("/dev/shm", n) for n in (left, kept)]
    for p in paths:
        with open(p, "wb") as f:
            f.truncate(4096)
    try:
        with open(paths[1], "rb+") as f:
            m = mmap.mmap(f.fileno(), 4096)
            try:
                out = subprocess.run([sys.executable, script, "clear",
                                      str(before)], capture_output=True,
                                     text=True, check=True).stdout
            finally:
                m.close()
        assert out == f"removed /dev/shm/{left} (left by the failed run)\n"
        assert not os.path.exists(paths[0]) and os.path.exists(paths[1])
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
