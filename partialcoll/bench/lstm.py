"""Inherent load imbalance: an LSTM classifier over variable-length sequences
(the eager-SGD paper's video case, section 6.3, in miniature).

The paper trains an LSTM on UCF101 frame features: 29 to 1776 frames per
video, median 167, a long tail.  Here the sequences are generated: lengths
are log-normal with that median and range (times ``--length-scale``), and
each frame is a noisy glimpse of one of two prototypes, one in each half
of the sequence, their order telling the class (plus a slow drift), so longer sequences cost more to process
and the imbalance comes from the work itself, not from sleeps: each rank's
step takes as long as its batch's sequences.

Compares time-to-accuracy and final test accuracy of synchronous SGD and
eager-SGD (solo, majority) with the same optimizer, steps and data.
Needs PyTorch (``pip install 'partialcoll[torch]'``).
"""
import math
import sys

import numpy as np
from mpi4py import MPI

from ._common import cli, emit, real, whole, writable
from ._train import (add_curves, check_modes, plot_curves, run_mode,
                     summary_rows, time_to)

# UCF101 video lengths in frames (the paper's section 6.3)
UCF_MIN, UCF_MEDIAN, UCF_MAX = 29, 167, 1776


def add_args(p):
    p.add_argument("--classes", type=whole(2), default=10)
    p.add_argument("--features", type=whole(1), default=32,
                   help="features per frame (default 32)")
    p.add_argument("--hidden", type=whole(1), default=64)
    p.add_argument("--batch", type=whole(1), default=128,
                   help="total batch over all ranks (default 128, as the paper)")
    p.add_argument("--train-samples", type=whole(1), default=4096)
    p.add_argument("--test-samples", type=whole(1), default=512)
    p.add_argument("--epochs", type=real(0, True), default=4.0)
    p.add_argument("--length-scale", type=real(0, True), default=0.25,
                   help="multiply UCF101-like lengths (29..1776, median "
                        "167) by this (default 0.25)")
    p.add_argument("--noise", type=real(0), default=3.0,
                   help="per-frame noise (default 3: one frame says little)")
    p.add_argument("--lr", type=real(0, True), default=0.01)
    p.add_argument("--modes", default="sync,solo,majority")
    p.add_argument("--target", type=float, default=None,
                   help="accuracy for time-to-accuracy (default: 0.95 x "
                        "sync's final test accuracy)")
    p.add_argument("--eval-every", type=whole(1), default=8)
    p.add_argument("--seed", type=whole(0), default=0)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable, help="write a PNG of test accuracy vs time")


def lengths(n, scale, rng):
    """Long-tailed (log-normal) lengths with UCF101's median and range."""
    sigma = math.log(UCF_MAX / UCF_MEDIAN) / 2.6      # max ~ 99.5th pct
    raw = np.exp(rng.normal(math.log(UCF_MEDIAN), sigma, n))
    raw = np.clip(raw, UCF_MIN, UCF_MAX)
    return np.maximum(2, np.round(raw * scale)).astype(np.int64)


class SequenceTask:
    metric, better = "test_acc", "higher"

    def __init__(self, args, comm):
        import torch
        torch.set_num_threads(1)
        self.torch, self.args = torch, args
        P, rank = comm.size, comm.rank
        if args.batch % P:
            raise SystemExit(f"--batch {args.batch} is not divisible by "
                             f"{P} ranks")
        self.local = args.batch // P
        g = np.random.default_rng(args.seed)
        # class c shows prototype first[c] in the first half of the
        # sequence and second[c] in the second; classes come in mirrored
        # pairs (a, b) / (b, a), so the order matters, not just the mean
        k = max(2, (args.classes + 1) // 2 + 1)
        self.protos = g.standard_normal((k, args.features)).astype(np.float32)
        pairs = [(a, b) for a in range(k) for b in range(a + 1, k)]
        pairs = [p for ab in pairs for p in (ab, ab[::-1])]
        self.first = np.array([p[0] for p in pairs[:args.classes]])
        self.second = np.array([p[1] for p in pairs[:args.classes]])
        self.train_len = lengths(args.train_samples, args.length_scale, g)
        self.test_len = lengths(args.test_samples, args.length_scale, g)
        self.train_y = g.integers(0, args.classes, args.train_samples)
        self.test_y = g.integers(0, args.classes, args.test_samples)
        # each rank walks its own random order of the training set
        self.order = np.random.default_rng([args.seed, 1, rank]).permutation(
            args.train_samples)
        self.rank = rank
        if rank == 0:
            self.test = [self._seq(i, True) for i in range(args.test_samples)]

    def _seq(self, i, test):
        """Sequence i: frames = its class's prototype of that half + a slow
        drift + noise (deterministic in the seed and i)."""
        a = self.args
        n = (self.test_len if test else self.train_len)[i]
        y = (self.test_y if test else self.train_y)[i]
        rng = np.random.default_rng([a.seed, 2 + test, i])
        drift = np.cumsum(rng.standard_normal((n, a.features)), 0) * 0.1
        half = np.arange(n)[:, None] < n // 2
        proto = np.where(half, self.protos[self.first[y]],
                         self.protos[self.second[y]])
        x = proto + drift + a.noise * rng.standard_normal((n, a.features))
        return x.astype(np.float32), int(y)

    def _batch_tensors(self, seqs):
        torch = self.torch
        xs = [torch.from_numpy(x) for x, _ in seqs]
        lens = torch.tensor([len(x) for x in xs])
        padded = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            padded, lens, batch_first=True, enforce_sorted=False)
        return packed, torch.tensor([y for _, y in seqs])

    def _forward(self, model, packed):
        lstm, head = model
        _, (h, _) = lstm(packed)
        return head(h[-1])

    # -- the task interface ---------------------------------------------------
    def reset(self):
        torch, a = self.torch, self.args
        torch.manual_seed(a.seed)             # same start on every rank
        self.model = torch.nn.ModuleList([
            torch.nn.LSTM(a.features, a.hidden, batch_first=True),
            torch.nn.Linear(a.hidden, a.classes)])
        self.pos = 0

    def optimizer(self, mode, comm):
        import partialcoll.torch as pct
        return pct.EagerOptimizer(
            self.torch.optim.Adam(self.model.parameters(), lr=self.args.lr),
            self.model.named_parameters(), mode=mode, comm=comm)

    def step(self, opt, s):
        n = len(self.order)
        idx = [self.order[(self.pos + j) % n] for j in range(self.local)]
        self.pos += self.local
        packed, y = self._batch_tensors([self._seq(i, False) for i in idx])
        opt.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(
            self._forward(self.model, packed), y)
        loss.backward()
        opt.step()
        return opt.last_step

    def snapshot(self):
        return {k: v.detach().clone() for k, v in
                self.model.state_dict().items()}

    def evaluate(self, snap):
        torch = self.torch
        a = self.args
        model = torch.nn.ModuleList([
            torch.nn.LSTM(a.features, a.hidden, batch_first=True),
            torch.nn.Linear(a.hidden, a.classes)])
        model.load_state_dict(snap)
        correct, loss = 0, 0.0
        with torch.no_grad():
            for lo in range(0, len(self.test), 128):
                packed, y = self._batch_tensors(self.test[lo:lo + 128])
                out = self._forward(model, packed)
                loss += float(torch.nn.functional.cross_entropy(
                    out, y, reduction="sum"))
                correct += int((out.argmax(1) == y).sum())
        n = len(self.test)
        return {"test_acc": correct / n, "test_loss": loss / n}


def run(args, comm=MPI.COMM_WORLD):
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("the lstm benchmark needs PyTorch: pip install "
                         "'partialcoll[torch]'")
    modes = check_modes(args.modes, comm.size)
    task = SequenceTask(args, comm)
    steps = max(1, int(args.epochs * args.train_samples / args.batch))
    if comm.rank == 0:
        L = task.train_len
        print(f"# sequence lengths: min {L.min()}, median {int(np.median(L))},"
              f" max {L.max()} (UCF101 x {args.length_scale:g}); {steps} "
              f"steps", flush=True)
    results = []
    for mode in modes:
        r = run_mode(task, mode, steps, lambda s: 0.0, args.eval_every,
                     comm, str(mode))
        results.append(r)
        if comm.rank == 0:
            print(f"  {r['mode']:>8}: {r['steps_per_s']:.2f} steps/s, test "
                  f"accuracy {r['final']['test_acc']:.3f}", flush=True)
    base = next((r for r in results if r["mode"] == "sync"), None)
    target = args.target
    if target is None:
        target = 0.95 * base["final"]["test_acc"] if base else float("nan")
    rows = summary_rows(results, "test_acc", "higher", {"ranks": comm.size})
    tt_base = time_to(base["curve"], "test_acc", target, "higher") if base \
        else float("nan")
    for row, r in zip(rows, results):
        tt = time_to(r["curve"], "test_acc", target, "higher")
        row["target_acc"] = target
        row["time_to_target_s"] = tt
        # NaN when either never reached the target or reached it at once
        row["tta_speedup"] = tt_base / tt if tt > 0 and tt_base > 0 \
            else float("nan")
        row["test_loss"] = r["final"]["test_loss"]
    emit(rows, ["mode", "steps", "time_s", "steps_per_s", "speedup",
                "test_acc", "test_loss", "time_to_target_s", "tta_speedup",
                "nap", "included", "slowest", "late"], args,
         f"LSTM on long-tailed sequences: {comm.size} ranks, total batch "
         f"{args.batch}, {steps} steps", comm,
         legend={"speedup": "sync's time / this time",
                 "time_to_target_s": f"time to test accuracy {target:.3f}",
                 "tta_speedup": "sync's time to it / this time"})
    if args.json and comm.rank == 0:
        add_curves(args.json, [{"mode": r["mode"], "curve": r["curve"]}
                               for r in results])
    if args.plot and comm.rank == 0:
        plot_curves({"test accuracy": results}, "test_acc", args.plot,
                    f"LSTM, long-tailed sequence lengths, {comm.size} ranks",
                    ylabel="test accuracy")
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "lstm", argv)
