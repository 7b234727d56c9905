"""Arrival times of receives (``RoundOutcomes.t_arrive``): over plain MPI
the completion time; on the emulated network the model's arrival time
(last byte off the wire, plus the latency), however late the receiving
rank notices the message: its receive posted late, or the whole process
stopped while the message arrived."""
import os
import signal
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import devices

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
RATE, LATENCY = 10e6, 0.005           # "10 MB/s", "5 ms"
LINK = {"default": {"out_rate": "10 MB/s", "in_rate": "10 MB/s",
                    "latency": "5 ms"}}
SLACK = 0.1     # push after the sender's START_AT: same sweep, unless the
                # loaded host preempts the sender in between


@pytest.mark.parametrize("n", [0, 1, 37, 10_000])
def test_over_mpi_arrival_is_the_completion_time(n):
    """Plain MPI gives no arrival time: a receive's t_arrive is its t_done;
    sends and local ops have none."""
    x = np.arange(n, dtype=np.float64) + RANK
    got, acc = np.zeros(n), np.zeros(n)
    s = pc.Schedule(COMM)
    snd = s.send(s.buffer(x, writable=False), (RANK + 1) % P, tag=3)
    rcv = s.recv(s.buffer(got), (RANK - 1) % P, tag=3)
    red = s.reduce(s.buffer(acc), s.buffer(got), after=[rcv])
    t0 = pc.now()
    s.post().wait()
    t1 = pc.now()
    out = s.outcomes()
    assert out.name(rcv) == "ok"
    assert out.t_arrive[rcv] == out.t_done[rcv]
    assert t0 <= out.t_arrive[rcv] <= t1
    assert out.t_arrive[snd] == 0 and out.t_arrive[red] == 0
    assert not out.t_wire.any()          # no wire times over MPI
    assert np.array_equal(acc, np.arange(n) + (RANK - 1) % P)
    s.free()


def test_a_timed_out_receive_has_no_arrival_time():
    s = pc.Schedule(COMM)
    r = s.recv(s.buffer(np.zeros(4)), (RANK + 1) % P, tag=9, timeout=0.01)
    s.post().wait()
    out = s.outcomes()
    assert out.name(r) == "timedout"
    assert out.t_arrive[r] == 0 and out.t_wire[r] == 0 and out.t_done[r] > 0
    s.free()


def _one_message(comm, count, late_post=0.0):
    """Rank 0 sends `count` float64 to rank 1 at the START_AT time in `go`;
    rank 1's receive is posted `late_post` seconds after its round starts.
    Returns (schedule, recv op or None, START_AT op or None, go, buffer)."""
    s = pc.Schedule(comm)
    buf = np.arange(count, dtype=np.float64) if RANK == 0 else \
        np.zeros(count)
    rcv = st = None
    go = np.zeros(1)
    if RANK == 0:
        st = s.start_at(s.buffer(go, name="go")[0:1])
        s.send(s.buffer(buf, writable=False), 1, tag=1, after=[st])
    elif RANK == 1:
        d = s.delay(late_post)
        rcv = s.recv(s.buffer(buf), 0, tag=1, after=[d])
    s.commit()
    return s, rcv, st, go, buf


def _modelled_arrival(s, st, nbytes):
    """Rank 0's START_AT completion, shared: the push follows it in the
    same sweep, so the model's arrival is nbytes / RATE + LATENCY after."""
    t_s = COMM.bcast(float(s.outcomes().t_done[st]) if RANK == 0 else None)
    return t_s + nbytes / RATE + LATENCY


def test_receive_posted_late_still_gets_the_models_arrival(net):
    """The message arrives (model) about 21 ms after the start; rank 1's
    receive is posted 300 ms after its round started, so it completes
    (t_done) late, but t_arrive is the model's arrival."""
    if P < 2:
        pytest.skip("needs two ranks")
    comm = net(LINK)
    s, rcv, st, go, buf = _one_message(comm, 20_000, late_post=0.3)
    go[0] = COMM.bcast(pc.now() + 0.01 if RANK == 0 else None)
    s.post().wait()
    want = _modelled_arrival(s, st, 160_000)
    if RANK == 1:
        out = s.outcomes()
        assert out.name(rcv) == "ok"
        assert np.array_equal(buf, np.arange(20_000))
        assert want - 1e-6 <= out.t_arrive[rcv] <= want + SLACK
        assert out.t_done[rcv] - out.t_arrive[rcv] > 0.2
    s.free()


def test_stopped_receiver_still_gets_the_models_arrival(net):
    """Rank 1's whole process is stopped (SIGSTOP) while its message
    arrives, as a rank that the host does not run would be: it notices the
    message only after it continues, t_arrive is still the model's."""
    if P < 2:
        pytest.skip("needs two ranks")
    comm = net(LINK)
    pids = COMM.allgather(os.getpid())
    s, rcv, st, go, buf = _one_message(comm, 20_000)
    if RANK == 1:
        req = s.post()                  # rank 1 only receives: it never
    COMM.Barrier()                      # takes the network's shared lock
    t_cont = None
    if RANK == 0:
        os.kill(pids[1], signal.SIGSTOP)
        try:
            go[0] = pc.now() + 0.005    # sent while rank 1 is stopped
            req = s.post()
            time.sleep(0.6)
        finally:
            t_cont = pc.now()
            os.kill(pids[1], signal.SIGCONT)
    t_cont = COMM.bcast(t_cont)
    if RANK in (0, 1):
        req.wait()
    want = _modelled_arrival(s, st, 160_000)
    if RANK == 1:
        out = s.outcomes()
        assert out.name(rcv) == "ok"
        assert want - 1e-6 <= out.t_arrive[rcv] <= want + SLACK
        assert out.t_arrive[rcv] < t_cont - 0.2 < out.t_done[rcv]
    s.free()


def test_dropped_and_empty_messages_carry_arrival_times(net):
    """On one FIFO link: an empty message, a lost one (told) and a normal
    one arrive in order, each at the model's time (a lost message still
    uses the wire); only the lost one's data stays away.  Each one's first
    byte went on the wire once the one before had left it (``t_wire``), so
    ``t_arrive - t_wire`` is its own time on the wire plus the latency,
    not its wait in the channel."""
    if P < 2:
        pytest.skip("needs two ranks")
    cfg = dict(LINK, drop_mode="told", **{"class": {"1": {"drop": 1.0}}})
    comm = net(cfg)
    s = pc.Schedule(comm)
    go = np.zeros(1)
    a, b = np.full(1000, 7.0), np.full(1000, 8.0)
    recvs = st = None
    if RANK == 0:
        st = s.start_at(s.buffer(go)[0:1])
        s.send(s.buffer(np.zeros(0)), 1, tag=1, after=[st])
        s.send(s.buffer(a), 1, tag=2, after=[st], traffic_class=1)
        s.send(s.buffer(b), 1, tag=3, after=[st])
    elif RANK == 1:
        a[:], b[:] = 0, 0
        recvs = [s.recv(s.buffer(np.zeros(0)), 0, tag=1),
                 s.recv(s.buffer(a), 0, tag=2),
                 s.recv(s.buffer(b), 0, tag=3)]
    s.commit()
    go[0] = COMM.bcast(pc.now() + 0.01 if RANK == 0 else None)
    s.post().wait()
    first = _modelled_arrival(s, st, 0)
    if RANK == 1:
        out = s.outcomes()
        assert [out.name(r) for r in recvs] == ["ok", "dropped", "ok"]
        assert np.all(a == 0) and np.all(b == 8.0)
        t = out.t_arrive[recvs]
        want = first + np.array([0, 8000, 16000]) / RATE
        assert np.all(want - 1e-6 <= t) and np.all(t <= want + SLACK)
        # each took the wire after the one before (pushed microseconds
        # apart by the sender, so no less than its own 8000 bytes' time)
        assert np.all(np.diff(t) >= 8000 / RATE - 1e-6)
        w = out.t_wire[recvs]
        assert first - LATENCY - 1e-6 <= w[0] <= first - LATENCY + SLACK
        # b waited for a to leave the wire (FIFO): it went on no earlier;
        # exactly then when the sender pushed it before a had left, the
        # usual case, later when the loaded host preempted the sender
        # between the two pushes for longer than a's 0.8 ms on the wire
        assert 8000 / RATE - 1e-6 <= w[2] - w[1] <= 8000 / RATE + SLACK
        assert t - w == pytest.approx(np.array([0, 8000, 8000]) / RATE
                                      + LATENCY, abs=1e-6)
    s.free()


def test_device_buffers_are_refused_with_a_reason(net):
    """The arrival time travels in a host-memory header beside the data, so
    the emulated network refuses device pointers (the CUDA-aware path)."""
    comm = net({"default": {"latency": "1 ms"}})
    devices.set_gpu_path("cuda-aware")
    try:
        s = pc.Schedule(comm)
        x = devices.emulated(np.ones(8))
        s.send(s.buffer(x, writable=False), (RANK + 1) % P, tag=1)
        with pytest.raises(pc.TransportError, match="host buffers only"):
            s.post().wait(timeout=10)
        s.free()
    finally:
        devices.set_gpu_path(None)
