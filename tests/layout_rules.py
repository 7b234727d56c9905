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

The C core in ``csrc/`` is built in parts the same way; a part may include
only its own headers and those of the parts it stands on (``C_PARTS``)::

    partial     a separate extension: the partial
                collectives' call                 -> capi
    python      the binding (partialcoll._core)   -> capi, engine, sched,
                                                     common
    capi        the executor's C API for other
                extensions (a header)             -> nothing
    engine      runs schedules                    -> sched, transport, common
    sched       the schedule as data              -> common
    transport   the wire (MPI, emulated network)  -> common
    common      errors, clock, allocation, trace
    mlfabric    a separate extension              -> nothing of the above

* :func:`include_violations` -- a C file outside the parts, an include not
  written with its part (``"sched/pc_sched.h"``), or one that points up or
  across;
* :func:`length_violations` -- a file of ``csrc/`` or ``partialcoll/`` over
  600 lines, or a function over 80, unless it says why in a comment
  containing the words ``longer than`` (inside the function for a
  function, outside every function for a file).

Run ``python tests/layout_rules.py`` for the report; ``test_layout.py``
asserts it is empty.
"""
import ast
import io
import os
import re
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "partialcoll")
CSRC = os.path.join(ROOT, "csrc")

#: layer of each top-level part of the package
LAYERS = {"_core": 0, "core": 1, "transport": 2, "collectives": 3,
          "rps": 4, "tictac": 4, "loadbalance": 4, "mlfabric": 4,
          "eager": 4, "torch": 5, "bench": 6, "": 7}
#: the package's C extensions (no source file here to read)
EXTENSIONS = {"partialcoll._core", "partialcoll.mlfabric.scheduler._linkops",
              "partialcoll.collectives.partial._calls"}
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


# ---- the C core
#: part of csrc/ -> the other parts it may include
C_PARTS = {"common": set(), "transport": {"common"}, "sched": {"common"},
           "engine": {"sched", "transport", "common"},
           "python": {"capi", "engine", "sched", "common"},
           "capi": set(), "partial": {"capi"}, "mlfabric": set()}
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
#: the words a comment uses to say why a piece is longer
EXCUSE = "longer than"

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
_NAME = re.compile(r"(\w+)\s*\(")


class CFile:
    """One C source or header: its part, lines, includes and comments."""

    def __init__(self, path, root):
        self.path, self.root = path, root
        rel = os.path.relpath(path, root).split(os.sep)
        self.part = rel[0] if len(rel) > 1 else None
        with open(path) as f:
            self.text = f.read()
        self.lines = self.text.split("\n")
        if self.lines and self.lines[-1] == "":
            self.lines.pop()
        self.includes = [(n + 1, m.group(1))
                         for n, line in enumerate(self.lines)
                         for m in [_INCLUDE.match(line)] if m]

    def comments(self):
        """(first line, text) of every /* */ and // comment."""
        out, text, i, line = [], self.text, 0, 1
        while i < len(text):
            c = text[i]
            if c in "\"'":                      # a literal: skip it whole
                j = i + 1
                while j < len(text) and text[j] != c and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                line += text.count("\n", i, j + 1)
                i = j + 1
            elif text.startswith("/*", i) or text.startswith("//", i):
                end = text.find("*/" if text[i + 1] == "*" else "\n", i + 2)
                end = len(text) if end < 0 else end
                out.append((line, text[i:end]))
                line += text.count("\n", i, end)
                i = end
            else:
                line += c == "\n"
                i += 1
        return out

    def functions(self):
        """(name, first line, last line) of each function.  Its body opens
        with a `{` alone at column 0 and closes with a `}` at column 0; it
        starts at the nearest line above the `{` that starts at column 0
        (the line with its name)."""
        out, lines = [], self.lines
        for i, line in enumerate(lines):
            if line.rstrip() != "{":
                continue
            start = i - 1
            while start > 0 and lines[start][:1] in (" ", "\t", ""):
                start -= 1
            end = next((k for k in range(i + 1, len(lines))
                        if lines[k].startswith("}")), len(lines) - 1)
            m = _NAME.search(lines[start]) if start >= 0 else None
            out.append((m.group(1) if m else "?", start + 1, end + 1))
        return out


def c_files(csrc=CSRC):
    """Every .c and .h file under ``csrc``, by path relative to it."""
    found = {}
    for where, dirs, files in os.walk(csrc):
        dirs.sort()
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                cf = CFile(os.path.join(where, f), csrc)
                found[os.path.relpath(cf.path, csrc)] = cf
    return found


def _c_where(cf, line):
    return f"csrc/{os.path.relpath(cf.path, cf.root)}:{line}"


def include_violations(cfiles):
    bad = []
    for cf in cfiles.values():
        if cf.part not in C_PARTS:
            bad.append(f"{_c_where(cf, 1)}: a file outside the parts "
                       f"({', '.join(sorted(C_PARTS))})")
            continue
        for line, target in cf.includes:
            part = target.split("/")[0] if "/" in target else None
            if part is None:
                bad.append(f"{_c_where(cf, line)}: #include \"{target}\": "
                           f"write it with its part (\"{cf.part}/"
                           f"{target}\")")
            elif part != cf.part and part not in C_PARTS[cf.part]:
                may = ", ".join(sorted(C_PARTS[cf.part])) or "no other part"
                bad.append(f"{_c_where(cf, line)}: {cf.part} includes "
                           f"{target}: {cf.part} may include {may}")
            elif target not in cfiles:
                bad.append(f"{_c_where(cf, line)}: #include \"{target}\": "
                           f"no such header in csrc/")
    return bad


def _c_lengths(cf):
    bad, comments = [], cf.comments()
    functions = cf.functions()

    def excused(first, last):
        return any(first <= line <= last and EXCUSE in text
                   for line, text in comments)

    for name, first, last in functions:
        if last - first + 1 > MAX_FUNCTION_LINES and \
                not excused(first, last):
            bad.append(f"{_c_where(cf, first)}: {name}() is "
                       f"{last - first + 1} lines, over "
                       f"{MAX_FUNCTION_LINES}")
    inside = {n for _, first, last in functions
              for n in range(first, last + 1)}
    if len(cf.lines) > MAX_FILE_LINES and not any(
            EXCUSE in text and line not in inside
            for line, text in comments):
        bad.append(f"{_c_where(cf, 1)}: {len(cf.lines)} lines, over "
                   f"{MAX_FILE_LINES}")
    return bad


def _py_lengths(m):
    bad = []
    with open(m.path) as f:
        text = f.read()
    comments = [(t.start[0], t.string) for t in
                tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type == tokenize.COMMENT]
    functions = [n for n in ast.walk(m.tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in functions:
        length = fn.end_lineno - fn.lineno + 1
        if length > MAX_FUNCTION_LINES and EXCUSE not in (
                ast.get_docstring(fn) or "") and not any(
                fn.lineno <= line <= fn.end_lineno and EXCUSE in c
                for line, c in comments):
            bad.append(f"{_where(m, fn.lineno)}: {fn.name}() is {length} "
                       f"lines, over {MAX_FUNCTION_LINES}")
    inside = {n for fn in functions
              for n in range(fn.lineno, fn.end_lineno + 1)}
    nlines = len(text.splitlines())
    if nlines > MAX_FILE_LINES and EXCUSE not in (
            ast.get_docstring(m.tree) or "") and not any(
            EXCUSE in c and line not in inside for line, c in comments):
        bad.append(f"{_where(m, 1)}: {nlines} lines, over "
                   f"{MAX_FILE_LINES}")
    return bad


def length_violations(mods, cfiles):
    bad = []
    for m in mods.values():
        bad += _py_lengths(m)
    for cf in cfiles.values():
        bad += _c_lengths(cf)
    return bad


RULES = {"layers": layer_violations, "_core": core_violations,
         "front door": front_door_violations,
         "private names": private_violations, "cycles": cycles}


def report(package=PACKAGE, csrc=None):
    """{rule: [violation, ...]} for the package in directory ``package``
    and the C core in ``csrc`` (default: the ``csrc`` beside the package;
    none there, no C file)."""
    mods = modules(package)
    if csrc is None:
        csrc = os.path.join(os.path.dirname(package), "csrc")
    cfiles = c_files(csrc)
    out = {rule: fn(mods) for rule, fn in RULES.items()}
    out["C includes"] = include_violations(cfiles)
    out["lengths"] = length_violations(mods, cfiles)
    return out


if __name__ == "__main__":
    total = 0
    for rule, bad in report().items():
        print(f"== {rule}: {len(bad)}")
        for line in bad:
            print("  " + line)
        total += len(bad)
    sys.exit(1 if total else 0)
