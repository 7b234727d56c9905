"""One convention for sizes, rates and durations, the same on the benchmark
command line, in the emulated network's TOML and in the Python functions:
bare suffixes (64K) and IEC names (64KiB) are binary, SI names (64kB,
64KB, 10 MB/s) decimal; bits for rates with b or bit."""
import argparse
import math

import pytest

from partialcoll import ScheduleError
from partialcoll.bench._common import byte_size, duration_text, parse_size, \
    rate_text
from partialcoll.core import units
from partialcoll.transport import network


@pytest.mark.parametrize("text,nbytes", [
    ("0", 0), ("8", 8), ("8B", 8), ("1K", 1024), ("64K", 65536),
    ("64KiB", 65536), ("64 KiB", 65536), ("64Ki", 65536), ("64kB", 64000),
    ("64KB", 64000), ("4M", 4 << 20), ("4MiB", 4 << 20), ("4MB", 4000000),
    ("1G", 1 << 30), ("1GB", 10 ** 9), ("1.5K", 1536), ("2T", 2 << 40),
    (4096, 4096), (4096.0, 4096)])
def test_sizes(text, nbytes):
    assert units.size(text) == nbytes
    assert isinstance(units.size(text), int)


@pytest.mark.parametrize("text", ["64KB", "64K", "64KiB", "1 MB", "4M"])
def test_one_size_everywhere(text):
    """The command line, the network's TOML and the Python function read
    a size alike."""
    assert parse_size(text) == network._bytes(text) == units.size(text)
    assert byte_size(text) == text


@pytest.mark.parametrize("bad", ["", "K", "x", "-1", "0.5", "0.1B", "1.0001K",
                                 "64 Kb", "4M/s", "1e400", True, None, [8]])
def test_sizes_refused(bad):
    with pytest.raises(ScheduleError):
        units.size(bad)


def test_size_minimum_and_the_command_line_type():
    with pytest.raises(ScheduleError, match="at least 1 bytes"):
        units.size("0", minimum=1)
    with pytest.raises(argparse.ArgumentTypeError, match="binary, as MPI"):
        byte_size("0")
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        byte_size("4 apples")


@pytest.mark.parametrize("text,bps", [
    ("10 MB/s", 1e7), ("10MB/s", 1e7), ("100 kB/s", 1e5),
    ("2.5 MiB/s", 2.5 * 2 ** 20), ("1 Gb/s", 1.25e8), ("1 Gbit/s", 1.25e8),
    ("1 Gbps", 1.25e8), ("8 b/s", 1.0), ("5 B/s", 5.0), (5, 5.0),
    ("unlimited", math.inf)])
def test_rates(text, bps):
    assert units.rate(text) == pytest.approx(bps)
    assert network.rate(text) == units.rate(text)


@pytest.mark.parametrize("text,s", [
    ("1 ms", 1e-3), ("250 us", 2.5e-4), ("250 µs", 2.5e-4), ("10 ns", 1e-8),
    ("2 s", 2.0), ("0", 0.0), (0.5, 0.5)])
def test_durations(text, s):
    assert units.duration(text) == pytest.approx(s)
    assert network.seconds(text) == units.duration(text)


@pytest.mark.parametrize("read,checked,bad", [
    *[(units.rate, rate_text, b) for b in
      ["10M/s", "10 MB", "fast", 0, -1, "0 MB/s", float("nan")]],
    *[(units.duration, duration_text, b) for b in
      ["1", "ms", "-1 ms", -0.5, "1 h", math.inf]]])
def test_rates_and_durations_refused(read, checked, bad):
    with pytest.raises(ScheduleError):
        read(bad)
    if isinstance(bad, str):
        with pytest.raises(argparse.ArgumentTypeError):
            checked(bad)


@pytest.mark.parametrize("n,text", [(8, "8B"), (1000, "1000B"),
                                    (65536, "64KiB"), (4 << 20, "4MiB"),
                                    (3 << 30, "3GiB"), (1536, "1536B")])
def test_format_size(n, text):
    assert units.format_size(n) == text
    assert units.size(text) == n
