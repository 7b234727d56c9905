"""How long the scheduler takes per batch (the paper's section 7.4).

The paper's setting: batches of |U| updates with deadlines drawn from
Uniform(1, 2|U|), a network of |U|/2 nodes with a congestion-free core;
it measured 30 ms, 440 ms and 1,460 ms at |U| = 100, 500 and 1,000 (C++).
Here: one server and one replica at the top rate, |U|/2 workers (two
updates each) whose NICs are drawn independently from {1, 2.5, 3.3, 5, 10}
x ``base_rate`` with the probabilities ``probabilities`` (N2 by default),
``aggregators`` server aggregators and ``replica_aggregators`` replica
ones, momentum 0.9 and a Div_max of ``div_updates`` (update norms are
drawn from [0.5, 1.5]).  Each repeat draws a new network and batch.
"""
import statistics

import numpy as np

from .monitor import LinkMonitor
from .ordering import Update
from .batch import Scheduler

FACTORS = (1.0, 2.5, 3.3, 5.0, 10.0)
N1 = (0.0, 0.0, 0.0, 0.1, 0.9)
N2 = (0.0, 0.1, 0.1, 0.1, 0.7)
N3 = (0.5, 0.0, 0.0, 0.0, 0.5)


def random_batch(n_updates, rng, probabilities=N2, base_rate=1e7,
                 size=1e6, per_worker=2):
    """A network (out, in rates) and a batch as in section 7.4: returns
    (out_rates, in_rates, updates, tau_max); node 0 is the server, node 1
    the replica, workers from 2."""
    workers = max(1, -(-n_updates // per_worker))
    nodes = list(range(2, 2 + workers))
    top = FACTORS[-1] * base_rate
    out = {0: top, 1: top}
    inn = {0: top, 1: top}
    for n in nodes:
        out[n] = rng.choice(FACTORS, p=probabilities) * base_rate
        inn[n] = rng.choice(FACTORS, p=probabilities) * base_rate
    tau_max = 2 * n_updates
    deadlines = rng.integers(1, 2 * n_updates + 1, size=n_updates)
    updates = [Update(i, nodes[i % workers], size,
                      int(deadlines[i]) - tau_max, rng.uniform(0.5, 1.5))
               for i in range(n_updates)]
    return out, inn, updates, tau_max


def scheduler_benchmark(n_updates, repeats=5, seed=0, aggregators=4,
                        replica_aggregators=2, probabilities=N2,
                        div_updates=10.0, runs=3):
    """Time :meth:`.Scheduler.plan` on random batches of ``n_updates``.

    Each of ``repeats`` batches is planned ``runs`` times by a fresh
    scheduler (the same plan each time) and keeps its fastest run (the
    least disturbed by other processes).  Returns a dict: n, repeats, and
    for each phase ("order", "aggregate", "replicate", "total") the median
    and max over batches in wall seconds (and in thread CPU seconds as
    "cpu_order", ...); plus the medians of kept, dropped, direct updates
    and delayed server commits.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(repeats):
        out, inn, updates, tau_max = random_batch(n_updates, rng,
                                                  probabilities)
        best = None
        for _ in range(runs):
            sched = Scheduler(0, sorted(out), LinkMonitor(out, inn, lag=0.2),
                              tau_max, aggregators=aggregators, replica=1,
                              replica_aggregators=replica_aggregators,
                              div_max=div_updates, gamma=0.9, seed=seed + r)
            plan = sched.plan(0.0, updates)
            if best is None or plan.cpu["total"] < best.cpu["total"]:
                best = plan
        rows.append(dict(best.timings, kept=len(best.order),
                         **{"cpu_" + k: v for k, v in best.cpu.items()},
                         dropped=len(best.dropped),
                         direct=len(best.direct()),
                         delayed=best.replication.delayed))
    result = dict(n=n_updates, repeats=repeats)
    for phase in ("order", "aggregate", "replicate", "total", "cpu_order",
                  "cpu_aggregate", "cpu_replicate", "cpu_total"):
        values = [row[phase] for row in rows]
        result[phase] = dict(median=statistics.median(values),
                             max=max(values))
    for key in ("kept", "dropped", "direct", "delayed"):
        result[key] = statistics.median(row[key] for row in rows)
    return result
