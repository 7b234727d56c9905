"""The optimizer of the parameter server, and where momentum lives.

The paper's setting (Eqs. 1-2) keeps momentum at the server.  With
aggregation that makes the model depend on the grouping: an aggregate of
m updates applied as one momentum step is not the m steps, and the server
and the replica group differently, so Eq. 11 would not bound their real
divergence.  Exact server momentum is possible (a group's effect is two
weighted sums of its members, sum_j gamma^(m-j) u_j for the history and
sum_j (1 - gamma^(m-j+1)) / (1 - gamma) u_j for the model), but an
aggregator would then send twice the bytes, which the scheduler's plan
(a sum is as large as its largest member) does not account for.

Our choice: momentum at the workers.  Each worker keeps its own history
h <- gamma h + g and sends h; the server applies w <- w - lr * sum, a
linear step, so an aggregate is exactly its members applied one by one in
any order, and server and replica agree whenever they have applied the
same updates (the divergence bound is then Eq. 11 with gamma = 0: the sum
of the norms of the updates one has applied and the other not).
"""
import numpy as np

from .config import check_real
from ...core.errors import ScheduleError


class SGD:
    """SGD with momentum, the history kept per worker.

    Args:
        lr: the server's learning rate (eta).
        momentum: gamma, applied by each worker to its own gradients.

    Example::

        opt = SGD(lr=0.5, momentum=0.9)
        h = opt.history(n)                 # on a worker
        u = opt.update(h, grad)            # what it sends
        opt.apply(params, u)               # on the server (or a sum of us)
    """

    def __init__(self, lr=0.1, momentum=0.0):
        lr = check_real(lr, "lr", 0, open_low=True)
        momentum = check_real(momentum, "momentum (in [0, 1))", 0, high=1)
        if momentum == 1:
            raise ScheduleError("momentum must be < 1, got 1")
        self.lr, self.momentum = lr, momentum

    def __repr__(self):
        return f"SGD(lr={self.lr!r}, momentum={self.momentum!r})"

    def history(self, n):
        """A worker's momentum history."""
        return np.zeros(n)

    def update(self, history, grad):
        """h <- gamma h + g (in place); returns a copy of h to send."""
        history *= self.momentum
        history += grad
        return history.copy()

    def apply(self, params, total, scale=1.0):
        """w <- w - lr * scale * total (in place)."""
        params -= (self.lr * scale) * total

    def norm(self, update):
        """How far ``update`` moves the model (for Eq. 11)."""
        return self.lr * float(np.linalg.norm(update))

