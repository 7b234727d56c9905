"""Choosing an allreduce algorithm: a documented heuristic that a keyword
or an environment variable overrides."""
from typing import Any

from ..core import env
from ..core.errors import ScheduleError

#: messages up to this many bytes use recursive doubling
DEFAULT_THRESHOLD = 16384
ALGORITHMS = ("recursive_doubling", "ring", "rabenseifner")

_settings: dict[str, Any] = {}


def setting(name, default=None, cast=str):
    """An environment setting of the collectives, read once per process
    (at first use)."""
    if name not in _settings:
        _settings[name] = env.get(name, default, cast)
    return _settings[name]


def check_algorithm(algorithm):
    """``algorithm`` (None: the heuristic's choice), or a ScheduleError."""
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ScheduleError(f"unknown allreduce algorithm {algorithm!r}; "
                            f"choose from {', '.join(ALGORITHMS)}")
    return algorithm


def choose_algorithm(nbytes, count, size, algorithm=None):
    """Pick an algorithm: ``algorithm`` argument, else the
    ``PARTIALCOLL_ALLREDUCE_ALGORITHM`` variable, else recursive doubling up
    to ``PARTIALCOLL_ALLREDUCE_THRESHOLD`` bytes (default 16 KiB); above it
    Rabenseifner when P is a power of two (2 log2 P steps), else the ring
    (2 (P - 1) steps, but no extra full-vector fold step); both need at least
    one element per rank."""
    algo = check_algorithm(algorithm or setting(env.ALLREDUCE_ALGORITHM))
    if algo is not None:
        return algo
    threshold = setting(env.ALLREDUCE_THRESHOLD, DEFAULT_THRESHOLD, int)
    if nbytes <= threshold or count < size:
        return "recursive_doubling"
    return "rabenseifner" if size & (size - 1) == 0 else "ring"


def tmp_size(algorithm, count, size):
    """Elements of scratch space ``algorithm`` needs for ``count``
    elements on ``size`` ranks (two chunks for the ring, else a vector)."""
    return 2 * (count // size + 1) if algorithm == "ring" else count
