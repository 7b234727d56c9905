"""What the optimizer wrappers share (NumPy's here in :mod:`.optim`,
PyTorch's in :mod:`partialcoll.torch`): :class:`StepInfo`, what one step
did, and :class:`AveragerFront`, the methods over an
:class:`~.core.EagerAverager`."""
from __future__ import annotations

from typing import Any


class StepInfo:
    """What one eager-SGD step did, for logging.

    Attributes:
        step: this rank's step number (1-based; 0 for a flush).
        active: processes whose fresh gradient was in the round applied
            (the paper's NAP; P for ``"sync"``).
        included: whether this rank's gradient of this step is in the
            update just applied (if not, it is carried to a later round).
        rounds: how many rounds of the partial allreduce the update combines
            (more than 1 when this rank had fallen behind).
        round: index of the latest round applied.
    """

    __slots__ = ("step", "active", "included", "rounds", "round")

    step: int
    active: int
    included: bool
    rounds: int
    round: int

    def __init__(self, step: int, active: int, included: bool, rounds: int,
                 round: int) -> None:
        self.step, self.active, self.included = step, active, included
        self.rounds, self.round = rounds, round

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return ("StepInfo(" + ", ".join(f"{k}={getattr(self, k)}"
                                        for k in self.__slots__) + ")")


class AveragerFront:
    """What the optimizer wrappers share: ``flush``, ``close``,
    ``last_step`` and ``stats`` over ``self.averager``; the wrapper's
    ``_apply(averaged)`` applies averaged gradients with its optimizer."""

    # the wrapper's EagerAverager (typed Any: core.py imports this module)
    averager: Any

    def flush(self) -> StepInfo | None:
        """Collective: apply every gradient still pending on any rank, as
        one extra optimizer step on every rank (on none when nothing is
        pending anywhere).  Returns its StepInfo or None."""
        return self._apply_result(self.averager.flush())

    def close(self) -> StepInfo | None:
        """Collective: flush (applied), then free the communication
        resources.  Idempotent."""
        if self.averager.closed:
            return None
        return self._apply_result(self.averager.close())

    def _apply_result(self, out):
        if out is None:
            return None
        self._apply(out[0])
        return out[1]

    @property
    def last_step(self) -> StepInfo | None:
        """The latest step's :class:`~partialcoll.eager.StepInfo` (None
        before the first): ``active`` (processes with fresh gradients,
        NAP), ``included`` (this rank's gradient is in the update),
        ``rounds``."""
        return self.averager.last

    def stats(self) -> dict[str, Any]:
        """Counters: steps, included, rounds, mean_active (average NAP), and
        the straggler report (see
        :meth:`partialcoll.eager.EagerAverager.stats`)."""
        return self.averager.stats()
