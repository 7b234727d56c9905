"""TicTac's planner: a priority number per parameter receive (Hashemi et
al., *TicTac: Accelerating Distributed Deep Learning with Communication
Scheduling*, SysML 2019).

Input: a worker's computation graph (:class:`Graph`) whose roots are the
parameter receives, with a time per op (the paper's time oracle).  Output:
a priority number per receive, lower = sent first.

Section 4.1, the op properties (Algorithm 1), for the outstanding receives
R:

* ``op.dep``: the receives an op depends on, directly or transitively (a
  receive depends on itself);
* ``op.M`` = sum of Time(r) over r in op.dep & R (communication time);
* ``r.P`` = sum of Time(op) over the ops whose dep & R is exactly {r}
  (the compute that r alone unlocks);
* ``r.M+`` = min of op.M over the ops whose dep & R holds r and at least
  one other receive (+inf if there is none): the least communication that
  unlocks compute needing r together with others.

TIC (Algorithm 2): Time(recv) = 1, Time(compute) = 0, one pass;
priority = M+.  Ties share a number.

TAC (Algorithm 3): with the measured times, repeatedly pick the smallest
outstanding receive under the comparator of Equation 2 (A before B iff
min(P_B, M_A) < min(P_A, M_B); equal: the smaller M+), give it the next
number, remove it from R and update the properties.

Choices where the paper leaves room (tested in tests/test_planner.py):

* Algorithm 3's printed Comparator (A <- min(P_A, M_B), B <- min(P_B, M_A),
  return A < B) has the opposite sense to Equation 2 and its derivation
  (A first when min(P_B, M_A) < min(P_A, M_B)); we follow Equation 2,
  which :func:`simulate` confirms picks the shorter makespan
  (test_equation_2_picks_the_shorter_makespan).
* "Find the minimum op from R wrt Comparator" is a linear scan in receive
  index order keeping the current best unless a later one compares
  strictly smaller (the comparator need not be transitive in general, so
  the scan order is part of the definition).  Receives that compare equal
  keep index order.
* M+ = +inf (no op joins r with another outstanding receive) ranks after
  every finite M+ in TIC (number n + 1); in TAC the comparator handles it
  as a number.
* The enforcement (section 5.1) needs numbers 0..n-1 with no repeats (its
  counter gate releases transfer k after k others): :func:`enforcement`
  renumbers priorities so, breaking ties by index or by a seeded draw.

No MPI and no torch here; :func:`simulate` replays a graph under one
transfer order (one network channel, one compute stream) for tests and
for predicting what a schedule should achieve.
"""
import heapq
import math
import numbers
import random
from ..core.errors import ArgumentTypeError, ScheduleError


RECV, COMPUTE = "recv", "compute"


class Op:
    """One op of a worker graph: a parameter receive (a root) or compute."""

    __slots__ = ("index", "name", "kind", "time", "deps", "nbytes", "info")

    def __init__(self, index, name, kind, time, deps, nbytes=0, info=None):
        self.index, self.name, self.kind = index, name, kind
        self.time, self.deps, self.nbytes = float(time), list(deps), nbytes
        self.info = info or {}

    def __repr__(self):
        return (f"Op({self.index}, {self.name!r}, {self.kind}, "
                f"time={self.time:g}, deps={self.deps})")


class Graph:
    """A worker's computation graph: ops in a topological order (every op
    after the ops it depends on), receives as roots.

    ``time`` is the op's cost in seconds: for a receive its transfer time
    (e.g. bytes / link rate), for compute its run time.  ``nbytes`` is the
    size a receive carries; ``info`` free-form (e.g. the parameter names a
    receive carries).

    Example (the paper's Figure 1a)::

        g = Graph()
        r1, r2 = g.recv("recv1", 1.0), g.recv("recv2", 1.0)
        op1 = g.compute("op1", 2.0, [r1])
        g.compute("op2", 2.0, [op1, r2])
        tic(g)      # {'recv1': 2, 'recv2': 2}: a tie
        tac(g)      # {'recv1': 0, 'recv2': 1}
    """

    def __init__(self):
        self.ops = []
        self._names = {}

    def _add(self, name, kind, time, deps, nbytes=0, info=None):
        if name in self._names:
            raise ScheduleError(f"op name {name!r} is used twice")
        if not time >= 0:
            raise ScheduleError(f"op {name!r}: time must be >= 0, got {time!r}")
        deps = [self.index(d) for d in deps]
        op = Op(len(self.ops), name, kind, time, dict.fromkeys(deps), nbytes,
                info)
        self.ops.append(op)
        self._names[name] = op.index
        return op.index

    def recv(self, name, time=1.0, nbytes=0, info=None):
        """Add a parameter receive (a root); returns its index."""
        return self._add(name, RECV, time, (), nbytes, info)

    def compute(self, name, time, deps=(), info=None):
        """Add a compute op after ``deps`` (a list of indices or names of
        earlier ops); returns its index."""
        if isinstance(deps, (str, bytes)) or not hasattr(deps, "__iter__"):
            raise ArgumentTypeError(f"op {name!r}: deps must be a list of op "
                                    f"indices or names, got {deps!r}")
        return self._add(name, COMPUTE, time, deps, 0, info)

    def index(self, ref):
        """The index of op ``ref`` (its name, or an int index)."""
        if isinstance(ref, str):
            try:
                return self._names[ref]
            except KeyError:
                raise ScheduleError(f"no op named {ref!r}") from None
        if isinstance(ref, bool) or not isinstance(ref, numbers.Integral):
            raise ArgumentTypeError(f"an op is named by its name or int index, got "
                                    f"{ref!r}")
        if not 0 <= int(ref) < len(self.ops):
            raise ScheduleError(f"op {ref!r} is not in the graph (ops may only "
                                "depend on earlier ops)")
        return int(ref)

    @property
    def recvs(self):
        return [op for op in self.ops if op.kind == RECV]

    @property
    def compute_time(self):
        """The sum of the compute ops' times, C (one compute stream)."""
        return sum(op.time for op in self.ops if op.kind == COMPUTE)

    def with_times(self, recv_time=None, compute_time=None):
        """A copy with receive and/or compute times replaced: each argument
        a function ``op -> seconds`` (None: keep)."""
        g = Graph()
        for op in self.ops:
            f = recv_time if op.kind == RECV else compute_time
            g._add(op.name, op.kind, op.time if f is None else f(op),
                   op.deps, op.nbytes, dict(op.info))
        return g

    def __len__(self):
        return len(self.ops)

    def __repr__(self):
        return (f"Graph({len(self.recvs)} receives, "
                f"{len(self.ops) - len(self.recvs)} compute ops)")


# ---- section 4.1: properties -------------------------------------------
def find_dependencies(graph):
    """op.dep for every op, as bit masks over receive positions (bit k:
    the k-th receive of ``graph.recvs``).  The paper's depth-first
    post-order traversal; here one pass in topological order."""
    pos = {op.index: k for k, op in enumerate(graph.recvs)}
    dep = [0] * len(graph.ops)
    for op in graph.ops:
        m = 1 << pos[op.index] if op.kind == RECV else 0
        for d in op.deps:
            m |= dep[d]
        dep[op.index] = m
    return dep


class _Properties:
    """Algorithm 1 for a shrinking set R, kept incrementally: op.M and
    |op.dep & R| change only by the receive removed, so each step costs a
    pass over the ops instead of a pass over every (op, receive) pair."""

    def __init__(self, graph, recv_time, compute_time):
        self.recvs = graph.recvs
        self.rtime = [recv_time(r) for r in self.recvs]
        self.compute = [(dep, compute_time(op)) for op, dep in
                        zip(graph.ops, find_dependencies(graph))
                        if op.kind == COMPUTE]
        self.R = (1 << len(self.recvs)) - 1
        # op.M for compute ops; a receive's M is Time(r) itself
        self.M = [sum(self.rtime[k] for k in _bits(dep))
                  for dep, _ in self.compute]

    def remove(self, k):
        bit = 1 << k
        self.R &= ~bit
        for i, (dep, _) in enumerate(self.compute):
            if dep & bit:
                self.M[i] -= self.rtime[k]

    def update(self):
        """(P, M+) for every receive position (only those in R matter)."""
        n = len(self.recvs)
        P, Mplus = [0.0] * n, [math.inf] * n
        joins = []
        for i, (dep, t) in enumerate(self.compute):
            d = dep & self.R
            if not d:
                continue
            if d & (d - 1) == 0:                 # |D| = 1
                P[d.bit_length() - 1] += t
            else:
                joins.append((self.M[i], d))
        # M+ = min over joining ops: visit them by M, each receive takes
        # the first (smallest) M that reaches it
        unset = self.R
        for m, d in sorted(joins, key=lambda x: x[0]):
            new = d & unset
            if not new:
                continue
            for k in _bits(new):
                Mplus[k] = m
            unset &= ~new
            if not unset:
                break
        return P, Mplus


def _bits(mask):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def properties(graph, outstanding=None, recv_time=None, compute_time=None):
    """Algorithm 1: {receive name: (M, P, M+)} for the outstanding
    receives (default all), with the graph's times unless replaced by
    functions ``op -> seconds``."""
    rt = recv_time or (lambda op: op.time)
    ct = compute_time or (lambda op: op.time)
    props = _Properties(graph, rt, ct)
    names = [r.name for r in props.recvs]
    if outstanding is not None:
        keep = {graph.ops[graph.index(x)].name for x in outstanding}
        for k, name in enumerate(names):
            if name not in keep:
                props.remove(k)
    P, Mplus = props.update()
    return {name: (props.rtime[k], P[k], Mplus[k])
            for k, name in enumerate(names) if props.R >> k & 1}


# ---- section 4.2: TIC -----------------------------------------------------
def tic(graph):
    """Algorithm 2, Timing-Independent Communication scheduling: every
    receive costs 1, compute 0 (Equation 1); priority = M+ (the number of
    receives that unlock the first compute op needing this one with
    others).  Returns {receive name: priority}; receives with equal M+
    share a number.  A receive with M+ = +inf (no op joins it with another
    receive) gets n + 1, after every finite M+ (at most n)."""
    props = _Properties(graph, lambda op: 1.0, lambda op: 0.0)
    _, Mplus = props.update()
    n = len(props.recvs)
    return {r.name: n + 1 if math.isinf(Mplus[k]) else int(Mplus[k])
            for k, r in enumerate(props.recvs)}


# ---- section 4.3: TAC -----------------------------------------------------
def comparator(a, b):
    """TAC's comparator on (M, P, M+) triples: True when receive a should
    precede receive b.  Equation 2: min(P_B, M_A) < min(P_A, M_B); when
    equal, the smaller M+ (see the module docstring on Algorithm 3's
    printed form)."""
    Ma, Pa, Ma_plus = a
    Mb, Pb, Mb_plus = b
    x, y = min(Pb, Ma), min(Pa, Mb)
    if x != y:
        return x < y
    return Ma_plus < Mb_plus


def tac(graph, recv_time=None, compute_time=None):
    """Algorithm 3, Timing-Aware Communication scheduling, with the
    graph's times (or the given functions ``op -> seconds``).  Returns
    {receive name: priority}, numbers 0..n-1 (no ties)."""
    rt = recv_time or (lambda op: op.time)
    ct = compute_time or (lambda op: op.time)
    props = _Properties(graph, rt, ct)
    out, count = {}, 0
    left = list(range(len(props.recvs)))
    while left:
        P, Mplus = props.update()
        triple = {k: (props.rtime[k], P[k], Mplus[k]) for k in left}
        best = left[0]
        for k in left[1:]:
            if comparator(triple[k], triple[best]):
                best = k
        out[props.recvs[best].name] = count
        count += 1
        left.remove(best)
        props.remove(best)
    return out


# ---- section 5.1: enforcement --------------------------------------------
def enforcement(priorities, tie_break="index", seed=0):
    """Renumber priorities into 0..n-1 (section 5.1: "the priority number
    of a transfer represents the number of transfers that have to complete
    before it").  ``priorities``: {name: number} in receive order (as
    :func:`tic` and :func:`tac` return them).  Ties are broken by that
    order (``tie_break="index"``) or by a draw from ``seed``
    (``"random"``: the paper's runtime picks at random among equal
    numbers; here the draw is made once, so every iteration follows the
    same order).  Returns {name: 0..n-1}."""
    names = list(priorities)
    if tie_break == "random":
        rng = random.Random(seed)
        key = {n: rng.random() for n in names}
    elif tie_break == "index":
        key = {n: k for k, n in enumerate(names)}
    else:
        raise ScheduleError("tie_break must be 'index' or 'random'")
    ordered = sorted(names, key=lambda n: (priorities[n], key[n]))
    return {n: k for k, n in enumerate(ordered)}


def first_use(graph):
    """The receives in the order a compute stream running the ops in
    graph order first needs them: {name: 0..n-1} (receives no op uses come
    last, in index order).  The order a sequential program wants."""
    order, seen = [], set()
    recv_of = {r.index for r in graph.recvs}
    for op in graph.ops:
        if op.kind != COMPUTE:
            continue
        for d in sorted(d for d in op.deps if d in recv_of):
            if d not in seen:
                seen.add(d)
                order.append(d)
    order += [r.index for r in graph.recvs if r.index not in seen]
    return {graph.ops[i].name: k for k, i in enumerate(order)}


# ---- replay -----------------------------------------------------------------
def _order_ops(graph, order):
    """The receives of ``order`` ({name or index: number}), lowest number
    first (ties in the order given); checked to be exactly the graph's
    receives."""
    try:
        items = list(order.items())
    except AttributeError:
        raise ArgumentTypeError(f"order must be a dict {{receive name: number}}, "
                                f"got {type(order).__name__}") from None
    ops, seen = [], set()
    for ref, number in items:
        op = graph.ops[graph.index(ref)]
        if op.kind != RECV:
            raise ScheduleError(f"order numbers {op.name!r}, a compute op: "
                                f"only receives are transferred")
        if op.index in seen:
            raise ScheduleError(f"order numbers receive {op.name!r} twice")
        if isinstance(number, bool) or \
                not isinstance(number, numbers.Real) or number != number:
            raise ScheduleError(f"order's number for {op.name!r} must be a "
                                f"real number, got {number!r}")
        seen.add(op.index)
        ops.append((number, op.index, op))
    missing = [r.name for r in graph.recvs if r.index not in seen]
    if missing:
        raise ScheduleError(f"order leaves out receive(s) {missing}: number "
                            f"every receive of the graph")
    return [op for _, _, op in sorted(ops, key=lambda x: x[0])]


def simulate(graph, order, stream=True):
    """Replay one iteration: the receives cross one channel back to back
    in ``order`` ({name: number}, lower first; each takes its time), the
    compute ops run on one compute resource.  ``stream=True``: in graph
    order (a sequential program, as PyTorch runs a forward pass);
    ``False``: whichever ready op came first (list scheduling, as a
    dataflow executor).  Returns (T, N, C): iteration time, communication
    time, computation time.

    ``order`` must number exactly the graph's receives (by name or index,
    each once): ValueError otherwise (a missing receive would count as
    arrived at 0, a compute op as a transfer)."""
    done = [0.0] * len(graph.ops)
    t = 0.0
    for op in _order_ops(graph, order):
        t += op.time
        done[op.index] = t
    N = t
    compute = [op for op in graph.ops if op.kind == COMPUTE]
    ready = lambda op: max((done[d] for d in op.deps), default=0.0)  # noqa
    free = 0.0
    if stream:
        for op in compute:
            free = max(free, ready(op)) + op.time
            done[op.index] = free
    else:
        waiting = {op.index: len([d for d in op.deps
                                  if graph.ops[d].kind == COMPUTE])
                   for op in compute}
        users = {}
        for op in compute:
            for d in op.deps:
                users.setdefault(d, []).append(op)
        heap = [(ready(op), op.index) for op in compute
                if waiting[op.index] == 0]
        heapq.heapify(heap)
        while heap:
            at, i = heapq.heappop(heap)
            free = max(free, at) + graph.ops[i].time
            done[i] = free
            for u in users.get(i, ()):
                waiting[u.index] -= 1
                if waiting[u.index] == 0:
                    heapq.heappush(heap, (ready(u), u.index))
    T = max([free] + [done[r.index] for r in graph.recvs])
    return T, N, graph.compute_time
