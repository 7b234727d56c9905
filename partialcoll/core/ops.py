"""Reduction operators and datatypes.

``partialcoll.SUM`` etc. are :class:`Op` objects whose codes come from the C
core.  Wherever an op is accepted, mpi4py's ``MPI.SUM``-style constants and
the names ("sum", "SUM") are accepted too.
"""
from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any, TypeAlias, Union

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .. import _core
from .errors import ArgumentTypeError, ScheduleError

_C = _core.constants()


#: the NumPy (and CuPy) ufunc of each op, for reductions done in Python
UFUNCS = {"SUM": "add", "PROD": "multiply", "MIN": "minimum",
          "MAX": "maximum", "LAND": "logical_and", "LOR": "logical_or",
          "LXOR": "logical_xor", "BAND": "bitwise_and",
          "BOR": "bitwise_or", "BXOR": "bitwise_xor"}


class Op:
    """A reduction operator of the executor (``dst = dst op src``): its
    code in the C core, the dtypes it is defined for, its identity
    element, its ufunc and its MPI twin."""

    __slots__ = ("name", "code", "dtypes")

    name: str
    code: int
    dtypes: frozenset[np.dtype[Any]]

    def __init__(self, name: str, code: int, dtypes: Iterable[Any]) -> None:
        self.name, self.code = name, code
        self.dtypes = frozenset(np.dtype(d) for d in dtypes)

    def __repr__(self) -> str:
        return f"partialcoll.{self.name}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_by_name, (self.name,))

    def ufunc(self, xp: ModuleType = np) -> Any:
        """The op as a ufunc of the array namespace ``xp`` (NumPy, or
        CuPy for device arrays): ``op.ufunc()(a, b, out=a)``."""
        return getattr(xp, UFUNCS[self.name])

    @property
    def mpi(self) -> MPI.Op:
        """The mpi4py ``MPI.Op`` of the same reduction."""
        return getattr(MPI, self.name)

    @property
    def truth_valued(self) -> bool:
        """Whether the op gives truth values, 0 or 1 (LAND, LOR, LXOR):
        then ``identity op x`` is not ``x``."""
        return self.name in ("LAND", "LOR", "LXOR")

    def identity(self, dtype: npt.DTypeLike) -> np.generic:
        """The identity element of this op for ``dtype`` (a NumPy scalar)."""
        dt: np.dtype[Any] = np.dtype(dtype)
        kind = dt.kind
        if self.name in ("SUM", "BOR", "BXOR", "LOR", "LXOR"):
            return dt.type(0)
        if self.name in ("PROD", "LAND"):
            return dt.type(1)
        if self.name == "BAND":
            return dt.type(True) if kind == "b" else dt.type(~dt.type(0))
        if kind == "f":
            return dt.type(np.inf if self.name == "MIN" else -np.inf)
        info = np.iinfo(dt)
        return dt.type(info.max if self.name == "MIN" else info.min)


OPS = {name: Op(name, code, dts) for name, (code, dts) in _C["redops"].items()}
#: what an ``op=`` argument takes: an :class:`Op`, mpi4py's ``MPI.Op`` of
#: the same reduction, its name (``"sum"``, ``"SUM"``) or a
#: ``torch.distributed.ReduceOp`` member (torch is optional: ``Any``)
OpLike: TypeAlias = Union[Op, MPI.Op, str, Any]
_MPI_OPS = [(getattr(MPI, name), name) for name in OPS]


def _by_name(name):
    return OPS[name]


#: torch.distributed.ReduceOp's names of the executor's reductions
_TORCH_NAMES = {"SUM": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX",
                "BAND": "BAND", "BOR": "BOR", "BXOR": "BXOR"}

#: the names of the average, which :func:`partialcoll.allreduce` takes
AVERAGE_NAMES = ("avg", "average")


def torch_op_name(op):
    """The name of a ``torch.distributed.ReduceOp`` member (``"SUM"``,
    ``"AVG"``, ...), or None for anything else (torch is not imported)."""
    if type(op).__module__.startswith("torch"):
        name = getattr(op, "name", None)
        return name if isinstance(name, str) else None
    return None


def is_average(op):
    """Whether ``op`` asks for the average: ``"avg"``, ``"average"`` or
    ``torch.distributed.ReduceOp.AVG``."""
    if isinstance(op, str):
        return op.lower() in AVERAGE_NAMES
    return torch_op_name(op) == "AVG"


def as_op(op: OpLike) -> Op:
    """Normalise ``op`` (Op, mpi4py ``MPI.Op``, ``torch.distributed.ReduceOp``
    or name) to an :class:`Op`."""
    if isinstance(op, Op):
        return op
    if isinstance(op, MPI.Op):
        for mop, name in _MPI_OPS:
            if op == mop:
                return OPS[name]
        name = next((f"MPI.{n}" for n in dir(MPI) if n.isupper() and
                     isinstance(getattr(MPI, n), MPI.Op) and
                     getattr(MPI, n) == op), repr(op))
        raise ScheduleError(f"unsupported MPI reduction operator {name}; "
                            f"supported: {', '.join(OPS)}")
    if isinstance(op, str) and op.upper() in OPS:
        return OPS[op.upper()]
    tname = torch_op_name(op)
    if tname in _TORCH_NAMES:
        return OPS[_TORCH_NAMES[tname]]
    if is_average(op):
        raise ScheduleError(f"the average ({op!r}) is an op of "
                            f"partialcoll.allreduce and iallreduce only; "
                            f"here, reduce with SUM and divide by the "
                            f"number of ranks")
    if isinstance(op, str) or tname is not None:
        raise ScheduleError(f"unknown reduction operator {op!r}; use one of "
                            f"partialcoll.{', partialcoll.'.join(OPS)}")
    raise ArgumentTypeError(f"a reduction operator must be one of "
                            f"partialcoll.{', partialcoll.'.join(OPS)} (or "
                            f"its MPI.Op or name), not {type(op).__name__}")


# dtype name -> (code, itemsize, kind); longdouble/clongdouble keyed by numpy
DTYPES = {}
for _name, (_code, _size, _kind) in _C["dtypes"].items():
    DTYPES[np.dtype(_name)] = (_code, _size, _kind)


def dtype_code(dtype):
    """The C core's code for a NumPy dtype, or a clear error."""
    dtype = np.dtype(dtype)
    if not dtype.isnative:
        raise ScheduleError(f"dtype {dtype} is not in native byte order")
    try:
        return DTYPES[dtype][0]
    except KeyError:
        supported = ", ".join(sorted(str(d) for d in DTYPES))
        raise ScheduleError(f"dtype {dtype} has no MPI basic type; "
                            f"supported: {supported}") from None


def check_op_dtype(op, dtype):
    dtype = np.dtype(dtype)
    dtype_code(dtype)
    if dtype not in op.dtypes:
        raise ScheduleError(f"reduction {op.name} is not defined for {dtype}")
