"""Rabenseifner: reduce-scatter by recursive halving, allgather by
recursive doubling (bandwidth optimal in 2 log2 P steps)."""
import numpy as np

from .fold import Fold


def build_rabenseifner(s, ctx):
    """Append Rabenseifner's allreduce to schedule ``s`` (see
    :class:`~partialcoll.collectives.context.BuildContext`).

    The vector is cut into p2 chunks.  Halving: at distance m = p2/2, ..., 1
    each rank keeps the half of its current range on its side of the split
    (bit m of its rank), sends the other half to rank ^ m and adds the half
    it receives; it ends owning chunk `rank`, fully reduced.  Doubling: at
    distance m = 1, ..., p2/2 partners swap what they own, doubling it::

        p2 = 4, chunks c0..c3      halving m=2     halving m=1    doubling
        r0  keeps c0 c1 -> c0      send c2 c3      send c1        c0 <-> c1 ...
        r2  keeps c2 c3 -> c2      send c0 c1      send c3

    Non-powers of two fold the extra ranks in and out as recursive doubling
    does (:mod:`.fold`).  Tags ``tag0 .. tag0 + 2 log2 p2 + 1``.  Returns
    the index of the last op.
    """
    fold = Fold(ctx.size, ctx.rank)
    steps = fold.p2.bit_length() - 1
    unfold_tag = 2 * steps + 1
    prev, done = fold.fold_in(s, ctx, ctx.start(s), unfold_tag)
    if done:
        return prev
    prev, lo, hi, gave = _halve(s, ctx, fold, prev)
    prev = _double(s, ctx, fold, prev, lo, hi, gave, steps + 1)
    return fold.fold_out(s, ctx, prev, unfold_tag)


def _chunks(n, p2):
    counts = [n // p2 + (1 if i < n % p2 else 0) for i in range(p2)]
    return np.concatenate([[0], np.cumsum(counts)]).astype(int)


def _halve(s, ctx, fold, prev):
    """The reduce-scatter: returns (prev, owned range lo..hi, the send of
    each distance, which the doubling must follow)."""
    offs = _chunks(ctx.recv.size, fold.p2)
    lo, hi, tag, mask, gave = 0, fold.p2, 1, fold.p2 // 2, {}
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if fold.new & mask else \
            ((lo, mid), (mid, hi))
        k = offs[keep[1]] - offs[keep[0]]
        peer = fold.real(fold.new ^ mask)
        gave[mask] = s.send(ctx.recv[offs[give[0]]:offs[give[1]]], peer,
                            tag=ctx.tag0 + tag, after=prev)
        rcv = s.recv(ctx.tmp[0:k], peer, tag=ctx.tag0 + tag, after=prev)
        prev = [s.reduce(ctx.recv[offs[keep[0]]:offs[keep[1]]],
                         ctx.tmp[0:k], ctx.op, after=[gave[mask], rcv])]
        (lo, hi), mask, tag = keep, mask // 2, tag + 1
    return prev, lo, hi, gave


def _double(s, ctx, fold, prev, lo, hi, gave, tag):
    """The allgather: partners swap what they own, doubling it."""
    offs = _chunks(ctx.recv.size, fold.p2)
    mask = 1
    while mask < fold.p2:
        width = hi - lo
        other = (lo - width, lo) if fold.new & mask else (hi, hi + width)
        peer = fold.real(fold.new ^ mask)
        s.send(ctx.recv[offs[lo]:offs[hi]], peer, tag=ctx.tag0 + tag,
               after=prev)
        prev = [s.recv(ctx.recv[offs[other[0]]:offs[other[1]]], peer,
                       tag=ctx.tag0 + tag, after=prev + [gave[mask]])]
        lo, hi = min(lo, other[0]), max(hi, other[1])
        mask, tag = mask * 2, tag + 1
    return prev
