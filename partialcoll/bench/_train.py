"""The training-benchmark loop shared by ``hyperplane`` and ``lstm``.

A *task* supplies the model and data; this module runs it once per mode
(``sync`` first: it is the baseline), times it, records rank 0's model at
evaluation points (a weight copy, evaluated after the run so evaluation
costs no training time), and reports throughput, speed-up over sync, final
metrics, NAP and the fraction of steps whose gradient was included.

Task interface::

    reset()                 same initial weights on every rank
    optimizer(mode, comm)   an eager optimizer (NumPy or torch) in that mode
    step(opt, s)            one training step on this rank's next batch
    snapshot()              a copy of the weights
    evaluate(snap)          {"metric": value, ...} on the validation set
    metric, better          the headline metric and "lower"/"higher"
"""
import time

from mpi4py import MPI

from ..collectives.partial import designated as draw_rank
from ._common import progress, pyplot, save_plot


def one_random_rank(delay_s, seed, comm):
    """The paper's injection: at every step one rank, drawn at random (the
    same draw on every rank and for every mode), sleeps ``delay_s``."""
    P, rank = comm.size, comm.rank
    return lambda s: delay_s if delay_s and draw_rank(seed, s, P) == rank else 0.0


def parse_mode(text):
    return int(text) if text.isdigit() else text


def run_mode(task, mode, steps, delay_of, eval_every, comm, desc):
    """Train ``steps`` steps in ``mode``; returns a result dict."""
    task.reset()
    opt = task.optimizer(mode, comm)
    snaps = []
    infos_active, infos_included = 0, 0
    comm.Barrier()
    t0 = time.perf_counter()
    if comm.rank == 0:
        snaps.append((0.0, 0, task.snapshot()))
    for s in progress(range(steps), comm, desc):
        d = delay_of(s)
        if d:
            time.sleep(d)
        info = task.step(opt, s)
        infos_active += info.active
        infos_included += info.included
        if comm.rank == 0 and ((s + 1) % eval_every == 0 or s + 1 == steps):
            snaps.append((time.perf_counter() - t0, s + 1, task.snapshot()))
    late = _lateness(opt)
    opt.close()                 # collective: the last pending gradients applied
    elapsed = time.perf_counter() - t0
    if comm.rank == 0:
        snaps.append((elapsed, steps, task.snapshot()))
    wall = comm.allreduce(elapsed, op=MPI.MAX)
    nap = comm.allreduce(infos_active, op=MPI.SUM) / (steps * comm.size)
    incl = comm.allreduce(infos_included, op=MPI.SUM) / (steps * comm.size)
    curve = []
    if comm.rank == 0:
        for t, s, w in snaps:
            curve.append({"time_s": t, "step": s, **task.evaluate(w)})
    curve = comm.bcast(curve, root=0)
    return {"mode": str(mode), "steps": steps, "time_s": wall,
            "steps_per_s": steps / wall, "nap": nap, "included": incl,
            **late, "final": curve[-1], "curve": curve}


def _lateness(opt):
    """The straggler report's slowest rank and its late share (partial
    modes), from the optimizer's stats()."""
    st = opt.stats() if hasattr(opt, "stats") else {}
    if st.get("slowest") is None:
        return {"slowest": "-", "late": float("nan")}
    return {"slowest": st["slowest"], "late": st["late_share"][st["slowest"]]}


def time_to(curve, metric, target, better):
    """First time the curve reaches ``target`` (NaN if never)."""
    for p in curve:
        v = p[metric]
        if (v <= target) if better == "lower" else (v >= target):
            return p["time_s"]
    return float("nan")


def plot_curves(groups, metric, path, title, log=False, ylabel=None):
    """groups: {panel title: [result dicts]}; one panel per group."""
    plt = pyplot()
    if plt is None:
        return
    n = len(groups)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.8), squeeze=False)
    for ax, (panel, results) in zip(axes[0], groups.items()):
        for r in results:
            xs = [p["time_s"] for p in r["curve"]]
            ys = [p[metric] for p in r["curve"]]
            ax.plot(xs, ys, marker=".", ms=3,
                    label=f"{r['mode']} ({r['steps_per_s']:.2f} steps/s)")
        if log:
            ax.set_yscale("log")
        ax.set_title(panel)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(ylabel or metric)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_plot(fig, path)


def summary_rows(results, metric, better, extra):
    """Rows for the table: one per result, with speed-up and metric ratio
    against the sync result of the same group."""
    base = next((r for r in results if r["mode"] == "sync"), None)
    rows = []
    for r in results:
        v = r["final"][metric]
        row = dict(extra)
        row.update({"mode": r["mode"], "steps": r["steps"],
                    "time_s": r["time_s"], "steps_per_s": r["steps_per_s"],
                    "speedup": (base["time_s"] / r["time_s"]) if base else
                    float("nan"),
                    metric: v,
                    f"{metric}_vs_sync": (v / base["final"][metric]) if base
                    and base["final"][metric] else float("nan"),
                    "nap": r["nap"], "included": r["included"],
                    "slowest": r["slowest"], "late": r["late"]})
        rows.append(row)
    return rows


def check_modes(text, size):
    modes = [parse_mode(m.strip()) for m in text.split(",") if m.strip()]
    for m in modes:
        if isinstance(m, int):
            if not 1 <= m <= size:
                raise SystemExit(f"quorum {m} is not between 1 and {size}")
        elif m not in ("sync", "sync-mpi", "solo", "majority"):
            raise SystemExit(f"unknown mode {m!r}: use sync, sync-mpi, solo, "
                             f"majority or an integer quorum")
    if "sync" in modes:                 # the baseline runs first
        modes.remove("sync")
        modes.insert(0, "sync")
    return modes


def add_curves(path, curves):
    """Add the loss/accuracy curves to the --json file written by emit()."""
    import json
    with open(path) as f:
        doc = json.load(f)
    doc["curves"] = curves
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
