"""MLfabric's model distribution for the parameter server's pulls
(section 10.3, :func:`partialcoll.mlfabric.scheduler.dyntree.plan_distribution`),
no MPI: who gets the model from whom for given link rates, worked out by
hand, the refusals, and the structure over random instances (every
requester exactly once, from the server or from a relay that got it from
the server first); the same for the one-copy tree (:func:`plan_relayed`)."""
import random

import pytest

from partialcoll.mlfabric.runtime.config import RunConfig
from partialcoll.mlfabric.scheduler.dyntree import (choose_relays,
                                                    plan_distribution,
                                                    plan_relayed)

MB = 1e6
FAST = 10 * MB


def rates(n=4, **slow):
    """NICs of ranks 0..n-1 at 10 MB/s but those named ("out0": 1e6 is
    rank 0's outgoing NIC at 1 MB/s, "inn1" rank 1's incoming)."""
    out = {r: FAST for r in range(n)}
    inn = {r: FAST for r in range(n)}
    for name, rate in slow.items():
        (out if name.startswith("out") else inn)[int(name[3:])] = rate
    return out, inn


def random_instance(seed):
    """2 to 12 ranks with NICs drawn from the paper's factors x 1 MB/s, a
    server, some requesters and some of them as relays."""
    rng = random.Random(seed)
    P = rng.randint(2, 12)
    factors = [1, 2.5, 3.3, 5, 10]
    out = {r: rng.choice(factors) * MB for r in range(P)}
    inn = {r: rng.choice(factors) * MB for r in range(P)}
    server = rng.randrange(P)
    others = [r for r in range(P) if r != server]
    requests = rng.sample(others, rng.randint(1, len(others)))
    relays = rng.sample(requests, rng.randint(0, len(requests)))
    return rng, out, inn, server, requests, relays


def sources(hops):
    return {dst: src for src, dst, _ in hops}


def test_slow_server_link_sends_through_the_relay():
    """The server sends at 1 MB/s: three 1 MB copies out of it take 3 s,
    one to relay 1 (1 s) and two from 1 at 10 MB/s (0.2 s) take 1.2 s."""
    out, inn = rates(out0=1 * MB)
    hops = plan_distribution([1, 2, 3], out, inn, 0, [1], MB)
    assert sources(hops) == {1: 0, 2: 1, 3: 1}
    # the relay's own copy is planned before what it forwards
    assert hops[0][:2] == (0, 1)


def test_slow_relay_link_sends_everything_direct():
    """Relay 1 sends at 10 kB/s (100 s a copy): the server serves all
    three itself."""
    out, inn = rates(out0=1 * MB, out1=0.01 * MB)
    hops = plan_distribution([1, 2, 3], out, inn, 0, [1], MB)
    assert sources(hops) == {1: 0, 2: 0, 3: 0}


def test_no_distributors_or_one_request():
    out, inn = rates(out0=1 * MB)
    assert sources(plan_distribution([3, 2], out, inn, 0, [], MB)) == \
        {3: 0, 2: 0}
    assert plan_distribution([2], out, inn, 0, [2], MB) == [(0, 2, 0)]
    # the server among the requests is skipped
    assert sources(plan_distribution([0, 1], out, inn, 0, [], MB)) == {1: 0}


def test_the_last_relay_is_served_first():
    """Two relays behind a slow server link: the server's copies go to
    the relays first (the k-th first, section 10.3), the direct group
    last; priorities follow the list."""
    out, inn = rates(n=7, out0=1 * MB)
    hops = plan_distribution([1, 2, 3, 4, 5, 6], out, inn, 0, [1, 4], MB)
    server = [(dst, prio) for src, dst, prio in hops if src == 0]
    relays = {s for s, _, _ in hops} - {0}
    assert relays and relays <= {1, 4}
    direct = [d for d, _ in server if d not in relays]
    assert [d for d, _ in server][:len(relays)] == \
        [d for d, _ in server if d in relays]
    assert all(prio >= 0 for _, prio in server)
    assert len(server) == len(relays) + len(direct) < 6


def test_refuses_a_distributor_that_did_not_ask():
    out, inn = rates()
    with pytest.raises(ValueError, match="among the requests"):
        plan_distribution([1, 2], out, inn, 0, [3], MB)


@pytest.mark.parametrize("seed", range(30))
def test_structure_on_random_instances(seed):
    rng, out, inn, server, requests, relays = random_instance(seed)
    hops = plan_distribution(requests, out, inn, server, relays,
                             rng.choice([1e3, MB]), now=3.0)
    # every requester exactly once; from the server or from a relay that
    # got its copy from the server earlier in the list
    assert sorted(d for _, d, _ in hops) == sorted(requests)
    src = sources(hops)
    for i, (s, d, _) in enumerate(hops):
        if s != server:
            assert s in relays and src[s] == server
            assert (server, s) in [h[:2] for h in hops[:i]]


def test_run_config_checks_distributors():
    cfg = RunConfig(mode="mlfabric", tau_max=4, duration=1.0,
                    distributors=2)
    assert cfg.distributors == 2
    import numpy as np
    assert RunConfig(mode="mlfabric-s", duration=1.0,
                     distributors=np.int64(1)).distributors == 1
    with pytest.raises(ValueError, match="mode 'mlfabric'"):
        RunConfig(mode="async", duration=1.0, distributors=1)
    with pytest.raises(ValueError, match=">= 0"):
        RunConfig(mode="mlfabric", tau_max=4, duration=1.0, distributors=-1)
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError, match="integer"):
            RunConfig(mode="mlfabric", tau_max=4, duration=1.0,
                      distributors=bad)


def test_one_copy_tree_by_hand():
    """Equal 10 MB/s links, 1 MB: the server sends to relay 1 (0.1 s);
    1 passes it to relay 2 (0.2 s); then 3 from 1 (0.3 s, the tie goes to
    the earlier relay) and 4 from 2, free at 0.2 (0.3 s)."""
    out, inn = rates(n=5)
    assert plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB) == \
        [(0, 1, 0), (1, 2, 0), (1, 3, 1), (2, 4, 0)]


def test_one_copy_tree_takes_the_faster_relay():
    """Relay 1 sends at 1 MB/s: it passes the copy to relay 2 (done at
    1.1 s), and 2, at 10 MB/s, serves 3 and 4 (1.2 s and 1.3 s) where 1
    would take until 2.1 s."""
    out, inn = rates(n=5, out1=1 * MB)
    hops = plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB)
    assert hops == [(0, 1, 0), (1, 2, 0), (2, 3, 0), (2, 4, 1)]


def test_one_copy_tree_without_relays_and_refusals():
    out, inn = rates()
    assert plan_relayed([3, 0, 2], out, inn, 0, [], MB) == \
        [(0, 3, 0), (0, 2, 1)]
    with pytest.raises(ValueError, match="among the requests"):
        plan_relayed([1, 2], out, inn, 0, [3], MB)


def test_choose_relays_by_hand():
    """Relays are ranked by their slower link: 1 sends at 10 MB/s but
    receives at 1 MB/s (slower link 1), 2 has 5/5 (5), 3 and 4 10/10
    (10).  k = 2: 3 and 4 (the tie to the earlier request); k = 3 adds 2,
    not 1, which the outgoing link alone would have ranked above 2.  At
    most one fewer than the requesters; the server is never one; k = 0:
    none."""
    out, inn = rates(n=5, inn1=1 * MB, out2=5 * MB, inn2=5 * MB)
    assert choose_relays([1, 2, 3, 4], out, inn, 0, 2) == [3, 4]
    assert choose_relays([1, 2, 4, 3], out, inn, 0, 3) == [4, 3, 2]
    assert choose_relays([1, 2, 3, 4], out, inn, 0, 9) == [3, 4, 2]
    assert choose_relays([0, 1, 2], out, inn, 0, 5) == [2]
    assert choose_relays([1, 2], out, inn, 0, 0) == []
    assert choose_relays([2], out, inn, 0, 1) == []
    # equal slower links: the faster outgoing link first
    out, inn = rates(n=3, inn1=1 * MB, out2=1 * MB)
    assert choose_relays([1, 2], out, inn, 0, 1) == [1]


def test_earliest_tree_by_hand():
    """The "earliest" tree (the server a holder too), equal 10 MB/s links
    and 1 MB: 1 from the server (0.1 s); 2 from 1 (0.2 s; the server
    would finish at the same time, and a tie goes to the relay); 3 from
    the server, free at 0.1 (0.2 s, where a relay would take until
    0.3 s); 4 from 1 (0.3 s, tied with the server and relay 2)."""
    out, inn = rates(n=5)
    assert plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB,
                        server_sends=True) == \
        [(0, 1, 0), (1, 2, 0), (0, 3, 1), (1, 4, 1)]


def test_earliest_tree_passes_by_slow_relays():
    """Relays that send at 0.1 MB/s (10 s a copy): the server serves
    everyone itself, where the one-copy tree sends three copies through
    them; with a slow server (1 MB/s) and fast relays it is the one-copy
    tree."""
    out, inn = rates(n=5, out1=0.1 * MB, out2=0.1 * MB)
    assert plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB,
                        server_sends=True) == \
        [(0, 1, 0), (0, 2, 1), (0, 3, 2), (0, 4, 3)]
    assert len([h for h in plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2],
                                        MB) if h[0] != 0]) == 3
    out, inn = rates(n=5, out0=1 * MB)
    assert plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB,
                        server_sends=True) == \
        plan_relayed([1, 2, 3, 4], out, inn, 0, [1, 2], MB) == \
        [(0, 1, 0), (1, 2, 0), (1, 3, 1), (2, 4, 0)]


@pytest.mark.parametrize("server_sends", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_one_copy_structure_on_random_instances(seed, server_sends):
    """Every requester once; the server sends exactly one copy when there
    are relays (at least one with ``server_sends``); every other copy
    comes from a relay that has its own already (earlier in the list); a
    sender's priorities count up."""
    rng, out, inn, server, requests, relays = random_instance(seed)
    hops = plan_relayed(requests, out, inn, server, relays, MB, now=3.0,
                        server_sends=server_sends)
    assert sorted(d for _, d, _ in hops) == sorted(requests)
    from_server = [d for s, d, _ in hops if s == server]
    if server_sends and relays:
        assert 1 <= len(from_server) <= len(requests)
        assert hops[0] == (server, relays[0], 0)
    else:
        assert len(from_server) == (1 if relays else len(requests))
    got = set()
    prios = {}
    for s, d, prio in hops:
        assert s == server or (s in relays and s in got)
        assert prio == prios.get(s, -1) + 1
        prios[s] = prio
        got.add(d)


def test_run_config_checks_distribution():
    cfg = RunConfig(mode="mlfabric", tau_max=4, duration=1.0,
                    distributors=2, distribution="one-copy")
    assert cfg.distribution == "one-copy"
    assert RunConfig(mode="mlfabric", tau_max=4,
                     duration=1.0).distribution == "algorithm3"
    with pytest.raises(ValueError, match="distribution must be one of"):
        RunConfig(mode="mlfabric", tau_max=4, duration=1.0,
                  distribution="binomial")
    for shape in ("one-copy", "earliest"):
        with pytest.raises(ValueError, match=f"'{shape}' needs distributors"):
            RunConfig(mode="mlfabric", tau_max=4, duration=1.0,
                      distribution=shape)
    assert RunConfig(mode="mlfabric", tau_max=4, duration=1.0, distributors=1,
                     distribution="earliest").distribution == "earliest"
