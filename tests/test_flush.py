"""Synchronous rounds (flush, close, sync_every): a slow rank is waited for
without rounds fired on a timer, and nobody is left waiting."""
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
KINDS = [("solo", pc.SoloAllreduce, {}),
         ("majority", pc.MajorityAllreduce, {"seed": 5}),
         ("quorum", pc.QuorumAllreduce, {"quorum": max(1, P // 2)}),
         ("quorum-all", pc.QuorumAllreduce, {"quorum": P})]
IDS = [k[0] for k in KINDS]


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_flush_waits_for_a_slow_rank_without_running_rounds(name, cls, kw):
    """One rank computes for 1 s while the others are in flush(): at most
    the round pending at their entry runs meanwhile (it was 163 rounds of
    8 MiB, one every 2 ms), and the slow rank's progress thread spends
    about what it spends idle (it was 0.9 s of CPU).  Idle, with an object
    open, that thread polls for activation messages (0.03 to 0.07 s of CPU
    per second here), hence a bound relative to an idle second."""
    if P < 2:
        pytest.skip("needs two ranks")
    slow = P - 1
    ar = cls(np.zeros(1 << 18), **kw)          # 2 MiB
    x = np.ones(1 << 18)
    ar(x)
    ar.flush()
    COMM.Barrier()
    c0 = pc.progress_thread_cputime()
    time.sleep(1.0)                             # everyone idle: a baseline
    idle = pc.progress_thread_cputime() - c0
    COMM.Barrier()
    if RANK == slow:
        r0, c0 = ar.rounds, pc.progress_thread_cputime()
        time.sleep(1.0)                         # "computes"
        rounds, cpu = ar.rounds - r0, pc.progress_thread_cputime() - c0
        res = ar(x)              # collects the round the others started
        final = ar.flush()
    else:
        final = ar.flush()
    assert final.sync
    if RANK == slow:
        assert res.sync and not res.included
        assert rounds <= 2, f"{rounds} rounds ran while waiting for a rank"
        extra = cpu - idle
        assert extra < 0.1, (f"the slow rank's progress thread used "
                              f"{cpu:.3f} s of CPU ({idle:.3f} s idle)")
    ar.close()


@pytest.mark.parametrize("name,cls,kw", KINDS, ids=IDS)
def test_uneven_calls_then_flush_finish_and_lose_nothing(name, cls, kw):
    """Rank r makes 20 + 9r skewed calls and then flushes: ranks with more
    calls keep calling while others are in flush, and must neither wait
    for them nor lose anything (exactly-once, int64)."""
    rng = random.Random(RANK)
    ar = cls(np.zeros(3, np.int64), **kw)
    got = np.zeros(3, np.int64)
    for i in range(20 + 9 * RANK):
        time.sleep(rng.random() * 0.002 * (RANK + 1))
        got += ar(np.full(3, i + 1, np.int64)).data
    final = ar.flush()
    got += final.data
    assert final.sync and final.included
    total = sum(sum(range(1, 21 + 9 * r)) for r in range(P))
    assert (got == total).all(), (got, total)
    ar.close()


def test_sync_every_results_are_marked():
    ar = pc.MajorityAllreduce(np.zeros(2), sync_every=3)
    marks = [ar(np.ones(2)).sync for _ in range(6)]
    assert marks[2] and marks[5]
    ar.close()


def test_flushing_different_objects_is_an_error_everywhere():
    if P < 2:
        pytest.skip("needs two ranks")
    a, b = pc.SoloAllreduce(np.zeros(1)), pc.SoloAllreduce(np.zeros(1))
    with pytest.raises(pc.ScheduleError, match="different objects"):
        (a if RANK == 0 else b).flush()
    a.close()
    b.close()


def test_a_long_wait_says_what_it_waits_for(monkeypatch, caplog):
    """Majority: the first round's drawn initiator sleeps 1 s before its
    call; every other rank's call waits for it, and after
    PARTIALCOLL_WAIT_WARN_S (0.2 s here) logs once which rank the round
    waits for and the likely cause, then goes on waiting and completes."""
    if P < 2:
        pytest.skip("needs two ranks")
    from partialcoll.collectives.partial.kinds import designated
    monkeypatch.setenv("PARTIALCOLL_WAIT_WARN_S", "0.2")
    x = np.ones(4)
    with pc.MajorityAllreduce(x, seed=11) as ar:
        first = designated(11, 0, P)
        if RANK == first:
            time.sleep(1.0)
        with caplog.at_level("WARNING", logger="partialcoll"):
            res = ar(x)
        assert res.round >= 0
        said = [r.getMessage() for r in caplog.records
                if "has waited" in r.getMessage()]
        if RANK == first:
            assert said == []
        else:
            assert len(said) == 1, said
            assert f"rank {RANK} has waited 0.2 s for round 0, which " \
                   f"waits for rank {first}, drawn to start it" in said[0]
            assert "pc.flush_partials(comm)" in said[0]
        ar.flush()
