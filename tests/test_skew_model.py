"""bench/skew_model.py: the protocols' model under linear skew, on cases
worked by hand and on the properties each protocol promises."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    spec = importlib.util.spec_from_file_location(
        "skew_model", os.path.join(ROOT, "bench", "skew_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model = load()


def test_solo_by_hand():
    # P = 2, 1 ms step, rounds of 0.5 ms, 2 calls each.  Rank 0 starts
    # round 0 at 0 (0.5 ms) and round 1 at 0.5 (0.5 ms); rank 1 comes at
    # 1.0, when round 1 ends, and takes both at once (0 ms); its second
    # call, at 2.0, starts round 2 (0.5 ms)
    lat, nap = model.Model("solo", 2, 1e-3, 0.5e-3, 1, 2).run()
    assert lat == pytest.approx((0.5 + 0.5 + 0 + 0.5) / 4 * 1e-3)
    assert nap == 1


def test_a_call_during_a_round_waits_for_it_and_is_not_fresh():
    # P = 2, no skew, rounds of 1 ms: rank 0 starts round 0 at 0; rank 1's
    # call at 0 comes after it (the same time, later in order), finds it
    # running, carries its data on and waits for it
    m = model.Model("solo", 2, 0.0, 1e-3, 1, 1)
    lat, nap = m.run()
    assert lat == pytest.approx(1e-3)
    assert nap == 1 and m.started == 1


def test_mpi_allreduce_waits_for_the_last_rank():
    assert model.mpi_latency(8, 1e-3, 0) == pytest.approx(3.5e-3)
    assert model.mpi_latency(4, 2e-3, 1e-4) == pytest.approx(3.1e-3)


@pytest.mark.parametrize("P", [8, 16, 32])
def test_each_protocol_keeps_its_promise(P):
    step, k = 1e-3, P // 2
    solo = model.Model("solo", P, step, 0.0, k, 64).run()
    majority = model.Model("majority", P, step, 0.0, k, 64).run()
    quorum_model = model.Model("quorum", P, step, 0.0, k, 64)
    quorum = quorum_model.run()
    assert solo == (0.0, 1.0)          # nobody waits when rounds cost 0
    assert quorum[1] >= k              # k fresh deposits in every round
    assert abs(majority[1] - P / 2) <= 0.2 * P / 2
    # every implementation beats MPI_Allreduce, which waits for the last
    base = model.mpi_latency(P, step, 0.0)
    assert majority[0] < base and quorum[0] < base


def test_a_round_nobody_can_start_is_started_by_close():
    # quorum of 2 ranks out of 2, one call each, rank 1 a long way behind:
    # the round starts when rank 1 comes; with k = 3 > P no call starts
    # it, and the closing round does, after the last call
    m = model.Model("quorum", 2, 5e-3, 0.0, 3, 1)
    lat, nap = m.run()
    assert m.started == 1 and m.closing == 0
    assert lat == pytest.approx(5e-3 / 2)    # rank 0 waits 5 ms, rank 1 0
    assert nap == 0                          # no round before close()
