"""The eager-SGD paper's hyperplane regression (its Figure 10).

A one-layer model learns an 8192-dimensional hyperplane y = a.x + b + noise
(a, x standard normal, noise N(0, sigma^2), so the best possible MSE is
sigma^2).  The total batch (2048) is split across the ranks; at every step
one randomly chosen rank sleeps the injected delay (the same draw for every
mode).  For each delay, synchronous SGD (MPI_Allreduce of the gradients
every step) and eager-SGD in each mode train the same number of steps from
the same start; the table gives throughput, speed-up over sync and the
final validation MSE (after the closing flush) against sync's.

``--framework numpy`` (default) uses partialcoll.eager's NumPy optimizer;
``--framework torch`` a ``torch.nn.Linear`` with partialcoll.torch.
"""
import sys

import numpy as np
from mpi4py import MPI

from ._common import cli, emit, listed, real, whole, writable
from ._train import (add_curves, check_modes, one_random_rank, plot_curves,
                     run_mode, summary_rows)


def add_args(p):
    p.add_argument("--dim", type=whole(1), default=8192)
    p.add_argument("--batch", type=whole(1), default=2048,
                   help="total batch over all ranks (default 2048)")
    p.add_argument("--train-samples", type=whole(1), default=32768,
                   help="training set size (default 32768: 16 steps/epoch)")
    p.add_argument("--val-samples", type=whole(1), default=2048)
    p.add_argument("--steps", type=whole(1), default=96)
    p.add_argument("--lr", type=real(0, True), default=0.1)
    p.add_argument("--noise", type=real(0), default=2.0,
                   help="label noise sigma (best MSE = sigma^2; default 2)")
    p.add_argument("--delays", type=listed(real(0)), default="200,300,400",
                   help="injected delays in ms, comma-separated")
    p.add_argument("--modes", default="sync,solo,majority",
                   help="sync, solo, majority or an integer quorum")
    p.add_argument("--framework", choices=["numpy", "torch"], default="numpy")
    p.add_argument("--eval-every", type=whole(1), default=4)
    p.add_argument("--seed", type=whole(0), default=0)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="write a PNG of validation MSE vs time")


class Hyperplane:
    """Data and model; each rank holds its shard of the training set."""

    metric, better = "val_mse", "lower"

    def __init__(self, args, comm):
        P, rank = comm.size, comm.rank
        if args.batch % P:
            raise SystemExit(f"--batch {args.batch} is not divisible by "
                             f"{P} ranks")
        self.local = args.batch // P
        self.d, self.lr, self.framework = args.dim, args.lr, args.framework
        truth = np.random.default_rng(args.seed)
        self.a = truth.standard_normal(self.d).astype(np.float32)
        self.b = np.float32(1.0)
        shard = max(self.local, args.train_samples // P)
        self.X, self.y = self._data(shard, args.noise,
                                    np.random.default_rng([args.seed, 1, rank]))
        if rank == 0:
            self.Xv, self.yv = self._data(args.val_samples, args.noise,
                                          np.random.default_rng([args.seed, 2]))

    def _data(self, n, noise, rng):
        X = rng.standard_normal((n, self.d), dtype=np.float32)
        y = X @ self.a + self.b + noise * rng.standard_normal(n, dtype=np.float32)
        return X, y

    def _batch(self, s):
        n = self.X.shape[0]
        lo = (s * self.local) % n
        idx = np.arange(lo, lo + self.local) % n
        return self.X[idx], self.y[idx]

    # -- the task interface ---------------------------------------------------
    def reset(self):
        self.w = np.zeros(self.d, np.float32)
        self.w0 = np.zeros(1, np.float32)
        if self.framework == "torch":
            import torch
            self.model = torch.nn.Linear(self.d, 1)
            with torch.no_grad():
                self.model.weight.zero_()
                self.model.bias.zero_()

    def optimizer(self, mode, comm):
        if self.framework == "torch":
            import torch
            import partialcoll.torch as pct
            return pct.EagerOptimizer(
                torch.optim.SGD(self.model.parameters(), lr=self.lr),
                self.model.named_parameters(), mode=mode, comm=comm)
        from partialcoll.eager import SGD, EagerOptimizer
        return EagerOptimizer(SGD([self.w, self.w0], lr=self.lr), mode=mode,
                              comm=comm)

    def step(self, opt, s):
        X, y = self._batch(s)
        if self.framework == "torch":
            import torch
            Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
            opt.zero_grad()
            out = self.model(Xt).squeeze(1)
            torch.nn.functional.mse_loss(out, yt).backward()
            opt.step()
            return opt.last_step
        r = X @ self.w + self.w0[0] - y              # mse = mean(r^2)
        gw = (2.0 / len(y)) * (X.T @ r)
        gb = np.array([2.0 * r.mean()], np.float32)
        return opt.step([gw, gb])

    def snapshot(self):
        if self.framework == "torch":
            return (self.model.weight.detach().numpy().reshape(-1).copy(),
                    float(self.model.bias.detach()[0]))
        return self.w.copy(), float(self.w0[0])

    def evaluate(self, snap):
        w, b = snap
        r = self.Xv @ w + b - self.yv
        return {"val_mse": float(np.mean(r.astype(np.float64) ** 2))}


def run(args, comm=MPI.COMM_WORLD):
    modes = check_modes(args.modes, comm.size)
    delays = [float(x) for x in args.delays.split(",") if x.strip()]
    task = Hyperplane(args, comm)
    all_rows, groups = [], {}
    for delay in delays:
        results = []
        for mode in modes:
            results.append(run_mode(
                task, mode, args.steps,
                one_random_rank(delay / 1000.0, args.seed + 17, comm),
                args.eval_every, comm, f"{delay:g} ms {mode}"))
        rows = summary_rows(results, "val_mse", "lower",
                            {"ranks": comm.size, "delay_ms": delay})
        all_rows += rows
        groups[f"{delay:g} ms injected delay"] = results
        if comm.rank == 0:
            for r in rows:
                print(f"  delay {delay:g} ms  {r['mode']:>8}: "
                      f"{r['steps_per_s']:.2f} steps/s, speedup "
                      f"{r['speedup']:.2f}, val MSE {r['val_mse']:.3f}",
                      flush=True)
    emit(all_rows, ["delay_ms", "mode", "steps", "time_s", "steps_per_s",
                    "speedup", "val_mse", "val_mse_vs_sync", "nap",
                    "included", "slowest", "late"], args,
         f"hyperplane regression: {comm.size} ranks, dim {args.dim}, total "
         f"batch {args.batch}, {args.steps} steps, lr {args.lr}", comm,
         legend=["one random rank is delayed each step",
                 "speedup: sync's time / this time",
                 f"val_mse: validation MSE (the best possible is "
                 f"{args.noise ** 2:g}); nap: ranks fresh per round"])
    if args.json and comm.rank == 0:
        add_curves(args.json, {k: [{"mode": r["mode"], "curve": r["curve"]}
                                   for r in v] for k, v in groups.items()})
    if args.plot and comm.rank == 0:
        plot_curves(groups, "val_mse", args.plot,
                    f"hyperplane regression, {comm.size} ranks", log=True,
                    ylabel="validation MSE (log)")
    return all_rows


def main(argv=None):
    return cli(sys.modules[__name__], "hyperplane", argv)
