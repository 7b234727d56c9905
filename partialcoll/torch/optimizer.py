"""eager-SGD for PyTorch: wrap any ``torch.optim.Optimizer`` in one line.

::

    import partialcoll.torch as pct
    pct.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), mode="solo")
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.flush()                   # every pending gradient applied everywhere
    pct.synchronize_model(model)  # average the weights across ranks

Gradients of CPU tensors are used in place.  When every parameter is on one
CUDA device and CuPy is installed, ``EagerOptimizer`` keeps the exchange on
that GPU: gradients go to CuPy through DLPack (no copy), the reductions run
on the GPU, and MPI gets device memory (CUDA-aware) or pinned host copies
(staged), see :mod:`partialcoll.core.devices`.  Otherwise, and in ``EagerHook``
and ``synchronize_model``, device tensors are copied to the host and back.
The broadcasts (``broadcast_parameters``, ``broadcast_optimizer_state``)
live in :mod:`partialcoll.torch.broadcast`.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self, overload

import torch
from mpi4py import MPI

from ..core import logs
from ..core.checks import check_comm
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.ops import OpLike
from ..eager.agreement import refuse_setup
from ..eager.core import SYNC_MODES, EagerAverager
from ..eager.front import AveragerFront, StepInfo
from .accumulation import LocalSum
from .overlap import DEFAULT_BUCKET_BYTES, Overlap, hooks_available
from .params import (backward_order, check_named, cupy_stream, forward_order,
                     gpu_of, host_view, np_dtype, priority_numbers, set_grads)

log = logging.getLogger("partialcoll")

def _delegated(name):
    """A property that reads and writes the wrapped optimizer's ``name``;
    while torch's ``Optimizer.__init__`` runs on the wrapper (``_building``)
    it goes to a scratch attribute that is then dropped."""
    scratch = "_scratch_" + name

    def get(self: Any) -> Any:
        if self.__dict__.get("_building"):
            return self.__dict__[scratch]
        return getattr(self.optimizer, name)

    def put(self: Any, value: Any) -> None:
        if self.__dict__.get("_building"):
            self.__dict__[scratch] = value
        else:
            setattr(self.optimizer, name, value)

    return property(get, put, doc=f"The wrapped optimizer's ``{name}`` "
                                  f"(the same object).")


class EagerOptimizer(AveragerFront, torch.optim.Optimizer):
    """eager-SGD around ``optimizer`` (any ``torch.optim.Optimizer``).

    Args:
        optimizer: the optimizer to wrap; it keeps its state and param
            groups (this object shares them, so LR schedulers,
            ``state_dict()`` and ``zero_grad()`` work on either).
        named_parameters: ``model.named_parameters()``: names give every rank
            the same gradient order and readable errors.  It must name every
            parameter the optimizer updates.  None: the optimizer's order.
        mode: ``"solo"``, ``"majority"``, an integer quorum, ``"sync"``
            (a full allreduce every step: synchronous SGD) or
            ``"sync-mpi"`` (the same through ``MPI_Allreduce``).
        sync_every: every n-th step is a synchronous round (then every rank
            must make the same number of steps).  None: never.
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``).
        bucket_bytes: split the fused gradient buffer into buckets of about
            this many bytes (one reduction each), gradients in reverse
            registration order (the order backward makes them).  None: 25
            MiB (DDP's default) in ``"solo"`` and the sync modes, one
            bucket in ``"majority"`` and quorum (which take no other).
        seed: majority mode's seed for drawing initiators.
        priorities: ``{parameter name: number}``, lower = needed sooner by
            the next forward pass, e.g.
            :func:`partialcoll.tictac.graphs.parameter_priorities`
            (TicTac's planner on the traced model); each bucket's messages
            take its most urgent member's number (parameters not named:
            last).  Takes effect on the wire with a cap on sends in flight
            (``pc.set_send_cap(1)``).  ``"solo"`` and ``"sync"`` only.
        partition_bytes: cut buckets into collectives of at most this many
            bytes, so an urgent bucket waits for one piece at most.
        op: ``"average"`` (``pct.Average``, the default) or ``"sum"``
            (``pct.Sum``, ``pc.SUM``, ``MPI.SUM``): apply the gradients'
            average over the ranks or their sum.  Adasum is not supported.
        gradient_predivide_factor: f: gradients are divided by f before the
            sum and the sum by P / f after it (Horovod's; ``"average"``
            only).  The same average, computed with smaller partial sums.
        backward_passes_per_step: N: gradients accumulate locally over N
            backward passes; only then are they reduced and applied.  Both
            of Horovod's loops work: N backward passes then one ``step()``,
            or a ``step()`` after every pass (with or without
            ``zero_grad()``): a ``step()`` before the N-th pass since the
            last reduction adds ``.grad`` to a local sum, clears ``.grad``
            and applies nothing.  More than N passes before a ``step()``
            is an error.  A local sum of fewer than N passes is not part
            of :meth:`flush`: :meth:`synchronize` reduces it whatever its
            count.  Needs torch >= 2.1 for N > 1.
        overlap: start each bucket's reduction during backward, from the
            parameters' post-accumulate-grad hooks, as soon as its last
            gradient is made (on the N-th pass with
            ``backward_passes_per_step``), and wait for them in ``step()``
            / :meth:`synchronize`.  ``"solo"`` and ``"sync"``: bucket by
            bucket; ``"majority"`` and quorum: their one fused round starts
            at the last gradient; ``"sync-mpi"``: never (its
            ``MPI_Allreduce`` blocks).  None (default): on where it can
            be: torch >= 2.1, parameters on the CPU, not ``"sync-mpi"``;
            True: the same, saying on the ``partialcoll`` logger why not
            where it cannot; False: every reduction starts in ``step()``.
            The same on every rank.  With it on, a backward pass that
            reaches a parameter whose gradient already left (two
            ``backward()`` calls before one ``step()`` with
            ``backward_passes_per_step=1``) is an error at ``step()``, as
            in Horovod and DDP.
        compression: None (default) or ``pct.Compression.fp16`` (also
            ``"fp16"``, ``pc.Compression.fp16``; Horovod's
            ``compression=hvd.Compression.fp16``): float gradients travel
            as float16, half the bytes of float32, at float16's precision
            (about 3 significant digits, rounded at every combining step;
            magnitudes beyond 65504 overflow), and are applied in their own
            dtype.  Every mode but ``"sync-mpi"`` (which refuses it); in
            the partial modes a gradient that misses its round is carried
            to the next one as float16.  The same on every rank.

    ``step()`` averages the gradients across ranks (summed over the
    processes, divided by the world size, stale ones included) and then
    calls the wrapped optimizer's ``step()``.  A parameter with no gradient
    in a step contributes zeros; after averaging every parameter has a
    gradient (as in Horovod).  ``last_step`` and ``stats()`` report the
    number of active processes and whether this rank's gradient was
    included.  Creating, :meth:`flush` and :meth:`close` are collective.

    To clip (or inspect) the averaged gradients, Horovod's way::

        opt.synchronize()                 # the averages are now in .grad
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            opt.step()                    # applies them, no second reduction

    The wrapper is an instance of the wrapped optimizer's class too (as in
    Horovod): ``isinstance(pct.EagerOptimizer(torch.optim.SGD(...)),
    torch.optim.SGD)`` holds.

    With ``overlap``, a step that backward began but that is not applied
    (``zero_grad()``, :meth:`flush` or :meth:`close` before ``step()``, a
    ``step()`` inside :meth:`skip_synchronize` without :meth:`synchronize`,
    or the error above) is given up: in ``"sync"`` its reductions are
    completed and dropped; a partial mode cannot take back a gradient
    already in a round, so the rounds are completed and applied at this
    rank's next step (see :meth:`partialcoll.eager.EagerAverager.abandon`).
    """

    averager: EagerAverager
    optimizer: torch.optim.Optimizer
    backward_passes_per_step: int

    def __new__(cls, optimizer: Any = None, *args: Any,
                **kwargs: Any) -> Self:
        if (cls is EagerOptimizer
                and isinstance(optimizer, torch.optim.Optimizer)
                and not isinstance(optimizer, EagerOptimizer)):
            cls = _eager_class(type(optimizer))
        return super().__new__(cls)

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Iterable[tuple[str, torch.Tensor]]
                 | None = None,
                 mode: str | int = "solo", sync_every: int | None = None,
                 comm: MPI.Comm | None = None,
                 bucket_bytes: int | None = None, seed: int = 0, *,
                 priorities: Mapping[str, float] | None = None,
                 partition_bytes: int | None = None, op: OpLike = "average",
                 gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1,
                 overlap: bool | None = None,
                 compression: str | None = None) -> None:
        # A bad argument on one rank must not leave the others waiting in
        # the averager's agreement: refuse_setup() joins it and raises there.
        try:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise ArgumentTypeError(f"EagerOptimizer wraps a "
                                        f"torch.optim.Optimizer, not "
                                        f"{type(optimizer).__name__}")
            if isinstance(optimizer, EagerOptimizer):
                raise ArgumentTypeError("this optimizer is already an "
                                        "EagerOptimizer: use it as it is")
            self.optimizer = optimizer
            named, self._given, self._names = check_named(optimizer,
                                                          named_parameters)
            self._named = named
            for name, p in named:
                if p.is_sparse:
                    raise ScheduleError(f"parameter {name} is sparse; "
                                        f"eager-SGD averages dense gradients "
                                        f"only")
            templates = [(tuple(p.shape), np_dtype(p, n)) for n, p in named]
            passes = LocalSum.check(backward_passes_per_step)
            norm = mode.lower() if isinstance(mode, str) else None
            if bucket_bytes is None and norm in ("solo",) + SYNC_MODES:
                bucket_bytes = DEFAULT_BUCKET_BYTES
            numbers = priority_numbers(named, priorities)
            if numbers is None and norm in ("solo", "sync"):
                numbers = forward_order(named, self._given)
            overlap = self._overlap_wanted(overlap, norm, comm)
        except (ScheduleError, TypeError, ValueError) as e:
            refuse_setup(comm, e)
        self._averaged = {id(p) for _, p in named}
        # not super(): in a class made by _eager_class that is the wrapped
        # optimizer's own __init__, which wants its hyper-parameters.  Its
        # param_groups and state go to scratch attributes (see the
        # properties below) and are dropped: the wrapped optimizer's count.
        self._building = True
        torch.optim.Optimizer.__init__(self, optimizer.param_groups,
                                       optimizer.defaults)
        del self._building
        # set through __dict__ (see _delegated): unknown to type checkers
        del self._scratch_param_groups  # type: ignore[attr-defined]
        del self._scratch_state  # type: ignore[attr-defined]
        self._gpu, device = gpu_of(named), None
        if self._gpu is not None:
            import cupy
            with cupy.cuda.Device(self._gpu.index):
                device = cupy.empty(0)
        self.averager = EagerAverager(
            templates, mode, sync_every, comm, bucket_bytes, seed,
            [n for n, _ in named], device,
            priorities=numbers, partition_bytes=partition_bytes, op=op,
            predivide=gradient_predivide_factor,
            agree={"backward_passes_per_step": passes},
            order=backward_order(named, self._given),
            overlap=overlap, compression=compression)
        self.backward_passes_per_step = passes
        self._local = None if passes == 1 else LocalSum(named, passes)
        self._overlap = None if not overlap else Overlap(
            named, self.averager, self._local, host_view)
        self._synchronized = False      # synchronize() ran since step()
        self._skipping = False          # inside skip_synchronize()
        self._warned = False
        self._warned_abandon = False
        _OPTIMIZERS.add(self)
        self._ready = True

    # param_groups and state are always the wrapped optimizer's current
    # objects: its load_state_dict() (broadcast_optimizer_state(inner), a
    # checkpoint loaded into it) replaces both, and a copy taken once would
    # go stale.
    param_groups = _delegated("param_groups")
    state = _delegated("state")

    def _overlap_wanted(self, overlap, mode, comm):
        """Resolve ``overlap=None/True/False`` (see the class docstring)."""
        if overlap is not None and not isinstance(overlap, bool):
            raise ArgumentTypeError(f"overlap must be None, True or False, "
                                    f"not {overlap!r}")
        if overlap is False:
            return False
        why = None
        if not hooks_available():
            why = "this torch has no post-accumulate-grad hooks (torch < 2.1)"
        elif mode == "sync-mpi":
            why = "'sync-mpi' reduces with a blocking MPI_Allreduce"
        elif any(p.device.type != "cpu" for _, p in self._named):
            why = "the parameters are not all on the CPU"
        if why is None:
            return True
        # the same on every rank: said once, by rank 0
        logs.once(log, check_comm(comm).Get_rank(),
                  logging.WARNING if overlap else logging.DEBUG,
                  "EagerOptimizer: no overlap with backward (%s): every "
                  "reduction starts in step()", why)
        return False

    @property
    def overlap(self) -> bool:
        """Whether reductions start during backward (see ``overlap``)."""
        return self._overlap is not None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_ready", False):
            raise ScheduleError("cannot add a parameter group to an "
                                "EagerOptimizer (its gradients would not be "
                                "averaged): add it to the optimizer before "
                                "wrapping")
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer (its state is this one's)."""
        self.optimizer.load_state_dict(state_dict)

    def _apply(self, averaged):
        set_grads(self._named, averaged)
        self.optimizer.step()

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None
             ) -> float | None:
        """Average the gradients (partial allreduce) and step the wrapped
        optimizer.  Returns the closure's loss, if given.

        After :meth:`synchronize` it applies the gradients already averaged
        (inside :meth:`skip_synchronize`, as Horovod wants it; outside, it
        says so once on the ``partialcoll`` logger: Horovod would reduce
        them a second time).  Inside :meth:`skip_synchronize` without a
        :meth:`synchronize` it applies this rank's gradients as they are,
        like Horovod.  With ``backward_passes_per_step`` N, a call before
        the N-th backward pass only adds the gradients to a local sum."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_extra_pass()
        if not self._skipping and not self._synchronized:
            self._check_grads()
        if self._skipping:
            if not self._synchronized:
                self._abandon(why="skip_synchronize() without "
                                  "synchronize()")
                if self._local is not None:
                    self._local.forget_passes()
        elif self._synchronized:
            if not self._warned:
                self._warned = True
                logs.for_this_rank(
                    log, logging.WARNING, "EagerOptimizer.step() after "
                    "synchronize() outside skip_synchronize(): the gradients "
                    "averaged by synchronize() are applied, not reduced "
                    "again")
        elif self._local is not None and not self._local.complete():
            self._next_step()
            return loss
        else:
            self._reduce_into_grads()
        self._synchronized = False
        self._next_step()
        self.optimizer.step()
        return loss

    def _next_step(self, held=False):
        if self._overlap is not None:
            self._overlap.next_step(held)

    def _check_extra_pass(self):
        """With overlap: a backward pass reached a parameter whose gradient
        had already left.  Complete the step's reductions (every rank runs
        the same collectives), give it up, then raise."""
        extra = None if self._overlap is None else self._overlap.extra
        if extra is None:
            return
        name, count, held = extra
        self._give_up()
        if held:
            raise ScheduleError(
                f"a backward pass reached parameter {name} after "
                f"synchronize() and before step(): with overlap its "
                f"gradient would belong to no step; call step() first")
        raise ScheduleError(
            f"{count} backward passes before step(), more than "
            f"backward_passes_per_step={self.backward_passes_per_step} "
            f"(parameter {name}): with overlap each gradient leaves as "
            f"soon as backward has made it, so the step was given up.  "
            f"Raise backward_passes_per_step to accumulate passes locally, "
            f"or pass overlap=False")

    def _give_up(self):
        """Before raising in ``step()``: complete the step's reductions
        (every rank runs the same collectives) and give it up."""
        self._abandon(warn=False)
        if self._local is not None:
            self._local.drop()
        self._synchronized = False
        self._next_step()

    def _check_grads(self):
        """Before a reduction: refuse, on this rank, a gradient that would
        be applied unaveraged (a parameter left out of the averaged set) or
        averaged as it was before an edit (with overlap); the step is given
        up first (see :meth:`_give_up`)."""
        for g, group in enumerate(self.optimizer.param_groups):
            for k, p in enumerate(group["params"]):
                if p.grad is not None and id(p) not in self._averaged:
                    name = self._names.get(
                        id(p), f"param_groups[{g}]['params'][{k}]")
                    self._give_up()
                    raise ScheduleError(
                        f"parameter {name} has a gradient but is not "
                        f"averaged: it did not require a gradient when the "
                        f"EagerOptimizer was made, or was added to the "
                        f"wrapped optimizer since.  Its update would differ "
                        f"between ranks.  Make a new EagerOptimizer (flush "
                        f"or close this one first) after changing which "
                        f"parameters train, or set its .grad to None")
        edited = [] if self._overlap is None else self._overlap.edited()
        if edited:
            self._give_up()
            raise ScheduleError(
                f"the gradients of {', '.join(edited[:3])}"
                f"{' and more' if len(edited) > 3 else ''} "
                f"changed after backward handed it over for averaging "
                f"(overlap): the reduction under way holds the value "
                f"before the change (clip_grad_norm_, an edit of .grad"
                f"), so the step was given up.  Edit the averages "
                f"instead: opt.synchronize(), then unscale or clip, then "
                f"'with opt.skip_synchronize(): opt.step()' (or "
                f"scaler.step(opt)); or pass overlap=False to average the "
                f"gradients as they are at step()")

    def _abandon(self, warn=True, why="step()"):
        """Give up a step that backward began (see the class docstring)."""
        if self._overlap is None or not self.averager.step_open:
            return False
        if warn and not self._warned_abandon:
            self._warned_abandon = True
            logs.for_this_rank(
                log, logging.WARNING, "EagerOptimizer: %s before the step "
                "that backward began: %s", why,
                "its reductions are completed and dropped"
                if self.averager.mode == "sync" else
                "its gradients are in rounds already; those rounds are "
                "applied at this rank's next step")
        grads = [None if p.grad is None else host_view(p.grad)
                 for _, p in self._named]
        self.averager.abandon(grads)
        if self._local is not None:     # its local sum went with the step
            self._local.drop()
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; with overlap, after a
        backward whose step was not taken, that step is given up first
        (see the class docstring)."""
        if not self._synchronized and self._abandon(why="zero_grad()"):
            self._next_step()
        super().zero_grad(set_to_none)

    def flush(self) -> StepInfo | None:
        """Collective: apply every gradient still pending on any rank, as
        one extra optimizer step on every rank (on none when nothing is
        pending anywhere).  Returns its StepInfo or None.  With overlap, a
        step that backward began and ``step()`` did not take is given up
        first."""
        if self._abandon(why="flush()"):
            self._next_step()
        return super().flush()

    def synchronize(self) -> StepInfo | None:
        """Reduce the gradients now and write their averages into ``.grad``
        (Horovod's ``optimizer.synchronize()``), so they can be clipped or
        inspected before ``step()``; apply them with ``step()`` inside
        :meth:`skip_synchronize`.  With ``backward_passes_per_step`` it
        reduces what has accumulated, however many passes that is.  A
        second call before ``step()`` does nothing.  Collective like
        ``step()`` (in the modes where a step waits for others).  Returns
        the step's :class:`~partialcoll.eager.StepInfo`."""
        if not self._synchronized:
            self._check_extra_pass()
            self._check_grads()
            if self._local is not None:
                self._local.complete(now=True)
            self._reduce_into_grads()
            self._synchronized = True
            self._next_step(held=True)
        return self.averager.last

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[Self]:
        """Context manager: a ``step()`` inside it does not reduce the
        gradients (after :meth:`synchronize` they are reduced already)::

            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with opt.skip_synchronize():
                opt.step()
        """
        self._skipping = True
        try:
            yield self
        finally:
            self._skipping = False

    def close(self) -> StepInfo | None:
        """Collective: flush (applied), then free the communication
        resources and the gradient hooks.  Idempotent."""
        if self.averager.closed:
            return None
        self._abandon(why="close()")
        if self._local is not None:
            self._local.remove_hooks()
        if self._overlap is not None:
            self._overlap.remove_hooks()
        return super().close()

    def _reduce_into_grads(self):
        """One partial allreduce of the gradients; the averages go to
        ``.grad``."""
        if self._gpu is not None:
            self._reduce_on_gpu()
            return
        grads = [None if p.grad is None else host_view(p.grad)
                 for _, p in self._named]
        averaged, _ = self.averager.reduce(grads)
        set_grads(self._named, averaged)

    def _reduce_on_gpu(self):
        """Gradients to CuPy by DLPack, on torch's current stream."""
        import cupy
        with cupy.cuda.Device(self._gpu.index), cupy_stream(cupy, self._gpu):
            grads = [None if p.grad is None else
                     cupy.from_dlpack(p.grad.detach().contiguous())
                     for _, p in self._named]
            averaged, _ = self.averager.reduce(grads)
            set_grads(self._named, averaged)

    @property
    def mode(self) -> str | int:
        return self.averager.mode

    def __repr__(self) -> str:
        return f"EagerOptimizer(mode={self.mode!r}, {self.optimizer!r})"


# __new__ takes (optimizer=None, *args, **kwargs): without this, help(),
# editors and inspect.signature would show that instead of __init__'s (a
# class attribute type checkers do not know of)
EagerOptimizer.__signature__ = (  # type: ignore[attr-defined]
    inspect.signature(EagerOptimizer.__init__).replace(
        parameters=list(inspect.signature(
            EagerOptimizer.__init__).parameters.values())[1:]))

_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def _eager_class(inner):
    """EagerOptimizer that is also an ``inner`` (the wrapped optimizer's
    class), made once per class: Horovod keeps the class of the optimizer
    it wraps, and code checks ``isinstance(opt, torch.optim.SGD)``.
    EagerOptimizer comes first in its MRO, so its methods win; ``inner``'s
    own ``__init__`` and ``step`` are never called on the wrapper."""
    if inner is torch.optim.Optimizer:
        return EagerOptimizer
    cls = _CLASSES.get(inner)
    if cls is None:
        cls = type(f"Eager{inner.__name__}", (EagerOptimizer, inner),
                   {"__module__": __name__, "__doc__": EagerOptimizer.__doc__})
        _CLASSES[inner] = cls
    return cls


_OPTIMIZERS: weakref.WeakSet[EagerOptimizer] = weakref.WeakSet()


def live_optimizers(comm: MPI.Comm) -> list[EagerOptimizer]:
    """Open EagerOptimizers over the ranks of ``comm``, in creation order
    (the same on every rank)."""
    same = (MPI.IDENT, MPI.CONGRUENT)
    live = [o for o in _OPTIMIZERS if not o.averager.closed
            and MPI.Comm.Compare(o.averager.comm, comm) in same]
    return sorted(live, key=lambda o: o.averager.order)
