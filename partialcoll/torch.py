"""``import partialcoll.torch as pct``: eager-SGD for PyTorch, and
Horovod's broadcasts.

See :mod:`partialcoll.eager.torch` (the optimizer wrapper and the DDP hook)
and :mod:`partialcoll.broadcast_torch` (broadcasts) for the documentation.
Needs torch (``pip install partialcoll[torch]``).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:            # pragma: no cover - depends on the env
    raise ImportError("partialcoll.torch needs PyTorch: pip install "
                      "'partialcoll[torch]' (or your own torch build)") from e

from .eager.torch import (EagerHook, EagerOptimizer,  # noqa: E402
                          eager_comm_hook, synchronize_model)
from .broadcast import broadcast_object  # noqa: E402
from .broadcast_torch import (broadcast_optimizer_state,  # noqa: E402
                              broadcast_parameters)
from .eager.core import StepInfo  # noqa: E402
from .averaging_torch import RPSOptimizer  # noqa: E402

#: Horovod's names for ``EagerOptimizer(op=...)``.
Average, Sum = "average", "sum"

__all__ = ["EagerOptimizer", "EagerHook", "eager_comm_hook",
           "broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "synchronize_model", "StepInfo",
           "RPSOptimizer", "Average", "Sum"]
