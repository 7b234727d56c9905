/* types.h -- datatypes and reduction operators of a schedule's ops, and
 * how they map onto MPI (types.c). */
#ifndef PC_TYPES_H
#define PC_TYPES_H

#include <mpi.h>
#include <stdint.h>

enum { PC_INT8, PC_INT16, PC_INT32, PC_INT64, PC_UINT8, PC_UINT16, PC_UINT32,
       PC_UINT64, PC_FLOAT32, PC_FLOAT64, PC_LONGDOUBLE, PC_COMPLEX64,
       PC_COMPLEX128, PC_CLONGDOUBLE, PC_BOOL, PC_FLOAT16, PC_NDTYPES };
enum { PC_SUM, PC_PROD, PC_MIN, PC_MAX, PC_LAND, PC_LOR, PC_LXOR, PC_BAND,
       PC_BOR, PC_BXOR, PC_NREDOPS };

typedef struct {
    const char *name;   /* numpy dtype name */
    int size;           /* bytes per element */
    int kind;           /* 'i', 'u', 'f', 'c', 'b' */
} pc_dtype_info;

extern const pc_dtype_info pc_dtypes[PC_NDTYPES];
extern const char *const pc_redop_names[PC_NREDOPS];
/* the MPI datatype an op of dtype moves (and reduces with redop) */
MPI_Datatype pc_mpi_dtype(int dtype, int redop);
int pc_redop_valid(int redop, int dtype);
/* dst[i] = dst[i] op src[i]: MPI_Reduce_local for the types MPI has, our
 * own loop for float16 (widened to float, combined, rounded to nearest
 * even).  Returns an MPI error code. */
int pc_reduce_local(const void *src, void *dst, int64_t count, int dtype,
                    int redop);
/* dst[0 .. count) = the one element at src (esize bytes): a memset where
 * that element's bytes are all zero, else doubling copies */
void pc_fill(void *dst, const void *src, int64_t count, int esize);
/* buf[i] /= divisor (float and complex types); -1 for other types */
int pc_scale(void *buf, int64_t count, int dtype, double divisor);

#endif
