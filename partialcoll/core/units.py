"""Sizes, rates and durations written as text, with one convention for the
whole library: the benchmark command line, the emulated network's TOML and
the Python functions that take them (``partialcoll.network.rate``, ...).

Sizes (bytes):

* ``"64KiB"``, ``"4 MiB"``, ``"1GiB"``: binary (IEC), 2^10, 2^20, 2^30;
* ``"64kB"``, ``"64KB"``, ``"4 MB"``: decimal (SI), 10^3, 10^6, 10^9, as
  disks and networks quote them;
* ``"64K"``, ``"4M"``, ``"1G"`` (no ``B``): binary, as MPI and NCCL
  benchmarks read their size options (``osu_allreduce -m 8:4M``,
  ``all_reduce_perf -e 4M``);
* ``"8"``, ``"8B"`` or a number: bytes.

Rates (bytes per second): ``"10 MB/s"`` (decimal), ``"2.5 MiB/s"``
(binary), ``"1 Gb/s"`` or ``"1 Gbit/s"`` (bits: divided by 8, decimal),
a number of bytes per second, or ``"unlimited"``.  A rate needs its unit
spelled out: ``"10M/s"`` is refused.

Durations (seconds): ``"1 ms"``, ``"250 us"`` (also ``µs``), ``"10 ns"``,
``"2 s"``, ``"0"`` or a number of seconds.

Whole numbers of bytes only: ``"1.5K"`` is 1,536 bytes, ``"0.1B"`` is
refused.  No library reads the bare-suffix convention of the MPI tools,
so this module does (one regular expression per kind)."""
from __future__ import annotations

import math
import re

from .errors import ArgumentTypeError, ScheduleError

_DECIMAL = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
_BINARY = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_SIZE = re.compile(_NUMBER + r"\s*(?:([kKmMgGtT])(i?)(B?)|(B?))")
_RATE = re.compile(_NUMBER + r"\s*(?:([kKmMgGtT])(i?))?(B|b|bit)(?:/s|ps)")
_TIME = re.compile(_NUMBER + r"\s*(s|ms|us|µs|ns)")

SIZE_HELP = ("bytes: 64K, 4M (binary, as MPI tools), 64KiB, 4MiB (binary) "
             "or 64kB, 4MB (decimal)")


def _number(value):
    """``value`` as a float if it is an int or float (not a bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def size(value: str | float, what: str = "size", minimum: int = 0) -> int:
    """Bytes (an int) from ``"64K"``, ``"64KiB"``, ``"64kB"``, ``"8"`` or a
    number (the module docstring gives the convention); at least
    ``minimum``.  Raises ScheduleError naming ``what`` otherwise."""
    v = _number(value)
    if v is None:
        if not isinstance(value, str):
            raise ArgumentTypeError(f"{what} must be a size such as '4MiB' "
                                    f"or a number of bytes, not "
                                    f"{type(value).__name__}")
        m = _SIZE.fullmatch(value.strip())
        if not m:
            raise ScheduleError(f"{what}: cannot read {value!r} as a size "
                                f"(write e.g. '8', '64K', '4MiB' or '1MB')")
        number, prefix, iec, unit, _ = m.groups()
        v = float(number)
        if prefix:
            decimal = unit == "B" and not iec
            v *= (_DECIMAL if decimal else _BINARY)[prefix.lower()]
    if not math.isfinite(v) or v != int(v):
        raise ScheduleError(f"{what} must be a whole number of bytes, got "
                            f"{value!r}")
    if v < minimum:
        raise ScheduleError(f"{what} must be at least {minimum} bytes, got "
                            f"{value!r}")
    return int(v)


def rate(value: str | float, what: str = "rate") -> float:
    """Bytes per second (a float; math.inf for ``"unlimited"``) from
    ``"10 MB/s"``, ``"2.5 MiB/s"``, ``"1 Gb/s"`` or a number > 0."""
    v = _number(value)
    if v is None:
        text = str(value).strip()
        if text.lower() in ("unlimited", "inf", "none"):
            return math.inf
        m = _RATE.fullmatch(text)
        if not m:
            raise ScheduleError(f"{what}: cannot read {value!r} as a rate "
                                f"(write e.g. '10 MB/s', '2 MiB/s', "
                                f"'1 Gb/s' or 'unlimited')")
        number, prefix, iec, unit = m.groups()
        v = float(number)
        if prefix:
            v *= (_BINARY if iec else _DECIMAL)[prefix.lower()]
        if unit != "B":
            v /= 8
    if not v > 0 or math.isnan(v):
        raise ScheduleError(f"{what} must be > 0, got {value!r}")
    return v


def duration(value: str | float, what: str = "time") -> float:
    """Seconds (a float >= 0) from ``"1 ms"``, ``"250 us"``, ``"2 s"``,
    ``"0"`` (zero needs no unit) or a number of seconds."""
    v = _number(value)
    if v is None:
        text = str(value).strip()
        try:
            bare = float(text)
        except ValueError:
            bare = None
        if bare == 0:
            v = 0.0
        else:
            m = _TIME.fullmatch(text)
            if not m:
                raise ScheduleError(f"{what}: cannot read {value!r} as a "
                                    f"duration (write e.g. '1 ms', '250 us' "
                                    f"or '2 s')")
            v = float(m.group(1)) * _SECONDS[m.group(2)]
    if not 0 <= v < 1e6:
        raise ScheduleError(f"{what} must be >= 0 and finite, got "
                            f"{value!r}")
    return v


def format_size(n: int) -> str:
    """Bytes as the shortest exact binary text: 8 -> '8B', 65536 ->
    '64KiB', 4194304 -> '4MiB'."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"
