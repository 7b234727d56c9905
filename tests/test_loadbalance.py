"""LoadBalancedAllreduce at the running size: exact averages for every
scheme and slicing, measurements on an emulated network, and a plan that
moves load off a slow node."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.loadbalance.plan import integer_shares

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


@pytest.mark.parametrize("n,slice_elems,probes", [
    (0, 4, 2), (1, 4, 2), (37, 4, 2), (1000, 64, 2), (1000, 64, 0),
    (5000, 3000, 1)])
def test_average_is_exact(n, slice_elems, probes):
    x = (np.arange(n) % 7 + RANK).astype(np.float64)   # exact sums
    want = np.empty_like(x)
    COMM.Allreduce(x, want)
    want /= P
    with pc.LoadBalancedAllreduce(x, scheme="average",
                                  slice_elems=slice_elems, num_probe=probes,
                                  size_probe=8) as lb:
        for _ in range(3):
            y = x.copy()
            lb(y)
            assert np.array_equal(y, want)


def test_aware_plan_moves_load_off_a_slow_node():
    """Rank 0's NICs are 10x slower: after a few calls the aware scheme
    gives it no share (its own traffic is already its floor), and every
    call stays exact.  Rank 0's NICs are the bottleneck of every flow
    through them, so the scheduler measures them (from the messages'
    arrival times, which a loaded host running ranks late does not move):
    within 5 % (within 1.5 % in 18 calls at P = 8; before a link stopped
    counting as a flow between its probes and its averages, up to 15 %
    over).  A NIC that is not saturated is measured by what it carried:
    never above its rate."""
    if P < 3:
        pytest.skip("load does not depend on shares below 3 ranks")
    pc.network.enable({"default": {"out_rate": "20 MB/s",
                                   "in_rate": "20 MB/s"},
                       "rank": {"0": {"out_rate": "2 MB/s",
                                      "in_rate": "2 MB/s"}}})
    n = 250_000
    x0 = np.full(n, float(RANK), np.float32)
    try:
        with pc.LoadBalancedAllreduce(x0, scheme="aware", slice_elems=20_000,
                                      size_probe=5000) as lb:
            for _ in range(4):
                y = x0.copy()
                lb(y)
                assert np.allclose(y, (P - 1) / 2)
            S = lb.rates["S"]
            for nic in ("out", "in"):
                got = lb.rates[nic]
                assert got[0] == pytest.approx(2e6, rel=0.05), (nic, got)
                assert max(got[1:]) <= 1.10 * 20e6, (nic, got)
            assert S[0] < 0.5 * min(S[1:]), S
            # rank 0 is left with (almost) nothing.  A fast rank may be
            # given little too: while its share is small its incoming NIC
            # gets probes only, from senders busy with larger flows, so it
            # is not saturated and is measured low (plan.py: what no
            # passive measurement gives); the others carry the rest.
            assert lb.shares[0] < 0.05 * n
            assert sum(lb.shares[1:]) > 0.95 * n
            assert sum(lb.shares) == pytest.approx(n)
            # still probed, with probes of its share's size (at least
            # min_probe, by default slice_elems // 12 = 1,666) rather than
            # size_probe's 5,000
            mine = [c for _, c, o, probe in lb.plan["slices"]
                    if o == 0 and probe]
            share0 = integer_shares(n, lb.plan["shares"])[0]
            assert mine == [max(1666, min(5000, share0 // 2))] * 2, mine
    finally:
        pc.network.disable()


def test_aware_plan_follows_a_changed_rate_within_one_call():
    """Rank 0 slow for 4 calls, then rank 1 slow instead (the network
    re-enabled between calls, as a redraw): the plan after the first call
    on the new rates already gives rank 1 (almost) nothing.  A median of
    the last 3 calls' estimates still saw rank 1 fast then."""
    if P < 3:
        pytest.skip("load does not depend on shares below 3 ranks")

    def slow(rank):
        return {"default": {"out_rate": "20 MB/s", "in_rate": "20 MB/s"},
                "rank": {str(rank): {"out_rate": "2 MB/s",
                                     "in_rate": "2 MB/s"}}}
    n = 250_000
    x0 = np.full(n, float(RANK), np.float32)
    try:
        pc.network.enable(slow(0))
        with pc.LoadBalancedAllreduce(x0, scheme="aware", slice_elems=20_000,
                                      size_probe=5000) as lb:
            for _ in range(4):
                lb(x0.copy())
            assert lb.shares[0] < 0.05 * n
            pc.network.enable(slow(1))
            y = x0.copy()
            lb(y)
            assert np.allclose(y, (P - 1) / 2)
            # one call's reading, no median over calls: on 8 ranks over 2
            # cores it has read 1.90 to 2.00 MB/s.  What this needs is to
            # tell the new 2 MB/s from the old 20 (the records' median,
            # had the change not restarted them).
            assert lb.rates["S"][1] == pytest.approx(2e6, rel=0.15)
            assert lb.shares[1] < 0.05 * n, lb.shares
            assert sum(lb.shares) == pytest.approx(n)
    finally:
        pc.network.disable()


def test_bad_arguments():
    with pytest.raises(pc.ScheduleError, match="float"):
        pc.LoadBalancedAllreduce(np.zeros(4, np.int32))
    with pytest.raises(pc.ScheduleError, match="scheme"):
        pc.LoadBalancedAllreduce(np.zeros(4), scheme="fastest")
    with pytest.raises(pc.ScheduleError, match="measure"):
        pc.LoadBalancedAllreduce(np.zeros(4), measure=False)
    with pytest.raises(pc.ScheduleError, match="jump"):
        pc.LoadBalancedAllreduce(np.zeros(4), jump=1.0)
    with pytest.raises(pc.ScheduleError, match="min_probe"):
        pc.LoadBalancedAllreduce(np.zeros(4), min_probe=0)
    with pytest.raises(pc.ScheduleError, match="min_probe"):
        pc.LoadBalancedAllreduce(np.zeros(4), min_probe="small")
    with pytest.raises(pc.ScheduleError, match="min_probe"):
        pc.LoadBalancedAllreduce(np.zeros(4), min_probe=True)
    with pc.LoadBalancedAllreduce(np.zeros(4), min_probe=np.int64(5)) as lb:
        assert lb.min_probe == 5
    with pc.LoadBalancedAllreduce(np.zeros(4), scheme="average") as lb:
        with pytest.raises(pc.ScheduleError, match="float64"):
            lb(np.zeros(5))


def test_oracle_on_a_sub_communicator_reads_world_ranks():
    """The oracle plans with the network's rates, which are numbered by
    MPI_COMM_WORLD rank: on a sub-communicator it read rank i's rates for
    its rank i.  World rank 1 is slow; in the communicator of the ranks
    but 0 it is rank 0 and must get (almost) no share."""
    if P < 4:
        pytest.skip("needs a sub-communicator of 3 ranks or more")
    sub = COMM.Split(0 if RANK else MPI.UNDEFINED, RANK)
    pc.network.enable({"default": {"out_rate": "20 MB/s",
                                   "in_rate": "20 MB/s"},
                       "rank": {"1": {"out_rate": "2 MB/s",
                                      "in_rate": "2 MB/s"}}})
    try:
        if sub != MPI.COMM_NULL:
            n = 60_000
            x = np.full(n, float(sub.rank))
            with pc.LoadBalancedAllreduce(x, comm=sub, scheme="oracle",
                                          slice_elems=5000, num_probe=0,
                                          measure=False) as lb:
                for _ in range(2):
                    y = x.copy()
                    lb(y)
                    assert np.allclose(y, (sub.size - 1) / 2)
                assert lb.shares[0] < 0.2 * min(lb.shares[1:]), lb.shares
            sub.Free()
    finally:
        pc.network.disable()
