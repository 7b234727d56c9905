"""The settings of one parameter-server run (checked up front)."""
import math
import operator
from typing import Any

from ...core import schemas
from ...core.errors import ArgumentTypeError, ScheduleError

MODES = ("mlfabric", "async", "mlfabric-s")
DISTRIBUTIONS = ("algorithm3", "one-copy", "earliest")


def _real(says: str, **bounds: Any) -> dict[str, Any]:
    return {"type": "number", "real": "finite", "says": says, **bounds}


def _none_or(schema: dict[str, Any], says: str) -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, schema], "says": says}


_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0,
                          "says": "an integer >= 0"}
_RANKS: dict[str, Any] = {"anyOf": [_COUNT, {"type": "array", "items": _COUNT,
                                             "uniqueItems": True}],
                          "says": "an integer >= 0, or a list of distinct "
                                  "ranks"}

#: The settings every training loop shares (:func:`check_run`), as a JSON
#: Schema (:mod:`partialcoll.core.schemas`).
RUN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "compute_time": _real("finite seconds >= 0", minimum=0),
        "stragglers": {
            "type": "array", "minItems": 2, "maxItems": 2,
            "says": "a pair (r, s)",
            "prefixItems": [_real("a probability in [0, 1]", minimum=0,
                                  maximum=1),
                            _real("finite and >= 1", minimum=1)]},
        "duration": _none_or(_real("", exclusiveMinimum=0),
                             "None or finite seconds > 0"),
        "max_updates": _none_or({"type": "integer", "minimum": 1},
                                "None or an integer >= 1"),
        "target_loss": _none_or({"type": "number", "real": "not-nan"},
                                "None or a number"),
        "eval_every": _real("finite seconds > 0", exclusiveMinimum=0),
        "monitor_lag": _real("finite seconds >= 0", minimum=0),
        "monitor_window": _real("finite seconds > 0", exclusiveMinimum=0),
        "initial_rate": _real("finite bytes/s > 0", exclusiveMinimum=0),
    },
    "anyOf": [{"properties": {"duration": {"type": "number"}}},
              {"properties": {"max_updates": {"type": "integer"}}}],
    "message": "give duration= (seconds) or {max_updates_name}=",
}


def _rule(when, then, message):
    """If the settings match ``when``, ``then`` must hold; else
    ``message``."""
    return {"if": {"properties": when, "required": list(when)},
            "then": {"properties": {k: {**v, "message": message}
                                    for k, v in then.items()}}}


#: RunConfig's settings: :data:`RUN_SCHEMA`'s and MLfabric's own, with the
#: rules between them.
CONFIG_SCHEMA: dict[str, Any] = {
    **RUN_SCHEMA,
    "properties": {
        **RUN_SCHEMA["properties"],
        "mode": {"enum": list(MODES), "says": f"one of {MODES}"},
        "tau_max": _none_or({"type": "integer", "minimum": 1},
                            "None or an integer >= 1"),
        "aggregators": _RANKS,
        "replica_aggregators": _RANKS,
        "div_max": {"type": "number", "minimum": 0, "real": "not-nan",
                    "says": "a number >= 0"},
        "batch_interval": _real("finite seconds > 0", exclusiveMinimum=0),
        "seed": _COUNT,
        "distributors": _COUNT,
        "distribution": {"enum": list(DISTRIBUTIONS),
                         "says": f"one of {DISTRIBUTIONS}"},
        "checkpoint_every": _none_or({"type": "integer", "minimum": 1},
                                     "None or an integer >= 1"),
        "checkpoint_path": _none_or({"type": "string", "minLength": 1},
                                    "None or a file path"),
    },
    "allOf": [
        _rule({"mode": {"const": "mlfabric"}},
              {"tau_max": {"type": "integer"}},
              "mode 'mlfabric' needs tau_max >= 1"),
        _rule({"replica": {"const": True}},
              {"mode": {"const": "mlfabric"}},
              "a replica needs mode 'mlfabric'"),
        _rule({"distributors": {"type": "integer", "minimum": 1}},
              {"mode": {"not": {"const": "async"}}},
              "distributors need mode 'mlfabric' or 'mlfabric-s' (a plain "
              "asynchronous PS answers every pull itself)"),
        _rule({"checkpoint_every": {"type": "integer"}},
              {"checkpoint_path": {"type": "string"}},
              "checkpoint_every needs checkpoint_path (the file the "
              "server writes)"),
        _rule({"distribution": {"not": {"const": "algorithm3"}}},
              {"distributors": {"minimum": 1}},
              "distribution {distribution!r} needs distributors >= 1 (the "
              "relays that pass the copy on)"),
    ],
}

_NAMES = {("stragglers", 0): "stragglers r (a probability)",
          ("stragglers", 1): "stragglers s (a slow-down factor)"}


class RunConfig:
    """Settings of :func:`~.training.train`, checked when made against
    ``CONFIG_SCHEMA`` (a bad one raises ScheduleError, a ValueError,
    or ArgumentTypeError, a TypeError, naming it).

    Args:
        mode: "mlfabric", "async" or "mlfabric-s" (see ``train``).
        tau_max: the delay bound (mode "mlfabric").
        aggregators: k per batch (an int, drawn, or a list of ranks).
        distributors: k° relays of the model (section 10.3; modes
            "mlfabric" and "mlfabric-s"): pulls that come while the
            server's last copies are still on their way are answered
            together, once those have arrived or the oldest has waited
            ``batch_interval``, over a distribution tree (Algorithm 3 on
            the mirrored links),
            its relays the requesters whose slower link (in or out) the
            monitor reports fastest.  0 (default): the server sends every
            copy.
        distribution: the tree's shape, with ``distributors``:
            "algorithm3" (default, section 10.3: the server sends to each
            relay and to a direct group), "one-copy" (ours: the server
            sends one copy per batch and the relays pass it on, for when
            its outgoing link is the bottleneck) or "earliest" (ours:
            each copy from the server or a relay, whichever would finish
            it first by the monitor's rates, so slow relays are passed
            by); see
            :func:`~partialcoll.mlfabric.scheduler.dyntree.plan_relayed`.
        replica, replica_aggregators, div_max: the replica (5.3).
        batch_interval: seconds between batches (0.1, the paper's).
        compute_time: seconds of emulated compute per step (a DELAY op).
        stragglers: (r, s): a step is s times slower with probability r.
        monitor_lag, monitor_window: the link monitor (0.2 s, 0.5 s).
        initial_rate: bytes/s the scheduler assumes before any measurement.
        duration, max_updates, target_loss: when to stop (the first met).
        eval_every: seconds between loss evaluations at the server.
        seed: aggregator draws and stragglers (a whole number >= 0).
        record_models: keep the server's and the replica's model after
            every commit, with its time, to measure their real divergence
            (``RunResult.replica["max_divergence"]``); costs a model copy
            per commit: for small models.
        checkpoint_every, checkpoint_path: the server saves its model (and
            momentum history) to ``checkpoint_path`` (NumPy's .npy,
            written beside it, flushed to disk, then renamed over it)
            every ``checkpoint_every`` updates applied (modes "mlfabric"
            and "async"), in its loop: the fault tolerance of an MPI
            job, to weigh against a replica.
    """

    def __init__(self, mode="mlfabric", tau_max=None, aggregators=2,
                 replica=False, replica_aggregators=1, div_max=math.inf,
                 batch_interval=0.1, compute_time=0.1, stragglers=(0.0, 1.0),
                 monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8,
                 duration=None, max_updates=None, target_loss=None,
                 eval_every=0.1, seed=0, distributors=0,
                 distribution="algorithm3", record_models=False,
                 checkpoint_every=None, checkpoint_path=None):
        replica = bool(replica)
        values = dict(
            mode=mode, tau_max=tau_max, aggregators=aggregators,
            replica=replica, replica_aggregators=replica_aggregators,
            div_max=div_max, batch_interval=batch_interval,
            compute_time=compute_time, stragglers=stragglers,
            monitor_lag=monitor_lag, monitor_window=monitor_window,
            initial_rate=initial_rate, duration=duration,
            max_updates=max_updates, target_loss=target_loss,
            eval_every=eval_every, seed=seed, distributors=distributors,
            distribution=distribution, checkpoint_every=checkpoint_every,
            checkpoint_path=None if checkpoint_path is None
            else str(checkpoint_path))
        schemas.check(CONFIG_SCHEMA, values, _NAMES)
        tau_max = None if tau_max is None else operator.index(tau_max)
        aggregators = _ranks_or_count(aggregators)
        replica_aggregators = _ranks_or_count(replica_aggregators)
        distributors = operator.index(distributors)
        seed = operator.index(seed)
        r, s = (float(x) for x in stragglers)
        self.mode, self.tau_max = mode, tau_max
        self.aggregators, self.replica = aggregators, bool(replica)
        self.replica_aggregators, self.div_max = replica_aggregators, div_max
        self.batch_interval, self.compute_time = batch_interval, compute_time
        self.stragglers = (r, s)
        self.monitor_lag, self.monitor_window = monitor_lag, monitor_window
        self.initial_rate = float(initial_rate)
        self.duration, self.max_updates = duration, max_updates
        self.target_loss, self.eval_every = target_loss, eval_every
        self.seed, self.distributors = seed, distributors
        self.distribution = distribution
        self.record_models = bool(record_models)
        self.checkpoint_every = None if checkpoint_every is None else \
            operator.index(checkpoint_every)
        self.checkpoint_path = values["checkpoint_path"]

    def __repr__(self):
        return f"RunConfig({self.__dict__!r})"


def check_run(compute_time, stragglers, duration, max_updates, target_loss,
              eval_every, monitor_lag, monitor_window, initial_rate,
              max_name="max_updates"):
    """The settings every training loop here shares, checked alike on
    every rank before any message (``RUN_SCHEMA``); returns
    ``stragglers`` as (r, s)."""
    values = dict(compute_time=compute_time, stragglers=stragglers,
                  duration=duration, max_updates=max_updates,
                  target_loss=target_loss, eval_every=eval_every,
                  monitor_lag=monitor_lag, monitor_window=monitor_window,
                  initial_rate=initial_rate)
    schemas.check(RUN_SCHEMA, values, {**_NAMES, "max_updates": max_name})
    r, s = stragglers
    return float(r), float(s)


def _ranks_or_count(value):
    if isinstance(value, (list, tuple)):
        return [operator.index(r) for r in value]
    return operator.index(value)


def check_seed(seed):
    """A seed for ``numpy.random.default_rng([seed, rank, 7])``: a whole
    number >= 0 (checked on every rank before any message: a bad seed
    raised only on the workers, and the server waited for ever)."""
    return _count(seed, "seed")


def check_real(value, name, low, high=math.inf, open_low=False):
    """A finite real number in [low, high] (or (low, high] with
    ``open_low``); NaN and infinities are refused (an infinite wait or
    interval hung the run)."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name} must be a real number, got "
                                f"{value!r}") from None
    ok = math.isfinite(x) and (x > low if open_low else x >= low) and \
        x <= high
    if not ok:
        lo = f"> {low}" if open_low else f">= {low}"
        hi = "" if high == math.inf else f" and <= {high}"
        raise ScheduleError(f"{name} must be finite, {lo}{hi}; got {value!r}")
    return x


def check_aggregators(value, name):
    """k (a whole number >= 0) or a list of distinct ranks."""
    if isinstance(value, (list, tuple)):
        ranks = [_count(r, name + " (ranks)") for r in value]
        if len(set(ranks)) != len(ranks):
            raise ScheduleError(f"{name} repeat a rank: {list(value)}")
        return ranks
    return _count(value, name)


def _count(value, name):
    """A whole number >= 0 of any integer type (not a bool)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer >= 0, got "
                                f"{value!r}") from None
    if n < 0:
        raise ScheduleError(f"{name} must be >= 0, got {n}")
    return n
