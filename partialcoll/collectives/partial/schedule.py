"""A partial allreduce's persistent schedule, re-armed by the executor
every round (the protocol that drives it is in :mod:`.rounds`)::

    activation ──> snapshot (locked) ──> allreduce(data, op) ──┐
                                    └──> allreduce(flag, SUM) ──┴─> accumulate (locked)

Up to the recursive-doubling threshold (host memory) the two allreduces
are one: the flags ride in the data's messages (the data, padded to 8
bytes, then the int64 flags, in one buffer), each received message
reduced twice (data with op, flags with SUM).  Larger data runs its own
algorithm beside a recursive doubling of the flags.  At two ranks, where
that one buffer fits a round-stamped message (``STAMP_DATA_MAX`` bytes,
without the fault-tolerance extensions' send buffer), the data is the
activation: a rank starts on its trigger or on the peer's data, and a
round is one message each way (:func:`_build_eager`).

* activation: who may start a round.
  - solo: every rank's trigger T (stamped with the round) starts it.  Up
    to :data:`FLAT_MAX` ranks T sends the activation to every other rank
    directly: every rank hears it after one message, and a rank activated
    by a message forwards nothing.  Above, it spreads through a union of
    binomial trees on the circulant graph x -> x + 2^j (mod P): the send
    on dimension j fires on ANY(T, a receive on a lower dimension).
    Either way any P works and simultaneous initiators give one round
    (consumable ops + round-stamped messages).
  - majority: the same, but only the rank drawn for the round (a hash of
    a seed shared by all ranks and the round number) fires T.  The other
    fresh callers fire a second trigger, S, that activates this rank
    alone (no message): they snapshot and send their part of the
    exchange at once, and the round waits for the initiator all the
    same, since nobody else has its data.  At two ranks, where the data
    is the activation, the peer's data passes a gate (a callback op,
    ``partial.drawn``) that declines on the round's drawn rank unless
    the peer started the round in a synchronous round or while flushing.
  - quorum(k): every caller sends a stamped arrival to rank 0, whose
    activation NOP needs k of the P arrivals, then sends the activation
    as solo's T does; T also activates its caller's own part (the
    self-start of majority's S).  A rank that did not call takes part
    only once activated, after k arrivals, so a round still has k fresh
    ranks or all of them.  quorum(1) is activated as solo is: one
    arrival is a quorum, so counting it at rank 0 would only add a hop.

  Why the callers start their own part: the rank whose call completes a
  round (majority's initiator, quorum's k-th) then finds its peers'
  first messages waiting, and the round after its call is the
  exchange's hops from it alone, not an activation hop, each rank's
  snapshot and then the exchange.

  Why direct sends up to FLAT_MAX: a rank that is not inside a call
  hears a message when its progress thread next polls, tens of
  microseconds apart between rounds, so each hop of a tree costs about
  that; the log2 P hops of the trees, one after the other, made most of
  a round under skew (the round's exchange cannot start before its last
  rank is activated).  The initiator's P - 1 sends cost a microsecond or
  less each.  Where everyone starts a round at once, the surplus
  messages (counted in ``Schedule.stats``) cost CPU and nothing else.
  The initiator's sends go out one after the other, so with many ranks
  they would cost more than the trees' hops: FLAT_MAX bounds that, a
  choice measured up to 32 ranks on one host, not beyond.
* snapshot, under the schedule's data lock: send <- pending (without a
  send buffer, the exchange's receive buffer <- pending: the exchange
  then reduces in place, one pass over the data fewer), pending <-
  identity (in host memory a fill from one element: nothing to read),
  flags [fresh, flush, bypass, late_0 .. late_P-1, mark_0 .. mark_P-1]
  -> meta (then reset: late is 1 in this rank's own slot unless
  it is inside a synchronous round; a flush or bypass mark sets every
  mark_i), deposit sequence number -> round_seq, snapshots += 1 (the
  flags and numbers in one callback op, ``partial.snapshot``).
* meta (flags) allreduce (SUM of 3 + 2P int64): [ranks with fresh data,
  ranks whose synchronous round started this round (flush marks), ranks
  that started it while someone was flushing (bypass marks), then per
  rank: 1 if it was late, then the marks again, P times (a vector, to mask
  the late flags)].
* accumulate, under the lock: (with the fault-tolerance extensions in
  use: last <- result, for a survivor that did not complete the round
  when a rank died) acc <- acc op result (catch-up), or
  skipped <- skipped op acc; acc <- result (latest only: nothing is lost,
  a synchronous round returns `skipped`), rounds-accumulated += 1,
  acc_seq <- round_seq, last_active <- fresh count, last_flush <- flush
  marks, last_bypass <- bypass marks, flush_total += flush marks; the
  straggler counters count plain rounds only (no mark: plain <- 1 LXOR
  marks, late <- late * plain): late_total += late, lag <- (lag + late) *
  late (consecutive rounds late), lag_total += lag, stat_rounds += plain
  (all but the data in one callback op, ``partial.account``).

The bookkeeping fields are views of one int64 array, the book
(:func:`meta_buffers`), which the two callbacks (``csrc/partial/book.c``,
registered by :mod:`._calls`) take whole: each replaces a chain of
locked copies and reductions of one or P elements, five and sixteen ops
a round.
"""
import numpy as np

from ...core.devices import HOST
from ...core.ops import OPS
from ...core.graph import STAMP_DATA_MAX
from ...core.schedule import Schedule
from ..algorithm import choose_algorithm, tmp_size
from ..builders import BUILDERS, build_recursive_doubling
from ..context import BuildContext
from . import _calls

SUM = OPS["SUM"]
#: the int64 buffers of an object's bookkeeping (see the module docstring)
META = ("flag", "reset", "one", "meta_send", "dep_seq",
        "round_seq", "acc_seq", "acc_rounds", "last_active", "snaps",
        "prev_seq", "acc_lo", "last_flush", "last_bypass", "flush_total",
        "seed", "stat_rounds", "late_total", "lag", "lag_total", "plain",
        "late", "ones")
#: those of 3 + 2P elements (the flags, and what the meta allreduce sends;
#: its result and scratch belong to the schedule, see :func:`build`)
FLAGS = ("flag", "reset", "meta_send")
#: those of P elements (the straggler counters)
PER_RANK = ("late_total", "lag", "lag_total", "plain", "late", "ones")


def tag_layout(P, tag0):
    """Where an object's tags start, by use, in its block from ``tag0``:
    the data allreduce (any builder: the ring uses 2P - 2 tags, recursive
    doubling and Rabenseifner at most 2 log2 P + 2), the meta allreduce
    (recursive doubling: bit_length(P) + 1), one activation tag per
    circulant dimension, quorum's arrivals and flush arrivals."""
    data, meta = 2 * P + 2, P.bit_length() + 1
    act = max(1, (P - 1).bit_length())
    return {"data": tag0, "meta": tag0 + data,
            "activation": tag0 + data + meta,
            "arrive": tag0 + data + meta + act,
            "flush_arrive": tag0 + data + meta + act + 1,
            "end": tag0 + data + meta + act + 2}


def tag_block_size(P):
    """Tags one partial collective object holds on its communicator:
    2P + bit_length(P) + max(1, bit_length(P - 1)) + 5."""
    return tag_layout(P, 0)["end"]


def meta_buffers(P, rank, seed=0):
    """The bookkeeping buffers of an object at ``rank`` of P (see
    :data:`META`), initialised: this rank is late until it deposits, and
    ``seed`` is the draw's (majority's, as an int64 of the same 64 bits).
    They are views of one int64 array, ``meta["book"]``, in :data:`META`'s
    order: the round's bookkeeping ops are native callbacks on it
    (``csrc/partial/book.c``)."""
    sizes = [3 + 2 * P if k in FLAGS else P if k in PER_RANK else 1
             for k in META]
    book = np.zeros(sum(sizes), np.int64)
    ends = np.cumsum(sizes)
    meta = {k: book[e - n:e] for k, n, e in zip(META, sizes, ends)}
    meta["book"] = book
    meta["one"][0] = 1
    meta["ones"][...] = 1
    meta["seed"][...] = np.array([seed & (2**64 - 1)], np.uint64).view(
        np.int64)
    for k in ("flag", "reset"):
        meta[k][3 + rank] = 1
    return meta


class Activation:
    """The activation part of a round's schedule: ``trigger`` (the op a
    caller fires to start or join a round), ``bypass`` (the op that starts
    a synchronous round, or a round while someone flushes; solo and
    majority: the trigger itself), ``done`` (the op after which the round
    runs) and ``start`` (the op a fresh caller whose call activates no
    one fires, to run its part of the round at once: majority's callers
    other than the drawn one; else the trigger)."""

    def __init__(self, trigger, bypass, done, start=None):
        self.trigger, self.bypass, self.done = trigger, bypass, done
        self.start = trigger if start is None else start


#: up to this many ranks an activation goes from its initiator to every
#: other rank directly (see the module docstring)
FLAT_MAX = 64


def any_rank_activation(s, P, rank, tags, heard=(), self_start=False):
    """Solo's and majority's activation: the trigger, or an activation
    message, activates.  Up to :data:`FLAT_MAX` ranks the trigger sends
    to every other rank; above, each rank forwards on the circulant
    dimensions above the one it heard on.  ``heard``: at two ranks, the
    receive of the peer's data when the data is the activation (see
    :func:`build`), or a gate after it that may decline (majority's):
    no activation messages then, and only ``heard`` delivered counts.
    ``self_start``: a second trigger (:attr:`Activation.start`) that
    runs this rank's part of the round and sends no activation."""
    trigger = s.trigger(optional=True)
    tag0 = tags["activation"]
    if heard:
        return Activation(trigger, trigger,
                          s.nop(after=[trigger] + list(heard), mode=1,
                                delivered=True))
    start = [s.trigger(optional=True)] if self_start else []
    if P <= FLAT_MAX:
        others = [(rank + d) % P for d in range(1, P)]
        recvs = [s.recv(peer=p, tag=tag0, stamped=True, optional=True)
                 for p in others]
        _send_to_all(s, others, tag0, trigger)
    else:
        dims = [j for j in range(P.bit_length()) if (1 << j) < P]
        recvs = [s.recv(peer=(rank - (1 << j)) % P, tag=tag0 + j,
                        stamped=True, optional=True) for j in dims]
        for j in dims:
            s.send(peer=(rank + (1 << j)) % P, tag=tag0 + j, stamped=True,
                   optional=True, after=[trigger] + recvs[:j], mode=1)
    return Activation(trigger, trigger,
                      s.nop(after=[trigger] + start + recvs, mode=1),
                      *start)


def _send_to_all(s, peers, tag, act):
    """The activation's stamped sends to ``peers``, once ``act`` ran."""
    for p in peers:
        s.send(peer=p, tag=tag, stamped=True, optional=True, after=[act])


def quorum_activation(s, P, rank, tags, quorum, heard=()):
    """Quorum's activation: arrivals go to rank 0, whose activation needs
    ``quorum`` of them and is sent on as solo's is (to every rank
    directly up to :data:`FLAT_MAX` ranks, else on the circulant
    trees).  A second trigger (the bypass: synchronous rounds,
    flush-started rounds and callers while someone flushes) sends a flush
    arrival instead, and any one flush arrival activates on its own.  A
    fresh caller runs its own part of the round at once (its trigger
    also starts it here); only the ranks that did not call wait for the
    activation, so the quorum still holds: the round cannot complete
    before every rank took part, and a rank that did not call takes part
    only once k arrivals were counted::

        rank 0:  count = k of (T, arrivals 1..P-1)        (optional)
                 act   = ANY(count, bypass, flush arrivals 1..P-1)
                 done  = ANY(act, T)
        rank r:  done  = ANY(activation from rank 0, T)

    ``heard``: at two ranks, the receive of the peer's data when the data
    is the activation (see :func:`build`): rank 0 sends no activation
    message, rank 1 starts on rank 0's data, and rank 0 waits for its
    count (its data would activate rank 1).
    """
    trigger = s.trigger(optional=True)
    bypass = s.trigger(optional=True)
    tag0 = tags["activation"]
    dims = [j for j in range(P.bit_length()) if (1 << j) < P]
    if rank == 0:
        arrivals = [s.recv(peer=p, tag=tags["arrive"], stamped=True,
                           optional=True) for p in range(1, P)]
        flushes = [s.recv(peer=p, tag=tags["flush_arrive"], stamped=True,
                          optional=True) for p in range(1, P)]
        count = s.nop(after=[trigger] + arrivals, need=quorum, optional=True)
        act = s.nop(after=[count, bypass] + flushes, mode=1)
        if heard:
            return Activation(trigger, bypass, act)
        if P <= FLAT_MAX:
            _send_to_all(s, range(1, P), tag0, act)
        else:
            for j in dims:
                s.send(peer=1 << j, tag=tag0 + j, stamped=True,
                       optional=True, after=[act])
        return Activation(trigger, bypass,
                          s.nop(after=[act, trigger], mode=1))
    s.send(peer=0, tag=tags["arrive"], stamped=True, optional=True,
           after=[trigger])
    s.send(peer=0, tag=tags["flush_arrive"], stamped=True, optional=True,
           after=[bypass])
    if heard:
        recvs = list(heard)
    elif P <= FLAT_MAX:
        recvs = [s.recv(peer=0, tag=tag0, stamped=True, optional=True)]
    else:
        recvs = [s.recv(peer=(rank - (1 << j)) % P, tag=tag0 + j,
                        stamped=True, optional=True) for j in dims]
        for j in dims[1:]:
            s.send(peer=(rank + (1 << j)) % P, tag=tag0 + j, stamped=True,
                   optional=True, after=recvs[:j], mode=1)
    return Activation(trigger, bypass,
                      s.nop(after=recvs + [trigger], mode=1))


class RoundSpec:
    """What a round's schedule is built from: the communicator (the
    library's duplicate) and this rank's place in it, the reduction, the
    object's arrays (``pending``, ``identity`` (one element in host
    memory, else as long as ``pending``), ``acc``, ``skipped`` or
    None for catch-up, ``send``: where a round's snapshot goes, or None:
    into the exchange's buffers, ``last``:
    None, or where each completed round's result is copied, for a rank
    that did not complete it after a death, ``meta``:
    :func:`meta_buffers`), ``mem`` (their
    backend), ``algorithm`` (None: the heuristic), ``priority``,
    ``stamp_id``, its tag block from ``tag0`` and ``activate``
    (``activate(s, P, rank, tags)`` -> :class:`Activation`)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def build(spec):
    """The committed persistent schedule of one object and its
    :class:`Activation` (see the module docstring)."""
    P, rank, mem = spec.size, spec.rank, spec.mem
    n = spec.pending.size
    s = Schedule(spec.comm, persistent=True, stamp_id=spec.stamp_id,
                 priority=spec.priority, reliable=True)
    b = {k: s.buffer(v, name=k) for k, v in spec.meta.items()}
    for k in ("pending", "identity", "acc", "send", "last", "skipped"):
        if getattr(spec, k) is not None:
            b[k] = s.buffer(getattr(spec, k), name=k)
    algo = choose_algorithm(n * spec.dtype.itemsize, n, P, spec.algorithm)
    tags = tag_layout(P, spec.tag0)
    one_pass = algo == "recursive_doubling" and mem is HOST
    # without a send buffer the snapshot goes straight into the exchange's
    # receive buffers, which it then reduces in place
    inplace = spec.send is None
    if one_pass:
        # the bookkeeping rides in the data's messages
        wire = []
        for name in ("recv", "tmp"):
            data, meta, packed = _packed(n, spec.dtype, 3 + 2 * P)
            b[name], b["meta_" + name] = (
                s.buffer(data, name=name), s.buffer(meta, name="meta_" + name))
            wire.append(s.buffer(packed, name=name + "_wire"))
        if P == 2 and inplace and packed.nbytes <= STAMP_DATA_MAX:
            return _build_eager(s, spec, b, wire, tags)
    act = spec.activate(s, P, rank, tags)
    if not one_pass:
        b["recv"] = s.buffer(mem.empty(n, spec.dtype), name="recv")
        b["meta_recv"] = s.buffer(np.zeros(3 + 2 * P, np.int64),
                                  name="meta_recv")
        b["meta_tmp"] = s.buffer(np.zeros(3 + 2 * P, np.int64),
                                 name="meta_tmp")
    snap = _snapshot(s, b, act.done, inplace, mem is HOST, P)
    first = len(s)
    send, meta_send = (None, None) if inplace else (b["send"],
                                                    b["meta_send"])
    if one_pass:
        build_recursive_doubling(s, BuildContext(
            P, rank, send, b["recv"], b["tmp"], spec.op, inplace=inplace,
            after=[snap], tag0=tags["data"], wire=tuple(wire),
            riders=[(meta_send, b["meta_recv"], b["meta_tmp"], SUM)]))
    else:
        tmp = s.buffer(mem.empty(tmp_size(algo, n, P), spec.dtype),
                       name="tmp")
        BUILDERS[algo](s, BuildContext(P, rank, send, b["recv"], tmp,
                                       spec.op, inplace=inplace, after=[snap],
                                       tag0=tags["data"]))
        build_recursive_doubling(s, BuildContext(
            P, rank, meta_send, b["meta_recv"], b["meta_tmp"], SUM,
            inplace=inplace, after=[snap], tag0=tags["meta"]))
    # one rank: no exchange in place, the round is done with its snapshot
    done = s.nop(after=list(range(first, len(s))) or [snap])
    return _finish(s, spec, b, act, done)


def _build_eager(s, spec, b, wire, tags):
    """Two ranks, a small round: the data is the activation.  A rank's
    round starts on its trigger or on the peer's data, whichever comes
    first, and sends its snapshot (data and bookkeeping) to the peer as
    one stamped message::

        heard = stamped recv(tmp_wire <- peer)
        act   = ANY(T, heard)  (the kind's: majority's heard passes a
                                gate that declines on the round's drawn
                                rank, whose own call alone starts it;
                                quorum's act at rank 0 is its count)
        snapshot -> stamped send(recv_wire -> peer) -> recv op= tmp

    One message each way per round, as ``MPI_Allreduce`` sends, where an
    activation message and then an exchange would be two.  A stamped
    message travels on the executor's control channel, so an idle object
    posts no receive of its own."""
    peer = 1 - spec.rank
    tag = tags["activation"]
    heard = s.recv(wire[1], peer, tag=tag, stamped=True)
    act = spec.activate(s, 2, spec.rank, tags, heard=[heard],
                        book=(b["book"], b["meta_tmp"]))
    snap = _snapshot(s, b, act.done, True, True, 2)
    sent = s.send(wire[0], peer, tag=tag, stamped=True, after=[snap])
    done = s.nop(after=[s.reduce(b["recv"], b["tmp"], spec.op,
                                 after=[sent, heard]),
                        s.reduce(b["meta_recv"], b["meta_tmp"], SUM,
                                 after=[sent, heard])])
    return _finish(s, spec, b, act, done)


def _finish(s, spec, b, act, done):
    """The accounting after ``done`` (the exchange), then the schedule
    committed; returns (schedule, :class:`Activation`)."""
    _accumulate(s, b, spec.op, done, spec.size)
    s.commit()
    return s, act


def _packed(n, dtype, m):
    """n elements of ``dtype`` and m int64 back to back (the int64 aligned),
    as (the data's view, the int64 view, the whole as bytes)."""
    nbytes = n * dtype.itemsize
    off = -(-nbytes // 8) * 8
    packed = np.zeros(off + 8 * m, np.uint8)
    return packed[:nbytes].view(dtype), packed[off:].view(np.int64), packed


def _snapshot(s, b, act, inplace, host, P):
    """Under the lock: take the deposits and flags for this round (into
    ``send`` and ``meta_send``, or ``inplace`` into the exchange's receive
    buffers), reset them for the next (pending: filled with the one
    element of ``identity`` in host memory, else copied from it); the
    flags and sequence numbers in one callback (``partial.snapshot``)."""
    data, meta = ("recv", "meta_recv") if inplace else ("send", "meta_send")
    c = s.copy(b[data], b["pending"], after=[act], locked=True)
    reset = s.fill if host else s.copy
    c = reset(b["pending"], b["identity"], after=[c], locked=True)
    return s.callback(_calls.SNAPSHOT, b[meta], b["book"], P, after=[c],
                      locked=True)


def _accumulate(s, b, op, done, P):
    """Under the lock: the round's result into ``acc`` (catch-up) or in
    place of it (latest only, the one it replaces into ``skipped``), kept
    in ``last`` too where there is one; then the round's bookkeeping from
    the meta sums and the straggler counters (the same on every rank:
    from the meta sums, over plain rounds only, with no flush or bypass
    mark) in one callback (``partial.account``)."""
    if "last" in b:
        done = s.copy(b["last"], b["recv"], after=[done], locked=True)
    if "skipped" not in b:
        c = s.reduce(b["acc"], b["recv"], op, after=[done], locked=True)
    else:
        c = s.reduce(b["skipped"], b["acc"], op, after=[done], locked=True)
        c = s.copy(b["acc"], b["recv"], after=[c], locked=True)
    return s.callback(_calls.ACCOUNT, b["book"], b["meta_recv"], P,
                      after=[c], locked=True)
