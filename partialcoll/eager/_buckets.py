"""How eager-SGD's gradients become buckets (:mod:`partialcoll.eager.core`):
their specs and memory, the fused buffers and their order, priorities and
partitions (TicTac for allreduce), and one step's collectives over them,
synchronous or partial."""
import numbers
import reprlib

import numpy as np

from ..core import devices
from ..core.errors import ArgumentTypeError, ScheduleError
from ..collectives.allreduce import allreduce, iallreduce
from ._checks import check_count

class Bucket:
    """A fused buffer for some of the gradients, and its collective."""

    def __init__(self, dtype, members, mem):
        self.dtype = np.dtype(dtype)
        self.members = members              # [(index, offset, size, shape)]
        self.size = sum(m[2] for m in members)
        self.send = mem.full(self.size, 0, self.dtype)
        self.priority = 0                   # of its messages (lower first)
        self.parts = [(0, self.size)]       # slices, one collective each
        self.colls = []                     # partial allreduce per part

    @property
    def coll(self):
        """The partial allreduce of the (first) part; None in sync modes."""
        return self.colls[0] if self.colls else None


def memory_of(templates):
    """(memory backend, device id) of the template arrays: all host, or all
    on one device."""
    found = {(devices.backend_of(t), devices.backend_of(t) and
              devices.backend_of(t).device_id(t))
             for t in templates if not is_spec(t)}
    if len(found) > 1:
        raise ScheduleError("gradient templates mix host and device memory "
                            "(or devices): keep them in one place")
    be, dev = found.pop() if found else (None, None)
    return be or devices.HOST, dev


def is_spec(t):
    return isinstance(t, tuple) and len(t) == 2 and \
        not isinstance(t[0], np.ndarray)


def spec(t):
    if devices.backend_of(t) is not None:
        shape, dtype = t.shape, np.dtype(t.dtype)
    elif is_spec(t):
        shape, dtype = t
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
    else:
        a = np.asarray(t) if not isinstance(t, np.ndarray) else t
        shape, dtype = a.shape, a.dtype
    if dtype.kind not in "fc":
        raise ScheduleError(f"gradients must be floating point, not {dtype}")
    return tuple(int(s) for s in shape), dtype


def plan_buckets(specs, bucket_bytes, mem, order=None):
    """One fused buffer in the widest gradient dtype (at least float32: MPI
    has no float16) holding the gradients in ``order`` (None: index
    order), split into buckets of about ``bucket_bytes`` at gradient
    boundaries (None: one bucket)."""
    dtype = np.result_type(np.float32, *[d for _, d in specs])
    buckets, cur, off = [], [], 0
    for i in (range(len(specs)) if order is None else order):
        shape = specs[i][0]
        n = int(np.prod(shape, dtype=np.int64))
        if cur and bucket_bytes and (off + n) * dtype.itemsize > bucket_bytes:
            buckets.append(Bucket(dtype, cur, mem))
            cur, off = [], 0
        cur.append((i, off, n, shape))
        off += n
    buckets.append(Bucket(dtype, cur, mem))
    return buckets


def check_order(order, n):
    """``order`` as a list of ints, a permutation of range(n), or None."""
    if order is None:
        return None
    try:
        order = [int(i) for i in order]
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"order must be a list of gradient "
                                f"indices (ints), got "
                                f"{reprlib.repr(order)}") from None
    if sorted(order) != list(range(n)):
        raise ScheduleError(f"order must name every gradient index 0..{n - 1}"
                            f" once")
    return order


# -- priorities and partitions (TicTac for allreduce) ------------------------
def check_priorities(mode, priorities, partition_bytes, specs):
    if mode not in ("solo", "sync"):
        raise ScheduleError("priorities and partition_bytes work with 'solo' "
                            "and 'sync' modes only")
    if priorities is not None:
        priorities = list(priorities)
        if len(priorities) != len(specs):
            raise ScheduleError(f"priorities: one number per gradient "
                                f"({len(specs)}), got {len(priorities)}")
        bad = [p for p in priorities if isinstance(p, bool)
               or not isinstance(p, numbers.Integral)]
        if bad:
            raise ArgumentTypeError(f"priorities must be ints, not "
                                    f"{bad[0]!r}")
    check_count(partition_bytes, "partition_bytes")


def prioritise(buckets, priorities, partition_bytes):
    """A bucket's priority is its most urgent member's; a bucket over
    ``partition_bytes`` is cut into equal slices (one collective each)."""
    for b in buckets:
        if priorities is not None:
            b.priority = min(int(priorities[i]) for i, *_ in b.members)
        if partition_bytes:
            per = max(1, int(partition_bytes) // b.dtype.itemsize)
            n = -(-b.size // per)
            cuts = [b.size * k // n for k in range(n + 1)]
            b.parts = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def by_priority(buckets):
    """(bucket, part index) pairs, most urgent first (the same on every
    rank: priorities are checked to agree), so with no cap on sends the
    wire still takes them in that order."""
    return sorted(((b, j) for b in buckets for j in range(len(b.parts))),
                  key=lambda bj: bj[0].priority)


def sync_buckets(buckets, mem, comm, compression=None):
    """Every part of every bucket as a concurrent iallreduce at its
    bucket's priority; returns one reduced buffer per bucket.  A single
    part takes the blocking allreduce (its cached fast path)."""
    out = [mem.empty(b.size, b.dtype) for b in buckets]
    if len(buckets) == 1 and len(buckets[0].parts) == 1:
        allreduce(buckets[0].send, out[0], comm=comm,
                  priority=buckets[0].priority, compression=compression)
        return out
    where = {id(b): r for b, r in zip(buckets, out)}
    reqs = [iallreduce(b.send[lo:hi], where[id(b)][lo:hi], comm=comm,
                       priority=b.priority, compression=compression)
            for b, j in by_priority(buckets) for lo, hi in [b.parts[j]]]
    for r in reqs:
        r.wait()
    return out


def partial_buckets(buckets, mem, call):
    """``call(collective, part)`` for every part (most urgent first): a
    request (waited for after all started) or a result.  Returns (results,
    one buffer per bucket)."""
    got = {}
    for b, j in by_priority(buckets):
        lo, hi = b.parts[j]
        got[(id(b), j)] = call(b.colls[j], b.send[lo:hi])
    for key, h in got.items():
        got[key] = h.wait() if hasattr(h, "wait") else h
    res, out = [], []
    for b in buckets:
        parts = [got[(id(b), j)] for j in range(len(b.parts))]
        res += parts
        flat = [r.data.reshape(-1) for r in parts]
        out.append(flat[0] if len(flat) == 1 else mem.xp.concatenate(flat))
    return res, out
