/* pc_capi.h -- the executor's C API for the package's other extensions.
 *
 * partialcoll._core exports one pc_capi as the capsule PC_CAPI_NAME.  An
 * extension built on the executor (a collective's hot path in C) imports
 * it with PyCapsule_Import and reaches a schedule through the _core.Sched
 * object that partialcoll.Schedule.c_object() returns, never through the
 * executor's own headers: what a collective may do to a schedule is what
 * the Python Schedule API lets it do, each call here being one of those.
 *
 * Every function is called with the GIL held.  The Sched object must stay
 * alive across the call (the caller holds a reference). */
#ifndef PC_CAPI_H
#define PC_CAPI_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define PC_CAPI_NAME "partialcoll._core._C_API"
#define PC_CAPI_VERSION 4

/* what a callback returns when it did nothing this round: its op ends
 * SKIPPED (pc_sched.h's PC_CALLBACK_DECLINE) */
#define PC_CAPI_DECLINE 1

typedef struct {
    int version;                 /* PC_CAPI_VERSION */
    /* 0 if obj is a committed, open _core.Sched; else -1, exception set */
    int (*check)(PyObject *obj);
    /* take / give back the schedule's data lock (Schedule.data_lock());
     * lock waits with the GIL released; 0, or -1 with an exception
     * (freed, or the lock already held by this thread) */
    int (*lock)(PyObject *obj);
    void (*unlock)(PyObject *obj);
    /* dst[i] = dst[i] op src[i] for count elements of a dtype code of the
     * C core (partialcoll.core.ops.dtype_code) under reduction op code
     * redop (Op.code); 0, or -1 with an exception */
    int (*reduce)(const void *src, void *dst, int64_t count, int dtype,
                  int redop);
    /* Schedule.fire(op, round, wake); 0, or -1 with an exception */
    int (*fire)(PyObject *obj, int op, int64_t round, int wake);
    /* wait until `upto` rounds completed, driving progress on this thread
     * with the GIL released (Schedule.wait(upto - 1, timeout); timeout < 0:
     * none); 0, or -1 with the exception the Python call raises */
    int (*wait)(PyObject *obj, uint64_t upto, double timeout);
    /* dst[0 .. count) = the one element of esize bytes at src (a fill op:
     * Schedule.fill) */
    void (*fill)(void *dst, const void *src, int64_t count, int esize);
    /* register the function of Schedule.callback(name, ...) ops (see
     * pc_sched.h, PC_CALLBACK: it runs without the GIL and must not block,
     * call MPI or touch Python; it returns 0, PC_CAPI_DECLINE, or another
     * value with a message in its err); its id, or -1 with an exception */
    int (*register_callback)(const char *name,
                             int (*fn)(void *a, int64_t abytes, void *b,
                                       int64_t bbytes, int64_t arg,
                                       char *err, size_t errlen));
} pc_capi;

#endif
