"""An emulated network for one host: slow, uneven and lossy links.

Every message of every library communicator of the process goes through
it (the C transport in ``csrc/transport/netem*.c``): each rank has an
outgoing and an incoming NIC with a rate, each ordered pair of ranks is a
FIFO channel with a latency, messages on the wire at the same time share
NICs max-min fairly (two senders into one receiver get half each), rates
may follow a seeded piecewise-constant trace, and messages are lost with a
probability per pair and traffic class.  Everything random is seeded: the
same drops and rates in every run.

Describe it in TOML (rates: ``"10 MB/s"``, ``"2.5 MiB/s"``, ``"1 Gb/s"``
(bits), a number of bytes/s, or ``"unlimited"``; times: ``"1 ms"``,
``"250 us"``, ``"2 s"`` or seconds)::

    seed = 1
    drop_mode = "told"           # or "silent": the receiver must time out
    message_overhead = "0 ms"    # per message (default 0), see below
    [default]
    out_rate = "10 MB/s"
    in_rate = "10 MB/s"
    latency = "1 ms"
    drop = 0.0
    [rank.0]                     # per-rank overrides
    out_rate = "100 MB/s"
    [[pair]]                     # per ordered pair (optional `class`)
    src = 0
    dst = 1
    latency = "5 ms"
    drop = 0.05
    [class.1]                    # per traffic class (Schedule.send(traffic_class=1))
    drop = 0.1
    priority = "low"             # "high" (default) or "low"
    [priority]                   # how the two levels share a NIC
    weight = 8                   # a high flow gets 8x a low one (or "strict")
    low_buffer = "64 KB"         # low data a sender's NIC holds; beyond: dropped
    [[trace]]                    # a new rate every `every`, per NIC
    ranks = "all"                # or a list
    nic = "both"                 # "out", "in" or "both" (drawn independently)
    every = "2 s"
    factors = [1, 2.5, 3.3, 5, 10]     # of the NIC's base rate (or `rates`)
    probabilities = [0, 0, 0, 0.1, 0.9]

and use it with ``PARTIALCOLL_NETWORK=net.toml`` (read when partialcoll is
imported: every rank of the job then shares one network) or
``partialcoll.network.enable("net.toml")`` (collective over
``MPI.COMM_WORLD``, before any message is in flight).

A per-message cost: ``message_overhead`` (default 0) is how long a message
at the head of its channel holds the channel before its first byte moves,
taking no share of a NIC meanwhile: a sender's work per message (a system
call, protocol processing, a server handling a request).  Back-to-back
messages of s bytes on one channel then move at most s / (overhead + s /
rate) bytes/s, so cutting data into small messages costs time, as on a
real network; with 0, messages on a channel are pipelined for free.

Priority: every class is "high" (default) or "low"; a pair's channel is
FIFO per level, flows share NICs by weight (weighted max-min: a high flow
gets ``weight`` times the share of a low one; "strict" is a weight of
10^6), and a sender's NIC holds at most ``low_buffer`` bytes of low-priority
data waiting or on the wire: a low message that does not fit is dropped at
once (tail drop; told or silent as other drops).

A drop probability applies to (src, dst, class) from the most specific
entry: a ``[[pair]]`` with that class, a ``[[pair]]`` without one, the
class's table, then ``[default]``.  Round-stamped control messages (the
activation of partial collectives) are delayed like the rest but never
lost.  A lost message still occupies the wire.

What it does not model: queueing and buffers inside switches, congestion
control, and several hosts.  All ranks share one clock and one
shared-memory segment, so it runs on one machine only: enabling it over
ranks on more than one host raises an error on every rank (each host
would otherwise model its own copy of the network, silently).
"""
from __future__ import annotations

import hashlib
import math
import os
from typing import Any

from mpi4py import MPI

from ..core import control, engine, env, units
from . import network_schema
from ..core.errors import ArgumentTypeError, ScheduleError
from ..core.checks import check_comm

_state: dict[str, Any] = {"config": None, "generation": 0}


def rate(value: str | float, what: str = "rate") -> float:
    """Bytes per second from '10 MB/s', '2.5 MiB/s', '1 Gb/s', a number, or
    'unlimited' (returns math.inf): :func:`partialcoll.core.units.rate`."""
    return units.rate(value, what)


def seconds(value: str | float, what: str = "time") -> float:
    """Seconds from '1 ms', '250 us', '2 s', '0' (zero needs no unit) or a
    number of seconds: :func:`partialcoll.core.units.duration`."""
    return units.duration(value, what)


def _bytes(value, what="[priority] low_buffer"):
    """Bytes from '64 KB' (decimal), '64 KiB', '64K' (binary) or a number."""
    return float(units.size(value, what))


def _rank(value, P, where):
    if not isinstance(value, int) or not 0 <= value < P:
        raise ScheduleError(f"{where}: rank {value!r} is not in 0..{P - 1}")
    return value


def _traces(cfg, P):
    out = []
    for k, t in enumerate(cfg.get("trace", [])):
        where = f"[[trace]] #{k + 1}"
        ranks = t.get("ranks", "all")
        ranks = list(range(P)) if ranks == "all" else \
            [_rank(r, P, where) for r in ranks]
        nic = {"out": 0, "in": 1, "both": 2}[t.get("nic", "both")]
        factors = "factors" in t
        values = [float(v) if factors else rate(v, where)
                  for v in (t["factors"] if factors else t["rates"])]
        probs = t.get("probabilities", [1 / len(values)] * len(values))
        if len(probs) != len(values) or not abs(sum(probs) - 1) <= 1e-6:
            raise ScheduleError(f"{where}: probabilities must be one per "
                                "value, >= 0, summing to 1")
        out.append(dict(ranks=ranks, nic=nic,
                        every=seconds(t.get("every", 1.0), where),
                        factors=factors, values=values,
                        probabilities=[float(p) for p in probs]))
        if out[-1]["every"] <= 0:
            raise ScheduleError(f"{where}: every must be > 0")
    return out


def normalise(cfg: dict[str, Any], nranks: int) -> dict[str, Any]:
    """Check a parsed description (a dict, as from TOML) for ``nranks``
    ranks; returns the normalised dict every rate/probability resolved."""
    if not isinstance(cfg, dict):
        raise ArgumentTypeError(f"a network description is a dict (or a TOML "
                                f"file, for load()), not "
                                f"{type(cfg).__name__}")
    network_schema.check(cfg)          # its shape; values and ranks below
    P = nranks
    default = cfg.get("default", {})
    mode = cfg.get("drop_mode", "told")
    seed = cfg.get("seed", 0)
    nic = []
    for r in range(P):
        t = cfg.get("rank", {}).get(str(r), {})
        nic.append(tuple(rate(t.get(k, default.get(k, "unlimited")),
                              f"[rank.{r}] {k}")
                         for k in ("out_rate", "in_rate")))
    for key in cfg.get("rank", {}):
        if not key.isdigit() or int(key) >= P or str(int(key)) != key:
            raise ScheduleError(f"[rank.{key}]: not a rank of 0..{P - 1}")
    classes, levels = {}, {}
    for key, t in cfg.get("class", {}).items():
        if not key.isdigit() or int(key) >= 16 or str(int(key)) != key:
            raise ScheduleError(f"[class.{key}]: classes are 0..15")
        if "drop" in t:
            classes[int(key)] = float(t["drop"])
        levels[int(key)] = {"high": 0, "low": 1}[t.get("priority", "high")]
    prio = cfg.get("priority", {})
    weight = prio.get("weight", 1)
    weight = 1e6 if weight == "strict" else weight
    buffer = prio.get("low_buffer", "unlimited")
    buffer = math.inf if buffer == "unlimited" else _bytes(buffer)
    pairs = []
    for k, t in enumerate(cfg.get("pair", [])):
        where = f"[[pair]] #{k + 1}"
        s, d = _rank(t.get("src"), P, where), _rank(t.get("dst"), P, where)
        pairs.append(dict(src=s, dst=d, tclass=t.get("class", -2),
                          latency=None if "latency" not in t else
                          seconds(t["latency"], f"{where} latency"),
                          drop=None if "drop" not in t else
                          float(t["drop"])))
    return dict(ranks=P, seed=seed, drop_mode=mode, levels=levels,
                weight=float(weight), low_buffer=buffer,
                tick=seconds(cfg.get("tick", 0.001), "tick"), nic=nic,
                overhead=seconds(cfg.get("message_overhead", 0),
                                 "message_overhead"),
                latency=seconds(default.get("latency", 0), "[default] latency"),
                drop=float(default.get("drop", 0)),
                classes=classes, pairs=pairs, traces=_traces(cfg, P))


def _job_key():
    """The same string on every rank of this job on this host: the
    launcher's process and its start time (pid reuse cannot collide)."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        start = "0"
    return f"{ppid}-{start}"


def _text(n, shm):
    """The C core's description: one directive per line."""
    lines = [f"ranks {n['ranks']}", f"shm {shm}", f"seed {n['seed']}",
             f"mode {n['drop_mode']}", f"tick {n['tick']!r}",
             f"latency_default {n['latency']!r}",
             f"overhead {n['overhead']!r}"]
    for r, (o, i) in enumerate(n["nic"]):
        lines.append(f"nic {r} {-1 if math.isinf(o) else o!r} "
                     f"{-1 if math.isinf(i) else i!r}")
    for c in range(16):
        lines.append(f"drop_class {c} {n['classes'].get(c, n['drop'])!r}")
    for c, level in n["levels"].items():
        lines.append(f"level {c} {level}")
    lines.append(f"weights {n['weight']!r} 1.0")
    lines.append(f"low_buffer "
                 f"{-1 if math.isinf(n['low_buffer']) else n['low_buffer']!r}")
    for p in n["pairs"]:
        if p["latency"] is not None:
            lines.append(f"latency {p['src']} {p['dst']} {p['latency']!r}")
    # class-less pair entries first, so entries with a class override them
    for p in sorted(n["pairs"], key=lambda p: p["tclass"] != -2):
        if p["drop"] is not None:
            lines.append(f"drop {p['src']} {p['dst']} {p['tclass']} "
                         f"{p['drop']!r}")
    for t in n["traces"]:
        lines.append("trace " + " ".join(map(str, [
            len(t["ranks"]), *t["ranks"], t["nic"], repr(t["every"]),
            int(t["factors"]), len(t["values"]),
            *map(repr, t["values"]), *map(repr, t["probabilities"])])))
    return "\n".join(lines) + "\n"


def load(source: dict[str, Any] | str | os.PathLike[str]
         ) -> dict[str, Any]:
    """A description from a TOML path or a dict (not yet checked)."""
    if isinstance(source, dict):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ArgumentTypeError(f"a network is a dict or the path of a "
                                f"TOML file, got {type(source).__name__}")
    import tomllib
    try:
        with open(source, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ScheduleError(f"cannot read the network file {source!r}: "
                            f"{e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScheduleError(f"{source}: not valid TOML: {e}") from None


def _check_one_host(comm):
    """Collective: raise on every rank unless all ranks of ``comm`` share
    this host's shared memory (the emulated network is one segment there).

    On several hosts each host would model its own copy of the network
    (its own segment), and transfers between hosts would not share the
    links they cross: a silently different network.  So it is refused."""
    where = (MPI.Get_processor_name(), _job_key())
    everyone = comm.allgather(where)
    hosts = sorted({h for h, _ in everyone})
    keys = {k for _, k in everyone}
    if len(hosts) > 1:
        names = ", ".join(hosts[:4]) + (", ..." if len(hosts) > 4 else "")
        raise ScheduleError(
            f"the emulated network models one host, but the {len(everyone)} "
            f"ranks run on {len(hosts)} (hosts {names}): each host would "
            f"model its own copy of the network.  Run every rank on one "
            f"host (mpiexec -n P with no host file), or leave the network "
            f"out (unset {env.NETWORK}) across hosts")
    if len(keys) > 1:
        # one host, but the ranks' parent processes differ: each rank was
        # started through a wrapper of its own, and the ranks would name
        # different segments
        raise ScheduleError(
            f"the emulated network: the ranks were not all started by the "
            f"same launcher process ({len(keys)} different parents; a "
            f"wrapper such as 'sh -c' or a tool around each rank?), so they "
            f"cannot find one shared network segment.  Start the ranks "
            f"directly under mpiexec")


def _install(n, generation):
    digest = hashlib.sha1(repr(n).encode()).hexdigest()[:10]
    shm = f"/partialcoll-{_job_key()}-{generation}-{digest}"
    engine.set_network(_text(n, shm))
    _state["config"] = n


def enable(source: dict[str, Any] | str | os.PathLike[str],
           comm: MPI.Comm | None = None) -> dict[str, Any]:
    """Put every library communicator of the process on an emulated network.

    Collective over ``comm`` (default ``MPI.COMM_WORLD``, which the network
    must span); call it before any message is in flight.  ``source``: a
    TOML path or a dict (see the module docstring).  Returns the normalised
    description."""
    comm = check_comm(comm)
    if comm.Get_size() != MPI.COMM_WORLD.Get_size():
        raise ScheduleError("the emulated network spans MPI_COMM_WORLD: "
                            "enable it collectively over COMM_WORLD")
    n = normalise(load(source), comm.Get_size())
    _check_one_host(comm)
    everyone = comm.allgather(repr(n))
    if any(x != everyone[0] for x in everyone):
        raise ScheduleError("partialcoll.network.enable() was given "
                            "different descriptions on different ranks")
    _state["generation"] += 1
    _install(n, _state["generation"])
    comm.Barrier()
    control.settle()
    return n


def disable(comm: MPI.Comm | None = None) -> None:
    """Back to plain MPI (collective, no message in flight)."""
    comm = check_comm(comm)
    comm.Barrier()
    engine.set_network("")
    _state["config"] = None
    comm.Barrier()
    control.settle()


def current() -> dict[str, Any] | None:
    """The normalised description in use, or None (plain MPI)."""
    return _state["config"]


def nic_rate(rank: int, nic: str = "out",
             t: float | None = None) -> tuple[float, float]:
    """The rate (bytes/s, inf when unlimited) the network gives rank's
    outgoing or incoming NIC at time t (default now; traces included), and
    the network's time zero (traces redraw at t0 + k * every)."""
    if nic not in ("out", "in"):
        raise ScheduleError(f"nic must be 'out' or 'in', got {nic!r}")
    return engine.network_rate(int(rank), {"out": 0, "in": 1}[nic],
                              engine.now() if t is None else float(t))


def _from_environment():
    path = env.get(env.NETWORK)
    if path:
        n = normalise(load(path), MPI.COMM_WORLD.Get_size())
        # collective: every rank imports partialcoll when the variable is set
        _check_one_host(MPI.COMM_WORLD)
        _install(n, 0)


_from_environment()
