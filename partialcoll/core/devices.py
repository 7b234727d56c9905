"""Device (GPU) buffers: recognising them, and what the executor needs of them.

A *backend* recognises its own arrays and gives the executor what it needs:
a pointer, a stream, the reduction kernels, pinned host memory to stage
through.  Two backends:

* ``cupy`` -- ``cupy.ndarray`` (and, through DLPack, torch CUDA tensors in
  the eager-SGD wrappers).  Used only when the program imported CuPy; CuPy
  stays an optional extra (``pip install "partialcoll[cuda]"``).
* ``emulate`` -- :func:`emulated` arrays: host memory that the executor treats
  as device memory (device queue, staging copies, no host reductions), with
  device work run late and a little at a time.  It exists so that every
  device code path can be tested on machines with no GPU; it is not faster
  than host buffers.

Which MPI path device buffers take (:func:`gpu_path`):

* ``"cuda-aware"`` -- device pointers go to MPI directly (no host copies);
* ``"staged"`` -- each message is copied through pinned host memory by COPY
  ops inside the schedule, in pieces of ``PARTIALCOLL_GPU_CHUNK_BYTES``
  (default 1 MiB) so that copying one piece overlaps sending another.
  An allreduce of at most ``PARTIALCOLL_GPU_HOST_BYTES`` (256 KiB) is
  reduced in pinned host memory instead: one copy out, the allreduce on the
  host, one copy back (a few device operations, not a few per step); a
  blocking one does this on the calling thread
  (:mod:`partialcoll.collectives.allreduce`).

The default, ``"auto"``, asks MPI (``MPIX_Query_cuda_support``); the MPI
wheels on PyPI say no.  ``PARTIALCOLL_GPU_PATH`` or :func:`set_gpu_path`
forces either path.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np

from .. import _core
from . import env
from .buffers import as_array
from .errors import ScheduleError

_C = _core.constants()
PATHS = ("auto", "cuda-aware", "staged")
DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_HOST_BYTES = 256 << 10
_forced_path: str | None = None


def set_gpu_path(path: str | None) -> None:
    """Force how device buffers reach MPI: ``"cuda-aware"``, ``"staged"`` or
    ``"auto"`` (ask MPI); None goes back to ``PARTIALCOLL_GPU_PATH``.
    Applies to schedules built afterwards."""
    global _forced_path
    if path is not None and path not in PATHS:
        raise ScheduleError(f"gpu path must be one of {', '.join(PATHS)}, "
                            f"got {path!r}")
    _forced_path = path


def gpu_path() -> str:
    """The path device buffers take now: ``"cuda-aware"`` or ``"staged"``."""
    path = _forced_path or env.get(env.GPU_PATH, "auto")
    if path not in PATHS:
        raise ScheduleError(f"{env.GPU_PATH}={path!r}: choose from "
                            f"{', '.join(PATHS)}")
    if path == "auto":
        path = "cuda-aware" if mpi_cuda_aware() else "staged"
    return path


def mpi_cuda_aware() -> bool:
    """True when the MPI library reports CUDA support
    (``MPIX_Query_cuda_support``); False when it says no or cannot say."""
    return _core.mpi_cuda_aware() == 1


def host_bytes() -> int:
    """Largest staged allreduce of device buffers reduced in pinned host
    memory (``PARTIALCOLL_GPU_HOST_BYTES``; 0: none)."""
    n = env.get(env.GPU_HOST_BYTES, DEFAULT_HOST_BYTES, int)
    if n < 0:
        raise ScheduleError(f"{env.GPU_HOST_BYTES} must be 0 or more")
    return n


def reduced_on_host(nbytes: int) -> bool:
    """Whether an allreduce of ``nbytes`` of device buffers is reduced in
    pinned host memory: the staged path, and at most
    ``PARTIALCOLL_GPU_HOST_BYTES``."""
    return nbytes <= host_bytes() and gpu_path() == "staged"


def chunk_bytes() -> int:
    """Size of the pieces a staged message is cut into."""
    n = env.get(env.GPU_CHUNK_BYTES, DEFAULT_CHUNK_BYTES, int)
    if n < 1:
        raise ScheduleError(f"{env.GPU_CHUNK_BYTES} must be positive")
    return n


# --------------------------------------------------------------- emulation
class EmulatedArray(np.ndarray):
    """Host memory that partialcoll treats as device memory (tests only)."""


def emulated(array):
    """A C-contiguous copy of ``array`` that partialcoll treats as a device
    buffer (see the module docstring)."""
    return np.array(array, order="C", copy=True).view(EmulatedArray)


class _EmulatedBackend:
    name = "emulate"
    code = _C["DEV_EMULATE"]
    xp = np

    def owns(self, x):
        return isinstance(x, EmulatedArray)

    def device_id(self, x):
        return 0

    def ptr(self, a):
        return a.ctypes.data

    def empty(self, shape, dtype):
        return np.empty(shape, dtype).view(EmulatedArray)

    def full(self, shape, value, dtype):
        return np.full(shape, value, dtype).view(EmulatedArray)

    def pinned(self, n, dtype):
        return np.empty(n, dtype)

    def new_stream(self, device_id):
        return None

    def stream_ptr(self, stream):
        return 0

    def context(self, device_id):
        return 0

    def kernels(self, device_id):
        return b""

    def wait_for_caller(self, stream):
        """Order `stream` after the work the caller queued so far."""

    def caller_waits(self, stream):
        """Order the caller's later work after `stream`'s work so far."""

    def on(self, stream):
        return contextlib.nullcontext()

    def host(self, a):
        return np.asarray(a).view(np.ndarray)

    def from_host(self, a):
        return np.array(a).view(EmulatedArray)

    def copy_to_host(self, a, out):
        """``out[...] = a`` (``a`` C-contiguous, of ``out.size`` elements;
        ``out``: pinned host memory), finished when it returns."""
        out[...] = a.reshape(-1)

    def copy_from_host(self, h, a):
        """``a[...] = h`` (the same shapes as :meth:`copy_to_host`),
        finished when it returns."""
        a.reshape(-1)[...] = h


# -------------------------------------------------------------------- cupy
class _CupyBackend:
    name = "cupy"
    code = _C["DEV_CUDA"]

    def __init__(self, cupy):
        self.xp = cupy
        self._kernels = {}          # device id -> (RawModule, table bytes)

    def owns(self, x):
        return isinstance(x, self.xp.ndarray)

    def device_id(self, x):
        return x.device.id

    def ptr(self, a):
        return a.data.ptr

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype)

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype)

    def pinned(self, n, dtype):
        import cupyx
        return cupyx.empty_pinned(n, dtype)

    def copy_to_host(self, a, out):
        # on the caller's current stream, after the work queued there: one
        # runtime call, not CuPy's get() with its checks
        self._copy(out.ctypes.data, a.data.ptr, a.nbytes,
                   self.xp.cuda.runtime.memcpyDeviceToHost, a)

    def copy_from_host(self, h, a):
        self._copy(a.data.ptr, h.ctypes.data, a.nbytes,
                   self.xp.cuda.runtime.memcpyHostToDevice, a)

    def _copy(self, dst, src, nbytes, kind, a):
        rt = self.xp.cuda.runtime
        with a.device:
            stream = self.xp.cuda.get_current_stream()
            rt.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
            rt.streamSynchronize(stream.ptr)

    def new_stream(self, device_id):
        with self.xp.cuda.Device(device_id):
            return self.xp.cuda.Stream(non_blocking=True)

    def stream_ptr(self, stream):
        return stream.ptr

    def context(self, device_id):
        with self.xp.cuda.Device(device_id):
            self.xp.cuda.runtime.free(0)      # makes the primary context
            return _core.cuda_context()       # current on this thread

    def kernels(self, device_id):
        """int64 CUfunction handles indexed [dtype code * NREDOPS + op]."""
        if device_id not in self._kernels:
            from . import kernels
            from .ops import OPS, dtype_code
            table = np.zeros(_C["NDTYPES"] * _C["NREDOPS"], np.int64)
            keep = []           # the compiled functions must outlive us
            with self.xp.cuda.Device(device_id):
                mod = self.xp.RawModule(code=kernels.source(),
                                        options=("-std=c++11",))
                for op, dt in kernels.kernel_pairs():
                    # a RawKernel; .kernel is the cupy.cuda.Function compiled
                    # for the current device, .ptr its CUfunction
                    f = mod.get_function(kernels.kernel_name(op, dt)).kernel
                    keep.append(f)
                    table[dtype_code(dt) * _C["NREDOPS"] + OPS[op].code] = f.ptr
            self._kernels[device_id] = (mod, keep, table.tobytes())
        return self._kernels[device_id][2]

    def wait_for_caller(self, stream):
        ev = self.xp.cuda.Event(block=False, disable_timing=True)
        ev.record(self.xp.cuda.get_current_stream())
        stream.wait_event(ev)

    def caller_waits(self, stream):
        ev = self.xp.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        self.xp.cuda.get_current_stream().wait_event(ev)

    def on(self, stream):
        return stream

    def host(self, a):
        return self.xp.asnumpy(a)

    def from_host(self, a):
        return self.xp.asarray(a)


class _HostMemory(_EmulatedBackend):
    """Plain NumPy memory with the backends' interface, so that code written
    for device buffers runs unchanged on host ones."""
    name = "host"

    def owns(self, x):
        return backend_of(x) is None

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def full(self, shape, value, dtype):
        return np.full(shape, value, dtype)

    def from_host(self, a):
        return a


EMULATE = _EmulatedBackend()
HOST = _HostMemory()
_cupy_backend = None


def overlap(backend, a, b):
    """Whether the memory of ``backend``'s arrays ``a`` and ``b``
    overlaps."""
    pa, pb = backend.ptr(a), backend.ptr(b)
    return bool(a.nbytes and b.nbytes and pa < pb + b.nbytes and
                pb < pa + a.nbytes)


def backend_of(x):
    """The backend whose device array ``x`` is, or None for host data.
    CuPy is looked for only if the program has imported it."""
    if isinstance(x, EmulatedArray):
        return EMULATE
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        global _cupy_backend
        if _cupy_backend is None:
            _cupy_backend = _CupyBackend(cupy)
        return _cupy_backend
    return None


def place_of(x):
    """Where ``x`` lives, in words: host memory, or a backend's device."""
    backend = backend_of(x)
    return "host memory" if backend is None else \
        f"{backend.name} device {backend.device_id(x)}"


def check_place(x, mem, device, what, like):
    """The backend of ``x`` (None for host data) after checking that ``x``
    lives where ``mem``/``device`` say (HOST, or a backend and device id);
    ``like`` names what fixed that place, for the error."""
    backend = backend_of(x)
    if (backend or HOST) is not mem or \
            (backend is not None and backend.device_id(x) != device):
        where = "host memory" if mem is HOST else f"{mem.name} device {device}"
        raise ScheduleError(f"{what} must be in {where}, like {like}; got "
                            f"a {type(x).__name__} in {place_of(x)}")
    return backend


def flat(backend, x, what="buffer"):
    """A 1-D view of the device array ``x`` (C-contiguous required)."""
    if not x.flags.c_contiguous:
        raise ScheduleError(f"{what} must be C-contiguous (use "
                            f"{backend.xp.__name__}.ascontiguousarray)")
    return x.reshape(-1)


def flat_in_place(x, mem, device, what, owner):
    """A 1-D view of ``x`` (host buffer or device array), which must live
    where ``mem``/``device`` say: where the buffers of ``owner`` live."""
    backend = check_place(x, mem, device, what, f"this {owner}'s buffers")
    return as_array(x, what) if backend is None else flat(backend, x, what)
