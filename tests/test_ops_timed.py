"""Timed ops, application gates, receive outcomes and deadlines, the skip
and scale rules, and the counter gate, on one process (COMM_SELF)."""
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll import _core


def test_delay_takes_its_time_without_cpu():
    s = pc.Schedule(MPI.COMM_SELF)
    d = s.delay(0.5)
    s.nop(after=[d])
    cpu0, t0 = time.process_time(), time.monotonic()
    s.post().wait(timeout=10)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    assert 0.49 <= wall < 2.0
    assert cpu < 0.15, f"a 0.5 s delay used {cpu:.3f} s of CPU"
    s.free()


def test_delay_read_from_a_buffer_each_round():
    s = pc.Schedule(MPI.COMM_SELF)
    secs = np.zeros(1)
    p = s.buffer(secs)
    s.delay(p[0:1])
    for want in (0.05, 0.3):
        secs[0] = want
        t0 = time.monotonic()
        s.post().wait(timeout=10)
        assert want - 0.01 <= time.monotonic() - t0 < want + 1.0
    s.free()


def test_start_at_an_absolute_time_and_in_the_past():
    s = pc.Schedule(MPI.COMM_SELF)
    at = np.zeros(1)
    s.start_at(s.buffer(at)[0:1])
    at[0] = pc.now() + 0.2
    s.post().wait(timeout=10)
    assert pc.now() >= at[0]
    at[0] = pc.now() - 5            # already past: completes at once
    t0 = time.monotonic()
    s.post().wait(timeout=10)
    assert time.monotonic() - t0 < 0.5
    s.free()


def test_bad_timed_arguments():
    s = pc.Schedule(MPI.COMM_SELF)
    with pytest.raises(pc.ScheduleError, match="seconds"):
        s.delay("soon")
    b = s.buffer(np.zeros(2, np.int64))
    with pytest.raises(pc.ScheduleError, match="float64"):
        s.delay(b[0:1])
    with pytest.raises(pc.ScheduleError, match=">= 0"):
        s.recv(s.buffer(np.zeros(1)), 0, timeout=-1)


def test_gate_completes_only_when_the_application_opens_it():
    s = pc.Schedule(MPI.COMM_SELF, persistent=True)
    acc, one = np.zeros(1, np.int64), np.ones(1, np.int64)
    t = s.trigger()
    g = s.gate(after=[t])
    s.reduce(s.buffer(acc), s.buffer(one, writable=False), after=[g])
    s.post()
    with pytest.raises(pc.WaitTimeout):
        s.wait_gate(timeout=0.1)        # nothing ready yet
    for r in range(3):
        s.fire(t)
        op, rnd = s.wait_gate(timeout=5)
        assert (op, rnd) == (g, r)
        time.sleep(0.05)
        assert s.rounds == r and acc[0] == r    # held by the gate
        s.open_gate(op, rnd)
        s.wait(round=r, timeout=5)
        assert acc[0] == r + 1
    s.free()


def test_wait_gate_wakes_without_polling():
    """A thread blocked in wait_gate() is woken by the gate, not a timer."""
    s = pc.Schedule(MPI.COMM_SELF)
    d = s.delay(0.3)
    g = s.gate(after=[d])
    s.post()
    got = []
    th = threading.Thread(target=lambda: got.append(s.wait_gate(timeout=10)))
    cpu0 = time.process_time()
    th.start()
    th.join(10)
    assert got == [(g, 0)]
    assert time.process_time() - cpu0 < 0.15
    s.open_gate(g, 0)
    s.wait(timeout=5)
    s.free()


def test_receive_timeout_and_late_message_is_never_taken():
    comm = MPI.COMM_SELF.Dup()
    got = np.zeros(1)
    s = pc.Schedule(comm)
    r = s.recv(s.buffer(got), 0, tag=9, timeout=0.1)
    s.post().wait(timeout=5)            # nothing sent: times out
    out = s.outcomes()
    assert out.round == 0 and out.name(r) == "timedout"
    assert s.stats["timedout"] == 1

    def send(value):
        x = np.full(1, value)
        t = pc.Schedule(comm)
        t.send(t.buffer(x, writable=False), 0, tag=9)
        t.post().wait(timeout=5)
        t.free()

    send(1.0)                           # the late message of round 0
    deadline = time.monotonic() + 5
    while s.stats["late"] < 1 and time.monotonic() < deadline:
        _core.engine_stats()
        time.sleep(0.01)
    assert s.stats["late"] == 1 and got[0] == 0.0
    req = s.post()
    send(2.0)
    req.wait(timeout=5)
    assert got[0] == 2.0 and s.outcomes().name(r) == "ok"
    s.free()
    comm.Free()


def test_skip_rules_and_scale_by_delivered_count():
    """Three receives, one never satisfied: a NOP joining them counts 2
    delivered; a reduce fed by the failed one does nothing; scale divides
    by delivered + 1 (the owner's own block, as RPS does)."""
    comm = MPI.COMM_SELF.Dup()
    acc = np.full(4, 3.0)
    tmp = [np.zeros(4) for _ in range(3)]
    data = [np.full(4, 6.0), np.full(4, 9.0)]
    s = pc.Schedule(comm)
    a = s.buffer(acc)
    recvs = [s.recv(s.buffer(t), 0, tag=k, timeout=0.3)
             for k, t in enumerate(tmp)]
    reds = [s.reduce(a, s.buffer(t), after=[rv])
            for t, rv in zip(tmp, recvs)]
    join = s.nop(after=recvs)
    must = s.nop(after=recvs, delivered=True)           # ALL delivered
    some = s.nop(after=recvs, need=2, delivered=True)   # 2 delivered
    sc = s.scale(a, count_of=join, add=1, after=reds + [join])
    req = s.post()
    for k, x in enumerate(data):        # tags 0 and 1 only
        t = pc.Schedule(comm)
        t.send(t.buffer(x, writable=False), 0, tag=k)
        t.post().wait(timeout=5)
        t.free()
    req.wait(timeout=5)
    out = s.outcomes()
    assert [out.name(x) for x in recvs] == ["ok", "ok", "timedout"]
    assert [out.name(x) for x in reds] == ["ok", "ok", "skipped"]
    assert out.delivered[join] == 2
    assert out.name(must) == "skipped" and out.name(some) == "ok"
    assert out.name(sc) == "ok"
    np.testing.assert_array_equal(acc, np.full(4, (3 + 6 + 9) / 3))
    s.free()
    comm.Free()


def test_counter_gate_releases_sends_in_order():
    comm = MPI.COMM_SELF.Dup()
    pc.set_send_cap(1)                  # one at a time: the order shows
    try:
        xs = [np.full(1, float(k)) for k in range(4)]
        ys = [np.zeros(1) for _ in range(4)]
        s = pc.Schedule(comm)
        orders = [2, 0, 3, 1]
        for k, x in enumerate(xs):
            s.send(s.buffer(x, writable=False), 0, tag=k, order=orders[k])
        for k, y in enumerate(ys):
            s.recv(s.buffer(y), 0, tag=k)
        pc.timeline.enable()
        s.post().wait(timeout=5)
        events = pc.timeline.events()
        pc.timeline.disable()
        assert [float(y[0]) for y in ys] == [0.0, 1.0, 2.0, 3.0]
        sent = [e["op"] for e in events if e["ev"] == "released" and
                e["sched"] == s.serial]
        assert [orders[op] for op in sent] == [0, 1, 2, 3]
    finally:
        pc.set_send_cap(0)
    s.free()
    comm.Free()


def test_order_needs_a_non_negative_int():
    s = pc.Schedule(MPI.COMM_SELF)
    b = s.buffer(np.zeros(1))
    with pytest.raises(pc.ScheduleError, match="order"):
        s.send(b, 0, order=-2)
    with pytest.raises(pc.ScheduleError, match="order"):
        s.send(peer=0, stamped=True, order=1)
