"""MLfabric's allreduce tree (section 6 with Alg 3, and 10.3's get), no
MPI: the tree chosen for given link rates, worked out by hand, and the
plan's structure over random instances (every update reaches the root
once, every rank gets the result once, dependencies point backwards)."""
import random

import pytest

from partialcoll.mlfabric.scheduler.dyntree import PULL, PUSH, plan_tree

MB = 1e6
FAST = 10 * MB


def rates(**slow):
    """All four NICs of ranks 0..3 at 10 MB/s but those named
    ("in0": 1e6 is rank 0's incoming NIC at 1 MB/s)."""
    out = {r: FAST for r in range(4)}
    inn = {r: FAST for r in range(4)}
    for name, rate in slow.items():
        (out if name.startswith("out") else inn)[int(name[-1])] = rate
    return out, inn


def test_slow_root_link_aggregates_at_the_aggregator():
    """Root 0 receives at 1 MB/s, 1 MB updates from 1, 2, 3, aggregator 1.
    All direct: 3 s.  n = 0: 2 and 3 reach 1 by 0.1 and 0.2 s (1's own is
    local), the sum reaches 0 at 1.2 s.  n = 1: 1 direct until 1 s, the
    sum of 2, 3 after it: 2 s.  So every update goes through 1."""
    out, inn = rates(in0=1 * MB)
    plan = plan_tree([1, 2, 3], out, inn, root=0, aggregators=[1], size=MB)
    assert plan.parents() == {1: 1, 2: 1, 3: 1, ("sum", 1): 0}
    assert plan.push.cost == pytest.approx(1.2)
    assert plan.push.n == 0
    # the get on fast links: through relay 1 (0.1 + 0.2 s) ties direct
    # (3 x 0.1 s): ties go to aggregation (the smaller n)
    assert plan.sources() == {1: 0, 2: 1, 3: 1}
    assert plan.cost == pytest.approx(1.5)


def test_slow_aggregator_link_sends_everything_direct():
    """The same, but aggregator 1 receives at 0.1 MB/s: any update through
    it takes 10 s, so all three go straight to the root (3 s); the get
    sends each its copy directly (1 receives at 0.1 MB/s: 10 s)."""
    out, inn = rates(in0=1 * MB, in1=0.1 * MB)
    plan = plan_tree([1, 2, 3], out, inn, root=0, aggregators=[1], size=MB)
    assert plan.parents() == {1: 0, 2: 0, 3: 0}
    assert plan.push.cost == pytest.approx(3.0)
    assert plan.sources() == {1: 0, 2: 0, 3: 0}
    assert plan.cost == pytest.approx(13.0)


def test_slow_root_out_link_gets_through_a_relay():
    """The root sends at 1 MB/s: three copies out of it take 3 s; one to
    relay 1 (1 s) and two from 1 at 10 MB/s (0.2 s) take 1.2 s.  This is
    the mirrored Algorithm 3 of section 10.3."""
    out, inn = rates(out0=1 * MB)
    plan = plan_tree([1, 2, 3], out, inn, root=0, aggregators=[1], size=MB)
    assert plan.sources() == {1: 0, 2: 1, 3: 1}
    assert plan.cost - plan.push.cost == pytest.approx(1.2)


def test_the_tree_changes_with_the_rates():
    """Root 0 receives at 1 MB/s, two aggregators, one of them receiving
    at 10 kB/s (100 s for an update): it keeps only its own update (summed
    locally, nothing crosses its slow link) and the other aggregator takes
    the rest; swap the slow one and the tree follows."""
    out = {r: FAST for r in range(5)}
    inn = {**out, 0: 1 * MB}
    a = plan_tree([1, 2, 3, 4], out, {**inn, 1: 0.01 * MB}, 0, [1, 2], MB)
    b = plan_tree([1, 2, 3, 4], out, {**inn, 2: 0.01 * MB}, 0, [2, 1], MB)
    print(a.parents(), b.parents())
    assert a.shape() != b.shape()
    assert [p for k, p in a.parents().items() if k != 1].count(1) <= 1
    assert [p for k, p in b.parents().items() if k != 2].count(2) <= 1


def test_the_root_own_update_and_order():
    """The root's update never travels (it is the accumulator); the push
    takes the updates in the order they became ready."""
    out, inn = rates(in0=1 * MB)
    plan = plan_tree([3, 0, 2, 1], out, inn, root=0, aggregators=[],
                     size=MB)
    pushes = [h for h in plan.hops if h.kind == PUSH]
    assert [h.src for h in pushes] == [3, 2, 1]
    assert all(h.dst == 0 for h in pushes)
    assert plan.push.cost == pytest.approx(3.0)


def test_two_ranks_and_one_rank():
    plan = plan_tree([0, 1], {0: MB, 1: MB}, {0: MB, 1: MB}, 0, [1], MB)
    assert set(plan.parents()) <= {1, ("sum", 1)}
    assert plan.sources() == {1: 0}
    alone = plan_tree([0], {0: MB}, {0: MB}, 0, [], MB)
    assert alone.hops == [] and alone.parents() == {}


@pytest.mark.parametrize("seed", range(40))
def test_structure_on_random_instances(seed):
    rng = random.Random(seed)
    P = rng.randint(2, 9)
    factors = [1, 2.5, 3.3, 5, 10]
    out = {r: rng.choice(factors) * MB for r in range(P)}
    inn = {r: rng.choice(factors) * MB for r in range(P)}
    root = rng.randrange(P)
    others = [r for r in range(P) if r != root]
    aggs = rng.sample(others, rng.randint(0, len(others)))
    ready = rng.sample(range(P), P)
    plan = plan_tree(ready, out, inn, root, aggs, rng.choice([1e3, MB]),
                     now=5.0, first_tag=100)
    tags = [h.tag for h in plan.hops if h.tag is not None]
    assert len(set(tags)) == len(tags) and min(tags, default=100) == 100
    # every non-root update is summed exactly once, on its way to the root
    owners = [h.src for h in plan.hops
              if h.kind == PUSH and h.what == "update"]
    assert sorted(owners) == sorted(others)
    sums = [h for h in plan.hops if h.kind == PUSH and h.what == "sum"]
    assert all(h.dst == root and h.src in aggs for h in sums)
    assert all(h.dst in [root] + [s.src for s in sums]
               for h in plan.hops if h.what == "update")
    # every non-root rank gets the result exactly once, from the root or
    # from a rank that got it from the root
    pulls = [h for h in plan.hops if h.kind == PULL]
    assert sorted(h.dst for h in pulls) == sorted(others)
    src = plan.sources()
    assert all(src[h.dst] == root or src[src[h.dst]] == root for h in pulls)
    # dependencies are earlier hops; a push starts no earlier than planned
    seen = set()
    for h in plan.hops:
        assert set(h.after) <= seen, h
        if h.tag is not None:
            seen.add(h.tag)
        if h.start is not None:
            assert h.start >= 5.0
    assert plan.cost >= plan.push.cost >= 5.0
