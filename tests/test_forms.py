"""Function forms (solo/majority/quorum_allreduce) and the collective ways
to flush and close partial objects: flush_partials, close_partials,
partials(); automatic flushes before library collectives; the bounded
cache."""
import gc
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import libcomm
from partialcoll.collectives.partial import forms as forms_module

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


@pytest.fixture(autouse=True)
def nothing_held_before():
    """Each test starts with no partial object open on COMM (the results
    of earlier modules' objects would otherwise add into settle_all)."""
    pc.close_partials(COMM)
WAITING = [("majority", lambda x, **k: pc.majority_allreduce(x, seed=3, **k)),
           ("quorum", lambda x, **k: pc.quorum_allreduce(x, max(1, P // 2),
                                                         **k))]


def skew(rng, scale=0.002):
    time.sleep(rng.random() * scale)


def settle_all():
    """Everything still held, summed per buffer size."""
    out = {}
    for _, res in pc.close_partials(COMM):
        n = res.data.size
        out[n] = out.get(n, 0) + res.data.reshape(-1)
    return out


@pytest.mark.parametrize("name,form", WAITING, ids=[w[0] for w in WAITING])
def test_library_collectives_flush_waiting_forms_first(name, form):
    """A rank inside a majority/quorum call may wait for one that went on
    to pc.allreduce; the allreduce flushes the form first, and what that
    flush returns comes back with the form's next result."""
    rng = random.Random(RANK)
    got = np.zeros(3, np.int64)
    for step in range(4):
        for _ in range(15):
            skew(rng)
            got += form(np.ones(3, np.int64)).data
        total = pc.allreduce(np.ones(2), comm=COMM)        # auto-flush
        assert (total == P).all()
        req = pc.iallreduce(np.ones(2))                     # auto-flush too
        req.wait()
    got += settle_all().get(3, 0)
    assert (got == 4 * 15 * P).all(), got


@pytest.mark.parametrize("name,form", WAITING, ids=[w[0] for w in WAITING])
def test_another_signature_flushes_the_first(name, form):
    rng = random.Random(10 + RANK)
    a, b = np.zeros(3, np.int64), np.zeros(5, np.int64)
    for _ in range(12):
        skew(rng)
        a += form(np.ones(3, np.int64)).data
        skew(rng)
        b += form(np.ones(5, np.int64)).data
    held = settle_all()
    a += held.get(3, 0)
    b += held.get(5, 0)
    assert (a == 12 * P).all() and (b == 12 * P).all(), (a, b)


def test_creating_an_object_flushes_waiting_forms():
    rng = random.Random(20 + RANK)
    got = np.zeros(2)
    for i in range(10):
        skew(rng)
        got += pc.majority_allreduce(np.ones(2), seed=1).data
    with pc.SoloAllreduce(np.zeros(7)) as ar:              # auto-flush
        ar(np.ones(7))
    got += settle_all().get(2, 0)
    assert (got == 10 * P).all()


def test_form_cache_is_bounded_and_eviction_loses_nothing():
    limit = forms_module.FORMS_PER_COMM
    sizes = range(1, limit + 6)
    got = {n: np.zeros(n) for n in sizes}
    for rep in range(2):
        for n in sizes:
            got[n] += pc.solo_allreduce(np.ones(n)).data
            cache = libcomm.find(COMM).cache["partial.forms"].cache
            assert len(cache) <= limit
    for n, data in settle_all().items():
        got[n] += data
    for n in sizes:
        assert (got[n] == 2 * P).all(), (n, got[n])


def test_flush_and_close_partials_cover_objects_made_and_dropped():
    rng = random.Random(30 + RANK)
    mine = pc.MajorityAllreduce(np.zeros(4), seed=2)
    mine.label = "mine"
    dropped = pc.SoloAllreduce(np.zeros(6))
    got = {4: np.zeros(4), 6: np.zeros(6), 8: np.zeros(8)}
    for _ in range(10):
        skew(rng)
        got[4] += mine(np.ones(4)).data
        got[8] += pc.quorum_allreduce(np.ones(8), 1).data
        if RANK or dropped is None:
            continue
        got[6] += dropped(np.ones(6)).data
    if RANK == 0:
        del dropped                # on rank 0 only; the others still call
        gc.collect()
    else:
        for _ in range(5):
            got[6] += dropped(np.ones(6)).data
    flushed = pc.flush_partials(COMM)
    labels = [label for label, _ in flushed]
    assert "mine" in labels and any("SoloAllreduce #" in la for la in labels)
    assert any(la.startswith("quorum_allreduce(float64[8]") for la in labels)
    COMM.Barrier()                 # safe now: nobody waits in a partial call
    for _, res in flushed:
        got[res.data.size] += res.data
    for n, data in settle_all().items():
        got[n] += data
    assert mine.closed
    assert (got[4] == 10 * P).all() and (got[8] == 10 * P).all()
    assert (got[6] == 10 + 5 * (P - 1)).all(), got[6]


def test_context_manager_closes_and_returns_what_was_left():
    rng = random.Random(40 + RANK)
    got = np.zeros(3)
    with pc.partials(COMM) as scope:
        for _ in range(20):
            skew(rng)
            got += pc.majority_allreduce(np.ones(3), seed=9).data
    assert scope.results
    for _, res in scope.results:
        got += res.data
    assert (got == 20 * P).all()
    assert not libcomm.find(COMM).cache["partial.forms"].cache
    COMM.Barrier()


def test_options_of_a_function_form_are_checked_before_any_collective():
    """seed and quorum are part of the cached signature: a wrong type is
    refused on the calling rank before the flush of the other signatures
    or the creation (collectives the other ranks would not join)."""
    x = np.ones(4)
    pc.majority_allreduce(x, comm=COMM, seed=3)  # a signature cached first
    with pytest.raises(pc.ArgumentTypeError, match="seed must be an int"):
        pc.majority_allreduce(x, comm=COMM, seed="1")
    with pytest.raises(pc.ArgumentTypeError, match="quorum must be an int"):
        pc.quorum_allreduce(x, 1.5, comm=COMM)
    with pytest.raises(pc.ScheduleError, match="quorum must be"):
        pc.quorum_allreduce(x, 0, comm=COMM)
    forms = forms_module._forms(libcomm.library_comm(COMM))
    assert len(forms.cache) == 1
    # the cached signature was not flushed for the refused ones
    assert all(f.dirty for f in forms.cache.values())
    pc.close_partials(COMM)


def test_repeated_calls_take_the_cached_form_and_keep_its_contract():
    """A repeated call of a signature with NumPy arrays goes from one
    cached lookup to the object's one-frame call; the entries for it go
    with their forms when the cache evicts them, and a recvbuf the cached
    call cannot take is still checked, and refused, in full."""
    limit = forms_module.FORMS_PER_COMM
    sizes = range(1, limit + 6)
    got = {n: np.zeros(n) for n in sizes}
    out = {n: np.empty(n) for n in sizes}
    for rep in range(3):
        for n in sizes:
            res = pc.solo_allreduce(np.ones(n), out[n])
            assert res.data is out[n]
            got[n] += out[n]
            forms = libcomm.find(COMM).cache["partial.forms"]
            assert len(forms.fast) <= limit
            assert forms.fast[("solo", np.dtype(np.float64), (n,),
                               pc.SUM)][0] is forms.cache[next(reversed(
                                   forms.cache))]
    for n, data in settle_all().items():
        got[n] += data
    for n in sizes:
        assert (got[n] == 3 * P).all(), (n, got[n])
    x = np.ones(4)
    got = pc.solo_allreduce(x, np.empty(4)).data.copy()
    got += pc.solo_allreduce(x, np.empty(4)).data    # the cached path now
    with pytest.raises(pc.ScheduleError, match="recvbuf has 5 elements"):
        pc.solo_allreduce(x, np.empty(5))
    frozen = np.empty(4)
    frozen.flags.writeable = False
    with pytest.raises(pc.ScheduleError, match="read-only"):
        pc.solo_allreduce(x, frozen)
    res = pc.solo_allreduce(x, np.empty((2, 2)))        # another shape
    assert res.data.shape == (2, 2)
    got += res.data.reshape(-1)
    buf = np.empty(4)
    for _ in range(3):                     # in place, as comm.Allreduce
        buf[...] = 1
        res = pc.solo_allreduce(MPI.IN_PLACE, buf)
        assert res.data is buf
        got += buf
    got += settle_all().get(4, 0)          # both signatures of 4 elements
    assert (got == 6 * P).all(), got


def test_a_cached_call_delivers_later_flushes_as_its_own_type():
    """flush_partials returns a form's held result as its latest caller's
    type: a NumPy call on the cached path after a torch call of the same
    signature makes it NumPy again."""
    torch = pytest.importorskip("torch")
    k = max(1, P // 2)
    pc.quorum_allreduce(np.ones(3), k)
    pc.quorum_allreduce(torch.ones(3, dtype=torch.float64), k)
    pc.quorum_allreduce(np.ones(3), k)     # the cached path
    flushed = pc.flush_partials(COMM)
    assert flushed and all(type(res.data) is np.ndarray
                           for _, res in flushed), flushed
    pc.close_partials(COMM)


def test_a_cached_call_flushes_the_waiting_forms_first():
    """A solo form's repeated call, on the cached path, still flushes the
    majority form called before it (a rank inside that call may be
    waiting for this one), and what the flush returns comes back."""
    got = np.zeros(3)
    pc.solo_allreduce(np.ones(5))
    forms = libcomm.find(COMM).cache["partial.forms"]
    for _ in range(3):
        got += pc.majority_allreduce(np.ones(3), seed=3).data
        pc.solo_allreduce(np.ones(5))          # the cached path
        waiting = [f for f in forms.cache.values()
                   if f.rounds.kind == "majority"]
        assert waiting and not any(f.dirty for f in waiting)
    got += settle_all().get(3, 0)
    assert (got == 3 * P).all(), got


@pytest.mark.parametrize("name,form", WAITING, ids=[w[0] for w in WAITING])
def test_a_form_that_alone_waits_runs_no_hook_on_its_own_call(
        name, form, monkeypatch):
    """A waiting majority/quorum form marks its communicator with its own
    signature: its repeated calls run no before_collective hook (they
    would find nothing to flush), another signature's call or any other
    library collective runs them (and flushes it), and so does a mark
    another module left (pending True)."""
    runs = []
    real = libcomm._run_hooks
    monkeypatch.setattr(libcomm, "_run_hooks",
                        lambda event, *a: (runs.append(event), real(event,
                                                                    *a)))
    got = np.zeros(3)
    got += form(np.ones(3)).data
    lc = libcomm.find(COMM)
    mine = [f for f in lc.cache["partial.forms"].cache.values()
            if f.rounds.kind == name][0]
    assert lc.pending == mine.key
    runs.clear()
    for _ in range(5):
        got += form(np.ones(3)).data                # the cached path
    got += form(np.ones(3), op=MPI.SUM).data        # the general path
    assert runs == [] and lc.pending == mine.key
    lc.pending = True                               # another module's mark
    got += form(np.ones(3)).data
    assert runs == ["before_collective"] and lc.pending == mine.key
    assert mine.dirty                               # it still waits
    with pc.SoloAllreduce(np.zeros(2)):             # flushes it
        assert len(runs) == 2 and not mine.dirty
    got += settle_all().get(3, 0)
    assert (got == 8 * P).all(), got
