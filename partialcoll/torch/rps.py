"""RPS training for PyTorch: ``partialcoll.torch.RPSOptimizer`` (see
:mod:`partialcoll.rps.optim` for the two modes).

    opt = pct.RPSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           average="model", seed=0)
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.close()

CPU parameters of float32 or float64 (the averaging works on NumPy views of
them, without copies of the tensors themselves)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from ..core.errors import ScheduleError
from ..rps.optim import FlatView, check_mode
from ..rps.average import RPSAverage, RPSRound


class RPSOptimizer:
    """Wrap a ``torch.optim.Optimizer``: each ``step()`` is the local step
    and an averaging over an unreliable network.  Other attributes
    (``param_groups``, ``state_dict``, ...) are the wrapped optimizer's."""

    last: RPSRound | None       # what the latest step's averaging did

    def __init__(self, optimizer: torch.optim.Optimizer,
                 average: str = "model", comm: MPI.Comm | None = None,
                 seed: int = 0, timeout: float | None = None,
                 traffic_class: int = 1) -> None:
        self.optimizer, self.average = optimizer, check_mode(average)
        self.params = [p for g in optimizer.param_groups for p in g["params"]
                       if p.requires_grad]
        for p in self.params:
            if p.device.type != "cpu" or p.dtype not in (torch.float32,
                                                         torch.float64):
                raise ScheduleError(f"RPSOptimizer averages CPU float32/"
                                    f"float64 parameters, got {p.dtype} on "
                                    f"{p.device}")
        self._views = [p.detach().numpy() for p in self.params]
        self._view = FlatView(self._views)
        self._avg = RPSAverage(self._view.flat, comm=comm, seed=seed,
                               timeout=timeout, traffic_class=traffic_class)
        self.last = None

    def step(self, closure: Callable[[], float] | None = None
             ) -> float | None:
        """The local step and the averaging; returns the closure's loss."""
        if self.average == "gradients":
            grads = [p.grad.detach().numpy() if p.grad is not None else
                     np.zeros(p.shape, v.dtype)
                     for p, v in zip(self.params, self._views)]
            self.last = self._avg(self._view.pack(grads))
            for p, g in zip(self.params, self._view.pieces()):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(torch.from_numpy(g))
            loss = self.optimizer.step(closure)
        else:
            loss = self.optimizer.step(closure)
            with torch.no_grad():
                self.last = self._avg(self._view.pack(self._views))
                self._view.unpack_into(self._views)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def stats(self) -> dict[str, float]:
        return self._avg.stats()

    def close(self) -> None:
        """Collective: frees the averaging."""
        self._avg.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)
