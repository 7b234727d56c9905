"""Executor semantics in one process: graph validation, ALL/ANY firing,
consumable ops, triggers, persistent re-arming, errors.  No mpiexec needed."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll import _core
from partialcoll.core.graph import STAMP_DATA_MAX
from partialcoll.core.ops import OPS


def counter_sched(persistent=True, mode=pc.ALL, ntrig=2, optional=False):
    """acc += 1 once per execution of an op depending on `ntrig` triggers."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=persistent)
    acc = np.zeros(1, np.int64)
    one = np.ones(1, np.int64)
    a, o = s.buffer(acc), s.buffer(one, writable=False)
    trigs = [s.trigger(optional=optional) for _ in range(ntrig)]
    s.reduce(a, o, pc.SUM, after=trigs, mode=mode)
    return s, acc, trigs


def wait_until(pred, timeout=5.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.001)
    return True


def test_all_waits_for_every_input_any_for_the_first():
    s = pc.Schedule(MPI.COMM_SELF)
    out = np.zeros(2, np.int64)
    one = np.ones(1, np.int64)
    bo, b1 = s.buffer(out), s.buffer(one, writable=False)
    t1, t2 = s.trigger(), s.trigger()
    s.copy(bo[0:1], b1, after=[t1, t2], mode=pc.ALL)
    s.copy(bo[1:2], b1, after=[t1, t2], mode=pc.ANY)
    req = s.post()
    s.fire(t1)
    assert wait_until(lambda: out[1] == 1)
    time.sleep(0.02)
    assert out[0] == 0 and not req.test()
    s.fire(t2)
    req.wait(timeout=5)
    assert list(out) == [1, 1]
    s.free()


def test_any_op_runs_once_per_round_even_when_all_inputs_complete():
    s, acc, (t1, t2) = counter_sched(mode=pc.ANY, optional=True)
    s.post()
    for r in range(500):
        s.fire(t1, round=r)
        s.fire(t2, round=r)
        s.wait(round=r, timeout=5)
    assert acc[0] == 500
    # each round's second trigger fire was surplus or stale, never a new round
    assert s.rounds == 500
    st = s.stats
    assert st["surplus"] + st["stale"] == 500
    s.free()


def test_persistent_schedule_rearms_for_thousands_of_rounds():
    s, acc, (t,) = counter_sched(ntrig=1)
    s.post()
    for r in range(5000):
        s.fire(t)
    s.wait(round=4999, timeout=20)
    assert s.rounds == 5000 and acc[0] == 5000
    time.sleep(0.01)
    assert s.rounds == 5000    # no round without a fire
    s.free()


def test_banked_fires_are_never_lost():
    s, acc, (t,) = counter_sched(ntrig=1)
    for _ in range(7):              # fired before the schedule is even posted
        s.commit()
        s.fire(t)
    s.post()
    s.wait(round=6, timeout=5)
    assert acc[0] == 7
    s.free()


def test_stamped_fire_for_a_past_round_is_discarded():
    s, acc, (t,) = counter_sched(ntrig=1)
    s.post()
    s.fire(t, round=0)
    s.wait(round=0, timeout=5)
    s.fire(t, round=0)              # late: round 0 is over
    s.fire(t, round=2)              # early: kept for round 2
    time.sleep(0.05)
    assert s.rounds == 1
    s.fire(t, round=1)
    s.wait(round=2, timeout=5)
    assert acc[0] == 3 and s.stats["stale"] == 1
    s.free()


def test_wait_timeout_raises():
    s, acc, (t,) = counter_sched(ntrig=1)
    s.post()
    with pytest.raises(pc.WaitTimeout):
        s.wait(round=0, timeout=0.05)
    with pytest.raises(TimeoutError):       # also a builtin TimeoutError
        s.wait(round=0, timeout=0.01)
    s.free()


def test_nop_chain_and_non_persistent_reposting():
    s = pc.Schedule(MPI.COMM_SELF)
    acc, one = np.zeros(1), np.ones(1)
    a, o = s.buffer(acc), s.buffer(one, writable=False)
    prev = s.nop()
    for _ in range(1000):
        prev = s.nop(after=prev)
    s.reduce(a, o, after=prev)
    reqs = [s.post() for _ in range(3)]     # queued rounds
    for r in reqs:
        r.wait(timeout=5)
    assert acc[0] == 3 and s.rounds == 3


def test_cycle_is_rejected_by_the_core():
    C = _core.constants()
    desc = np.zeros((2, C["DESC_LEN"]), np.int64)
    for field in ("D_TIMEOUT", "D_ORDER", "D_PSLOT", "D_REF", "D_PRSLOT"):
        desc[:, C[field]] = -1      # "none"
    desc[:, C["D_NDEPS"]] = 1       # one dependency each
    desc[0, C["D_DEPOFF"]], desc[1, C["D_DEPOFF"]] = 0, 1
    deps = np.array([1, 0], np.int64)
    with pytest.raises(pc.ScheduleError, match="cycle"):
        _core.Sched(desc.tobytes(), deps.tobytes(), 0,
                    MPI._addressof(MPI.COMM_SELF), False, MPI.COMM_SELF)


def test_ops_depend_only_on_earlier_ops():
    s = pc.Schedule(MPI.COMM_SELF)
    with pytest.raises(pc.ScheduleError):
        s.nop(after=[0])
    with pytest.raises(pc.ScheduleError):
        s.nop(after=[s.nop()], mode=7)


def test_buffer_errors():
    s = pc.Schedule(MPI.COMM_SELF)
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only"):
        s.recv(s.buffer(ro), 0)
    b = s.buffer(dtype=np.float64, size=8)
    c = s.buffer(dtype=np.float64, size=4)
    with pytest.raises(pc.ScheduleError, match="different lengths"):
        s.copy(b, c)
    s.copy(b[0:4], c)
    with pytest.raises(pc.ScheduleError, match="cannot take"):
        s.bind(b, np.zeros(3))
    with pytest.raises(pc.ScheduleError, match="not bound"):
        s.post()
    with pytest.raises(pc.ScheduleError, match="not defined"):
        s2 = pc.Schedule(MPI.COMM_SELF)
        x = s2.buffer(np.zeros(2, np.complex128))
        s2.reduce(x, x, pc.MAX)
    with pytest.raises(pc.ScheduleError, match="no MPI basic type"):
        pc.Schedule(MPI.COMM_SELF).buffer(np.zeros(2, "m8[s]"))
    with pytest.raises(pc.ScheduleError, match="peer"):
        s3 = pc.Schedule(MPI.COMM_SELF)
        s3.send(s3.buffer(np.zeros(1)), peer=5)
        s3.commit()


def test_freed_schedule_cannot_be_reused():
    s, acc, (t,) = counter_sched(ntrig=1)
    s.post()
    s.free()
    s.free()                                 # idempotent
    for call in (lambda: s.fire(t), s.wait, s.post, lambda: s.rounds):
        with pytest.raises(pc.ScheduleFreedError):
            call()


def test_rebinding_while_running_is_refused():
    s, acc, (t,) = counter_sched(ntrig=1)
    s.post()
    with pytest.raises(pc.ScheduleBusyError):
        s.bind(0, np.zeros(1, np.int64))
    with pytest.raises(pc.ScheduleBusyError):
        s.post()                             # persistent: posted once
    s.free()


def test_reduce_ops_and_dtypes_single_process():
    for name, op in [("SUM", pc.SUM), ("PROD", pc.PROD), ("MIN", pc.MIN),
                     ("MAX", pc.MAX), ("BXOR", pc.BXOR)]:
        s = pc.Schedule(MPI.COMM_SELF)
        x = np.array([3, 5, 7], np.int32)
        y = np.array([2, 6, 7], np.int32)
        ref = {"SUM": x + y, "PROD": x * y, "MIN": np.minimum(x, y),
               "MAX": np.maximum(x, y), "BXOR": x ^ y}[name]
        s.reduce(s.buffer(x), s.buffer(y, writable=False), op)
        s.post().wait(timeout=5)
        assert list(x) == list(ref), name


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64",
                                   "uint32", "uint64", "int16"])
@pytest.mark.parametrize("op", ["SUM", "PROD"])
def test_sums_and_products_are_elementwise_and_wrap(dtype, op):
    """The executor's own loops (sums and products of the common types)
    give what NumPy gives element by element, integers wrapping; other
    types go to MPI_Reduce_local (int16 here)."""
    rng = np.random.default_rng(1)
    n = 100_003                         # not a multiple of any vector width
    if np.dtype(dtype).kind == "f":
        x, y = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    else:
        info = np.iinfo(dtype)
        x, y = (rng.integers(info.min, info.max, n, dtype=dtype,
                             endpoint=True) for _ in range(2))
    want = (x + y) if op == "SUM" else (x * y)
    s = pc.Schedule(MPI.COMM_SELF)
    s.reduce(s.buffer(x), s.buffer(y, writable=False), getattr(pc, op))
    s.post().wait(timeout=5)
    assert np.array_equal(x.view(np.uint8), want.view(np.uint8))


def test_fill_sets_every_element_from_one():
    """A fill writes its value's one element everywhere, zero or not, and
    reads the value when it runs."""
    for dtype, value in (("float32", 0.0), ("float32", 1.5),
                         ("int64", -7), ("complex128", 2 - 1j),
                         ("float64", -0.0), ("uint8", 0xAB)):
        s = pc.Schedule(MPI.COMM_SELF, persistent=True)
        dst = np.full(1001, 3, dtype)
        v = np.array([value], dtype)
        t = s.trigger()
        s.fill(s.buffer(dst), s.buffer(v), after=[t], locked=True)
        s.post()
        s.fire(t)
        s.wait(0, timeout=5)
        assert np.array_equal(dst.view(np.uint8),
                              np.full(1001, value, dtype).view(np.uint8))
        v[0] = 1                              # read when the op runs
        s.fire(t)
        s.wait(1, timeout=5)
        assert (dst == 1).all()
        s.free()


@pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
def test_identity_op_x_is_x_unless_the_op_gives_truth_values(op):
    """What a partial call's deposit into an empty pending buffer relies
    on to copy instead of reducing (csrc/partial/calls.c): identity op x
    is x, for every op but those that give truth values."""
    for dt in sorted(op.dtypes, key=str):
        if dt.kind == "b":              # truth values already
            continue
        x = np.array([5, 0, 3, 2], dt)
        y = op.ufunc()(np.full(4, op.identity(dt), dt), x)
        assert np.array_equal(y, x) != op.truth_valued, (op, dt)


def test_fill_errors():
    s = pc.Schedule(MPI.COMM_SELF)
    dst = s.buffer(np.zeros(8))
    with pytest.raises(pc.ScheduleError, match="one element"):
        s.fill(dst, s.buffer(np.zeros(2)))
    with pytest.raises(pc.ScheduleError, match="different dtypes"):
        s.fill(dst, s.buffer(np.zeros(1, np.float32)))
    ro = np.zeros(8)
    ro.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only"):
        s.fill(s.buffer(ro), s.buffer(np.zeros(1)))
    s.fill(dst[2:6], s.buffer(np.zeros(1)))   # a range of a slot


def test_mpi4py_ops_and_names_are_accepted():
    assert pc.as_op(MPI.SUM) is pc.SUM and pc.as_op("max") is pc.MAX
    with pytest.raises(pc.ScheduleError):
        pc.as_op(MPI.MAXLOC)


def test_dot_export():
    s = pc.Schedule(MPI.COMM_SELF)
    b = s.buffer(np.zeros(2))
    t = s.trigger()
    s.nop(after=[t], mode=pc.ANY)
    s.send(b, 0, after=[t])
    dot = s.to_dot()
    assert dot.startswith('digraph "schedule"') and "n0 -> n1" in dot
    assert "dashed" in dot and "send to 0" in dot


def test_idle_progress_thread_uses_no_cpu():
    s, acc, (t,) = counter_sched(persistent=False, ntrig=1)
    s.post()
    s.fire(t)
    s.wait(timeout=5)                        # thread started, now idle
    time.sleep(0.05)
    c0 = pc.progress_thread_cputime()
    time.sleep(0.5)
    assert pc.progress_thread_cputime() - c0 < 0.005   # < 1% of a core


def test_settle_nudges_mpi_for_a_moment_then_sleeps():
    """After a control exchange (control.settle) the progress thread calls
    into MPI a few times with nothing of ours outstanding, ever more
    sparsely, then stops: the idle thread still uses no CPU."""
    from partialcoll.core import control
    assert wait_until(lambda: _core.engine_stats()["outstanding"] == 0)
    time.sleep(2 * control.SETTLE_S)         # an earlier settle is over
    n0 = _core.engine_stats()["nudges"]
    control.settle()
    time.sleep(2 * control.SETTLE_S)
    n1 = _core.engine_stats()["nudges"]
    assert 3 <= n1 - n0 <= 200, n1 - n0
    c0 = pc.progress_thread_cputime()
    time.sleep(0.3)
    assert _core.engine_stats()["nudges"] == n1
    assert pc.progress_thread_cputime() - c0 < 0.003


def test_control_waits_poll_only_with_a_core_per_local_rank(monkeypatch):
    """Control waits poll before they sleep only where the launcher says
    this host runs no more ranks than it has CPUs (MPICH's or Open MPI's
    count); without its word, or with more ranks than CPUs, they sleep."""
    from partialcoll.core import control
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(control.os, "cpu_count", lambda: 4)
    assert control._polling_seconds() == 0
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    assert control._polling_seconds() > 0
    monkeypatch.setenv("MPI_LOCALNRANKS", "5")
    assert control._polling_seconds() == 0
    monkeypatch.delenv("MPI_LOCALNRANKS")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert control._polling_seconds() > 0
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "not a number")
    assert control._polling_seconds() == 0


def test_stamped_message_of_another_schedule_is_dropped():
    """Same communicator and tag, different stamp id: never an activation.
    The control channel keeps it for a schedule with that id that may
    still be posted (engine stats: unclaimed)."""
    b = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=2)
    r = b.recv(peer=0, tag=7, stamped=True, optional=True)
    b.nop(after=[r])
    b.post()
    before = _core.engine_stats()["unclaimed"]
    a = pc.Schedule(MPI.COMM_SELF, stamp_id=1)
    a.send(peer=0, tag=7, stamped=True)
    a.post().wait(timeout=5)
    assert wait_until(lambda: _core.engine_stats()["unclaimed"] == before + 1)
    time.sleep(0.02)
    assert b.rounds == 0
    a.free()
    b.free()


def _stamped_sender(stamp_id, x, tag=3):
    """On each fire of its trigger: x *= 10, then x sent stamped to this
    rank (COMM_SELF), the round's data in the message."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=stamp_id)
    bx = s.buffer(x)
    ten = s.buffer(np.full(x.size, 10.0), writable=False)
    t = s.trigger()
    s.send(bx, 0, tag=tag, stamped=True,
           after=[s.reduce(bx, ten, pc.PROD, after=[t])])
    return s, t


def test_stamped_messages_carry_their_round_s_data():
    """Round r of the receiver gets the data sent in round r: the messages
    of rounds 1 and 2 come while its round 0 waits for a trigger, and are
    banked with their data until their rounds."""
    rx = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=11)
    got, acc = np.zeros(2), np.zeros(2)
    g, a = rx.buffer(got), rx.buffer(acc)
    gate = rx.trigger()
    heard = rx.recv(g, peer=0, tag=3, stamped=True)
    rx.reduce(a, g, pc.SUM, after=[heard, gate])
    rx.post()
    tx, t = _stamped_sender(11, np.array([1.0, -1.0]))
    tx.post()
    for r in range(3):
        tx.fire(t)
        tx.wait(round=r, timeout=5)
    time.sleep(0.05)
    assert rx.rounds == 0
    for _ in range(3):
        rx.fire(gate)
    rx.wait(round=2, timeout=5)
    assert acc.tolist() == [1110.0, -1110.0]    # 10 + 100 + 1000, once each
    tx.free()
    rx.free()


def test_stamped_data_before_its_receiver_exists_is_kept():
    """The control channel (listening for another schedule) keeps a
    message for a schedule not posted yet, data and all."""
    other = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=99)
    other.nop(after=[other.recv(peer=0, tag=3, stamped=True)])
    other.post()
    before = _core.engine_stats()["unclaimed"]
    tx, t = _stamped_sender(12, np.array([4.0, 2.0]))
    tx.post()
    tx.fire(t)
    tx.wait(round=0, timeout=5)
    assert wait_until(lambda: _core.engine_stats()["unclaimed"] ==
                      before + 1)
    rx = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=12)
    got = np.zeros(2)
    rx.recv(rx.buffer(got), peer=0, tag=3, stamped=True)
    rx.post()
    rx.wait(round=0, timeout=5)
    assert got.tolist() == [40.0, 20.0]
    tx.free()
    rx.free()
    other.free()


def test_stamped_data_of_another_size_fails_the_receiver():
    rx = pc.Schedule(MPI.COMM_SELF, persistent=True, stamp_id=13)
    got = np.zeros(3)
    rx.recv(rx.buffer(got), peer=0, tag=3, stamped=True)
    rx.post()
    tx, t = _stamped_sender(13, np.ones(2))
    tx.post()
    tx.fire(t)
    with pytest.raises(pc.ScheduleError, match="a stamped message of 16 "
                       "data bytes for a receive of 24"):
        rx.wait(round=0, timeout=5)
    assert got.tolist() == [0.0, 0.0, 0.0]       # nothing written
    tx.free()
    rx.free()


def test_stamped_data_is_small():
    s = pc.Schedule(MPI.COMM_SELF)
    big = s.buffer(np.zeros(STAMP_DATA_MAX // 8 + 1))
    small = s.buffer(np.zeros(STAMP_DATA_MAX // 8))
    for op in (s.send, s.recv):
        with pytest.raises(pc.ScheduleError, match=f"at most "
                           f"{STAMP_DATA_MAX} bytes, not "
                           f"{STAMP_DATA_MAX + 8}"):
            op(big, 0, stamped=True)
        op(small, 0, stamped=True)               # the largest that fits
    s.free()


def test_need_k_of_n_inputs():
    s, acc, trigs = counter_sched(persistent=True, ntrig=4, optional=True)
    s2 = pc.Schedule(MPI.COMM_SELF, persistent=True)
    acc2, one = np.zeros(1, np.int64), np.ones(1, np.int64)
    a, o = s2.buffer(acc2), s2.buffer(one, writable=False)
    ts = [s2.trigger(optional=True) for _ in range(4)]
    s2.reduce(a, o, after=ts, need=3)
    s2.post()
    s2.fire(ts[0], round=0)
    s2.fire(ts[1], round=0)
    time.sleep(0.02)
    assert s2.rounds == 0 and acc2[0] == 0     # 2 of 4: not yet
    s2.fire(ts[3], round=0)
    s2.wait(round=0, timeout=5)
    assert acc2[0] == 1
    with pytest.raises(pc.ScheduleError, match="need"):
        pc.Schedule(MPI.COMM_SELF).nop(after=[], need=1)
    s.free()
    s2.free()


def test_locked_chain_is_atomic_for_the_application():
    """A locked copy-then-reset chain never lets a deposit fall between."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=True)
    pend, out = np.zeros(1, np.int64), np.zeros(1, np.int64)
    total, zero = np.zeros(1, np.int64), np.zeros(1, np.int64)
    bp, bo, bt, bz = (s.buffer(pend), s.buffer(out), s.buffer(total),
                      s.buffer(zero, writable=False))
    t = s.trigger()
    c = s.copy(bo, bp, after=[t], locked=True)
    c = s.copy(bp, bz, after=[c], locked=True)
    s.reduce(bt, bo, after=[c], locked=True)
    s.post()
    for i in range(2000):
        with s.data_lock():
            pend[0] += 1
        if i % 7 == 0:
            s.fire(t)
    s.fire(t)
    s.wait(round=2000 // 7 + 1, timeout=10)
    with s.data_lock():
        assert total[0] + pend[0] == 2000
    s.free()


def test_priority_read_from_a_slot_orders_every_round():
    """Ops whose priority is an int64 slot element start in this round's
    order (lowest first, ties by index), read when they become ready."""
    s = pc.Schedule(MPI.COMM_SELF)
    prio = np.zeros(4, np.int64)
    slot = s.buffer(prio)
    for k in range(4):
        s.delay(0.0, priority=slot[k:k + 1])
    try:
        for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [-5, 7, 0, -1],
                      [1, 1, 0, 0]):
            prio[:] = order
            pc.timeline.clear()
            pc.timeline.enable()
            s.post().wait(timeout=10)
            pc.timeline.disable()
            started = [e["op"] for e in pc.timeline.events()
                       if e["ev"] == "start" and e["sched"] == s.serial]
            assert started == list(np.argsort(order, kind="stable")), order
    finally:
        pc.timeline.disable()
        pc.timeline.clear()
        s.free()


def test_priority_slot_must_be_one_host_int64():
    s = pc.Schedule(MPI.COMM_SELF)
    f = s.buffer(np.zeros(2))
    i = s.buffer(np.zeros(2, np.int64))
    with pytest.raises(pc.ScheduleError, match="priority"):
        s.delay(0.0, priority=f[0:1])
    with pytest.raises(pc.ScheduleError, match="priority"):
        s.delay(0.0, priority=i[0:2])
    with pytest.raises(pc.ScheduleError, match="priority"):
        s.delay(0.0, priority=1.5)
    s.free()


def test_dot_export_names_a_priority_read_from_a_slot():
    """An op whose priority is read from a buffer slot shows that slot
    element, not the constant 0 stored beside it; a constant priority
    shows itself."""
    s = pc.Schedule(MPI.COMM_SELF)
    b = s.buffer(np.zeros(2))
    prio = s.buffer(np.zeros(3, np.int64))
    s.send(b, 0, priority=prio[1:2])
    s.send(b, 0, priority=7)
    dot = s.to_dot()
    assert f"prio {prio[1:2]!r}" in dot, dot
    assert "prio 7" in dot and "prio 0" not in dot, dot


def test_apart_takes_alike_buffers_whose_memory_is_apart():
    """The cached allreduce plan's one check (core.buffers.apart): one
    format and length, a writable C-contiguous receive buffer, no
    overlap; anything else is False (the checked path then says why)."""
    from partialcoll.core.buffers import apart
    a, b = np.ones(8), np.empty(8)
    assert apart(a, b) and apart(a[:4], a[4:]) and apart(a, b.reshape(2, 4))
    assert not apart(a, a) and not apart(a[:5], a[3:])
    frozen = np.empty(8)
    frozen.flags.writeable = False
    for other in (b.view(np.int64), np.empty(8, ">f8"), np.empty(9),
                  np.empty(16, np.float32), frozen, np.empty(16)[::2], 3):
        assert not apart(a, other), other
    assert not apart(np.empty(16)[::2], b)
