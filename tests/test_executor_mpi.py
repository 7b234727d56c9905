"""Executor semantics across processes: round-stamped activation messages,
cancellation, errors on the progress thread, clean exit."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi


def activation_ring(comm):
    """Every rank: trigger T (optional); stamped send to the right on T;
    stamped recv from the left; NOP N = ANY(T, R) is the round's only
    required op.  Simultaneous initiators give one round."""
    s = pc.Schedule(comm, persistent=True)
    t = s.trigger(optional=True)
    r = s.recv(peer=(comm.rank - 1) % comm.size, tag=5, stamped=True,
               optional=True)
    s.send(peer=(comm.rank + 1) % comm.size, tag=5, stamped=True,
           optional=True, after=[t, r], mode=pc.ANY)
    s.nop(after=[t, r], mode=pc.ANY)
    return s, t


def test_late_activation_messages_never_start_a_round():
    comm = MPI.COMM_WORLD.Dup()
    s, t = activation_ring(comm)
    s.post()
    rounds = 300
    for r in range(rounds):
        s.fire(t, round=r)            # every rank initiates every round
        s.wait(round=r, timeout=30)
        comm.Barrier()
    time.sleep(0.1)
    assert s.rounds == rounds          # surplus messages started nothing
    st = s.stats
    if comm.size > 1:                  # each round's incoming message was late
        assert st["stale"] + st["surplus"] >= rounds
    s.free()
    comm.Free()


def test_one_initiator_activates_everyone():
    comm = MPI.COMM_WORLD.Dup()
    s, t = activation_ring(comm)
    s.post()
    for r in range(50):
        if comm.rank == r % comm.size:
            s.fire(t, round=r)
        s.wait(round=r, timeout=30)
    assert s.rounds >= 50
    s.free()
    comm.Free()


def test_free_with_pending_receives_does_not_hang():
    comm = MPI.COMM_WORLD.Dup()
    s = pc.Schedule(comm)
    buf = np.zeros(4)
    s.recv(s.buffer(buf), peer=(comm.rank + 1) % comm.size, tag=99)
    req = s.post()
    time.sleep(0.01)
    assert not req.test()
    s.free()                          # cancels the receive
    comm.Barrier()
    comm.Free()


def test_mpi_error_surfaces_at_wait():
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    P, rank = comm.size, comm.rank
    s = pc.Schedule(comm)
    big, small = np.zeros(8), np.zeros(2)
    s.send(s.buffer(big, writable=False), (rank + 1) % P, tag=3)
    s.recv(s.buffer(small), (rank - 1) % P, tag=3)   # truncation error
    with pytest.raises(pc.TransportError, match="round 0"):
        s.post().wait(timeout=30)
    s.free()
    comm.Barrier()
    comm.Free()
