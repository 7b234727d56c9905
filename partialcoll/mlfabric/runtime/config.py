"""The settings of one parameter-server run (checked up front)."""
import math
import operator
from ...core.errors import ArgumentTypeError, ScheduleError

MODES = ("mlfabric", "async", "mlfabric-s")
DISTRIBUTIONS = ("algorithm3", "one-copy", "earliest")


class RunConfig:
    """Settings of :func:`~.training.train`, checked when made (a bad one
    raises ValueError or TypeError naming it).

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
    """

    def __init__(self, mode="mlfabric", tau_max=None, aggregators=2,
                 replica=False, replica_aggregators=1, div_max=math.inf,
                 batch_interval=0.1, compute_time=0.1, stragglers=(0.0, 1.0),
                 monitor_lag=0.2, monitor_window=0.5, initial_rate=1e8,
                 duration=None, max_updates=None, target_loss=None,
                 eval_every=0.1, seed=0, distributors=0,
                 distribution="algorithm3"):
        if mode not in MODES:
            raise ScheduleError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "mlfabric" and (tau_max is None or tau_max < 1):
            raise ScheduleError("mode 'mlfabric' needs tau_max >= 1")
        if replica and mode != "mlfabric":
            raise ScheduleError("a replica needs mode 'mlfabric'")
        distributors = _count(distributors, "distributors")
        if distributors and mode == "async":
            raise ScheduleError("distributors need mode 'mlfabric' or "
                             "'mlfabric-s' (a plain asynchronous PS answers "
                                "every pull itself)")
        if distribution not in DISTRIBUTIONS:
            raise ScheduleError(f"distribution must be one of {DISTRIBUTIONS}, "
                                f"got {distribution!r}")
        if distribution != "algorithm3" and not distributors:
            raise ScheduleError(f"distribution {distribution!r} needs "
                                f"distributors >= 1 (the relays that pass the "
                                f"copy on)")
        aggregators = check_aggregators(aggregators, "aggregators")
        replica_aggregators = check_aggregators(replica_aggregators,
                                                "replica_aggregators")
        if tau_max is not None:
            tau_max = _count(tau_max, "tau_max")
            if tau_max < 1:
                raise ScheduleError(f"tau_max must be >= 1, got {tau_max}")
        if not div_max >= 0:                     # (NaN fails too)
            raise ScheduleError(f"div_max must be >= 0, got {div_max!r}")
        batch_interval = check_real(batch_interval, "batch_interval", 0,
                                 open_low=True)
        r, s = check_run(compute_time, stragglers, duration, max_updates,
                         target_loss, eval_every, monitor_lag,
                         monitor_window, initial_rate)
        seed = check_seed(seed)
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
        raise ScheduleError(f"give duration= (seconds) or {max_name}=")
    if duration is not None and not 0 < duration < math.inf:
        raise ScheduleError(f"duration must be > 0 seconds, got {duration!r}")
    if max_updates is not None and _count(max_updates, max_name) < 1:
        raise ScheduleError(f"{max_name} must be >= 1, got {max_updates}")
    if target_loss is not None and math.isnan(target_loss):
        raise ScheduleError("target_loss must be a number, got nan")
    try:
        r, s = stragglers
    except (TypeError, ValueError):
        raise ScheduleError(f"stragglers must be a pair (r, s), got "
                            f"{stragglers!r}") from None
    r = check_real(r, "stragglers r (a probability)", 0, high=1)
    s = check_real(s, "stragglers s (a slow-down factor)", 1)
    check_real(compute_time, "compute_time (seconds)", 0)
    check_real(eval_every, "eval_every (seconds)", 0, open_low=True)
    check_real(monitor_lag, "monitor_lag (seconds)", 0)
    check_real(monitor_window, "monitor_window (seconds)", 0, open_low=True)
    check_real(initial_rate, "initial_rate (bytes/s)", 0, open_low=True)
    return float(r), float(s)


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
