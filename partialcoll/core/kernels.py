"""CUDA source of the executor's device reductions, compiled by CuPy.

One kernel ``pc_<OP>_<dtype>(T *a, const T *b, long long n)`` computes
``a[i] = a[i] op b[i]`` with a grid-stride loop, for exactly the (op, dtype)
pairs the host executor supports, minus the long double types that CUDA has
not.  The C core launches them with ``cuLaunchKernel`` on the schedule's
stream; this module only writes the source and hands back the handles.
float16 is stored as ``unsigned short`` and combined as the host executor
does (``csrc/sched/types.c``): widened to float, combined, rounded to
nearest even, with the conversions written out so that the source needs no
CUDA header and compiles for the host in the tests.
"""
from .ops import OPS

_CTYPES = {
    "int8": "signed char", "int16": "short", "int32": "int",
    "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
    "uint32": "unsigned int", "uint64": "unsigned long long",
    "float16": "unsigned short",
    "float32": "float", "float64": "double", "complex64": "pc_c64",
    "complex128": "pc_c128", "bool": "unsigned char",
}

# expressions of x (= a[i]) and y (= b[i])
_REAL = {
    "SUM": "x + y", "PROD": "x * y", "MIN": "(y < x ? y : x)",
    "MAX": "(y > x ? y : x)", "LAND": "(T)((x != 0) && (y != 0))",
    "LOR": "(T)((x != 0) || (y != 0))", "LXOR": "(T)((x != 0) != (y != 0))",
    "BAND": "(T)(x & y)", "BOR": "(T)(x | y)", "BXOR": "(T)(x ^ y)",
}
_COMPLEX = {
    "SUM": "T{x.re + y.re, x.im + y.im}",
    "PROD": "T{x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re}",
}

# float16 bits (x, y) combined through float (see csrc/sched/types.c)
_HALF = {
    "SUM": "pc_f2h(pc_h2f(x) + pc_h2f(y))",
    "PROD": "pc_f2h(pc_h2f(x) * pc_h2f(y))",
    "MIN": "(pc_h2f(y) < pc_h2f(x) ? y : x)",
    "MAX": "(pc_h2f(y) > pc_h2f(x) ? y : x)",
}

_PRELUDE = """
struct pc_c64 { float re, im; };
struct pc_c128 { double re, im; };
union pc_bits { float f; unsigned int u; };

__device__ inline float pc_h2f(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000) << 16;
    unsigned int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    pc_bits b;
    if (e == 0x1f) b.u = sign | 0x7f800000 | (m << 13);
    else if (e) b.u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) b.u = sign;
    else {
        e = 113;
        while (!(m & 0x400)) { m <<= 1; e--; }
        b.u = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    return b.f;
}

__device__ inline unsigned short pc_f2h(float f) {
    pc_bits b;
    b.f = f;
    unsigned short sign = (unsigned short)((b.u >> 16) & 0x8000);
    unsigned int a = b.u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00 | ((a >> 13) & 0x3ff);
    if (a >= 0x477ff000) return sign | 0x7c00;
    if (a >= 0x38800000)
        return sign | (unsigned short)((a + 0xfff + ((a >> 13) & 1)
                                        - 0x38000000) >> 13);
    if (a <= 0x33000000) return sign;
    unsigned int e = a >> 23, m = (a & 0x7fffff) | 0x800000;
    unsigned int shift = 126 - e, q = m >> shift;
    unsigned int rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (q & 1))) q++;
    return sign | (unsigned short)q;
}
"""

_KERNEL = """
extern "C" __global__ void {name}({t} *a, const {t} *b, long long n) {{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {{
        {t} x = a[i];
        const {t} y = b[i];
        a[i] = {expr};
    }}
}}
"""


def kernel_name(op, dtype):
    return f"pc_{op}_{dtype}"


def _table(dtype):
    if dtype == "float16":
        return _HALF
    return _COMPLEX if dtype.startswith("complex") else _REAL


def kernel_pairs():
    """(op name, dtype name) for every kernel in :func:`source`."""
    pairs = []
    for name, op in OPS.items():
        for dt in sorted(str(d) for d in op.dtypes):
            if dt not in _CTYPES:
                continue
            if name in _table(dt):
                pairs.append((name, dt))
    return pairs


def source():
    """The CUDA C++ source of every reduction kernel."""
    parts = [_PRELUDE]
    for name, dt in kernel_pairs():
        ctype = _CTYPES[dt]
        expr = _table(dt)[name].replace("T{", ctype + "{") \
            .replace("(T)", f"({ctype})")
        parts.append(_KERNEL.format(name=kernel_name(name, dt), t=ctype,
                                    expr=expr))
    return "".join(parts)
