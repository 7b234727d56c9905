"""Small real models for the parameter server's tests and benchmark:
softmax regression on generated data (a random linear teacher), and the
same data through a tanh hidden layer (:class:`TanhMLP`).

The model interface :func:`~.training.train` expects::

    model.params                     # the initial parameters (1-D float)
    model.gradient(params, worker, step) -> the gradient (1-D, same size)
    model.loss(params) -> float      # evaluated at the server
"""
import numpy as np


def _softmax(z):
    """Row-wise softmax of logits ``z`` (overwritten)."""
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


class SoftmaxRegression:
    """Softmax regression, ``features`` x ``classes`` weights, on
    ``samples`` generated points; each gradient uses a mini-batch of
    ``batch`` drawn from (seed, worker, step), so runs repeat exactly.
    Parameters: features * classes float64 (8 bytes each)."""

    def __init__(self, features=64, classes=8, samples=2048, batch=32,
                 eval_samples=512, seed=0):
        rng = np.random.default_rng([seed, 11])
        teacher = rng.normal(size=(features, classes))
        self.x = rng.normal(size=(samples, features)) / np.sqrt(features)
        logits = self.x @ teacher * 3.0
        self.y = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
        self.features, self.classes = features, classes
        self.batch, self.seed = batch, seed
        self.eval = slice(0, min(eval_samples, samples))
        self.params = np.zeros(features * classes)

    def _probs(self, w, x):
        return _softmax(x @ w.reshape(self.features, self.classes))

    def _batch(self, worker, step):
        """The mini-batch (x, y) of (seed, worker, step)."""
        rng = np.random.default_rng([self.seed, worker, step])
        idx = rng.integers(0, len(self.y), self.batch)
        return self.x[idx], self.y[idx]

    def gradient(self, params, worker, step):
        """The mean cross-entropy gradient on one mini-batch."""
        x, y = self._batch(worker, step)
        p = self._probs(params, x)
        p[np.arange(len(y)), y] -= 1.0
        return (x.T @ p).reshape(-1) / len(y)

    def loss(self, params):
        """Mean cross-entropy on the first ``eval_samples`` points."""
        x, y = self.x[self.eval], self.y[self.eval]
        p = self._probs(params, x)
        return float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-12)))


class TanhMLP(SoftmaxRegression):
    """:class:`SoftmaxRegression`'s data and mini-batches through one tanh
    hidden layer of ``hidden`` units, no biases: ``features x hidden +
    hidden x classes`` float64 parameters (1024, 128, 128: 1.1 MiB).

    A non-convex model for MLfabric's comparison of schemes.  Softmax
    regression's gradient is bounded and, on these few points, every stale
    gradient still points the right way, so delay hardly slows it at any
    learning rate (docs/results.md);
    with a hidden layer, stale updates at a high learning rate do.
    First layer N(0, 1) (the inputs have norm about 1), second
    N(0, 1 / hidden), from ``seed``."""

    def __init__(self, features=64, classes=8, hidden=32, samples=2048,
                 batch=32, eval_samples=512, seed=0):
        super().__init__(features, classes, samples, batch, eval_samples,
                         seed)
        self.hidden = hidden
        rng = np.random.default_rng([seed, 12])
        w1 = rng.normal(0.0, 1.0, (features, hidden))
        w2 = rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, classes))
        self.params = np.concatenate([w1.ravel(), w2.ravel()])

    def _split(self, w):
        k = self.features * self.hidden
        return (w[:k].reshape(self.features, self.hidden),
                w[k:].reshape(self.hidden, self.classes))

    def _forward(self, w, x):
        w1, w2 = self._split(w)
        h = np.tanh(x @ w1)
        return h, _softmax(h @ w2)

    def _probs(self, w, x):
        return self._forward(w, x)[1]

    def gradient(self, params, worker, step):
        """The mean cross-entropy gradient on one mini-batch."""
        x, y = self._batch(worker, step)
        h, p = self._forward(params, x)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        dh = (p @ self._split(params)[1].T) * (1.0 - h * h)
        return np.concatenate([(x.T @ dh).ravel(), (h.T @ p).ravel()])
