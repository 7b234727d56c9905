import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _world_size():
    """MPI_COMM_WORLD's size when this pytest runs under mpiexec with
    --with-mpi (MPI is then initialised by the test modules anyway), else 1."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


def pytest_runtest_setup(item):
    """``@pytest.mark.max_ranks(n)``: skip above n ranks.  For long tests
    whose subject does not depend on P (memory over many rounds, benchmark
    smoke runs, the framework wrappers): at P = 5 and 8 they only cost CI
    time on two cores."""
    mark = item.get_closest_marker("max_ranks")
    if mark is not None and _world_size() > mark.args[0]:
        pytest.skip(f"runs at P <= {mark.args[0]} only (P-independent, slow)")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """A test that fails on one rank of several leaves the other ranks
    waiting in its collectives until mpiexec's time limit, and that rank's
    report would only be printed in the summary that never comes.  So under
    mpiexec (--with-mpi, size > 1) write the failing rank's report to stderr
    at once and abort every rank."""
    if not report.failed or _world_size() == 1:
        return
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    sys.stderr.write(f"\n==== rank {rank}: {report.nodeid} FAILED "
                     f"({report.when}) ====\n{report.longreprtext}\n"
                     f"==== rank {rank}: aborting all ranks ====\n")
    sys.stderr.flush()
    sys.stdout.flush()
    MPI.COMM_WORLD.Abort(1)


def run_mpi_script(code, n=2, timeout=60, env=None):
    """Run ``code`` under ``mpiexec -n n`` in a fresh process; return
    (returncode, stdout, stderr, seconds)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        f"pc_script_{os.getpid()}_{time.monotonic_ns()}.py")
    with open(path, "w") as f:
        f.write(code)
    try:
        return run_mpi(["python", path], n, timeout, env)
    finally:
        os.unlink(path)


def run_mpi(argv, n=2, timeout=60, env=None, cwd=ROOT):
    """Run ``argv`` (``"python"`` stands for this interpreter) under
    ``mpiexec -n n`` with a time limit; return (returncode, stdout, stderr,
    seconds)."""
    argv = [sys.executable if a == "python" else a for a in argv]
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_"))}
    e.update(env or {})
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(exe):
        exe = "mpiexec"
    t0 = time.monotonic()
    p = subprocess.run(["timeout", str(timeout), exe, "-n", str(n)] + argv,
                       capture_output=True, text=True, env=e, cwd=cwd)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


@pytest.fixture
def mpi_script():
    return run_mpi_script
