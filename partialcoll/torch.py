"""``import partialcoll.torch as pct``: eager-SGD for PyTorch.

See :mod:`partialcoll.eager.torch` for the documentation.  Needs torch
(``pip install partialcoll[torch]``).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:            # pragma: no cover - depends on the env
    raise ImportError("partialcoll.torch needs PyTorch: pip install "
                      "'partialcoll[torch]' (or your own torch build)") from e

from .eager.torch import (EagerHook, EagerOptimizer,  # noqa: E402
                          broadcast_parameters, eager_comm_hook,
                          synchronize_model)
from .eager.core import StepInfo  # noqa: E402
from .averaging_torch import RPSOptimizer  # noqa: E402

__all__ = ["EagerOptimizer", "EagerHook", "eager_comm_hook",
           "broadcast_parameters", "synchronize_model", "StepInfo",
           "RPSOptimizer"]
