"""Bad input to the collectives, the emulated network and the timeline
gets a clear error on every rank before anything is lost: found by calling
them as a user would (each case raised late, truncated a value, lost a
round's result or hung before)."""
import math

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P = COMM.size


def test_function_forms_check_recvbuf_before_the_round():
    """A recvbuf refused after the round ran lost that round's result."""
    pc.close_partials(COMM)              # what earlier tests left open
    bad = [np.zeros(3, np.float32), np.zeros(4), np.zeros(6)[::2]]
    ro = np.zeros(3)
    ro.flags.writeable = False
    for recvbuf in bad + [ro]:
        with pytest.raises(pc.ScheduleError):
            pc.solo_allreduce(np.ones(3), recvbuf=recvbuf)
    out = pc.close_partials(COMM)
    assert out == [], out            # no object was made, nothing is lost
    buf = np.ones(3)
    pc.solo_allreduce(MPI.IN_PLACE, buf)       # as comm.Allreduce
    rest = pc.close_partials(COMM)
    assert buf.sum() + sum(r.data.sum() for _, r in rest) == 3 * P


def test_in_place_is_not_a_buffer():
    with pytest.raises(pc.ScheduleError, match="IN_PLACE"):
        pc.SoloAllreduce(MPI.IN_PLACE)
    with pytest.raises(pc.ScheduleError, match="IN_PLACE needs recvbuf"):
        pc.solo_allreduce(MPI.IN_PLACE)


def test_a_buffer_spec_over_a_strided_array_is_refused():
    """reshape(-1) copied it: the result went to the copy."""
    a = np.zeros((3, 4))
    with pytest.raises(pc.ScheduleError, match="C-contiguous"):
        pc.allreduce(np.ones(6), [a[:, :2], MPI.DOUBLE])
    with pytest.raises(pc.ScheduleError, match="count must be an int >= 0"):
        pc.allreduce(np.ones(3), [np.zeros(4), -1, MPI.DOUBLE])
    out = np.zeros(4)
    pc.allreduce(np.ones(3), [out, 3, MPI.DOUBLE])
    assert list(out) == [P, P, P, 0]


@pytest.mark.parametrize("make, kw, match", [
    (pc.QuorumAllreduce, dict(quorum=1.9), "quorum"),
    (pc.QuorumAllreduce, dict(quorum=True), "quorum"),
    (pc.QuorumAllreduce, dict(quorum=1, sync_every=1.7), "sync_every"),
    (pc.MajorityAllreduce, dict(seed=1.5), "seed"),
    (pc.SoloAllreduce, dict(priority=2.0), "priority"),
])
def test_partial_options_are_not_truncated(make, kw, match):
    with pytest.raises(pc.ScheduleError, match=match):
        make(np.ones(2), **kw)


def test_the_base_class_says_what_to_make():
    with pytest.raises(TypeError, match="SoloAllreduce"):
        pc.PartialAllreduce(np.ones(2))


def test_rps_options():
    with pytest.raises(pc.ScheduleError, match="seed"):
        pc.RPSAverage(np.ones(4), seed=-1)
    avg = pc.RPSAverage(np.ones(4), traffic_class=np.int64(2),
                        timeout=math.inf)
    x = np.full(4, float(COMM.rank))
    avg(x)
    assert np.allclose(x, (P - 1) / 2)
    avg.close()


def test_load_balancing_refuses_on_every_rank():
    """The oracle without an emulated network failed on rank 0 alone, the
    others waiting for ever; a NaN lead hung every rank."""
    with pytest.raises(pc.ScheduleError, match="emulated network"):
        pc.LoadBalancedAllreduce(np.zeros(4), scheme="oracle")
    for lead in (math.nan, 1e9, -1, "soon"):
        with pytest.raises(pc.ScheduleError, match="lead"):
            pc.LoadBalancedAllreduce(np.zeros(4), lead=lead)
    COMM.Barrier()


@pytest.mark.parametrize("cfg, match", [
    ({"default": {"out_rate": math.nan}}, "must be > 0"),
    ({"trace": [{"rates": [1e6, 2e6], "probabilities": [math.nan, 1]}]},
     "probabilities"),
    ({"rank": {"00": {"out_rate": 1e6}}}, "not a rank"),
    ({"class": {"01": {"drop": 0.1}}}, "classes are 0..15"),
])
def test_network_descriptions(cfg, match):
    with pytest.raises(pc.ScheduleError, match=match):
        pc.network.enable(cfg)


def test_network_queries_and_sources():
    with pytest.raises(pc.ScheduleError, match="nic must be"):
        pc.network.nic_rate(0, "both")
    with pytest.raises(pc.ScheduleError, match="dict or the path"):
        pc.network.enable(5)


def test_timeline_path_is_checked_when_enabled(tmp_path):
    """A path in a missing directory failed only at exit: the whole trace
    was lost."""
    with pytest.raises(pc.ScheduleError, match="not a writable directory"):
        pc.timeline.enable(str(tmp_path / "missing" / "t.json"))
    assert not pc.timeline.enabled()


def test_the_straggler_report_outlives_close():
    """stats(), rounds and started() after close() said "the schedule has
    been freed"; a report read at the end of training is the usual case."""
    ar = pc.SoloAllreduce(np.ones(4))
    for _ in range(3):
        ar(np.ones(4))
    before = ar.stats()
    ar.close()
    after = ar.stats()
    assert after["calls"] == before["calls"] == 3
    assert after["rounds"] >= before["rounds"] >= 1     # rounds in flight
    assert len(after["late_share"]) == P                # may have ended
    assert ar.rounds >= 3 and ar.started >= 3
    with pytest.raises(pc.ScheduleError, match="closed"):
        ar(np.ones(4))
