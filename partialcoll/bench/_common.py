"""Shared helpers of the benchmarks: size parsing, cross-rank statistics,
table/CSV/JSON output, progress bar on rank 0."""
import csv
import json
import sys

import numpy as np
from mpi4py import MPI


def parse_size(text):
    """'8', '4K', '4KiB', '1M' -> bytes."""
    t = text.strip().upper().replace("IB", "").replace("B", "")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def fmt_size(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"


def across_ranks(value, comm):
    """(avg, min, max) of a per-rank value over all ranks."""
    v = np.array([value], dtype=np.float64)
    tot, mn, mx = np.empty(1), np.empty(1), np.empty(1)
    comm.Allreduce(v, tot, op=MPI.SUM)
    comm.Allreduce(v, mn, op=MPI.MIN)
    comm.Allreduce(v, mx, op=MPI.MAX)
    return tot[0] / comm.size, mn[0], mx[0]


def progress(iterable, comm, desc, total=None):
    """tqdm on rank 0 when it is installed and stderr is a terminal or
    PARTIALCOLL_PROGRESS=1; the iterable itself otherwise."""
    import os
    if comm.rank != 0 or not (sys.stderr.isatty() or
                              os.environ.get("PARTIALCOLL_PROGRESS") == "1"):
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, file=sys.stderr)


def emit(rows, columns, args, title, comm):
    """Print a table on rank 0; write --csv / --json if asked."""
    if comm.rank != 0:
        return
    print(f"# {title}")
    widths = [max(len(c), *(len(_cell(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_cell(r[c]).rjust(w) for c, w in zip(columns, widths)))
    sys.stdout.flush()
    if getattr(args, "csv", None):
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else columns)
            w.writeheader()
            w.writerows(rows)
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump({"title": title, "rows": rows}, f, indent=1)


def _cell(v):
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def cli(module, name, argv=None):
    """The command line of one benchmark module (its add_args and run)."""
    import argparse
    p = argparse.ArgumentParser(prog=f"python -m partialcoll.bench {name}",
                                description=module.__doc__)
    module.add_args(p)
    return module.run(p.parse_args(argv))
