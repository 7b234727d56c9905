"""The package's layout rules, checked over its source (no import runs).

``partialcoll/`` is built in layers; a module may import only from its own
layer or below, and the seed systems (one package each) never import each
other::

    6  bench        the benchmark CLI (may use the front door, as a user)
    5  torch        every PyTorch-facing module
    4  rps  tictac  loadbalance  mlfabric  eager     one package per system
    3  collectives  builders, the schedule pool, partial collectives
    2  transport    the emulated network, timelines
    1  core         the executor's Python face; the only importer of _core
    0  _core        the C extension

The rules (each a function below, each returning the violations as text):

* :func:`layer_violations` -- an import that points up a layer, or across
  to a sibling system package;
* :func:`core_violations` -- ``_core`` imported outside ``core``;
* :func:`front_door_violations` -- a module below ``bench`` imports the
  package front door (``import partialcoll``);
* :func:`private_violations` -- a ``_private`` module of another package
  imported, a ``_private`` name imported from another module, or
  ``x._name`` used where only another package defines ``_name``;
* :func:`cycles` -- modules that import each other in a loop (imports
  inside functions count too).

Run ``python tests/layout_rules.py`` for the report; ``test_layout.py``
asserts it is empty.
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "partialcoll")

#: layer of each top-level part of the package
LAYERS = {"_core": 0, "core": 1, "transport": 2, "collectives": 3,
          "rps": 4, "tictac": 4, "loadbalance": 4, "mlfabric": 4,
          "eager": 4, "torch": 5, "bench": 6, "": 7}
#: the package's C extensions (no source file here to read)
EXTENSIONS = {"partialcoll._core", "partialcoll.mlfabric.scheduler._linkops"}
#: parts of one layer that may not import each other
SIBLINGS_APART = {4}


class Module:
    """One source file: its dotted name, its package and its imports."""

    def __init__(self, path, root=ROOT):
        self.root = root
        rel = os.path.relpath(path, root)[:-3].split(os.sep)
        self.is_package = rel[-1] == "__init__"
        if self.is_package:
            rel = rel[:-1]
        self.path, self.name = path, ".".join(rel)
        self.package = self.name if self.is_package else \
            self.name.rpartition(".")[0]
        with open(path) as f:
            self.tree = ast.parse(f.read(), path)
        # (line, imported module, names taken from it or None)
        self.imports = list(self._imports())

    @property
    def part(self):
        """The top-level part (``core``, ``collectives`` ...; "" for the
        front door)."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else ""

    def _resolve(self, level, module):
        base = self.package.split(".")
        if level > 1:
            base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def _imports(self):
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                target = self._resolve(node.level, node.module) \
                    if node.level else node.module
                yield node.lineno, target, [a.name for a in node.names]


def modules(package=PACKAGE):
    """Every module of the package in directory ``package``, by dotted
    name."""
    found, root = {}, os.path.dirname(package)
    for where, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                m = Module(os.path.join(where, f), root)
                found[m.name] = m
    return found


def _ours(name):
    return name == "partialcoll" or name.startswith("partialcoll.")


def _targets(mods, name, names):
    """The modules an import of ``name`` (taking ``names``) reaches: the
    module itself and, for ``from pkg import mod``, each submodule named."""
    subs = [f"{name}.{n}" for n in names or ()
            if f"{name}.{n}" in mods or f"{name}.{n}" in EXTENSIONS]
    if names and len(subs) == len(names):
        return subs              # only submodules: the package is not used
    return [name] + subs


def _part_of(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _where(m, line):
    return f"{os.path.relpath(m.path, m.root)}:{line}"


def layer_violations(mods):
    bad = []
    for m in mods.values():
        mine = LAYERS.get(m.part)
        for line, name, names in m.imports:
            if not _ours(name):
                continue
            for target in _targets(mods, name, names):
                part = _part_of(target)
                if target == "partialcoll" or part == m.part:
                    continue       # the front door: front_door_violations
                theirs = LAYERS.get(part)
                if mine is None or theirs is None:
                    bad.append(f"{_where(m, line)}: {m.name} -> {target}: "
                               f"a part that has no layer")
                elif theirs > mine:
                    bad.append(f"{_where(m, line)}: {m.name} (layer {mine}) "
                               f"imports {target} (layer {theirs}): up")
                elif theirs == mine and mine in SIBLINGS_APART:
                    bad.append(f"{_where(m, line)}: {m.name} imports "
                               f"{target}: systems do not import each other")
    return bad


def core_violations(mods):
    bad = []
    for m in mods.values():
        for line, name, names in m.imports:
            reaches = name == "partialcoll._core" or (
                name == "partialcoll" and names and "_core" in names)
            if reaches and m.part != "core":
                bad.append(f"{_where(m, line)}: {m.name} imports _core "
                           f"(only partialcoll.core may)")
    return bad


def front_door_violations(mods):
    bad = []
    for m in mods.values():
        if m.part in ("bench", ""):
            continue
        for line, name, names in m.imports:
            if name == "partialcoll" and not (names and all(
                    f"partialcoll.{n}" in mods or n == "_core"
                    for n in names)):
                bad.append(f"{_where(m, line)}: {m.name} imports the front "
                           f"door (partialcoll): import what it needs from "
                           f"the module that defines it")
    return bad


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and
                                         name.endswith("__"))


def _defined_private(mods):
    """{private name: set of packages that define it} (functions, classes,
    module and class attributes, ``self._x = ...``, ``__slots__``)."""
    where = {}

    def add(name, pkg):
        if _private(name):
            where.setdefault(name, set()).add(pkg)

    for m in mods.values():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)):
                add(node.name, m.package)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) \
                    else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Name):
                            add(sub.id, m.package)
                        elif isinstance(sub, ast.Attribute):
                            add(sub.attr, m.package)
                    if isinstance(t, ast.Name) and t.id == "__slots__":
                        for c in ast.walk(node.value):
                            if isinstance(c, ast.Constant) and \
                                    isinstance(c.value, str):
                                add(c.value, m.package)
            elif isinstance(node, ast.arg):
                add(node.arg, m.package)
            elif isinstance(node, ast.keyword) and node.arg:
                add(node.arg, m.package)
    return where


def private_violations(mods):
    bad = []
    for m in mods.values():
        for line, name, names in m.imports:
            if not _ours(name) or name == "partialcoll._core":
                continue
            owner = name if name in mods and mods[name].is_package else \
                name.rpartition(".")[0]
            mod_parts = name.split(".")[1:]
            if owner != m.package and any(_private(p) for p in mod_parts):
                bad.append(f"{_where(m, line)}: {m.name} imports the private "
                           f"module {name} of another package")
                continue
            for n in names or ():
                sub = f"{name}.{n}"
                if not _private(n) or sub == "partialcoll._core" or \
                        name == m.name:
                    continue
                if sub in mods or sub in EXTENSIONS:
                    if name != m.package:
                        bad.append(f"{_where(m, line)}: {m.name} imports "
                                   f"the private module {sub} of another "
                                   f"package")
                else:
                    bad.append(f"{_where(m, line)}: {m.name} imports the "
                               f"private name {n} from {name}")
    defined = _defined_private(mods)
    for m in mods.values():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                pkgs = defined.get(node.attr)
                if pkgs and m.package not in pkgs:
                    bad.append(f"{_where(m, node.lineno)}: {m.name} uses "
                               f".{node.attr}, private to "
                               f"{', '.join(sorted(pkgs))}")
    return bad


def cycles(mods):
    """Strongly connected components of more than one module."""
    graph = {}
    for m in mods.values():
        out = set()
        for _, name, names in m.imports:
            for target in _targets(mods, name, names):
                if target in mods and target != m.name:
                    out.add(target)
        graph[m.name] = out
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [" <-> ".join(c) for c in comps]


RULES = {"layers": layer_violations, "_core": core_violations,
         "front door": front_door_violations,
         "private names": private_violations, "cycles": cycles}


def report(package=PACKAGE):
    """{rule: [violation, ...]} for the package in directory ``package``."""
    mods = modules(package)
    return {rule: fn(mods) for rule, fn in RULES.items()}


if __name__ == "__main__":
    total = 0
    for rule, bad in report().items():
        print(f"== {rule}: {len(bad)}")
        for line in bad:
            print("  " + line)
        total += len(bad)
    sys.exit(1 if total else 0)
