/*
 * device.h -- device (GPU) memory for the executor: a schedule's device queue.
 *
 * A buffer slot lives in host or device memory.  COPY and REDUCE ops that
 * touch a device slot are *device ops*: they are queued on the schedule's
 * device queue (a CUDA stream) and stay in flight until an event recorded
 * after them has completed, so a successor (an MPI send of the copied bytes,
 * say) never sees half-written data.  FENCE ops complete once everything
 * queued before them has run (on the CUDA backend that includes work the
 * application made the stream wait for).  A LOCKED device op is run to
 * completion inside its hold of the data lock.
 *
 * Device ops of one schedule share one queue and complete in queue order.
 *
 * The executor knows nothing of CUDA at build time.  Two backends:
 *   cuda      libcuda.so.1 opened with dlopen(); copies with cuMemcpyAsync,
 *             reductions with kernels the Python layer compiled (CuPy) and
 *             handed over as CUfunction handles, launched with
 *             cuLaunchKernel on the schedule's stream.
 *   emulate   "device" memory is host memory; queued work runs later, a
 *             little at a time, when the progress side polls (so a missing
 *             dependency on a device op shows up as wrong data on a machine
 *             with no GPU).  Used by the tests.
 */
#ifndef PC_DEVICE_H
#define PC_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/pc_common.h"     /* PC_HOST, PC_DEVICE: a slot's memory */

enum { PC_DEV_NONE = 0, PC_DEV_EMULATE = 1, PC_DEV_CUDA = 2 };

typedef struct pc_emu_task pc_emu_task;

typedef struct pc_devq {
    int backend;
    void *ctx;                     /* CUcontext (cuda) */
    void *stream;                  /* CUstream (cuda) */
    void *kernels[16][10];         /* CUfunction by [dtype][redop] (cuda) */
    /* emulate: tasks queued and not yet run */
    pc_emu_task *head, *tail;
    uint64_t queued, ran;          /* tasks queued / run so far */
    uint64_t rng;
    /* statistics: bytes moved by kind of copy, kernels launched */
    uint64_t h2d, d2h, d2d, h2h, reductions;
    char err[160];
} pc_devq;

/* Everything returns 0 on success, else -1 with q->err set. */
int pc_devq_init(pc_devq *q, int backend, void *ctx, void *stream,
                 const int64_t *kernels, int nkernels);
void pc_devq_fini(pc_devq *q);
int pc_dev_copy(pc_devq *q, void *dst, int dspace, const void *src, int sspace,
                size_t n);
int pc_dev_reduce(pc_devq *q, void *dst, const void *src, int64_t count,
                  int dtype, int redop);
/* An event after everything queued so far; *ev is never 0 on success. */
int pc_dev_record(pc_devq *q, uintptr_t *ev);
/* 1 when the event has completed (and is released), 0 when not yet, -1 on
 * error. */
int pc_dev_query(pc_devq *q, uintptr_t ev);
/* Block until the event completed; releases it. */
int pc_dev_sync(pc_devq *q, uintptr_t ev);

/* Process-level queries (cuda backend): the calling thread's current
 * context, and whether the MPI library says it is CUDA-aware (1 yes, 0 no,
 * -1 it does not say). */
int pc_cuda_current_context(void **ctx, char *err, size_t errlen);
int pc_mpi_cuda_aware(void);

#endif
