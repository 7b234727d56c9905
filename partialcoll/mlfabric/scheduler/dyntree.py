"""MLfabric's allreduce (section 6, "MPI"): push every worker's update to
a root over an aggregation tree built for the current links, then get the
sum back from the root.  This module is the plan, pure (no MPI, no
clock): :func:`plan_tree` turns the order the updates became ready and
the link rates *as the monitor reports them* into the transfers
(:class:`Hop`) that :mod:`partialcoll.mlfabric.runtime.allreduce` builds into one
schedule per rank.

Per iteration, with root R, aggregators a_1..a_k (relays for the get)::

    push (Alg 3 on the ready list, section 6 "Synchronous SGD/PS"):
        group 1:  w ------------------------> R     (sum into R's buffer)
        group i:  w --> a_i --sum of group--> R
    get (section 10.3, model distribution: Alg 3 on the mirrored links):
        R --> a_k --> its members, then R --> a_k-1 ..., R --> group 1

    time --->   R in:   [w][w][ sum a_1 ][ sum a_2 ]
                R out:                               [a_2][a_1][w][w]
                a_i out:                                  [->m][->m]

Where the paper is silent, our choices (also on the documentation's
MLfabric page):

* *The tree* is Algorithm 3's two-level one (section 6 applies "our
  algorithm from section 5.2" to an unordered list): the root is the
  destination, the updates in the order they became ready, k aggregators
  drawn per iteration among the non-root workers.  The root's own update
  needs no transfer (it is the accumulator); an aggregator's own update
  is summed locally when it falls in its own group, sent like any other
  when it does not.
* *The get.*  Section 6 says only "get pulls the aggregated update from
  root"; N - 1 copies out of the root's NIC would make its outgoing link
  the bottleneck, which section 10.3 avoids with a distribution tree
  "determined similar to the aggregation pattern".  We run Algorithm 3 on
  the mirrored network (every node's outgoing rate taken as its incoming
  one and back), where a worker -> relay -> root path crosses exactly the
  links that root -> relay -> worker crosses in the real one, from when
  the push plan has the sum at the root; the relays are the push's
  aggregators.  As section 10.3 says, the root serves the k-th relay
  first and goes backwards, the direct group last (send priorities; the
  get has no start times: each copy leaves once its data is there).  A
  relay gets the result from the root (its forward hop reversed); when it
  is also listed in another relay's group that copy is not sent (every
  rank receives the result exactly once).
* *Rates*: only the monitor's lagged view; each iteration is planned on a
  fresh network state (the iteration is synchronous: nothing of the last
  one is still in flight when every update is ready).

The parameter server's pulls use the same get (:func:`plan_distribution`)
or, with ``distribution="one-copy"``, :func:`plan_relayed`: one copy out
of the server per batch, passed on by the relays.
"""
from .aggregation import aggregate_sync
from .links import NetworkState
from .ordering import Update
from ...core.errors import ScheduleError

PUSH, PULL = "push", "pull"


class Hop:
    """One transfer of an iteration (or, ``src == dst``, an aggregator's
    own update summed locally).

    Attributes:
        tag: the message tag (None for a local sum).
        src, dst: ranks.
        kind: "push" (toward the root) or "pull" (the result back).
        what: "update" (src's own), "sum" (an aggregator's group) or
            "result" (the root's sum).
        start: the planned first byte (push transfers), or None.
        after: tags of the hops that must arrive at ``src`` first.
        priority: lower leaves first among ``src``'s ready sends.
    """

    __slots__ = ("tag", "src", "dst", "kind", "what", "start", "after",
                 "priority")

    def __init__(self, tag, src, dst, kind, what, start=None, after=(),
                 priority=0):
        self.tag, self.src, self.dst, self.kind = tag, src, dst, kind
        self.what, self.start, self.after = what, start, list(after)
        self.priority = priority

    def __repr__(self):
        return (f"Hop({self.kind} {self.what} {self.src}->{self.dst}, "
                f"tag={self.tag})")


class TreePlan:
    """One iteration's tree.

    Attributes:
        root: the rank that holds the sum.
        push, pull: the :class:`~.aggregation.Aggregation` of each phase
            (``pull`` on the mirrored network; its "updates" are the
            ranks that receive).
        hops: every :class:`Hop`, in an order that respects ``after``.
        cost: when the plan has the result at every rank (monitor's view).
        size: bytes of an update.
    """

    def __init__(self, root, push, pull, hops, cost, size):
        self.root, self.push, self.pull = root, push, pull
        self.hops, self.cost, self.size = hops, cost, size

    def parents(self):
        """{rank: where its update goes} of the push (aggregator or root);
        aggregators' sums are under ("sum", rank)."""
        out = {}
        for grp in self.push.groups:
            for g in grp.members:
                out[g.worker] = self.root if grp.aggregator is None \
                    else grp.aggregator
            if grp.aggregator is not None:
                out[("sum", grp.aggregator)] = self.root
        return out

    def sources(self):
        """{rank: the rank it gets the result from} of the get."""
        return {h.dst: h.src for h in self.hops if h.kind == PULL}

    def shape(self):
        """A hashable summary of the tree (for "did the tree change")."""
        return (self.root, tuple(sorted((str(k), v) for k, v in
                                        self.parents().items())),
                tuple(sorted(self.sources().items())))


def plan_tree(ready, out_rates, in_rates, root, aggregators, size,
              now=0.0, first_tag=1):
    """Plan one allreduce iteration (MLfabric section 6, with 5.2's
    Algorithm 3 for the push and 10.3's distribution for the get).

    Args:
        ready: the ranks, in the order their updates became ready (the
            root may be among them: it is skipped).
        out_rates, in_rates: {rank: bytes/s} from the link monitor.
        root: the rank that sums.
        aggregators: k ranks (not the root), used in this order.
        size: bytes of an update (and of the sum).
        now: when the updates may start; first_tag: tags count from it.
    Returns a :class:`TreePlan`.

    Example::

        plan = plan_tree([1, 2, 3], {r: 1e7 for r in range(4)},
                         {0: 1e6, 1: 1e7, 2: 1e7, 3: 1e7}, root=0,
                         aggregators=[1], size=1e6)
        plan.parents()     # {1: 1, 2: 1, 3: 1, ("sum", 1): 0}
    """
    aggregators = [a for a in aggregators if a != root]
    workers = [r for r in dict.fromkeys(ready) if r != root]
    updates = [Update(r, r, float(size), 0, 0.0) for r in workers]
    net = NetworkState(out_rates, in_rates, now)
    push = aggregate_sync(updates, net, root, aggregators, now)
    mirrored = NetworkState(in_rates, out_rates, push.cost)
    pull = aggregate_sync(updates, mirrored, root, aggregators, push.cost)
    hops = _HopList(first_tag)
    into_root = _push_hops(push, root, hops)
    _pull_hops(pull, root, hops, into_root)
    return TreePlan(root, push, pull, hops.hops, pull.cost, float(size))


class _HopList:
    def __init__(self, first_tag):
        self.hops, self.tag = [], first_tag

    def add(self, src, dst, kind, what, start=None, after=(), priority=0):
        tag = None
        if src != dst:
            tag, self.tag = self.tag, self.tag + 1
        self.hops.append(Hop(tag, src, dst, kind, what, start, after,
                             priority))
        return tag


def _push_hops(push, root, hops):
    """The push's hops; returns the tags arriving at the root."""
    into_root = []
    for k, grp in enumerate(push.groups):
        if grp.aggregator is None:
            g, tr = grp.members[0], grp.forward
            into_root.append(hops.add(g.worker, root, PUSH, "update",
                                      _first_byte(tr), priority=k))
            continue
        a, members = grp.aggregator, []
        for g, tr in zip(grp.members, grp.arrivals):
            members.append(hops.add(g.worker, a, PUSH, "update",
                                    _first_byte(tr), priority=k))
        into_root.append(hops.add(a, root, PUSH, "sum",
                                  _first_byte(grp.forward),
                                  [t for t in members if t is not None], k))
    return into_root


def _pull_hops(pull, root, hops, into_root):
    """The get: Algorithm 3's groups on the mirrored network, reversed in
    time (section 10.3): the last relay is served first."""
    relays = {grp.aggregator for grp in pull.groups} - {None}
    served = len(pull.groups)
    for k, grp in reversed(list(enumerate(pull.groups))):
        prio = served - 1 - k
        if grp.aggregator is None:
            g = grp.members[0]
            if g.worker not in relays:
                hops.add(root, g.worker, PULL, "result", after=into_root,
                         priority=prio)
            continue
        a = grp.aggregator
        got = hops.add(root, a, PULL, "result", after=into_root,
                       priority=prio)
        for j, g in enumerate(reversed(grp.members)):
            if g.worker != a and g.worker not in relays:
                hops.add(a, g.worker, PULL, "result", after=[got],
                         priority=j)


def _requesters(requests, server, distributors):
    """A batch's requesters (in order, once each, the server skipped) and
    its relays, which must be among them."""
    workers = [r for r in dict.fromkeys(requests) if r != server]
    relays = list(dict.fromkeys(distributors))
    if not set(relays) <= set(workers):
        raise ScheduleError(f"distributors {relays} must be among the "
                            f"requests {workers}")
    return workers, relays


def choose_relays(requests, out_rates, in_rates, server, k):
    """The relays of one batch of pulls: at most ``k`` of the requesters
    (the server skipped), fewer than them, those whose *slower* link is
    fastest (a relay receives its copy, then sends it on), ties to the
    faster outgoing link, then to the earlier request.

    Our choice; section 10.3 does not say how distributors are earmarked.
    Ranking by the outgoing link alone (as before) could pick a relay
    whose incoming link is at the lowest rate: under N3 half the links
    are, and then the whole batch waited for that one slow copy.

    Example::

        choose_relays([1, 2, 3], {1: 1e8, 2: 5e7, 3: 1e8},
                      {1: 1e7, 2: 5e7, 3: 1e8}, 0, 2)
        # [3, 2]: 1 sends fast but receives at 1e7
    """
    workers, _ = _requesters(requests, server, [])
    k = max(0, min(int(k), len(workers) - 1))
    order = sorted(range(len(workers)), key=lambda i: (
        -min(out_rates[workers[i]], in_rates[workers[i]]),
        -out_rates[workers[i]], i))
    return [workers[i] for i in order[:k]]


def plan_distribution(requests, out_rates, in_rates, server, distributors,
                      size, now=0.0):
    """Section 10.3's model distribution for one batch of pulls: who gets
    the model from whom, so that the server's outgoing link does not have
    to carry every copy.

    Algorithm 3 on the mirrored network (as the allreduce's get, see
    :func:`plan_tree`): the first group gets the model straight from the
    server, each later group from its distributor, which gets it from the
    server first; the server serves the last distributor first and goes
    backwards, the direct group last.

    Args:
        requests: the workers waiting for the model, in the order they
            asked (the server is skipped).
        out_rates, in_rates: {rank: bytes/s} from the link monitor.
        server: the rank that has the model.
        distributors: up to k ranks, each one of ``requests`` (a relay
            needs the model itself: it forwards what it received).
        size: bytes of the model.
    Returns ``[(src, dst, priority)]``: every requester exactly once as a
    ``dst``; a relay's own copy comes before what it forwards; lower
    ``priority`` leaves first among ``src``'s sends.

    Example::

        plan_distribution([1, 2, 3], {r: 1e7 for r in range(4)},
                          {r: 1e7 for r in range(4)}, 0, [1], 1e6)
        # [(0, 1, 0), (1, 3, 0), (1, 2, 1)]-like: 1 relays to 2 and 3
    """
    workers, relays = _requesters(requests, server, distributors)
    updates = [Update(r, r, float(size), 0, 0.0) for r in workers]
    mirrored = NetworkState(in_rates, out_rates, now)
    pull = aggregate_sync(updates, mirrored, server, relays, now)
    hops = _HopList(1)
    _pull_hops(pull, server, hops, [])
    return [(h.src, h.dst, h.priority) for h in hops.hops]


def _first_byte(transfer):
    """When a planned transfer first has bandwidth (None: local)."""
    if transfer.src == transfer.dst:
        return None
    return transfer.points[0] if transfer.points else transfer.start


def plan_relayed(requests, out_rates, in_rates, server, distributors, size,
                 now=0.0, server_sends=False):
    """Model distribution that spends the least of the server's outgoing
    link (our choice, beyond section 10.3): the server sends *one* copy
    per batch, to the first distributor; the distributors pass it on.
    With ``server_sends`` the server is a holder like the distributors
    (after its first copy it may send more, wherever it would finish a
    copy first): the "earliest" distribution.

    Algorithm 3's distribution (:func:`plan_distribution`) is a two-level
    tree: the server sends to each distributor and to the direct group,
    so with small batches it still sends most copies itself.  When the
    server's link is the bottleneck, every copy it does not send is time
    it has for the next batch.  Here the distributors are served first,
    in the order given (as :func:`choose_relays` ranks them, best
    first), then the others in the order they asked; each copy comes from
    the holder that would finish it first: a distributor that already has
    the copy, sending one copy at a time at ``min(its out rate, the
    receiver's in rate)``, ties to the earlier distributor (and, with
    ``server_sends``, to a distributor before the server, sparing its
    link).  Without distributors every copy comes from the server.

    Why ``server_sends``: with one copy from the server, every other copy
    crosses a distributor's links.  When those are slow (under N3 half
    of them are at the lowest rate) the tree is slower than the server
    alone (16 ranks, C2-N3, three seeds: MLfabric applied 732-870
    updates in 60 s over the one-copy tree, 1,742-1,833 without one).
    With the server as a holder the plan is the greedy earliest-finish
    broadcast: the server serves whom its fast link reaches first, the
    distributors the rest.  Measured there: C2-N3 rises from 0.49x to
    0.87x ring (no tree: 1.52x), C2-N1 and C2-N2 lose about a tenth.  The
    plan sees neither a relay's own pushes nor rates that changed since
    the monitor last saw them.

    Args and return value as :func:`plan_distribution`.

    Example::

        plan_relayed([1, 2, 3, 4], {r: 1e7 for r in range(5)},
                     {r: 1e7 for r in range(5)}, 0, [1, 2], 1e6)
        # [(0, 1, 0), (1, 2, 0), (1, 3, 1), (2, 4, 0)]
    """
    workers, relays = _requesters(requests, server, distributors)
    if not relays:
        return [(server, w, i) for i, w in enumerate(workers)]

    def secs(src, dst):
        return size / max(min(out_rates[src], in_rates[dst]), 1e-9)

    first = relays[0]
    free = {first: now + secs(server, first)}   # holder -> its link free
    sent = {first: 0}
    if server_sends:
        free[server], sent[server] = free[first], 1
    tie = {h: i for i, h in enumerate(relays)}  # ties: earlier distributor,
    tie[server] = len(relays)                   # the server last
    hops = [(server, first, 0)]
    for dst in relays[1:] + [w for w in workers if w not in relays]:
        src = min(free, key=lambda h: (free[h] + secs(h, dst), tie[h]))
        t = free[src] + secs(src, dst)
        hops.append((src, dst, sent[src]))
        free[src], sent[src] = t, sent[src] + 1
        if dst in relays:
            free[dst], sent[dst] = t, 0
    return hops
