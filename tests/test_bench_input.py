"""The benchmark command line refuses bad values up front, on every rank
alike and before any message (one rank raising mid-run left the others
waiting; other values were silently measured as something else): counts,
sizes, warm-up, steps, delays, intervals, seeds, straggler and network
names, and output files whose directory is missing.  No benchmark runs
here: only the parser (and aware's cross-check, before any message)."""
import os

import pytest

from partialcoll.bench import aware
from partialcoll.bench.__main__ import COMMANDS, build_parser

BAD = [
    "latency --step-ms -5", "latency --iters 0", "latency --iters -2",
    "latency --count -4", "latency --warmup -1", "latency --step-ms nan",
    "latency --size 6", "latency --size 0", "latency --size 4K --count 2",
    "hyperplane --delays -50", "hyperplane --delays 200,x",
    "hyperplane --eval-every 0", "hyperplane --steps 0",
    "sweep --iters -3", "sweep --iters 0", "sweep --sizes -8",
    "sweep --sizes 0", "sweep --sizes 8,,x", "sweep --warmup -1",
    "sweep --repeat 0", "sweep -m 64:8", "sweep -m 8:64 --sizes 8",
    "sweep -f 1", "sweep -d int3", "tictac -i 0", "tictac -x -1",
    "mlfabric-sched --sizes 0", "mlfabric-sched --sizes -5",
    "mlfabric-sched --repeat 0", "mlfabric-sched --runs 0",
    "mlfabric-sched --aggregators -1", "mlfabric-sched --seed -1",
    "aware --mbytes -1", "aware --size 1MiB+", "aware --size 2",
    "aware --low 0", "aware --every inf",
    "aware --schemes aware,fast", "aware --schemes aware,,oracle",
    "netcal --size -5", "netcal --size 0", "netcal --repeat 0",
    "rps --every 0", "rps --iters 0",
    "mlfabric --stragglers C9", "mlfabric --networks N7",
    "mlfabric --networks N1,,N2", "mlfabric --seeds -1",
    "mlfabric --compute inf", "mlfabric --interval 0",
    "mlfabric --momentum-at replica", "mlfabric-replica --div-max 0",
    "mlfabric-replica --div-max nan", "mlfabric-replica --div-max 5,-inf",
    "mlfabric-replica --checkpoint-every 0", "mlfabric-replica --duration 0",
    "tictac --iters 0", "tictac --payload -8M", "tictac --rhos 0",
    "tictac-allreduce --steps 0", "tictac-allreduce --bucket 0",
    "overhead --iters 0", "overlap --steps 0", "overlap --bucket -1",
    "lstm --eval-every 0",
    "allreduce -m 8:x", "allreduce -m 64:8", "allreduce -m 0:8",
    "allreduce -f 1", "allreduce -i 0", "allreduce -x -1",
    "allreduce -d int3", "allreduce -o mean", "allreduce -b 0",
    "allreduce -c 2", "latency --sweep-steps 0,-1", "latency --sweep-steps x",
]


@pytest.mark.parametrize("line", BAD)
def test_bad_values_refused_by_the_parser(line, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(line.split())
    assert info.value.code == 2
    assert "argument" in capsys.readouterr().err


#: what a command needs on its command line besides options
REQUIRED = {"mlfabric-retarget": ["curves.json"]}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_default_parses(name):
    args = build_parser().parse_args([name] + REQUIRED.get(name, []))
    assert args.run is COMMANDS[name][0].run


def test_good_values_pass():
    p = build_parser()
    a = p.parse_args("sweep --sizes 8,4K,1M --iters 3 --warmup 1".split())
    assert a.sizes == "8,4K,1M" and a.iters == 3
    a = p.parse_args("mlfabric --stragglers C1,C3 --networks N2".split())
    assert a.stragglers == "C1,C3"
    a = p.parse_args("latency --step-ms 0 --warmup 0".split())
    assert a.step_ms == 0.0 and a.warmup == 0
    a = p.parse_args(["aware", "--sweep", "", "--schemes", ""])
    assert (a.sweep, a.schemes) == ("", "")
    a = p.parse_args("sweep -i 7 -x 0".split())
    assert (a.iters, a.warmup) == (7, 0)
    a = p.parse_args("allreduce -m 8:4M -i 100 -x 10".split())
    assert a.message_size == (8, 4 << 20)
    assert (a.iters, a.warmup) == (100, 10)
    a = p.parse_args("allreduce -b 1KB -e 64K -f 4 -o max -d int64".split())
    assert (a.minbytes, a.maxbytes, a.stepfactor) == ("1KB", "64K", 4.0)


def test_allreduce_sizes_osu_and_nccl_tests_forms():
    from partialcoll.bench import allreduce
    p = build_parser()
    sizes = allreduce.sizes_of(p.parse_args("allreduce -m 8:64".split()))
    assert sizes == [8, 16, 32, 64]
    sizes = allreduce.sizes_of(p.parse_args(
        "allreduce -b 1K -e 1M -f 32".split()))
    assert sizes == [1024, 32768, 1 << 20]
    default = allreduce.sizes_of(p.parse_args(["allreduce"]))
    assert (default[0], default[-1]) == (8, 1 << 20)
    with pytest.raises(SystemExit, match="not both"):
        allreduce.sizes_of(p.parse_args("allreduce -m 8:64 -b 8".split()))


@pytest.mark.parametrize("option", ["--json", "--csv", "--plot"])
def test_output_in_a_missing_directory_refused(option, tmp_path, capsys):
    path = str(tmp_path / "no-such-dir" / "out.x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["latency", option, path])
    assert "no directory" in capsys.readouterr().err


def test_output_in_an_existing_directory_accepted(tmp_path):
    path = str(tmp_path / "out.json")
    args = build_parser().parse_args(["sweep", "--json", path])
    assert args.json == path
    assert not os.path.exists(path)          # checked, not written


def test_output_that_is_a_directory_refused(tmp_path):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--csv", str(tmp_path)])


def test_aware_low_above_high_refused_before_any_message():
    args = build_parser().parse_args("aware --low 5 --high 2".split())
    with pytest.raises(SystemExit, match="must not exceed --high"):
        aware.run(args)
