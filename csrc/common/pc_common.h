/* pc_common.h -- what every part of the C core shares: error codes, memory
 * spaces, traffic classes, the clock, and allocation on the progress path
 * (failure injection and the one grow helper).
 *
 * The parts of csrc/ and who may include whom (tests/layout_rules.py keeps
 * it so):
 *
 *     partial/    a separate extension: the partial
 *                 collectives' blocking call           -> capi
 *     python/     the binding (partialcoll._core)     -> capi, engine, sched,
 *                                                        common
 *     capi/       the executor's C API for the other
 *                 extensions (one header)             -> nothing
 *     engine/     the progress thread: runs schedules -> sched, transport,
 *                                                        common
 *     sched/      the schedule as a data structure     -> common
 *     transport/  the wire: MPI, the emulated network  -> common
 *     common/     this header, the timeline recorder   -> nothing
 *
 * Nothing here knows a schedule, a transport or Python. */
#ifndef PC_COMMON_H
#define PC_COMMON_H

#include <stddef.h>

/* ---- error codes (partialcoll/core/errors.py maps them to exceptions) */
enum {
    PC_OK = 0,
    PC_EINVAL = 1,     /* misuse: bad graph, bad buffer, bad argument */
    PC_EBUSY = 2,      /* operation not allowed while a round is running */
    PC_EMPI = 3,       /* the transport (MPI) reported an error */
    PC_ETIMEOUT = 4,   /* wait() ran out of time */
    PC_ENOMEM = 5,
    PC_EFREED = 6,     /* schedule used after (or freed during) a call */
    PC_ETHREAD = 7,    /* MPI not initialised with MPI_THREAD_MULTIPLE */
    PC_EDEVICE = 8,    /* the device (CUDA) reported an error */
    PC_EFAILED = 9,    /* a rank failed, or another rank revoked the
                          communicator on finding one that had (MPI's
                          fault-tolerance extensions) */
    PC_NCODES = 10,
};

/* memory space of a buffer (sched/device.h explains device memory) */
enum { PC_HOST = 0, PC_DEVICE = 1 };

/* Traffic classes 0 .. PC_NCLASS - 1 label a message for the transport (the
 * emulated network gives each class its drop probability and priority
 * level); -1 is the engine's control channel. */
enum { PC_NCLASS = 16 };

double pc_now(void);                        /* CLOCK_MONOTONIC seconds */

/* Allocation points on the progress path ask pc_alloc_ok() first, so a test
 * can make the n-th one fail (pc_inject_alloc_failure(n); -1: never). */
int pc_alloc_ok(void);
void pc_inject_alloc_failure(int n);
void *pc_realloc(void *p, size_t n);      /* realloc, or NULL when injected */

/* Growing an array of capacity `cap` so that it holds `need` elements: the
 * capacity doubled (from `init` when empty) until it does. */
int pc_grow_cap(int cap, int need, int init);
/* Room for `need` elements of `elem` bytes in arr, of capacity *cap:
 * returns the array (grown through pc_realloc if need > *cap, *cap then
 * updated), or NULL when that allocation fails: arr is then still valid
 * and *cap unchanged. */
void *pc_grow(void *arr, int *cap, int need, size_t elem, int init);

#endif
