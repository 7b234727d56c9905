"""Every environment variable partialcoll reads, in one place."""
import os

#: force an allreduce algorithm: "recursive_doubling" or "ring"
ALLREDUCE_ALGORITHM = "PARTIALCOLL_ALLREDUCE_ALGORITHM"
#: messages of at most this many bytes use recursive doubling (default 16384)
ALLREDUCE_THRESHOLD = "PARTIALCOLL_ALLREDUCE_THRESHOLD"
#: bytes of temporary buffers allreduce's schedule pool may keep in idle
#: schedules (default 64 MiB; least recently used ones are dropped first)
ALLREDUCE_POOL_BYTES = "PARTIALCOLL_ALLREDUCE_POOL_BYTES"
#: longest sleep (microseconds) of a polling progress thread (default 100);
#: read by the C core
POLL_MAX_US = "PARTIALCOLL_POLL_MAX_US"
#: how device buffers reach MPI: "auto" (ask MPI), "cuda-aware", "staged"
GPU_PATH = "PARTIALCOLL_GPU_PATH"
#: staged device messages are copied in pieces of this many bytes (1 MiB)
GPU_CHUNK_BYTES = "PARTIALCOLL_GPU_CHUNK_BYTES"
#: longest sleep (microseconds) of a progress thread whose only outstanding
#: messages are long-lived receives; grows with the time since the last
#: event (default 2000); read by the C core
IDLE_MAX_US = "PARTIALCOLL_IDLE_MAX_US"
#: a TOML file describing an emulated network (partialcoll.network)
NETWORK = "PARTIALCOLL_NETWORK"
#: write a Chrome trace / Perfetto timeline here at exit (partialcoll.timeline)
TIMELINE = "PARTIALCOLL_TIMELINE"
#: sends in flight per destination process (default 0: no cap)
SEND_CAP = "PARTIALCOLL_SEND_CAP"
#: "1": MLfabric's scheduler uses its link model's Python loops even where
#: their C versions (partialcoll.mlfabric.scheduler._linkops) are built
MLFABRIC_PURE_PYTHON = "PARTIALCOLL_MLFABRIC_PURE_PYTHON"


def get(name, default=None, cast=str):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return cast(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a "
                         f"valid {cast.__name__}") from None
