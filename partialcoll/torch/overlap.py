"""Overlap of communication with backward for
:class:`partialcoll.torch.EagerOptimizer`: each parameter's
post-accumulate-grad hook hands its gradient to the averager
(:meth:`partialcoll.eager.EagerAverager.offer`) as soon as backward has
made it, and a bucket's reduction starts when its last gradient is in.

Which pass of a step is the one to hand over: with
``backward_passes_per_step`` N (:class:`.accumulation.LocalSum`), the
N-th since the last reduction, counted per parameter (the passes the local
sum already holds, plus those that reached the parameter since the last
``step()``).  A pass that reaches a parameter after its gradient was handed
over (more than N passes before ``step()``, or a backward between
``synchronize()`` and ``step()``) is remembered and reported by ``step()``,
which first completes the step's reductions so that every rank runs the
same collectives.

The hand-over copies the gradient, so a change to ``.grad`` between
backward and ``step()`` (``clip_grad_norm_``, a hand edit) cannot reach a
reduction already under way: each handed-over gradient's tensor and its
``_version`` (torch's counter of in-place changes) are recorded, and
``step()`` refuses a step whose gradients changed since.  GradScaler's
``unscale_`` does not move that counter, so it cannot be seen: with
overlap, unscale the averages (``synchronize()``, ``unscale_``, then
``step()`` inside ``skip_synchronize()``), as the docs' overlap page
shows."""
import functools
import weakref

import torch

DEFAULT_BUCKET_BYTES = 25 << 20     # as DDP's bucket_cap_mb=25


def hooks_available():
    """Whether this torch has post-accumulate-grad hooks (torch >= 2.1)."""
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


class Overlap:
    """Hooks on ``named``'s parameters that hand each gradient to
    ``averager`` (made with ``overlap=True``) once backward has made it;
    ``local``: the optimizer's LocalSum or None; ``host``: a function from
    a tensor to the host array to send."""

    def __init__(self, named, averager, local, host):
        self.named, self.averager = named, averager
        self.local, self.host = local, host
        self.seen = [0] * len(named)    # passes per parameter since step()
        self.extra = None               # (name, passes) of an extra pass
        self.held = False               # after synchronize(), until step()
        # index -> (.grad, its _version) when handed over: a change since
        # (an in-place edit or a new tensor) would be lost, see edited()
        self.handed = {}
        me = weakref.ref(self)
        self.hooks = [p.register_post_accumulate_grad_hook(
            functools.partial(_on_grad, me, i))
            for i, (_, p) in enumerate(named)]

    def on_grad(self, i, p):
        self.seen[i] += 1
        done = self.local.done if self.local is not None else 0
        passes = self.local.passes if self.local is not None else 1
        count = done + self.seen[i]
        if self.held or count > passes:
            if self.extra is None:
                self.extra = (self.named[i][0], count, self.held)
            return
        if count < passes:
            return
        g = p.grad
        if self.local is not None and self.local.sums[i] is not None:
            g = g + self.local.sums[i]      # passes stepped before this one
        self.averager.offer(i, self.host(g))
        self.handed[i] = (p.grad, p.grad._version)

    def edited(self):
        """Names of the parameters whose ``.grad`` changed since it was
        handed over in this step (modified in place, or replaced)."""
        return [self.named[i][0] for i, (g, version) in self.handed.items()
                if self.named[i][1].grad is not g or g._version != version]

    def next_step(self, held=False):
        """After a ``step()`` (``held``: after ``synchronize()``)."""
        self.seen = [0] * len(self.seen)
        self.extra = None
        self.held = held
        self.handed = {}

    def remove_hooks(self):
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _on_grad(ref, i, param):
    me = ref()
    if me is not None:
        me.on_grad(i, param)
