"""The emulated network's shared segment leaves nothing behind, even when
the job is killed: its name is unlinked as soon as every rank has it
mapped.  Run as separate mpiexec jobs (one of them aborts on purpose)."""
import os

import pytest

ABORT_AFTER_ENABLE = """
import os, sys
import numpy as np
from mpi4py import MPI
import partialcoll as pc
from partialcoll import network
comm = MPI.COMM_WORLD
pc.network.enable({"default": {"out_rate": 1e8, "in_rate": 1e8}})
prefix = "partialcoll-" + network._job_key() + "-"
left = [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]
x = pc.allreduce(np.full(4, float(comm.rank)))   # over the emulated links
seen = comm.gather((len(left), float(x[0])))
if comm.rank == 0:                       # one writer: lines stay whole
    print("key", prefix, flush=True)
    print("named", sum(a for a, _ in seen), flush=True)
    print("sums", sorted({b for _, b in seen}), flush=True)
if comm.rank == 0 and sys.argv[-1] == "abort":
    comm.Abort(3)                        # no detach runs anywhere
pc.network.disable()
print("ok", flush=True)
"""


def _segments(prefix):
    return [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("end", ["abort", "clean"])
def test_no_segment_outlives_the_job(mpi_script, n, end):
    code = ABORT_AFTER_ENABLE.replace('sys.argv[-1] == "abort"',
                                      repr(end == "abort"))
    rc, out, err, _ = mpi_script(code, n=n, timeout=60)
    keys = {line.split()[1] for line in out.splitlines()
            if line.startswith("key ")}
    assert len(keys) == 1, out + err[-2000:]
    assert "named 0" in out, out         # gone while the job runs
    assert f"sums [{float(n * (n - 1) // 2)}]" in out, out
    if end == "abort":
        assert rc != 0
    else:
        assert rc == 0 and out.count("ok") == n, err[-2000:]
    assert _segments(keys.pop()) == []
