"""Function forms of the partial collectives for mpi4py programs, and the
collective ways to flush and close partial collective objects.

``solo_allreduce(x)``, ``majority_allreduce(x)``, ``quorum_allreduce(x, k)``
keep one persistent object per signature (communicator, shape, dtype, op,
memory, options), at most ``FORMS_PER_COMM`` (16) per communicator (the
least recently used is closed first).  Like every MPI collective they must be called in the
same order on every rank, which makes all of the following deterministic.

The rule "flush a majority or quorum object before another collective" (a
rank inside a call may be waiting for one that has moved on) is kept for
them by the library wherever it can see the next collective:

* every library collective on the communicator (``allreduce``,
  ``iallreduce``, creating a partial object, a function-form call of another
  signature) first flushes the majority/quorum function forms called since
  their last flush (a ``before_collective`` hook of ``partialcoll.core.libcomm``);
* evicting a form from the cache closes it;
* ``with partials(comm):`` flushes and closes them at exit.

What such an automatic flush returns is not lost: it is held and combined
into that signature's next result (as catch-up combines missed rounds), or
returned by :func:`~partialcoll.flush_partials` /
:func:`~partialcoll.close_partials`.

What remains the user's job: an mpi4py collective (``comm.Barrier()``,
``comm.allreduce``) cannot be intercepted; call ``flush_partials(comm)``
first, or use the context manager around the loop.
"""
from __future__ import annotations

import collections
from typing import Self

import numpy as np
from mpi4py import MPI

from ...core import arrays, devices, libcomm
from ...core.buffers import Buffer
from ...core.checks import check_comm, check_int
from ...core.errors import ScheduleError
from ...core.ops import OPS, Op, OpLike, as_op
from .handles import deliver, make_rounds
from .result import PartialResult
from .rounds import open_rounds

SUM = OPS["SUM"]

#: function-form objects kept per communicator (least recently used first)
FORMS_PER_COMM = 16


class _Form:
    """One cached function-form object and what an automatic flush held
    back for its next result."""

    __slots__ = ("key", "rounds", "dirty", "held", "created", "array_kind")

    def __init__(self, key, rounds, created):
        self.key, self.rounds, self.created = key, rounds, created
        self.dirty = False            # called since its last flush
        self.held = None              # a PartialResult for the next call
        self.array_kind = None        # of its latest caller's data

    def deliver(self, res):
        """``res`` as its latest caller's results are (type and dtype)."""
        return deliver(self.rounds, res, self.array_kind)


class _Forms:
    """The function forms of one library communicator."""

    def __init__(self):
        self.cache = collections.OrderedDict()     # key -> _Form, LRU first
        # key -> (label, PartialResult, _Form) of an evicted form (the
        # result as accumulated: not delivered)
        self.held = {}
        self.created = 0
        # (kind, dtype, shape, op, options) -> (_Form, its array kind):
        # the repeated call with NumPy arrays (see _again); an entry is
        # used only while its form is the cached one of its key, and goes
        # when the form is evicted
        self.fast = {}


def _forms(lc):
    forms = lc.cache.get("partial.forms")
    if forms is None:
        forms = lc.cache["partial.forms"] = _Forms()
    return forms


def _merge(first, later, combine):
    """``first`` then ``later`` as one result (None-safe)."""
    if first is None or later is None:
        return later if first is None else first
    data = later.data.copy()
    combine(first.data, later.data, out=data)
    return PartialResult(data, later.included, later.round, later.active,
                         first.rounds + later.rounds, later.sync,
                         first.skipped + later.skipped)


def _function_form(kind, name, sendbuf, recvbuf, op, comm, **kw):
    """One call of a function form: the user's buffer is taken in once
    (ingested, placed, checked), then the cached object's call.  A repeated
    call with NumPy arrays goes through :func:`_again`."""
    res = _again(kind, sendbuf, recvbuf, op, comm, kw)
    if res is not None:
        return res
    comm = check_comm(comm)
    if sendbuf is MPI.IN_PLACE:          # as comm.Allreduce(IN_PLACE, buf)
        if recvbuf is None:
            raise ScheduleError("MPI.IN_PLACE needs recvbuf")
        sendbuf = recvbuf
    data = arrays.ingest(sendbuf, "sendbuf")
    mem = data.backend or devices.HOST
    device = data.backend and data.backend.device_id(data.array)
    x = devices.flat_in_place(data.array, mem, device, "sendbuf", name)
    op = as_op(op)
    # recvbuf is checked before the round: its result would be lost
    out = None if recvbuf is None else \
        _check_recvbuf(recvbuf, data, mem, device, name)
    # the options are part of the cache key: a wrong type on one rank is
    # refused here, before the signature's collective flush or creation
    # that the other ranks would not join
    for k, v in kw.items():
        check_int(v, k, lo=0 if k == "seed" else 1)
    key = (kind, data.shape, str(data.dtype), op.name, mem.name, device,
           tuple(sorted(kw.items())))
    lc = libcomm.library_comm(comm, survivors=True)
    lc.before_collective(keep=key)          # flush the other signatures
    forms = _forms(lc)
    form = forms.cache.get(key)
    if form is None:
        form = _new_form(lc, forms, key, kind, name, data, op, comm, kw)
    forms.cache.move_to_end(key)
    form.array_kind = data.kind             # flush_partials delivers so
    res = form.rounds.call(form.rounds.accept(data, x)[0])
    form.dirty = True
    if form.rounds.kind != "solo":
        _waits(lc, form)
    fast = _fast_key(kind, sendbuf, op, kw)
    if fast is not None and mem is devices.HOST:
        forms.fast[fast] = (form, data.kind)
    if form.held is not None:
        res, form.held = _merge(form.held, res, form.rounds.combine), None
    if out is None:
        return deliver(form.rounds, res, data.kind)
    if arrays.is_half(data.dtype):
        arrays.narrow(res.data.reshape(-1), data.dtype, out=out)
    else:
        out[...] = res.data.reshape(-1)
    res.data = recvbuf
    return res


def _fast_key(kind, sendbuf, op, kw):
    """The key of a call that :func:`_again` may take next time (a NumPy
    ``sendbuf``, an :class:`~partialcoll.Op` and int options), else None."""
    if type(sendbuf) is not np.ndarray or type(op) is not Op or \
            any(type(v) is not int for v in kw.values()):
        return None
    return (kind, sendbuf.dtype, sendbuf.shape, op) + tuple(kw.values())


def _again(kind, sendbuf, recvbuf, op, comm, kw):
    """A repeated function-form call, from one cached lookup: ``sendbuf``
    (and ``recvbuf``, if given) C-contiguous NumPy arrays of the shape and
    dtype of an earlier call of the signature on this communicator, whose
    form is still cached, has nothing held for it and takes the object's
    one-frame call (see ``Blocking.quick``); ``MPI.IN_PLACE`` takes
    ``recvbuf``'s contents.  Does what the general path
    does in that case: the flush of the other signatures, the cache's
    order, the result into ``recvbuf``.  None: not that case (the general
    path checks, and says what is wrong)."""
    if sendbuf is MPI.IN_PLACE:
        sendbuf = recvbuf
    key = _fast_key(kind, sendbuf, op, kw)
    if key is None or (recvbuf is not None and (
            type(recvbuf) is not np.ndarray or
            recvbuf.dtype != sendbuf.dtype or
            recvbuf.shape != sendbuf.shape or
            not recvbuf.flags.c_contiguous or
            not recvbuf.flags.writeable)):
        return None
    try:
        lc = libcomm.find_fast(MPI.COMM_WORLD if comm is None else comm)
    except AttributeError:              # not a communicator
        return None
    forms = lc and lc.cache.get("partial.forms")
    form, array_kind = (forms and forms.fast.get(key)) or (None, None)
    if form is None or form.held is not None or \
            forms.cache.get(form.key) is not form:
        return None
    if lc.pending:
        lc.before_collective(keep=form.key)
    res = form.rounds.quick(sendbuf, recvbuf)
    if res is None:
        return None
    forms.cache.move_to_end(form.key)
    form.array_kind = array_kind
    form.dirty = True
    if form.rounds.kind != "solo":
        _waits(lc, form)
    if recvbuf is not None and res.data is not recvbuf:
        # a wait that went on (a long wait, a death) made its own array
        recvbuf.reshape(-1)[...] = res.data.reshape(-1)
        res.data = recvbuf
    return res


def _check_recvbuf(recvbuf, data, mem, device, name):
    """The flat view of ``recvbuf`` after checking that it can take the
    result of ``data`` (:class:`~partialcoll.core.arrays.Data`)."""
    out = arrays.ingest(recvbuf, "recvbuf")
    flat = devices.flat_in_place(out.array, mem, device, "recvbuf", name)
    if out.dtype is not data.dtype and out.dtype != data.dtype:
        raise ScheduleError(f"recvbuf is {out.dtype}, sendbuf {data.dtype}")
    if flat.size != data.array.size:
        raise ScheduleError(f"recvbuf has {flat.size} elements, sendbuf "
                            f"{data.array.size}")
    if isinstance(flat, np.ndarray) and not flat.flags.writeable:
        raise ScheduleError("recvbuf is read-only")
    return flat


def _new_form(lc, forms, key, kind, name, like, op, comm, kw):
    """Make the object of a new signature, evicting (closing) the least
    recently used one when the cache is full.  ``like``: the ingested
    sendbuf (:class:`~partialcoll.core.arrays.Data`)."""
    while len(forms.cache) >= FORMS_PER_COMM:
        old = forms.cache.popitem(last=False)[1]
        forms.fast = {k: v for k, v in forms.fast.items() if v[0] is not old}
        forms.held[old.key] = (old.rounds.label, _merge(
            old.held, old.rounds.close(), old.rounds.combine), old)
    rounds = make_rounds(kind, name, like, op, comm, seed=kw.get("seed", 0),
                         quorum=kw.get("quorum"))
    opts = "".join(f", {k}={v}" for k, v in sorted(kw.items()))
    rounds.label = f"{kind}_allreduce({like.dtype}{list(like.shape)}, " \
                   f"{op.name}{opts})"
    forms.created += 1
    form = forms.cache[key] = _Form(key, rounds, forms.created)
    form.held = forms.held.pop(key, (None, None, None))[1]
    return form


@libcomm.register("before_collective")
def _flush_waiting_forms(lc, keep=None):
    """Before a library collective on lc: flush (collectively, in creation
    order) the majority/quorum forms called since their last flush, but
    ``keep``; hold what they return for their next result.  Solo callers
    never wait for another rank, so solo forms need no flush."""
    forms = lc.cache.get("partial.forms")
    if not forms:
        return
    for form in sorted(forms.cache.values(), key=lambda f: f.created):
        if form.dirty and form.key != keep and form.rounds.kind != "solo":
            form.dirty = False
            form.held = _merge(form.held, form.rounds.flush(),
                               form.rounds.combine)
        elif form.dirty and form.rounds.kind != "solo":
            _waits(lc, form)                 # `keep` still waits for a flush


def _waits(lc, form):
    """Tell lc's next collectives that ``form`` waits for a flush: only
    another signature's call, or any other collective, flushes it (see
    ``LibraryComm.before_collective``)."""
    lc.pending = form.key if lc.pending in (False, form.key) else True


@libcomm.register("on_user_free")
def _close_forms(lc):
    # inside the user's collective MPI_Comm_free: every rank closes the same
    # objects in the same (creation) order; what they still held is lost
    # (close_partials(comm) before Free returns it)
    forms = lc.cache.pop("partial.forms", None)
    if forms:
        for form in sorted(forms.cache.values(), key=lambda f: f.created):
            form.rounds.close()


def _library_comms(comm):
    """[lc] of ``comm`` (or every live one when None)."""
    if comm is None:
        return libcomm.live()
    lc = libcomm.find(check_comm(comm))
    return [lc] if lc is not None else []


def _settle(comm, close):
    """flush_partials / close_partials: every open object of the chosen
    library communicators, in creation order (the same on every rank)."""
    lcs = _library_comms(comm)
    out = []
    for r in [r for r in open_rounds() if r.lc in lcs]:
        forms = _forms(r.lc)
        form = next((f for f in forms.cache.values() if f.rounds is r), None)
        if form is not None and not close and not form.dirty:
            res = None                   # nothing of it is pending anywhere
        else:
            res = r.close() if close else r.flush()
        if form is not None:
            res, form.held, form.dirty = \
                _merge(form.held, res, r.combine), None, False
        if res is not None:
            out.append((r.label, form.deliver(res) if form is not None
                        else deliver(r, res)))
    for lc in lcs:
        forms = _forms(lc)
        out += [(label, form.deliver(res))
                for label, res, form in forms.held.values()]
        forms.held.clear()
        if close:
            forms.cache.clear()
            forms.fast.clear()
    return out


def flush_partials(comm: MPI.Comm | None = None
                   ) -> list[tuple[str, PartialResult]]:
    """Collective: a synchronous round on every open partial collective
    object on ``comm`` (None: on every communicator, in creation order):
    objects you made, objects dropped without ``close()``, and the function
    forms called since their last flush.  Afterwards no rank is left
    waiting inside a partial call, so any collective may follow (call it
    before ``comm.Barrier()`` and other mpi4py collectives after function
    forms).

    Returns ``[(label, PartialResult)]`` in creation order: what each flush
    returned (for function forms, with anything an automatic flush held
    back).  Apply it, or that data is lost.  Example::

        for x in data:
            res = pc.majority_allreduce(x)
        for label, res in pc.flush_partials(comm):
            ...                            # the last pending contributions
        comm.Barrier()
    """
    return _settle(comm, close=False)


def close_partials(comm: MPI.Comm | None = None
                   ) -> list[tuple[str, PartialResult]]:
    """Collective: close every open partial collective object on ``comm``
    (None: on every communicator), in creation order: objects you made
    (their handles then say ``closed``), objects dropped without
    ``close()``, and function forms.  Returns ``[(label, PartialResult)]``:
    each one's final result (see :func:`flush_partials`)."""
    return _settle(comm, close=True)


class partials:
    """Context manager: at exit, :func:`close_partials` of ``comm`` (None:
    every communicator); its results are then in ``.results``.  Nothing is
    left waiting or open, whatever collective follows.

    Example::

        with pc.partials(comm) as scope:
            for x in data:
                pc.majority_allreduce(x, comm=comm)
        final = scope.results      # [(label, PartialResult)]
        comm.Barrier()
    """

    results: list[tuple[str, PartialResult]] | None

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        self.comm, self.results = comm, None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.results = close_partials(self.comm)


def solo_allreduce(sendbuf: Buffer, recvbuf: Buffer = None,
                   op: OpLike = SUM,
                   comm: MPI.Comm | None = None) -> PartialResult:
    """Solo allreduce for mpi4py programs: reuses one persistent
    :class:`SoloAllreduce` per (comm, shape, dtype, op) (see the module
    docstring for flushing, closing and the cache).  Returns a
    :class:`PartialResult` (``recvbuf``, if given, receives ``res.data``;
    ``sendbuf=MPI.IN_PLACE`` takes the contribution from ``recvbuf``, as
    ``comm.Allreduce`` does).

    Example::

        res = pc.solo_allreduce(grad)      # res.data, res.active, ...
    """
    return _function_form("solo", "SoloAllreduce", sendbuf, recvbuf, op, comm)


def majority_allreduce(sendbuf: Buffer, recvbuf: Buffer = None,
                       op: OpLike = SUM, comm: MPI.Comm | None = None,
                       seed: int = 0) -> PartialResult:
    """Majority allreduce for mpi4py programs (see :func:`solo_allreduce`).
    Before an mpi4py collective on the same ranks, call
    :func:`flush_partials` (or use :class:`partials`)."""
    return _function_form("majority", "MajorityAllreduce", sendbuf, recvbuf,
                          op, comm, seed=seed)


def quorum_allreduce(sendbuf: Buffer, quorum: int, recvbuf: Buffer = None,
                     op: OpLike = SUM,
                     comm: MPI.Comm | None = None) -> PartialResult:
    """Quorum(k) allreduce for mpi4py programs (see
    :func:`majority_allreduce`)."""
    return _function_form("quorum", "QuorumAllreduce", sendbuf, recvbuf, op,
                          comm, quorum=quorum)
