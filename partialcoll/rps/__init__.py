"""RPS (Yu et al., *Distributed Learning over Unreliable Networks*):
averaging over links that lose messages, and training with it.

* :mod:`.average`: :class:`RPSAverage`, the drop-tolerant averaging step
  (the paper's Algorithm 1) as a schedule on the executor;
* :mod:`.optim`: :class:`RPSOptimizer` for NumPy optimizers (PyTorch:
  ``partialcoll.torch.RPSOptimizer``).
"""
from .average import RPSAverage, RPSRound
from .optim import RPSOptimizer

__all__ = ["RPSAverage", "RPSRound", "RPSOptimizer"]
