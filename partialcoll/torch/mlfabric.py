"""A torch front end for MLfabric's parameter server: a ``torch.nn.Module``, a loss function,
mini-batches and a ``torch.optim.SGD`` become the model interface of
:func:`~partialcoll.mlfabric.runtime.training.train` (``params``, ``gradient``, ``loss``) and its
:class:`~partialcoll.mlfabric.runtime.optim.SGD`.

What moves is one 1-D float64 buffer: the module's parameters flattened
in ``module.parameters()`` order (:class:`ParamMap`).  A worker copies
the pulled model into its module, runs the loss and torch's backward and
flattens the gradients; the server evaluates the loss with its model
copied in; at the end every rank's module gets the server's final model.

The optimizer: momentum lives at the workers, so that an aggregate is
exactly its members applied one by one
(:mod:`partialcoll.mlfabric.runtime.optim`, the documentation's
MLfabric page).  A ``torch.optim.SGD`` maps onto it: ``lr`` is the
server's step, ``momentum`` each worker's history, ``weight_decay`` is
added to the gradient on the worker (as torch does, before momentum).
Refused, with the reason: other optimizers (Adam and the like keep
per-coordinate state that a sum of several workers' updates cannot
carry), Nesterov, dampening, ``maximize`` and parameter groups with
different settings, and an optimizer whose parameters are not exactly
the module's trainable ones (those with ``requires_grad``: a parameter
of another module, or one of the module's left out, would be trained
differently from what the optimizer says).  Frozen parameters stay as
they are (weight decay skips them, as torch's step does).  Module buffers
(batch-norm statistics) are not trained: each rank keeps its own.

This module needs torch (``pip install partialcoll[torch]``); importing
it without torch raises ImportError.
"""
import numpy as np
import torch

from ..mlfabric.runtime.optim import SGD
from ..core.errors import ArgumentTypeError, ScheduleError


class ParamMap:
    """Where each parameter of a module lives in the flat buffer.

    Example::

        pmap = ParamMap(module)
        flat = pmap.flatten()             # float64, pmap.size elements
        pmap.unflatten(flat * 0.5)        # into the module's parameters
        grad = pmap.flatten_grads()       # zeros where a grad is None
    """

    def __init__(self, module):
        self.params = [p for p in module.parameters()]
        if not self.params:
            raise ScheduleError("the module has no parameters to train")
        for p in self.params:
            if not p.dtype.is_floating_point:
                raise ArgumentTypeError(f"parameter of dtype {p.dtype}: only "
                                        "floating-point parameters can be "
                                        "trained")
        self.numels = [p.numel() for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.numels)])
        self.size = int(self.offsets[-1])

    def flatten(self):
        """The parameters as one float64 array (a copy)."""
        return self._gather([p.detach() for p in self.params])

    def flatten_grads(self):
        """The gradients as one float64 array (zero where None)."""
        return self._gather([p.grad if p.grad is not None else
                             torch.zeros_like(p) for p in self.params])

    def _gather(self, tensors):
        out = np.empty(self.size, dtype=np.float64)
        for t, a, b in zip(tensors, self.offsets[:-1], self.offsets[1:]):
            out[a:b] = t.detach().reshape(-1).cpu().double().numpy()
        return out

    def unflatten(self, flat):
        """Copy ``flat`` (``size`` elements) into the parameters, each in
        its own dtype and device."""
        flat = np.asarray(flat).reshape(-1)
        if flat.size != self.size:
            raise ScheduleError(f"{flat.size} values for {self.size} "
                                "parameters")
        with torch.no_grad():
            for p, a, b in zip(self.params, self.offsets[:-1],
                               self.offsets[1:]):
                p.copy_(torch.from_numpy(flat[a:b]).view(p.shape))


def sgd_from_torch(optimizer, module=None):
    """The mlfabric :class:`~partialcoll.mlfabric.runtime.optim.SGD` for a ``torch.optim.SGD`` (or
    an mlfabric SGD, returned as is), and the weight decay to add to the
    gradients; raises TypeError / ValueError for what cannot be mapped.

    With ``module``, the optimizer's trainable parameters (frozen ones
    it lists are ignored, as torch's step does) must be exactly the
    module's parameters with ``requires_grad``: ValueError otherwise.

    Example::

        opt, wd = sgd_from_torch(torch.optim.SGD(m.parameters(), lr=0.1,
                                                 momentum=0.9), m)
    """
    if isinstance(optimizer, SGD):
        return optimizer, 0.0
    if not isinstance(optimizer, torch.optim.SGD):
        raise ArgumentTypeError(
            f"{type(optimizer).__name__} is not supported: MLfabric's server "
            "applies w -= lr * (sum of updates), which an aggregate of "
            "several workers' updates computes exactly only for SGD with "
            "momentum kept at the workers; use torch.optim.SGD or "
            "partialcoll.mlfabric.SGD")
    settings = {tuple(sorted((k, repr(v)) for k, v in g.items()
                             if k != "params"))
                for g in optimizer.param_groups}
    if len(settings) != 1:
        raise ScheduleError("parameter groups with different settings are not "
                            "supported: the server has one learning rate")
    g = optimizer.param_groups[0]
    for key, ok in (("nesterov", False), ("dampening", 0),
                    ("maximize", False)):
        if g.get(key, ok) != ok:
            raise ScheduleError(f"torch.optim.SGD({key}={g[key]!r}) is not "
                                f"supported (momentum lives at the workers as "
                                f"h <- momentum * h + g)")
    if module is not None:
        _check_owns(optimizer, module)
    lr = float(g["lr"].item() if torch.is_tensor(g["lr"]) else g["lr"])
    return SGD(lr, float(g.get("momentum", 0.0))), \
        float(g.get("weight_decay", 0.0))


def _check_owns(optimizer, module):
    """The optimizer trains exactly the module's trainable parameters."""
    listed = {id(p) for g in optimizer.param_groups for p in g["params"]
              if p.requires_grad}
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    every = {id(p) for p in module.parameters()}
    foreign = listed - every
    missing = trainable - listed
    if foreign or missing:
        said = []
        if foreign:
            said.append(f"{len(foreign)} of its parameters are not the "
                        f"module's")
        if missing:
            said.append(f"{len(missing)} of the module's trainable "
                        f"parameters are not in it")
        raise ScheduleError(
            "the optimizer must own exactly the module's trainable "
            "parameters (requires_grad): " + " and ".join(said) +
            "; build it as torch.optim.SGD(p for p in module.parameters() "
            "if p.requires_grad), or freeze what it should not train")


class TorchModel:
    """A torch module as :func:`~partialcoll.mlfabric.runtime.training.train`'s model.

    Args:
        module: the ``torch.nn.Module``.
        loss_fn: ``loss_fn(module(inputs), targets)`` -> scalar tensor.
        data: ``data(worker, step)`` -> (inputs, targets), or an iterable
            of (inputs, targets) (each rank iterates its own, starting
            again when it ends).
        eval_data: (inputs, targets) the server's loss is evaluated on
            (default: ``data``'s first batch on the server).
        weight_decay: added to the gradient of every trainable
            parameter (w * decay; frozen ones, ``requires_grad=False``,
            stay as they are).

    Example::

        model = TorchModel(net, torch.nn.functional.cross_entropy,
                           lambda worker, step: batch(worker, step))
        res = train(model, SGD(0.1, 0.9), tau_max=6, duration=10)
    """

    def __init__(self, module, loss_fn, data, eval_data=None,
                 weight_decay=0.0):
        self.module, self.loss_fn = module, loss_fn
        self.map = ParamMap(module)
        self.params = self.map.flatten()
        self.weight_decay = float(weight_decay)
        self._decayed = np.concatenate(                 # trainable: 1
            [np.full(p.numel(), float(p.requires_grad))
             for p in self.map.params])
        self._data, self._it = data, None
        self._eval = eval_data

    def batch(self, worker, step):
        """The mini-batch of (worker, step)."""
        if callable(self._data):
            return self._data(worker, step)
        if self._it is None:
            self._it = iter(self._data)
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self._data)
            return next(self._it)

    def gradient(self, params, worker, step):
        """torch's backward on one mini-batch at ``params``."""
        self.map.unflatten(params)
        self.module.zero_grad(set_to_none=True)
        inputs, targets = self.batch(worker, step)
        self.loss_fn(self.module(inputs), targets).backward()
        grad = self.map.flatten_grads()
        if self.weight_decay:
            grad += self.weight_decay * self._decayed * np.asarray(params)
        return grad

    def loss(self, params):
        """The loss on ``eval_data`` at ``params``."""
        if self._eval is None:
            self._eval = self.batch(0, 0)
        self.map.unflatten(params)
        inputs, targets = self._eval
        with torch.no_grad():
            return float(self.loss_fn(self.module(inputs), targets))


def train_torch(module, loss_fn, data, optimizer, comm=None,
                mode="mlfabric", eval_data=None, **settings):
    """:func:`~partialcoll.mlfabric.runtime.training.train` for a torch module; at the end the
    server's final model is copied into ``module`` on every rank.

    Args:
        module, loss_fn, data, eval_data: see :class:`TorchModel`.
        optimizer: a ``torch.optim.SGD`` over exactly the module's
            trainable parameters (see :func:`sgd_from_torch` for what
            maps and what is refused) or a :class:`~partialcoll.mlfabric.runtime.optim.SGD`.
        comm, mode, settings: as for :func:`~partialcoll.mlfabric.runtime.training.train`.
    Returns its :class:`~partialcoll.mlfabric.runtime.training.RunResult`.

    Example::

        net = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.5)
        res = train_torch(net, torch.nn.functional.cross_entropy,
                          lambda w, s: batch(w, s), opt, tau_max=6,
                          aggregators=2, duration=5.0)
        res.losses[-1], res.invariants      # net now holds the model
    """
    from ..mlfabric.runtime.training import train
    sgd, decay = sgd_from_torch(optimizer, module)
    model = TorchModel(module, loss_fn, data, eval_data, decay)
    res = train(model, sgd, comm=comm, mode=mode, **settings)
    model.map.unflatten(res.params)
    return res


__all__ = ["ParamMap", "TorchModel", "sgd_from_torch", "train_torch"]
