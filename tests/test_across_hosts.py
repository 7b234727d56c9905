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


def _outside_mpi_barrier(listener, port, timeout=30.0):
    """Every rank connects to rank 0's TCP socket, says it is there, and
    waits for rank 0's word that all are: a barrier that calls no MPI (as
    a gloo collective after a library call does not)."""
    import socket
    if RANK == 0:
        peers = []
        for _ in range(P - 1):
            conn, _ = listener.accept()
            conn.settimeout(timeout)
            assert conn.recv(1) == b"r"
            peers.append(conn)
        for conn in peers:
            conn.sendall(b"g")
            conn.close()
        return
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(b"r")
        assert s.recv(1) == b"g"


def test_an_exchange_then_a_wait_outside_mpi_finishes():
    """An mpi4py allreduce on the calling thread (as the library's flush
    ends with), ``control.settle()``, then a wait outside MPI (a TCP
    barrier) for every rank to be done, twenty times.  Over MPICH's OFI
    module with the TCP provider, without the settle, this hung at once
    in every run: a rank's last message of the allreduce stayed inside
    MPI until its next MPI call, the rank went on into the barrier, and a
    peer waited in the allreduce for ever (a gloo collective after
    ``EagerHook.close`` hung so).  The library settles after each of its
    own exchanges (:mod:`partialcoll.core.control`)."""
    import socket

    from partialcoll.core import control
    if P < 2:
        pytest.skip("needs two ranks")
    listener, port = None, None
    if RANK == 0:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(30.0)
        port = listener.getsockname()[1]
    port = COMM.bcast(port, root=0)
    comm = COMM.Dup()
    try:
        for i in range(20):
            assert comm.allreduce(RANK + i, op=MPI.MAX) == P - 1 + i
            control.settle()
            _outside_mpi_barrier(listener, port)
    finally:
        comm.Free()
        if listener is not None:
            listener.close()
    COMM.Barrier()
