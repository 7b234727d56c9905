"""The command line (``partialcoll-bench``): argparse subparsers, so
``--help`` lists every benchmark and each one's ``--help`` its options;
and library code that reports through logging, not print."""
import argparse
import ast
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

import pytest

import partialcoll
from partialcoll.bench.__main__ import COMMANDS, build_parser


def bench_argv():
    """The installed console script, or ``python -m partialcoll.bench``
    (a source checkout with the extension built in place)."""
    exe = os.path.join(os.path.dirname(sys.executable), "partialcoll-bench")
    if os.path.exists(exe):
        return [exe]
    return [sys.executable, "-m", "partialcoll.bench"]


def run_bench(*args, timeout=60):
    # no MPI launcher's variables: a singleton MPI process; wide lines, so
    # argparse does not wrap the help texts the test looks for
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "OMPI_"))}
    env["COLUMNS"] = "250"
    t0 = time.monotonic()
    p = subprocess.run(bench_argv() + list(args), capture_output=True,
                       text=True, timeout=timeout, env=env,
                       cwd=os.path.dirname(__file__))
    return p, time.monotonic() - t0


def test_top_level_help_lists_every_command_with_its_summary():
    p, secs = run_bench("--help")
    assert p.returncode == 0, p.stderr
    assert secs < 30, f"--help took {secs:.1f} s"
    text = " ".join(p.stdout.split())
    assert text.startswith("usage: partialcoll-bench")
    for name, (_, summary) in COMMANDS.items():
        assert f"{name} {' '.join(summary.split())}" in text, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_help_shows_its_options(name):
    p, secs = run_bench(name, "--help")
    assert p.returncode == 0, p.stderr
    assert secs < 30, f"{name} --help took {secs:.1f} s"
    assert p.stdout.startswith(f"usage: partialcoll-bench {name} ")
    # its own options, from the module's add_args
    own = argparse.ArgumentParser(add_help=False)
    COMMANDS[name][0].add_args(own)
    flags = [a.option_strings[-1] for a in own._actions if a.option_strings]
    assert flags and all(f in p.stdout for f in flags)


def test_missing_or_unknown_command_is_a_usage_error():
    p, _ = run_bench()
    assert p.returncode == 2 and "required: COMMAND" in p.stderr
    p, _ = run_bench("no-such-bench")
    assert p.returncode == 2 and "invalid choice: 'no-such-bench'" in p.stderr


def test_parsed_arguments_reach_the_commands_run():
    args = build_parser().parse_args(["latency", "--iters", "3"])
    module = COMMANDS["latency"][0]
    assert args.run == module.run and args.iters == 3


def print_calls(path):
    """Line numbers of calls to print() in a module (docstrings, which may
    show a user printing, are not calls)."""
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_library_code_reports_through_logging_not_print():
    """Only the command-line tools (partialcoll.bench) print."""
    root = pathlib.Path(partialcoll.__file__).parent
    found = {str(p.relative_to(root)): lines
             for p in sorted(root.rglob("*.py"))
             if "bench" not in p.relative_to(root).parts
             for lines in [print_calls(p)] if lines}
    assert not found, f"print() in library code (use the 'partialcoll' " \
                      f"logger): {found}"


def test_a_bad_option_is_said_once_whatever_the_ranks():
    """Every rank parses the command line; the usage error is printed by
    rank 0 only, and every rank exits with argparse's status 2."""
    from conftest import run_mpi
    bench = bench_argv()
    argv = ["python"] + bench[1:] if bench[0] == sys.executable else bench
    rc, out, err, _ = run_mpi(argv + ["latency", "--iters", "x"], n=3,
                              timeout=60)
    assert rc != 0
    assert err.count("error: argument -i/--iters") == 1, err


def test_version_names_the_library_and_its_mpi():
    p, _ = run_bench("--version")
    assert p.returncode == 0
    assert p.stdout.startswith(f"partialcoll {partialcoll.__version__}, ")
    assert "mpi4py" in p.stdout and "numpy" in p.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_description_is_plain_restructuredtext(name):
    """A command's description (its module's docstring, roles made plain)
    parses as reStructuredText without a message: the benchmark page of
    the documentation is generated from it."""
    import io
    docutils = pytest.importorskip("docutils.core")
    from partialcoll.bench.__main__ import plain
    said = io.StringIO()
    docutils.publish_doctree(plain(COMMANDS[name][0].__doc__),
                             settings_overrides={"warning_stream": said,
                                                 "report_level": 2})
    assert not said.getvalue(), said.getvalue()


def test_a_rank_missing_a_dependency_ends_the_job(tmp_path):
    """``overlap`` needs torch; on rank 2 of 3 a stand-in ``torch`` module
    on PYTHONPATH fails to import.  That rank says which command needs what
    and how to install it, and the job ends at once with a non-zero status
    (the other ranks do not wait for it in a collective until mpiexec's
    time limit)."""
    from conftest import run_mpi
    (tmp_path / "torch.py").write_text(
        'raise ImportError("no torch on this host")\n')
    bench = bench_argv()
    argv = ["python"] + bench[1:] if bench[0] == sys.executable else bench
    cmd = argv + ["overlap", "--steps", "50", "--modes", "sync"]
    cmd = [sys.executable if a == "python" else a for a in cmd]
    mpmd = cmd + [":", "-n", "1", "env", f"PYTHONPATH={tmp_path}"] + cmd
    rc, out, err, secs = run_mpi(mpmd, n=2, timeout=60)
    assert rc not in (0, 124), (rc, out, err)
    assert "partialcoll: rank 2 failed" in err, err
    assert "partialcoll-bench overlap needs torch (no torch on this " \
           "host): pip install 'partialcoll[torch]'" in err, err


def test_an_uncaught_exception_on_one_rank_ends_the_job(mpi_script):
    """With :func:`partialcoll.abort_on_error`, rank 1 raising while rank 0
    waits in a barrier ends both, the traceback printed with the rank."""
    rc, out, err, secs = mpi_script(
        "import partialcoll as pc\n"
        "from mpi4py import MPI\n"
        "pc.abort_on_error()\n"
        "if MPI.COMM_WORLD.rank == 1:\n"
        "    raise RuntimeError('rank one gives up')\n"
        "MPI.COMM_WORLD.Barrier()\n", n=2, timeout=60)
    assert rc not in (0, 124), (rc, out, err)
    assert "partialcoll: rank 1 failed; ending every rank" in err, err
    assert "RuntimeError: rank one gives up" in err, err


def test_abort_on_error_refuses_a_bad_code():
    with pytest.raises(partialcoll.ScheduleError, match="1..255"):
        partialcoll.abort_on_error(0)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_default(name):
    """Every option with a default says it in --help (as
    ArgumentDefaultsHelpFormatter would; the text's own wording where it
    has one)."""
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[name]
    formatter = sub._get_formatter()
    missing = [a.option_strings[0] for a in sub._actions
               if a.option_strings and a.default not in (None, False)
               and a.default != argparse.SUPPRESS
               and "default" not in formatter._get_help_string(a)]
    assert not missing, f"{name}: no default shown for {missing}"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or
                    importlib.util.find_spec("torchvision") is None,
                    reason="needs torch and torchvision")
def test_tictac_needs_are_met_where_the_models_load():
    """A torchvision whose compiled operators do not load beside this
    torch (PyPI's CUDA build beside a CPU torch) still has its model
    definitions, which the TicTac graphs use: the benchmark's check of
    what it needs must accept it, as the graphs module does."""
    code = ("from partialcoll.bench.__main__ import NEEDS, require; "
            "require(NEEDS['tictac'], 'tictac')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120,
                       cwd=os.path.dirname(__file__))
    assert p.returncode == 0, p.stderr[-2000:]
