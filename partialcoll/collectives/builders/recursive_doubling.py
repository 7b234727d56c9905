"""Recursive doubling: latency optimal (log2 P exchanges of the whole
vector), for small messages."""
from .fold import Fold


def build_recursive_doubling(s, ctx):
    """Append recursive doubling to schedule ``s`` (see
    :class:`~partialcoll.collectives.context.BuildContext`); non-powers of
    two fold the excess ranks first (:mod:`.fold`)::

        P = 6 (p2 = 4): fold 0->1, 2->3; new ranks 0..3 = 1, 3, 4, 5
        round 0  partner = new ^ 1     (1 <-> 3, 4 <-> 5)
        round 1  partner = new ^ 2     (1 <-> 4, 3 <-> 5)
        unfold   1->0, 3->2

    Tags ``tag0`` (fold), ``tag0 + 1 .. tag0 + log2 p2`` (rounds),
    ``tag0 + log2 p2 + 1`` (unfold).  Returns the index of the last op.
    Riders (``ctx.riders``) travel in the same messages and are reduced
    beside the vector.
    """
    fold = Fold(ctx.size, ctx.rank)
    steps = fold.p2.bit_length() - 1
    unfold_tag = steps + 1
    prev, done = fold.fold_in(s, ctx, ctx.start(s), unfold_tag)
    if done:
        return prev
    for k in range(steps):
        peer = fold.real(fold.new ^ (1 << k))
        snd = s.send(ctx.wire_recv, peer, tag=ctx.tag0 + k + 1, after=prev)
        rcv = s.recv(ctx.wire_tmp, peer, tag=ctx.tag0 + k + 1, after=prev)
        prev = ctx.combine(s, [snd, rcv])
    return fold.fold_out(s, ctx, prev, unfold_tag)
