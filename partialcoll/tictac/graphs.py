"""Worker graphs from real PyTorch models, for the planner (TicTac's
tracing module and time oracle, section 5).

:func:`trace` runs ``torch.fx.symbolic_trace`` on a model and turns its
nodes into a :class:`~partialcoll.tictac.planner.Graph`: one receive
per parameter (or per module holding parameters), one compute op per
node, each compute op after the nodes it reads and the receives of the
parameters it uses.  Op times come from the time oracle of section 5:
each node is run ``repeats`` times (after one warm-up) on the CPU and the
minimum is kept.

Two choices the paper leaves open (both tested):

* ``stream=True`` (default) adds the program order as edges: PyTorch runs
  a forward pass one node after another in the order of the traced code,
  so that order is part of the graph the worker executes.  ``False``
  keeps only the data dependencies (the paper's TensorFlow DAG, whose
  executor may run any ready op).
* Straight-line chains of compute ops are merged (``merge=True``): an op
  whose only input is the previous op, that receives no parameter, and
  whose input has no other user joins that op (times add up).  This
  changes no dependency the planner sees, and keeps the error of timing
  tiny ops one by one from piling up.

torch (and torchvision for :func:`model`) are imported when called, so
this module imports without them.
"""
import logging
import time

from .planner import COMPUTE, RECV, Graph
from ..core.errors import ScheduleError

log = logging.getLogger("partialcoll.tictac")

#: models :func:`model` builds (torchvision architectures without weights,
#: and a transformer block); name -> default input shape (batch 1)
MODELS = {"resnet50": (1, 3, 224, 224), "vgg16": (1, 3, 224, 224),
          "inception_v3": (1, 3, 299, 299), "resnet18": (1, 3, 224, 224),
          "transformer": (1, 128, 512)}


def model(name, batch=8, image=None):
    """(module, example input) for a model of :data:`MODELS`, randomly
    initialised (no download), in eval mode.  ``image`` overrides the
    image side for the convolutional ones (smaller is faster to time)."""
    import torch
    if name not in MODELS:
        raise ScheduleError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    shape = (batch,) + MODELS[name][1:]
    if image is not None and len(shape) == 4:
        shape = shape[:2] + (image, image)
    if name == "transformer":
        m = TransformerBlock(d_model=shape[2])
    else:
        tvm = torchvision_models()
        kw = {"weights": None}
        if name == "inception_v3":
            kw.update(aux_logits=False, init_weights=False)
        m = getattr(tvm, name)(**kw)
    torch.manual_seed(0)
    return m.eval(), torch.randn(*shape)


def torchvision_models():
    """``torchvision.models``.  The model definitions are plain Python;
    when torchvision's compiled operators cannot load (a wheel built for
    another torch, e.g. PyPI's CUDA build beside a CPU torch, fails with
    "operator torchvision::nms does not exist"), the import is retried
    without registering them, which the models here never use."""
    import sys
    import types
    try:
        import torchvision.models as tvm
        return tvm
    except ImportError:
        raise ImportError("the torchvision models need torchvision: pip "
                          "install 'partialcoll[vision]'") from None
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        log.warning("torchvision's operators do not load (%s); using its "
                    "model definitions only", e)
    for name in [m for m in sys.modules if m.startswith("torchvision")]:
        del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = \
        types.ModuleType("torchvision._meta_registrations")
    import torchvision.models as tvm
    return tvm


def _transformer_block():
    import torch
    from torch import nn

    class Block(nn.Module):
        """A pre-norm transformer encoder block (attention + MLP) written
        with plain modules, so torch.fx traces every op."""

        def __init__(self, d_model=512, heads=8, ff=2048):
            super().__init__()
            self.heads = heads
            self.norm1 = nn.LayerNorm(d_model)
            self.norm2 = nn.LayerNorm(d_model)
            self.q, self.k, self.v, self.out = (nn.Linear(d_model, d_model)
                                                for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d_model, ff), nn.Linear(ff, d_model)
            self.act = nn.GELU()

        def forward(self, x):
            b, t, d = x.shape
            h = self.norm1(x)
            q, k, v = (f(h).view(b, t, self.heads, d // self.heads)
                       .transpose(1, 2) for f in (self.q, self.k, self.v))
            att = torch.softmax(q @ k.transpose(-2, -1) /
                                (d // self.heads) ** 0.5, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.out(y)
            return x + self.fc2(self.act(self.fc1(self.norm2(x))))

    return Block


def TransformerBlock(d_model=512, heads=8, ff=2048):   # noqa: N802
    """A transformer encoder block (torch.nn.Module), traceable by fx."""
    return _transformer_block()(d_model, heads, ff)


def _time_nodes(gm, example, repeats):
    """{node name: min seconds over ``repeats`` runs} (one warm-up)."""
    import torch
    import torch.fx

    best = {}

    class Timer(torch.fx.Interpreter):
        def run_node(self, n):
            t0 = time.perf_counter()
            out = super().run_node(n)
            dt = time.perf_counter() - t0
            best[n.name] = min(best.get(n.name, dt), dt)
            return out

    with torch.no_grad():
        Timer(gm).run(example)          # warm-up
        best.clear()
        for _ in range(repeats):
            Timer(gm).run(example)
    return best


def _param_owner(gm, target):
    """(module path, parameter or None) of a get_attr target."""
    import torch
    mod_path, _, attr = target.rpartition(".")
    obj = gm.get_submodule(mod_path) if mod_path else gm
    value = getattr(obj, attr, None)
    return mod_path, value if isinstance(value, torch.nn.Parameter) else None


def trace(module, example, group="module", repeats=5, stream=True,
          merge=True):
    """The worker graph of ``module`` for input ``example``.

    Args:
        module: a torch.nn.Module that torch.fx can trace.
        example: an input tensor (its batch sets the op times).
        group: ``"module"``: one receive per module holding parameters
            (all its tensors travel together); ``"tensor"``: one receive
            per parameter tensor (TensorFlow's granularity).
        repeats: runs per op for the time oracle (minimum kept).
        stream: add program-order edges (see the module docstring).
        merge: merge straight-line chains of compute ops.

    Receives carry ``nbytes`` (the parameters' bytes), time 0 (set one
    with ``graph.with_times(recv_time=lambda op: op.nbytes / rate)``) and
    ``info["params"]``, the parameter names.  Compute ops carry their
    measured time and ``info["nodes"]``, the fx nodes they stand for.
    """
    import torch.fx
    if group not in ("module", "tensor"):
        raise ScheduleError("group must be 'module' or 'tensor'")
    gm = torch.fx.symbolic_trace(module)
    times = _time_nodes(gm, example, repeats)
    g, op_of, recv_of = Graph(), {}, {}

    def receive(key, names, tensors):
        if key not in recv_of:
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            recv_of[key] = g.recv(f"recv:{key}", 0.0, nbytes,
                                  {"params": list(names)})
        return recv_of[key]

    def receives_of(mod_path, named):
        named = list(named)
        if not named:
            return []
        if group == "module":
            full = [f"{mod_path}.{n}" if mod_path else n for n, _ in named]
            return [receive(mod_path or "<root>", full, [p for _, p in named])]
        return [receive(f"{mod_path}.{n}" if mod_path else n,
                        [f"{mod_path}.{n}" if mod_path else n], [p])
                for n, p in named]

    prev = None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        deps = [op_of[a.name] for a in node.all_input_nodes
                if op_of.get(a.name) is not None]
        if node.op == "get_attr":
            mod_path, p = _param_owner(gm, node.target)
            op_of[node.name] = receives_of(
                mod_path, [(node.target.rpartition(".")[2], p)])[0] \
                if p is not None else None
            continue
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            deps += receives_of(node.target, sub.named_parameters())
        if stream and prev is not None:
            deps.append(prev)
        op = g.compute(f"op:{node.name}", times.get(node.name, 0.0), deps,
                       {"nodes": [node.name]})
        op_of[node.name] = prev = op
    log.info("traced %s: %d receives, %d compute ops, %.3f s compute",
             type(module).__name__, len(g.recvs), len(g) - len(g.recvs),
             g.compute_time)
    return merge_chains(g) if merge else g


def merge_chains(graph):
    """A copy of ``graph`` with straight-line chains of compute ops merged:
    op v joins u when v's only dependency is u (a compute op), u has no
    other user, and v receives nothing.  Times add; ``info["nodes"]``
    concatenate."""
    users = [0] * len(graph.ops)
    for op in graph.ops:
        for d in op.deps:
            users[d] += 1
    out, new_of = Graph(), {}
    for op in graph.ops:
        deps = list(dict.fromkeys(new_of[d] for d in op.deps))
        if op.kind == COMPUTE and len(op.deps) == 1:
            (u,) = op.deps
            if graph.ops[u].kind == COMPUTE and users[u] == 1:
                target = out.ops[new_of[u]]
                target.time += op.time
                target.info.setdefault("nodes", []).extend(
                    op.info.get("nodes", []))
                new_of[op.index] = target.index
                continue
        if op.kind == RECV:
            new_of[op.index] = out.recv(op.name, op.time, op.nbytes,
                                        dict(op.info))
        else:
            info = dict(op.info)
            info["nodes"] = list(info.get("nodes", []))
            new_of[op.index] = out.compute(op.name, op.time, deps, info)
    return out


def scale_compute(graph, total):
    """A copy whose compute times are scaled to add up to ``total``
    seconds (same shape: only the unit of time changes)."""
    c = graph.compute_time
    if c <= 0:
        raise ScheduleError("the graph has no compute time to scale")
    f = total / c
    return graph.with_times(compute_time=lambda op: op.time * f)


def parameter_priorities(module, example, method="tic", repeats=1,
                         stream=True):
    """{parameter name: number} from TicTac's planner on ``module`` traced
    with ``example`` (one receive per parameter tensor): lower = needed
    sooner by the forward pass.  ``method``: ``"tic"`` (graph only),
    ``"tac"`` (op times; a receive costs its bytes / 1 GB/s: only the
    ratio to compute matters) or ``"first_use"``.  For
    :class:`partialcoll.torch.EagerOptimizer`'s ``priorities``: gradient
    buckets of the first layers then leave first (ByteScheduler's
    observation: the next forward pass needs them first)."""
    from . import planner
    g = trace(module, example, group="tensor", repeats=repeats, stream=stream)
    if method == "tic":
        numbers = planner.enforcement(planner.tic(g))
    elif method == "tac":
        numbers = planner.tac(
            g.with_times(recv_time=lambda op: op.nbytes / 1e9))
    elif method == "first_use":
        numbers = planner.first_use(g)
    else:
        raise ScheduleError("method must be 'tic', 'tac' or 'first_use'")
    return {r.info["params"][0]: numbers[r.name] for r in g.recvs}
