"""Timelines: what every op and message did, for a trace viewer.

Switch it on before the work you want to see, with
``PARTIALCOLL_TIMELINE=trace.json`` in the environment (read when
partialcoll is imported) or ``partialcoll.timeline.enable("trace.json")``.
At exit (or at :func:`write`, collective) every rank's events are merged
into one Chrome trace / Perfetto JSON file: one process per rank, one track
per schedule with a span per op (ready to complete), a track for the
emulated wire, and arrows from each send to the receive that took it.  Open
it in https://ui.perfetto.dev or chrome://tracing.  Off by default; when off
the executor pays one branch per event site.

Events (the C core's names): ``ready``, ``start``, ``gated`` (a send waits
in a gate), ``released`` (handed to the wire), ``wire_start``/``wire_end``
(bytes on the emulated wire), ``delivered``/``dropped``/``timedout``
(receive outcomes), ``complete``, ``round``.  An op's event says
whether an application thread ran it (``on_caller``: a caller driving
progress while it waits) rather than the progress thread.  Times are the
executor's clock
(:func:`partialcoll.now`), shared by the processes of a host; a merged
trace puts every rank's on the clock of ``comm``'s rank 0, with the
offsets estimated by :mod:`partialcoll.core.clock` (their error bounds
are in the file).

Reading one back: ``tl = load("trace.json")``, then ``tl.transfers()``
(one row per message: who, when it was released, on the wire, delivered),
``tl.out_of_order(...)`` and ``tl.link_busy(...)``; see :class:`Timeline`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..core import clock, control, engine, env, libcomm
from ..core.errors import ScheduleError
from ..core.checks import check_comm
from ..core.slots import OUTCOMES as _OUTCOMES

_C = engine.CONSTANTS
EVENT_NAMES = {_C[k]: k[3:].lower() for k in _C if k.startswith("EV_")}
KIND_NAMES = _C["kinds"]
#: one recorded event (mirrors pc_tl_event in csrc/common/pc_trace.h)
EVENT_DTYPE = np.dtype([("t", "f8"), ("sched", "u8"), ("round", "u8"),
                        ("bytes", "i8"), ("op", "i4"), ("ev", "i4"),
                        ("kind", "i4"), ("peer", "i4"), ("tag", "i4"),
                        ("prio", "i4"), ("outcome", "i4"), ("flags", "i4")])
if engine.record_timeline(False) != EVENT_DTYPE.itemsize:
    raise ImportError("partialcoll._core and timeline.py disagree on the "
                      "event layout: rebuild the extension")

_state: dict[str, Any] = {"path": None, "chunks": [], "on": False}


def enable(path: str | os.PathLike[str] | None = None) -> None:
    """Start recording; ``path``: where the merged trace is written at exit
    (default: nowhere; read the events with :func:`events` or write them
    with :func:`write`)."""
    if path is not None:                 # found out now, not at exit
        where = os.path.dirname(os.path.abspath(os.fspath(path)))
        if not os.path.isdir(where) or not os.access(where, os.W_OK):
            raise ScheduleError(f"cannot write the timeline to {path!r}: "
                                f"{where} is not a writable directory")
    _state["path"] = path if path is not None else _state["path"]
    _state["on"] = True
    engine.record_timeline(True)


def disable() -> None:
    """Stop recording (what was recorded stays until :func:`clear`)."""
    _state["on"] = False
    engine.record_timeline(False)


def enabled() -> bool:
    """Whether events are being recorded."""
    return _state["on"]


def raw() -> npt.NDArray[np.void]:
    """Every event recorded by this process so far (a structured array)."""
    data = engine.take_timeline()
    if data:
        _state["chunks"].append(np.frombuffer(data, EVENT_DTYPE).copy())
    if not _state["chunks"]:
        return np.zeros(0, EVENT_DTYPE)
    if len(_state["chunks"]) > 1:
        _state["chunks"] = [np.concatenate(_state["chunks"])]
    return _state["chunks"][0]


def clear() -> None:
    """Forget the events recorded so far by this process."""
    raw()
    _state["chunks"] = []


def _decode(row, rank=None):
    d = {"t": float(row["t"]), "ev": EVENT_NAMES.get(int(row["ev"]), "?"),
         "sched": int(row["sched"]), "op": int(row["op"]),
         "round": int(row["round"]), "peer": int(row["peer"]),
         "tag": int(row["tag"]), "bytes": int(row["bytes"]),
         "prio": int(row["prio"]),
         "kind": KIND_NAMES[row["kind"]] if row["kind"] >= 0 else None,
         "outcome": _OUTCOMES.get(int(row["outcome"]), "none"),
         "on_caller": bool(int(row["flags"]) & _C["TL_CALLER"])}
    if rank is not None:
        d["rank"] = rank
    return d


def events() -> list[dict[str, Any]]:
    """This process's events as dicts (see the module docstring)."""
    return [_decode(r) for r in raw()]


# ---- merging and writing ---------------------------------------------------
def write(path: str | os.PathLike[str], comm: MPI.Comm | None = None
          ) -> str | os.PathLike[str] | None:
    """Collective over ``comm`` (default COMM_WORLD): gather every rank's
    events and write one Chrome trace JSON at ``path`` on rank 0.

    Every rank's times are put on rank 0's clock (ranks on other hosts
    count from another origin): each rank sends them on ``comm``'s
    reference clock (:func:`partialcoll.core.clock.of`, an estimate made
    the first time, collective) and rank 0 reads them on its own.  The
    file's ``partialcoll.clock`` holds each rank's estimated offset and
    its error bound (seconds, by world rank)."""
    comm = check_comm(comm)
    clk = clock.of(comm)
    mine = raw().copy()
    mine["t"] = clk.to_reference(mine["t"])
    world = MPI.COMM_WORLD.Get_rank()
    everyone = comm.gather((world, clk.offset, clk.error, mine.tobytes()),
                           root=0)
    control.settle()
    if comm.Get_rank() != 0:
        return None
    assert everyone is not None          # gathered at rank 0
    per_rank = {}
    for r, _, _, b in everyone:
        per_rank[r] = np.frombuffer(b, EVENT_DTYPE).copy()
        per_rank[r]["t"] = clk.to_local(per_rank[r]["t"])
    trace = to_chrome(per_rank)
    trace["partialcoll"]["clock"] = {
        "reference": world, "offsets": {str(r): o for r, o, _, _ in everyone},
        "errors": {str(r): e for r, _, e, _ in everyone}}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return path


@libcomm.register("at_exit")
def write_at_exit() -> None:
    """Exit hook (every rank, after partial objects quiesced): writes the
    merged trace if a path was given (PARTIALCOLL_TIMELINE or
    enable(path))."""
    path = _state["path"]
    if path and MPI.Is_initialized() and not MPI.Is_finalized():
        write(path)


def _spans(rank, evs, t0):
    """Op spans (start -> complete) of one rank, as Chrome 'X' events."""
    out, open_ = [], {}
    for e in evs:
        key = (int(e["sched"]), int(e["op"]), int(e["round"]))
        name = EVENT_NAMES.get(int(e["ev"]))
        if name == "start":
            open_[key] = e
        elif name == "complete" and key in open_:
            s = open_.pop(key)
            kind = KIND_NAMES[e["kind"]] if e["kind"] >= 0 else "op"
            label = kind if e["peer"] < 0 else \
                f"{kind} {'to' if kind == 'send' else 'from'} {e['peer']}"
            out.append({"name": label, "cat": kind, "ph": "X", "pid": rank,
                        "tid": int(e["sched"]),
                        "ts": (s["t"] - t0) * 1e6,
                        "dur": max((e["t"] - s["t"]) * 1e6, 0.01),
                        "args": {"op": int(e["op"]), "round": int(e["round"]),
                                 "tag": int(e["tag"]),
                                 "bytes": int(e["bytes"]),
                                 "prio": int(e["prio"]),
                                 "outcome": _OUTCOMES.get(int(e["outcome"]))}})
    return out


def to_chrome(per_rank: dict[int, npt.NDArray[np.void]]) -> dict[str, Any]:
    """Chrome trace (dict) from {world rank: event array}, every rank's
    times on one clock."""
    allt = [a["t"].min() for a in per_rank.values() if len(a)]
    t0 = min(allt) if allt else 0.0
    out = []
    for rank, evs in sorted(per_rank.items()):
        out.append({"name": "process_name", "ph": "M", "pid": rank,
                    "args": {"name": f"rank {rank}"}})
        out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": "wire (emulated)"}})
        out += _spans(rank, evs, t0)
    tl = Timeline(per_rank)
    for k, x in enumerate(tl.transfers()):
        if not math.isnan(x["wire_start"]):
            out.append({"name": f"to {x['dst']}", "cat": "wire", "ph": "X",
                        "pid": x["src"], "tid": 0,
                        "ts": (x["wire_start"] - t0) * 1e6,
                        "dur": max((x["wire_end"] - x["wire_start"]) * 1e6,
                                   0.01),
                        "args": {"bytes": x["bytes"], "tag": x["tag"],
                                 "prio": x["prio"]}})
        if not math.isnan(x["delivered"]):
            common = {"name": "message", "cat": "message", "id": k}
            out.append(dict(common, ph="s", pid=x["src"], tid=x["sched"],
                            ts=(x["released"] - t0) * 1e6))
            out.append(dict(common, ph="f", bp="e", pid=x["dst"],
                            tid=x["recv_sched"],
                            ts=(x["delivered"] - t0) * 1e6))
    rows = {str(r): a.tolist() for r, a in per_rank.items()}
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "partialcoll": {"fields": list(EVENT_DTYPE.names or ()), "t0": t0,
                            "events": rows}}


# ---- reading ---------------------------------------------------------------
def load(path: str | os.PathLike[str]) -> Timeline:
    """A :class:`Timeline` from a file written by :func:`write`."""
    with open(path) as f:
        data = json.load(f)["partialcoll"]
    per_rank = {int(r): np.array([tuple(x) for x in rows], EVENT_DTYPE)
                for r, rows in data["events"].items()}
    return Timeline(per_rank)


class Timeline:
    """Events of every rank ({world rank: event array}), with the figures
    the network experiments need."""

    def __init__(self, per_rank: dict[int, npt.NDArray[np.void]]) -> None:
        self.per_rank = per_rank

    def events(self) -> list[dict[str, Any]]:
        """Every rank's events as dicts (see the module docstring), with
        their ``rank``, rank by rank."""
        return [_decode(r, rank) for rank, a in sorted(self.per_rank.items())
                for r in a]

    def transfers(self) -> list[dict[str, Any]]:
        """One dict per data message (stamped control messages excluded):
        src, dst, tag, bytes, prio, round, sched, op; times ``gated``
        (NaN if it never waited), ``released`` (handed to the wire),
        ``wire_start``/``wire_end`` (emulated network, else NaN),
        ``delivered`` (the receive completed, NaN if it never did) and the
        receive's ``outcome``.  Sends and receives are paired in order per
        (src, dst, tag), as MPI matches them."""
        sends: dict[tuple[int, ...], dict[str, Any]] = {}
        recvs: dict[tuple[int, int, int], list[tuple[float, str, int]]] = {}
        for rank, a in self.per_rank.items():
            for e in a:
                name = EVENT_NAMES.get(int(e["ev"]))
                if e["flags"] & _C["F_STAMPED"] or e["tag"] < 0:
                    continue
                key = (int(e["sched"]), int(e["op"]), int(e["round"]))
                if name in ("gated", "released", "wire_start", "wire_end"):
                    d = sends.setdefault((rank,) + key, {
                        "src": rank, "dst": int(e["peer"]), "tag": int(e["tag"]),
                        "bytes": int(e["bytes"]), "prio": int(e["prio"]),
                        "round": int(e["round"]), "sched": int(e["sched"]),
                        "op": int(e["op"]), "gated": math.nan,
                        "released": math.nan, "wire_start": math.nan,
                        "wire_end": math.nan})
                    if math.isnan(d[name]):
                        d[name] = float(e["t"])
                elif name in ("delivered", "dropped", "timedout") and \
                        e["kind"] == _C["RECV"]:
                    recvs.setdefault((int(e["peer"]), rank, int(e["tag"])),
                                     []).append((float(e["t"]), name,
                                                 int(e["sched"])))
        pairs: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
        for d in sorted(sends.values(), key=lambda d: d["released"]):
            pairs.setdefault((d["src"], d["dst"], d["tag"]), []).append(d)
        out = []
        for key, ds in pairs.items():
            got = sorted(recvs.get(key, []))
            for k, d in enumerate(ds):
                t, outcome, rs = got[k] if k < len(got) else \
                    (math.nan, "none", -1)
                d.update(delivered=t if outcome == "delivered" else math.nan,
                         outcome=outcome, recv_sched=rs)
                out.append(d)
        return sorted(out, key=lambda d: d["released"])

    def out_of_order(self, src: int | None = None) -> tuple[int, int]:
        """Share of transfers that left a rank while a transfer to the same
        destination with a lower priority number was already waiting for
        it (gated before, released after).  Counts only transfers that had
        something waiting; returns (out_of_order, compared)."""
        xs = [x for x in self.transfers() if src is None or x["src"] == src]
        bad = compared = 0
        by_link: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for x in xs:
            by_link.setdefault((x["src"], x["dst"]), []).append(x)
        for link in by_link.values():
            for x in link:
                waiting = [y for y in link if y is not x and
                           not math.isnan(y["gated"]) and
                           y["gated"] <= x["released"] < y["released"]]
                if not waiting:
                    continue
                compared += 1
                bad += any(y["prio"] < x["prio"] for y in waiting)
        return bad, compared

    def link_busy(self, src: int, t0: float | None = None,
                  t1: float | None = None) -> tuple[float, int]:
        """Share of [t0, t1] during which rank src's emulated outgoing NIC
        carried at least one message, and the bytes it carried."""
        spans = sorted((x["wire_start"], x["wire_end"], x["bytes"])
                       for x in self.transfers()
                       if x["src"] == src and not math.isnan(x["wire_start"]))
        if not spans:
            return 0.0, 0
        t0 = spans[0][0] if t0 is None else t0
        t1 = max(e for _, e, _ in spans) if t1 is None else t1
        busy, cur_s, cur_e = 0.0, None, None
        for s, e, _ in spans:
            s, e = max(s, t0), min(e, t1)
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                busy += 0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += 0 if cur_e is None else cur_e - cur_s
        return busy / max(t1 - t0, 1e-12), sum(b for _, _, b in spans)


def _from_environment():
    path = env.get(env.TIMELINE)
    if path:
        enable(path)


_from_environment()
