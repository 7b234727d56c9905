"""Shared helpers of the benchmarks: size parsing, argparse types that
refuse bad values up front (on every rank alike, before any message: one
rank raising mid-run left the others waiting), cross-rank statistics,
table/CSV/JSON output, progress bar on rank 0."""
import argparse
import contextlib
import csv
import json
import math
import os
import re
import sys

import numpy as np
from mpi4py import MPI

from ..core import units
from ..core.errors import ScheduleError


def parse_size(text):
    """'8', '4K', '4KiB', '1M' -> bytes (binary), '64kB' -> 64,000: the
    library's one convention (:mod:`partialcoll.core.units`)."""
    return units.size(text)


def whole(low):
    """argparse type: a whole number >= ``low`` (``whole(1)`` for counts
    of iterations, steps, repeats; ``whole(0)`` for warm-up, seeds)."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < low:
            raise argparse.ArgumentTypeError(
                f"a whole number >= {low}, not {text!r}")
        return n
    parse.__name__ = f"whole number >= {low}"
    return parse


def real(low, positive=False, infinite=False):
    """argparse type: a finite number >= ``low`` (> ``low`` with
    ``positive``); NaN is refused, and infinities unless ``infinite``
    (then "inf" is allowed)."""
    def parse(text):
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        ok = math.isfinite(x) or (infinite and x == math.inf)
        if not ok or x < low or (positive and x == low):
            kind = "number" if infinite else "finite number"
            also = " or inf" if infinite else ""
            raise argparse.ArgumentTypeError(
                f"a {kind} {'>' if positive else '>='} {low}{also}, "
                f"not {text!r}")
        return x
    parse.__name__ = "number"
    return parse


def _read_by(read, example, hint=""):
    """An argparse type that checks its text with ``read`` (a function of
    :mod:`partialcoll.core.units`) and returns the text as given (the
    benchmark reads it again where it is used)."""
    def check(text):
        try:
            read(text)
        except ScheduleError as e:
            raise argparse.ArgumentTypeError(f"{e}{hint}") from None
        return text
    check.__name__ = example
    return check


#: argparse type: a size in bytes > 0 ('8', '4K', '4MiB', '1MB'); the
#: benchmark reads it with :func:`parse_size`
byte_size = _read_by(lambda t: units.size(t, minimum=1), "size",
                     f"; sizes are {units.SIZE_HELP}")
#: argparse type: a size in bytes >= 0, for options where 0 turns
#: something off (tictac-allreduce's --partition)
byte_size_or_0 = _read_by(units.size, "size", f"; sizes are {units.SIZE_HELP}")
#: argparse type: a rate ('10 MB/s', '2 MiB/s', '1 Gb/s'), for
#: ``partialcoll.network.rate``
rate_text = _read_by(units.rate, "rate")
#: argparse type: a duration ('20 ms', '250 us', '0'), for
#: ``partialcoll.network.seconds``
duration_text = _read_by(units.duration, "duration")


def float32_bytes(text):
    """argparse type of a message of float32 elements given in bytes: a
    size > 0 and a multiple of 4 ('4M' is 1,048,576 elements); returns
    the text, read again with :func:`parse_size`."""
    byte_size(text)
    if parse_size(text) % 4:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {parse_size(text)} bytes, not a whole number of "
            f"float32 elements (4 bytes each): give a multiple of 4")
    return text


float32_bytes.__name__ = "size"


def size_range(text):
    """argparse type of ``-m``: 'MIN:MAX' (or one size) -> (min, max) in
    bytes, as ``osu_allreduce -m 8:4M`` reads it."""
    lo, _, hi = text.partition(":")
    lo, hi = byte_size(lo or "1"), byte_size(hi or lo or "1")
    if parse_size(lo) > parse_size(hi):
        raise argparse.ArgumentTypeError(f"MIN is larger than MAX in "
                                         f"{text!r}")
    return parse_size(lo), parse_size(hi)


def factor(text):
    """argparse type of ``-f``: a number > 1, the ratio of one size of a
    sweep to the last."""
    try:
        f = float(text)
    except ValueError:
        f = 0.0
    if not f > 1 or not math.isfinite(f):
        raise argparse.ArgumentTypeError(f"a factor > 1, not {text!r}")
    return f


def sizes_between(lo, hi, step):
    """[lo, lo x step, ...] up to ``hi`` (bytes, whole, each once)."""
    out, s = [], float(lo)
    while s <= hi:
        if not out or int(s) != out[-1]:
            out.append(int(s))
        s *= step
    return out


# The options every benchmark spells alike (a test over every command
# keeps it so): -i/--iters for timed iterations, -x/--warmup for untimed
# ones first, -d/--dtype for the element type, -m MIN:MAX and -f for a
# sweep over message sizes, and sizes in bytes read by parse_size.

def add_iters(p, default, help, *aliases):
    """``-i/--iters``: timed iterations (``aliases``: other spellings of
    the same option, such as OSU's ``--iterations``)."""
    p.add_argument("-i", "--iters", *aliases, dest="iters", type=whole(1),
                   default=default, help=help)


def add_warmup(p, default, help):
    """``-x/--warmup``: untimed iterations before the timed ones."""
    p.add_argument("-x", "--warmup", type=whole(0), default=default,
                   help=help)


def add_dtype(p, choices, default="float32", *aliases):
    """``-d/--dtype``: the element type of the messages."""
    p.add_argument("-d", "--dtype", *aliases, dest="dtype", choices=choices,
                   default=default, metavar="DTYPE",
                   help=f"element type: {', '.join(choices)}")


def add_size_range(p, default, group=None):
    """``-m MIN:MAX`` (into ``group`` if given: a mutually exclusive one)
    and ``-f``: the sizes of a sweep, OSU style; the caller turns them
    into sizes with :func:`sizes_between`.  ``default`` says in --help
    what runs without ``-m``."""
    (group or p).add_argument(
        "-m", "--message-size", type=size_range, default=None,
        metavar="MIN:MAX",
        help=f"size range in bytes, OSU style (default: {default})")
    p.add_argument("-f", "--stepfactor", type=factor, default=None,
                   help="each size of the range is the last times this "
                        "(default 2)")


class _Renamed(argparse.Action):
    """A former option that still works: its value, converted into the
    text the new option reads, goes to the new option's destination, and
    rank 0 says what to write instead."""

    def __init__(self, option_strings, dest, new, convert, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.convert = new, convert

    def __call__(self, parser, namespace, values, option_string=None):
        text = self.convert(values)
        setattr(namespace, self.dest, text)
        parser._print_message(f"{parser.prog}: {option_string} is "
                              f"deprecated: {option_string} {values} is "
                              f"{self.new} {text}\n", sys.stderr)


def add_renamed(group, old, new, dest, type, convert, metavar, help):
    """``old`` kept as a deprecated spelling of ``new`` (in the same
    mutually exclusive ``group``): ``type`` checks its value,
    ``convert`` turns it into ``new``'s text, stored in ``dest``."""
    group.add_argument(old, action=_Renamed, dest=dest, new=new,
                       convert=convert, type=type, metavar=metavar,
                       default=argparse.SUPPRESS,
                       help=f"deprecated: {help}; write {new}")


def listed(item, empty=False):
    """argparse type: a comma-separated list whose every entry ``item``
    (an argparse type) accepts; returns the text as given (the benchmark
    splits it), so a bad entry is refused before the run.  With
    ``empty``, '' is accepted too (a part to skip)."""
    def parse(text):
        entries = [t for t in text.split(",") if t.strip()]
        if empty and text == "":
            return text
        if not entries:
            raise argparse.ArgumentTypeError("an empty list")
        for t in entries:
            item(t.strip())
        return text
    parse.__name__ = "list"
    return parse


def one_of(names, empty=False):
    """argparse type: a comma-separated list of keys of ``names`` (with
    ``empty``, '' too: none of them)."""
    def parse(text):
        if empty and text == "":
            return text
        for t in text.split(","):
            if t not in names:
                raise argparse.ArgumentTypeError(
                    f"{t!r} is not one of {', '.join(sorted(names))}")
        return text
    parse.__name__ = "list"
    return parse


def writable(path):
    """argparse type of an output file (--csv, --json, --plot): its
    directory must exist and be writable now, so a long run's results are
    not lost at the end."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(
            f"cannot write {path!r}: no directory {folder!r}")
    if os.path.isdir(path) or not os.access(folder, os.W_OK) or \
            (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {path!r}")
    return path


def fmt_size(n):
    return units.format_size(n)


def across_ranks(value, comm):
    """(avg, min, max) of a per-rank value over all ranks."""
    v = np.array([value], dtype=np.float64)
    tot, mn, mx = np.empty(1), np.empty(1), np.empty(1)
    comm.Allreduce(v, tot, op=MPI.SUM)
    comm.Allreduce(v, mn, op=MPI.MIN)
    comm.Allreduce(v, mx, op=MPI.MAX)
    return tot[0] / comm.size, mn[0], mx[0]


def settle(comm, n=1, calls=200):
    """A job's first collectives are slow (connections made on first use,
    pages touched, ranks still starting on shared cores): ``calls``
    untimed MPI_Allreduce calls of ``n`` float32 before the first timed
    row, so that the run's first row is not the only one that pays for
    them."""
    x = np.ones(n, np.float32)
    for _ in range(calls):
        comm.Allreduce(MPI.IN_PLACE, x)
    comm.Barrier()


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


def versions():
    """{"partialcoll", "MPI", "mpi4py", "numpy", "python"} (and "torch"
    when the benchmark imported it): what every table's header names."""
    import platform
    import mpi4py
    from .. import __version__
    out = {"partialcoll": __version__,
           "MPI": MPI.Get_library_version().splitlines()[0].strip(),
           "mpi4py": mpi4py.__version__, "numpy": np.__version__,
           "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
    return out


def versions_line():
    v = versions()
    # "MPICH Version:      5.0.2", "Open MPI v5.0.11, package: ...": the
    # library and its version
    mpi = " ".join(w for w in v["MPI"].split(",")[0].split()
                   if w != "Version:")
    return ", ".join([f"partialcoll {v['partialcoll']}", mpi] +
                     [f"{k} {v[k]}" for k in ("mpi4py", "numpy", "python",
                                             "torch") if k in v])


def emit(rows, columns, args, title, comm, legend=None):
    """Print a table on rank 0: a short header (``title`` and the versions
    of partialcoll, MPI and the rest), the rows, then ``legend`` (a
    {column: meaning} dict, or a list of lines) below; write --csv / --json
    if asked (the JSON with the versions)."""
    if comm.rank != 0:
        return
    print(f"# {title}")
    print(f"# {versions_line()}")
    widths = [max(len(c), *(len(_cell(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_cell(r[c]).rjust(w) for c, w in zip(columns, widths)))
    if legend:
        items = legend.items() if isinstance(legend, dict) else \
            [(None, line) for line in legend]
        for name, meaning in items:
            print(f"  {name}: {meaning}" if name else f"  {meaning}")
    sys.stdout.flush()
    if getattr(args, "csv", None):
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else columns)
            w.writeheader()
            w.writerows(rows)
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump({"title": title, "versions": versions(), "rows": rows},
                      f, indent=1)


def _cell(v):
    if isinstance(v, float):
        if 0 < abs(v) < 1e-3:
            return f"{v:.2e}"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def auto_or_count(text):
    """argparse type of an option that takes 'auto' or a whole number
    >= 0 (--blas-threads, the aware benchmark's --min-probe)."""
    import argparse
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"'auto' or a whole number >= 0, not {text!r}")
    return n


@contextlib.contextmanager
def limit_blas(threads, comm):
    """Cap this rank's BLAS thread pool (OpenBLAS, MKL, BLIS, through
    threadpoolctl) inside the ``with`` block, which gets the cap (None:
    left alone); the library's own setting comes back after it.

    ``threads``: 'auto' shares the host's cores among the ranks on it
    (at least one thread each); 0 leaves the library's own default.  Why:
    NumPy's OpenBLAS starts a pool of one thread per core in every process,
    and its idle threads spin for a while after each call.  With more ranks
    than cores (8 on 2 here) the pools of ranks just out of a matrix
    product keep every core busy: in the MLfabric benchmark they took
    two thirds of the CPU and stretched the workers' steps (100 ms of
    emulated compute) from about 170 ms to 290 ms (docs/results.md)."""
    if threads == 0:
        yield None
        return
    if threads == "auto":
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        threads = max(1, len(os.sched_getaffinity(0)) // local.size)
        local.Free()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise SystemExit("--blas-threads needs threadpoolctl: pip install "
                         "'partialcoll[bench]' (or --blas-threads 0)")
    with threadpool_limits(limits=threads, user_api="blas"):
        yield threads


class Parser(argparse.ArgumentParser):
    """argparse's parser, printing (usage, errors, --help, --version) on
    rank 0 only: every rank parses the same command line, and a mistake is
    said once, not once per rank.  Every rank exits with the same status."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The descriptions as written, and every option's default in its
    help line (where the help text does not already give it)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and "default" not in text and \
                action.default not in (None, False, argparse.SUPPRESS) and \
                not isinstance(action, (argparse._HelpAction,
                                        argparse._VersionAction)):
            text += " (default: %(default)s)"
        return text


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?: <[^>]*>)?`")


def plain(text):
    """A module docstring as a command's description: Sphinx roles
    (``:func:`~.mod.name```) as plain names, for a terminal."""
    def name(m):
        target = m.group(1)
        return "``" + (target.rsplit(".", 1)[-1] if m.group(0)[m.group(0)
                       .index("`") + 1] == "~" else target.lstrip(".")) + "``"
    return _ROLE.sub(name, text or "")


def cli(module, name, argv=None):
    """The command line of one benchmark module (its add_args and run)."""
    p = Parser(prog=f"partialcoll-bench {name}",
               description=plain(module.__doc__),
               formatter_class=HelpFormatter)
    module.add_args(p)
    return module.run(p.parse_args(argv))


DEVICES = ("host", "gpu", "emulate")


def add_device_arg(p):
    p.add_argument("--device", choices=DEVICES, default="host",
                   help="where partialcoll's buffers live: host (NumPy), gpu "
                        "(CuPy; rank r uses GPU r %% GPUs) or emulate (host "
                        "memory treated as device memory: runs the GPU code "
                        "path without a GPU, for testing); MPI_Allreduce "
                        "always runs on host buffers of the same size")


class Buffers:
    """Arrays where ``--device`` says, and the comparisons that go with
    them (NCCL through ``cupyx.distributed`` on GPUs)."""

    def __init__(self, device, comm):
        self.device, self.comm = device, comm
        self.xp, self._nccl, self.nccl_note = np, None, ""
        if device == "gpu":
            try:
                import cupy
            except ImportError:
                raise SystemExit("--device gpu needs CuPy: pip install "
                                 "'partialcoll[cuda]' (or cupy-cudaXXx)")
            ngpu = cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(comm.rank % ngpu).use()
            self.xp = cupy
            self._ngpu = comm.allreduce(ngpu, op=MPI.MIN)

    def array(self, a):
        """``a`` (a NumPy array) moved to where the buffers live."""
        if self.device == "gpu":
            return self.xp.asarray(a)
        if self.device == "emulate":
            from ..core.devices import emulated
            return emulated(a)
        return a

    def host(self, a):
        return self.xp.asnumpy(a) if self.device == "gpu" else np.asarray(a)

    def nccl(self):
        """An allreduce(x, y) through NCCL (cupyx.distributed), or None with
        the reason in ``nccl_note``."""
        if self.device != "gpu":
            self.nccl_note = "NCCL needs --device gpu"
            return None
        if self._nccl is None:
            if self.comm.size > self._ngpu:
                self.nccl_note = (f"NCCL skipped: {self.comm.size} ranks share "
                                  f"{self._ngpu} GPU(s); NCCL needs one each")
                return None
            try:
                from cupyx.distributed import NCCLBackend
                backend = NCCLBackend(self.comm.size, self.comm.rank,
                                      use_mpi=True)
            except Exception as e:        # NCCL missing from this CuPy
                self.nccl_note = f"NCCL unavailable: {e}"
                return None
            stream = self.xp.cuda.get_current_stream()

            def allreduce(x, y):
                backend.all_reduce(x, y, "sum", stream=stream)
                stream.synchronize()
            self._nccl = allreduce
        return self._nccl


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None (after saying
    how to get it) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install 'partialcoll[bench]'")
        return None
    return plt


def save_plot(fig, path):
    """Lay out ``fig``, write it to ``path`` as a PNG, free it, say where."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")
