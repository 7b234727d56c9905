"""The layout rules (tests/layout_rules.py) hold for the package, and
each rule catches what it is meant to catch: every rule is run on a small
made-up package that breaks it once."""
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


def broken_rules(tmp_path, extra):
    report = layout_rules.report(make_package(tmp_path, {**CLEAN, **extra}))
    return {rule for rule, bad in report.items() if bad}


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
