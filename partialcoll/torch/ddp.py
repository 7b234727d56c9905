"""eager-SGD as a ``DistributedDataParallel`` communication hook
(:class:`EagerHook`, :func:`eager_comm_hook`), for DDP users who keep their
optimizer; the optimizer wrapper is in :mod:`partialcoll.torch.optimizer`."""
from __future__ import annotations

import logging
from typing import Any

import torch
from mpi4py import MPI

from ..core import logs
from ..core.errors import ArgumentTypeError, ScheduleError
from ..eager.agreement import refuse_setup
from ..eager.core import SYNC_MODES, EagerAverager
from ..eager.front import StepInfo
from .params import backward_order, host_view, np_dtype, set_grads
from .overlap import DEFAULT_BUCKET_BYTES

log = logging.getLogger("partialcoll")


class EagerHook:
    """eager-SGD as a ``DistributedDataParallel`` communication hook, for
    DDP users who keep their optimizer as it is::

        ddp = torch.nn.parallel.DistributedDataParallel(
            model, broadcast_buffers=False)       # gloo group; see below
        hook = pct.EagerHook(ddp, mode="solo")
        ddp.register_comm_hook(hook, pct.eager_comm_hook)
        ...                       # train as usual with any optimizer
        hook.close(optimizer)     # collective: pending gradients applied,
                                  # the partial collectives freed

    DDP hands the gradients over bucket by bucket during backward.  The hook
    averages them over MPI in its own buckets (fixed: a parameter order and
    size cap that do not change when DDP rebuilds its buckets after the
    first iteration), gradients in reverse registration order as DDP fills
    its buckets.  With ``overlap`` (default) in ``"solo"`` and ``"sync"``,
    each of its buckets starts its reduction as soon as DDP has handed over
    all its gradients, so communication runs while backward goes on; in
    ``"majority"`` and quorum (one fused round per step) the round starts at
    the last gradient.  DDP reads the results only once backward is over,
    so the futures are completed at its last bucket.  ``overlap=False``:
    everything starts at the last bucket.

    ``mode``, ``sync_every``, ``comm`` and ``seed`` are as for
    :class:`EagerOptimizer`; ``last_step`` and ``stats()`` too.
    ``bucket_bytes``: the hook's bucket cap in ``"solo"`` and ``"sync"``
    (None: DDP's ``bucket_cap_mb``, else 25 MiB).  ``compression``: as for
    :class:`EagerOptimizer` (``pct.Compression.fp16``: float16 on the
    wire; not with ``"sync-mpi"``).

    DDP synchronises the ranks itself at some points, whatever the hook
    does: with ``broadcast_buffers=True`` (DDP's default) and a model with
    buffers (BatchNorm's running statistics), every forward pass starts
    with a broadcast from rank 0, so a fast rank waits for a slow one at
    every step and a partial mode cannot tolerate stragglers (measured: a
    median step of 206 ms against 1.9 ms with the broadcast off).  A
    warning says so when the hook is made for such a model in a mode other
    than sync.  Also: ``find_unused_parameters=True`` (an allreduce of the
    used-parameter map at every backward), ``SyncBatchNorm`` (collectives
    in every forward), and once, the parameter broadcast when DDP is made
    and the bucket rebuild after the first iteration.
    """

    averager: EagerAverager
    overlap: bool
    buckets: int        # DDP buckets in the latest step

    def __init__(self, model: torch.nn.Module, mode: str | int = "solo",
                 sync_every: int | None = None,
                 comm: MPI.Comm | None = None, seed: int = 0, *,
                 bucket_bytes: int | None = None, overlap: bool = True,
                 compression: str | None = None) -> None:
        # A bad argument on one rank must not leave the others waiting in
        # the averager's agreement: refuse_setup() joins it and raises there.
        try:
            module = getattr(model, "module", model)
            if not isinstance(module, torch.nn.Module):
                raise ArgumentTypeError(f"EagerHook takes the DDP model "
                                        f"(or its module), not "
                                        f"{type(model).__name__}")
            if not isinstance(overlap, bool):
                raise ArgumentTypeError(f"overlap must be True or False, "
                                        f"not {overlap!r}")
            given = [(n, p) for n, p in module.named_parameters()
                     if p.requires_grad]
            self._named = sorted(given, key=lambda item: item[0])
            if not self._named:
                raise ScheduleError("the model has no parameter that "
                                    "requires a gradient")
            templates = [(tuple(p.shape), np_dtype(p, n))
                         for n, p in self._named]
        except (ScheduleError, TypeError, ValueError) as e:
            refuse_setup(comm, e)
        self._index = {id(p): i for i, (_, p) in enumerate(self._named)}
        plain = mode.lower() if isinstance(mode, str) else None
        bucketed = plain in ("solo", "sync")
        if bucket_bytes is None and bucketed:
            bucket_bytes = int(getattr(model, "bucket_bytes_cap", 0)) or \
                DEFAULT_BUCKET_BYTES
        names = [n for n, _ in given]
        self.averager = EagerAverager(
            templates, mode, sync_every, comm, bucket_bytes, seed,
            [n for n, _ in self._named],
            order=backward_order(self._named, names),
            overlap=overlap and plain != "sync-mpi", compression=compression)
        self.overlap = self.averager.overlap
        self.buckets = 0              # DDP buckets in the latest step
        self._reset()
        _warn_ddp_sync_points(model, module, self.averager.mode,
                              self.averager.rank)

    def _reset(self):
        self._grads = [None] * len(self._named)
        self._waiting = []            # (bucket buffer, layout, future)

    def _layout(self, bucket):
        out, off = [], 0
        for p in bucket.parameters():
            i = self._index.get(id(p))
            if i is None:
                raise ScheduleError("DDP handed the hook a parameter that "
                                    "its model does not have")
            out.append((i, off, p.numel()))
            off += p.numel()
        return out

    def _on_bucket(self, bucket):
        buf = bucket.buffer()
        layout = self._layout(bucket)
        flat = host_view(buf)
        for i, off, n in layout:
            self._grads[i] = flat[off:off + n]
            if self.overlap:          # starts the buckets it completes
                self.averager.offer(i, self._grads[i])
        fut = torch.futures.Future()
        self._waiting.append((buf, layout, fut))
        if bucket.is_last():
            self.buckets = len(self._waiting)
            try:
                averaged, _ = self.averager.reduce(self._grads)
                for b, lay, f in self._waiting:
                    with torch.no_grad():
                        for i, off, n in lay:
                            b[off:off + n].copy_(torch.from_numpy(
                                averaged[i].reshape(-1)))
                    f.set_result(b)
            finally:
                self._reset()
        return fut

    def flush(self, optimizer: torch.optim.Optimizer) -> StepInfo | None:
        """Collective: average everything still pending and apply it with
        one extra ``optimizer.step()`` (on every rank, or on none).
        Returns the StepInfo or None."""
        return self._apply(self.averager.flush(), optimizer)

    def close(self, optimizer: torch.optim.Optimizer) -> StepInfo | None:
        """Collective: flush (applied with ``optimizer``), then free: one
        synchronous round (the averager's close flushes)."""
        return self._apply(self.averager.close(), optimizer)

    def _apply(self, out, optimizer):
        if out is None:
            return None
        set_grads(self._named, out[0])
        optimizer.step()
        return out[1]

    @property
    def last_step(self) -> StepInfo | None:
        return self.averager.last

    def stats(self) -> dict[str, Any]:
        return self.averager.stats()


def _warn_ddp_sync_points(model, module, mode, rank):
    """Warn when DDP will broadcast buffers at every forward pass (a
    synchronisation point) under a mode meant to tolerate stragglers."""
    # torch >= 2.13 calls it forward_sync_buffers (broadcast_buffers is a
    # deprecated alias)
    on = getattr(model, "forward_sync_buffers",
                 getattr(model, "broadcast_buffers", False))
    if mode in SYNC_MODES or not on:
        return
    buffers = sum(1 for _ in module.buffers())
    if not buffers:
        return
    logs.once(log, rank, logging.WARNING,
              "EagerHook in mode %r on a DistributedDataParallel model with "
              "broadcast_buffers=True and %d buffer(s): DDP broadcasts them "
              "from rank 0 at every forward pass, which makes every rank "
              "wait for the slowest each step, whatever the hook does.  Pass "
              "broadcast_buffers=False (torch >= 2.13: forward_sync_buffers="
              "False) to DistributedDataParallel, and average the buffers "
              "now and then with pct.synchronize_model", mode, buffers)


# Not annotated: DDP's register_comm_hook compares a hook's annotations with
# the objects dist.GradBucket and Future[Tensor] when it registers it (the
# strings of postponed annotations fail that), and evaluating them here
# would need a torch built with torch.distributed to import this module.
# state: an EagerHook; bucket: a dist.GradBucket; returns a Future[Tensor]
def eager_comm_hook(state, bucket):
    """The function to register with ``ddp.register_comm_hook(state, ...)``;
    ``state`` is an :class:`EagerHook`."""
    return state._on_bucket(bucket)
