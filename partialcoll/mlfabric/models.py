"""A small real model for the parameter server's tests and benchmark:
softmax regression on generated data (a random linear teacher).

The model interface :func:`~.training.train` expects::

    model.params                     # the initial parameters (1-D float)
    model.gradient(params, worker, step) -> the gradient (1-D, same size)
    model.loss(params) -> float      # evaluated at the server
"""
import numpy as np


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
        z = x @ w.reshape(self.features, self.classes)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def gradient(self, params, worker, step):
        """The mean cross-entropy gradient on one mini-batch."""
        rng = np.random.default_rng([self.seed, worker, step])
        idx = rng.integers(0, len(self.y), self.batch)
        x, y = self.x[idx], self.y[idx]
        p = self._probs(params, x)
        p[np.arange(len(y)), y] -= 1.0
        return (x.T @ p).reshape(-1) / len(y)

    def loss(self, params):
        """Mean cross-entropy on the first ``eval_samples`` points."""
        x, y = self.x[self.eval], self.y[self.eval]
        p = self._probs(params, x)
        return float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-12)))
