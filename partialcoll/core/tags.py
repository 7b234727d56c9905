"""The tags of one executor communicator, handed out identically on every
rank (:class:`TagSpace`)."""
from .errors import ScheduleError


class TagSpace:
    """The tags of one executor communicator, 0 .. MPI_TAG_UB - 1 (the
    executor keeps MPI_TAG_UB for its control channel).

    * The lower three quarters hold blocks for persistent objects: first
      fit, given back at close().  Exhausting them raises ScheduleError
      with the numbers (see the lifecycle guide's tag budget).
    * The upper quarter rotates among one-shot calls (allreduce): each call
      takes the block after the previous call's, wrapping around.

    Blocks are taken and given back inside collective calls, in the same
    order on every rank, so every rank hands out the same tags.
    """

    def __init__(self, tag_ub, size):
        total = tag_ub                  # MPI_TAG_UB itself is reserved
        self.tag_ub, self.size = tag_ub, size
        self.one_shot_lo = total - total // 4
        self._free = [[0, self.one_shot_lo]]     # sorted [start, end)
        self._next = self.one_shot_lo
        self.held = 0           # tags held by persistent objects
        self.blocks = 0         # blocks held

    def block(self, ntags, what="partial collective object"):
        """The first tag of a free block of ``ntags`` tags (first fit)."""
        for ext in self._free:
            if ext[1] - ext[0] >= ntags:
                base = ext[0]
                ext[0] += ntags
                if ext[0] == ext[1]:
                    self._free.remove(ext)
                self.held += ntags
                self.blocks += 1
                return base
        raise ScheduleError(
            f"out of MPI tags on this communicator: {self.blocks} open "
            f"objects hold {self.held} of the {self.one_shot_lo} tags set "
            f"aside for persistent objects (three quarters of MPI_TAG_UB "
            f"= {self.tag_ub}), and a {what} at P = {self.size} needs "
            f"{ntags}; close() objects you no longer use")

    def give_back(self, base, ntags):
        """Return a block taken with :meth:`block`."""
        self.held -= ntags
        self.blocks -= 1
        end = base + ntags
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < base:
            i += 1
        free.insert(i, [base, end])
        if i + 1 < len(free) and free[i + 1][0] == end:     # merge right
            free[i][1] = free.pop(i + 1)[1]
        if i > 0 and free[i - 1][1] == base:                 # merge left
            free[i - 1][1] = free.pop(i)[1]

    def one_shot(self, ntags):
        """The first tag of the next rotating block of ``ntags`` tags."""
        top = self.tag_ub               # exclusive: MPI_TAG_UB is reserved
        if ntags > top - self.one_shot_lo:
            raise ScheduleError(
                f"a one-shot collective at P = {self.size} needs {ntags} "
                f"tags, more than the {top - self.one_shot_lo} kept for them "
                f"(a quarter of MPI_TAG_UB = {top})")
        if self._next + ntags > top:
            self._next = self.one_shot_lo
        base, self._next = self._next, self._next + ntags
        return base
