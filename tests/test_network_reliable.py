"""Collectives that need every message on a network that may lose some:
refused on every rank before anything is sent (they returned wrong sums,
different on every rank, or hung), while traffic in a lossless class and
hand-built schedules that read their receive outcomes still run."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi
P = MPI.COMM_WORLD.size

LOSSY = [
    ({"default": {"drop": 0.3}}, "told"),
    ({"default": {"drop": 0.3}, "drop_mode": "silent"}, "silent"),
    ({"class": {"0": {"drop": 0.5}}}, "class 0"),
    ({"priority": {"low_buffer": "1 KB"},
      "class": {"0": {"priority": "low"}}}, "tail drops"),
]


@pytest.mark.parametrize("cfg, what", LOSSY, ids=[w for _, w in LOSSY])
def test_reliable_collectives_refuse_a_lossy_class(net, cfg, what):
    if P < 2:
        pytest.skip("needs two ranks")
    comm = net(dict(cfg, seed=3))
    for call in (lambda: pc.allreduce(np.ones(8), comm=comm),
                 lambda: pc.iallreduce(np.ones(8), comm=comm).wait(),
                 lambda: pc.allreduce(np.ones(100_000), comm=comm,
                                      algorithm="ring")):
        with pytest.raises(pc.ScheduleError, match="needs every message"):
            call()
    with pytest.raises(pc.ScheduleError, match="needs every message"):
        pc.SoloAllreduce(np.ones(8), comm=comm)      # posted when made
    comm.Barrier()


def test_a_lossy_class_of_its_own_leaves_class_0_exact(net):
    """Drops in class 1 only (where RPS sends): allreduce is exact."""
    comm = net({"seed": 3, "class": {"1": {"drop": 0.5}}})
    for n in (8, 100_000):
        out = pc.allreduce(np.full(n, float(comm.rank + 1)), comm=comm)
        assert np.all(out == P * (P + 1) / 2)
    avg = pc.RPSAverage(np.ones(64), comm=comm, seed=1)
    avg(np.full(64, float(comm.rank)))       # class 1: runs, drops and all
    avg.close()


def test_a_hand_built_schedule_reads_its_outcomes_unless_reliable(net):
    if P < 2:
        pytest.skip("needs two ranks")
    comm = net({"default": {"drop": 1.0}})
    for reliable in (False, True):
        s = pc.Schedule(comm, reliable=reliable)
        b = s.buffer(np.zeros(4))
        if comm.rank == 0:
            s.send(b, 1, tag=3)
        elif comm.rank == 1:
            r = s.recv(b, 0, tag=3)
        if not reliable:
            s.post().wait(timeout=30)
            if comm.rank == 1:
                assert s.outcomes().name(r) == "dropped"
        elif comm.rank == 1:             # only rank 1 receives
            with pytest.raises(pc.ScheduleError, match="every message"):
                s.post()
        else:
            s.post().wait(timeout=30)
        s.free()
    comm.Barrier()
