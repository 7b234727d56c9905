"""MLfabric's replication against checkpointing (the paper's section 7.3
and Figure 9), on the emulated network, under mpiexec (about 8 ranks):
rank 0 is the parameter server, the last rank the replica (when there is
one), the others workers; momentum 0.9 at the server (the paper's Eq. 2).

Every configuration trains for ``--duration`` seconds on the same traces:

* ``none``: no fault tolerance (the baseline);
* ``replica D`` for each D in ``--div-max``: a replica, the divergence
  bound Div_max = D (``inf``: the replica follows as its links allow);
* ``checkpoint K`` for each K in ``--checkpoint-every``: no replica; the
  server saves its model and history to a file every K updates, in its
  loop, as an MPI job's rank 0 does.

Reported per configuration: updates applied and their rate, the
overhead against ``none`` (1 - rate / the baseline's rate), the final
loss; for a replica the bytes sent to it, the bytes that sending every
update on its own would take, their ratio (the paper's Figure 9:
"reduction in data sent to replica"), how far the replica lagged (the
largest and mean lead in updates at the server's commits, as the replica
had reported them), how long the server held commits for the bound, and
with ``--measure-divergence`` the largest ||w_server - w_replica|| during
the run (a model copy per commit: small models only); for a checkpoint
the count and seconds spent writing.  The rows in updates tell the two
apart at equal exposure: a replica that lags by L updates loses about L
on a server failure, a checkpoint every K about K / 2 on average.
"""
import math
import os
import sys
import tempfile

from mpi4py import MPI

import partialcoll as pc
from ..mlfabric import SGD, train
from ._common import (auto_or_count, cli, emit, limit_blas, listed, real,
                      save_plot, whole, writable)
from .mlfabric import (NETWORKS, STRAGGLERS, make_model, network_config,
                       update_bytes)


def add_args(p):
    p.add_argument("--duration", type=real(0, True), default=20.0,
                   help="seconds of training per configuration")
    p.add_argument("--div-max", type=listed(real(0, True, infinite=True)),
                   default="2,5,10,20,50,inf",
                   help="Div_max values for the replica (a norm of the "
                   "model's difference; 'inf': no bound)")
    p.add_argument("--checkpoint-every", type=listed(whole(1), empty=True),
                   default="1,10,100",
                   help="checkpoint periods, in updates applied ('': none)")
    p.add_argument("--replica-in-rate", type=real(0, True), default=None,
                   help="bytes/s of the replica's incoming NIC, fixed "
                   "(default: it follows the trace as the workers' do); "
                   "a slow one starves the replica")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where the server writes its checkpoint (default: "
                   "a temporary directory, removed after the run)")
    p.add_argument("--stragglers", choices=sorted(STRAGGLERS), default="C1")
    p.add_argument("--network", choices=sorted(NETWORKS), default="N1")
    p.add_argument("--seed", type=whole(0), default=0)
    p.add_argument("--model", choices=("softmax", "mlp"), default="mlp")
    p.add_argument("--hidden", type=whole(1), default=128)
    p.add_argument("--features", type=whole(1), default=1024)
    p.add_argument("--classes", type=whole(1), default=128)
    p.add_argument("--base-rate", type=real(0, True), default=10e6,
                   help="bytes/s; NICs run at 1..10x this")
    p.add_argument("--every", type=real(0, True), default=2.0,
                   help="seconds between rate redraws")
    p.add_argument("--server-nic", choices=("varied", "fixed"),
                   default="fixed")
    p.add_argument("--compute", type=real(0), default=0.1)
    p.add_argument("--interval", type=real(0, True), default=0.1)
    p.add_argument("--lag", type=real(0), default=0.2)
    p.add_argument("--aggregators", type=whole(0), default=2)
    p.add_argument("--replica-aggregators", type=whole(0), default=2)
    p.add_argument("--lr", type=real(0, True), default=0.5)
    p.add_argument("--momentum", type=real(0), default=0.9)
    p.add_argument("--tau-max", type=whole(1), default=None,
                   help="the delay bound (default 2N, N workers)")
    p.add_argument("--measure-divergence", action="store_true",
                   help="keep a model copy per commit to measure the "
                   "largest divergence (small models only)")
    p.add_argument("--blas-threads", type=auto_or_count, default="auto",
                   help="BLAS threads per rank ('auto': the host's cores "
                   "shared among its ranks; 0: NumPy's own)")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)
    p.add_argument("--plot", type=writable,
                   help="PNG: data to the replica and throughput against "
                   "Div_max, beside the checkpoints")


def configurations(args):
    """[(label, settings)] in the order run."""
    out = [("none", {})]
    out += [(f"replica {d:g}", {"div_max": d})
            for d in (float(x) for x in args.div_max.split(","))]
    out += [(f"checkpoint {k}", {"checkpoint_every": k})
            for k in (int(x) for x in args.checkpoint_every.split(",")
                      if x.strip())]
    return out


def run(args, comm=MPI.COMM_WORLD):
    if comm.size < 4:
        raise SystemExit("mlfabric-replica: run under mpiexec with >= 4 "
                         "ranks (a server, two workers and a replica)")
    args.tau_max = args.tau_max or 2 * (comm.size - 2)
    folder = args.checkpoint_dir
    own = None
    if comm.rank == 0 and folder is None:
        own = tempfile.TemporaryDirectory(prefix="partialcoll-ckpt-")
        folder = own.name
    folder = comm.bcast(folder, root=0)
    rows = []
    try:
        with limit_blas(args.blas_threads, comm):
            for label, settings in configurations(args):
                rows.append(_one(args, label, settings, folder, comm))
    finally:
        if own is not None:
            own.cleanup()
    base = rows[0]["updates_per_s"]
    for r in rows:
        r["overhead_pct"] = round(100 * (1 - r["updates_per_s"] / base), 1) \
            if base else math.nan
    size = update_bytes(args)
    emit(rows, list(rows[0]), args,
         f"MLfabric replication against checkpointing: P = {comm.size}, "
         f"{args.model}, {size} B updates ({2 * size} B messages with "
         f"server momentum)", comm,
         legend=[f"{args.stragglers}-{args.network}, base rate "
                 f"{args.base_rate:g} B/s, server NICs {args.server_nic}; "
                 f"momentum {args.momentum} at the server, lr {args.lr}, "
                 f"tau_max {args.tau_max}; {args.duration} s each"
                 + ("" if args.replica_in_rate is None else
                    f"; the replica's incoming NIC at "
                    f"{args.replica_in_rate:g} B/s"),
                 "reduction: bytes every update sent on its own would take "
                 "/ bytes sent to the replica (the paper's Figure 9)",
                 "lead: updates the server had applied and the replica "
                 "not, at the server's commits",
                 "over: commits applied over Div_max because they alone "
                 "move the model further (the replica had everything "
                 "before them)"])
    if args.plot and comm.rank == 0:
        _plot(rows, args.plot)
    return rows


def _one(args, label, settings, folder, comm):
    model = make_model(args, args.seed)
    replica = "div_max" in settings
    kw = dict(mode="mlfabric", tau_max=args.tau_max,
              aggregators=args.aggregators, batch_interval=args.interval,
              monitor_lag=args.lag, initial_rate=args.base_rate * 5,
              compute_time=args.compute,
              stragglers=STRAGGLERS[args.stragglers],
              duration=args.duration, seed=args.seed)
    if replica:
        kw.update(replica=True, replica_aggregators=args.replica_aggregators,
                  div_max=settings["div_max"],
                  record_models=args.measure_divergence)
    if "checkpoint_every" in settings:
        kw.update(checkpoint_every=settings["checkpoint_every"],
                  checkpoint_path=os.path.join(folder, "server.npy"))
    # without a replica the last rank sits out, so that every
    # configuration has the same workers
    last = comm.rank == comm.size - 1
    sub = comm if replica else comm.Split(MPI.UNDEFINED if last else 0)
    net = network_config(args, args.network, args.seed)
    if args.replica_in_rate is not None:
        replica_rank = comm.size - 1
        net.setdefault("rank", {})[str(replica_rank)] = {
            "in_rate": args.replica_in_rate}
        for trace in net.get("trace", []):
            if trace["ranks"] == "all":
                trace["ranks"] = list(range(replica_rank))
            else:
                trace["ranks"] = [r for r in trace["ranks"]
                                  if r != replica_rank]
    pc.network.enable(net)
    try:
        res = None
        if sub != MPI.COMM_NULL:
            res = train(model, SGD(args.lr, args.momentum, at="server"), sub,
                        **kw)
    finally:
        pc.network.disable()
        if sub not in (comm, MPI.COMM_NULL):
            sub.Free()
    res = comm.bcast(res, root=0)
    applied = res.updates["applied"]
    row = {"config": label, "updates": applied,
           "updates_per_s": round(applied / args.duration, 2),
           "overhead_pct": math.nan,
           "final_loss": round(res.losses[-1][2], 4),
           "dropped": res.updates["dropped"]}
    rep = res.replica or {}
    if replica:
        r = comm.size - 1
        sent = sum(v for (_, dst), v in res.bytes.items() if dst == r)
        alone = rep["applied"] * 2 * update_bytes(args)
        row.update(replica_MB=round(sent / 1e6, 1),
                   alone_MB=round(alone / 1e6, 1),
                   reduction=round(alone / sent, 2) if sent else math.nan,
                   lead_max=rep["lead_max"],
                   lead_mean=round(rep["lead_mean"], 1),
                   held=rep["held"], held_s=round(rep["held_s"], 2),
                   over=rep["unmeetable"],
                   delayed=rep["delayed"],
                   max_div=round(rep["max_divergence"], 3)
                   if rep.get("max_divergence") is not None else math.nan)
    else:
        row.update(replica_MB=math.nan, alone_MB=math.nan,
                   reduction=math.nan, lead_max=math.nan,
                   lead_mean=math.nan, held=math.nan, held_s=math.nan,
                   over=math.nan,
                   delayed=math.nan, max_div=math.nan)
    ck = res.checkpoints
    row.update(checkpoints=ck["count"],
               checkpoint_s=round(ck["seconds"], 2))
    if comm.rank == 0:
        print(f"[mlfabric-replica] {label}: {applied} updates, loss "
              f"{row['final_loss']}", file=sys.stderr, flush=True)
    comm.Barrier()
    return row


def _plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    reps = [r for r in rows if r["config"].startswith("replica")]
    cks = [r for r in rows if r["config"].startswith("checkpoint")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.5))
    xs = [r["config"].split()[1] for r in reps]
    a.plot(xs, [r["reduction"] for r in reps], "o-")
    a.set_xlabel("Div_max")
    a.set_ylabel("reduction in data sent to the replica")
    b.plot([r["lead_mean"] for r in reps],
           [r["overhead_pct"] for r in reps], "o-", label="replica")
    b.plot([int(r["config"].split()[1]) / 2 for r in cks],
           [r["overhead_pct"] for r in cks], "s--", label="checkpoint")
    b.set_xscale("symlog")
    b.set_xlabel("updates a server failure loses\n(replica: mean lead; "
                 "checkpoint every K: K / 2)")
    b.set_ylabel("throughput overhead (%)")
    b.legend()
    save_plot(fig, path)


def main(argv=None):
    return cli(sys.modules[__name__], "mlfabric-replica", argv)
