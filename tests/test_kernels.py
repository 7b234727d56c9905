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
from partialcoll.core import kernels

SHIM = """
#define __global__
#define __device__
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
    src.write_text(SHIM + kernels.source())
    subprocess.run([cxx, "-std=c++11", "-Wall", "-Werror", "-O1", "-shared",
                    "-fPIC", str(src), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


def test_every_kernel_matches_the_host_reduction(lib):
    rng = np.random.default_rng(0)
    pairs = kernels.kernel_pairs()
    assert len(pairs) == 102        # 98 + float16 SUM/PROD/MIN/MAX
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
        fn = getattr(lib, kernels.kernel_name(op, dt))
        fn(ctypes.c_void_p(got.ctypes.data), ctypes.c_void_p(b.ctypes.data),
           ctypes.c_longlong(n))
        assert np.array_equal(got, want), (op, dt)


def test_float16_kernels_match_the_host_executor_bit_for_bit(lib):
    """Random float16 bit patterns (subnormals, infinities and large values
    included; NaNs only where the ops agree on them) through the CUDA
    kernels and the host executor, which must also equal NumPy's float16
    arithmetic (float, then rounded to nearest even)."""
    rng = np.random.default_rng(1)
    n = 1 << 16
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)
    b = rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    for op, ref in (("SUM", np.add), ("PROD", np.multiply),
                    ("MIN", np.minimum), ("MAX", np.maximum)):
        want = a.copy()
        s = pc.Schedule()
        x, y = s.buffer(want), s.buffer(b.copy())
        s.reduce(x, y, op)
        s.post().wait()
        s.free()
        with np.errstate(over="ignore"):
            expect = ref(a, b)
        assert np.array_equal(want.view(np.uint16), expect.view(np.uint16)), op
        got = a.copy()
        getattr(lib, kernels.kernel_name(op, "float16"))(
            ctypes.c_void_p(got.ctypes.data), ctypes.c_void_p(b.ctypes.data),
            ctypes.c_longlong(got.size))
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), op
