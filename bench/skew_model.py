"""What the partial collectives' protocols allow under skew: a model of
`partialcoll-bench latency`'s loop in which nothing costs time but a
round (COST microseconds from its start to its end on every rank, the
same for MPI_Allreduce) and the skew.

Every rank sleeps its skew (linear: rank r sleeps r x STEP ms) before
each of ITERS calls, as the benchmark does.  The model follows the
library's protocol (``partialcoll/collectives/partial/rounds.py``): a call
that finds finished rounds it has not taken returns them at once; one
that finds a round running carries its data into the next round and
waits for the running one; otherwise its deposit is fresh, counts
towards the next round's start (solo: any fresh call starts it;
majority: the fresh call of the rank drawn for the round, the library's
draw with seed 1; quorum: the k-th fresh call) and waits for that round.
A round that still waits when every rank has made its calls is started
by the closing synchronous round, as ``close()`` does.  Prints, per
implementation, the mean latency per call (over ranks and calls), the
speed-up over MPI_Allreduce and the mean NAP (fresh deposits per round):
the ceiling a protocol allows once the per-call costs are gone.

    python bench/skew_model.py --ranks 8,16,32 --step-ms 1 --cost-us 0,100
"""
import argparse
import heapq

from partialcoll.collectives.partial.kinds import designated

KINDS = ("majority", "quorum", "solo")


class Model:
    """One implementation's run: the ranks' calls and the rounds, in the
    order of their times."""

    def __init__(self, kind, P, step, cost, k, iters, seed=1):
        self.kind, self.P, self.step, self.cost = kind, P, step, cost
        self.k, self.seed = k, seed
        self.left = [iters] * P         # calls still to make
        self.observed = [0] * P         # rounds taken, per rank
        self.started = self.completed = 0
        self.fresh = {}                 # round -> ranks fresh in it
        self.blocked = {}               # rank -> (round it waits for, t0)
        self.latency = []
        self.events = [(r * step, 1, r) for r in range(P)]   # first sleeps
        heapq.heapify(self.events)
        self.last_call = 0.0
        self.closing = float("inf")     # the first round close() started

    def run(self):
        """(mean latency per call, mean NAP) of the whole run."""
        while self.events or self.blocked:
            if not self.events:         # close(): its synchronous round
                self.closing = min(self.closing, self.started)
                self._start(self.last_call)
                continue
            t, what, x = heapq.heappop(self.events)
            if what == 0:               # round x ends, on every rank
                self._end(t, x)
            else:
                self._call(t, x)
        # NAP as the benchmark counts it: the rounds before close()
        naps = [len(v) for rnd, v in self.fresh.items()
                if rnd < self.closing]
        return (sum(self.latency) / len(self.latency),
                sum(naps) / max(len(naps), 1))

    def _call(self, t, r):
        self.left[r] -= 1
        self.last_call = max(self.last_call, t)
        if self.completed > self.observed[r]:      # finished rounds: at once
            self.observed[r] = self.completed
            self._returned(t, r, t)
            return
        rnd = self.observed[r]
        self.blocked[r] = (rnd, t)
        if self.started > rnd:                     # a round runs: stale
            return
        fresh = self.fresh.setdefault(rnd, set())
        fresh.add(r)
        if self.kind == "solo" or \
                (self.kind == "majority" and
                 designated(self.seed, rnd, self.P) == r) or \
                (self.kind == "quorum" and len(fresh) >= self.k):
            self._start(t)

    def _start(self, t):
        heapq.heappush(self.events, (t + self.cost, 0, self.started))
        self.started += 1

    def _end(self, t, rnd):
        self.completed = rnd + 1
        for r, (waits, t0) in list(self.blocked.items()):
            if waits <= rnd:
                del self.blocked[r]
                self.observed[r] = self.completed
                self._returned(t, r, t0)

    def _returned(self, t, r, t0):
        self.latency.append(t - t0)
        if self.left[r]:
            heapq.heappush(self.events, (t + r * self.step, 1, r))


def mpi_latency(P, step, cost):
    """MPI_Allreduce's mean latency: every call ends when the last rank
    has arrived, (P - 1) x step after the first, and the round is over."""
    return (P - 1) * step / 2 + cost


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,16,32",
                   help="comma-separated rank counts")
    p.add_argument("--step-ms", type=float, default=1.0,
                   help="the linear skew's step (default 1)")
    p.add_argument("--cost-us", default="0",
                   help="comma-separated round costs in microseconds")
    p.add_argument("--iters", type=int, default=64,
                   help="calls per rank (the benchmark's default, 64)")
    p.add_argument("--seed", type=int, default=1,
                   help="majority's draw (the benchmark's, 1)")
    args = p.parse_args()
    step = args.step_ms * 1e-3
    print("P  cost_us  impl           latency_ms  speedup  nap")
    for P in (int(x) for x in args.ranks.split(",")):
        for cost in (float(c) * 1e-6 for c in args.cost_us.split(",")):
            base = mpi_latency(P, step, cost)
            print(f"{P:<3}{cost * 1e6:7.0f}  MPI_Allreduce  "
                  f"{base * 1e3:10.3f}  {1:7.2f}  {P:.2f}")
            for kind in KINDS:
                lat, nap = Model(kind, P, step, cost, max(1, P // 2),
                                 args.iters, args.seed).run()
                speedup = base / lat if lat > 0 else float("inf")
                print(f"{P:<3}{cost * 1e6:7.0f}  {kind:<13}  "
                      f"{lat * 1e3:10.3f}  {speedup:7.2f}  {nap:.2f}")


if __name__ == "__main__":
    main()
