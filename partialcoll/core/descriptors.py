"""A schedule's ops as the C core takes them: one row of ``DESC_LEN``
int64 values per op (the layout is ``PC_D_*`` in the C core, read here
from its constants) and one flat array of dependencies."""
import numpy as np

from .. import _core
from .ops import dtype_code

_C = _core.constants()


def pack(ops):
    """(descriptor bytes, dependency bytes) of ``ops``: the dicts
    :class:`~.schedule.Schedule` records as ops are added."""
    desc = np.zeros((len(ops), _C["DESC_LEN"]), dtype=np.int64)
    desc[:, [_C["D_TIMEOUT"], _C["D_ORDER"], _C["D_PSLOT"], _C["D_REF"],
             _C["D_ASLOT"], _C["D_BSLOT"], _C["D_PRSLOT"]]] = -1
    deps = []
    for i, o in enumerate(ops):
        row = desc[i]
        a, b = o["a"], o["b"]
        row[_C["D_KIND"]], row[_C["D_MODE"]] = o["kind"], o["mode"]
        row[_C["D_FLAGS"]] = (
            (_C["F_OPTIONAL"] if o["optional"] else 0) |
            (_C["F_STAMPED"] if o["stamped"] else 0) |
            (_C["F_LOCKED"] if o["locked"] else 0) |
            (_C["F_DELIVERED"] if o["delivered"] else 0) |
            (_C["F_FILL"] if o.get("fill") else 0))
        if a is not None:
            item = a.slot.dtype.itemsize
            row[_C["D_ASLOT"]], row[_C["D_AOFF"]] = a.slot.index, \
                a.start * item
            row[_C["D_COUNT"]] = a.count
            row[_C["D_DTYPE"]] = dtype_code(a.slot.dtype)
        if b is not None:
            row[_C["D_BSLOT"]] = b.slot.index
            row[_C["D_BOFF"]] = b.start * b.slot.dtype.itemsize
        row[_C["D_REDOP"]] = o["op"].code if o["op"] else 0
        row[_C["D_PEER"]] = o["peer"]
        row[_C["D_TAG"]] = o["tag"] if o["peer"] >= 0 else 0
        row[_C["D_PRIO"]] = o["priority"]
        row[_C["D_NDEPS"]], row[_C["D_DEPOFF"]] = len(o["deps"]), len(deps)
        row[_C["D_NEED"]] = o["need"]
        row[_C["D_TIMEOUT"]] = o.get("timeout", -1)
        row[_C["D_TCLASS"]] = o.get("tclass", 0)
        row[_C["D_ORDER"]] = o.get("order", -1)
        row[_C["D_VALUE"]] = o.get("value", 0)
        param = o.get("param")
        if param is not None:
            row[_C["D_PSLOT"]] = param.slot.index
            row[_C["D_POFF"]] = param.start * param.slot.dtype.itemsize
        prio = o["prio_param"]
        if prio is not None:
            row[_C["D_PRSLOT"]] = prio.slot.index
            row[_C["D_PROFF"]] = prio.start * prio.slot.dtype.itemsize
        row[_C["D_REF"]] = o.get("ref", -1)
        row[_C["D_ADD"]] = o.get("add", 0)
        if "callback" in o:
            row[_C["D_REDOP"]] = o["callback"]
            row[_C["D_BBYTES"]] = b.count * b.slot.dtype.itemsize
            row[_C["D_ARG"]] = o["arg"]
        deps.extend(o["deps"])
    return desc.tobytes(), np.asarray(deps, dtype=np.int64).tobytes()

