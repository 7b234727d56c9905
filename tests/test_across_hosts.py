"""What differs when the ranks run on several hosts: messages cross a
network module (UCX, OFI) instead of shared memory, and each host has its
own /dev/shm.  These tests run at every P on one host, and on the cluster
in a box (tests/cluster.py, several emulated hosts) where it matters."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def _hosts():
    return len(set(COMM.allgather(MPI.Get_processor_name())))


def test_partial_rounds_then_close_finish_on_every_rank():
    """An allreduce, 20 solo calls and a close, ten times.  Across hosts
    over MPICH's UCX module this hung in most runs when the control channel
    took round activations with one MPI_ANY_SOURCE receive: MPICH posts it
    to both its shared-memory and network modules and cancels the loser,
    and a message could be lost in that race, leaving a round that never
    started on one rank (and UCX warning of unmatched messages at exit)."""
    x = np.full(4, RANK + 1, np.float32)
    total = P * (P + 1) / 2
    for _ in range(10):
        out = pc.allreduce(x)
        assert np.all(out == total)
        got = np.zeros(4, np.float64)
        for _ in range(20):
            got += pc.solo_allreduce(x).data
        for _, res in pc.close_partials(COMM):
            got += res.data
        # every rank's 20 contributions arrive exactly once
        assert np.all(got == 20 * total), got
    COMM.Barrier()


@pytest.mark.across_hosts
def test_emulated_network_refused_across_hosts_accepted_on_one():
    """The emulated network is one shared-memory segment: on one host it
    is enabled; over ranks on several hosts every rank gets the same error
    (each host would model its own copy of the network)."""
    nic = {"default": {"out_rate": "10 MB/s", "in_rate": "10 MB/s"}}
    if _hosts() == 1:
        pc.network.enable(nic, COMM)
        try:
            assert pc.network.current() is not None
        finally:
            pc.network.disable(COMM)
        return
    with pytest.raises(pc.Error, match="models one host"):
        pc.network.enable(nic, COMM)
    assert pc.network.current() is None
    COMM.Barrier()


def test_control_channel_posts_one_receive_per_rank_and_cancels_them():
    """An idle partial object's communicator has one control receive per
    rank posted (no MPI_ANY_SOURCE receive), and none is left once the
    object is closed.  (Alone, an object has no peer to hear from.)
    Counted by ``control_receives``: ``outstanding`` also counts any
    send of an earlier test still on its way."""
    import time

    def settle(want):
        deadline = time.monotonic() + 10
        while pc.engine_stats()["control_receives"] != want and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        stats = pc.engine_stats()
        assert stats["control_receives"] == want, stats
        return stats

    comm = COMM.Dup()
    try:
        COMM.Barrier()
        before = pc.engine_stats()
        ar = pc.SoloAllreduce(np.zeros(4), comm=comm)
        idle = settle(before["control_receives"] + (P if P > 1 else 0))
        assert idle["outstanding"] >= idle["control_receives"], idle
        ar.close()
        settle(before["control_receives"])
    finally:
        comm.Free()
