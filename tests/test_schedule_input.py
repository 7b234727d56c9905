"""Bad input to a hand-built schedule gets a clear error when the schedule
is built or waited on: no wrapped peer or tag, no foreign buffer, no
overlapping reduction, no wait that outlasts its timeout, no timed op that
never comes due."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc


def test_wait_timeout_holds_with_nothing_in_flight():
    """A round waiting on a long delay (no message outstanding) times out
    after about its timeout: it took 16 times as long when the deadline
    was checked every 16th idle sweep of 0.1 s and the slices were
    counted, not timed."""
    for build in (lambda s: s.delay(100), lambda s: s.trigger()):
        s = pc.Schedule(MPI.COMM_SELF)
        build(s)
        req = s.post()
        t0 = time.monotonic()
        with pytest.raises(pc.WaitTimeout):
            req.wait(timeout=0.5)
        took = time.monotonic() - t0
        assert 0.45 <= took < 1.5, took
        s.free()


@pytest.mark.parametrize("timeout", [-1, float("nan"), "soon"])
def test_wait_refuses_a_bad_timeout(timeout):
    s = pc.Schedule(MPI.COMM_SELF)
    s.trigger()
    req = s.post()
    with pytest.raises(pc.ScheduleError, match="timeout"):
        req.wait(timeout=timeout)
    with pytest.raises(pc.ScheduleError, match="timeout"):
        s.wait(timeout=timeout)
    with pytest.raises(pc.ScheduleError, match="timeout"):
        s.wait_gate(timeout=timeout)
    s.fire(0)
    req.wait(timeout=float("inf"))          # inf: for ever (done at once)
    s.free()


@pytest.mark.parametrize("kw, match", [
    (dict(peer=2**32 + 1), "peer must be in"),
    (dict(peer=-1), "peer must be in"),
    (dict(peer=0.0), "peer must be an int"),
    (dict(peer=True), "peer must be an int"),
    (dict(tag=2**32 + 7), "tag must be in"),
    (dict(tag=-3), "tag must be in"),
    (dict(traffic_class=-1), "traffic_class must be in 0..15"),
    (dict(traffic_class=16), "traffic_class must be in 0..15"),
    (dict(priority=2**40), "priority must be in"),
])
def test_send_and_recv_refuse_what_would_wrap(kw, match):
    """Values outside a C int were cast: peer 2**32 + 1 sent to rank 1,
    tag 2**32 + 7 became 7, traffic class -1 the never-dropped control
    class."""
    s = pc.Schedule(MPI.COMM_SELF)
    b = s.buffer(np.zeros(2))
    args = dict(peer=0, tag=0)
    args.update(kw)
    with pytest.raises(pc.ScheduleError, match=match):
        s.send(b, **args)
    with pytest.raises(pc.ScheduleError, match=match):
        s.recv(b, **args)


def test_numpy_integers_are_accepted():
    s = pc.Schedule(MPI.COMM_SELF)
    x, y = np.arange(3.0), np.zeros(3)
    b, c = s.buffer(x), s.buffer(y)
    s.recv(c, peer=np.int64(0), tag=np.int32(3), traffic_class=np.int8(1))
    s.send(b, peer=np.int64(0), tag=np.int32(3), priority=np.int64(-2))
    s.post().wait(timeout=10)
    assert np.array_equal(y, x)
    s.free()


def test_a_buffer_of_another_schedule_is_refused():
    s1, s2 = pc.Schedule(MPI.COMM_SELF), pc.Schedule(MPI.COMM_SELF)
    own = s2.buffer(np.zeros(4))
    foreign = s1.buffer(np.ones(4))
    for add in (lambda: s2.send(foreign, 0), lambda: s2.copy(own, foreign),
                lambda: s2.reduce(own, foreign),
                lambda: s2.send(own, 0, priority=s1.buffer(
                    np.zeros(1, np.int64))[0:1]),
                lambda: s2.delay(s1.buffer(np.zeros(1))[0:1])):
        with pytest.raises(pc.ScheduleError, match="another schedule"):
            add()


def test_overlapping_reduction_is_refused():
    """dst = dst op src over overlapping ranges of one buffer read
    elements it had already written ([0,1,2,4,6,9,12,16] for
    reduce(b[2:8], b[0:6]) over arange(8))."""
    s = pc.Schedule(MPI.COMM_SELF)
    b = s.buffer(np.arange(8.0))
    for dst, src in ((b[2:8], b[0:6]), (b, b), (b[0:4], b[3:7])):
        with pytest.raises(pc.ScheduleError, match="must not overlap"):
            s.reduce(dst, src)
    s.reduce(b[4:8], b[0:4])                  # disjoint: allowed
    s.post().wait(timeout=10)
    s.free()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, -1.0,
                                   True])
def test_delay_refuses_a_bad_constant(value):
    s = pc.Schedule(MPI.COMM_SELF)
    with pytest.raises(pc.ScheduleError, match="seconds"):
        s.delay(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_delay_or_time_read_as_nan_fails_the_round(value):
    """Read from a slot, NaN never came due: the round hung."""
    for add in (lambda s, p: s.delay(p), lambda s, p: s.start_at(p)):
        s = pc.Schedule(MPI.COMM_SELF)
        add(s, s.buffer(np.array([value]))[0:1])
        with pytest.raises(pc.ScheduleError, match="not a finite number"):
            s.post().wait(timeout=10)
        s.free()


def test_fire_and_wait_refuse_a_negative_round():
    s = pc.Schedule(MPI.COMM_SELF, persistent=True)
    t = s.trigger()
    s.commit()
    with pytest.raises(pc.ScheduleError, match="round must be in"):
        s.fire(t, round=-3)
    with pytest.raises(pc.ScheduleError, match="round must be in"):
        s.wait(round=-1, timeout=1)
    s.free()


@pytest.mark.mpi
def test_intercommunicators_are_refused_everywhere():
    """An intercommunicator was taken as its local group: allreduce gave
    every rank the same wrong sum and SoloAllreduce hung."""
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    color = comm.rank % 2
    local = comm.Split(color, comm.rank)
    inter = local.Create_intercomm(0, comm, 1 - color, 0)
    try:
        for call in (lambda: pc.allreduce(np.ones(3), comm=inter),
                     lambda: pc.SoloAllreduce(np.ones(3), comm=inter),
                     lambda: pc.Schedule(inter),
                     lambda: pc.RPSAverage(np.ones(3), comm=inter)):
            with pytest.raises(pc.ScheduleError, match="intercommunicators"):
                call()
    finally:
        inter.Free()
        local.Free()
    comm.Barrier()


@pytest.mark.parametrize("comm", [MPI.COMM_NULL, 7, "world"])
def test_a_bad_communicator_is_refused_clearly(comm):
    for call in (lambda: pc.allreduce(np.ones(3), comm=comm),
                 lambda: pc.SoloAllreduce(np.ones(3), comm=comm),
                 lambda: pc.flush_partials(comm),
                 lambda: pc.Schedule(comm),
                 lambda: pc.RPSAverage(np.ones(3), comm=comm),
                 lambda: pc.LoadBalancedAllreduce(np.ones(3), comm=comm)):
        with pytest.raises(pc.ScheduleError, match="comm"):
            call()
