"""Turn what users pass as buffers into NumPy arrays (zero-copy views).

Accepted: NumPy arrays, any C-contiguous buffer-protocol object, and mpi4py
buffer specs ``[buf, MPI.DOUBLE]`` / ``[buf, count, MPI.DOUBLE]``.
"""
from typing import Any, TypeAlias

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from .. import _core
from .errors import ArgumentTypeError, ScheduleError

#: What the public API's annotations call a buffer: a NumPy array, a CuPy
#: array, a torch tensor (or another object exporting DLPack), a
#: buffer-protocol object or an mpi4py buffer spec ``[buf, MPI.DOUBLE]``.
#: Which of them a call takes is checked when it runs (:mod:`.arrays`), not
#: by a type checker: the alias is ``Any``.
Buffer: TypeAlias = Any


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
            raise ArgumentTypeError(
                f"{what} must be a NumPy array, a buffer-protocol object or "
                f"an mpi4py buffer spec [buf, MPI.TYPE]; got "
                f"{type(buf).__name__}") from None
    if not arr.flags.c_contiguous:
        raise ScheduleError(f"{what} must be C-contiguous (use "
                            "numpy.ascontiguousarray)")
    return arr.reshape(-1)


#: ``apart(send, recv)``: whether ``recv`` can take ``send``'s data as it
#: is: both C-contiguous buffers of one format and length, ``recv``
#: writable, their memory apart (the C function itself, no Python frame on
#: the allreduce fast path; never an error: where it says False,
#: :func:`as_array` and the caller's own checks say what is wrong).
apart = _core.apart


def _from_spec(spec, what):
    dtype = dtlib.to_numpy_dtype(spec[-1])
    base = spec[0] if isinstance(spec[0], np.ndarray) else \
        np.asarray(memoryview(spec[0]))
    if not base.flags.c_contiguous:      # reshape(-1) would copy it
        raise ScheduleError(f"{what}: the buffer of an mpi4py buffer spec "
                            "must be C-contiguous (use "
                            "numpy.ascontiguousarray)")
    raw = base.reshape(-1).view(np.uint8)
    if raw.size % dtype.itemsize:
        raise ScheduleError(f"{what}: {raw.size} bytes are not a whole "
                            f"number of {dtype} elements")
    arr = raw.view(dtype)
    if len(spec) == 3:
        count = spec[1]
        if not isinstance(count, (int, np.integer)) or \
                isinstance(count, bool):
            raise ArgumentTypeError(f"{what}: count must be an int >= 0, "
                                    f"got {count!r}")
        if count < 0:
            raise ScheduleError(f"{what}: count must be an int >= 0, got "
                                f"{count!r}")
        count = int(count)
        if count > arr.size:
            raise ScheduleError(f"{what}: count {count} exceeds the buffer "
                                f"({arr.size} elements)")
        arr = arr[:count]
    elif len(spec) != 2:
        raise ScheduleError(f"{what}: buffer spec must be [buf, type] or "
                            "[buf, count, type]")
    return arr
