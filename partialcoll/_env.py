"""Every environment variable partialcoll reads, in one place."""
import os

#: force an allreduce algorithm: "recursive_doubling" or "ring"
ALLREDUCE_ALGORITHM = "PARTIALCOLL_ALLREDUCE_ALGORITHM"
#: messages of at most this many bytes use recursive doubling (default 16384)
ALLREDUCE_THRESHOLD = "PARTIALCOLL_ALLREDUCE_THRESHOLD"
#: longest sleep (microseconds) of a polling progress thread (default 100);
#: read by the C core
POLL_MAX_US = "PARTIALCOLL_POLL_MAX_US"


def get(name, default=None, cast=str):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return cast(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a "
                         f"valid {cast.__name__}") from None
