"""partialcoll's logging, fit for a job of P ranks.

The library reports through the ``partialcoll`` logger and its children
(``partialcoll.stragglers``, ``partialcoll.tictac`` ...), and installs a
``NullHandler`` on it: nothing is printed unless the program configures
logging (``logging.basicConfig()``), as with any library.
``PARTIALCOLL_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR`` or a
number) sets the ``partialcoll`` logger's level.  The one exception is a
wait that may never end (:class:`~partialcoll.StallWarning`): where
logging would not show it, it goes through ``warnings``, so a
program that hangs says why.

A fact that is the same on every rank (a straggler report, computed from
numbers every rank shares) is said once, by rank 0 of the communicator it
concerns (:func:`once`); a fact about one rank names the rank
(:func:`for_this_rank`), so P lines of the same text never appear.
"""
import logging

from . import env

LOGGER = "partialcoll"
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR,
           "CRITICAL": logging.CRITICAL}


def level_from_environment(value):
    """The logging level that ``PARTIALCOLL_LOG_LEVEL=value`` asks for."""
    text = value.strip().upper()
    if text in _LEVELS:
        return _LEVELS[text]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {env.LOG_LEVEL}={value!r}: "
                         f"give one of {', '.join(_LEVELS)} or a number") \
            from None


def setup():
    """Once, at import: the ``NullHandler`` and the environment's level."""
    root = logging.getLogger(LOGGER)
    if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
        root.addHandler(logging.NullHandler())
    value = env.get(env.LOG_LEVEL)
    if value is not None:
        root.setLevel(level_from_environment(value))


def shown(logger):
    """Whether a WARNING record of ``logger`` reaches a handler of the
    program's (the library's own ``NullHandler`` does not count), or the
    program silenced such records (a level above WARNING)."""
    if not logger.isEnabledFor(logging.WARNING):
        return True
    c = logger
    while c is not None:
        if any(not isinstance(h, logging.NullHandler) for h in c.handlers):
            return True
        if not c.propagate:
            return False
        c = c.parent
    return False


def world_rank():
    """This process's rank in MPI_COMM_WORLD (0 before MPI starts)."""
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return 0
    return MPI.COMM_WORLD.Get_rank()


def once(logger, rank, level, msg, *args):
    """Log ``msg`` when ``rank`` (this process's rank in the communicator
    the fact concerns) is 0: for what every rank knows alike."""
    if rank == 0:
        logger.log(level, msg, *args)


def for_this_rank(logger, level, msg, *args):
    """Log ``msg`` prefixed with this process's world rank: for what only
    this rank knows."""
    logger.log(level, "rank %d: " + msg, world_rank(), *args)
