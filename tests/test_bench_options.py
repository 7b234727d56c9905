"""Every benchmark spells the options they share alike, so what works on
one command works on the next: ``-i/--iters`` for timed iterations,
``-x/--warmup`` for untimed ones first, ``-d/--dtype`` for the element
type, ``-m MIN:MAX`` with ``-f`` for a sweep over sizes, and every size in
bytes read by :mod:`partialcoll.core.units` ("4K" and "4KiB" are 4,096
bytes, "4kB" is 4,000).  The checks walk every command's parser, so a
command added or changed later is held to the same rules.  Former
spellings still work and say what to write instead.  Only the parser
runs here, no benchmark."""
import re

import pytest

from partialcoll.bench import _common, allreduce, sweep
from partialcoll.bench.__main__ import COMMANDS, build_parser
from partialcoll.core import units

#: command -> its parser
PARSERS = build_parser()._subparsers._group_actions[0].choices

#: concept -> (the spellings, the other spellings that mean it, its dest)
SHARED = {
    "iterations": (("-i", "--iters"), {"--iterations", "--iter", "-n"},
                   "iters"),
    "warm-up": (("-x", "--warmup"), {"--warm-up", "--warmup-iters", "-w"},
                "warmup"),
    "dtype": (("-d", "--dtype"), {"--datatype", "--type", "-t"}, "dtype"),
}

#: options whose names say size but that count something other than bytes
NOT_BYTES = {("mlfabric-sched", "--sizes"): "batch sizes |U|, in updates"}

_SIZE_NAME = re.compile(r"size|bytes|payload|bucket|partition")


def _options(name):
    """Every option of ``name`` but --help; the deprecated spellings
    (checked below) left out."""
    return [a for a in PARSERS[name]._actions
            if a.option_strings and a.dest != "help"
            and not isinstance(a, _common._Renamed)]


def _bytes(value):
    """What a size option parsed, as a tuple of byte counts (the types
    return the text as given, a (min, max) pair, or a list's text)."""
    if isinstance(value, tuple):
        return value
    return tuple(units.size(t) for t in str(value).split(","))


def size_options(name):
    """The options of ``name`` whose names say they take a size."""
    out = []
    for action in _options(name):
        long = [f for f in action.option_strings if f.startswith("--")]
        if any(_SIZE_NAME.search(f) for f in long) and \
                (name, long[-1]) not in NOT_BYTES:
            out.append(action)
    return out


def test_the_walk_sees_every_command_and_the_shared_options():
    assert set(PARSERS) == set(COMMANDS)
    flags = {f for name in PARSERS for a in _options(name)
             for f in a.option_strings}
    assert {"-i", "--iters", "-x", "--warmup", "-d", "--dtype", "-m",
            "-f", "--size"} <= flags
    sizes = {(name, a.option_strings[-1]) for name in PARSERS
             for a in size_options(name)}
    assert {("latency", "--size"), ("aware", "--size"),
            ("sweep", "--sizes"), ("allreduce", "--maxbytes"),
            ("tictac", "--payload"), ("overlap", "--bucket"),
            ("rps", "--service-bytes")} <= sizes, sizes


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_shared_options_spelled_alike(name):
    wrong = []
    for action in _options(name):
        given = set(action.option_strings)
        for concept, (spelled, others, dest) in SHARED.items():
            if (given & (set(spelled) | others) or action.dest == dest) \
                    and not (set(spelled) <= given and action.dest == dest):
                wrong.append(f"{concept} is {'/'.join(spelled)}, not "
                             f"{'/'.join(action.option_strings)}")
    assert not wrong, f"{name}: {wrong}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_size_options_read_bytes_in_the_one_convention(name):
    for action in size_options(name):
        flag = action.option_strings[-1]
        assert action.type is not None, f"{name} {flag}: no size type"
        binary = [_bytes(action.type(t)) for t in ("4K", "4KiB", "4 KiB")]
        assert binary[0] == binary[1] == binary[2], (name, flag, binary)
        assert set(binary[0]) == {4096}, (name, flag, binary[0])
        assert set(_bytes(action.type("4kB"))) == {4000}, (name, flag)
        with pytest.raises(Exception):
            action.type("4 apples")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_size_sweeps_read_min_max_and_a_factor(name):
    for action in _options(name):
        if {"-m", "--message-size"} & set(action.option_strings):
            assert action.type is _common.size_range, name
            assert action.type("4K:1MiB") == (4096, 1 << 20)
            step = [a for a in _options(name) if "-f" in a.option_strings]
            assert step and step[0].type is _common.factor, name


def test_a_sweep_gives_the_same_sizes_in_every_command():
    for cmd, module in (("allreduce", allreduce), ("sweep", sweep)):
        args = PARSERS[cmd].parse_args("-m 8:64 -f 2".split())
        assert module.sizes_of(args) == [8, 16, 32, 64], cmd
        args = PARSERS[cmd].parse_args("-m 1K:1MiB -f 32".split())
        assert module.sizes_of(args) == [1024, 32768, 1 << 20], cmd


def test_a_step_without_a_range_is_refused():
    """-f steps a -m range: with a list of sizes it would be ignored."""
    args = PARSERS["sweep"].parse_args("--sizes 8,64 -f 4".split())
    with pytest.raises(SystemExit, match="-f is the step of a -m"):
        sweep.sizes_of(args)
    args = PARSERS["sweep"].parse_args("-m 8:64".split())
    assert sweep.sizes_of(args) == [8, 16, 32, 64]        # -f 2 unsaid


def test_the_familiar_spellings_of_allreduce_still_read():
    """OSU's --iterations and nccl-tests' --datatype: the same options."""
    a = PARSERS["allreduce"].parse_args(
        "--iterations 7 --datatype int64".split())
    assert (a.iters, a.dtype) == (7, "int64")


@pytest.mark.parametrize("line, dest, bytes_", [
    ("latency --count 300", "size", 1200),
    ("aware --mbytes 0.2", "size", 200_000),
])
def test_a_former_option_still_works_and_says_what_to_write(
        line, dest, bytes_, capsys):
    args = build_parser().parse_args(line.split())
    assert units.size(getattr(args, dest)) == bytes_
    err = capsys.readouterr().err
    old = line.split()[1]
    assert f"{old} is deprecated" in err and f"--size {bytes_}" in err, err


def test_repeats_is_repeat_everywhere(capsys):
    """One spelling for timed blocks or batches repeated: --repeat."""
    for name in sorted(COMMANDS):
        flags = {f for a in _options(name) for f in a.option_strings}
        assert "--repeats" not in flags, name
    args = build_parser().parse_args("mlfabric-sched --repeats 3".split())
    assert int(args.repeat) == 3
    assert "--repeats is deprecated" in capsys.readouterr().err


@pytest.mark.parametrize("line", ["latency --size 1200",
                                  "latency --size 1200B",
                                  "aware --size 200kB"])
def test_the_new_spelling_says_nothing(line, capsys):
    build_parser().parse_args(line.split())
    assert "deprecated" not in capsys.readouterr().err
