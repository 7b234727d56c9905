"""Turn what users pass as buffers into NumPy arrays (zero-copy views).

Accepted: NumPy arrays, any C-contiguous buffer-protocol object, and mpi4py
buffer specs ``[buf, MPI.DOUBLE]`` / ``[buf, count, MPI.DOUBLE]``.
"""
import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ._errors import ScheduleError


def as_array(buf, what="buffer"):
    """A 1-D zero-copy NumPy view of ``buf``."""
    if isinstance(buf, np.ndarray):
        arr = buf
    elif isinstance(buf, (list, tuple)) and buf and \
            isinstance(buf[-1], MPI.Datatype):
        arr = _from_spec(buf, what)
    else:
        try:
            arr = np.asarray(memoryview(buf))
        except TypeError:
            raise ScheduleError(f"{what} must be a NumPy array, a buffer-"
                                "protocol object or an mpi4py buffer spec "
                                f"[buf, MPI.TYPE]; got {type(buf).__name__}") from None
    if not arr.flags.c_contiguous:
        raise ScheduleError(f"{what} must be C-contiguous (use "
                            "numpy.ascontiguousarray)")
    return arr.reshape(-1)


def _from_spec(spec, what):
    dtype = dtlib.to_numpy_dtype(spec[-1])
    raw = np.asarray(memoryview(spec[0])).reshape(-1).view(np.uint8) \
        if not isinstance(spec[0], np.ndarray) else spec[0].reshape(-1).view(np.uint8)
    arr = raw.view(dtype)
    if len(spec) == 3:
        count = int(spec[1])
        if count > arr.size:
            raise ScheduleError(f"{what}: count {count} exceeds the buffer "
                                f"({arr.size} elements)")
        arr = arr[:count]
    elif len(spec) != 2:
        raise ScheduleError(f"{what}: buffer spec must be [buf, type] or "
                            "[buf, count, type]")
    return arr
