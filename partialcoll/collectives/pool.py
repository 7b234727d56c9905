"""The allreduce schedule pool: committed schedules reused by calls of the
same signature, so that a repeated allreduce builds nothing."""
import collections

import numpy as np

from ..core import devices, env, libcomm
from ..core.errors import ScheduleBusyError
from ..core.schedule import Schedule
from .algorithm import setting, tmp_size
from .builders import BUILDERS
from .context import BuildContext

#: most schedules the pool keeps (idle ones beyond it are dropped, oldest
#: first); their temporary buffers are bounded by pool_budget()
POOL_SCHEDULES = 64
#: default of PARTIALCOLL_ALLREDUCE_POOL_BYTES
DEFAULT_POOL_BYTES = 64 << 20


def pool_budget():
    """Bytes of temporary buffers the pool may keep in idle schedules
    (``PARTIALCOLL_ALLREDUCE_POOL_BYTES``, default 64 MiB)."""
    return setting(env.ALLREDUCE_POOL_BYTES, DEFAULT_POOL_BYTES, int)


class Pooled:
    """One pooled schedule: slots 0 (``send``, read-only), 1 (``recv``)
    and 2 (``tmp``, its own); ``ntags``: the tags one call takes."""

    __slots__ = ("schedule", "key", "nbytes", "ntags")

    def __init__(self, schedule, key, nbytes, ntags):
        self.schedule, self.key = schedule, key
        self.nbytes, self.ntags = nbytes, ntags

    def give_back(self):
        """Unbind the caller's buffers (slots 0 and 1), so the pool keeps
        no user array alive.  A slot that a newer call has rebound (and
        posted) is that call's to give back."""
        try:
            self.schedule.unbind(0)
            self.schedule.unbind(1)
        except ScheduleBusyError:
            pass


class SchedulePool:
    """Committed allreduce schedules by signature (library communicator,
    algorithm, count, dtype, op, in-place, device, priority).

    Least recently used first: after each new schedule, idle ones are
    dropped, oldest first, until at most POOL_SCHEDULES remain and their
    temporary buffers fit pool_budget() (the newest stays even if it alone
    is larger).  A busy one is never dropped; a dropped one is not freed
    (a request may still hold it): the last reference frees it.  The
    schedules hold no caller's buffers between calls
    (:meth:`Pooled.give_back`)."""

    def __init__(self):
        self._by_key = {}                       # (lc, key) -> [Pooled]
        self._lru = collections.OrderedDict()   # Pooled -> None
        self.nbytes = 0

    def __len__(self):
        return len(self._lru)

    def signatures(self):
        """The signatures of the pooled schedules, oldest use first:
        (algorithm, count, dtype string, op name, in place, device, GPU
        path, priority).  The path of a staged allreduce small enough to be
        reduced in pinned host memory is ``"staged-host"``."""
        return [entry.key[1] for entry in self._lru]

    def get(self, lc, algo, count, dtype, op, inplace, device=None,
            priority=0):
        """An idle :class:`Pooled` (made if none is idle).  ``device``:
        (backend, device id) for device buffers."""
        path = devices.gpu_path() if device else None
        if device and devices.reduced_on_host(count * dtype.itemsize):
            path = "staged-host"         # reduced in pinned host memory
        key = (lc, (algo, count, dtype.str, op.name, inplace,
                    device and (device[0].name, device[1]), path, priority))
        for entry in self._by_key.get(key, ()):
            if entry.schedule.idle:
                self._lru.move_to_end(entry)
                return entry
        entry = _build(lc, key, algo, count, dtype, op, inplace, device,
                       priority, path == "staged-host")
        self._by_key.setdefault(key, []).append(entry)
        self._lru[entry] = None
        self.nbytes += entry.nbytes
        self._trim(pool_budget())
        return entry

    def _trim(self, budget):
        for entry in list(self._lru)[:-1]:
            if len(self._lru) <= POOL_SCHEDULES and self.nbytes <= budget:
                return
            if entry.schedule.idle:
                self._forget(entry)

    def _forget(self, entry):
        del self._lru[entry]
        self.nbytes -= entry.nbytes
        same = self._by_key[entry.key]
        same.remove(entry)
        if not same:
            del self._by_key[entry.key]
        lc = entry.key[0]
        plans = lc.cache.get("allreduce.plans", {})
        for k in [k for k, plan in plans.items() if plan.entry is entry]:
            del plans[k]

    def drop(self, lc):
        """Forget lc's schedules once their rounds (posted on every rank, so
        they complete) are over: lc's duplicates are about to be freed."""
        for entry in [e for e in self._lru if e.key[0] is lc]:
            entry.schedule.wait()
            self._forget(entry)


def _build(lc, key, algo, count, dtype, op, inplace, device, priority=0,
           mirrored=False):
    """A committed :class:`Pooled` schedule for one signature (``mirrored``:
    device buffers reduced in pinned host memory)."""
    s = Schedule(lc.comm, priority=priority, reliable=True)
    if device:
        s.use_device(*device)
    send = s.buffer(dtype=dtype, size=count, writable=False, name="send",
                    device=bool(device))
    recv = s.buffer(dtype=dtype, size=count, name="recv", device=bool(device))
    n = tmp_size(algo, count, lc.size)
    if mirrored:
        nbytes = _build_mirrored(s, lc, algo, count, dtype, op, inplace,
                                 device[0], send, recv, n)
    else:
        tmp = device[0].empty(n, dtype) if device else np.empty(n, dtype)
        tmp_slot = s.buffer(tmp, name="tmp")
        # MPI may read the caller's data only once it is there
        after = [s.fence()] if device else ()
        BUILDERS[algo](s, BuildContext(lc.size, lc.rank, send, recv,
                                       tmp_slot, op, inplace, after=after))
        nbytes = tmp.nbytes
    s.commit()
    return Pooled(s, key, nbytes, 2 * lc.size + 2)


def _build_mirrored(s, lc, algo, count, dtype, op, inplace, backend, send,
                    recv, n):
    """A small allreduce of device buffers on the staged path: the input is
    copied once into pinned host memory, reduced there by the host
    algorithm, and the result copied back once.  Every staged message
    would otherwise cost a copy out, a copy in and a reduction kernel, each
    a device operation whose completion the progress thread must see.
    Returns the bytes of memory the schedule owns."""
    host = backend.pinned(count, dtype)
    tmp = backend.pinned(n, dtype)
    host_slot, tmp_slot = s.buffer(host, name="recv@host"), \
        s.buffer(tmp, name="tmp@host")
    # a device copy: on the schedule's stream, which post() orders after
    # the caller's work, so no fence (one event less to wait for)
    out = s.copy(host_slot, recv if inplace else send)
    first = len(s)
    BUILDERS[algo](s, BuildContext(lc.size, lc.rank, host_slot, host_slot,
                                   tmp_slot, op, True, after=[out]))
    s.copy(recv, host_slot, after=list(range(first, len(s))) or [out])
    return host.nbytes + tmp.nbytes


POOL = SchedulePool()


def pool_size():
    """(schedules, bytes of temporary buffers) the pool holds now."""
    return len(POOL), POOL.nbytes


@libcomm.register("on_release")
def _drop_pool(lc):
    POOL.drop(lc)
