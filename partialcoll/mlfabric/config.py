"""The settings of one parameter-server run (checked up front)."""
import math
import operator

MODES = ("mlfabric", "async", "mlfabric-s")
DISTRIBUTIONS = ("algorithm3", "one-copy")


class RunConfig:
    """Settings of :func:`~.training.train` (see there for their meaning)."""

    def __init__(self, mode="mlfabric", tau_max=None, aggregators=2,
                 replica=False, replica_aggregators=1, div_max=math.inf,
                 batch_interval=0.1, compute_time=0.1, stragglers=(0.0, 1.0),
                 monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8,
                 duration=None, max_updates=None, target_loss=None,
                 eval_every=0.1, seed=0, distributors=0,
                 distribution="algorithm3"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "mlfabric" and (tau_max is None or tau_max < 1):
            raise ValueError("mode 'mlfabric' needs tau_max >= 1")
        if replica and mode != "mlfabric":
            raise ValueError("a replica needs mode 'mlfabric'")
        distributors = _count(distributors, "distributors")
        if distributors and mode == "async":
            raise ValueError("distributors need mode 'mlfabric' or "
                             "'mlfabric-s' (a plain asynchronous PS answers "
                             "every pull itself)")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, "
                             f"got {distribution!r}")
        if distribution == "one-copy" and not distributors:
            raise ValueError("distribution 'one-copy' needs distributors "
                             ">= 1 (the relays that pass the copy on)")
        aggregators = check_aggregators(aggregators, "aggregators")
        replica_aggregators = check_aggregators(replica_aggregators,
                                                "replica_aggregators")
        if tau_max is not None:
            tau_max = _count(tau_max, "tau_max")
            if tau_max < 1:
                raise ValueError(f"tau_max must be >= 1, got {tau_max}")
        if not div_max >= 0:                     # (NaN fails too)
            raise ValueError(f"div_max must be >= 0, got {div_max!r}")
        if not batch_interval > 0:
            raise ValueError("batch_interval must be > 0")
        r, s = check_run(compute_time, stragglers, duration, max_updates,
                         target_loss, eval_every, monitor_lag,
                         monitor_window, initial_rate)
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

    def __repr__(self):
        return f"RunConfig({self.__dict__!r})"


def check_run(compute_time, stragglers, duration, max_updates, target_loss,
              eval_every, monitor_lag, monitor_window, initial_rate,
              max_name="max_updates"):
    """The settings every training loop here shares, checked alike on
    every rank before any message; returns ``stragglers`` as (r, s)."""
    if duration is None and max_updates is None:
        raise ValueError(f"give duration= (seconds) or {max_name}=")
    if duration is not None and not 0 < duration < math.inf:
        raise ValueError(f"duration must be > 0 seconds, got {duration!r}")
    if max_updates is not None and _count(max_updates, max_name) < 1:
        raise ValueError(f"{max_name} must be >= 1, got {max_updates}")
    if target_loss is not None and math.isnan(target_loss):
        raise ValueError("target_loss must be a number, got nan")
    r, s = stragglers
    if not 0 <= r <= 1 or not s >= 1:
        raise ValueError("stragglers=(r, s): 0 <= r <= 1, s >= 1")
    if not compute_time >= 0 or not eval_every > 0:
        raise ValueError("eval_every > 0; compute_time >= 0")
    if not monitor_lag >= 0 or not monitor_window > 0 or \
            not 0 < initial_rate < math.inf:
        raise ValueError("monitor_lag >= 0, monitor_window > 0 and "
                         "0 < initial_rate < inf")
    return float(r), float(s)


def check_aggregators(value, name):
    """k (a whole number >= 0) or a list of distinct ranks."""
    if isinstance(value, (list, tuple)):
        ranks = [_count(r, name + " (ranks)") for r in value]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{name} repeat a rank: {list(value)}")
        return ranks
    return _count(value, name)


def _count(value, name):
    """A whole number >= 0 of any integer type (not a bool)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer >= 0, got "
                        f"{value!r}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n
