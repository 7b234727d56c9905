"""An allreduce's buffers, checked: host buffers (NumPy arrays,
buffer-protocol objects, mpi4py buffer specs, ``MPI.IN_PLACE``) or device
arrays of one backend and device, as the flat arrays the executor binds."""
import numpy as np
from mpi4py import MPI

from ..core import arrays, devices
from ..core.buffers import as_array
from ..core.checks import check_comm, require_thread_multiple
from ..core.errors import ScheduleError
from ..core.ops import as_op, check_op_dtype


def prepare(sendbuf, recvbuf, op, comm):
    """(send, recv, result, op, comm) of an allreduce of host buffers:
    ``send`` and ``recv`` flat arrays (the same one in place), ``result``
    what the call returns (``recvbuf``, or a new array when None)."""
    require_thread_multiple()
    comm = check_comm(comm)
    if sendbuf is MPI.IN_PLACE or (sendbuf is recvbuf and sendbuf is not None):
        if recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        recv = as_array(recvbuf, "recvbuf")
        send = recv
    else:
        send = as_array(sendbuf, "sendbuf")
        if recvbuf is None:
            shape = sendbuf.shape if isinstance(sendbuf, np.ndarray) else send.shape
            recvbuf = np.empty(shape, send.dtype)
        recv = as_array(recvbuf, "recvbuf")
        if np.shares_memory(send, recv):
            raise ScheduleError("sendbuf and recvbuf overlap; use MPI.IN_PLACE "
                                "or pass the same array for in-place")
    if recv.dtype != send.dtype or recv.size != send.size:
        raise ScheduleError(f"recvbuf ({recv.dtype}[{recv.size}]) does not "
                            f"match sendbuf ({send.dtype}[{send.size}])")
    if not arrays.writeable(recv):
        raise ScheduleError("recvbuf is read-only")
    result = recvbuf if isinstance(recvbuf, np.ndarray) else recv
    op = as_op(op)
    check_op_dtype(op, send.dtype)
    return send, recv, result, op, comm


def device_of(sendbuf, recvbuf):
    """The backend of device buffers (None for host ones); mixing host and
    device memory is an error."""
    send_be = None if sendbuf is MPI.IN_PLACE else devices.backend_of(sendbuf)
    recv_be = None if recvbuf is None else devices.backend_of(recvbuf)
    if sendbuf is MPI.IN_PLACE or recvbuf is None:
        return send_be or recv_be
    if send_be is not recv_be:
        raise ScheduleError("sendbuf and recvbuf must both be device arrays "
                            "or both host buffers")
    return send_be


def prepare_device(be, sendbuf, recvbuf, op, comm):
    """:func:`prepare` for device arrays of backend ``be``."""
    require_thread_multiple()
    comm = check_comm(comm)
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        if recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        recv = send = devices.flat(be, recvbuf, "recvbuf")
    else:
        send = devices.flat(be, sendbuf, "sendbuf")
        if recvbuf is None:
            recvbuf = be.empty(sendbuf.shape, send.dtype)
        recv = devices.flat(be, recvbuf, "recvbuf")
        if be.device_id(sendbuf) != be.device_id(recvbuf):
            raise ScheduleError("sendbuf and recvbuf are on different devices")
        if devices.overlap(be, send, recv):
            raise ScheduleError("sendbuf and recvbuf overlap; use MPI.IN_PLACE "
                                "or pass the same array for in-place")
    if recv.dtype != send.dtype or recv.size != send.size:
        raise ScheduleError(f"recvbuf ({recv.dtype}[{recv.size}]) does not "
                            f"match sendbuf ({send.dtype}[{send.size}])")
    op = as_op(op)
    check_op_dtype(op, send.dtype)
    return send, recv, recvbuf, op, comm
