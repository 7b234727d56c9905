"""The optimizer of the parameter server, and where momentum lives.

The paper keeps momentum at the server (Eq. 2): every update is applied
as its own step, h <- gamma h + u, w <- w + h (here w <- w - lr h, u the
worker's gradient).  ``SGD(at="server")`` does that, and aggregation
stays exact: m updates u_1..u_m applied one by one from (w, h) give::

    h' = gamma^m h + V
    w' = w - lr (A_m h + (S - gamma V) / (1 - gamma))

with S = sum_j u_j, V = sum_j gamma^(m-j) u_j and A_m = gamma + .. +
gamma^m.  So a commit carries two sums, [S, V] (each member sends
[u, gamma^(m-j) u] and an aggregator adds them), and the server and the
replica apply exactly Eq. 2 step by step in the server's order, however
their commits group the updates.  The price: with gamma > 0 every update
and sum of mode "mlfabric" is twice the model's size on the wire, and the
scheduler plans with that size (``wire_width``).  A direct update sends
[u, u]: the redundant half keeps every transfer of a run one size, which
the link monitor needs (it reads a rate from a planned size and a
measured time).  The replica applies its own commits the same way, so
its model at version p is the server's at version p, and Eq. 11 (with
momentum) bounds their real divergence.

``SGD(at="worker")`` keeps a history per worker and sends it: the server
applies w <- w - lr * sum, linear, with the model's size on the wire; the
divergence bound is then Eq. 11 with gamma = 0.

Mode "mlfabric-s" (synchronous) takes one momentum step per iteration on
the average of its updates; mode "async" one per update (the paper's
asynchronous PS).  Neither needs the second sum.
"""
import numpy as np

from .config import check_real
from ...core.errors import ArgumentTypeError, ScheduleError

PLACES = ("worker", "server")


class SGD:
    """SGD with momentum, at the server (the paper) or at the workers.

    Args:
        lr: the server's learning rate (eta).
        momentum: gamma.
        at: "worker" (default: each worker keeps its own history and
            sends it) or "server" (the paper's Eq. 2: the server keeps
            the history and applies every update as its own step).

    Example::

        opt = SGD(lr=0.5, momentum=0.9, at="server")
        h = opt.history(n)                 # on a worker
        u = opt.update(h, grad)            # what it sends
        opt.apply(params, u)               # on the server (at="worker")
    """

    def __init__(self, lr=0.1, momentum=0.0, at="worker"):
        lr = check_real(lr, "lr", 0, open_low=True)
        momentum = check_real(momentum, "momentum (in [0, 1))", 0, high=1)
        if momentum == 1:
            raise ScheduleError("momentum must be < 1, got 1")
        if not isinstance(at, str):
            raise ArgumentTypeError(f"at must be one of {PLACES}, got "
                                    f"{type(at).__name__}")
        if at not in PLACES:
            raise ScheduleError(f"at must be one of {PLACES}, got {at!r}")
        self.lr, self.momentum, self.at = lr, momentum, at

    def __repr__(self):
        return (f"SGD(lr={self.lr!r}, momentum={self.momentum!r}, "
                f"at={self.at!r})")

    @property
    def server_gamma(self):
        """The server's momentum (0 when the workers keep it)."""
        return self.momentum if self.at == "server" else 0.0

    def wire_width(self, mode):
        """How many model-sized halves a scheduled transfer carries: 2
        for server momentum in mode "mlfabric" ([S, V]), else 1."""
        return 2 if mode == "mlfabric" and self.server_gamma > 0 else 1

    def history(self, n):
        """A worker's momentum history (unused with ``at="server"``)."""
        return np.zeros(n)

    def update(self, history, grad):
        """What a worker sends: its gradient (``at="server"``), or its
        history after h <- gamma h + g (in place; a copy)."""
        if self.at == "server":
            return np.array(grad, dtype=np.float64)
        history *= self.momentum
        history += grad
        return history.copy()

    def apply(self, params, total, scale=1.0):
        """w <- w - lr * scale * total (in place; worker momentum)."""
        params -= (self.lr * scale) * total

    def norm(self, update):
        """How far ``update`` moves the model (the norms of Eq. 11)."""
        return self.lr * float(np.linalg.norm(update))


class ServerMomentum:
    """The momentum state of a model that applies updates one by one in a
    fixed order (the server, the replica): Eq. 2 per update.

    Args:
        optimizer: the :class:`SGD` (``at="server"``).
        n: the model's size.
    """

    def __init__(self, optimizer, n):
        self.lr, self.gamma, self.n = optimizer.lr, optimizer.momentum, n
        self.h = np.zeros(n)

    def apply(self, params, buf, members):
        """Apply a commit of ``members`` updates (in place): ``buf`` is
        [S, V] (2n) or, for one update, [u] (n) or [u, u]."""
        g, n = self.gamma, self.n
        if buf.size == n:
            if members != 1:
                raise ScheduleError(f"a commit of {members} updates needs "
                                    f"both sums (2 x {n} values), got {n}")
            s = v = buf
        else:
            s, v = buf[:n], buf[n:]
        a = g * (1 - g ** members) / (1 - g)     # 0 when gamma is 0
        step = a * self.h + (s - g * v) / (1 - g)
        self.h *= g ** members
        self.h += v
        params -= self.lr * step

    def step_average(self, params, total):
        """One step on ``total`` (an iteration's average: mode
        "mlfabric-s")."""
        self.h *= self.gamma
        self.h += total
        params -= self.lr * self.h
