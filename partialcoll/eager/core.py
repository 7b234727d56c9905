"""The framework-agnostic core of eager-SGD: average a list of gradients
across ranks with one partial allreduce per step over a fused buffer.

The wrappers (:mod:`partialcoll.eager.optim` for NumPy,
:mod:`partialcoll.torch` for PyTorch) only move tensors in and out of this.

Why the sum of applied updates equals synchronous SGD's: every rank's
gradient lands in exactly one round of the partial allreduce (a late one is
carried into the next round, never dropped), and with catch-up every rank
receives every round exactly once, either at the step that waited for it or
folded into a later step's result, or at the latest in :meth:`flush`.  Each
result is divided by the world size P (not by the number of active
processes), so over a run every rank applies sum(all gradients) / P, exactly
what synchronous SGD applies, only at different steps.

Once a rank died and the partial modes carried on over the S survivors,
a gradient handed over from then on is scaled by P / S before it is
reduced, so it counts 1/S.  The scale goes with the gradient into its
round, never with the step that applies the round: around a death the
survivors apply some rounds at different steps (one before it joined the
survivors' recovery, another after), and every survivor must apply every
round alike.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

import numpy as np
from mpi4py import MPI

from ..collectives.allreduce import iallreduce
from ..core import control, devices, failures, libcomm
from ..core.buffers import Buffer, as_array
from ..core.checks import check_comm
from ..core.errors import RankFailedError, ScheduleError
from ..core.ops import OpLike
from ..collectives.partial import (MajorityAllreduce, QuorumAllreduce,
                                   SoloAllreduce)
from ._buckets import (check_order, check_priorities, memory_of,
                       partial_buckets, plan_buckets, prioritise, spec,
                       sync_buckets)
from ._checks import (SYNC_MODES, check_compression_for_mode, check_count,
                      check_mode, check_op, check_predivide, check_seed)
from .agreement import agree_on_setup
from .front import StepInfo


class EagerAverager:
    """Average gradients across the ranks of ``comm``, eager-SGD style.

    Args:
        templates: one array (or ``(shape, dtype)`` pair) per gradient, in an
            order that is the same on every rank.  Device (CuPy) arrays keep
            the whole exchange on that GPU: gradients must then be device
            arrays there too, and the averages come back as device arrays.
        mode: ``"solo"`` (wait-free: the first rank to arrive starts the
            round), ``"majority"`` (a randomly drawn rank starts it, so on
            average half the ranks are fresh), an integer k (quorum: at least
            k fresh ranks per round), ``"sync"`` (partialcoll's full allreduce
            every step: synchronous SGD, the baseline) or ``"sync-mpi"``
            (the same with MPI_Allreduce).  The two sync modes differ only in
            how a waiting rank waits: MPI libraries usually spin, partialcoll
            backs off, which matters when ranks share cores.
        sync_every: every ``sync_every``-th step is a synchronous round (all
            pending gradients applied on every rank).  Every rank must then
            make the same number of steps.  None: never.
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        bucket_bytes: split the fused buffer into buckets of about this many
            bytes, one partial allreduce each (never splitting a gradient);
            ``"solo"`` and ``"sync"`` only.  None: one buffer.  The buffer
            has the widest gradient dtype, at least float32 (float16
            gradients travel as float32), and results come back in it.
        seed: majority mode's seed for drawing initiators.
        names: a name per gradient, used in error messages.
        priorities: a number per gradient, lower = needed sooner by the
            next forward pass (e.g. from :mod:`partialcoll.tictac`'s
            planner); a bucket's messages take its smallest member's number
            and concurrent buckets leave lowest first where a cap on sends
            in flight queues them (:func:`partialcoll.set_send_cap`).
            ``"solo"`` and ``"sync"`` only.  None: all 0 (FIFO).
        partition_bytes: cut every bucket into collectives of at most this
            many bytes (same priority), so a bucket already on the wire
            holds a more urgent one back for one piece at most.
        device: a device (CuPy) array on the GPU the buffers should live on,
            for ``(shape, dtype)`` templates; device templates imply it.
        op: ``"average"`` (the sum over ranks divided by their number) or
            ``"sum"`` (also ``partialcoll.SUM`` or ``MPI.SUM``).
        predivide: Horovod's ``gradient_predivide_factor`` f: gradients are
            divided by f before the sum and the sum by P / f (``"average"``
            only; 1: the sum is divided by P).  The result is the same
            average; f > 1 keeps large sums of low-precision gradients
            from overflowing.
        agree: a dict of a wrapper's own options that must be equal on every
            rank, checked with the rest (one error, on every rank).
        order: the gradients' indices in the order the fused buffer holds
            them (and buckets are cut and launched in): the order backward
            makes them, for :meth:`offer`.  None: index order.
        overlap: start each bucket's reduction as soon as :meth:`offer`
            has handed over all its gradients, instead of in :meth:`reduce`
            (which then packs the rest, starts what is left and waits).
            Buckets start in bucket order on every rank, whatever order the
            gradients come in.  Not with ``"sync-mpi"`` (its
            ``MPI_Allreduce`` blocks).
        compression: None (or ``"none"``) or ``"fp16"``
            (``partialcoll.Compression.fp16``, Horovod's
            ``Compression.fp16``): the buckets travel as float16 and come
            back in their own dtype (see :func:`partialcoll.allreduce`:
            float16's precision, rounded at every combining step; in the
            partial modes a late gradient is also carried to the next
            round as float16, see :class:`partialcoll.SoloAllreduce`).
            Not with ``"sync-mpi"``.

    Creating, :meth:`flush` and :meth:`close` are collective over ``comm``.

    Overlap (a step in parts)::

        avg.offer(i, grad_i)        # as backward makes each gradient
        averaged, info = avg.reduce(grads)   # the rest, then wait for all

    A step whose reductions started but that is given up
    (:meth:`abandon`, or :meth:`flush` with one open): ``"sync"`` starts
    what is left (every rank must run the same collectives) and drops the
    results; a partial mode cannot take back a gradient already deposited
    in a round, so it waits for the rounds started and adds their result
    to this rank's next step (or flush): every gradient is still applied
    exactly once on every rank.
    """

    _created = 0
    last: StepInfo | None       # the latest step's (None before the first)

    def __init__(self, templates: Iterable[Any], mode: str | int = "solo",
                 sync_every: int | None = None,
                 comm: MPI.Comm | None = None,
                 bucket_bytes: int | None = None, seed: int = 0,
                 names: Iterable[str] | None = None, device: Buffer = None,
                 *, priorities: Sequence[float] | None = None,
                 partition_bytes: int | None = None,
                 op: OpLike = "average", predivide: float = 1.0,
                 agree: Mapping[str, Any] | None = None,
                 order: Sequence[int] | None = None, overlap: bool = False,
                 compression: str | None = None) -> None:
        comm = check_comm(comm)
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        lc = libcomm.library_comm(comm)
        # A bad argument on one rank must not leave the others waiting in
        # the agreement below: it is carried into it and raised everywhere.
        try:
            mine = self._read_arguments(
                templates, mode, sync_every, bucket_bytes, seed, names,
                device, priorities, partition_bytes, op, predivide, order,
                overlap, compression)
            mine.update(dict(agree or {}))
            problem = None
        except (ScheduleError, TypeError, ValueError) as e:
            mine, problem = None, e
        agree_on_setup(lc.ctl, mine, problem)
        order, bucket_bytes = mine["order"], mine["bucket_bytes"]
        seed, priorities = mine["seed"], mine["priorities"]
        partition_bytes = mine["partition_bytes"]
        self.comm = comm
        self._lc = lc.acquire()     # its control duplicate, until close()
        self._buckets = plan_buckets(self.specs, bucket_bytes, self._mem,
                                     order)
        self._where = {}            # gradient index -> (bucket index, member)
        for k, b in enumerate(self._buckets):
            for m in b.members:
                self._where[m[0]] = (k, m)
        prioritise(self._buckets, priorities, partition_bytes)
        if self.mode not in SYNC_MODES:
            kw = {"comm": comm, "sync_every": self.sync_every,
                  "compression": self.compression}
            for b in self._buckets:
                for lo, hi in b.parts:
                    part, kw["priority"] = b.send[lo:hi], b.priority
                    if self.mode == "solo":
                        b.colls.append(SoloAllreduce(part, **kw))
                    elif self.mode == "majority":
                        b.colls.append(MajorityAllreduce(part, seed=seed,
                                                         **kw))
                    else:
                        b.colls.append(QuorumAllreduce(part, self.mode, **kw))
        self.steps = 0              # steps taken by this rank
        self.included = 0           # steps whose gradient was in their update
        self.rounds = 0             # rounds applied (flushes included)
        self._active_sum = 0        # sum of NAP over steps
        self.last = None
        self.started_early = 0      # buckets started by offer() so far
        # bucket -> [raw sum, rounds, round]
        self._stash: dict[int, list[Any]] = {}
        self._new_step()
        self.closed = False         # close() was called
        EagerAverager._created += 1
        # creation order, the same on every rank: collective clean-ups
        # (optimizers closed at exit) go through averagers in this order
        self.order = EagerAverager._created

    @property
    def bucket_count(self) -> int:
        """How many buckets the gradients travel in."""
        return len(self._buckets)

    def _read_arguments(self, templates, mode, sync_every, bucket_bytes,
                        seed, names, device, priorities, partition_bytes, op,
                        predivide, order, overlap, compression):
        """Check the arguments on this rank alone and set the attributes
        they give; returns what every rank must agree on (a dict).  Raises
        ScheduleError (see ``__init__``: carried into the agreement)."""
        self.mode = check_mode(mode, self.size)
        self.op = check_op(op)
        self.predivide = check_predivide(predivide, self.op)
        self.compression = check_compression_for_mode(compression, self.mode)
        self.sync_every = check_count(sync_every, "sync_every")
        bucket_bytes = check_count(bucket_bytes, "bucket_bytes")
        seed = check_seed(seed)
        if bucket_bytes is not None and self.mode not in ("solo",) + SYNC_MODES:
            # Each bucket would be its own partial allreduce with its own
            # rounds; a rank whose deposit is stale in one bucket does not
            # arrive there, while it waits for another bucket's round: two
            # such ranks can wait on each other forever.
            raise ScheduleError("bucket_bytes works with 'solo' and 'sync' "
                                "modes only: separate majority/quorum rounds "
                                "per bucket can wait on each other forever")
        templates = list(templates)
        self._mem, self._device = memory_of(
            templates + ([] if device is None else [device]))
        specs = [spec(t) for t in templates]
        if not specs:
            raise ScheduleError("nothing to average: no gradients given")
        self.names = (list(names) if names is not None
                      else [f"grad[{i}]" for i in range(len(specs))])
        if len(self.names) != len(specs):
            raise ScheduleError("names and templates differ in length")
        self.specs = specs
        order = check_order(order, len(specs))
        self.overlap = bool(overlap)
        if self.overlap and self.mode == "sync-mpi":
            raise ScheduleError("overlap: 'sync-mpi' reduces with a blocking "
                                "MPI_Allreduce; use 'sync' to overlap")
        if priorities is not None or partition_bytes is not None:
            check_priorities(self.mode, priorities, partition_bytes, specs)
        return {"gradients": [(n, s, d.str) for n, (s, d) in
                              zip(self.names, self.specs)],
                "memory": self._mem.name,
                "mode": self.mode, "sync_every": self.sync_every,
                "bucket_bytes": bucket_bytes, "seed": seed,
                "priorities": None if priorities is None
                else [int(p) for p in priorities],
                "partition_bytes": partition_bytes,
                "op": self.op, "gradient_predivide_factor": self.predivide,
                "compression": self.compression, "order": order,
                "overlap": self.overlap}

    # -- steps ------------------------------------------------------------
    def reduce(self, grads: Iterable[Buffer]
               ) -> tuple[list[Any], StepInfo]:
        """Contribute this rank's ``grads`` (a list like the templates; None
        for a gradient this step did not produce: it counts as zero) and
        return ``(averaged, info)``: the arrays to apply (fresh arrays,
        shaped like the templates, divided by the world size unless ``op``
        is ``"sum"``) and a :class:`StepInfo`.  With ``overlap``, gradients
        already handed over by :meth:`offer` in this step are not read
        again (their entries may be anything)."""
        self._check_open()
        grads = self._check_grads(grads)
        self._pack_rest(grads)
        self.steps += 1
        if self.overlap:
            res, out = self._finish()
        elif self.mode == "sync":
            self._predivide(self._buckets)
            res, out = None, sync_buckets(self._buckets, self._mem,
                                           self.comm, self.compression)
        elif self.mode in SYNC_MODES:
            self._predivide(self._buckets)
            self._lc.before_collective()
            res, out = None, []
            for b in self._buckets:     # MPI_Allreduce, on a host copy
                r = self._mem.host(b.send).copy()
                self._mpi_allreduce(r)
                out.append(self._mem.from_host(r))
        else:
            self._predivide(self._buckets)
            res, out = partial_buckets(self._buckets, self._mem,
                                        lambda c, part: c.start(part))
        self._new_step()
        if res is None:
            info = StepInfo(self.steps, self.size, True, 1, self.steps - 1)
        else:
            extra = self._take_stash(out)
            info = StepInfo(self.steps, min(r.active for r in res),
                            all(r.included for r in res),
                            max(r.rounds for r in res) + extra[0],
                            max([r.round for r in res] + [extra[1]]))
        self.included += info.included
        self.rounds += info.rounds
        self._active_sum += info.active
        self.last = info
        return self._unpack(out), info

    def offer(self, index: int, grad: Buffer) -> None:
        """``overlap``: hand over gradient ``index`` of this step (an array
        like its template; None: zeros).  It is copied at once; when it
        completes its bucket, that bucket's reduction starts, and so does
        every following bucket already complete (buckets start in bucket
        order on every rank).  :meth:`reduce` ends the step."""
        self._check_open()
        if not self.overlap:
            raise ScheduleError("offer() needs an averager made with "
                                "overlap=True")
        if self._got[index]:
            raise ScheduleError(f"gradient {self.names[index]} was handed "
                                f"over twice in one step")
        self._pack_one(index, grad)
        self.started_early += self._launch_ready()

    @property
    def step_open(self) -> bool:
        """True once this step has begun, when a gradient was handed over
        by :meth:`offer` (its reduction may be running)."""
        return any(self._got)

    def abandon(self, grads: Iterable[Buffer] | None = None) -> bool:
        """Give up the step :meth:`offer` began (see the class docstring:
        ``"sync"`` completes it and drops it, a partial mode adds the
        rounds already started to the next step).  ``grads``: the data for
        the gradients not handed over yet, which ``"sync"`` still has to
        send (None: zeros).  Returns whether a step was open."""
        self._check_open()
        if not self.step_open:
            return False
        if self.mode == "sync":
            grads = self._check_grads(grads if grads is not None else
                                      [None] * len(self.specs))
            self._pack_rest(grads)
            self._finish()
        else:                       # only the rounds already started
            got = self._collect(self._inflight)
            for k, parts in got.items():
                flat = self._flat(parts)
                old = self._stash.get(k)
                rounds = max(r.rounds for r in parts)
                last = max(r.round for r in parts)
                self._stash[k] = [flat, rounds, last] if old is None else \
                    [old[0] + flat, old[1] + rounds, max(old[2], last)]
        self._new_step()
        return True

    def flush(self) -> tuple[list[Any], StepInfo] | None:
        """Collective: a synchronous round that returns everything still
        pending anywhere (every rank's carried gradients and the rounds this
        rank has not applied yet) as ``(averaged, info)``; ``None`` when
        there is nothing to apply on any rank (then every rank gets None,
        so optimizers with state stay in step).  ``"sync"`` mode never has
        anything pending.  A step begun by :meth:`offer` is abandoned
        first (:meth:`abandon`)."""
        self._check_open()
        self.abandon()
        if self.mode in SYNC_MODES:
            return None
        res, out = partial_buckets(self._buckets, self._mem,
                                    lambda c, part: c.flush())
        extra = self._take_stash(out)
        xp = self._mem.xp
        anything = int((extra[0] > 0 or any(r.rounds for r in res)) and
                       any(bool(xp.any(d != 0)) for d in out))
        # no busy-poll for a slow rank
        control.arrive(self._lc.ctl, then_settle=False)
        anything = self._lc.ctl.allreduce(anything, op=MPI.MAX)
        control.settle()
        if not anything:
            return None
        info = StepInfo(0, min(r.active for r in res), True,
                        max(r.rounds for r in res) + extra[0],
                        max([r.round for r in res] + [extra[1]]))
        self.rounds += info.rounds
        return self._unpack(out), info

    def close(self) -> tuple[list[Any], StepInfo] | None:
        """Collective: flush and free.  Returns what :meth:`flush` returns
        (apply it, or pending gradients are lost).  Idempotent."""
        if self.closed:
            return None
        final = self.flush()
        for b in self._buckets:
            for c in b.colls:
                c.close()
        self._lc.release()
        self.closed = True
        return final

    # -- a step in parts ----------------------------------------------------
    def _new_step(self):
        self._got = [False] * len(self.specs)
        self._missing = [len(b.members) for b in self._buckets]
        self._next = 0              # the next bucket to start
        self._inflight = {}         # bucket -> [request per part]
        self._outs = {}             # bucket -> its result buffer (sync)

    def _check_grads(self, grads):
        grads = list(grads)
        if len(grads) != len(self.specs):
            raise ScheduleError(f"expected {len(self.specs)} gradients, got "
                                f"{len(grads)}")
        return grads

    def _checked(self, i, g):
        """Gradient ``i`` as an array to copy from (None: zeros)."""
        if g is None:
            return None
        n, shape = self._where[i][1][2:]
        be = devices.check_place(g, self._mem, self._device,
                                 f"gradient {self.names[i]}", "the templates")
        a = g if be is not None or isinstance(g, np.ndarray) else \
            as_array(g, self.names[i])
        if a.size != n:
            raise ScheduleError(f"gradient {self.names[i]} has {a.size} "
                                f"elements, expected {n} (shape {shape})")
        return a

    def _pack_one(self, i, g, checked=False):
        a = g if checked else self._checked(i, g)
        k, (_, off, n, _) = self._where[i]
        b = self._buckets[k]
        if a is None:
            b.send[off:off + n] = 0
        else:
            b.send[off:off + n] = a.reshape(-1)
        self._got[i] = True
        self._missing[k] -= 1

    def _pack_rest(self, grads):
        """Pack every gradient not handed over yet (all checked first: a
        bad one leaves the step as it was)."""
        rest = [(i, self._checked(i, grads[i]))
                for i, done in enumerate(self._got) if not done]
        for i, a in rest:
            self._pack_one(i, a, checked=True)

    def _predivide(self, buckets):
        """Divide the gradients about to be reduced by the predivide factor
        f and, once the partial modes carried on over fewer ranks than P,
        by S / P as well (S: :attr:`group_size`); the result of their round
        is divided by P / f whenever it is applied (:meth:`_unpack`)."""
        d = self.predivide
        S = self.group_size
        if self.op == "average" and S != self.size:
            d = d * S / self.size
        if d != 1:
            for b in buckets:
                b.send /= d

    def _launch_ready(self):
        """Start every complete bucket from the next one on, in order;
        returns how many started."""
        started = 0
        while self._next < len(self._buckets) and \
                self._missing[self._next] == 0:
            k, b = self._next, self._buckets[self._next]
            self._predivide([b])
            parts = [b.send[lo:hi] for lo, hi in b.parts]
            if self.mode == "sync":
                out = self._outs[k] = self._mem.empty(b.size, b.dtype)
                self._inflight[k] = [
                    iallreduce(x, out[lo:hi], comm=self.comm,
                               priority=b.priority,
                               compression=self.compression)
                    for x, (lo, hi) in zip(parts, b.parts)]
            else:
                self._inflight[k] = [c.start(x)
                                     for c, x in zip(b.colls, parts)]
            self._next += 1
            started += 1
        return started

    def _collect(self, inflight):
        """Wait for the requests; returns {bucket: [result per part]}
        (partial modes) or {bucket: None} (sync)."""
        got = {}
        for k, reqs in inflight.items():
            done = [r.wait() for r in reqs]
            got[k] = None if self.mode == "sync" else done
        return got

    def _flat(self, parts):
        flat = [r.data.reshape(-1) for r in parts]
        return flat[0] if len(flat) == 1 else self._mem.xp.concatenate(flat)

    def _finish(self):
        """Overlap: start what is left (every gradient is packed), wait
        for every bucket; returns (results or None, buffer per bucket)."""
        self._launch_ready()
        got = self._collect(self._inflight)
        if self.mode == "sync":
            return None, [self._outs[k] for k in range(len(self._buckets))]
        res, out = [], []
        for k in range(len(self._buckets)):
            res += got[k]
            out.append(self._flat(got[k]))
        return res, out

    def _take_stash(self, out):
        """Add what abandoned steps left (partial modes) to ``out`` (a raw
        sum per bucket); returns (their rounds, their latest round)."""
        rounds, last = 0, -1
        for k, (flat, n, r) in self._stash.items():
            out[k] = out[k] + flat
            rounds, last = max(rounds, n), max(last, r)
        self._stash = {}
        return rounds, last

    # -- counters ---------------------------------------------------------
    @property
    def mean_active(self) -> float:
        """Average number of active processes (NAP) over the steps so far."""
        return self._active_sum / self.steps if self.steps else 0.0

    def stats(self) -> dict[str, Any]:
        """Counters for logging: steps, included, rounds, mean_active,
        ``started_early`` (buckets whose reduction :meth:`offer` started,
        before :meth:`reduce`: the ones overlapped with backward), and the
        straggler report of the partial collective (partial modes; the
        first bucket's: with several buckets each is its own partial
        allreduce, with its own rounds, and every rank contributes to each
        once per step, so a rank late in one is late in the others unless
        it caught up in between): ``late_share``
        (per rank, the share of rounds its gradients missed and were carried
        into a later one), ``mean_lag`` (per rank, rounds since its last
        fresh gradient, averaged) and ``slowest`` (see
        :meth:`partialcoll.SoloAllreduce.stats`).  A warning is logged once
        when some ranks were late in most of the last 100 rounds."""
        out = {"mode": self.mode, "steps": self.steps,
               "included": self.included, "rounds": self.rounds,
               "mean_active": self.mean_active,
               "started_early": self.started_early}
        coll = next((b.coll for b in self._buckets if b.coll is not None),
                    None)
        if coll is not None and not coll.closed:
            st = coll.stats()
            out.update({k: st[k] for k in ("late_share", "mean_lag",
                                           "slowest")})
        return out

    # -- internals ----------------------------------------------------------
    def _mpi_allreduce(self, r):
        """MPI_Allreduce(SUM) of ``r`` in place, over the library's control
        duplicate: RankFailedError where a rank died."""
        lc = self._lc
        if lc.lost:         # the partial collectives went on without them
            raise RankFailedError(f"rank(s) {', '.join(map(str, lc.lost))} "
                                  f"died: a sync mode cannot carry on",
                                  lc.lost)
        try:
            lc.ctl.Allreduce(MPI.IN_PLACE, r, op=MPI.SUM)
        except MPI.Exception as e:
            if not failures.is_rank_failure(e):
                raise
            raise failures.rank_failure(e, lc.ctl, "eager-SGD's "
                                        "MPI_Allreduce", libcomm.owned()) \
                from e

    @property
    def group_size(self) -> int:
        """How many ranks are averaged over (``size``, or the survivors
        once a rank died, as the partial modes carry on without it): a
        gradient handed over from then on counts 1 / group_size."""
        coll = next((b.coll for b in self._buckets if b.coll is not None),
                    None)
        return self.size if coll is None or coll.closed else coll.size

    def _unpack(self, flat_per_bucket):
        out = [None] * len(self.specs)
        for b, flat in zip(self._buckets, flat_per_bucket):
            # the rest of the division by P: P, never the group size now
            # (gradients handed over after a death were scaled for the
            # survivors, see _predivide): a round of the former group may
            # be applied here after this rank's recovery, elsewhere before
            if self.op == "average":
                flat /= self.size / self.predivide
            for i, off, n, shape in b.members:
                out[i] = flat[off:off + n].reshape(shape)
        return out

    def _check_open(self):
        if self.closed:
            raise ScheduleError("this eager-SGD averager is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
