"""Argument checks of eager-SGD (:mod:`partialcoll.eager.core`): the mode,
the reduction, Horovod's predivide factor, compression, the integer
options, and how the gradients of two ranks differ when they must agree."""
import numbers

import numpy as np

from ..core.errors import ArgumentTypeError, ScheduleError
from ..collectives.staging import check_compression
from ..core.ops import OPS, as_op

MODES = ("solo", "majority", "sync", "sync-mpi")


SYNC_MODES = ("sync", "sync-mpi")


REDUCTIONS = ("average", "sum")


def check_mode(mode, size):
    """Normalise ``mode``: "solo", "majority", "sync", "sync-mpi" or an int
    quorum (also given as a string of digits)."""
    if isinstance(mode, str):
        if mode.lower() in MODES:
            return mode.lower()
        if mode.isdigit():
            mode = int(mode)
    if isinstance(mode, (int, np.integer)) and not isinstance(mode, bool):
        if not 1 <= int(mode) <= size:
            raise ScheduleError(f"quorum mode must be between 1 and the "
                                f"number of processes ({size}), not {mode}")
        return int(mode)
    kind = ScheduleError if isinstance(mode, str) else ArgumentTypeError
    raise kind(f"mode must be 'solo', 'majority', 'sync', 'sync-mpi' or an "
               f"integer quorum, not {mode!r}")


def check_count(value, what):
    """An option that is a positive int or None (``sync_every``,
    ``bucket_bytes``, ``partition_bytes``): refused, not truncated, when it
    is anything else (2.5, True, "3", inf)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{what} must be a positive integer or "
                                f"None, not {value!r}")
    if value < 1:
        raise ScheduleError(f"{what} must be a positive integer or None, "
                            f"not {value!r}")
    return int(value)


def check_seed(seed):
    """Majority mode's seed: an int (not a float, None or a string)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ArgumentTypeError(f"seed must be an int, not {seed!r}")
    return int(seed)


def check_op(op):
    """Normalise ``op``: ``"average"`` or ``"sum"`` (any case), or the
    summing op as ``partialcoll.SUM`` / ``MPI.SUM``."""
    if isinstance(op, str) and op.lower() in REDUCTIONS:
        return op.lower()
    if "adasum" in str(op).lower():
        raise ScheduleError("op: Adasum is not supported; gradients are "
                            "averaged ('average') or summed ('sum')")
    kind = ScheduleError
    try:
        if as_op(op) is OPS["SUM"]:
            return "sum"
    except ArgumentTypeError:
        kind = ArgumentTypeError        # not an op at all
    except ScheduleError:
        pass
    raise kind(f"op must be 'average' or 'sum' (also partialcoll.SUM, "
               f"MPI.SUM), not {op!r}: gradients are averaged or summed")


def check_predivide(factor, op):
    """Horovod's ``gradient_predivide_factor``: a finite number > 0, and not
    1 only when averaging."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ArgumentTypeError(f"gradient_predivide_factor must be a "
                                f"finite number > 0, not {factor!r}")
    if not np.isfinite(factor) or factor <= 0:
        raise ScheduleError(f"gradient_predivide_factor must be a finite "
                            f"number > 0, not {factor!r}")
    if factor != 1 and op != "average":
        raise ScheduleError("gradient_predivide_factor splits an average: "
                            "it needs op='average'")
    return float(factor)


def check_compression_for_mode(compression, mode):
    """``compression`` as ``allreduce`` takes it (None or "fp16"), refused
    with ``"sync-mpi"`` (MPI_Allreduce does not compress)."""
    try:
        compression = check_compression(compression)
    except ScheduleError:
        raise ScheduleError(f"compression must be None or 'fp16' "
                            f"(partialcoll.Compression.fp16), not "
                            f"{compression!r}") from None
    if compression is not None and mode == "sync-mpi":
        raise ScheduleError(f"compression={compression!r} does not work with "
                            f"mode='sync-mpi' (MPI_Allreduce does not "
                            f"compress): use 'sync'")
    return compression


def describe_gradient_mismatch(per_rank):
    ref = per_rank[0]
    for r, g in enumerate(per_rank[1:], 1):
        if g == ref:
            continue
        a, b = {n: (s, d) for n, s, d in ref}, {n: (s, d) for n, s, d in g}
        only0 = sorted(set(a) - set(b))
        onlyr = sorted(set(b) - set(a))
        diff = sorted(n for n in set(a) & set(b) if a[n] != b[n])
        parts = []
        if only0:
            parts.append(f"only rank 0 has {_few(only0)}")
        if onlyr:
            parts.append(f"only rank {r} has {_few(onlyr)}")
        for n in diff[:3]:
            parts.append(f"{n} is {a[n][0]} {np.dtype(a[n][1])} on rank 0 "
                         f"but {b[n][0]} {np.dtype(b[n][1])} on rank {r}")
        if not parts:
            parts.append(f"the gradients are in a different order on rank {r}")
        return "gradients differ: " + "; ".join(parts)
    return "gradients differ"


def _few(names):
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more"
                                   if len(names) > 4 else "")
