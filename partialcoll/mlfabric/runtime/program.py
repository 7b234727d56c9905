"""From a batch plan to what each rank does, for the end-to-end parameter
server (``roles``, ``server``, ``worker``).  No MPI here: a
:class:`Program` per rank lists its sends, receives, sums and applies,
with tags, peers, sizes, start times and priorities; ``execute`` turns
each into a one-shot
:class:`~partialcoll.core.schedule.Schedule` (start_at -> send; recv -> reduce;
recv -> gate that applies the update in order).

Per batch, for the server S (and likewise the replica R with the
replication plan)::

    worker w      [start_at t] -> send update -> (S | aggregator a)
    aggregator a  recv member .. -> reduce into the sum ..
                  (all members) [start_at t] -> send sum -> S
    S             recv commit k -> apply k (after apply k-1) -> ...

* A transfer starts when its planned profile first has bandwidth (its
  first byte), not at the batch time: the plan time-shares links, so the
  emulated network, which shares a NIC fairly among what is on it, sees
  little overlap where the plan has none.
* Sends carry ``priority`` = the commit's position (lower leaves first
  where several wait; the replica's after every server one: the paper
  gives the server's transfers precedence), the server applies commits
  strictly in plan order
  (a gate after the previous apply): commits planned at the same instant
  (floors) may arrive in either order.
* An update that is its aggregator's own needs no transfer (a local
  reduce); a dropped update has no op at all, only a "drop" notice to its
  worker.
"""
import itertools


class Op:
    """One step of a rank's program.

    kind: "send" | "recv" | "sum" | "apply" | "drop".
    peer: the other rank (sends, receives); tag: the message's tag.
    what: ("update", uid) or ("sum", group id): the buffer.
    size: bytes; start: earliest start (sends; on the reference clock,
    :mod:`partialcoll.core.clock`); priority: commit position.
    after: ops (indices into the same program) it waits for.
    commit: the commit's index at its destination (apply).
    stream: "server" or "replica" (whose commits it serves).
    weight: gamma^(m-j), the weight of an own update's second half on its
    send or local sum, with the server's momentum (None otherwise; see
    :mod:`partialcoll.mlfabric.runtime.optim`).
    """

    __slots__ = ("kind", "peer", "tag", "what", "size", "start", "priority",
                 "after", "commit", "stream", "weight")

    def __init__(self, kind, peer=None, tag=None, what=None, size=0.0,
                 start=None, priority=0, after=(), commit=None, stream=None,
                 weight=None):
        self.kind, self.peer, self.tag, self.what = kind, peer, tag, what
        self.size, self.start, self.priority = size, start, priority
        self.after, self.commit = list(after), commit
        self.stream, self.weight = stream, weight

    def __repr__(self):
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__
                           if getattr(self, k) not in (None, [], 0, 0.0))
        return f"Op({self.kind}, {fields})"


class Program:
    """What one rank does for one batch: ``ops`` in an order that respects
    their ``after`` lists."""

    def __init__(self, rank):
        self.rank, self.ops = rank, []

    def add(self, op):
        self.ops.append(op)
        return len(self.ops) - 1

    def of(self, kind):
        return [op for op in self.ops if op.kind == kind]


def first_byte(transfer):
    """When a planned transfer first has bandwidth."""
    return transfer.points[0] if transfer.points else transfer.start


def programs(plan, server, replica=None, tags=None, gamma=None):
    """{rank: Program} for a :class:`~partialcoll.mlfabric.scheduler.batch.BatchPlan`.

    ``tags``: an iterator of fresh tags (default 0, 1, ...); the caller
    keeps them unique among messages in flight (the tag budget).
    ``gamma``: the server's momentum when commits carry two sums
    (:mod:`partialcoll.mlfabric.runtime.optim`): each own update's send
    or local sum gets its weight gamma^(m-j); None: one sum, no
    weights."""
    tags = iter(tags) if tags is not None else itertools.count()
    progs = {}

    def prog(rank):
        return progs.setdefault(rank, Program(rank))

    for g, reason in plan.dropped:
        prog(g.worker).add(Op("drop", what=("update", g.uid)))
    _commits(plan.groups, server, prog, tags, "server", 0)
    if replica is not None and plan.replication is not None:
        _commits(plan.replication.groups, replica, prog, tags, "replica",
                 REPLICA_PRIORITY)
    if gamma is not None:
        _weigh(progs, plan, gamma)
    return progs


def _weigh(progs, plan, gamma):
    """Set each own update's weight, gamma^(m-j), from its position j
    (1-based) in its commit of m."""
    at = {}
    streams = [("server", plan.groups)]
    if plan.replication is not None:
        streams.append(("replica", plan.replication.groups))
    for label, groups in streams:
        for grp in groups:
            m = len(grp.members)
            for j, g in enumerate(grp.members):
                at[(label, g.uid)] = float(gamma) ** (m - 1 - j)
    for p in progs.values():
        for op in p.ops:
            if op.kind in ("send", "sum") and op.what[0] == "update":
                op.weight = at[(op.stream, op.what[1])]


#: replica transfers' priorities start here (after the server's)
REPLICA_PRIORITY = 1 << 20


def _commits(groups, dst, prog, tags, label, base):
    """The ops of one stream of commits (``label``: "server"/"replica")."""
    marked = {}

    def stream_prog(rank):
        p = prog(rank)
        marked.setdefault(rank, len(p.ops))
        return p

    _ops(groups, dst, stream_prog, tags, label, base)
    for rank, first in marked.items():
        for op in prog(rank).ops[first:]:
            op.stream = label


def _ops(groups, dst, prog, tags, label, base):
    applied = None
    for k0, grp in enumerate(groups):
        k = base + k0
        if grp.aggregator is None:
            g, tr = grp.members[0], grp.forward
            tag = next(tags)
            prog(g.worker).add(Op("send", dst, tag, ("update", g.uid),
                                  g.size, first_byte(tr), k))
            rcv = prog(dst).add(Op("recv", g.worker, tag, ("update", g.uid),
                                   g.size, priority=k))
        else:
            rcv = _aggregate(grp, dst, prog, tags, k, (label, k0))
        after = [rcv] if applied is None else [rcv, applied]
        applied = prog(dst).add(Op("apply", what=_what(grp, label, k0),
                                   after=after, commit=k0,
                                   size=grp.forward.size))


def _what(grp, label, k):
    if grp.aggregator is None:
        return ("update", grp.members[0].uid)
    return ("sum", (label, k))


def _aggregate(grp, dst, prog, tags, k, name):
    """Members to the aggregator, summed, the sum ``("sum", name)`` to
    ``dst`` (priority k); returns the destination's receive."""
    a, sums = grp.aggregator, []
    for g, tr in zip(grp.members, grp.arrivals):
        if g.worker == a:
            sums.append(prog(a).add(Op("sum", what=("update", g.uid),
                                       size=g.size)))
            continue
        tag = next(tags)
        prog(g.worker).add(Op("send", a, tag, ("update", g.uid), g.size,
                              first_byte(tr), k))
        rcv = prog(a).add(Op("recv", g.worker, tag, ("update", g.uid),
                             g.size, priority=k))
        sums.append(prog(a).add(Op("sum", what=("update", g.uid),
                                   size=g.size, after=[rcv])))
    tag, fwd = next(tags), grp.forward
    prog(a).add(Op("send", dst, tag, ("sum", name), fwd.size,
                   first_byte(fwd), k, after=sums))
    return prog(dst).add(Op("recv", a, tag, ("sum", name), fwd.size,
                            priority=k))
