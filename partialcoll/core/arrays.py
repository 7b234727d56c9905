"""What callers pass as data, and what they get back, in one place.

:func:`ingest` turns anything a collective accepts into an array that the
executor can use, zero-copy:

* NumPy arrays and device arrays (CuPy, :func:`~.devices.emulated`): as they
  are;
* mpi4py buffer specs and buffer-protocol objects: a flat NumPy view
  (:func:`~.buffers.as_array`);
* objects exporting DLPack (``__dlpack__``: torch tensors, JAX and other
  array-API arrays): a NumPy view of host memory (``numpy.from_dlpack``), or
  a CuPy array for CUDA memory; bfloat16, which NumPy and CuPy lack, as a
  uint16 view of its bits (read from the DLPack capsule here);
* objects exporting only ``__cuda_array_interface__``: a CuPy array.

Non-contiguous data is refused (a copy would silently not receive results).

Results go back as the caller's type: each ingested object carries an
:class:`ArrayKind`, which makes new arrays of its type (``empty`` of its
array namespace, same dtype and device) or wraps a NumPy/CuPy result
without a copy (its ``from_dlpack``).  NumPy and CuPy arrays and
buffer-protocol objects get arrays back (:data:`ARRAY`).

16-bit floats (float16, :data:`BFLOAT16`) are widened to float32 exactly
(:func:`widen`) and rounded back to nearest even (:func:`narrow`, the
rounding of torch's ``.to(torch.bfloat16)`` and NumPy's ``astype``).

The core modules never import torch: a tensor is recognised by the
protocols it exports, and its namespace is the module it comes from.
"""
import ctypes
import sys

import numpy as np
from mpi4py import MPI

from . import devices
from .buffers import as_array
from .errors import ScheduleError
from .ops import check_op_dtype


class _BFloat16:
    """The bfloat16 dtype, which NumPy has not: stored as uint16 bits."""

    name = str = "bfloat16"
    itemsize, kind = 2, "f"
    storage = np.dtype(np.uint16)

    def __repr__(self):
        return "bfloat16"

    __str__ = __repr__

    def __eq__(self, other):
        return other is self or other == "bfloat16"

    def __hash__(self):
        return hash("bfloat16")

    def __reduce__(self):
        return "BFLOAT16"


BFLOAT16 = _BFloat16()
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)


def is_half(dtype):
    """Whether ``dtype`` is a 16-bit float (reduced through float32)."""
    return dtype is BFLOAT16 or dtype == FLOAT16


class ArrayKind:
    """Makes results of one caller's array type: ``new`` (uninitialised,
    shaped, of the caller's dtype and device) and ``wrap`` (a NumPy/CuPy
    array as that type, without a copy)."""

    def __init__(self, namespace, dtype, device):
        self.namespace, self.dtype, self.device = namespace, dtype, device

    def new(self, shape):
        """(new object, its storage as an array)."""
        obj = self.namespace.empty(tuple(shape), dtype=self.dtype,
                                   device=self.device)
        return obj, ingest(obj, "result").array

    def wrap(self, array):
        return self.namespace.from_dlpack(array)


class _Arrays(ArrayKind):
    """NumPy and device arrays: results are arrays."""

    def __init__(self):
        super().__init__(None, None, None)

    def wrap(self, array):
        return array


ARRAY = _Arrays()


class Data:
    """One ingested object.  ``array``: its data as a NumPy or device array
    (shaped like the object; flat for buffer-protocol objects and specs;
    uint16 bits for bfloat16); ``dtype``: its element type (a NumPy dtype
    or :data:`BFLOAT16`); ``backend``: the device backend (None: host);
    ``kind``: the :class:`ArrayKind` of results for this caller."""

    __slots__ = ("obj", "array", "dtype", "backend", "kind")

    def __init__(self, obj, array, dtype=None, kind=ARRAY):
        self.obj, self.array, self.kind = obj, array, kind
        self.dtype = array.dtype if dtype is None else dtype
        self.backend = devices.backend_of(array)

    @property
    def shape(self):
        return self.array.shape


def ingest(obj, what="buffer"):
    """``obj`` as :class:`Data` (see the module docstring)."""
    if obj is MPI.IN_PLACE:
        raise ScheduleError(f"{what}: MPI.IN_PLACE is not a buffer here")
    if isinstance(obj, np.ndarray) or devices.backend_of(obj) is not None:
        return Data(obj, obj)
    if isinstance(obj, (list, tuple)) and obj and \
            isinstance(obj[-1], MPI.Datatype):
        return Data(obj, as_array(obj, what))
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, what)
    if hasattr(obj, "__cuda_array_interface__"):
        cupy = _cupy(obj, what)
        return Data(obj, _contiguous(cupy.asarray(obj), obj, what))
    return Data(obj, as_array(obj, what))


# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def _from_dlpack(obj, what):
    if getattr(obj, "is_neg", None) is not None and obj.is_neg():
        # DLPack has no negative bit: NumPy and CuPy would read the
        # magnitudes without their sign (torch's z.conj().imag is one)
        raise ScheduleError(f"{what}: this tensor is a lazily negated view "
                            f"(torch's negative bit, e.g. z.conj().imag), "
                            f"which DLPack would read without its sign: "
                            f"pass t.resolve_neg()")
    try:
        device_type = int(obj.__dlpack_device__()[0])
    except (AttributeError, TypeError):
        device_type = _DL_CPU
    kind = _kind_of(obj)
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        cupy = _cupy(obj, what)
        try:
            array, dtype = cupy.from_dlpack(obj), None
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            array, dtype = _bfloat16_bits(obj, cupy), BFLOAT16
            if array is None:
                raise ScheduleError(f"{what}: CuPy cannot take this "
                                    f"{type(obj).__name__} ({e})") from None
        if dtype is None and array.dtype.name == "bfloat16":
            # CuPy with ml_dtypes has a bfloat16 of its own: its bits
            array, dtype = array.view(np.uint16), BFLOAT16
        return Data(obj, _contiguous(array, obj, what), dtype, kind)
    try:
        array, dtype = np.from_dlpack(obj), None
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        array, dtype = _bfloat16_bits(obj), BFLOAT16
        if array is None:
            raise ScheduleError(f"{what}: cannot read this "
                                f"{type(obj).__name__} through DLPack: {e}") \
                from None
    return Data(obj, _contiguous(array, obj, what), dtype, kind)


def _contiguous(array, obj, what):
    if not array.flags.c_contiguous:
        raise ScheduleError(f"{what} must be C-contiguous: pass a contiguous "
                            f"copy (for a torch tensor, .contiguous())")
    return array


def _kind_of(obj):
    """The ArrayKind of a DLPack exporter: its array namespace
    (``__array_namespace__``, else the module its type comes from) when
    that has ``empty`` and ``from_dlpack``; else results are arrays."""
    try:
        namespace = obj.__array_namespace__()
    except AttributeError:
        namespace = sys.modules.get(type(obj).__module__.partition(".")[0])
    if not (hasattr(namespace, "empty") and hasattr(namespace, "from_dlpack")
            and hasattr(obj, "dtype") and hasattr(obj, "device")):
        return ARRAY
    return ArrayKind(namespace, obj.dtype, obj.device)


def _cupy(obj, what):
    try:
        import cupy
    except ImportError:
        raise ScheduleError(f"{what}: this {type(obj).__name__} is in GPU "
                            "memory, which needs CuPy (pip install "
                            "'partialcoll[cuda]')") from None
    return cupy


# ------------------------------------------------- bfloat16 through DLPack
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_BFLOAT = 4


class _Bits:
    """Exposes a DLPack tensor's memory to NumPy (``__array_interface__``)
    and keeps its capsule alive: the capsule, never consumed, calls the
    producer's deleter when the last view of it is gone (the DLPack
    protocol)."""

    def __init__(self, capsule, address, shape, strides):
        self.capsule = capsule
        self.__array_interface__ = {
            "shape": shape, "typestr": np.dtype(np.uint16).str,
            "data": (address, False), "strides": strides, "version": 3}


def _bfloat16_bits(obj, cupy=None):
    """A uint16 view of a bfloat16 tensor's bits (a NumPy array for host
    memory; with ``cupy``, a CuPy array for CUDA memory, since CuPy has no
    bfloat16), or None when ``obj`` is not one.  The capsule is the legacy
    ``dltensor`` one (a DLTensor first in a DLManagedTensor), never
    consumed: the view keeps it, and so the tensor's memory, alive."""
    try:
        capsule = obj.__dlpack__()
        t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    except (BufferError, RuntimeError, TypeError, ValueError):
        return None
    where = (_DL_CUDA, _DL_CUDA_MANAGED) if cupy else (_DL_CPU, _DL_CUDA_HOST)
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (_DL_BFLOAT, 16, 1) \
            or t.device.device_type not in where:
        return None
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else \
        tuple(2 * t.strides[i] for i in range(t.ndim))
    address = (t.data or 0) + t.byte_offset
    if cupy is None:
        return np.asarray(_Bits(capsule, address, shape, strides))
    n = int(np.prod(shape, dtype=np.int64))
    span = 2 * (1 + sum((d - 1) * s // 2 for d, s in
                        zip(shape, strides))) if strides and n else 2 * n
    mem = cupy.cuda.UnownedMemory(address, span, capsule,
                                  int(t.device.device_id))
    return cupy.ndarray(shape, np.uint16, cupy.cuda.MemoryPointer(mem, 0),
                        strides)


# ------------------------------------------------------- 16-bit floats
def widen(array, dtype):
    """A float32 copy of ``array``, whose elements are ``dtype`` (float16,
    or bfloat16 stored as uint16 bits): exact."""
    if dtype is BFLOAT16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def narrow(array, dtype, out=None):
    """float32 ``array`` rounded to nearest even into ``dtype`` (float16,
    or bfloat16 bits), into ``out`` when given (the storage of the
    result: float16, or uint16 for bfloat16); returns the storage array."""
    if dtype is BFLOAT16:
        u = array.view(np.uint32)
        # add 0x7fff plus the lowest kept bit, then truncate: ties go to
        # the even neighbour; a NaN becomes a quiet NaN (0x7fc0)
        bits = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
        bits = np.where((u & 0x7FFFFFFF) > 0x7F800000, np.uint16(0x7FC0),
                        bits)
    else:
        bits = to_float16(array)
    if out is None:
        return bits
    out.reshape(-1)[...] = bits.reshape(-1)
    return out


def to_float16(array):
    """``array`` rounded to float16, to nearest even (beyond 65504: inf,
    float16's rounding, so without NumPy's overflow warning)."""
    with np.errstate(over="ignore"):
        return array.astype(np.float16)


def writeable(array):
    """Whether ``array`` may be written: NumPy's flag; device arrays (CuPy
    has no read-only arrays, and no such flag) always may."""
    return getattr(array.flags, "writeable", True)


def reduced_as(array, given, dtype):
    """``array`` (elements of ``given``; bfloat16 as uint16 bits) as
    ``dtype``, the dtype a partial collective reduces in: the same array
    when they agree, else a converted copy (a 16-bit float widened to
    float32, exactly; anything rounded to float16 under wire
    compression)."""
    if given is not BFLOAT16 and given == dtype:
        return array
    if is_half(given):
        array = widen(array, given)
    return to_float16(array) if dtype == FLOAT16 else array


def deliver(array, dtype, kind):
    """A result for the caller: ``array`` as reduced (of ``dtype`` itself,
    float32 when ``dtype`` is 16-bit, or float16 under wire compression)
    as ``kind``'s type and ``dtype``."""
    if dtype is not BFLOAT16 and array.dtype == dtype:
        return kind.wrap(array)
    if is_half(dtype):
        if array.dtype != FLOAT32:           # float16 -> bfloat16
            array = array.astype(np.float32)
        if kind is ARRAY:
            if dtype is BFLOAT16:
                raise ScheduleError("a bfloat16 result needs an array type "
                                    "that has bfloat16 (e.g. torch)")
            return narrow(array, dtype)
        obj, storage = kind.new(array.shape)
        narrow(array, dtype, out=storage)
        return obj
    if kind is ARRAY:                        # float16 -> wider: exact
        return array.astype(dtype)
    obj, storage = kind.new(array.shape)
    storage[...] = array
    return obj


def check_op(op, dtype):
    """Refuse an op the data's dtype has not (16-bit floats: the float
    ops); ``op`` is an :class:`~.ops.Op`."""
    if is_half(dtype):
        if FLOAT16 not in op.dtypes:
            raise ScheduleError(f"reduction {op.name} is not defined for "
                                f"{dtype}")
        return
    check_op_dtype(op, dtype)
