"""Where the aware scheme loses to the oracle on redrawn rates (issue 17):
``mpiexec -n P python bench/aware_gap.py OUT.json [mbytes] [every]
[redraws] [slice] [schemes]``.  The benchmark's trace (every NIC's in and
out rate from 2..25 MB/s, redrawn every ``every`` s, seed 3), each scheme
for ``every * redraws`` s, and per call rank 0 records: its start and
length (s since the network's time zero), the shares it ran with, the true
NIC rates at its start and end, this call's raw NIC estimates
(``plan.nic_rates``) and the scheduler's (the medians it plans with).

``python bench/aware_gap.py --replay OUT.json`` then replays the record
offline through the load model of 3.3 (t_i = L_i / S_i, the true S_i of
the call's start): for every call, the model time of the plan it ran with
against the oracle's plan (Algorithm 1 on the true S_i) and equal shares,
the calls split by how they stand to the last redraw, and per plan its
estimation error on the nodes that matter.  The model has no host noise,
so the comparison of plans is exact where the load model holds.
"""
import json
import math
import sys

import numpy as np

from partialcoll.loadbalance.plan import follow


def record(path, mbytes=1.0, every=2.5, redraws=12, slice_elems=30_000,
           schemes="average,aware,oracle"):
    from mpi4py import MPI

    import partialcoll as pc
    from partialcoll.bench import aware
    from partialcoll.loadbalance import plan

    comm = MPI.COMM_WORLD
    P = comm.size
    args = type("A", (), {"low": 2.0, "high": 25.0, "every": every,
                          "latency": "1 ms", "seed": 3,
                          "message_overhead": "0"})()
    n = int(mbytes * 1e6 / 4)
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(
        np.float32)
    out = {"P": P, "n": n, "every": every, "mbytes": mbytes,
           "slice": slice_elems, "schemes": {}}
    for scheme in schemes.split(","):
        pc.network.enable(aware.network(args))
        _, t0 = pc.network.nic_rate(0)
        lb = pc.LoadBalancedAllreduce(x, scheme=scheme,
                                      slice_elems=slice_elems)
        calls, stop = [], False
        while not stop:
            t = pc.now()
            used = lb(x)
            end = pc.now()
            if comm.rank == 0:
                def nics(when):
                    return [[pc.network.nic_rate(i, k, when)[0]
                             for i in range(P)] for k in ("out", "in")]
                rep = lb.rates.get("reports") or {}
                raw = plan.nic_rates(rep, P) if rep else None
                calls.append({
                    "t": t - t0, "dt": end - t,
                    "shares": [float(m) for m in used["shares"]],
                    "true_start": nics(t), "true_end": nics(end),
                    "raw": raw, "est": [lb.rates.get("out"),
                                        lb.rates.get("in")],
                    "next_shares": [float(m) for m in lb.shares]})
            stop = comm.bcast(pc.now() - t0 >= every * redraws
                              if comm.rank == 0 else None)
        lb.close()
        pc.network.disable()
        if comm.rank == 0:
            out["schemes"][scheme] = calls
            print(f"{scheme}: {len(calls)} calls", flush=True)
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump(out, f, allow_nan=True)


def _S(nics):
    return [min(o, i) for o, i in zip(*nics)]


def model_time(M, shares, S):
    from partialcoll.loadbalance import plan
    return max(plan.node_times(M, shares, S))


def replay(path):
    from partialcoll.loadbalance import plan

    rec = json.load(open(path))
    M, P, every = float(rec["n"]) * 4, rec["P"], rec["every"]
    scale = 4.0                           # shares are elements of float32
    print(f"P={P}, {rec['mbytes']} MB, redraw every {every} s, slice "
          f"{rec['slice']}")
    for scheme, calls in rec["schemes"].items():
        wall = calls[-1]["t"] + calls[-1]["dt"]
        print(f"\n== {scheme}: {len(calls)} calls in {wall:.1f} s, "
              f"{len(calls) / wall:.2f} calls/s, median call "
              f"{np.median([c['dt'] for c in calls]):.3f} s")
        rows = []
        for k, c in enumerate(calls):
            S = _S(c["true_start"])
            crossed = _S(c["true_end"]) != S
            used = [m * scale for m in c["shares"]]
            opt = plan.distribute(M, S)[0]
            t_used, t_opt = model_time(M, used, S), model_time(M, opt, S)
            t_avg = model_time(M, plan.equal_shares(M, P), S)
            epoch = int(c["t"] // every)
            age = sum(1 for d in calls[:k] if int(d["t"] // every) == epoch)
            rows.append((k, epoch, age, crossed, c["dt"], t_used, t_opt,
                         t_avg))
        print(" call epoch age cross  real_s  model(plan) model(oracle) "
              "model(avg)  plan/oracle")
        for k, ep, age, cr, dt, tu, to, ta in rows:
            print(f" {k:4d} {ep:5d} {age:3d} {'x' if cr else ' ':5s} "
                  f"{dt:6.3f}  {tu:10.3f}  {to:12.3f}  {ta:9.3f}  "
                  f"{tu / to:6.2f}")
        for name, sel in (("all", lambda r: True),
                          ("redraw inside the call", lambda r: r[3]),
                          ("first call after a redraw",
                           lambda r: not r[3] and r[2] == 0),
                          ("second", lambda r: not r[3] and r[2] == 1),
                          ("third+", lambda r: not r[3] and r[2] >= 2)):
            sub = [r for r in rows if sel(r)]
            if sub:
                tu, to, ta = (sum(r[i] for r in sub) for i in (5, 6, 7))
                real = sum(r[4] for r in sub)
                print(f"  {name:28s} n={len(sub):3d}  model: plan "
                      f"{tu:7.2f} s, oracle {to:7.2f} s, average "
                      f"{ta:7.2f} s, plan/oracle {tu / to:5.2f}; real "
                      f"{real:7.2f} s")
        if scheme == "aware":
            estimates(calls, M, P, every)
            policies(calls, M, P, every)


def estimates(calls, M, P, every):
    """Per steady call (third+ in its draw, no redraw inside): the
    scheduler's S_i against the true, on the nodes the oracle gives a
    share, and the share each got."""
    from partialcoll.loadbalance import plan
    print("  steady calls: est/true S_i per node (shares: plan | oracle, "
          "% of M)")
    for k, c in enumerate(calls):
        if c["est"][0] is None or k == 0:
            continue
        S = _S(c["true_end"])
        est = [min(o, i) for o, i in zip(*c["est"])]
        raw = [min(o, i) for o, i in zip(*c["raw"])] if c["raw"] else est
        opt = plan.distribute(M, S)[0]
        nxt = [4 * m for m in c["next_shares"]]
        if _S(c["true_start"]) != S:
            continue
        print(f"   call {k:3d}: " + " ".join(
            f"{e / s:4.2f}/{r / s:4.2f}({100 * a / M:3.0f}|"
            f"{100 * b / M:3.0f})"
            for e, r, s, a, b in zip(est, raw, S, nxt, opt)))


def policies(calls, M, P, every):
    """The aware run's raw per-call estimates replanned offline with other
    ways of following them (plan k from calls < k), in the load model, over
    the oracle's plan: by the call's place after a redraw."""
    from partialcoll.loadbalance import plan

    def median_of(w):
        def pick(k):
            rows = [c["raw"] for c in calls[max(0, k - w):k] if c["raw"]]
            return np.nanmedian(np.array(rows), axis=0) if rows else None
        return pick

    def followed(k):
        rec = [[[] for _ in range(P)] for _ in range(2)]
        for c in calls[:k]:
            for side in range(2):
                for i in range(P) if c["raw"] else ():
                    rec[side][i] = follow(rec[side][i],
                                               c["raw"][side][i])
        return [[float(np.median(r)) if r else math.nan for r in side]
                for side in rec]

    print("  replanned from the raw estimates (model, over the oracle):")
    for name, pick in (("median of last 3 (before)", median_of(3)),
                       ("last call only", median_of(1)),
                       ("restart on a jump", followed)):
        cats = {"cross": [0, 0], "first": [0, 0], "second": [0, 0],
                "later": [0, 0]}
        for k in range(1, len(calls)):
            c, est = calls[k], pick(k)
            S = _S(c["true_start"])
            shares = plan.equal_shares(M, P) if est is None else \
                plan.distribute(M, plan.node_throughput(list(est[0]),
                                                        list(est[1])))[0]
            epoch = int(c["t"] // every)
            age = sum(1 for d in calls[:k] if int(d["t"] // every) == epoch)
            cat = "cross" if _S(c["true_end"]) != S else \
                ("first", "second", "later")[min(age, 2)]
            cats[cat][0] += model_time(M, shares, S)
            cats[cat][1] += model_time(M, plan.distribute(M, S)[0], S)
        total = [sum(v[i] for v in cats.values()) for i in (0, 1)]
        print(f"    {name:26s} all {total[0] / total[1]:.2f}  " + "  ".join(
            f"{k} {a / b:.2f}" for k, (a, b) in cats.items() if b))


if __name__ == "__main__":
    if sys.argv[1] == "--replay":
        replay(sys.argv[2])
    else:
        a = sys.argv[1:]
        record(a[0], *[f(v) for f, v in zip(
            (float, float, int, int, str), a[1:])])
