"""The executor's callback ops, and the partial allreduce's bookkeeping
that runs as two of them (``partial.snapshot`` and ``partial.account``,
csrc/partial/book.c): each against what its chain of copy and reduce
ops did, written out here in NumPy.  One process, no mpiexec."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll import _core
from partialcoll.collectives.partial import _calls, schedule


def test_the_book_s_fields_are_those_the_builder_lays_out():
    assert _calls.BOOK_FIELDS == schedule.META
    for P in (1, 2, 5):
        m = schedule.meta_buffers(P, 0)
        book = m["book"]
        assert book.size == 23 + 12 * P
        at = 0
        for k in schedule.META:        # views of the book, in its order
            assert np.shares_memory(m[k], book)
            assert m[k].__array_interface__["data"][0] == \
                book.__array_interface__["data"][0] + 8 * at
            at += m[k].size


def _random_book(P, rng):
    m = schedule.meta_buffers(P, int(rng.integers(P)))
    m["book"][...] = rng.integers(0, 5, m["book"].size)
    return m


def _run(name, a, b, P):
    """One round of a schedule whose one op is the callback ``name``."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=False)
    t = s.trigger()
    s.callback(name, s.buffer(a), s.buffer(b), P, after=[t], locked=True)
    s.post()
    s.fire(t)
    s.wait(0, timeout=5)
    s.free()


@pytest.mark.parametrize("P", [1, 2, 3, 8])
def test_snapshot_takes_the_flags_and_moves_the_sequence_numbers(P):
    rng = np.random.default_rng(P)
    m = _random_book(P, rng)
    before = {k: m[k].copy() for k in schedule.META}
    out = np.full(3 + 2 * P, -1, np.int64)
    _run(_calls.SNAPSHOT, out, m["book"], P)
    assert np.array_equal(out, before["flag"])
    assert np.array_equal(m["flag"], before["reset"])
    assert m["prev_seq"][0] == before["round_seq"][0]
    assert m["round_seq"][0] == before["dep_seq"][0]
    assert m["snaps"][0] == before["snaps"][0] + 1
    moved = {"flag", "prev_seq", "round_seq", "snaps"}
    for k in set(schedule.META) - moved:
        assert np.array_equal(m[k], before[k]), k


def _account_reference(b, meta, P):
    """What the chain of locked ops did (schedule.py before the callback):
    the round's counters, then the straggler counters over plain rounds."""
    b["acc_rounds"] += 1
    b["acc_seq"][...] = b["round_seq"]
    b["acc_lo"][...] = b["prev_seq"]
    b["last_active"][...] = meta[0:1]
    b["last_flush"][...] = meta[1:2]
    b["last_bypass"][...] = meta[2:3]
    b["flush_total"] += meta[1:2]
    b["plain"][...] = np.logical_xor(b["ones"] != 0, meta[3 + P:] != 0)
    b["late"][...] = meta[3:3 + P] * b["plain"]
    b["late_total"] += b["late"]
    b["lag"] += b["late"]
    b["lag"] *= b["late"]
    b["lag_total"] += b["lag"]
    b["stat_rounds"] += b["plain"][0:1]


@pytest.mark.parametrize("P", [1, 2, 3, 8])
def test_account_counts_the_round_and_its_stragglers(P):
    rng = np.random.default_rng(10 + P)
    for trial in range(20):
        m = _random_book(P, rng)
        m["ones"][...] = 1
        meta = rng.integers(0, 3, 3 + 2 * P)
        if trial % 3 == 0:
            meta[3 + P:] = 0                    # a plain round
        want = {k: v.copy() for k, v in m.items() if k != "book"}
        _account_reference(want, meta, P)
        _run(_calls.ACCOUNT, m["book"], meta, P)
        for k in schedule.META:
            assert np.array_equal(m[k], want[k]), (k, trial)


def test_a_callback_that_fails_fails_its_schedule():
    """The bookkeeping callbacks check their buffers' sizes: one too small
    for P ends the round with the callback's message."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=False)
    t = s.trigger()
    s.callback(_calls.ACCOUNT, s.buffer(np.zeros(10, np.int64)),
               s.buffer(np.zeros(7, np.int64)), 2, after=[t])
    s.post()
    s.fire(t)
    with pytest.raises(pc.ScheduleError, match="callback.*a book of 80 bytes"):
        s.wait(0, timeout=5)
    s.free()


def test_callback_arguments_are_checked():
    s = pc.Schedule(MPI.COMM_SELF)
    a, b = s.buffer(np.zeros(4, np.int64)), s.buffer(np.zeros(2))
    with pytest.raises(pc.ScheduleError, match="no native callback"):
        s.callback("no.such.callback", a, b)
    with pytest.raises(pc.ArgumentTypeError, match="name must be a str"):
        s.callback(print, a, b)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only"):
        s.callback(_calls.SNAPSHOT, a, s.buffer(ro))
    s.callback(_calls.SNAPSHOT, a[1:3], b, 1)   # ranges, other dtypes


def test_the_core_refuses_a_callback_nobody_registered():
    """A descriptor naming an unregistered callback id is refused when the
    schedule is built, not when the op runs."""
    C = _core.constants()
    desc = np.zeros((1, C["DESC_LEN"]), np.int64)
    for field in ("D_TIMEOUT", "D_ORDER", "D_PSLOT", "D_REF", "D_PRSLOT"):
        desc[:, C[field]] = -1
    desc[0, C["D_KIND"]] = C["CALLBACK"]
    desc[0, C["D_REDOP"]] = C["MAX_CALLBACKS"] - 1
    desc[0, C["D_ASLOT"]] = desc[0, C["D_BSLOT"]] = 0
    desc[0, C["D_COUNT"]] = 1
    with pytest.raises(pc.ScheduleError, match="no callback is registered"):
        _core.Sched(desc.tobytes(), b"", 1, MPI._addressof(MPI.COMM_SELF),
                    False, MPI.COMM_SELF)


def test_the_round_runs_two_callbacks_for_its_bookkeeping():
    """A partial allreduce's round (one rank) is its data ops and the two
    callbacks: no op per bookkeeping field."""
    ar = pc.SoloAllreduce(np.zeros(3, np.float32), comm=MPI.COMM_SELF)
    try:
        dot = ar._rounds.sched.to_dot()
        assert dot.count(": callback") == 2
        assert _calls.SNAPSHOT in dot and _calls.ACCOUNT in dot
        assert len(ar._rounds.sched) <= 8
        for _ in range(3):
            r = ar(np.ones(3, np.float32))
            assert r.included and np.array_equal(r.data, np.ones(3))
        assert ar.stats()["rounds"] == 3
    finally:
        ar.close()


def _gate_round(book, flags, rank):
    """One round: the drawn gate after a trigger, a NOP that counts only
    delivered inputs after it, and a second path (a trigger) into an ANY
    that also counts only delivered inputs.  Returns the outcomes of the
    gate, of the NOP after it and of the ANY, and the ANY's delivered
    inputs."""
    s = pc.Schedule(MPI.COMM_SELF, persistent=False)
    t, other = s.trigger(), s.trigger()
    gate = s.callback(_calls.DRAWN, s.buffer(book), s.buffer(flags), rank,
                      after=[t])
    after = s.nop(after=[gate], delivered=True)
    either = s.nop(after=[gate, other], mode=1, delivered=True)
    s.post()
    s.fire(t)
    s.fire(other)
    s.wait(0, timeout=5)
    oc = s.outcomes()
    s.free()
    return oc.name(gate), oc.name(after), oc.name(either), \
        int(oc.delivered[either])


@pytest.mark.parametrize("seed", [0, 7, 2**63 + 5])
def test_the_drawn_gate_declines_on_the_initiator_of_a_plain_round(seed):
    """partial.drawn (majority's two-rank round) declines where this rank
    is the round's drawn initiator (the round: the book's snaps) and the
    peer's flags carry no flush or bypass mark: its op ends skipped, a
    successor that counts delivered inputs skips, an ANY over it and
    another input fires on that other alone.  Elsewhere it lets the
    peer's data through."""
    from partialcoll.collectives.partial import designated
    declined = 0
    for rnd in range(12):
        for rank in (0, 1):
            book = schedule.meta_buffers(2, rank, seed)
            book["snaps"][0] = rnd
            for mark in (None, 1, 2):
                flags = np.zeros(7, np.int64)
                if mark is not None:
                    flags[mark] = 1
                drawn = designated(seed, rnd, 2) == rank and mark is None
                gate, after, either, n = _gate_round(book["book"], flags,
                                                     rank)
                assert gate == after == ("skipped" if drawn else "ok")
                assert either == "ok" and n == (1 if drawn else 2)
                declined += drawn
    assert 0 < declined < 24       # both ranks are drawn in some rounds


def test_the_drawn_gate_checks_its_buffers():
    book = schedule.meta_buffers(2, 0)["book"]
    s = pc.Schedule(MPI.COMM_SELF, persistent=False)
    t = s.trigger()
    s.callback(_calls.DRAWN, s.buffer(book), s.buffer(np.zeros(6, np.int64)),
               0, after=[t])
    s.post()
    s.fire(t)
    with pytest.raises(pc.ScheduleError, match="the drawn gate takes"):
        s.wait(0, timeout=5)
    s.free()
