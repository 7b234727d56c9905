"""Training over an unreliable network: every rank takes a local step, then
the ranks average through RPS (:class:`partialcoll.RPSAverage`), whose
messages the network may lose.

Two modes, as in the RPS paper (section 6):

* ``average="model"`` (RPS, the paper's Algorithm 1): take the local SGD
  step, then average the *models*.  A lost block leaves a rank with its own
  block, which the next averaging pulls back: replicas stay close.
* ``average="gradients"`` (the baseline the paper compares with): average
  the *gradients*, then step.  A lost block leaves a rank stepping on its own
  gradient block; nothing ever pulls the replicas back together, so they
  drift apart.

For NumPy optimizers (a ``params`` list of arrays and ``step(grads)``, as
in :mod:`partialcoll.eager`); PyTorch: ``partialcoll.torch.RPSOptimizer``.
Use plain SGD without momentum to match the paper's analysis::

    from partialcoll.eager import SGD
    opt = RPSOptimizer(SGD([w, b], lr=0.1), average="model", seed=0)
    for batch in data:
        info = opt.step(grads_of(w, b, batch))     # an RPSRound
    opt.close()                                    # collective
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..core.errors import ScheduleError
from .average import RPSAverage, RPSRound

MODES = ("model", "gradients")


class FlatView:
    """Copies a list of arrays into one flat vector and back."""

    def __init__(self, arrays):
        if not arrays:
            raise ScheduleError("nothing to average: no parameters")
        kinds = {np.dtype(a.dtype).kind for a in arrays}
        if not kinds <= {"f"}:
            raise ScheduleError("RPS averages float parameters only")
        self.dtype = np.result_type(*[a.dtype for a in arrays])
        self.sizes = [a.size for a in arrays]
        self.shapes = [a.shape for a in arrays]
        self.flat = np.zeros(sum(self.sizes), self.dtype)

    def pack(self, arrays):
        k = 0
        for a, n in zip(arrays, self.sizes):
            self.flat[k:k + n] = np.asarray(a).reshape(-1)
            k += n
        return self.flat

    def unpack_into(self, arrays):
        """Write the flat vector back into ``arrays``, in place: through
        each array itself, so that a non-contiguous one (a transposed
        view, a channels-last tensor's view) is written too, not a copy
        that ``reshape(-1)`` would make."""
        k = 0
        for a, n, shape in zip(arrays, self.sizes, self.shapes):
            a[...] = self.flat[k:k + n].reshape(shape)
            k += n

    def pieces(self):
        k, out = 0, []
        for n, shape in zip(self.sizes, self.shapes):
            out.append(self.flat[k:k + n].reshape(shape))
            k += n
        return out


def check_mode(average):
    if average not in MODES:
        raise ScheduleError(f"average must be one of {MODES}, got "
                            f"{average!r}")
    return average


class RPSOptimizer:
    """Wrap a NumPy optimizer: local step and averaging over an unreliable
    network (see the module docstring).

    Args:
        optimizer: has ``params`` (arrays updated in place) and
            ``step(grads)``.
        average: ``"model"`` (RPS) or ``"gradients"`` (the baseline).
        comm, seed, timeout, traffic_class: as
            :class:`~partialcoll.RPSAverage`.
    """

    last: RPSRound | None       # what the latest step's averaging did

    def __init__(self, optimizer: Any, average: str = "model",
                 comm: MPI.Comm | None = None, seed: int = 0,
                 timeout: float | None = None,
                 traffic_class: int = 1) -> None:
        self.optimizer, self.average = optimizer, check_mode(average)
        self.params = list(optimizer.params)
        self._view = FlatView(self.params)
        self._avg = RPSAverage(self._view.flat, comm=comm, seed=seed,
                               timeout=timeout, traffic_class=traffic_class)
        self.last = None

    def step(self, grads: Sequence[npt.NDArray[np.floating[Any]]]
             ) -> RPSRound:
        """One training step; returns the averaging's
        :class:`~partialcoll.RPSRound`."""
        if len(grads) != len(self.params):
            raise ScheduleError(f"{len(grads)} gradients for "
                                f"{len(self.params)} parameters")
        if self.average == "gradients":
            self.last = self._avg(self._view.pack(grads))
            self.optimizer.step(self._view.pieces())
        else:
            self.optimizer.step(grads)
            self.last = self._avg(self._view.pack(self.params))
            self._view.unpack_into(self.params)
        return self.last

    def stats(self) -> dict[str, float]:
        return self._avg.stats()

    def close(self) -> None:
        """Collective: frees the averaging."""
        self._avg.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
