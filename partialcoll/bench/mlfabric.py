"""MLfabric's comparison (the paper's Table 2 shape) on the emulated
network, under mpiexec (about 8 ranks): rank 0 is the parameter server,
the others workers; the synchronous baselines run over the same workers.

For every straggler configuration (C1 = 10 % of steps 2x slower, C2 = 10 %
4x, C3 = 4 % 2x), link distribution (every NIC's rate redrawn every
``--every`` seconds from {1, 2.5, 3.3, 5, 10} x ``--base-rate`` with
N1 = (0, 0, 0, .1, .9), N2 = (0, .1, .1, .1, .7), N3 = (.5, 0, 0, 0, .5);
``--server-nic fixed`` keeps the server's NICs at 10 x the base rate)
and seed, with the same network seed (the same traces) and straggler seed
for every scheme: MLfabric with tau_max = N and 2N (N workers), plain
asynchronous PS, ring allreduce, binary-tree allreduce and MLfabric-S
(and, named in ``--schemes``, ``mlfabric-ar``: MLfabric's allreduce),
each for ``--duration`` seconds of training on softmax regression
(``--features`` x ``--classes`` float64 parameters: the update size), or
with ``--model mlp`` on the same data through a tanh hidden layer of
``--hidden`` units (:class:`~partialcoll.mlfabric.TanhMLP`, whose training
is slowed by stale updates at a high learning rate; softmax regression's
is not).
The parameter server applies every update at ``--lr``; the synchronous
schemes average N updates and by default use lr x N (``--sync-lr``), so
every scheme moves the model as far per update.

Reported per scheme: time to the target loss (``--target-loss``, or by
default the highest of the configuration's schemes' lowest losses, so
every scheme reaches it; with ``--common-target``, the highest over every
configuration of the seed, one target for all of them as the paper's
Table 2 measures all nine settings to one accuracy) and its speed-up
over ring allreduce, updates applied by then,
the final loss, drops, the largest delay, the scheduler's CPU time per
batch, for the synchronous schemes the communication time per
iteration, and for the parameter-server schemes the MB/s leaving the
server (its model copies) and the copies relays forwarded
(``--distributors``, section 10.3).  ``--plot F.png``: loss against
time per scheme, one panel per configuration; ``--curves F.json``: the
same curves as numbers.  ``--quick``: a CI-size
run (a small model, one configuration, 2 s per scheme).
"""
import json
import math
import sys

from mpi4py import MPI

import partialcoll as pc
from ..mlfabric import (SGD, SoftmaxRegression, TanhMLP, train,
                        train_allreduce)
from ..mlfabric.runtime.config import DISTRIBUTIONS
from ._common import (
    auto_or_count, cli, emit, limit_blas, listed, one_of, real,
    save_plot, whole, writable)

FACTORS = [1, 2.5, 3.3, 5, 10]
NETWORKS = {"N1": [0, 0, 0, 0.1, 0.9], "N2": [0, 0.1, 0.1, 0.1, 0.7],
            "N3": [0.5, 0, 0, 0, 0.5]}
STRAGGLERS = {"C1": (0.10, 2.0), "C2": (0.10, 4.0), "C3": (0.04, 2.0)}
SCHEMES = ("mlfabric-N", "mlfabric-2N", "async", "ring", "tree",
           "mlfabric-s")
#: schemes run only when named in --schemes: MLfabric's allreduce
#: (section 6; train_allreduce(algorithm="mlfabric"))
OPTIONAL = ("mlfabric-ar",)
QUICK = dict(features=32, classes=16, base_rate=0.5e6, duration=2.0,
             compute=0.04, interval=0.05, every=0.5, stragglers="C2",
             networks="N2", lag=0.1)


def add_args(p):
    p.add_argument("--quick", action="store_true",
                   help="CI size: " + ", ".join(f"{k}={v}" for k, v in
                                                QUICK.items()))
    p.add_argument("--stragglers", type=one_of(STRAGGLERS), default="C1,C2,C3")
    p.add_argument("--networks", type=one_of(NETWORKS), default="N1,N2,N3")
    p.add_argument("--schemes", default=",".join(SCHEMES),
                   help="comma-separated, of " + ", ".join(SCHEMES + OPTIONAL)
                   + " (mlfabric-ar, MLfabric's allreduce, only when named)")
    p.add_argument("--seeds", type=listed(whole(0)), default="0")
    p.add_argument("--duration", type=real(0, True), default=60.0,
                   help="seconds of training per scheme")
    p.add_argument("--model", choices=("softmax", "mlp"), default="softmax",
                   help="softmax regression (default) or a tanh MLP")
    p.add_argument("--hidden", type=whole(1), default=128,
                   help="the MLP's hidden units (128)")
    p.add_argument("--features", type=whole(1), default=1024)
    p.add_argument("--classes", type=whole(1), default=128,
                   help="with 1024 features: 1 MiB updates")
    p.add_argument("--base-rate", type=real(0, True), default=10e6,
                   help="bytes/s; NICs run at 1..10x this")
    p.add_argument("--every", type=real(0, True), default=2.0,
                   help="seconds between rate redraws")
    p.add_argument("--server-nic", choices=("varied", "fixed"),
                   default="varied",
                   help="'varied' (default): the server's NICs follow the "
                   "rate trace as every worker's do; 'fixed': they keep "
                   "the top rate (10 x base), the paper's dedicated "
                   "server machine")
    p.add_argument("--compute", type=real(0), default=0.1,
                   help="seconds of emulated compute per step")
    p.add_argument("--interval", type=real(0, True), default=0.1,
                   help="the scheduler's batch interval")
    p.add_argument("--lag", type=real(0), default=0.2, help="monitor lag")
    p.add_argument("--aggregators", type=whole(0), default=2)
    p.add_argument("--distributors", type=whole(0), default=0,
                   help="relays of the model's distribution tree for the "
                   "MLfabric schemes' pulls (section 10.3; 0: the server "
                   "sends every copy itself, as plain async PS does)")
    p.add_argument("--distribution", choices=DISTRIBUTIONS,
                   default="algorithm3",
                   help="the distribution tree's shape: Algorithm 3's "
                   "(section 10.3), 'one-copy' (the server sends one copy "
                   "per batch, the distributors pass it on) or 'earliest' "
                   "(each copy from the server or a distributor, whichever "
                   "would finish it first)")
    add_optimizer_args(p)
    p.add_argument("--blas-threads", type=auto_or_count, default="auto",
                   help="BLAS threads per rank: 'auto' (default) shares the "
                   "host's cores among its ranks; 0 leaves NumPy's BLAS "
                   "alone (its idle threads spin: with more ranks than "
                   "cores they take most of the CPU)")
    p.add_argument("--target-loss", type=float,
                   help="the loss every scheme's time is measured to "
                   "(default: the highest of the schemes' lowest losses, "
                   "per configuration)")
    p.add_argument("--common-target", action="store_true",
                   help="one default target per seed for all the run's "
                   "configurations (the highest of all their schemes' "
                   "lowest losses), as the paper's Table 2 measures its "
                   "nine settings to one accuracy")
    p.add_argument("--plot", type=writable)
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--curves", type=writable,
                   help="write every scheme's loss curve (seconds, updates "
                   "applied, loss) to this JSON file, to read times to "
                   "other targets after the run")


def add_optimizer_args(p):
    """The step's options: --lr, --momentum, --momentum-at, --sync-lr."""
    p.add_argument("--lr", type=real(0, True), default=5.0)
    p.add_argument("--momentum", type=real(0), default=0.5)
    p.add_argument("--momentum-at", choices=("worker", "server"),
                   default="worker",
                   help="where the parameter-server schemes keep momentum: "
                   "'worker' (default: each worker's history, the model's "
                   "size on the wire) or 'server' (the paper's Eq. 2; "
                   "MLfabric's messages carry two sums, twice the size); "
                   "the synchronous schemes keep it on every worker")
    p.add_argument("--sync-lr", choices=("scaled", "same"), default="scaled",
                   help="the synchronous schemes' learning rate: 'scaled' "
                   "(default) lr x N on their mean of N updates, the same "
                   "step per update as the parameter server, which applies "
                   "every update at lr; 'same': lr on the mean (N times "
                   "smaller steps per update)")


def _quick(args):
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    return args


def network_config(args, name, seed):
    """The emulated network of one configuration.  ``--server-nic
    varied``: every NIC's rate follows the trace.  ``fixed``: the server's
    (rank 0's) NICs keep the top rate, max(FACTORS) x the base rate, and
    only the workers' NICs follow it (the paper's section 7: the server
    sits on "a dedicated machine with 10 Gbps bandwidth", the top of its
    rate set, while background traffic is emulated on the workers'
    hosts)."""
    net = {"seed": 1000 + seed, "default": {
        "out_rate": args.base_rate, "in_rate": args.base_rate,
        "latency": "0.5 ms"},
        "trace": [{"ranks": "all", "nic": "both", "every": args.every,
                   "factors": FACTORS,
                   "probabilities": NETWORKS[name]}]}
    if args.server_nic == "fixed":
        top = max(FACTORS) * args.base_rate
        net["rank"] = {"0": {"out_rate": top, "in_rate": top}}
        workers = list(range(1, MPI.COMM_WORLD.size))
        if workers:
            net["trace"][0]["ranks"] = workers
        else:
            del net["trace"]
    return net


def _one(args, scheme, stragglers, seed, comm):
    """Run one scheme; returns {"losses", "drops", "max_delay", ...};
    the parameter-server schemes' also {"drop_reasons", "notified"}."""
    model = make_model(args, seed)
    sync = scheme in ("ring", "tree", "mlfabric-ar")
    opt = SGD(_lr(args, scheme, comm.size - 1), args.momentum,
              at="worker" if sync else args.momentum_at)
    common = dict(compute_time=args.compute, stragglers=stragglers,
                  duration=args.duration, seed=seed)
    if scheme in ("ring", "tree"):
        out = train_allreduce(model, opt, comm, algorithm=scheme, **common)
        return {"losses": out["losses"], "drops": 0, "max_delay": 0,
                "sched_ms": math.nan, "comm_ms": _ms(out["comm"]),
                "server_out": math.nan, "relayed": math.nan}
    if scheme == "mlfabric-ar":
        out = train_allreduce(model, opt, comm, algorithm="mlfabric",
                              aggregators=args.aggregators,
                              monitor_lag=args.lag,
                              initial_rate=args.base_rate * 5, **common)
        return {"losses": out["losses"], "drops": 0, "max_delay": 0,
                "sched_ms": 1e3 * out["scheduler"]["cpu_mean"],
                "comm_ms": _ms(out["comm"]),
                "server_out": math.nan, "relayed": math.nan}
    N = comm.size - 1
    kw = dict(batch_interval=args.interval, monitor_lag=args.lag,
              aggregators=args.aggregators,
              initial_rate=args.base_rate * 5, **common)
    if scheme.startswith("mlfabric-") and scheme != "mlfabric-s":
        kw["tau_max"] = N if scheme == "mlfabric-N" else 2 * N
        mode = "mlfabric"
    else:
        mode = scheme
    if mode != "async":
        kw["distributors"] = args.distributors
        kw["distribution"] = args.distribution
    res = train(model, opt, comm, mode=mode, **kw)
    return {"losses": res.losses, "drops": res.updates["dropped"],
            "drop_reasons": dict(res.drops),
            "notified": res.updates["notified"],
            "max_delay": res.invariants["max_delay"],
            "sched_ms": 1e3 * res.scheduler["cpu_mean"]
            if res.scheduler["batches"] else math.nan,
            "comm_ms": _ms(res.comm) if mode == "mlfabric-s" else math.nan,
            "invariants": res.invariants,
            "server_out": sum(v for (src, _), v in res.bytes.items()
                              if src == 0) / res.wall / 1e6,
            "relayed": res.pulls["relayed"]}


def make_model(args, seed):
    if args.model == "mlp":
        return TanhMLP(args.features, args.classes, args.hidden, seed=seed)
    return SoftmaxRegression(args.features, args.classes, seed=seed)


def update_bytes(args):
    f, c, h = args.features, args.classes, args.hidden
    return 8 * (f * h + h * c if args.model == "mlp" else f * c)


def _lr(args, scheme, N):
    """The parameter server applies each update at ``lr``; the
    synchronous schemes (ring, tree, MLfabric-S and -AR) apply the mean of
    N, so with ``--sync-lr scaled`` they use lr x N (the linear scaling
    rule): every scheme then moves the model as far per update and differs
    only in staleness, drops and waiting, which is what the comparison is
    about."""
    sync = scheme in ("ring", "tree", "mlfabric-s", "mlfabric-ar")
    return args.lr * N if sync and args.sync_lr == "scaled" else args.lr


def _ms(xs):
    return 1e3 * sum(xs) / len(xs) if xs else math.nan


def straggler_ceiling(workers, rate, slowdown):
    """The speed-up over a synchronous scheme that compute stragglers alone
    allow an asynchronous one, with free communication and as much progress
    per update: each of ``workers`` steps takes 1 (or ``slowdown`` with
    probability ``rate``), so a worker averages 1 + (s - 1) r per step and a
    synchronous iteration, which waits for the slowest, 1 + (s - 1)
    (1 - (1 - r)^N).  7 workers: C1 1.38x, C2 1.97x, C3 1.20x; the paper's
    30: 1.78x, 2.98x, 1.64x (its Table 2 under N1: 1.74, 2.96, 1.90)."""
    if workers < 1 or not 0 <= rate <= 1 or slowdown < 1:
        raise ValueError(f"straggler_ceiling: workers >= 1, 0 <= rate <= 1 "
                         f"and slowdown >= 1, not {workers}, {rate}, "
                         f"{slowdown}")
    extra = slowdown - 1.0
    return (1 + extra * (1 - (1 - rate) ** workers)) / (1 + extra * rate)


def time_to(losses, target):
    """(seconds, updates applied) when the loss curve ``losses`` ([(t,
    applied, loss)]) first reaches ``target`` (nan, nan if never)."""
    for t, applied, loss in losses:
        if loss <= target:
            return t, applied
    return math.nan, math.nan


def run(args, comm=MPI.COMM_WORLD):
    args = _quick(args)
    unknown = set(args.schemes.split(",")) - set(SCHEMES + OPTIONAL)
    if unknown:
        raise SystemExit(f"mlfabric: unknown schemes {sorted(unknown)}; "
                         f"known: {', '.join(SCHEMES + OPTIONAL)}")
    if args.distribution != "algorithm3" and args.distributors < 1:
        raise SystemExit(f"mlfabric: --distribution {args.distribution} "
                         f"needs --distributors >= 1")
    if args.common_target and args.target_loss is not None:
        raise SystemExit("mlfabric: --common-target chooses the target "
                         "itself; give it or --target-loss, not both")
    if comm.size < 3:
        raise SystemExit("mlfabric: run under mpiexec with >= 3 ranks "
                         "(a server and two workers; the paper's: about 8)")
    rows, curves = [], {}
    with limit_blas(args.blas_threads, comm) as cap:
        for cname in args.stragglers.split(","):
            for nname in args.networks.split(","):
                for seed in (int(s) for s in args.seeds.split(",")):
                    curves[(cname, nname, seed)] = _configuration(
                        args, cname, nname, seed, comm)
    goal = targets(curves, args.target_loss, args.common_target)
    for (cname, nname, seed), got in curves.items():
        rows.extend(_rows(cname, nname, seed, got, goal[cname, nname, seed],
                          comm.size - 1))
    server = " (the server's NICs fixed at the top rate)" \
        if args.server_nic == "fixed" else ""
    shape = args.distribution
    emit(rows, list(rows[0]) if rows else [], args,
         f"MLfabric comparison: P = {comm.size} ({comm.size - 1} workers), "
         f"{args.model}, {update_bytes(args)} B updates", comm,
         legend=[f"base rate {args.base_rate:g} B/s redrawn every "
                 f"{args.every} s{server}; compute {args.compute} s; "
                 f"{args.duration} s per scheme",
                 f"lr {args.lr:g} (synchronous schemes: {args.sync_lr}), "
                 f"momentum {args.momentum:g} (parameter server: at the "
                 f"{args.momentum_at}); "
                 f"BLAS threads per rank "
                 f"{cap or 'as the library starts'}",
                 f"{args.aggregators} aggregators, {args.distributors} "
                 f"distributors"
                 f"{'' if shape == 'algorithm3' else f' ({shape})'}",
                 "ceiling: the speed-up over ring that stragglers alone "
                 "allow (straggler_ceiling)"])
    if args.plot and comm.rank == 0:
        _plot(curves, args.plot)
    if args.curves and comm.rank == 0:
        _save_curves(curves, args.curves)
    return rows


def _save_curves(curves, path):
    """{"C2-N1 seed 0": {scheme: [[seconds, applied, loss], ...]}}."""
    out = {f"{c}-{net} seed {seed}": {scheme: [list(p) for p in r["losses"]]
                                     for scheme, r in got.items()}
           for (c, net, seed), got in curves.items()}
    with open(path, "w") as f:
        json.dump(out, f)


def _configuration(args, cname, nname, seed, comm):
    got = {}
    for scheme in args.schemes.split(","):
        pc.network.enable(network_config(args, nname, seed))
        try:
            got[scheme] = _one(args, scheme, STRAGGLERS[cname], seed, comm)
        finally:
            pc.network.disable()
        comm.Barrier()
        if comm.rank == 0:
            r = got[scheme]
            print(f"[{cname}-{nname} seed {seed}] {scheme}: final loss "
                  f"{r['losses'][-1][2]:.4f} after {r['losses'][-1][1]} "
                  f"updates, drops {r['drops']}, max delay "
                  f"{r['max_delay']}", file=sys.stderr, flush=True)
    return got


def targets(curves, fixed=None, common=False):
    """The target loss of every configuration in ``curves`` ({(straggler
    setting, network, seed): {scheme: {"losses": [(seconds, applied, loss),
    ...]}}}): ``fixed`` if given; else the highest of the schemes' lowest
    losses, so that every scheme reaches it, taken over the configuration
    alone or, with ``common``, over every configuration of the same seed."""
    if fixed is not None:
        return {key: fixed for key in curves}
    low = {key: max(min(loss for _, _, loss in r["losses"])
                    for r in got.values())
           for key, got in curves.items()}
    if not common:
        return low
    seed_low = {}
    for (_, _, seed), loss in low.items():
        seed_low[seed] = max(loss, seed_low.get(seed, loss))
    return {key: seed_low[key[2]] for key in curves}


def _rows(cname, nname, seed, got, target, workers):
    base = time_to(got["ring"]["losses"], target)[0] if "ring" in got \
        else math.nan
    rows = []
    ceiling = round(straggler_ceiling(workers, *STRAGGLERS[cname]), 2)
    for scheme, r in got.items():
        t, applied = time_to(r["losses"], target)
        rows.append({"config": f"{cname}-{nname}", "seed": seed,
                     "scheme": scheme, "target": round(target, 4),
                     "time_s": round(t, 2), "speedup": round(base / t, 2)
                     if t and t == t else math.nan,
                     "updates": applied,
                     "final_loss": round(r["losses"][-1][2], 4),
                     "drops": r["drops"], "max_delay": r["max_delay"],
                     "sched_ms": round(r["sched_ms"], 2),
                     "comm_ms": round(r["comm_ms"], 1),
                     "out_MBps": round(r["server_out"], 1),
                     "relayed": r["relayed"], "ceiling": ceiling})
    return rows


def _plot(curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(curves)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, ((c, net, seed), got) in zip(axes[0], curves.items()):
        for scheme, r in got.items():
            ts, ls = zip(*[(t, loss) for t, _, loss in r["losses"]])
            ax.plot(ts, ls, label=scheme)
        ax.set_title(f"{c}-{net} seed {seed}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("loss")
        low = min(loss for r in got.values() for _, _, loss in r["losses"])
        high = max(loss for r in got.values() for _, _, loss in r["losses"])
        if low > 0 and high / low > 100:      # losses over decades: log
            ax.set_yscale("log")
        ax.legend()
    save_plot(fig, path)


def main(argv=None):
    return cli(sys.modules[__name__], "mlfabric", argv)
