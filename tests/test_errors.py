"""Errors users can catch by kind: :class:`partialcoll.Error` is the base
of partialcoll's own errors; a wrong type raises
:class:`~partialcoll.ArgumentTypeError` (a ``TypeError``, and a
``ScheduleError`` for code written before it), a bad value
:class:`~partialcoll.ScheduleError` (a ``ValueError``, not a
``TypeError``), each naming what was passed.  The last tests keep the
convention in the source: a ``raise ScheduleError(...)`` whose message
names the type of what was passed (``type(x).__name__``) reports a wrong
type, so it raises ArgumentTypeError instead.  No mpiexec needed."""
import argparse
import ast
import os

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import errors, units
from partialcoll.eager import SGD, EagerOptimizer

from conftest import ROOT

SELF = MPI.COMM_SELF


def test_the_names():
    assert pc.Error is pc.PartialcollError
    assert issubclass(pc.ArgumentTypeError, TypeError)
    assert issubclass(pc.ArgumentTypeError, pc.ScheduleError)
    assert issubclass(pc.ArgumentTypeError, pc.Error)
    assert issubclass(pc.ScheduleError, ValueError)
    assert not issubclass(pc.ScheduleError, TypeError)
    assert issubclass(pc.WaitTimeout, TimeoutError)
    assert issubclass(pc.TransportError, pc.Error)
    for name in ("Error", "ArgumentTypeError"):
        assert name in pc.__all__


def _slot():
    return pc.Schedule(SELF).buffer(np.zeros(4))


def _copy(dst=None, src=None, **kwargs):
    """A copy op added to a fresh schedule (the arguments are checked)."""
    s = pc.Schedule(SELF)
    b = s.buffer(np.zeros(4))
    s.copy(b[0:1] if dst is None else dst, b[1:2] if src is None else src,
           **kwargs)


def _wait(timeout):
    """A wait of an allreduce over COMM_SELF with ``timeout``, then a plain
    one (the request is done either way)."""
    req = pc.iallreduce(np.ones(3), comm=SELF)
    try:
        req.wait(timeout)
    finally:
        req.wait()


#: (what, call, a fragment of the message naming what was passed)
WRONG_TYPES = [
    ("Schedule(comm=)", lambda: pc.Schedule(comm="x"), "got str"),
    ("allreduce of a str", lambda: pc.allreduce("abc", comm=SELF),
     "got str"),
    ("allreduce of an object", lambda: pc.allreduce(object(), comm=SELF),
     "got object"),
    ("a float as op", lambda: pc.allreduce(np.ones(3), op=3.5, comm=SELF),
     "not float"),
    ("as_op", lambda: pc.as_op(3.5), "not float"),
    ("set_send_cap", lambda: pc.set_send_cap(1.5), "1.5"),
    ("abort_on_error", lambda: pc.abort_on_error("1"), "'1'"),
    ("slot[i]", lambda: _slot()[1], "slot[1]"),
    ("an op's buffer", lambda: _copy([1], [2]), "got list"),
    ("a dependency", lambda: _copy(after=["x"]), "not str"),
    ("wait(timeout=)", lambda: _wait("soon"), "'soon'"),
    ("quorum", lambda: pc.QuorumAllreduce(np.ones(3), quorum=1.5,
                                          comm=SELF), "1.5"),
    ("network.load", lambda: pc.network.load(3), "got int"),
    ("a size", lambda: units.size([1]), "not list"),
    ("RPSAverage timeout", lambda: pc.RPSAverage(np.ones(3), comm=SELF,
                                                 timeout="x"), "'x'"),
    ("LoadBalancedAllreduce lead", lambda: pc.LoadBalancedAllreduce(
        np.ones(3), comm=SELF, lead="x"), "'x'"),
    ("eager SGD params", lambda: SGD(["x"], lr=0.1), "not str"),
    ("EagerOptimizer", lambda: EagerOptimizer(object(), comm=SELF),
     "not object"),
]

#: (what, call): a bad value of the right type
BAD_VALUES = [
    ("an unknown op", lambda: pc.allreduce(np.ones(3), op="nope",
                                           comm=SELF)),
    ("an unknown algorithm", lambda: pc.allreduce(
        np.ones(3), algorithm="nope", comm=SELF)),
    ("as_op of a name", lambda: pc.as_op("nope")),
    ("an unsupported MPI op", lambda: pc.as_op(MPI.MAXLOC)),
    ("set_send_cap", lambda: pc.set_send_cap(-1)),
    ("abort_on_error", lambda: pc.abort_on_error(0)),
    ("slot[a:b:step]", lambda: _slot()[::2]),
    ("a dependency", lambda: _copy(after=[99])),
    ("wait(timeout=)", lambda: _wait(-1)),
    ("quorum", lambda: pc.QuorumAllreduce(np.ones(3), quorum=5,
                                          comm=SELF)),
    ("a size", lambda: units.size("zz")),
    ("RPSAverage timeout", lambda: pc.RPSAverage(np.ones(3), comm=SELF,
                                                 timeout=-1)),
    ("LoadBalancedAllreduce lead", lambda: pc.LoadBalancedAllreduce(
        np.ones(3), comm=SELF, lead=99)),
    ("eager SGD params", lambda: SGD([np.ones(3, int)], lr=0.1)),
    ("eager SGD lr", lambda: SGD([np.ones(3)], lr=-1)),
    ("mismatched buffers", lambda: pc.allreduce(np.ones(3), np.ones(4),
                                                comm=SELF)),
]


@pytest.mark.parametrize("call,passed",
                         [(c, p) for _, c, p in WRONG_TYPES],
                         ids=[w for w, _, _ in WRONG_TYPES])
def test_a_wrong_type_raises_a_type_error(call, passed):
    with pytest.raises(TypeError) as info:
        call()
    assert isinstance(info.value, pc.ArgumentTypeError)
    assert isinstance(info.value, pc.ScheduleError)     # older code
    assert isinstance(info.value, pc.Error)
    assert passed in str(info.value)


@pytest.mark.parametrize("call", [c for _, c in BAD_VALUES],
                         ids=[w for w, _ in BAD_VALUES])
def test_a_bad_value_raises_a_value_error(call):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, pc.ScheduleError)
    assert not isinstance(info.value, TypeError)


def test_the_torch_layer_refuses_wrong_types_with_a_type_error():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import partialcoll.torch as pct
    calls = [lambda: pct.allreduce(np.ones(3), comm=SELF),
             lambda: pct.grouped_allreduce(torch.ones(3), comm=SELF),
             lambda: pct.synchronize(3),
             lambda: pct.EagerOptimizer(object(), comm=SELF)]
    for call in calls:
        with pytest.raises(pc.ArgumentTypeError):
            call()
    with pytest.raises(pc.ScheduleError) as info:
        pct.allreduce(torch.ones(3), op="nope", comm=SELF)
    assert not isinstance(info.value, TypeError)


# -- the convention, checked over the source --------------------------------
PACKAGE = os.path.join(ROOT, "partialcoll")
#: parts of the package the convention does not cover (relative paths)
SKIPPED = ("bench",)
#: (module, function) -> why its raise names a type yet reports a value:
#: the object is of a kind partialcoll takes, but it cannot be used as it is
NOT_TYPE_ERRORS = {
    ("core/arrays.py", "_cupy"): "GPU data, and CuPy is not installed",
    ("core/arrays.py", "_from_dlpack"): "data DLPack cannot hand over "
                                        "(its dtype, say)",
    ("core/devices.py", "check_place"): "an array in the wrong memory",
    ("core/schedule.py", "_bind_device"): "an array in the wrong memory",
}


def _names_a_type(node):
    """Whether ``type(...).__name__`` appears inside ``node``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "__name__"
               and isinstance(n.value, ast.Call)
               and isinstance(n.value.func, ast.Name)
               and n.value.func.id == "type" for n in ast.walk(node))


def _raises(tree):
    """``(function, raise node)`` for every ``raise Name(...)`` of ``tree``,
    with the name of the innermost enclosing function (None at top
    level)."""
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and isinstance(node.exc.func, ast.Name):
            found.append((function, node))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def schedule_error_raises(package=PACKAGE):
    """``(module, function, line, names a type)`` for every ``raise
    ScheduleError(...)`` of the package outside :data:`SKIPPED`."""
    out = []
    for where, dirs, files in os.walk(package):
        rel_dir = os.path.relpath(where, package)
        if rel_dir.split(os.sep)[0] in SKIPPED:
            dirs[:] = []
            continue
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(where, name)
            module = os.path.relpath(path, package).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for function, node in _raises(tree):
                if node.exc.func.id == "ScheduleError":
                    out.append((module, function, node.lineno,
                                _names_a_type(node.exc)))
    return out


def test_a_message_naming_the_type_passed_raises_argument_type_error():
    found = schedule_error_raises()
    assert len(found) > 100, "the scan found too few raises: is it broken?"
    wrong = [f"partialcoll/{module}:{line} ({function})"
             for module, function, line, names in found
             if names and (module, function) not in NOT_TYPE_ERRORS]
    assert not wrong, (
        "these raise ScheduleError with a message naming the type of what "
        "was passed: raise ArgumentTypeError (partialcoll.core.errors) "
        "for a wrong type, or list the function in NOT_TYPE_ERRORS with "
        "why it is a bad value:\n  " + "\n  ".join(wrong))


def test_every_exception_to_the_convention_is_still_there():
    naming = {(module, function)
              for module, function, _, names in schedule_error_raises()
              if names}
    stale = sorted(set(NOT_TYPE_ERRORS) - naming)
    assert not stale, f"no longer raise a type-naming ScheduleError: {stale}"


def test_the_convention_check_catches_a_type_error_left_as_schedule_error(
        tmp_path):
    package = tmp_path / "partialcoll"
    (package / "core").mkdir(parents=True)
    (package / "bench").mkdir()
    (package / "core" / "things.py").write_text(
        "def f(x):\n"
        "    raise ScheduleError(f'x must be an int, not '\n"
        "                        f'{type(x).__name__}')\n"
        "def g(x):\n"
        "    raise ArgumentTypeError(f'not {type(x).__name__}')\n"
        "def h(x):\n"
        "    raise ScheduleError(f'x must be >= 0, got {x!r}')\n")
    (package / "bench" / "cli.py").write_text(
        "def f(x):\n"
        "    raise ScheduleError(f'not {type(x).__name__}')\n")
    found = schedule_error_raises(str(package))
    assert found == [("core/things.py", "f", 2, True),
                     ("core/things.py", "h", 7, False)]


#: library code that raises Python's own ValueError/TypeError, and why
PLAIN_RAISES = {
    "core/env.py": "environment variables are read before the errors "
                   "module may be imported",
    "core/logs.py": "the same: PARTIALCOLL_LOG_LEVEL at import",
    "collectives/partial/handles.py": "PartialAllreduce() is a programming "
                                      "error of a subclass, as Python's "
                                      "abstract classes raise TypeError",
}


def test_library_errors_are_partialcolls():
    """Outside the benchmarks, a bad value or type raises a partialcoll
    error (ScheduleError / ArgumentTypeError, still a ValueError /
    TypeError), so ``except partialcoll.Error`` catches it."""
    import pathlib
    import re
    package = pathlib.Path(PACKAGE)
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("bench/") or rel in PLAIN_RAISES:
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\braise (ValueError|TypeError)\(", line):
                found.append(f"{rel}:{k}")
    assert not found, f"plain ValueError/TypeError raised: {found}"


# -- an error found on one rank, as the other ranks raise it -----------------
@pytest.mark.parametrize("error, kind, text", [
    (pc.ArgumentTypeError("x is str"), "ArgumentTypeError", "x is str"),
    (pc.ScheduleBusyError("busy"), "ScheduleBusyError", "busy"),
    (TypeError("not iterable"), "ArgumentTypeError",
     "TypeError: not iterable"),
    (ValueError("bad"), "ScheduleError", "ValueError: bad"),
    (KeyError("k"), "PartialcollError", "KeyError: 'k'"),
    # a class of another library that shares a name with one of ours
    (argparse.ArgumentTypeError("n"), "PartialcollError",
     "ArgumentTypeError: n"),
])
def test_an_error_travels_as_the_name_of_its_kind(error, kind, text):
    """Only a name and a message cross ranks: partialcoll's own class, or
    the one of its classes a builtin TypeError / ValueError maps to."""
    assert errors.portable(error) == (kind, text)


@pytest.mark.parametrize("kinds, agreed", [
    (["ArgumentTypeError"] * 3, pc.ArgumentTypeError),
    (["ArgumentTypeError", "ScheduleError"], pc.ScheduleError),
    (["ScheduleBusyError", "ArgumentTypeError"], pc.ScheduleError),
    (["TransportError", "ScheduleError"], pc.PartialcollError),
    (["WaitTimeout"], pc.WaitTimeout),
    (["OSError"], pc.PartialcollError),
    (["ArgumentTypeError", "builtins.eval"], pc.PartialcollError),
    ([("ArgumentTypeError",)], pc.PartialcollError),
])
def test_every_rank_raises_the_kind_all_reports_share(kinds, agreed):
    """The most specific of partialcoll's classes that every reported kind
    is; a name that is not one of partialcoll's classes is only a
    PartialcollError (nothing else is made from what a rank sent)."""
    assert errors.agreed_kind(kinds) is agreed

