"""The allreduce algorithms as builders: each only appends operations to a
:class:`~partialcoll.Schedule` (libNBC's ``allred_sched_*``), given the
communicator size and rank, the ``send``, ``recv`` and ``tmp`` slots, the
op, whether the call is in place, the ops to start after and the first of
its tags.  The reduced vector ends in ``recv`` on every rank,
bit-identical across ranks (every combining step computes ``a op b`` on one
side and ``b op a`` on the other, and the ops are commutative elementwise).
:mod:`.allreduce` chooses among them and runs them; the partial collectives
(:mod:`._rounds`) build them into their persistent schedules.
"""
import numpy as np


def build_recursive_doubling(s, size, rank, send, recv, tmp, op, inplace, after=(),
                             tag0=0):
    """Recursive doubling; non-powers of two fold the excess ranks first.

    P = 6 (p2 = 4, rem = 2): ranks 0 and 2 hand their vector to 1 and 3 and
    wait; the remaining four exchange full vectors over log2(4) = 2 rounds;
    1 and 3 hand the result back::

        fold     0->1   2->3
        round 0  1<->3' ... (new ranks 0..3: 1,3,4,5; partner = new ^ 1)
        round 1  partner = new ^ 2
        unfold   1->0   3->2

    Returns the index of the last op.
    """
    prev = list(after) if inplace else [s.copy(recv, send, after=after)]
    p2 = 1 << (size.bit_length() - 1)
    rem = size - p2
    steps = p2.bit_length() - 1
    unfold_tag = steps + 1
    if rank < 2 * rem and rank % 2 == 0:            # folded away
        snd = s.send(recv, rank + 1, tag=tag0 + 0, after=prev)
        return s.recv(recv, rank + 1, tag=tag0 + unfold_tag, after=[snd])
    if rank < 2 * rem:                              # absorbs rank - 1
        r = s.recv(tmp, rank - 1, tag=tag0 + 0, after=after)
        prev = [s.reduce(recv, tmp, op, after=prev + [r])]
        new = rank // 2
    else:
        new = rank - rem
    for k in range(steps):
        pnew = new ^ (1 << k)
        peer = 2 * pnew + 1 if pnew < rem else pnew + rem
        snd = s.send(recv, peer, tag=tag0 + k + 1, after=prev)
        rcv = s.recv(tmp, peer, tag=tag0 + k + 1, after=prev)
        prev = [s.reduce(recv, tmp, op, after=[snd, rcv])]
    if rank < 2 * rem:
        return s.send(recv, rank - 1, tag=tag0 + unfold_tag, after=prev)
    return prev[0]


def build_ring(s, size, rank, send, recv, tmp, op, inplace, after=(),
               tag0=0):
    """Ring reduce-scatter followed by a ring allgather (bandwidth optimal).

    The vector is cut into P chunks.  In reduce-scatter step t, rank r sends
    chunk (r - t) to r + 1 and adds chunk (r - t - 1) received from r - 1;
    after P - 1 steps rank r owns the full sum of chunk (r + 1).  The
    allgather passes finished chunks around the ring for P - 1 more steps::

        P = 3, chunk owned after reduce-scatter:  r0: c1  r1: c2  r2: c0
        step   0          1
        r0     send c0    send c2      (then allgather c1, c0)
        r1     send c1    send c0
        r2     send c2    send c1

    Received chunks land in two alternating halves of ``tmp``.
    """
    n = recv.size
    counts = [n // size + (1 if i < n % size else 0) for i in range(size)]
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    half = max(counts)
    chunk = [recv[offs[i]:offs[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    init = list(after) if inplace else [s.copy(recv, send, after=after)]
    reds, snds = [], []
    for t in range(size - 1):
        sc, rc = (rank - t) % size, (rank - t - 1) % size
        buf = tmp[(t % 2) * half:(t % 2) * half + counts[rc]]
        snds.append(s.send(chunk[sc], right, tag=tag0 + t, after=reds[-1:] or init))
        rcv = s.recv(buf, left, tag=tag0 + t, after=reds[-2:-1] or after)
        reds.append(s.reduce(chunk[rc], buf, op, after=[rcv] + init))
    last = reds[-1:]
    for t in range(size - 1):
        sc, rc = (rank + 1 - t) % size, (rank - t) % size
        s.send(chunk[sc], right, tag=tag0 + size - 1 + t, after=last)
        last = [s.recv(chunk[rc], left, tag=tag0 + size - 1 + t,
                       after=[reds[-1], snds[t]] + last)]


def _fold(s, size, rank):
    """Ranks beyond the largest power of two p2 fold into a partner.
    Returns (p2, rem, new rank or None, real rank of a new rank)."""
    p2 = 1 << (size.bit_length() - 1)
    rem = size - p2
    new = None if rank < 2 * rem and rank % 2 == 0 else \
        (rank // 2 if rank < 2 * rem else rank - rem)
    return p2, rem, new, (lambda v: 2 * v + 1 if v < rem else v + rem)


def build_rabenseifner(s, size, rank, send, recv, tmp, op, inplace, after=(),
                       tag0=0):
    """Reduce-scatter by recursive halving, allgather by recursive doubling.

    The vector is cut into p2 chunks.  Halving: at distance m = p2/2, ..., 1
    each rank keeps the half of its current range on its side of the split
    (bit m of its rank), sends the other half to rank ^ m and adds the half
    it receives; it ends owning chunk `rank`, fully reduced.  Doubling: at
    distance m = 1, ..., p2/2 partners swap what they own, doubling it::

        p2 = 4, chunks c0..c3      halving m=2     halving m=1    doubling
        r0  keeps c0 c1 -> c0      send c2 c3      send c1        c0 <-> c1 ...
        r2  keeps c2 c3 -> c2      send c0 c1      send c3

    Non-powers of two fold the extra ranks in and out as recursive doubling
    does.  2 log2(p2) steps of shrinking/growing size: bandwidth optimal with
    fewer synchronisations than the ring.
    """
    prev = list(after) if inplace else [s.copy(recv, send, after=after)]
    p2, rem, new, real = _fold(s, size, rank)
    steps = p2.bit_length() - 1
    unfold_tag = 2 * steps + 1
    if new is None:                                  # folded away
        snd = s.send(recv, rank + 1, tag=tag0 + 0, after=prev)
        return s.recv(recv, rank + 1, tag=tag0 + unfold_tag, after=[snd])
    if rank < 2 * rem:
        r = s.recv(tmp, rank - 1, tag=tag0 + 0, after=after)
        prev = [s.reduce(recv, tmp, op, after=prev + [r])]
    n = recv.size
    counts = [n // p2 + (1 if i < n % p2 else 0) for i in range(p2)]
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)

    def rng(lo, hi):
        return recv[offs[lo]:offs[hi]]

    lo, hi, tag, mask, gave = 0, p2, 1, p2 // 2, {}
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if new & mask else \
            ((lo, mid), (mid, hi))
        k = offs[keep[1]] - offs[keep[0]]
        peer = real(new ^ mask)
        gave[mask] = s.send(rng(*give), peer, tag=tag0 + tag, after=prev)
        rcv = s.recv(tmp[0:k], peer, tag=tag0 + tag, after=prev)
        prev = [s.reduce(rng(*keep), tmp[0:k], op, after=[gave[mask], rcv])]
        (lo, hi), mask, tag = keep, mask // 2, tag + 1
    mask = 1
    while mask < p2:
        width = hi - lo
        other = (lo - width, lo) if new & mask else (hi, hi + width)
        peer = real(new ^ mask)
        s.send(rng(lo, hi), peer, tag=tag0 + tag, after=prev)
        prev = [s.recv(rng(*other), peer, tag=tag0 + tag, after=prev + [gave[mask]])]
        lo, hi = min(lo, other[0]), max(hi, other[1])
        mask, tag = mask * 2, tag + 1
    if rank < 2 * rem:
        return s.send(recv, rank - 1, tag=tag0 + unfold_tag, after=prev)
    return prev[0]


BUILDERS = {"recursive_doubling": build_recursive_doubling, "ring": build_ring,
            "rabenseifner": build_rabenseifner}
