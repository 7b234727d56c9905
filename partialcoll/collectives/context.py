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
      most ``2 * size + 2`` from there).
    """

    __slots__ = ("size", "rank", "send", "recv", "tmp", "op", "inplace",
                 "after", "tag0")

    def __init__(self, size, rank, send, recv, tmp, op, inplace=False,
                 after=(), tag0=0):
        self.size, self.rank = size, rank
        self.send, self.recv, self.tmp = send, recv, tmp
        self.op, self.inplace = op, inplace
        self.after, self.tag0 = list(after), tag0

    def start(self, s):
        """The ops the reduction proper starts after: the copy of ``send``
        into ``recv`` (after ``after``), or ``after`` itself in place."""
        if self.inplace:
            return list(self.after)
        return [s.copy(self.recv, self.send, after=self.after)]
