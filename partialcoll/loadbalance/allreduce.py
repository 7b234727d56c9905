"""Load-balanced allreduce for parameter servers over heterogeneous links:
the schedules, the measurements and the scheduler (section 3 of Cai et al.;
the algorithms are in :mod:`.plan`).

One call averages a vector over the ranks.  Every rank is a worker and,
beside it, a server (3.3).  The vector is cut into slices (Algorithm 2); the
server that owns a slice receives it from every other worker (PUSH, an
uneven reduce-scatter), averages it and sends the average back to them
(PULL, an uneven allgather).  A slice's PULL starts as soon as its own PUSH
is complete, so PUSH and PULL overlap slice by slice (3.1)::

    worker r -> server j:   forecast | probe slices | data slices   (PUSH)
    server j -> worker r:   averaged slices, each as soon as it is ready (PULL)

Measurement (3.2): before its slices, each worker sends every server a tiny
*forecast* message on the same FIFO link; the server takes the forecast's
arrival as the start and the last slice's arrival as the end of the link's
transfer (bytes / (t_end - t_start) is the paper's s_ij, and every data
slice counts, not only probes).  Arrival means the receive's ``t_arrive``,
when the message arrived, not when this rank's progress thread noticed it:
on a host with more ranks than cores that is late by more than a slice
takes.  (On the emulated network the arrival time comes from the model, as
a real NIC's hardware receive timestamps would; over plain MPI it is the
completion time.)  A server must be listening when the forecast comes, or
it would find forecast and slices already there: so, as in the paper
("after receiving the latest strategy, each node transmits"), the plan
carries a start time a little ahead (``lead``, 5 ms): every rank posts its
receives at once and its sends wait for that time (a START_AT op).  The
start time and the arrivals in the reports cross ranks on the
communicator's reference clock (:mod:`partialcoll.core.clock`): each rank
converts them from and to its own, so ranks on hosts whose clocks differ
start together and the scheduler compares arrivals measured on different
servers.  Links
that span under 1 ms are not reported.  Servers report every link's
arrivals (forecast, then each slice with its bytes) to the scheduler (rank
0) after every call, with when each link's later traffic (the averages
coming back) ended; it estimates every NIC's rate over the stretch in
which its links were on the wire together (:func:`.plan.nic_rates`),
holds a lower reading unless the NIC was the binding limit of some flow
(:func:`.plan.held_estimates`), takes per NIC the median of its estimates
since its rate last changed (at most ``window``; :func:`.plan.follow`),
and S_i = min(out_i, in_i) (:func:`.plan.node_throughput`); then it
plans the next call's shares with Algorithm 1.  So a call runs with the
plan from the reports of the call before it: one call of lag, the least a
measured plan can have.  The reports and the plan travel on the library's
control communicator (reliable, outside an emulated network): the
scheduler sees only these measurements, never the network's configured
rates.

Schemes: ``"aware"`` (the above), ``"average"`` (equal shares, the same
slicing, probes and forecasts: the paper's baseline) and ``"oracle"``
(Algorithm 1 on the emulated network's true current NIC rates: an upper
bound for the comparison, not a deployable scheme).

No server loop is shared with the other parameter servers (TicTac's,
MLfabric's): here every rank is worker and server inside one schedule per
call, a collective; see :mod:`partialcoll.tictac.ps` for why each builds
on the Schedule API directly.
"""
from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..core import clock, control, libcomm
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.checks import check_comm
from ..core.schedule import Schedule
from . import plan as planner

log = logging.getLogger("partialcoll")


SCHEMES = ("aware", "average", "oracle")


class LoadBalancedAllreduce:
    """Average a float vector over the ranks with network-aware, uneven
    parameter-server load distribution (see the module docstring).

    Args:
        like: an array with the vector's size and float dtype.
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        scheme: ``"aware"``, ``"average"`` or ``"oracle"``.
        slice_elems: elements per data slice (the paper's constant: 1.2e5,
            for models of 5e6 to 6e7 parameters).  For a vector of a few
            MB use about 1 to 3 % of it: when a plan gives a slow node no
            share, every slice waits for that node's push, split over its
            N - 1 links, and large slices then leave its incoming NIC idle
            until the first ones are complete (at 8 ranks and 4 MB, calls
            with 30,000 came within 2 % of the load model, with 1.2e5 up
            to 26 % over it; docs/results.md).
        num_probe: probe slices to every server before the data (the
            paper's default: 2; 0: none).
        size_probe: elements per probe slice (the paper's: 10,000).
        min_probe: a server planned below ``num_probe * size_probe`` gets
            probes of its share's size, at least ``min_probe`` elements (at
            most ``size_probe``).  ``"auto"`` (default): ``slice_elems //
            12``, the paper's ratio of probe to slice (10,000 to 1.2e5), so
            with the library's default slice every probe has
            ``size_probe`` elements; None: always, as in the paper.
            Probes are load on their server, and a server at share 0 is
            the slow node that sets the call's time: with the paper's
            fixed probes its load at 8 ranks and 4 MB was 12 % above its
            floor.  Much smaller probes are measured less well: at 30,000-
            element slices, 1,000-element probes left 42 % of the NIC
            estimates more than 10 % off, 2,500 18 %, 10,000 11 %
            (:func:`.plan.assign_slices`, docs/results.md).
        measure: send forecasts and measure the links (needed by "aware").
        threshold: Algorithm 1 stops when max t - min t <= threshold max t.
        window: at most this many calls' NIC estimates, since the NIC's
            rate last changed, make the median the scheduler plans with.
        jump: an estimate more than ``jump`` times above or below that
            median is a changed rate: the NIC's record restarts from it.

    Creating it and ``close()`` are collective; so is every call.
    Example::

        lb = LoadBalancedAllreduce(grad, scheme="aware")
        for step in range(steps):
            lb(grad)                  # grad is now the average (in place)
        print(lb.plan["shares"], lb.rates["S"])
        lb.close()
    """

    n: int
    dtype: np.dtype[Any]
    scheme: str
    slice_elems: int
    num_probe: int
    size_probe: int
    min_probe: int | None
    measure: bool
    threshold: float
    window: int
    jump: float
    lead: float
    size: int
    rank: int
    max_slices: int
    # each rank's server's planned share of the vector
    shares: list[float]
    # the last call's plan: shares and slices
    plan: dict[str, Any]
    # the NIC rate estimates S (bytes/s per rank) and the reports (their
    # times on the reference clock, rank 0's)
    rates: dict[str, Any]
    calls: int          # calls so far
    _lc: libcomm.LibraryComm
    _ntags: int
    _tag0: int
    _scheds: dict[tuple[Any, ...], tuple[Schedule, dict[str, Any]]]
    _closed: bool
    _go: float | None
    _clock: clock.Clock

    def __init__(self, like: npt.ArrayLike, comm: MPI.Comm | None = None,
                 scheme: str = "aware", slice_elems: int = 120_000,
                 num_probe: int = 2, size_probe: int = 10_000,
                 min_probe: int | str | None = "auto", measure: bool = True,
                 threshold: float = 0.01, window: int = 3,
                 jump: float = 1.25, lead: float = 0.005) -> None:
        like = np.asarray(like)
        if like.dtype.kind != "f":
            raise ScheduleError(f"LoadBalancedAllreduce averages float "
                                f"arrays, not {like.dtype}")
        if scheme not in SCHEMES:
            raise ScheduleError(f"scheme must be one of {SCHEMES}")
        if scheme == "aware" and not measure:
            raise ScheduleError("the aware scheme needs measure=True")
        if slice_elems < 1 or num_probe < 0 or size_probe < 1 or \
                not 0 < threshold < 1 or window < 1 or not jump > 1 or \
                not (min_probe in (None, "auto") or
                     (isinstance(min_probe, numbers.Integral) and
                      not isinstance(min_probe, bool) and min_probe >= 1)):
            raise ScheduleError("slice_elems >= 1, num_probe >= 0, "
                                "size_probe >= 1, min_probe an int >= 1, "
                                "'auto' or None, 0 < threshold < 1, "
                                "window >= 1, jump > 1")
        if not isinstance(lead, numbers.Real) or isinstance(lead, bool):
            raise ArgumentTypeError(f"lead must be a number of seconds in "
                                    f"[0, 60], got {lead!r}")
        if not 0 <= lead <= 60:
            raise ScheduleError(f"lead must be a number of seconds in "
                                f"[0, 60], got {lead!r}")
        if scheme == "oracle":
            from ..transport import network
            if network.current() is None:    # the same on every rank
                raise ScheduleError("the oracle scheme plans with the "
                                    "emulated network's true rates: enable "
                                    "one first (partialcoll.network.enable)")
        comm = check_comm(comm)
        self.n, self.dtype, self.scheme = like.size, like.dtype, scheme
        self.slice_elems, self.num_probe = int(slice_elems), int(num_probe)
        self.size_probe, self.measure = int(size_probe), bool(measure)
        if min_probe == "auto":
            min_probe = planner.auto_min_probe(self.slice_elems)
        self.min_probe = None if min_probe is None else int(min_probe)
        self.threshold, self.window = float(threshold), int(window)
        self.jump = float(jump)
        self.lead = float(lead)
        lc = self._lc = libcomm.library_comm(comm)
        lc.before_collective()
        mine = {"collective": "LoadBalancedAllreduce", "n": self.n,
                "dtype": self.dtype.str, "scheme": scheme,
                "slice": self.slice_elems,
                "probes": (num_probe, size_probe, self.min_probe),
                "measure": measure}
        control.require_same(lc, "LoadBalancedAllreduce", mine)
        self._clock = clock.of(comm)
        self.size, self.rank = lc.size, lc.rank
        self._world = control.world_ranks(comm)   # the network's rank numbers
        N = self.size
        self.max_slices = N * num_probe + -(-self.n // self.slice_elems) + N
        self._ntags = 2 * self.max_slices + 1
        self._tag0 = lc.tags.block(self._ntags, "load-balanced allreduce")
        lc.acquire()
        self.shares = planner.equal_shares(float(self.n), N)
        self._floors = ([math.nan] * N, [math.nan] * N)
        self._records = [[[] for _ in range(N)] for _ in ("out", "in")]
        self._scheds = {}
        self.plan = {"shares": list(self.shares), "slices": []}
        self.rates = {"S": [math.nan] * N, "reports": {}}
        self.calls, self._closed = 0, False
        self._go = None              # the next call's start (reference)

    # -- one call -----------------------------------------------------------
    def __call__(self, x: npt.NDArray[np.floating[Any]]) -> dict[str, Any]:
        """Average ``x`` (C-contiguous, the object's size and dtype) over the
        ranks, in place.  Returns this call's plan (dict)."""
        if self._closed:
            raise ScheduleError("this LoadBalancedAllreduce is closed")
        if not isinstance(x, np.ndarray):
            raise ArgumentTypeError(f"needs a writable C-contiguous "
                                    f"{self.dtype}[{self.n}] NumPy array, "
                                    f"not {type(x).__name__}")
        if not x.flags.c_contiguous or not x.flags.writeable or \
                x.size != self.n or x.dtype != self.dtype:
            raise ScheduleError(f"needs a writable C-contiguous "
                                f"{self.dtype}[{self.n}] NumPy array, got "
                                f"{x.dtype}[{x.size}] (writable: "
                                f"{x.flags.writeable}, C-contiguous: "
                                f"{x.flags.c_contiguous})")
        self._lc.before_collective()
        if self.size == 1 or self.n == 0:
            self.calls += 1
            return self.plan
        slices = planner.assign_slices(self.n, self.shares, self.slice_elems,
                                       self.num_probe, self.size_probe,
                                       self.min_probe)
        s, meta = self._schedule(tuple(slices))
        if self._go is None:
            self._go = self._lc.ctl.bcast(
                self._clock.reference_now() + self.lead
                if self.rank == 0 else None)
        meta["go"][0] = self._clock.to_local(self._go)
        s.bind(meta["x"], x.reshape(-1))
        try:
            s.post().wait()
        finally:
            s.unbind(meta["x"])
        reports = self._measure(s, meta) if self.measure else {}
        self.plan = {"shares": list(self.shares), "slices": slices}
        self._replan(reports)
        self.calls += 1
        return self.plan

    def _schedule(self, slices):
        """The schedule of a slicing (cached: plans repeat when stable)."""
        hit = self._scheds.get(slices)
        if hit is not None:
            return hit
        if len(self._scheds) >= 4:           # keep a few, free the oldest
            old = next(iter(self._scheds))
            self._scheds.pop(old)[0].free()
        built = self._build(slices)
        self._scheds[slices] = built
        return built

    def _build(self, slices):
        N, r, K = self.size, self.rank, self.max_slices
        t_push, t_pull, t_fc = self._tag0, self._tag0 + K, self._tag0 + 2 * K
        s = Schedule(self._lc.comm)
        X = s.buffer(dtype=self.dtype, size=self.n, name="x")
        own = [(k, a, c) for k, (a, c, o, _) in enumerate(slices) if o == r]
        tmp = s.buffer(np.zeros(max((N - 1) * sum(c for _, _, c in own), 1),
                                self.dtype), name="incoming")
        fc = s.buffer(np.zeros(N, self.dtype), name="forecasts")
        go = np.zeros(1)
        start = s.start_at(s.buffer(go, name="go")[0:1])
        peers = [j for j in range(N) if j != r]
        if self.measure:                     # forecasts lead each link
            for j in peers:
                s.send(fc[r:r + 1], j, tag=t_fc, after=[start])
        pushed = {}
        for k, (a, c, o, _) in enumerate(slices):
            if o != r:
                pushed[k] = s.send(X[a:a + c], o, tag=t_push + k,
                                   after=[start])
        fcast = {j: s.recv(fc[j:j + 1], j, tag=t_fc) for j in peers} \
            if self.measure else {}
        slices_in, off = {j: [] for j in peers}, 0
        for k, a, c in own:                  # server: aggregate, then PULL
            recvs, reds = [], []
            for j in peers:
                rv = s.recv(tmp[off:off + c], j, tag=t_push + k)
                reds.append(s.reduce(X[a:a + c], tmp[off:off + c],
                                     after=[rv]))
                recvs.append(rv)
                slices_in[j].append(rv)
                off += c
            join = s.nop(after=recvs)
            avg = s.scale(X[a:a + c], count_of=join, add=1,
                          after=reds + [join])
            for j in peers:
                s.send(X[a:a + c], j, tag=t_pull + k, after=[avg])
        pulls_in = {j: [] for j in peers}
        for k, (a, c, o, _) in enumerate(slices):    # worker: PULL
            if o != r:
                pulls_in[o].append(s.recv(X[a:a + c], o, tag=t_pull + k,
                                          after=[pushed[k]]))
        s.commit()
        return s, {"x": X, "go": go, "forecast": fcast,
                   "slices_in": slices_in, "pulls_in": pulls_in,
                   "slice_bytes": [c * self.dtype.itemsize
                                   for _, _, c in own]}

    # -- measuring and planning -----------------------------------------
    def _measure(self, s, meta):
        """This server's link reports {(i, me): (arrivals, until, resume)}:
        the forecast's and every slice's arrival, [(t_arrive, bytes), ...]
        (the forecast's bytes 0); when the link's last message of the call
        arrived (the averages that server i sends back follow the slices on
        the same FIFO link and share the NICs, unmeasured); and when the
        first of those averages went on the wire (``t_wire``, on the
        emulated network; elsewhere None: the link counts as busy from its
        last slice on).

        Times are the receives' arrival times (``t_arrive``), not when this
        rank noticed them (``t_done``): on a busy host the progress thread
        runs late, by more than a slice takes.  On the emulated network they
        come from the model, as a NIC's receive timestamps would; over plain
        MPI they are the completion times.  Reported on the reference clock
        (rank 0's), as the scheduler compares them across servers."""
        got = s.outcomes()
        t, t_wire = got.t_arrive, got.t_wire
        ref = self._clock.to_reference
        out = {}
        for j, f in meta["forecast"].items():
            ops = meta["slices_in"][j]
            if not ops or not t[f] > 0 or \
                    max(t[op] for op in ops) - t[f] <= 1e-3:
                continue
            arrivals = [(ref(float(t[f])), 0)] + \
                [(ref(float(t[op])), nbytes)
                 for op, nbytes in zip(ops, meta["slice_bytes"])]
            pulls = meta["pulls_in"][j]
            until = ref(float(max([t[op] for op in ops + pulls])))
            wired = [float(t_wire[op]) for op in pulls if t_wire[op] > 0]
            out[(j, self.rank)] = (arrivals, until,
                                   ref(min(wired)) if wired else None)
        return out

    def _replan(self, reports):
        ctl = self._lc.ctl
        gathered = ctl.gather(reports, root=0)
        shares = None
        if self.rank == 0:
            try:
                shares = self._plan_next(gathered)
            except Exception as e:       # every rank raises, none waits
                shares = ScheduleError(f"planning the next call failed on "
                                       f"rank 0: {e}")
        shares = ctl.bcast(shares, root=0)
        if isinstance(shares, Exception):
            raise shares
        self.shares, self._go = shares
        self.rates = ctl.bcast(self.rates, root=0)

    def _plan_next(self, gathered):
        """Rank 0: the next call's shares and start from the reports."""
        allrep = {k: v for part in gathered for k, v in part.items()}
        self.rates["reports"] = allrep
        if allrep:
            held, self._floors, bound = planner.held_estimates(
                allrep, self._floors, self.size, self.jump)
            self.rates["bound"] = bound
            out, inn = self._follow(held)
            self.rates["S"] = planner.node_throughput(out, inn)
            self.rates["out"], self.rates["in"] = out, inn
            self.rates["links"] = planner.link_rates(allrep)
        return self._shares(), self._clock.reference_now() + self.lead

    def _follow(self, estimates):
        """Each NIC's record after this call's (out, in) estimates; the
        records' medians (NaN for a NIC never measured)."""
        medians = []
        for records, latest in zip(self._records, estimates):
            for i, value in enumerate(latest):
                records[i] = planner.follow(records[i], value, self.window,
                                            self.jump)
            medians.append([float(np.median(r)) if r else math.nan
                            for r in records])
        return medians

    def _shares(self):
        M, N = float(self.n), self.size
        if self.scheme == "average":
            return planner.equal_shares(M, N)
        if self.scheme == "oracle":
            from ..transport import network
            S = [min(network.nic_rate(w, "out")[0],
                     network.nic_rate(w, "in")[0]) for w in self._world]
            S = [s if math.isfinite(s) else 1e12 for s in S]
        else:
            S = self.rates["S"]
            if any(math.isnan(s) for s in S):
                return planner.equal_shares(M, N)
        return planner.distribute(M, S, self.threshold)[0]

    # -- housekeeping -----------------------------------------------------
    def close(self) -> None:
        """Collective: free the schedules and the tags.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        for s, _ in self._scheds.values():
            s.free()
        self._scheds.clear()
        self._lc.tags.give_back(self._tag0, self._ntags)
        self._lc.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
