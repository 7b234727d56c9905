"""The documentation site (docs/, Sphinx): it builds with warnings as
errors (every cross-reference resolves), every public name is in the API
reference, and every internal link of the site and of the repository's
Markdown files resolves.

tests/run.sh builds it first and sets PARTIALCOLL_DOCS_HTML to the result;
without that variable the test builds it itself (into a temporary
directory)."""
import importlib
import os
import re
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


#: the repository's own Markdown files whose links must resolve
MARKDOWN = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md",
            "examples/README.md"]
_LINK = re.compile(r"\]\(((?!https?:|mailto:)[^)#\s]*)(#[^)\s]*)?\)")


@pytest.mark.parametrize("name", MARKDOWN)
def test_every_link_of_the_markdown_files_resolves(name):
    """A relative link in the README and its siblings names a file of the
    repository (the README is also the package's long description, where
    setup.py turns such links into text)."""
    path = os.path.join(ROOT, name)
    with open(path) as f:
        text = f.read()
    where = os.path.dirname(path)
    missing = [target for target, _ in _LINK.findall(text)
               if target and not os.path.exists(os.path.join(where, target))]
    assert not missing, f"{name} links to files that do not exist: {missing}"


def test_every_internal_link_of_the_site_resolves(html):
    """Every link from a page of the built site to another page or file of
    it points at something that exists, and every #anchor at an id of
    that page (external links are not followed: no network)."""
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.links, self.ids = [], set()

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if a.get("id"):
                self.ids.add(a["id"])
            target = a.get("href") if tag in ("a", "link") else \
                a.get("src") if tag in ("img", "script") else None
            if target and not re.match(r"[a-z]+:", target):
                self.links.append(target)

    pages = {}
    for where, _, files in os.walk(html):
        for f in files:
            if f.endswith(".html"):
                p = Page()
                with open(os.path.join(where, f)) as fh:
                    p.feed(fh.read())
                pages[os.path.normpath(os.path.join(where, f))] = p
    broken = []
    for path, page in pages.items():
        if "/_modules/" in path:        # the highlighted source: its own
            continue
        for link in page.links:
            target, _, anchor = link.partition("#")
            target = target.split("?")[0]
            full = os.path.normpath(os.path.join(os.path.dirname(path),
                                                 target)) if target else path
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(path, html)} -> {link}")
            elif anchor and full in pages and anchor not in pages[full].ids:
                broken.append(f"{os.path.relpath(path, html)} -> {link} "
                              f"(no such anchor)")
    assert not broken, "\n".join(broken[:40])
