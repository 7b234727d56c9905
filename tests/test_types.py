"""The package's types (PEP 561: ``partialcoll/py.typed``, and stubs for
the C extensions): mypy passes over the installed package with the
repository's configuration (pyproject.toml, ``[tool.mypy]``), and every
function and method of the public API is annotated, every parameter and
its return.

mypy checks only the bodies of annotated functions; the second test keeps
the public API among them."""
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYPROJECT = os.path.join(os.path.dirname(HERE), "pyproject.toml")

#: namespaces whose ``__all__`` is public API
ALL_OF = ["partialcoll", "partialcoll.torch", "partialcoll.eager",
          "partialcoll.rps"]
#: modules whose public functions and classes (defined there) are
MODULES = ["partialcoll.transport.network", "partialcoll.transport.timeline",
           "partialcoll.core.units"]
#: classes the API returns that no ``__all__`` names
RETURNED = ["partialcoll.core.request.RoundRequest",
            "partialcoll.core.slots.RoundOutcomes",
            "partialcoll.core.slots.DataLock",
            "partialcoll.core.slots.BufRef"]
#: classes whose ``__slots__`` are public attributes, each annotated
SLOTTED = ["partialcoll.PartialResult", "partialcoll.RPSRound",
           "partialcoll.eager.StepInfo"]
#: "module.qualname" of a function exempt from the annotation check, with
#: the reason
EXEMPT = {
    "partialcoll.torch.eager_comm_hook":
        "DDP's register_comm_hook compares a hook's annotations with "
        "torch's objects (dist.GradBucket, Future[Tensor]) at run time: "
        "string annotations fail that, and evaluated ones would need a "
        "torch built with torch.distributed to import partialcoll.torch",
}


def test_mypy_passes_over_the_installed_package(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: install the test extra "
                    "(pip install '.[test]'), which the test command "
                    "(tests/run.sh) does")
    # from tests/, so that -p finds the installed package (with its
    # compiled extension's stub), not the source tree
    p = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "partialcoll",
         "--config-file", PYPROJECT, "--cache-dir", str(tmp_path / "cache")],
        cwd=HERE, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, \
        f"mypy -p partialcoll failed:\n{p.stdout}\n{p.stderr}"


def test_the_installed_package_ships_its_types():
    import partialcoll
    where = os.path.dirname(partialcoll.__file__)
    for f in ("py.typed", "_core.pyi",
              os.path.join("mlfabric", "scheduler", "_linkops.pyi")):
        assert os.path.isfile(os.path.join(where, f)), \
            f"{f} is not installed with the package (package-data)"


def _ours(obj):
    return (getattr(obj, "__module__", None) or "").startswith("partialcoll")


def _functions_of(cls):
    """(qualified name, function) of every public method, dunder method,
    property getter and setter that a class of partialcoll in ``cls``'s MRO
    defines (torch's own, for a class made on torch.optim.Optimizer, are
    torch's)."""
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and not (name.startswith("__") and
                                             name.endswith("__")):
                continue
            where = f"{klass.__module__}.{klass.__qualname__}.{name}"
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                for part, fn in (("getter", value.fget),
                                 ("setter", value.fset)):
                    if fn is not None:
                        yield f"{where} ({part})", fn
            elif inspect.isfunction(value):
                yield where, value


def public_functions():
    """{qualified name: function} of the public API (see the lists
    above)."""
    found, classes = {}, set()

    def take(obj, where):
        if inspect.isclass(obj) and _ours(obj):
            classes.add(obj)
        elif inspect.isfunction(obj) and _ours(obj):
            found[where] = obj

    for name in ALL_OF:
        if name == "partialcoll.torch" and \
                importlib.util.find_spec("torch") is None:
            continue                    # checked where torch is installed
        mod = importlib.import_module(name)
        for attr in mod.__all__:
            take(getattr(mod, attr), f"{name}.{attr}")
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if not attr.startswith("_") and \
                    getattr(obj, "__module__", None) == name:
                take(obj, f"{name}.{attr}")
    for full in RETURNED:
        mod, _, attr = full.rpartition(".")
        take(getattr(importlib.import_module(mod), attr), full)
    for cls in classes:
        found.update(_functions_of(cls))
    return found


def missing_annotations(fn):
    """The parameters of ``fn`` without an annotation, and "return" when
    its return has none (``self`` and ``cls`` need none)."""
    fn = inspect.unwrap(fn)
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    missing = [p.name for p in params if p.annotation is p.empty]
    if sig.return_annotation is sig.empty:
        missing.append("return")
    return missing


def test_the_public_api_is_annotated():
    functions = public_functions()
    assert len(functions) > 150, sorted(functions)   # the lists were read
    bad = {}
    for where, fn in sorted(functions.items()):
        if where.split(" ")[0] in EXEMPT:
            continue
        missing = missing_annotations(fn)
        if missing:
            bad[where] = missing
    assert not bad, "not annotated (parameters, or the return):\n" + \
        "\n".join(f"  {w}: {', '.join(m)}" for w, m in bad.items())


def test_slotted_results_annotate_every_attribute():
    for full in SLOTTED:
        mod, _, attr = full.rpartition(".")
        cls = getattr(importlib.import_module(mod), attr)
        missing = [s for s in cls.__slots__
                   if s not in cls.__dict__.get("__annotations__", {})]
        assert not missing, f"{full}: {missing} not annotated"


def test_the_check_sees_a_missing_annotation():
    def f(x: int, y) -> int:
        return x

    def g(x: int):
        return x

    class C:
        def m(self, x: int) -> None:
            pass

    assert missing_annotations(f) == ["y"]
    assert missing_annotations(g) == ["return"]
    assert missing_annotations(C.m) == []
