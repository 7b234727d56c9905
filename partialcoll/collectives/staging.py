"""Allreduce of data that is not a plain array of an executor dtype:
tensors and other DLPack objects, 16-bit floats, and wire compression.

One call::

    sendbuf/recvbuf ──ingest──> arrays (zero-copy views; a torch tensor's
        │                        memory is written in place)
        └─ stage? ──> wire buffers ──allreduce──> finish: into recvbuf's
                                                  memory, or a new object
                                                  of the caller's type

The average (``op="avg"``, :func:`.allreduce.allreduce`) is staged too:
the sum, divided by the number of ranks at the end.

What travels and how results are rounded:

* bfloat16 and float16 (no compression): widened to float32 (exact) into a
  staging buffer of this call, reduced in float32, rounded to the 16-bit
  type once, at the end (nearest even).  The result is, bit for bit,
  ``round16(allreduce_float32(widen(x)))``, where ``allreduce_float32`` is
  what partialcoll computes for float32 data with the same algorithm (the
  same order of combination on every rank).  The wire carries float32:
  twice the 16-bit size.
* ``compression="fp16"``: floating data that is not float16 (float32,
  float64, bfloat16) is rounded to float16 for the wire, reduced in
  float16 (every combining step computes in float and rounds to float16,
  see ``csrc/sched/types.c``) and widened back to its dtype; float16 data
  is reduced as it is.  Other dtypes are not compressed (as Horovod's
  ``Compression.fp16``).  The precision is float16's: about 3 decimal
  digits, rounded at each of the algorithm's combining steps, and values
  beyond 65504 overflow to infinity.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..core import arrays, devices
from ..core.arrays import ARRAY, FLOAT16, FLOAT32, is_half
from ..core.errors import ScheduleError
from ..core.ops import as_op
from ..core.request import Request


class Compression:
    """Wire compression for :func:`partialcoll.allreduce` (Horovod's
    ``Compression``): ``Compression.none`` or ``Compression.fp16``."""

    none = None
    fp16 = "fp16"


def check_compression(compression):
    """None or "fp16" (also accepted: "none")."""
    if compression is None or compression == "none":
        return None
    if compression == Compression.fp16:
        return compression
    raise ScheduleError(f"unknown compression {compression!r}: use None or "
                        "'fp16' (partialcoll.Compression.fp16)")


def plain(sendbuf, recvbuf, compression):
    """Whether this call needs none of this module: NumPy or device arrays
    (or MPI.IN_PLACE / None) of a dtype the executor reduces as it is."""
    if compression is not None:
        return False
    for buf in (sendbuf, recvbuf):
        if buf is None or buf is MPI.IN_PLACE:
            continue
        if not (isinstance(buf, np.ndarray) or
                devices.backend_of(buf) is not None) or buf.dtype == FLOAT16:
            return False
    return True


class Call:
    """One allreduce's buffers: ``send`` and ``recv`` (the arrays the
    executor works on, the same array when in place), ``op``, and
    :meth:`finish` (the caller's result).  Everything is checked before
    anything is staged."""

    def __init__(self, sendbuf, recvbuf, op, compression, divide=None):
        self.op = as_op(op)
        self.divide = divide
        inplace = sendbuf is MPI.IN_PLACE or \
            (sendbuf is recvbuf and sendbuf is not None)
        if inplace and recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        recv = None if recvbuf is None else arrays.ingest(recvbuf, "recvbuf")
        send = recv if inplace else arrays.ingest(sendbuf, "sendbuf")
        self.dtype = dtype = send.dtype
        arrays.check_op(self.op, dtype)
        if divide and not (is_half(dtype) or np.dtype(dtype).kind in "fc"):
            raise ScheduleError(f"the average needs floating-point (or "
                                f"complex) data, not {dtype}: use op=SUM")
        if recv is not None and (recv.dtype is not dtype and
                                 recv.dtype != dtype or
                                 recv.array.size != send.array.size):
            raise ScheduleError(f"recvbuf ({recv.dtype}[{recv.array.size}]) "
                                f"does not match sendbuf "
                                f"({dtype}[{send.array.size}])")
        if recv is None:
            self.result, out = _new_result(send)
        else:
            self.result, out = recvbuf, recv.array
        self._out = _flat(out, "recvbuf")
        if not arrays.writeable(self._out):
            raise ScheduleError("recvbuf is read-only")
        if recv is not None and recv.kind is ARRAY and \
                not isinstance(recvbuf, np.ndarray):
            self.result = out            # as allreduce returns spec views
        self.wire = wire_dtype(dtype, check_compression(compression))
        data = _flat(send.array, "sendbuf")
        if self.wire is None:            # reduced as it is, zero-copy
            self.send, self.recv = (self._out if inplace else data), self._out
        else:
            self.send = arrays.reduced_as(data, dtype, self.wire)
            self.recv = self.send if inplace else np.empty_like(self.send)

    def finish(self):
        """Write the result where the caller expects it (divided by
        ``divide`` for the average: 16-bit floats in float32, so that the
        average is rounded to 16 bits once); return it."""
        n = self.divide
        if self.wire is not None:
            wire = self.recv
            if n and is_half(self.dtype):
                if wire.dtype != FLOAT32:
                    wire = wire.astype(np.float32)
                wire /= n
                n = None
            _from_wire(wire, self.dtype, self._out)
        if n:
            self._out /= n
        return self.result


def _new_result(send):
    """(result object, its storage) shaped like ``send``, of its type."""
    if send.kind is ARRAY:
        a = send.array
        storage = send.dtype.storage if send.dtype is arrays.BFLOAT16 \
            else a.dtype
        out = (send.backend.empty(a.shape, storage) if send.backend
               else np.empty(a.shape, storage))
        return out, out
    return send.kind.new(send.shape)


def _flat(array, what):
    if not array.flags.c_contiguous:
        raise ScheduleError(f"{what} must be C-contiguous (use "
                            "numpy.ascontiguousarray, or .contiguous() for "
                            "a torch tensor)")
    return array.reshape(-1)


def wire_dtype(dtype, compression):
    """The dtype the executor reduces (None: ``dtype`` itself, no staging)."""
    if compression == Compression.fp16 and dtype.kind == "f":
        return None if dtype is not arrays.BFLOAT16 and dtype == FLOAT16 \
            else FLOAT16
    return FLOAT32 if is_half(dtype) else None


def _from_wire(wire_data, dtype, out):
    if is_half(dtype) and wire_data.dtype == FLOAT32:
        arrays.narrow(wire_data, dtype, out=out)
    elif dtype is arrays.BFLOAT16:
        arrays.narrow(wire_data.astype(np.float32), dtype, out=out)
    else:
        out[...] = wire_data                     # float16 -> wider: exact


class CallRequest(Request):
    """The request of a :class:`Call`: once complete, ``wait()``/``test()``
    finish it (once: the 16-bit rounding, or widening from the wire) and
    ``wait()`` returns the caller's result."""

    def __init__(self, request: Request, call: Call) -> None:
        self._request = request
        self._call: Call | None = call
        self._result: Any = None

    def test(self) -> bool:
        if self._call is None:
            return True
        if not self._request.test():
            return False
        self._done()
        return True

    def wait(self, timeout: float | None = None) -> Any:
        if self._call is not None:
            self._request.wait(timeout)
            self._done()
        return self._result

    def _done(self):
        self._result, self._call = self._call.finish(), None
