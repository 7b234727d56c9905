"""Local gradient accumulation for :class:`partialcoll.torch.EagerOptimizer`
(Horovod's ``backward_passes_per_step``): the gradients of N backward passes
are summed on each rank and reduced once."""
import functools
import weakref

import torch

from ..core.errors import ArgumentTypeError, ScheduleError


class LocalSum:
    """``backward_passes_per_step`` = N: gradients summed on this rank until
    N backward passes since the last reduction.

    Each parameter's post-accumulate-grad hook counts the passes that reached
    it; a ``step()`` counts the most any parameter saw since the previous
    one, at least 1 (gradients set by hand).  So N passes and one
    ``step()`` count N, as do N ``step()`` calls after one pass each."""

    def __init__(self, named, passes):
        self.named, self.passes = named, self.check(passes)
        self.done = 0                   # passes in the local sum
        self.seen = [0] * len(named)    # per parameter, since step()
        self.sums = [None] * len(named)
        # the parameters hold the hooks: a weak reference lets the sums go
        # with the optimizer even if the model lives on
        me = weakref.ref(self)
        self.hooks = [p.register_post_accumulate_grad_hook(
            functools.partial(_count_pass, me, i))
            for i, (_, p) in enumerate(named)]

    @staticmethod
    def check(passes):
        """``backward_passes_per_step`` if valid (an int >= 1, and torch
        >= 2.1 above 1), else a ScheduleError."""
        if isinstance(passes, bool) or not isinstance(passes, int):
            raise ArgumentTypeError(f"backward_passes_per_step must be an "
                                    f"int >= 1, not {passes!r}")
        if passes < 1:
            raise ScheduleError(f"backward_passes_per_step must be an int "
                                f">= 1, not {passes!r}")
        if passes > 1 and not hasattr(torch.Tensor,
                                      "register_post_accumulate_grad_hook"):
            raise ScheduleError("backward_passes_per_step > 1 needs torch "
                                ">= 2.1 (post-accumulate-grad hooks)")
        return passes

    def complete(self, now=False):
        """At a ``step()``: True when the passes reach N (or ``now``): the
        whole sum is then in ``.grad``, ready to reduce.  Else False, after
        adding ``.grad`` to the local sum and clearing it."""
        self.done += max(1, *self.seen)
        self.seen = [0] * len(self.seen)
        if self.done > self.passes and not now:
            done, self.done = self.done, 0
            self._to_grads()
            raise ScheduleError(
                f"{done} backward passes before step(), more than "
                f"backward_passes_per_step={self.passes}: raise it to "
                f"accumulate more passes locally")
        if self.done < self.passes and not now:
            for i, (_, p) in enumerate(self.named):
                if p.grad is not None:
                    if self.sums[i] is None:    # taken over, not copied
                        self.sums[i] = p.grad
                    else:
                        self.sums[i] += p.grad
                    p.grad = None
            return False
        self.done = 0
        self._to_grads()
        return True

    def _to_grads(self):
        for i, (_, p) in enumerate(self.named):
            total, self.sums[i] = self.sums[i], None
            if total is not None:
                if p.grad is not None:
                    total += p.grad
                p.grad = total

    def forget_passes(self):
        """A ``step()`` inside ``skip_synchronize()`` used this rank's
        passes as they were."""
        self.seen = [0] * len(self.seen)

    def drop(self):
        """Forget the passes and the local sum (its step was given up)."""
        self.done = 0
        self.seen = [0] * len(self.seen)
        self.sums = [None] * len(self.sums)

    def remove_hooks(self):
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _count_pass(ref, i, _param):
    local = ref()
    if local is not None:
        local.seen[i] += 1
