"""Non-powers of two: the ranks beyond the largest power of two p2 fold
their vector into a partner before the power-of-two algorithm and get the
result back after it (recursive doubling and Rabenseifner share this)::

    P = 6 (p2 = 4, rem = 2): ranks 0 and 2 hand their vector to 1 and 3
    and wait; 1, 3, 4, 5 become new ranks 0..3; 1 and 3 hand the result
    back to 0 and 2.
"""


class Fold:
    """The folding of ``size`` ranks onto p2, seen from ``rank``.

    ``new`` is this rank's number among the p2 (None: folded away);
    :meth:`real` maps a new number back to a rank."""

    def __init__(self, size, rank):
        self.p2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.p2
        self.rank = rank
        self.folded = rank < 2 * self.rem and rank % 2 == 0
        self.absorbs = rank < 2 * self.rem and not self.folded
        self.new = None if self.folded else \
            (rank // 2 if self.absorbs else rank - self.rem)

    def real(self, new):
        """The rank that is ``new`` among the p2."""
        return 2 * new + 1 if new < self.rem else new + self.rem

    def fold_in(self, s, ctx, prev, unfold_tag):
        """Before the algorithm: a folded rank sends its vector and waits for
        the result (returns its last op and True); the partner that absorbs
        it adds it in (returns the new ``prev`` and False)."""
        if self.folded:
            snd = s.send(ctx.wire_recv, self.rank + 1, tag=ctx.tag0,
                         after=prev)
            return s.recv(ctx.wire_recv, self.rank + 1,
                          tag=ctx.tag0 + unfold_tag, after=[snd]), True
        if self.absorbs:
            r = s.recv(ctx.wire_tmp, self.rank - 1, tag=ctx.tag0,
                       after=ctx.after)
            return ctx.combine(s, prev + [r]), False
        return prev, False

    def fold_out(self, s, ctx, prev, unfold_tag):
        """After the algorithm: the partner hands the result back."""
        if self.absorbs:
            return s.send(ctx.wire_recv, self.rank - 1,
                          tag=ctx.tag0 + unfold_tag, after=prev)
        return s.nop(after=prev) if len(prev) > 1 else prev[0]
