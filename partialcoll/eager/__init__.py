"""eager-SGD (the paper's section 5): data-parallel training whose gradient
averaging is a partial allreduce, so a slow rank no longer stalls the rest.

* ``core``: :class:`EagerAverager`, framework-agnostic (NumPy arrays);
  ``front``: what the optimizer wrappers share (:class:`StepInfo`);
  ``agreement``: the setup check every rank joins;
* ``optim``: NumPy optimizers (:class:`SGD`, :class:`Adam`) and their
  :class:`EagerOptimizer`;
* :mod:`partialcoll.torch`: the PyTorch wrapper and DDP hook (imports
  torch), built on :class:`EagerAverager`.
"""
from .core import EagerAverager
from .front import StepInfo
from .optim import SGD, Adam, EagerOptimizer

__all__ = ["EagerAverager", "StepInfo", "EagerOptimizer", "SGD", "Adam"]
