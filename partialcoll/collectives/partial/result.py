"""What a partial collective's call returns."""
from __future__ import annotations

from typing import Any


class PartialResult:
    """What one call returns (``partialcoll.PartialResult``).

    Attributes:
        data: the result (an array shaped like ``like``): with ``catch_up``
            every round this rank had not returned yet, combined; without
            it, the latest round only (the rounds it passed over are kept
            and returned, combined, by the next synchronous round).
        included: whether this call's contribution is in ``data``.
        round: index of the last round ``data`` covers (-1 if none).
        active: processes that contributed fresh data in that round (NAP):
            calls that found no round begun or completed since their
            rank's previous call.  Not a count of the contributions in
            ``data``: any other deposit is carried into the next round
            without being counted, so a synchronous round may hold data
            with ``active == 0``, or hold nothing (the op's identity).
        rounds: how many rounds ``data`` combines (always the rounds whose
            sums are in ``data``: 1 for a plain call without catch-up).
        skipped: rounds that completed since this rank's previous result
            and are *not* in ``data`` (only without catch-up; a
            synchronous round returns them).
        sync: whether that round is part of a synchronous round: started by
            flush, close or the sync_every-th call, or by a caller while
            some rank was inside one.  Only such a round may have fewer
            fresh contributions than the kind promises (majority: its
            initiator, so ``active >= 1``; quorum: ``active >= k``).
    """

    __slots__ = ("data", "included", "round", "active", "rounds", "sync",
                 "skipped")

    data: Any               # of the caller's type (Buffer)
    included: bool
    round: int
    active: int
    rounds: int
    sync: bool
    skipped: int

    def __init__(self, data: Any, included: bool, round: int, active: int,
                 rounds: int, sync: bool = False, skipped: int = 0) -> None:
        self.data, self.included, self.round = data, included, round
        self.active, self.rounds, self.sync = active, rounds, sync
        self.skipped = skipped

    def __repr__(self) -> str:
        return (f"PartialResult(round={self.round}, rounds={self.rounds}, "
                f"active={self.active}, included={self.included}, "
                f"sync={self.sync}, skipped={self.skipped})")
