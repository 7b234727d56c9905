"""The RPS benchmarks' training run, shared by the paper's experiment
(:mod:`.rps`) and the colocated case study (:mod:`.rps_colocated`): an
MLP on scikit-learn's digits, plain SGD on each rank's shard, the
gradients or models averaged by RPS or by a reliable allreduce."""
import numpy as np

import partialcoll as pc


def digits():
    """scikit-learn's digits, scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the rps benchmark needs scikit-learn: pip install "
                         "'partialcoll[bench]'") from None
    d = load_digits()
    return (d.data / 16.0).astype(np.float64), d.target.astype(np.int64)


class MLP:
    """64 -> hidden (tanh) -> 10 softmax; parameters as a list of arrays."""

    def __init__(self, hidden, seed):
        rng = np.random.default_rng([seed, 7])
        self.params = [rng.normal(0, 0.5, (64, hidden)), np.zeros(hidden),
                       rng.normal(0, 0.5, (hidden, 10)), np.zeros(10)]

    @staticmethod
    def forward(params, X):
        W1, b1, W2, b2 = params
        h = np.tanh(X @ W1 + b1)
        z = h @ W2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return h, p / p.sum(axis=1, keepdims=True)

    @classmethod
    def loss(cls, params, X, y):
        _, p = cls.forward(params, X)
        return float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())

    @classmethod
    def grads(cls, params, X, y):
        W1, b1, W2, b2 = params
        h, p = cls.forward(params, X)
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        d /= len(y)
        dh = (d @ W2.T) * (1 - h * h)
        return [X.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]


class SGD:
    def __init__(self, params, lr):
        self.params, self.lr = params, lr

    def step(self, grads):
        for p, g in zip(self.params, grads):
            p -= self.lr * g


def train(algo, p, seed, args, X, y, comm):
    """One run; returns (losses at the evaluation points, spread, delivered
    share)."""
    P, r = comm.size, comm.rank
    model = MLP(args.hidden, seed)
    order = np.random.default_rng([seed, 1, r])
    shard = np.arange(r, len(y), P)
    opt = SGD(model.params, args.lr)
    timeout = args.timeout if args.drop_mode == "silent" else None
    avg = None if algo == "allreduce" else pc.rps.RPSOptimizer(
        opt, average="model" if algo == "rps" else "gradients", comm=comm,
        seed=seed, timeout=timeout)
    losses = []
    for it in range(args.iters + 1):
        if it % args.every == 0:
            losses.append(evaluate(model.params, X, y, comm))
        if it == args.iters:
            break
        idx = order.choice(shard, args.batch, replace=False)
        g = MLP.grads(model.params, X[idx], y[idx])
        if avg is None:
            flat = np.concatenate([x.ravel() for x in g])
            pc.allreduce(flat, flat, comm=comm)
            flat /= P
            k = 0
            for x in g:
                x.ravel()[...] = flat[k:k + x.size]
                k += x.size
            opt.step(g)
        else:
            avg.step(g)
    mean = mean_model(model.params, comm)
    spread = float(np.linalg.norm(np.concatenate(
        [(a - m).ravel() for a, m in zip(model.params, mean)])) /
        np.linalg.norm(np.concatenate([m.ravel() for m in mean])))
    spread = comm.allreduce(spread) / P
    share = 1.0
    if avg is not None:
        st = avg.stats()
        share = comm.allreduce((st["rs_delivered_share"] +
                                st["ag_delivered_share"]) / 2) / P
        avg.close()
    return losses, spread, share


def evaluate(params, X, y, comm):
    """The benchmark's loss: the training loss, on the whole training set,
    of the average of the ranks' models (not a rank's own model on its own
    shard).  Collective."""
    return MLP.loss(mean_model(params, comm), X, y)


def mean_model(params, comm):
    """The average of the ranks' models (reliable mpi4py, outside the
    emulated network: a measurement, not part of training)."""
    out = []
    for a in params:
        m = np.empty_like(a)
        comm.Allreduce(a, m)
        out.append(m / comm.size)
    return out
