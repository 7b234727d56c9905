"""The MPI job of tests/test_clock.py: ranks whose clocks differ by days.

Run under an MPMD mpiexec where some ranks start in a new time namespace
(``unshare --time --monotonic S``): their CLOCK_MONOTONIC, the executor's
clock, reads S seconds ahead, as another host's clock would.  The true
offset of each rank is read from /proc/self/timens_offsets.  Checks, in
order (each rank exits non-zero on a failed check; a hang ends in the
watchdog's traceback after ``TIMEOUT`` seconds):

1. each rank's estimated offset to rank 0 lies within its error bound of
   the true one;
2. the load-balanced allreduce: correct sums, no rank starts its sends
   before the planned start (the start converted to each rank's clock),
   and rank 0's reports have every arrival on its own clock;
3. a merged timeline has every rank's events on rank 0's clock;
4. MLfabric's tree allreduce (correct sums; its planner's link monitor
   learns from the arrivals) and a short parameter-server run.

Rank 0 prints one JSON line: the offsets, their error bounds and the
truth.  Usage: ``clock_offset_job.py TRACE_PATH``.
"""
import faulthandler
import json
import sys

import numpy as np
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import clock
from partialcoll.mlfabric import train
from partialcoll.mlfabric.runtime.allreduce import DynamicTreeAllreduce
from partialcoll.mlfabric.runtime.models import SoftmaxRegression
from partialcoll.mlfabric.runtime.optim import SGD

TIMEOUT = 25          # seconds: a hang (a start time days ahead) fails
faulthandler.dump_traceback_later(TIMEOUT, exit=True)
COMM = MPI.COMM_WORLD
RANK, P = COMM.rank, COMM.size
LEAD = 0.3            # the load balancer's start lead (seconds)
#: MLfabric's link monitor before any measurement (bytes/s): an estimate
#: still at it took in no measurement
INITIAL_RATE = 1e7
#: the parameter server's: above any rate a report could show here
UNMEASURED = 1e12


def namespace_offset():
    """This process's CLOCK_MONOTONIC offset (seconds) from its time
    namespace."""
    with open("/proc/self/timens_offsets") as f:
        for line in f:
            name, secs, nsecs = line.split()
            if name == "monotonic":
                return int(secs) + int(nsecs) * 1e-9
    raise RuntimeError("no monotonic line in /proc/self/timens_offsets")


def check(ok, what):
    if not ok:
        raise AssertionError(f"rank {RANK}: {what}")


def check_estimate(truths):
    clk = clock.of(COMM)
    true = truths[RANK] - truths[0]
    check(abs(clk.offset - true) <= clk.error,
          f"estimated offset {clk.offset!r} is not within {clk.error:.3g} s "
          f"of the true {true!r}")
    return clk


def send_starts():
    """This process's send starts recorded since the last clear()."""
    return [e["t"] for e in pc.timeline.events()
            if e["ev"] == "start" and e["kind"] == "send"]


def check_load_balanced(clk):
    x = np.arange(2_000_000, dtype=np.float64) * (RANK + 1)
    want = np.arange(2_000_000, dtype=np.float64) * (P + 1) / 2
    pc.timeline.clear()
    pc.timeline.enable()
    t0 = COMM.bcast(clk.reference_now(), root=0)
    with pc.LoadBalancedAllreduce(x, lead=LEAD, slice_elems=20_000) as lb:
        lb(x)
        starts = send_starts()
        pc.timeline.disable()
        check(np.allclose(x, want), "the load-balanced average is wrong")
        check(starts, "no send recorded")
        # the first call starts at rank 0's clock + LEAD, read after t0
        earliest = clk.to_local(t0 + LEAD) - clk.error - 1e-3
        check(min(starts) >= earliest,
              f"a send started {earliest - min(starts):.3g} s before the "
              f"planned start: no pacing")
        for _ in range(2):
            x[:] = np.arange(x.size) * (RANK + 1)
            lb(x)
            check(np.allclose(x, want), "the load-balanced average is wrong")
        t1 = clk.reference_now()
        reports = lb.rates["reports"]
    if RANK == 0:
        times = [t for arrivals, until, *_ in reports.values()
                 for t in [a for a, _ in arrivals] + [until]]
        check(times, "no link reports")
        check(all(t0 <= t <= t1 for t in times),
              f"report times outside this run: {min(times) - t0:.6g} .. "
              f"{max(times) - t0:.6g} s after its start (lasted "
              f"{t1 - t0:.3g} s)")


def check_timeline(clk, path):
    pc.timeline.clear()
    pc.timeline.enable()
    t0 = COMM.bcast(clk.reference_now(), root=0)
    for _ in range(3):
        pc.allreduce(np.ones(1000))
    t1 = COMM.allreduce(clk.reference_now(), op=MPI.MAX)
    pc.timeline.disable()
    pc.timeline.write(path)
    pc.timeline.clear()
    if RANK != 0:
        return
    tl = pc.timeline.load(path)
    slack = 1e-3
    for rank, events in tl.per_rank.items():
        check(len(events), f"no events of rank {rank}")
        lo, hi = events["t"].min() - t0, events["t"].max() - t0
        check(-slack <= lo and hi <= t1 - t0 + slack,
              f"rank {rank}'s events lie {lo:.6g} .. {hi:.6g} s after the "
              f"start on rank 0's clock (the run lasted {t1 - t0:.3g} s)")
    for x in tl.transfers():
        check(x["delivered"] >= x["released"] - slack,
              f"delivered {x['released'] - x['delivered']:.6g} s before "
              f"it was released: {x}")


def check_tree_allreduce():
    ar = DynamicTreeAllreduce(COMM, aggregators=1, monitor_lag=0.0,
                              initial_rate=INITIAL_RATE, seed=2)
    try:
        for it in range(5):
            x = np.full(50_000, float(RANK + it))
            ar(x)
            check(np.all(x == sum(r + it for r in range(P))),
                  "the tree allreduce's sum is wrong")
        if RANK == ar.planner:     # every rank received in some call
            _, inn = ar.monitor.rates(ar.clock.reference_now())
            check(all(rate != INITIAL_RATE for rate in inn.values()),
                  f"the monitor took in no arrival of some rank: {inn}")
    finally:
        ar.free()


def check_parameter_server():
    """A short run.  No aggregators: a worker's incoming rate is then
    measured only by its own model pulls, so each worker's reports must
    reach the server's monitor on the server's clock.  The monitor starts
    far above any real rate, so every estimate a report made is lower."""
    model = SoftmaxRegression(features=16, classes=4, seed=1)
    res = train(model, SGD(1.0), mode="mlfabric", tau_max=P, aggregators=0,
                duration=0.8, compute_time=0.02, batch_interval=0.04,
                monitor_lag=0.0, initial_rate=UNMEASURED, seed=3)
    inv = res.invariants
    check(res.updates["applied"] >= 5, f"few updates applied: {res}")
    check(inv["late"] == inv["unaccounted"] == inv["applied_twice"] == 0,
          f"broken invariants {inv}")
    out, inn = res.scheduler["rates"]
    for what, rate in [("rank 0 out", out[0])] + \
            [(f"rank {w} in", inn[w]) for w in range(1, P)]:
        check(1e3 < rate < UNMEASURED,
              f"{what}: {rate:.3g} bytes/s, not from a plausible "
              f"measurement: {out} {inn}")


def main():
    truths = COMM.allgather(namespace_offset())
    clk = check_estimate(truths)
    check_load_balanced(clk)
    check_timeline(clk, sys.argv[1])
    check_tree_allreduce()
    check_parameter_server()
    COMM.Barrier()
    if RANK == 0:
        print(json.dumps({"offsets": clk.offsets, "errors": clk.errors,
                          "true": [t - truths[0] for t in truths]}))


if __name__ == "__main__":
    pc.abort_on_error()
    main()
