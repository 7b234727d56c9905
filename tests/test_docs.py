"""The API reference (docs/, Sphinx autodoc): it builds with warnings as
errors, and every public name is in it.

tests/run.sh builds it first and sets PARTIALCOLL_DOCS_HTML to the result;
without that variable the test builds it itself (into a temporary
directory)."""
import importlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install "
                    "'partialcoll[docs]')")

#: the packages whose __all__ is the public API; the names documented
#: under another package (the same object); the packages whose names are
#: documented in their modules (partialcoll.mlfabric.scheduler.links.Timeline)
PACKAGES = ["partialcoll", "partialcoll.eager", "partialcoll.torch",
            "partialcoll.mlfabric"]
ALIASES = {"partialcoll.torch.StepInfo": "partialcoll.eager.StepInfo",
           "partialcoll.timeline": "partialcoll.transport.timeline",
           "partialcoll.network": "partialcoll.transport.network"}
BY_MODULE = {"partialcoll.mlfabric"}
MODULES = {"partialcoll.transport.timeline", "partialcoll.transport.network"}


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    built = os.environ.get("PARTIALCOLL_DOCS_HTML")
    if built:
        return built
    out = str(tmp_path_factory.mktemp("html"))
    exe = os.path.join(os.path.dirname(sys.executable), "sphinx-build")
    if not os.path.exists(exe):
        exe = shutil.which("sphinx-build")
    p = subprocess.run([exe, "-W", "--keep-going", "-q", "-b", "html",
                        os.path.join(ROOT, "docs"), out],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"the docs build failed:\n{p.stdout}\n{p.stderr}"
    return out


def documented(html):
    """Every object name in the build's inventory (objects.inv)."""
    from sphinx.util.inventory import InventoryFile
    with open(os.path.join(html, "objects.inv"), "rb") as f:
        inventory = InventoryFile.load(f, "", os.path.join)
    return {name for names in inventory.values() for name in names}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_in_the_reference(html, package):
    if package == "partialcoll.torch":
        pytest.importorskip("torch", reason="PyTorch is not installed")
    names = documented(html)
    public = importlib.import_module(package).__all__
    in_modules = {n.rsplit(".", 1)[1] for n in names
                  if package in BY_MODULE and n.startswith(package + ".")}
    missing = []
    for name in public:
        full = f"{package}.{name}"
        if ALIASES.get(full, full) not in names and name not in in_modules:
            missing.append(full)
    assert not missing, f"not in docs/api/*.rst: {missing}"


def test_the_reference_has_the_modules_it_promises(html):
    names = documented(html)
    assert MODULES | {"partialcoll", "partialcoll.torch",
                      "partialcoll.tictac.planner",
                      "partialcoll.mlfabric.scheduler"} <= names
