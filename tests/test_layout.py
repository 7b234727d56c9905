"""The layout rules (tests/layout_rules.py) hold for the package and its
C core, and each rule catches what it is meant to catch: every rule is run
on a small made-up package (and csrc/ tree) that breaks it once."""
import os
import textwrap

import pytest

import layout_rules

pytestmark = pytest.mark.filterwarnings("error")


def test_the_package_keeps_every_rule():
    report = layout_rules.report()
    broken = {rule: bad for rule, bad in report.items() if bad}
    assert not broken, "\n".join(
        f"{rule}:\n  " + "\n  ".join(bad) for rule, bad in broken.items())


def make_package(tmp_path, files):
    """A package ``partialcoll`` under tmp_path from {relative path: code}
    (each folder gets an __init__.py)."""
    root = tmp_path / "partialcoll"
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))
    for where, dirs, _ in os.walk(root):
        init = os.path.join(where, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()
    return str(root)


CLEAN = {
    "core/schedule.py": "from .. import _core\nclass Schedule: pass\n",
    "core/libcomm.py": "def library_comm(comm): return comm\n",
    "collectives/allreduce.py": "from ..core.schedule import Schedule\n",
    "rps/average.py": "from ..collectives import allreduce\n",
    "torch/rps.py": "from ..rps.average import allreduce\n",
    "bench/latency.py": "import partialcoll as pc\n",
}


#: a made-up csrc/ whose parts include only what they may
CLEAN_C = {
    "common/pc_common.h": "enum { PC_OK };\n",
    "transport/pc_transport.h": '#include "common/pc_common.h"\n',
    "sched/pc_sched.h": '#include <mpi.h>\n#include "common/pc_common.h"\n',
    "engine/pc_engine.h": '#include "sched/pc_sched.h"\n'
                          '#include "transport/pc_transport.h"\n',
    "engine/engine.c": '#include "engine/pc_engine.h"\n\n'
                       'int pc_engine_post(void)\n{\n    return 0;\n}\n',
    "python/module.c": '#include "engine/pc_engine.h"\n'
                       '#include "sched/pc_sched.h"\n',
    "capi/pc_capi.h": "#include <Python.h>\n",
    "python/pycapi.c": '#include "capi/pc_capi.h"\n'
                       '#include "sched/pc_sched.h"\n',
    "partial/calls.c": '#include "capi/pc_capi.h"\n',
    "mlfabric/linkops.h": "#include <Python.h>\n",
    "mlfabric/linkops.c": '#include "mlfabric/linkops.h"\n',
}


def make_csrc(tmp_path, files):
    """A csrc/ beside the made-up package from {relative path: code}."""
    for rel, code in files.items():
        path = tmp_path / "csrc" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)


def broken_rules(tmp_path, extra, c_extra=None):
    make_csrc(tmp_path, {**CLEAN_C, **(c_extra or {})})
    report = layout_rules.report(make_package(tmp_path, {**CLEAN, **extra}))
    return {rule for rule, bad in report.items() if bad}


def c_function(lines, excuse=""):
    """A C function of `lines` lines, in the style of csrc/."""
    body = [f"    x += {k};" for k in range(lines - 4)]
    if excuse:
        body[0] = f"    /* {excuse} */"
    return "\n".join(["static int f(int x)", "{", *body, "    return x;",
                      "}"]) + "\n"


def py_function(lines, excuse=""):
    body = [f"    x += {k}" for k in range(lines - 2)]
    if excuse:
        body[0] = f"    # {excuse}"
    return "\n".join(["def f(x):", *body, "    return x"]) + "\n"


def test_a_clean_made_up_package_passes(tmp_path):
    assert broken_rules(tmp_path, {}) == set()


@pytest.mark.parametrize("extra,rule", [
    ({"core/arrays.py": "from ..collectives import allreduce\n"},
     "layers"),                                   # an arrow back up
    ({"rps/optim.py": "from ..mlfabric import scheduler\n",
      "mlfabric/scheduler.py": "X = 1\n"}, "layers"),   # across systems
    ({"collectives/pool.py": "from .. import _core\n"}, "_core"),
    ({"tictac/ps.py": "import partialcoll as pc\n"}, "front door"),
    ({"eager/core.py": "from ..core.libcomm import _by_handle\n"},
     "private names"),                            # a private name imported
    ({"eager/core.py": "from ..core import _helpers\n",
      "core/_helpers.py": "X = 1\n"}, "private names"),   # a private module
    ({"core/libcomm.py": "_by_handle = {}\n",
      "eager/core.py": "from ..core import libcomm\n"
                       "x = libcomm._by_handle\n"},
     "private names"),                            # a private attribute
    ({"collectives/a.py": "from . import b\n",
      "collectives/b.py": "def f():\n    from . import a\n"}, "cycles"),
])
def test_each_rule_catches_its_case(tmp_path, extra, rule):
    assert broken_rules(tmp_path, extra) == {rule}


@pytest.mark.parametrize("extra,c_extra,rule", [
    ({}, {"transport/netem.c": '#include "sched/pc_sched.h"\n'},
     "C includes"),                       # a transport sees a schedule
    ({}, {"sched/build.c": '#include "engine/pc_engine.h"\n'},
     "C includes"),                       # an arrow back up
    ({}, {"python/pysched.c": '#include "transport/pc_transport.h"\n'},
     "C includes"),                       # the binding reaches a transport
    ({}, {"mlfabric/linkops.c": '#include "common/pc_common.h"\n'},
     "C includes"),                       # the separate extension
    ({}, {"partial/calls.c": '#include "sched/pc_sched.h"\n'},
     "C includes"),                       # past the executor's C API
    ({}, {"capi/pc_capi.h": '#include "engine/pc_engine.h"\n'},
     "C includes"),                       # the API leaks the executor
    ({}, {"engine/wire.c": '#include "pc_engine.h"\n'},
     "C includes"),                       # an include without its part
    ({}, {"engine/wire.c": '#include "engine/engine_int.h"\n'},
     "C includes"),                       # a header that is not there
    ({}, {"pc_stray.c": "int x;\n"}, "C includes"),   # outside the parts
    ({}, {"engine/round.c": c_function(81)}, "lengths"),
    ({}, {"engine/round.c": "int x;\n" * 601}, "lengths"),
    ({}, {"engine/round.c": "/* longer than 80 lines because ... */\n" +
          c_function(81)}, "lengths"),    # a file's excuse is not a function's
    ({"core/arrays.py": py_function(81)}, {}, "lengths"),
    ({"core/arrays.py": "x = 1\n" * 601}, {}, "lengths"),
])
def test_each_c_and_length_rule_catches_its_case(tmp_path, extra, c_extra,
                                                  rule):
    assert broken_rules(tmp_path, extra, c_extra) == {rule}


@pytest.mark.parametrize("extra,c_extra", [
    ({}, {"engine/round.c": c_function(80)}),
    ({}, {"engine/round.c": c_function(120, "longer than 80 lines because "
                                            "it is one table")}),
    ({}, {"engine/round.c": "/* longer than 600 lines: one state machine "
                            "*/\n" + "int x;\n" * 601}),
    ({"core/arrays.py": py_function(80)}, {}),
    ({"core/arrays.py": py_function(120, "longer than 80 lines: a table")},
     {}),
    ({"core/arrays.py": '"""A long module (longer than 600 lines: ...)."""\n'
                        + "x = 1\n" * 601}, {}),
])
def test_a_piece_that_says_why_it_is_longer_passes(tmp_path, extra, c_extra):
    assert broken_rules(tmp_path, extra, c_extra) == set()
