import os
import subprocess
import sys
import tempfile
import time

import pytest

import shm_segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: where ranks other than 0 write their output under mpiexec: LOGS/P<size>/
#: rank<r>.log (tests/run.sh removes a run's logs when it passed)
LOGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs")
_console = None       # the console's stderr, on a rank whose output is logged
_log_path = None      # that rank's log file


def _world_size():
    """MPI_COMM_WORLD's size when this pytest runs under mpiexec with
    --with-mpi (MPI is then initialised by the test modules anyway), else 1."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


def _launcher_rank():
    """(rank, size) from the MPI launcher's environment (MPICH's hydra and
    Intel MPI set PMI_*, Open MPI OMPI_COMM_WORLD_*), read before MPI is
    initialised; (0, 1) outside a launcher."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Under mpiexec only rank 0 writes to the console: every other rank's
    stdout and stderr (pytest's report, and anything C or MPI prints) go
    to ``LOGS/P<size>/rank<r>.log``, so the console reads like one pytest
    run.  A failure is still shown on the console at once (see
    ``pytest_runtest_logreport``).

    pytest's output capture saved the console's descriptors when it
    started and restores them whenever it suspends, so it is stopped
    around the redirection and started again on the log (it is suspended
    at this point, between loading the conftests and the session)."""
    global _console, _log_path
    rank, size = _launcher_rank()
    if rank == 0 or size == 1 or _console is not None:
        return
    _own_temp_root(rank)
    # PARTIALCOLL_TEST_LOGS names the folder (tests/cluster.py: one per
    # cluster configuration)
    sub = os.environ.get("PARTIALCOLL_TEST_LOGS") or f"P{size}"
    _log_path = os.path.join(LOGS, sub, f"rank{rank}.log")
    os.makedirs(os.path.dirname(_log_path), exist_ok=True)
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()
    sys.stdout.flush()
    sys.stderr.flush()
    _console = os.fdopen(os.dup(2), "w")
    log = os.open(_log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    if capman is not None:
        capman.start_global_capturing()
        capman.suspend_global_capture()


def _own_temp_root(rank):
    """Ranks other than 0 keep pytest's temporary directories under a root
    of their own (``<tmp>/pytest-rank<r>``): under one root, ranks that
    start together clean up the same old numbered directories at once
    (a PytestWarning at P = 3 in CI).  Inside a root pytest numbers and
    locks its directories, so concurrent sessions stay apart.  pytest
    reads the variable when a test first asks for a temporary path."""
    if "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return
    root = os.path.join(tempfile.gettempdir(), f"pytest-rank{rank}")
    os.makedirs(root, exist_ok=True)
    os.environ["PYTEST_DEBUG_TEMPROOT"] = root


def pytest_runtest_logstart(nodeid, location):
    """On a rank whose output is logged, write each test's name as it
    starts, unbuffered: when mpiexec's time limit kills the ranks, the logs
    still say where each rank was."""
    if _log_path is not None:
        os.write(2, f"\n[{time.strftime('%H:%M:%S')}] {nodeid}\n".encode())


def pytest_runtest_setup(item):
    """``@pytest.mark.max_ranks(n)``: skip above n ranks.  For long tests
    whose subject does not depend on P (memory over many rounds, benchmark
    smoke runs, the framework wrappers): at P = 5 and 8 they only cost CI
    time on two cores."""
    mark = item.get_closest_marker("max_ranks")
    if mark is not None and _world_size() > mark.args[0]:
        pytest.skip(f"runs at P <= {mark.args[0]} only (P-independent, slow)")


_HOSTS = []


def _host_count():
    """Hosts the MPI world spans (collective the first time: every rank
    runs the same tests in the same order)."""
    if not _HOSTS:
        from mpi4py import MPI
        names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
        _HOSTS.append(len(set(names)))
    return _HOSTS[0]


@pytest.fixture(autouse=True)
def _emulated_network_on_one_host(request, monkeypatch):
    """Across hosts (tests/cluster.py) the emulated network is refused (it
    models one host), so a test that enables it is skipped there, saying
    why, at the point where it enables it.  ``@pytest.mark.across_hosts``
    tests (of that refusal) call the real one."""
    if (_world_size() == 1 or request.node.get_closest_marker("across_hosts")
            or _host_count() == 1):
        yield
        return
    import partialcoll as pc

    def enable(*args, **kwargs):
        pytest.skip(f"uses the emulated network, which models one host "
                    f"(these ranks run on {_host_count()} hosts)")

    monkeypatch.setattr(pc.network, "enable", enable)
    yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """A test that fails on one rank of several leaves the other ranks
    waiting in its collectives until mpiexec's time limit, and that rank's
    report would only be printed in the summary that never comes.  So under
    mpiexec (--with-mpi, size > 1) write the failing rank's report to the
    console's stderr at once (and to its log, if it has one), then abort
    every rank."""
    if not report.failed or _world_size() == 1:
        return
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    where = (f"; its whole output is in {_log_path}"
             if _log_path else "")
    text = (f"\n==== rank {rank}: {report.nodeid} FAILED ({report.when}) "
            f"====\n{report.longreprtext}\n"
            f"==== rank {rank}: aborting all ranks{where} ====\n")
    for stream in (sys.stderr, _console):     # the log, and the console
        if stream is not None:
            stream.write(text)
            stream.flush()
    sys.stdout.flush()
    MPI.COMM_WORLD.Abort(1)


@pytest.fixture
def net():
    """Enable an emulated network for one test (collective over
    MPI_COMM_WORLD); yields ``enable(cfg)``, which returns a fresh
    communicator on it.  Plain MPI again afterwards."""
    import partialcoll as pc
    from mpi4py import MPI
    comms = []

    def enable(cfg):
        pc.network.enable(cfg)
        c = MPI.COMM_WORLD.Dup()
        comms.append(c)
        return c

    yield enable
    pc.network.disable()
    for c in comms:
        c.Free()


#: put first in every script run_mpi_script runs: the library's warnings
#: go to stderr, as a program that configures logging would see them
#: (partialcoll itself installs only a NullHandler)
SCRIPT_LOGGING = ("import logging\nlogging.basicConfig(format="
                  "'%(name)s %(levelname)s %(message)s')\n")


def run_mpi_script(code, n=2, timeout=60, env=None, launcher=()):
    """Run ``code`` under ``mpiexec -n n`` in a fresh process, with logging
    configured (:data:`SCRIPT_LOGGING`); return (returncode, stdout,
    stderr, seconds)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        f"pc_script_{os.getpid()}_{time.monotonic_ns()}.py")
    with open(path, "w") as f:
        f.write(SCRIPT_LOGGING + code)
    try:
        return run_mpi(["python", path], n, timeout, env, launcher=launcher)
    finally:
        os.unlink(path)


def mpiexec():
    """This interpreter's mpiexec (the one beside it, else the PATH's)."""
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return exe if os.path.exists(exe) else "mpiexec"


_vendor = []


def launcher_is_open_mpi():
    """Whether :func:`mpiexec` is Open MPI's (else MPICH's hydra)."""
    if not _vendor:
        out = subprocess.run([mpiexec(), "--version"], capture_output=True,
                             text=True).stdout
        _vendor.append("Open MPI" in out)
    return _vendor[0]


def run_mpi(argv, n=2, timeout=60, env=None, cwd=ROOT, launcher=()):
    """Run ``argv`` (``"python"`` stands for this interpreter) under
    ``mpiexec -n n`` with a time limit; return (returncode, stdout, stderr,
    seconds).  ``launcher``: more options for mpiexec.  Open MPI's is told
    that n may exceed the cores (MPICH's allows it anyway)."""
    argv = [sys.executable if a == "python" else a for a in argv]
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_",
                              "OMPI_COMM_WORLD", "PRTE_"))}
    e.update(env or {})
    opts = list(launcher)
    if launcher_is_open_mpi():
        opts = ["--oversubscribe"] + opts
    before = shm_segments.segments()
    t0 = time.monotonic()
    p = subprocess.run(["timeout", str(timeout), mpiexec(), "-n", str(n)]
                       + opts + argv, capture_output=True, text=True, env=e,
                       cwd=cwd)
    secs = time.monotonic() - t0
    # a job aborted on purpose leaves its segment (sometimes with status 0:
    # hydra may report a rank's os._exit(0) as the job's); a job that ended
    # well removed its own, and nothing else is running
    shm_segments.clear_new(before)
    return p.returncode, p.stdout, p.stderr, secs


@pytest.fixture
def mpi_script():
    return run_mpi_script
