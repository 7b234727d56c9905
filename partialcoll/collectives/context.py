"""What a builder is given: :class:`BuildContext`."""


class BuildContext:
    """The arguments every allreduce builder takes (Gloo's options struct):

    * ``size``, ``rank`` -- the communicator's;
    * ``send``, ``recv``, ``tmp`` -- slots (or ``slot[a:b]`` ranges) of the
      schedule being built: the input, where the result ends, and scratch
      space (recursive doubling and Rabenseifner: as long as ``recv``;
      the ring: two chunks);
    * ``op`` -- the reduction (:class:`~partialcoll.core.ops.Op`);
    * ``inplace`` -- the input is already in ``recv`` (``send`` unused);
    * ``after`` -- the ops the builder's first ops depend on;
    * ``tag0`` -- the first of the tags the builder may use (it uses at
      most ``2 * size + 2`` from there);
    * ``riders`` -- more vectors reduced in the same messages, as
      ``(send, recv, tmp, op)`` (recursive doubling only), and ``wire``
      their messages: ``(recv_all, tmp_all)``, slots whose memory is
      ``recv`` and every rider's recv back to back (and the same for
      tmp), so one message carries them all.  A partial collective's
      bookkeeping rides on its data this way.
    """

    __slots__ = ("size", "rank", "send", "recv", "tmp", "op", "inplace",
                 "after", "tag0", "riders", "wire")

    def __init__(self, size, rank, send, recv, tmp, op, inplace=False,
                 after=(), tag0=0, riders=(), wire=None):
        self.size, self.rank = size, rank
        self.send, self.recv, self.tmp = send, recv, tmp
        self.op, self.inplace = op, inplace
        self.after, self.tag0 = list(after), tag0
        self.riders, self.wire = list(riders), wire

    def start(self, s):
        """The ops the reduction proper starts after: the copy of ``send``
        into ``recv`` (and each rider's) after ``after``, or ``after``
        itself in place."""
        if self.inplace:
            return list(self.after)
        return [s.copy(r, snd, after=self.after) for snd, r, _, _ in
                [(self.send, self.recv, None, None)] + self.riders]

    @property
    def wire_recv(self):
        """What a message sends from and the unfold receives into."""
        return self.recv if self.wire is None else self.wire[0]

    @property
    def wire_tmp(self):
        """What a message to be combined is received into."""
        return self.tmp if self.wire is None else self.wire[1]

    def combine(self, s, after):
        """The ops that reduce a received message (in ``tmp``) into
        ``recv``: one per vector it carries."""
        return [s.reduce(r, t, op, after=after) for r, t, op in
                [(self.recv, self.tmp, self.op)] +
                [(r, t, op) for _, r, t, op in self.riders]]
