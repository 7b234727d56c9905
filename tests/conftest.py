import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_mpi_script(code, n=2, timeout=60, env=None):
    """Run ``code`` under ``mpiexec -n n`` in a fresh process; return
    (returncode, stdout, stderr, seconds)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        f"pc_script_{os.getpid()}_{time.monotonic_ns()}.py")
    with open(path, "w") as f:
        f.write(code)
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_"))}
    e.update(env or {})
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(exe):
        exe = "mpiexec"
    t0 = time.monotonic()
    try:
        p = subprocess.run(["timeout", str(timeout), exe, "-n", str(n),
                            sys.executable, path], capture_output=True,
                           text=True, env=e, cwd=ROOT)
    finally:
        os.unlink(path)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


@pytest.fixture
def mpi_script():
    return run_mpi_script
