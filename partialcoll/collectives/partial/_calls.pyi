# The C extension partialcoll.collectives.partial._calls (csrc/partial/):
# a partial allreduce's blocking call, the protocol of rounds.py on the
# object's own buffers; blocking.py makes and calls it.  Importing it
# registers the round's callbacks (book.c) with the executor: the two of
# the bookkeeping, under the names SNAPSHOT and ACCOUNT, and majority's
# two-rank gate, DRAWN.
from typing import Any

#: the book's fields in its order (schedule.META)
BOOK_FIELDS: tuple[str, ...]
SNAPSHOT: str
ACCOUNT: str
DRAWN: str

class Calls:
    seq: int
    def __init__(self, sched: Any, buffers: tuple[Any, ...], size: int,
                 rank: int, kind: int, marks_bypass: bool, seed: int,
                 trigger: int, bypass: int, start: int, base: int,
                 count: int, itemsize: int, dtype: int, redop: int,
                 keeps: bool, /) -> None: ...
    def call(self, x: Any, observed: int, epochs: int, timeout: float,
             out: Any, late: Any,
             /) -> tuple[int, int, int, int, int, int, int]: ...
