"""partialcoll: partial collective operations over MPI.

A C schedule executor (send/recv/reduce/copy/NOP graphs with all-of/any-of
dependencies, consumable ops and self-re-arming persistent schedules, run by
a progress thread that never holds the GIL), and collectives built on it.

Quick start (``mpiexec -n 4 python prog.py``)::

    import numpy as np
    import partialcoll as pc
    total = pc.allreduce(np.ones(10))          # like comm.Allreduce
    req = pc.iallreduce(np.ones(10)); total = req.wait()
    total = pc.allreduce(cupy.ones(10))        # GPU buffers (CuPy)
"""
# mpi4py.MPI first: it initialises MPI (MPI_THREAD_MULTIPLE by default; a
# lower level is refused with ThreadLevelError on first use) and loads the
# libmpi that our extension links against by soname.
from mpi4py import MPI  # noqa: F401

from .core import env, logs  # noqa: E402
from .core.errors import (ArgumentTypeError, DeviceError,  # noqa: E402
                          Error, PartialcollError, RankFailedError,
                          ScheduleBusyError, ScheduleError,
                          ScheduleFreedError, StallWarning,
                          ThreadLevelError, TransportError, WaitTimeout)
from .core.ops import OPS as _OPS, Op, as_op  # noqa: E402
from .core.request import Request  # noqa: E402
from .core.schedule import ALL, ANY, Schedule, Slot  # noqa: E402
from .core.failfast import abort_on_error  # noqa: E402
from .core.failures import fault_tolerance  # noqa: E402
from .core.devices import gpu_path, set_gpu_path  # noqa: E402
from .core.engine import (engine_stats, now,  # noqa: E402
                          progress_thread_cputime, set_send_cap)

SUM, PROD, MIN, MAX = _OPS["SUM"], _OPS["PROD"], _OPS["MIN"], _OPS["MAX"]
LAND, LOR, LXOR = _OPS["LAND"], _OPS["LOR"], _OPS["LXOR"]
BAND, BOR, BXOR = _OPS["BAND"], _OPS["BOR"], _OPS["BXOR"]

from .collectives.allreduce import allreduce, iallreduce  # noqa: E402
from .collectives.staging import Compression  # noqa: E402
from .collectives.partial import (MajorityAllreduce,  # noqa: E402
                                  PartialAllreduce, PartialResult,
                                  QuorumAllreduce, SoloAllreduce,
                                  close_partials, flush_partials,
                                  majority_allreduce, partials,
                                  quorum_allreduce, solo_allreduce)
from .rps import RPSAverage, RPSRound  # noqa: E402
from .loadbalance.allreduce import LoadBalancedAllreduce  # noqa: E402
from . import rps  # noqa: E402
from .transport import network, timeline  # noqa: E402

logs.setup()
set_send_cap(env.get(env.SEND_CAP, 0, int))


__version__ = "0.1.0"
__all__ = ["Schedule", "Slot", "Request", "ALL", "ANY", "Op", "as_op",
           "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR",
           "BXOR", "allreduce", "iallreduce", "Compression",
           "Error", "PartialcollError", "ArgumentTypeError",
           "ScheduleError", "ScheduleBusyError", "ScheduleFreedError",
           "ThreadLevelError", "TransportError", "RankFailedError",
           "WaitTimeout", "StallWarning", "progress_thread_cputime",
           "abort_on_error",
           "fault_tolerance", "SoloAllreduce",
           "MajorityAllreduce",
           "QuorumAllreduce", "PartialAllreduce", "PartialResult",
           "solo_allreduce", "majority_allreduce", "quorum_allreduce",
           "flush_partials", "close_partials", "partials",
           "DeviceError", "gpu_path", "set_gpu_path", "now", "set_send_cap",
           "engine_stats", "timeline", "network", "RPSAverage", "RPSRound",
           "LoadBalancedAllreduce"]
