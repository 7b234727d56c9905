"""eager-SGD for NumPy training loops.

A NumPy optimizer here is any object with a ``params`` list of arrays that it
updates in place and a ``step(grads)`` method taking one gradient per
parameter.  :class:`SGD` and :class:`Adam` are small reference ones; wrap any
of them (or your own) in one line::

    opt = EagerOptimizer(SGD(params, lr=0.1), mode="solo")
    for batch in data:
        info = opt.step(compute_grads(params, batch))   # a StepInfo
    opt.flush()          # collective: every pending gradient applied
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..core.buffers import Buffer
from ..core.errors import ArgumentTypeError, ScheduleError
from .core import EagerAverager
from .front import AveragerFront, StepInfo

#: a parameter: a floating-point NumPy array, updated in place
Param = npt.NDArray[np.floating[Any]]


class SGD:
    """Plain SGD with optional momentum and weight decay, like
    ``torch.optim.SGD`` (``v = mu v + g; p -= lr v``)."""

    def __init__(self, params: Iterable[Param], lr: float,
                 momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        self.params = _check_params(params)
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ScheduleError(f"lr must be > 0; momentum, weight_decay "
                                f">= 0; got lr={lr!r}, momentum={momentum!r}"
                                f", weight_decay={weight_decay!r}")
        self.lr, self.momentum = float(lr), float(momentum)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)
        self._v: list[Param | None] = [None] * len(self.params)

    def step(self, grads: Iterable[Param | None]) -> None:
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                v = self._v[i]
                if v is None:
                    v = self._v[i] = np.array(g, dtype=p.dtype, copy=True)
                else:
                    v *= self.momentum
                    v += g
                g = g + self.momentum * v if self.nesterov else v
            p -= self.lr * g


class Adam:
    """Adam (Kingma and Ba), like ``torch.optim.Adam`` without amsgrad."""

    def __init__(self, params: Iterable[Param], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        self.params = _check_params(params)
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.weight_decay = float(weight_decay)
        self._m = [np.zeros_like(p) for p in self.params]
        self._v = [np.zeros_like(p) for p in self.params]
        self._t = [0] * len(self.params)

    def step(self, grads: Iterable[Param | None]) -> None:
        b1, b2 = self.betas
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            if self.weight_decay:
                g = g + self.weight_decay * p
            self._t[i] += 1
            t, m, v = self._t[i], self._m[i], self._v[i]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            mhat = m / (1 - b1 ** t)
            vhat = v / (1 - b2 ** t)
            p -= self.lr * mhat / (np.sqrt(vhat) + self.eps)


class EagerOptimizer(AveragerFront):
    """Turn a NumPy optimizer into eager-SGD.

    ``step(grads)`` averages ``grads`` across ranks with a partial allreduce
    (see :class:`~partialcoll.eager.EagerAverager` for ``mode``,
    ``sync_every``, ``comm``, ``bucket_bytes`` and ``seed``) and passes the
    result to the wrapped optimizer's ``step``.  A gradient that misses its
    round is carried into a later one and applied then: nothing is lost.

    ``compression="fp16"`` (``partialcoll.Compression.fp16``; not with
    ``"sync-mpi"``): the gradients travel as float16 (see
    :class:`~partialcoll.eager.EagerAverager`).

    Creating, ``flush()`` and ``close()`` are collective; ``last_step``
    and ``stats()`` report how the steps went.
    """

    def __init__(self, optimizer: Any, mode: str | int = "solo",
                 sync_every: int | None = None,
                 comm: MPI.Comm | None = None,
                 bucket_bytes: int | None = None, seed: int = 0,
                 names: Iterable[str] | None = None, *,
                 compression: str | None = None) -> None:
        if not hasattr(optimizer, "step") or not hasattr(optimizer, "params"):
            raise ArgumentTypeError(f"optimizer must have a 'params' list "
                                    f"and a 'step(grads)' method (like "
                                    f"partialcoll.eager.SGD), not "
                                    f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.params = list(optimizer.params)
        self.averager = EagerAverager(self.params, mode, sync_every, comm,
                                      bucket_bytes, seed, names,
                                      compression=compression)

    def step(self, grads: Iterable[Buffer]) -> StepInfo:
        """Average ``grads`` (one per parameter, None for none) and apply
        them.  Returns the step's :class:`~partialcoll.eager.StepInfo`."""
        avg, info = self.averager.reduce(grads)
        self._apply(avg)
        return info

    def _apply(self, averaged):
        self.optimizer.step(averaged)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_params(params):
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, np.ndarray):
            raise ArgumentTypeError(f"params[{i}] must be a floating-point "
                                    f"NumPy array updated in place, not "
                                    f"{type(p).__name__}")
        if p.dtype.kind != "f":
            raise ScheduleError(f"params[{i}] must be a floating-point NumPy "
                                f"array updated in place, not {p.dtype}")
    return params
