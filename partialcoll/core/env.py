"""Every environment variable partialcoll reads, in one place.

Each constant below is the variable's name; its comment says what it sets
and its default.  An empty value counts as unset; a value that cannot be
read raises a ValueError naming the variable.
"""
import os

#: Forces the full allreduce's algorithm, ``recursive_doubling``, ``ring``
#: or ``rabenseifner``, for every call that does not name one (default:
#: chosen by message size and process count).
ALLREDUCE_ALGORITHM = "PARTIALCOLL_ALLREDUCE_ALGORITHM"
#: Messages of at most this many bytes use recursive doubling, larger ones
#: Rabenseifner or the ring (default 16384).
ALLREDUCE_THRESHOLD = "PARTIALCOLL_ALLREDUCE_THRESHOLD"
#: Bytes of temporary buffers the full allreduce's pool of idle schedules
#: may keep; the least recently used are dropped first (default 64 MiB).
ALLREDUCE_POOL_BYTES = "PARTIALCOLL_ALLREDUCE_POOL_BYTES"
#: The longest sleep, in microseconds, of a progress thread that polls
#: messages in flight (default 100); read by the C core.
POLL_MAX_US = "PARTIALCOLL_POLL_MAX_US"
#: How device buffers reach MPI, ``auto`` (ask MPI, the default),
#: ``cuda-aware`` or ``staged`` (through pinned host memory).
GPU_PATH = "PARTIALCOLL_GPU_PATH"
#: The size of the pieces a staged device message is copied in (bytes,
#: default 1 MiB).
GPU_CHUNK_BYTES = "PARTIALCOLL_GPU_CHUNK_BYTES"
#: Device buffers of an allreduce up to this many bytes are reduced in
#: pinned host memory on the staged path: one copy out, the allreduce on
#: the host, one copy back (default 256 KiB; 0 turns it off).
GPU_HOST_BYTES = "PARTIALCOLL_GPU_HOST_BYTES"
#: The longest sleep, in microseconds, of a progress thread whose only
#: outstanding messages are long-lived receives; it grows with the time
#: since the last event (default 2000); read by the C core.
IDLE_MAX_US = "PARTIALCOLL_IDLE_MAX_US"
#: A TOML file describing an emulated network, installed when partialcoll
#: is imported (see the emulated networks guide).
NETWORK = "PARTIALCOLL_NETWORK"
#: Records a timeline and writes it to this path, as a Chrome trace /
#: Perfetto file, at exit.
TIMELINE = "PARTIALCOLL_TIMELINE"
#: The most sends in flight per destination process; 0, the default, sets
#: no cap.
SEND_CAP = "PARTIALCOLL_SEND_CAP"
#: The level of the ``partialcoll`` logger: ``DEBUG``, ``INFO``,
#: ``WARNING``, ``ERROR`` or a number (default: unset, logging's own).
LOG_LEVEL = "PARTIALCOLL_LOG_LEVEL"
#: Seconds a majority, quorum or solo call waits for its round before it
#: logs, once per object, which rank or ranks the round waits for and the
#: likely cause (default 10; 0: never).
WAIT_WARN_S = "PARTIALCOLL_WAIT_WARN_S"
#: ``1`` makes MLfabric's scheduler use its link model's Python loops even
#: where their C versions are built (for comparing the two).
MLFABRIC_PURE_PYTHON = "PARTIALCOLL_MLFABRIC_PURE_PYTHON"


def get(name, default=None, cast=str):
    """The value of environment variable ``name`` as ``cast`` gives it, or
    ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return cast(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a "
                         f"valid {cast.__name__}") from None
