"""Does staleness slow the MLfabric benchmark's model?  (issue 14; no MPI)

``python bench/mlfabric_staleness.py [--lrs 5,40,320] [--delays 0,4,8,16]
[--gradients 2100] [--l2 0] [--features 1024] [--classes 128]
[--model softmax|mlp] [--hidden 128] [--momentum 0.5]
[--momentum-at worker|server]``

The benchmark's model (:class:`partialcoll.mlfabric.SoftmaxRegression`,
1024 x 128 float64: 1 MiB updates) trained in one process, with SGD and
momentum 0.5 as the benchmark applies them (a momentum history per
worker, :class:`partialcoll.mlfabric.SGD`):

  sync      each step the mean of 7 workers' gradients at lr x 7 (the
            benchmark's ``--sync-lr scaled``; ring and tree)
  delay d   one gradient per step at lr, computed from the model as it
            was k steps before, k drawn uniformly from 0..2d (mean d: an
            asynchronous parameter server whose updates arrive d versions
            late on average)

Prints the loss (the model's ``loss``, as the benchmark evaluates it)
after every ``--gradients`` / 6 gradients, so every row has used as many
gradients.  If delay does not raise the loss at a learning rate, an
asynchronous scheme loses nothing by staleness there, and a delay bound
(MLfabric's tau_max) can only cost the updates it drops.  ``--l2`` adds
(l2 / 2) |w|^2 to the loss (the regulariser of the paper's Eq. 1).
``--model mlp``: :class:`partialcoll.mlfabric.TanhMLP`, the same data
through one tanh hidden layer of ``--hidden`` units (1.1 MiB at the
defaults), a non-convex model for comparison.  ``--momentum-at server``: the
paper's Eq. 2 instead, w <- w + u + gamma (w - w_prev) at the server, the
workers sending plain gradients (one step per update, or per synchronous
mean).
"""
import argparse

import numpy as np

from partialcoll.mlfabric import SGD, SoftmaxRegression, TanhMLP


def train(model, lr, delay, gradients, l2=0.0, momentum=0.5, workers=7,
          seed=5, at="worker"):
    """Losses at six evenly spaced gradient counts (delay None: sync).

    Momentum as the benchmark keeps it (:class:`partialcoll.mlfabric.SGD`):
    a history per worker, which sends it; the parameter server applies
    each at lr, ring and tree the mean of ``workers`` at lr x workers.
    ``at="server"``: Eq. 2's momentum at the server instead."""
    opt = SGD(lr * workers if delay is None else lr,
              momentum if at == "worker" else 0.0)
    w = model.params.copy()
    w_prev = w.copy()

    def step_server(total, scale=1.0):
        nonlocal w, w_prev
        if at == "server":
            moved = w - w_prev
            w_prev = w.copy()
            opt.apply(w, total, scale)
            w += momentum * moved
        else:
            opt.apply(w, total, scale)
    hist = [opt.history(w.size) for _ in range(workers)]
    models, rng = [w.copy()], np.random.default_rng(seed)
    every, used, step, losses = gradients // 6, 0, 0, []
    while used < gradients:
        if delay is None:
            total = sum(opt.update(hist[j], model.gradient(w, j, step) +
                                   l2 * w) for j in range(workers))
            step_server(total, 1.0 / workers)
            used += workers
        else:
            j = step % workers
            old = models[max(0, len(models) - 1 - int(
                rng.integers(0, 2 * delay + 1)))]
            step_server(opt.update(hist[j], model.gradient(old, j, step) +
                                   l2 * old))
            models = (models + [w.copy()])[-(2 * delay + 2):]
            used += 1
        step += 1
        if used // every > len(losses):
            losses.append(model.loss(w) + 0.5 * l2 * float(w @ w))
    return losses[:6]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lrs", default="5,40,320")
    p.add_argument("--delays", default="0,4,8,16")
    p.add_argument("--gradients", type=int, default=2100)
    p.add_argument("--l2", type=float, default=0.0)
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--classes", type=int, default=128)
    p.add_argument("--model", choices=("softmax", "mlp"), default="softmax")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--momentum-at", choices=("worker", "server"),
                   default="worker")
    args = p.parse_args()
    model = SoftmaxRegression(args.features, args.classes, seed=args.seed) \
        if args.model == "softmax" else \
        TanhMLP(args.features, args.classes, args.hidden, seed=args.seed)
    print(f"loss after each {args.gradients // 6} gradients "
          f"(start {model.loss(model.params):.3f})")
    for lr in [float(v) for v in args.lrs.split(",")]:
        for d in [None] + [int(v) for v in args.delays.split(",")]:
            got = train(model, lr, d, args.gradients, args.l2,
                        args.momentum, at=args.momentum_at)
            name = "sync" if d is None else f"delay {d}"
            print(f"lr {lr:<7g} {name:<9} " +
                  " ".join(f"{x:9.4g}" for x in got), flush=True)


if __name__ == "__main__":
    main()
