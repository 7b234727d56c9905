/* pc_types.c -- datatypes and reduction operators, mapped onto MPI.
 * Reductions use MPI_Reduce_local, so every (op, type) pair MPI defines is
 * computed by the MPI library itself, on whichever thread runs the op. */
#include "pc_sched.h"

#include <stdlib.h>

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
    case PC_BOOL:
        /* MPI defines bitwise ops on integers only; on 0/1 bytes they are
         * the logical ones, so bool+BAND/BOR/BXOR reduce as uint8. */
        if (redop == PC_BAND || redop == PC_BOR || redop == PC_BXOR)
            return MPI_UINT8_T;
        return MPI_C_BOOL;
    default: return MPI_DATATYPE_NULL;
    }
}

MPI_Op pc_mpi_op(int redop)
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

const char *const pc_kind_names[PC_NKINDS] = {
    "nop", "trigger", "send", "recv", "reduce", "copy", "callback", "fence",
    "delay", "start_at", "gate", "scale"};

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

static _Atomic int alloc_countdown = -1;

void pc_inject_alloc_failure(int n)
{
    atomic_store(&alloc_countdown, n);
}

void *pc_realloc(void *p, size_t n)
{
    return pc_alloc_ok() ? realloc(p, n) : NULL;
}

int pc_alloc_ok(void)
{
    int n = atomic_load(&alloc_countdown);
    while (n > 0 && !atomic_compare_exchange_weak(&alloc_countdown, &n, n - 1))
        ;
    return n != 0;
}
