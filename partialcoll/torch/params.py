"""The parameters an eager-SGD torch wrapper averages: their names and
orders, checked; gradients as host arrays (or on their GPU) and back.
Shared by :mod:`.optimizer` (the optimizer) and :mod:`.ddp` (DDP's
hook)."""
import collections
import importlib.util
import numbers
import reprlib

import numpy as np
import torch

from ..core.errors import ArgumentTypeError, ScheduleError


NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32,
                torch.float64: np.float64, torch.complex64: np.complex64,
                torch.complex128: np.complex128}


def np_dtype(t, name):
    try:
        return np.dtype(NUMPY_DTYPES[t.dtype])
    except KeyError:
        raise ScheduleError(f"parameter {name} is {t.dtype}: eager-SGD "
                            f"averages float16/32/64 and complex gradients "
                            f"only") from None


def gpu_of(named):
    """The CUDA device every parameter lives on, when CuPy is there to keep
    the exchange on it; else None (gradients go through host memory)."""
    devices = {p.device for _, p in named}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return None
    return next(iter(devices)) if importlib.util.find_spec("cupy") else None


def host_view(t):
    """A NumPy array with ``t``'s data: a view for a contiguous CPU tensor,
    else a host copy.  A sparse tensor (``nn.Embedding(sparse=True)``, say)
    is refused: eager-SGD averages dense gradients only."""
    if t.layout != torch.strided:
        raise ScheduleError(f"a gradient is a {t.layout} tensor: eager-SGD "
                            f"averages dense gradients only (make the layer "
                            f"dense, e.g. nn.Embedding(..., sparse=False))")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        # to(memory_format=...) returns a CPU tensor unchanged: copy here
        t = t.contiguous()
    return t.numpy()


def cupy_stream(cupy, device):
    """torch's current stream on ``device`` as a CuPy stream (CuPy >= 14:
    ``Stream.from_external``, through the CUDA stream protocol; before:
    ``ExternalStream``, deprecated since)."""
    stream = torch.cuda.current_stream(device)
    if hasattr(cupy.cuda.Stream, "from_external") and \
            hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, device.index)


@torch.no_grad()
def set_grads(named, averaged):
    """Set each parameter's .grad to its averaged gradient (a host array)."""
    for (_, p), g in zip(named, averaged):
        t = torch.from_numpy(g) if isinstance(g, np.ndarray) else \
            torch.from_dlpack(g)
        if p.grad is None:
            p.grad = t.to(device=p.device, dtype=p.dtype, copy=True)
        else:
            p.grad.copy_(t)


def priority_numbers(named, priorities):
    """Per-parameter numbers in ``named`` order from {name: number}
    (unnamed: after every named one); None stays None."""
    if priorities is None:
        return None
    if not isinstance(priorities, dict):
        raise ArgumentTypeError(f"priorities must be a dict {{parameter "
                                f"name: number}}, not "
                                f"{type(priorities).__name__}")
    unknown = sorted(set(priorities) - {n for n, _ in named})
    if unknown:
        raise ScheduleError(f"priorities name parameters the optimizer does "
                            f"not average: {unknown[:4]}")
    for n, v in priorities.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ArgumentTypeError(f"priorities: the number of {n} must "
                                    f"be an int, not {v!r}")
    last = max(priorities.values(), default=0) + 1
    return [int(priorities.get(n, last)) for n, _ in named]


def check_named(optimizer, named_parameters):
    """``(named, given, names)``: the (name, parameter) pairs to average,
    sorted by name; their names in registration order; and {id: name} of
    every parameter ``named_parameters`` named (frozen ones too, for error
    messages).  Raises ScheduleError on a malformed or incomplete list."""
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is None:
        named = [(f"param.{i}", p) for i, p in enumerate(opt_params)]
        names = {id(p): n for n, p in named}
    else:
        named = list(named_parameters)
        for item in named:
            if (not isinstance(item, tuple) or len(item) != 2
                    or not isinstance(item[1], torch.Tensor)):
                raise ArgumentTypeError(
                    f"named_parameters must be (name, tensor) pairs, e.g. "
                    f"model.named_parameters(); got {reprlib.repr(item)}")
        counts = collections.Counter(n for n, _ in named)
        dup = sorted(n for n, c in counts.items() if c > 1)
        if dup:
            raise ScheduleError(f"named_parameters repeats names: {dup[:4]}")
        ids = {id(p) for _, p in named}
        missing = [i for i, p in enumerate(opt_params) if id(p) not in ids]
        if missing:
            raise ScheduleError(f"named_parameters does not name "
                                f"{len(missing)} of the optimizer's "
                                f"parameters (indices {missing[:4]})")
        names = {id(p): n for n, p in named}
        opt_ids = {id(p) for p in opt_params}
        named = [(n, p) for n, p in named if id(p) in opt_ids]
    given = [n for n, p in named if p.requires_grad]   # registration order
    named = sorted(((n, p) for n, p in named if p.requires_grad),
                   key=lambda item: item[0])
    if not named:
        raise ScheduleError("the optimizer has no parameter that requires "
                            "a gradient")
    return named, given, names


def backward_order(named, given):
    """Indices into ``named`` (sorted by name) in reverse registration
    order ``given``: roughly the order backward makes the gradients, so
    buckets fill one after another during backward."""
    index = {n: i for i, (n, _) in enumerate(named)}
    return [index[n] for n in reversed(given)]


def forward_order(named, given):
    """A number per parameter of ``named``: its place in registration order
    (the order the next forward pass needs them, first layers first)."""
    place = {n: k for k, n in enumerate(given)}
    return [place[n] for n, _ in named]
