"""Smoke tests of the benchmarks (short runs) at the running comm size."""
import argparse
import pathlib
import tempfile

import pytest
from mpi4py import MPI

from partialcoll.bench import latency, overhead, sweep

pytestmark = pytest.mark.mpi


@pytest.fixture
def rank_tmp():
    """A private directory per rank (pytest's tmp_path is shared, racy)."""
    with tempfile.TemporaryDirectory() as d:
        yield pathlib.Path(d)


def args_for(module, argv):
    p = argparse.ArgumentParser()
    module.add_args(p)
    return p.parse_args(argv)


def test_latency_benchmark_runs_and_counts(rank_tmp):
    out = rank_tmp / "lat.json"
    rows = latency.run(args_for(latency, ["--iters", "6", "--step-ms", "0.2",
                                          "--json", str(out)]))
    if MPI.COMM_WORLD.rank == 0:
        names = [r["impl"] for r in rows]
        assert names[0] == "MPI_Allreduce" and names[-1] == "solo"
        assert all(r["avg_ms"] > 0 for r in rows) and out.exists()
        k = max(1, MPI.COMM_WORLD.size // 2)
        quorum = [r for r in rows if r["impl"].startswith("quorum")][0]
        assert quorum["nap"] != quorum["nap"] or quorum["nap"] >= k  # NaN ok


def test_sweep_and_overhead_run(rank_tmp):
    rows = sweep.run(args_for(sweep, ["--sizes", "8,4K", "--iters", "20",
                                      "--repeat", "1",
                                      "--csv", str(rank_tmp / "s.csv")]))
    assert [r["bytes"] for r in rows] == [8, 4096]
    rows = overhead.run(args_for(overhead, ["--chain", "1000", "--pairs", "50",
                                            "--iters", "50",
                                            "--idle-seconds", "0.1"]))
    assert rows[0]["avg"] < 100
