/* types.c -- datatypes and reduction operators, mapped onto MPI.
 * Reductions use MPI_Reduce_local, so every (op, type) pair MPI defines is
 * computed by the MPI library itself, on whichever thread runs the op.
 * float16, which MPI has no basic type for, travels as 16-bit words and is
 * reduced here: each element is widened to float (exact), combined in float
 * and rounded back to nearest even.  float's 24-bit significand is at least
 * 2 * 11 + 2 bits, so this double rounding gives the correctly rounded
 * float16 result of +, *, min and max (the same as NumPy's float16 loops). */
#include "sched/types.h"

#include <string.h>

const pc_dtype_info pc_dtypes[PC_NDTYPES] = {
    [PC_INT8] = {"int8", 1, 'i'},       [PC_INT16] = {"int16", 2, 'i'},
    [PC_INT32] = {"int32", 4, 'i'},     [PC_INT64] = {"int64", 8, 'i'},
    [PC_UINT8] = {"uint8", 1, 'u'},     [PC_UINT16] = {"uint16", 2, 'u'},
    [PC_UINT32] = {"uint32", 4, 'u'},   [PC_UINT64] = {"uint64", 8, 'u'},
    [PC_FLOAT32] = {"float32", 4, 'f'}, [PC_FLOAT64] = {"float64", 8, 'f'},
    [PC_LONGDOUBLE] = {"longdouble", sizeof(long double), 'f'},
    [PC_COMPLEX64] = {"complex64", 8, 'c'},
    [PC_COMPLEX128] = {"complex128", 16, 'c'},
    [PC_CLONGDOUBLE] = {"clongdouble", 2 * sizeof(long double), 'c'},
    [PC_BOOL] = {"bool", 1, 'b'},
    [PC_FLOAT16] = {"float16", 2, 'f'},
};

const char *const pc_redop_names[PC_NREDOPS] = {
    "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"};

MPI_Datatype pc_mpi_dtype(int dtype, int redop)
{
    switch (dtype) {
    case PC_INT8: return MPI_INT8_T;
    case PC_INT16: return MPI_INT16_T;
    case PC_INT32: return MPI_INT32_T;
    case PC_INT64: return MPI_INT64_T;
    case PC_UINT8: return MPI_UINT8_T;
    case PC_UINT16: return MPI_UINT16_T;
    case PC_UINT32: return MPI_UINT32_T;
    case PC_UINT64: return MPI_UINT64_T;
    case PC_FLOAT32: return MPI_FLOAT;
    case PC_FLOAT64: return MPI_DOUBLE;
    case PC_LONGDOUBLE: return MPI_LONG_DOUBLE;
    case PC_COMPLEX64: return MPI_C_FLOAT_COMPLEX;
    case PC_COMPLEX128: return MPI_C_DOUBLE_COMPLEX;
    case PC_CLONGDOUBLE: return MPI_C_LONG_DOUBLE_COMPLEX;
    case PC_FLOAT16: return MPI_UINT16_T;   /* moved as bits, reduced here */
    case PC_BOOL:
        /* MPI defines bitwise ops on integers only; on 0/1 bytes they are
         * the logical ones, so bool+BAND/BOR/BXOR reduce as uint8. */
        if (redop == PC_BAND || redop == PC_BOR || redop == PC_BXOR)
            return MPI_UINT8_T;
        return MPI_C_BOOL;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(int redop)
{
    switch (redop) {
    case PC_SUM: return MPI_SUM;
    case PC_PROD: return MPI_PROD;
    case PC_MIN: return MPI_MIN;
    case PC_MAX: return MPI_MAX;
    case PC_LAND: return MPI_LAND;
    case PC_LOR: return MPI_LOR;
    case PC_LXOR: return MPI_LXOR;
    case PC_BAND: return MPI_BAND;
    case PC_BOR: return MPI_BOR;
    case PC_BXOR: return MPI_BXOR;
    default: return MPI_OP_NULL;
    }
}

/* IEEE binary16 <-> binary32.  Widening is exact; narrowing rounds to
 * nearest, ties to even, overflowing to infinity; NaNs stay (quiet) NaNs. */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f,
             m = h & 0x3ff, u;
    if (e == 0x1f)                          /* inf, NaN */
        u = sign | 0x7f800000 | (m << 13);
    else if (e)                             /* normal: rebias 15 -> 127 */
        u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m)
        u = sign;
    else {                                  /* subnormal: m * 2^-24 */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000)                     /* NaN: keep it a quiet NaN */
        return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    if (a >= 0x477ff000)                    /* >= 65520: rounds to inf */
        return sign | 0x7c00;
    if (a >= 0x38800000) {                  /* normal: round at bit 13 */
        uint32_t r = a + 0xfff + ((a >> 13) & 1);
        return sign | (uint16_t)((r - 0x38000000) >> 13);
    }
    if (a <= 0x33000000)                    /* <= 2^-25: rounds to 0 */
        return sign;
    /* subnormal result, in units of 2^-24 (1 << 10 is the least normal) */
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e, q = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (q & 1)))
        q++;
    return sign | (uint16_t)q;
}

static int reduce_half(const uint16_t *src, uint16_t *dst, int64_t n,
                       int redop)
{
    for (int64_t i = 0; i < n; i++) {
        float x = half_to_float(dst[i]), y = half_to_float(src[i]);
        switch (redop) {
        case PC_SUM: dst[i] = float_to_half(x + y); break;
        case PC_PROD: dst[i] = float_to_half(x * y); break;
        case PC_MIN: if (y < x) dst[i] = src[i]; break;
        case PC_MAX: if (y > x) dst[i] = src[i]; break;
        default: return MPI_ERR_OP;
        }
    }
    return MPI_SUCCESS;
}

/* Sums and products of the common types in loops the compiler vectorises:
 * MPICH's MPI_Reduce_local took about three times as long as NumPy's add
 * on 4 MiB of float32.  Elementwise, so each result is the one MPI gives
 * (integers wrap, through their unsigned types).  Returns 0 where it does
 * not apply (another type or reduction, overlapping buffers). */
#define PC_LOOP(T, OP)                                                    \
    do {                                                                  \
        T *restrict d = dst;                                              \
        const T *restrict s = src;                                        \
        for (int64_t i = 0; i < n; i++)                                   \
            d[i] = d[i] OP s[i];                                          \
    } while (0)
#define PC_SUM_PROD(T)                                                    \
    do {                                                                  \
        if (redop == PC_SUM)                                              \
            PC_LOOP(T, +);                                                \
        else                                                              \
            PC_LOOP(T, *);                                                \
    } while (0)
__attribute__((optimize("O3")))
static int reduce_loops(const void *src, void *dst, int64_t n, int dtype,
                        int redop)
{
    size_t bytes = (size_t)n * (size_t)pc_dtypes[dtype].size;
    const char *a = src, *b = dst;
    if ((redop != PC_SUM && redop != PC_PROD) ||
        (a < b + bytes && b < a + bytes))
        return 0;
    switch (dtype) {
    case PC_FLOAT32: PC_SUM_PROD(float); return 1;
    case PC_FLOAT64: PC_SUM_PROD(double); return 1;
    case PC_INT32: case PC_UINT32: PC_SUM_PROD(uint32_t); return 1;
    case PC_INT64: case PC_UINT64: PC_SUM_PROD(uint64_t); return 1;
    default: return 0;
    }
}
#undef PC_SUM_PROD
#undef PC_LOOP

int pc_reduce_local(const void *src, void *dst, int64_t count, int dtype,
                    int redop)
{
    if (dtype == PC_FLOAT16)
        return reduce_half(src, dst, count, redop);
    if (reduce_loops(src, dst, count, dtype, redop))
        return MPI_SUCCESS;
    return MPI_Reduce_local(src, dst, (int)count, pc_mpi_dtype(dtype, redop),
                            mpi_op(redop));
}

/* Which (op, dtype) pairs are defined; mirrors the MPI standard's table. */
int pc_redop_valid(int redop, int dtype)
{
    if (redop < 0 || redop >= PC_NREDOPS || dtype < 0 || dtype >= PC_NDTYPES)
        return 0;
    int k = pc_dtypes[dtype].kind;
    switch (redop) {
    case PC_SUM: case PC_PROD: return k != 'b';
    case PC_MIN: case PC_MAX: return k == 'i' || k == 'u' || k == 'f';
    case PC_LAND: case PC_LOR: case PC_LXOR:
        return k == 'i' || k == 'u' || k == 'b';
    default: /* bitwise */
        return k == 'i' || k == 'u' || k == 'b';
    }
}

void pc_fill(void *dst, const void *src, int64_t count, int esize)
{
    size_t total = (size_t)count * (size_t)esize, done = (size_t)esize;
    const unsigned char *v = src;
    int zero = 1;
    for (int k = 0; k < esize; k++)
        zero &= v[k] == 0;
    if (zero || total == 0) {
        memset(dst, 0, total);
        return;
    }
    memcpy(dst, src, (size_t)esize);
    while (done < total) {          /* copy what is filled onto the rest */
        size_t k = done < total - done ? done : total - done;
        memcpy((unsigned char *)dst + done, dst, k);
        done += k;
    }
}

/* buf[i] /= divisor for the float and complex types (SCALE ops). */
int pc_scale(void *buf, int64_t count, int dtype, double divisor)
{
    switch (dtype) {
#define SCALE_LOOP(T)                                   \
    do {                                                \
        T *p = buf;                                     \
        for (int64_t i = 0; i < count; i++)             \
            p[i] /= (T)divisor;                         \
    } while (0)
    case PC_FLOAT16: {
        uint16_t *p = buf;
        for (int64_t i = 0; i < count; i++)
            p[i] = float_to_half(half_to_float(p[i]) / (float)divisor);
        return 0;
    }
    case PC_FLOAT32: SCALE_LOOP(float); return 0;
    case PC_FLOAT64: SCALE_LOOP(double); return 0;
    case PC_LONGDOUBLE: SCALE_LOOP(long double); return 0;
    case PC_COMPLEX64: count *= 2; SCALE_LOOP(float); return 0;
    case PC_COMPLEX128: count *= 2; SCALE_LOOP(double); return 0;
    case PC_CLONGDOUBLE: count *= 2; SCALE_LOOP(long double); return 0;
#undef SCALE_LOOP
    default: return -1;
    }
}
