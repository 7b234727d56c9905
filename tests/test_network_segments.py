"""The emulated network's shared segment leaves nothing behind, even when
the job is killed: its name is unlinked as soon as every rank has it
mapped.  Run as separate mpiexec jobs (one of them aborts on purpose)."""
import json
import os

import pytest

ABORT_AFTER_ENABLE = """
import json, os
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
if comm.rank == 0:
    # to a file, closed before the abort (what goes to stdout may be cut
    # short by it)
    with open(os.environ["PC_SEGMENTS_OUT"], "w") as f:
        json.dump({"key": prefix, "named": sum(a for a, _ in seen),
                   "sums": sorted({b for _, b in seen})}, f)
if comm.rank == 0 and os.environ["PC_SEGMENTS_END"] == "abort":
    comm.Abort(3)                        # no detach runs anywhere
pc.network.disable()
print("ok", flush=True)
"""


def _segments(prefix):
    return [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("end", ["abort", "clean"])
def test_no_segment_outlives_the_job(mpi_script, tmp_path, n, end):
    report = tmp_path / "segments.json"
    rc, out, err, _ = mpi_script(ABORT_AFTER_ENABLE, n=n, timeout=60,
                                 env={"PC_SEGMENTS_OUT": str(report),
                                      "PC_SEGMENTS_END": end})
    assert report.exists(), out + err[-2000:]
    seen = json.loads(report.read_text())
    assert seen["named"] == 0, seen          # gone while the job runs
    assert seen["sums"] == [float(n * (n - 1) // 2)], seen
    if end == "abort":
        assert rc != 0
    else:
        assert rc == 0 and out.count("ok") == n, err[-2000:]
    assert _segments(seen["key"]) == []
