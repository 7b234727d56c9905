"""CUDA source of the executor's device reductions, compiled by CuPy.

One kernel ``pc_<OP>_<dtype>(T *a, const T *b, long long n)`` computes
``a[i] = a[i] op b[i]`` with a grid-stride loop, for exactly the (op, dtype)
pairs the host executor supports, minus the long double types that CUDA has
not.  The C core launches them with ``cuLaunchKernel`` on the schedule's
stream; this module only writes the source and hands back the handles.
"""
from .ops import OPS

_CTYPES = {
    "int8": "signed char", "int16": "short", "int32": "int",
    "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
    "uint32": "unsigned int", "uint64": "unsigned long long",
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

_PRELUDE = """
struct pc_c64 { float re, im; };
struct pc_c128 { double re, im; };
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


def kernel_pairs():
    """(op name, dtype name) for every kernel in :func:`source`."""
    pairs = []
    for name, op in OPS.items():
        for dt in sorted(str(d) for d in op.dtypes):
            if dt not in _CTYPES:
                continue
            table = _COMPLEX if dt.startswith("complex") else _REAL
            if name in table:
                pairs.append((name, dt))
    return pairs


def source():
    """The CUDA C++ source of every reduction kernel."""
    parts = [_PRELUDE]
    for name, dt in kernel_pairs():
        table = _COMPLEX if dt.startswith("complex") else _REAL
        ctype = _CTYPES[dt]
        expr = table[name].replace("T{", ctype + "{").replace("(T)",
                                                               f"({ctype})")
        parts.append(_KERNEL.format(name=kernel_name(name, dt), t=ctype,
                                    expr=expr))
    return "".join(parts)
