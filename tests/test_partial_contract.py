"""What the partial collectives promise, checked on every result of runs that
end unevenly (some ranks already in flush() while others still call):
majority's initiator is always active, quorum's rounds have k fresh
contributions or say they are synchronous, nothing is lost with or without
catch-up, the result fields agree with each other, and the straggler report
names the slow rank."""
import logging
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
K = max(1, P // 2)
KINDS = [("solo", pc.SoloAllreduce, {}),
         ("majority", pc.MajorityAllreduce, {"seed": 5}),
         ("quorum", pc.QuorumAllreduce, {"quorum": K})]
IDS = [k[0] for k in KINDS]


def uneven_run(ar, calls, max_skew, seed, contrib, slow=None):
    """Each rank makes a different number of calls with a random skew before
    each (0 .. max_skew s; ``slow``: rank P-1's instead), then flushes: the
    last calls of the ranks that stay longest meet ranks that are already
    inside flush()."""
    rng = random.Random(977 * seed + RANK)
    skew = slow if slow is not None and RANK == P - 1 else max_skew
    out = []
    for _ in range(calls - 37 * RANK % max(calls // 3, 1)):
        time.sleep(rng.random() * skew)
        x = contrib()
        out.append((x, ar(x)))
    uneven_run.entered = ar.started
    return out, ar.flush()


def before_any_flush(calls):
    """The results of rounds that every rank had started before the first
    rank entered flush(): no flush can have touched them (collective)."""
    first = COMM.allreduce(uneven_run.entered, op=MPI.MIN)
    return [res for _, res in calls if res.round < first]


def test_majority_initiator_is_always_active():
    """Every round a plain call returns has its drawn initiator's fresh data
    (active >= 1), unless it is marked synchronous; under 0..2 ms of
    random skew, rounds used to run ahead with active == 0.  Rounds that
    no flush can have touched are never marked synchronous."""
    ar = pc.MajorityAllreduce(np.zeros(2, np.int64), seed=11)
    calls, fin = uneven_run(ar, 150, 0.002, 1, lambda: np.ones(2, np.int64))
    bad = [res for _, res in calls if res.active < 1 and not res.sync]
    assert not bad, bad[:3]
    early = before_any_flush(calls)
    assert early, "no round before the first flush"
    assert all(not res.sync and res.active >= 1 for res in early), \
        [res for res in early if res.sync or res.active < 1][:3]
    assert fin.sync
    ar.close()


@pytest.mark.parametrize("k", sorted({1, K, P}))
def test_quorum_contract_is_exact(k):
    """Every result of a plain call has active >= k or says sync; checked on
    every call of uneven runs that end in flush (the README's contract).
    Rounds that no flush can have touched are plain and have k fresh
    contributions (marking every round synchronous would otherwise pass)."""
    ar = pc.QuorumAllreduce(np.zeros(2, np.int64), quorum=k)
    calls, _ = uneven_run(ar, 120, 0.001, 2 + k, lambda: np.ones(2, np.int64))
    bad = [res for _, res in calls if res.active < k and not res.sync]
    assert not bad, f"k={k}: {bad[:3]}"
    early = before_any_flush(calls)
    assert early, "no round before the first flush"
    assert all(not res.sync and res.active >= k for res in early), \
        f"k={k}: {[res for res in early if res.sync or res.active < k][:3]}"
    ar.close()


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_catch_up_results_add_up_round_by_round(name, cls, kw):
    """With catch-up, a result holds every round since this rank's last
    one: the running total of a rank's results, taken at each result's
    round, is the sum of rounds 0..round, the same on every rank that
    returned that round.  (A result holding only its latest round, the
    rest left to the flush, passes the exactly-once test but not this.)"""
    rng = np.random.default_rng(RANK + 29)
    ar = cls(np.zeros(4, np.int64), catch_up=True, **kw)
    calls, _ = uneven_run(ar, 200, 0.0005, 5,
                          lambda: rng.integers(-100, 100, 4), slow=0.004)
    total, at = np.zeros(4, np.int64), {}
    for _, res in calls:
        total = total + res.data
        at[res.round] = total.tolist()
    everyone = COMM.allgather(at)
    common = [(r, v, other[r]) for other in everyone for r, v in at.items()
              if r in other]
    assert common
    assert all(v == w for _, v, w in common), \
        [c for c in common if c[1] != c[2]][:3]
    if P > 1:          # the slow rank caught up on several rounds at once
        multi = COMM.allreduce(sum(res.rounds > 1 for _, res in calls))
        assert multi > 0
    ar.close()


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch_up",
                                                         "latest_only"])
@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_included_says_whether_the_calls_own_data_is_there(name, cls, kw,
                                                           catch_up):
    """Call c of rank r contributes a one-hot vector at slot (r, c):
    ``included`` is true exactly when that slot is set in the call's own
    result, and every slot is delivered exactly once over all results of
    a rank (its calls and the flush)."""
    calls_max = 120
    ar = cls(np.zeros(P * calls_max, np.int64), catch_up=catch_up, **kw)
    count = iter(range(calls_max))

    def one_hot():
        x = np.zeros(P * calls_max, np.int64)
        x[RANK * calls_max + next(count)] = 1
        return x

    calls, fin = uneven_run(ar, calls_max, 0.0005, 6, one_hot, slow=0.003)
    for c, (x, res) in enumerate(calls):
        mine = res.data[RANK * calls_max + c]
        assert mine in (0, 1)
        assert res.included == bool(mine), (c, res)
    got = sum(res.data for _, res in calls) + fin.data
    made = COMM.allreduce(sum(x for x, _ in calls))
    assert np.array_equal(got, made)
    assert set(got.tolist()) <= {0, 1}
    ar.close()


def test_latest_only_skips_rounds_and_the_flush_returns_them():
    """Rank P-1 sleeps up to 5 ms before each call while the others drive
    solo rounds: latest-only, it passes over rounds (skipped > 0), and its
    results plus the flush still hold every deposit exactly once."""
    if P < 2:
        pytest.skip("needs two ranks")
    ar = pc.SoloAllreduce(np.zeros(1, np.int64), catch_up=False)
    calls, fin = uneven_run(ar, 150, 0.0002, 7, lambda: np.ones(1, np.int64),
                            slow=0.005)
    passed = sum(res.skipped for _, res in calls)
    if RANK == P - 1:
        assert passed > 0
    got = sum(int(res.data[0]) for _, res in calls) + int(fin.data[0])
    assert got == COMM.allreduce(len(calls))
    assert fin.rounds >= passed + 1
    ar.close()


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch_up",
                                                         "latest_only"])
@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_flush_delivers_everything_exactly_once(name, cls, kw, catch_up):
    """The sum of everything a rank got (every call and the flush) equals
    the sum of every deposit of every rank, exactly (int64), with and
    without catch-up; and ``rounds`` over all results counts every round
    this rank completed exactly once."""
    rng = np.random.default_rng(RANK + 17)
    ar = cls(np.zeros(4, np.int64), catch_up=catch_up, **kw)
    calls, fin = uneven_run(ar, 200, 0.0005, 3,
                            lambda: rng.integers(-100, 100, 4))
    done = ar.rounds        # before the Allreduce: no rank is in close() yet
    got = sum(res.data for _, res in calls) + fin.data
    total = np.empty(4, np.int64)
    COMM.Allreduce(sum(x for x, _ in calls), total)
    assert np.array_equal(got, total), (got, total)
    counted = sum(res.rounds for _, res in calls) + fin.rounds
    assert counted == done, (counted, done)
    assert fin.skipped == 0 and fin.included
    ar.close()


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_result_fields_mean_one_thing(name, cls, kw):
    """Latest-only results hold one round (rounds == 1), say how many they
    passed over (skipped), and those come back in the flush; with catch-up,
    nothing is skipped.  Every call contributes 1, so data[0] counts the
    deposits in data's rounds, at least the fresh ones of the last."""
    for catch_up in (True, False):
        ar = cls(np.zeros(1, np.int64), catch_up=catch_up, **kw)
        calls, fin = uneven_run(ar, 150, 0.0005, 4,
                                lambda: np.ones(1, np.int64))
        for _, res in calls:
            assert res.rounds >= 1 and res.round >= 0
            assert res.data[0] >= res.active
            if catch_up:
                assert res.skipped == 0
            else:
                assert res.rounds == 1
        passed = sum(res.skipped for _, res in calls)
        assert ar.stats()["skipped"] == 0
        if not catch_up:
            # the flush returns its own round, the passed-over ones and the
            # ones completed after this rank's last call
            assert fin.rounds >= passed + 1
        else:
            assert passed == 0
        ar.close()


def test_straggler_report_names_the_slow_rank(caplog):
    """Rank P-1 sleeps 20 ms before each call, the others 0.2 ms: it is
    late in most solo rounds; every rank reports the same lists; a warning
    on rank 0 names it once.  (With 4 ms the test failed once on a loaded machine:
    rounds then took about as long as the slow rank's sleep, so its calls
    started as many rounds as the others'.  20 ms keeps it the slowest by
    far whatever a round costs under load, and still leaves the fast ranks
    hundreds of rounds in 1.5 s.)"""
    if P < 2:
        pytest.skip("needs two ranks")
    ar = pc.SoloAllreduce(np.zeros(8))
    x = np.ones(8)
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        t_end = time.monotonic() + 1.5
        go = True
        while go:
            time.sleep(0.02 if RANK == P - 1 else 0.0002)
            ar(x)
            go = time.monotonic() < t_end
        ar.flush()
    st = ar.stats()
    everyone = COMM.allgather((st["rounds"], st["late_share"],
                               st["mean_lag"]))
    assert all(e == everyone[0] for e in everyone), everyone
    assert st["rounds"] >= 100, st
    assert st["slowest"] == P - 1, st
    assert st["late_share"][P - 1] > 0.5, st
    assert st["mean_lag"][P - 1] >= 1.0, st
    warned = [r for r in caplog.records if "were late" in r.getMessage()]
    # said once for the job, by rank 0: every rank has the same counts
    assert len(warned) == (1 if RANK == 0 else 0), warned
    if warned:
        assert str(P - 1) in warned[0].getMessage()
    ar.close()


def test_no_rank_is_late_in_synchronous_rounds(caplog):
    """The report counts plain rounds only: with sync_every=1 every round is
    synchronous (everyone waits for the slow rank), so none is counted and
    nothing is logged."""
    ar = pc.SoloAllreduce(np.zeros(2), sync_every=1)
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        for i in range(120):
            if RANK == P - 1:
                time.sleep(0.001)
            ar(np.ones(2))
    st = ar.stats()
    assert ar.rounds >= 120 and st["rounds"] == 0, (ar.rounds, st)
    assert st["late_share"] == [0.0] * P, st
    assert not [r for r in caplog.records if "were late" in r.getMessage()]
    ar.close()


def test_eager_stats_carry_the_straggler_report():
    from partialcoll.eager import EagerAverager
    avg = EagerAverager([np.zeros(3, np.float32)], mode="solo")
    for _ in range(5):
        avg.reduce([np.ones(3, np.float32)])
    st = avg.stats()
    assert len(st["late_share"]) == P and len(st["mean_lag"]) == P
    assert st["slowest"] in range(P)
    avg.close()


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_tree_activation_keeps_the_contract(monkeypatch, name, cls, kw):
    """Above FLAT_MAX ranks the activation spreads along the circulant
    trees instead of going to every rank directly: forced here at this
    P, the same runs deliver everything exactly once, and majority's
    rounds still hold their initiator's data."""
    from partialcoll.collectives.partial import schedule
    monkeypatch.setattr(schedule, "FLAT_MAX", 1)
    rng = np.random.default_rng(RANK + 41)
    ar = cls(np.zeros(4, np.int64), **kw)
    calls, fin = uneven_run(ar, 150, 0.0005, 7,
                            lambda: rng.integers(-100, 100, 4))
    got = sum(res.data for _, res in calls) + fin.data
    total = np.empty(4, np.int64)
    COMM.Allreduce(sum(x for x, _ in calls), total)
    assert np.array_equal(got, total), (got, total)
    if name == "majority":
        bad = [res for _, res in calls if res.active < 1 and not res.sync]
        assert not bad, bad[:3]
    ar.close()
