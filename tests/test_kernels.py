"""The CUDA reduction kernels, compiled for the host with a C++ compiler and
a few lines that stand in for CUDA's thread indices: every (op, dtype)
kernel must compute what the host executor computes.  (On a GPU the same
source is compiled by CuPy; see tests/test_device.py.)"""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import partialcoll as pc
from partialcoll import _kernels

SHIM = """
#define __global__
struct pc_dim { unsigned x; };
static const pc_dim blockDim = {1}, gridDim = {1}, blockIdx = {0},
                    threadIdx = {0};
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler to build the kernels for the host")
    d = tmp_path_factory.mktemp("kernels")
    src, so = d / "kernels.cpp", d / "kernels.so"
    src.write_text(SHIM + _kernels.source())
    subprocess.run([cxx, "-std=c++11", "-Wall", "-Werror", "-O1", "-shared",
                    "-fPIC", str(src), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


def test_every_kernel_matches_the_host_reduction(lib):
    rng = np.random.default_rng(0)
    pairs = _kernels.kernel_pairs()
    assert len(pairs) == 98
    for op, dt in pairs:
        n = 257
        if dt == "bool":
            a, b = rng.integers(0, 2, n).astype(bool), \
                rng.integers(0, 2, n).astype(bool)
        else:
            a = rng.integers(-50, 50, n).astype(dt)
            b = rng.integers(-50, 50, n).astype(dt)
            if dt.startswith("complex"):
                a = a + 1j * rng.integers(-5, 5, n)
                b = b + 1j * rng.integers(-5, 5, n)
                a, b = a.astype(dt), b.astype(dt)
        want = a.copy()
        s = pc.Schedule()            # the host executor's own reduction
        x, y = s.buffer(want), s.buffer(b.copy())
        s.reduce(x, y, op)
        s.post().wait()
        s.free()
        got = a.copy()
        fn = getattr(lib, _kernels.kernel_name(op, dt))
        fn(ctypes.c_void_p(got.ctypes.data), ctypes.c_void_p(b.ctypes.data),
           ctypes.c_longlong(n))
        assert np.array_equal(got, want), (op, dt)
