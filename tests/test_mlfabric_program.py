"""From MLfabric batch plans to per-rank programs (no MPI): every send
has its receive, sums wait for their members, the server and the replica
apply commits in plan order, dropped updates send nothing, and a small
hand-checked plan."""
import random

import pytest

from partialcoll.mlfabric.scheduler.links import NetworkState
from partialcoll.mlfabric.scheduler.monitor import LinkMonitor
from partialcoll.mlfabric.scheduler.ordering import Update
from partialcoll.mlfabric.runtime.program import first_byte, programs
from partialcoll.mlfabric.scheduler.batch import Scheduler


def test_paper_fig2_plan_as_programs():
    """Fig. 2: g1, g2 straight to the server, g3 and g4 summed at 5."""
    rates = {n: 1.0 for n in range(6)}
    sched = Scheduler(0, range(1, 6), LinkMonitor(rates, dict(rates)),
                      tau_max=10, aggregators=[5])
    plan = sched.plan(0.0, [Update(f"g{w}", w, 1.0, 0) for w in (1, 2, 3,
                                                                 4)])
    progs = programs(plan, server=0)
    sends = {r: [(op.peer, op.what, op.start) for op in p.of("send")]
             for r, p in progs.items()}
    assert sends[1] == [(0, ("update", "g1"), 0.0)]
    assert sends[2] == [(0, ("update", "g2"), pytest.approx(1.0))]
    assert sends[3] == [(5, ("update", "g3"), 0.0)]
    assert sends[4] == [(5, ("update", "g4"), pytest.approx(1.0))]
    assert sends[5] == [(0, ("sum", ("server", 2)), pytest.approx(2.0))]
    server = progs[0]
    assert [op.commit for op in server.of("apply")] == [0, 1, 2]
    assert [op.peer for op in server.of("recv")] == [1, 2, 5]


def random_plans(seed, batches=4):
    rng = random.Random(seed)
    n_workers = rng.randrange(3, 8)
    nodes = list(range(2 + n_workers))
    rates = [1.0, 2.5, 5.0, 10.0]
    out = {n: rng.choice(rates) for n in nodes}
    inn = {n: rng.choice(rates) for n in nodes}
    sched = Scheduler(0, nodes, LinkMonitor(out, inn), rng.randrange(2, 9),
                      aggregators=rng.randrange(0, 3), replica=1,
                      replica_aggregators=rng.randrange(0, 3),
                      div_max=rng.uniform(3, 20), gamma=0.5, seed=seed)
    uid, plans = 0, []
    for b in range(batches):
        ups = []
        for _ in range(rng.randrange(0, 8)):
            ups.append(Update(uid, rng.randrange(2, 2 + n_workers),
                              rng.uniform(0.5, 3),
                              sched.version - rng.randrange(0, 10),
                              norm=rng.uniform(0.2, 2)))
            uid += 1
        plans.append(sched.plan(0.5 * b, ups))
    return plans


@pytest.mark.parametrize("seed", range(20))
def test_programs_are_consistent(seed):
    for plan in random_plans(seed):
        progs = programs(plan, server=0, replica=1)
        sends = {(r, op.peer, op.tag): op for r, p in progs.items()
                 for op in p.of("send")}
        recvs = {(op.peer, r, op.tag): op for r, p in progs.items()
                 for op in p.of("recv")}
        assert sends.keys() == recvs.keys()        # one receive per send
        assert len({k[2] for k in sends}) == len(sends)   # unique tags
        for key, op in sends.items():
            assert recvs[key].size == op.size and recvs[key].what == op.what
            assert op.start >= plan.now
        dropped = {g.uid for g, _ in plan.dropped}
        sent = {op.what[1] for op in sends.values() if op.what[0] == "update"}
        assert not dropped & sent
        for rank, p in progs.items():
            for i, op in enumerate(p.ops):
                assert all(j < i for j in op.after)
        for dst, groups in ((0, plan.groups),
                            (1, plan.replication.groups)):
            applies = progs[dst].of("apply") if groups else []
            assert [op.commit for op in applies] == list(range(len(groups)))
            for k in range(1, len(applies)):
                prev = progs[dst].ops.index(applies[k - 1])
                assert prev in applies[k].after


def test_first_byte_is_when_the_profile_starts():
    net = NetworkState({1: 1.0, 2: 1.0}, {0: 1.0})
    net.reserve(2, 0, 0.0, 3.0)
    tr = net.reserve(1, 0, 0.0, 1.0)
    assert tr.start == 0.0 and first_byte(tr) == pytest.approx(3.0)


def test_replica_transfers_yield_to_the_servers():
    from partialcoll.mlfabric.runtime.program import REPLICA_PRIORITY
    seen = set()
    for seed in range(10):
        for plan in random_plans(seed):
            progs = programs(plan, server=0, replica=1)
            for p in progs.values():
                for op in p.ops:
                    if op.kind == "drop":
                        continue
                    seen.add((op.stream, op.peer))
                    if op.kind == "send":
                        assert (op.priority >= REPLICA_PRIORITY) == \
                            (op.stream == "replica")
                    if op.kind == "apply":
                        assert p.rank == (0 if op.stream == "server" else 1)
    assert any(s == "replica" and peer not in (0, 1) for s, peer in seen)
