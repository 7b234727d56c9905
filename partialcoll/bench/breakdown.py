"""Where the time of one partial round goes, stage by stage.

Balanced ranks (no skew), one small message.  For each of solo, majority
and quorum every call is stamped on the executor's clock
(:func:`partialcoll.now`) as it starts and returns, and the timeline
(:mod:`partialcoll.timeline`) records every op of the round it returned.
Per rank and round, the stages are the times between:

=================  ======================================================
``before``         the call starting and the round's first op on this
                   rank (the caller's Python work: argument checks, the
                   deposit under the data lock, firing the trigger; and
                   the engine picking the fire up)
``activation``     the first activation op done (the trigger fired, or
                   an activation message heard) to the snapshot ready
``snapshot``       the locked copies that take this round's deposits
``exchange``       the allreduce of the data and the bookkeeping
                   (``3 + 2P`` int64; in the same messages up to the
                   recursive-doubling threshold), to the first locked op
                   after it ready
``accounting``     the locked ops that fold the result in and count
                   stragglers, to the round's last op done
``after``          the round's last op to the call returning (the caller
                   learning the round is done, copying the result out,
                   the result object)
=================  ======================================================

A first recorded pass of the first collective is thrown away: the
recording's first growth would about double its stages.  Each stage is
clipped to the call, so a round's stages add up to its call: a round
activated before the call began has a ``before`` of 0 and only the rest
of its activation.  The table gives each stage's mean per
call (means add up, medians need not), then the median call with and
without the timeline.
Also per round: ops, messages sent (activation / exchange), the ops run on
the caller's thread rather than the progress thread, and thread switches
(consecutive op completions on different threads).  MPI_Allreduce and
partialcoll's full allreduce on the same message, timed in the same run,
are the floor (``x_mpi``: the untraced median over MPI_Allreduce's).
Last, the median synchronous round (``flush()``, each after one call),
which training loops run every ``sync_every`` steps and at the end.
"""
import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll import timeline
from partialcoll.core.engine import CONSTANTS

from ._common import (add_iters, add_warmup, emit, float32_bytes, one_of,
                      parse_size, progress, whole, writable)
from .latency import make_partial

KINDS = ("solo", "majority", "quorum")
STAGES = ("before", "activation", "snapshot", "exchange", "accounting",
          "after")


def add_args(p):
    add_iters(p, 200, "timed calls per collective")
    add_warmup(p, 20, "untimed calls first")
    p.add_argument("--size", type=float32_bytes, default="4",
                   help="bytes per call, float32 elements (default 4)")
    p.add_argument("--kinds", type=one_of(KINDS), default=",".join(KINDS),
                   metavar="K,K,...",
                   help=f"partial collectives to break down (default "
                        f"{','.join(KINDS)})")
    p.add_argument("--quorum", type=whole(1), default=None,
                   help="k of the quorum allreduce (default P/2)")
    p.add_argument("--csv", type=writable)
    p.add_argument("--json", type=writable)


def _median_call(call, x, iters):
    """The median of ``iters`` calls, in seconds."""
    lat = []
    for _ in range(iters):
        t0 = pc.now()
        call(x)
        lat.append(pc.now() - t0)
    return float(np.median(lat))


def _floors(x, comm, args):
    """Median call of MPI_Allreduce and of partialcoll's allreduce."""
    y = np.empty_like(x)
    out = {}
    for name, call in (("MPI_Allreduce", lambda v: comm.Allreduce(v, y)),
                       ("allreduce", lambda v: pc.allreduce(v, y,
                                                            comm=comm))):
        for _ in range(args.warmup):
            call(x)
        comm.Barrier()
        out[name] = _median_call(call, x, args.iters)
    return out


def _calls(ar, x, iters, comm, kind):
    """(call start, call end, round returned) of ``iters`` traced calls."""
    rows = []
    for _ in progress(range(iters), comm, kind):
        t0 = pc.now()
        res = ar(x)
        rows.append((t0, pc.now(), res.round))
    return rows


def _by_round(events):
    """This process's op events of the busiest schedule, by round."""
    ops = events[events["op"] >= 0]
    if ops.size == 0:
        return {}
    serials, counts = np.unique(ops["sched"], return_counts=True)
    mine = ops[ops["sched"] == serials[np.argmax(counts)]]
    return {int(r): mine[mine["round"] == r]
            for r in np.unique(mine["round"])}


def _stages(ev, t_call, t_ret):
    """One round's stage times (seconds; each clipped to the call, so
    they add up to it) and counts on this rank.  The schedule is built
    in stage order: the activation's ops, then the snapshot's locked ops,
    the exchange's (unlocked), then the accounting's locked ops."""
    done = ev[ev["ev"] == CONSTANTS["EV_COMPLETE"]]
    done = done[np.argsort(done["t"], kind="stable")]
    ready = ev[ev["ev"] == CONSTANTS["EV_READY"]]
    locked = (done["flags"] & CONSTANTS["F_LOCKED"]) != 0
    if not locked.any():
        return None
    first_locked = int(done["op"][locked].min())
    after = done["op"][~locked & (done["op"] > first_locked)]
    snapshot = locked & (done["op"] < (after.min() if after.size else
                                       np.iinfo(np.int32).max))
    accounting = locked & ~snapshot
    activation = done["op"] < first_locked

    def ready_at(op, fallback):
        t = ready["t"][ready["op"] == op]
        return float(t.min()) if t.size else fallback

    t_start = float(done["t"][activation].min())   # fired, or heard
    t_snap = float(done["t"][snapshot].max())
    ends = [t_start, ready_at(first_locked, t_start), t_snap,
            ready_at(int(done["op"][accounting].min()), t_snap)
            if accounting.any() else t_snap,
            float(done["t"].max()), t_ret]
    out, t = {}, t_call
    for name, end in zip(STAGES, ends):
        end = min(max(end, t), t_ret)
        out[name], t = end - t, end
    sends = done[done["kind"] == CONSTANTS["SEND"]]
    # an activation message is stamped and carries no data (a stamped
    # message with data, at two ranks, is the exchange)
    stamped = ((sends["flags"] & CONSTANTS["F_STAMPED"]) != 0) & \
        (sends["bytes"] == CONSTANTS["STAMP_HEADER"])
    caller = (done["flags"] & CONSTANTS["TL_CALLER"]) != 0
    out.update(total=t_ret - t_call, ops=float(done.size),
               act_msgs=float(stamped.sum()),
               x_msgs=float((~stamped).sum()),
               on_caller=float(caller.sum()),
               switches=float(np.count_nonzero(np.diff(caller))))
    return out


def _breakdown(kind, x, comm, args, k):
    """Per-stage means over this rank's rounds, the median traced call and
    the untraced one."""
    ar = make_partial(kind, x, comm, k)
    for _ in range(args.warmup):
        ar(x)
    untraced = []
    ar.flush()
    comm.Barrier()
    untraced.append(_median_call(ar, x, args.iters // 2))
    ar.flush()
    timeline.clear()
    timeline.enable()
    # every rank records before any calls: a round a faster rank starts
    # would otherwise run here, its first ops unrecorded
    comm.Barrier()
    try:
        calls = _calls(ar, x, args.iters, comm, kind)
    finally:
        timeline.disable()
    ar.flush()
    comm.Barrier()
    untraced.append(_median_call(ar, x, args.iters - args.iters // 2))
    ar.flush()
    flush = _median_flush(ar, x, max(1, args.iters // 8))
    ar.close()
    rounds = _by_round(timeline.raw())
    timeline.clear()
    rows = [_stages(rounds[r], t0, t1)
            for t0, t1, r in calls if r in rounds]
    rows = [r for r in rows if r is not None]
    if not rows:
        return {"untraced": float(np.mean(untraced)), "flush": flush}
    # means: the stages of a round add up to its call, and so do their means
    out = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
    out["median"] = float(np.median([r["total"] for r in rows]))
    out["untraced"] = float(np.mean(untraced))
    out["flush"] = flush
    return out


def _median_flush(ar, x, n):
    """The median of ``n`` synchronous rounds (``flush()``), each after
    one call, in seconds."""
    lat = []
    for _ in range(n):
        ar(x)
        t0 = pc.now()
        ar.flush()
        lat.append(pc.now() - t0)
    return float(np.median(lat))


COLUMNS = ["impl"] + [f"{s}_us" for s in STAGES] + \
    ["total_us", "median_us", "untraced_us", "x_mpi", "ops", "act_msgs",
     "x_msgs", "on_caller", "switches", "flush_us"]
LEGEND = {
    "before..after": "the stages (module docstring), mean us per call",
    "total_us": "their sum, the mean traced call",
    "median_us / untraced_us": "the median call with / without the "
                               "timeline recording",
    "x_mpi": "untraced_us / MPI_Allreduce's",
    "ops, act_msgs, x_msgs": "per round on a rank: ops completed, "
                             "activation and exchange messages sent",
    "on_caller, switches": "ops run on the caller's thread, and changes "
                           "of thread between consecutive ops",
    "flush_us": "the median synchronous round (flush(), after one call; "
                "iters / 8 of them)"}


def run(args, comm=MPI.COMM_WORLD):
    n = parse_size(args.size) // 4
    x = np.ones(n, np.float32)
    k = args.quorum or max(1, comm.size // 2)
    blank = {c: float("nan") for c in COLUMNS[1:]}
    floors = comm.allgather(_floors(x, comm, args))
    rows = [{**blank, "impl": name,
             "untraced_us": _over(floors, name, np.median)}
            for name in floors[0]]
    kinds = [s.strip() for s in args.kinds.split(",") if s.strip()]
    # the recording's first pass pays for growing its buffer and would
    # inflate the first kind's stages about twice: a pass thrown away
    _breakdown(kinds[0], x, comm, args, k)
    for kind in kinds:
        every = comm.allgather(_breakdown(kind, x, comm, args, k))
        row = {**blank,
               "impl": f"quorum(k={k})" if kind == "quorum" else kind}
        for key in STAGES + ("total",):     # means add up
            row[f"{key}_us"] = _over(every, key, np.mean)
        for key in ("median", "untraced", "flush"):
            row[f"{key}_us"] = _over(every, key, np.median)
        for key in ("ops", "act_msgs", "x_msgs", "on_caller", "switches"):
            row[key] = _over(every, key, np.mean, 1.0)
        rows.append(row)
    for row in rows:
        row["x_mpi"] = row["untraced_us"] / rows[0]["untraced_us"]
        row["ranks"], row["bytes"] = comm.size, 4 * n
    emit(rows, COLUMNS, args,
         f"one partial round, stage by stage: {comm.size} ranks, no skew, "
         f"{4 * n} bytes, {args.iters} calls", comm, legend=LEGEND)
    return rows


def _over(every, key, how, scale=1e6):
    """``how`` over the ranks' dicts ``every`` of their ``key`` (where
    finite), times ``scale``."""
    got = [d[key] for d in every if np.isfinite(d.get(key, np.nan))]
    return float(how(got)) * scale if got else float("nan")
