/* device.c -- the device queue of a schedule: CUDA (through dlopen) or the
 * host emulation the tests use.  See device.h. */
#include "sched/device.h"
#include "sched/types.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(PC_NDTYPES <= 16 && PC_NREDOPS <= 10,
               "pc_devq.kernels is too small for the dtype/op tables");

#define QFAIL(q, ...)                                           \
    do {                                                        \
        snprintf((q)->err, sizeof((q)->err), __VA_ARGS__);      \
        return -1;                                              \
    } while (0)

static void count_copy(pc_devq *q, int dspace, int sspace, size_t n)
{
    if (dspace == PC_DEVICE && sspace == PC_DEVICE)
        q->d2d += n;
    else if (dspace == PC_DEVICE)
        q->h2d += n;
    else if (sspace == PC_DEVICE)
        q->d2h += n;
    else
        q->h2h += n;
}

/* ------------------------------------------------------------ emulation */
struct pc_emu_task {
    int reduce;
    void *dst;
    const void *src;
    int64_t count;      /* bytes for a copy, elements for a reduction */
    int dtype, redop;
    pc_emu_task *next;
};

static int emu_run_one(pc_devq *q)
{
    pc_emu_task *t = q->head;
    if (!t)
        return 0;
    q->head = t->next;
    if (!q->head)
        q->tail = NULL;
    if (t->reduce)
        pc_reduce_local(t->src, t->dst, t->count, t->dtype, t->redop);
    else
        memmove(t->dst, t->src, (size_t)t->count);
    free(t);
    q->ran++;
    return 1;
}

static int emu_push(pc_devq *q, pc_emu_task *t)
{
    pc_emu_task *c = malloc(sizeof(*c));
    if (!c)
        QFAIL(q, "out of memory queueing device work");
    *c = *t;
    c->next = NULL;
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    q->queued++;
    return 0;
}

/* xorshift: whether this poll lets the emulated device run a task */
static int emu_coin(pc_devq *q)
{
    q->rng ^= q->rng << 13;
    q->rng ^= q->rng >> 7;
    q->rng ^= q->rng << 17;
    return (int)(q->rng & 1);
}

/* ------------------------------------------------------------------ cuda */
typedef int CUresult;
typedef uintptr_t CUdeviceptr;
enum { CUDA_SUCCESS_ = 0, CUDA_ERROR_NOT_READY_ = 600,
       CU_EVENT_DISABLE_TIMING_ = 2 };

static struct {
    pthread_once_t once;
    void *lib;
    char err[160];
    CUresult (*Init)(unsigned);
    CUresult (*CtxGetCurrent)(void **);
    CUresult (*CtxSetCurrent)(void *);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, void *);
    CUresult (*EventCreate)(void **, unsigned);
    CUresult (*EventRecord)(void *, void *);
    CUresult (*EventQuery)(void *);
    CUresult (*EventSynchronize)(void *);
    CUresult (*EventDestroy)(void *);
    CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, void *, void **,
                             void **);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu = {PTHREAD_ONCE_INIT};

static void cu_load(void)
{
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) {
        snprintf(cu.err, sizeof cu.err, "cannot load libcuda.so.1: %s",
                 dlerror());
        return;
    }
#define SYM(field, name)                                                   \
    if (!(*(void **)&cu.field = dlsym(cu.lib, name))) {                    \
        snprintf(cu.err, sizeof cu.err, "libcuda.so.1 lacks %s", name);   \
        cu.lib = NULL;                                                     \
        return;                                                            \
    }
    SYM(Init, "cuInit");
    SYM(CtxGetCurrent, "cuCtxGetCurrent");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(MemcpyAsync, "cuMemcpyAsync");
    SYM(EventCreate, "cuEventCreate");
    SYM(EventRecord, "cuEventRecord");
    SYM(EventQuery, "cuEventQuery");
    SYM(EventSynchronize, "cuEventSynchronize");
    SYM(EventDestroy, "cuEventDestroy_v2");
    SYM(LaunchKernel, "cuLaunchKernel");
    SYM(GetErrorString, "cuGetErrorString");
#undef SYM
    if (cu.Init(0) != CUDA_SUCCESS_) {
        snprintf(cu.err, sizeof cu.err, "cuInit failed (no usable GPU?)");
        cu.lib = NULL;
    }
}

static int cu_ready(char *err, size_t errlen)
{
    pthread_once(&cu.once, cu_load);
    if (!cu.lib) {
        snprintf(err, errlen, "%s", cu.err);
        return -1;
    }
    return 0;
}

static int cu_check(pc_devq *q, CUresult r, const char *what)
{
    const char *msg = NULL;
    if (r == CUDA_SUCCESS_)
        return 0;
    cu.GetErrorString(r, &msg);
    QFAIL(q, "%s: CUDA error %d (%s)", what, r, msg ? msg : "?");
}

int pc_cuda_current_context(void **ctx, char *err, size_t errlen)
{
    if (cu_ready(err, errlen) < 0)
        return -1;
    if (cu.CtxGetCurrent(ctx) != CUDA_SUCCESS_ || !*ctx) {
        snprintf(err, errlen, "no current CUDA context on this thread");
        return -1;
    }
    return 0;
}

int pc_mpi_cuda_aware(void)
{
    int (*query)(void) = (int (*)(void))dlsym(RTLD_DEFAULT,
                                              "MPIX_Query_cuda_support");
    return query ? (query() != 0) : -1;
}

/* ------------------------------------------------------------ interface */
int pc_devq_init(pc_devq *q, int backend, void *ctx, void *stream,
                 const int64_t *kernels, int nkernels)
{
    pc_devq_fini(q);
    memset(q, 0, sizeof(*q));
    q->backend = backend;
    q->rng = 0x9E3779B97F4A7C15ull ^ (uintptr_t)q;
    if (backend == PC_DEV_EMULATE)
        return 0;
    if (backend != PC_DEV_CUDA)
        QFAIL(q, "unknown device backend %d", backend);
    if (cu_ready(q->err, sizeof q->err) < 0)
        return -1;
    q->ctx = ctx;
    q->stream = stream;
    for (int k = 0; k < nkernels && k < PC_NDTYPES * PC_NREDOPS; k++)
        q->kernels[k / PC_NREDOPS][k % PC_NREDOPS] =
            (void *)(uintptr_t)kernels[k];
    return 0;
}

void pc_devq_fini(pc_devq *q)
{
    while (q->head) {               /* unrun emulated work is dropped */
        pc_emu_task *t = q->head;
        q->head = t->next;
        free(t);
    }
    q->tail = NULL;
}

int pc_dev_copy(pc_devq *q, void *dst, int dspace, const void *src, int sspace,
                size_t n)
{
    count_copy(q, dspace, sspace, n);
    if (q->backend == PC_DEV_EMULATE) {
        pc_emu_task t = {0, dst, src, (int64_t)n, 0, 0, NULL};
        return emu_push(q, &t);
    }
    if (cu_check(q, cu.CtxSetCurrent(q->ctx), "cuCtxSetCurrent"))
        return -1;
    return cu_check(q, cu.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n,
                                      q->stream), "cuMemcpyAsync");
}

int pc_dev_reduce(pc_devq *q, void *dst, const void *src, int64_t count,
                  int dtype, int redop)
{
    q->reductions++;
    if (q->backend == PC_DEV_EMULATE) {
        pc_emu_task t = {1, dst, src, count, dtype, redop, NULL};
        return emu_push(q, &t);
    }
    void *f = q->kernels[dtype][redop];
    if (!f)
        QFAIL(q, "no device kernel for %s on %s", pc_redop_names[redop],
              pc_dtypes[dtype].name);
    if (cu_check(q, cu.CtxSetCurrent(q->ctx), "cuCtxSetCurrent"))
        return -1;
    CUdeviceptr a = (CUdeviceptr)dst, b = (CUdeviceptr)src;
    long long n = count;
    void *args[] = {&a, &b, &n};
    unsigned threads = 256;
    long long blocks = (n + threads - 1) / threads;
    if (blocks > 4096)            /* the kernels loop with a grid stride */
        blocks = 4096;
    if (blocks < 1)
        blocks = 1;
    return cu_check(q, cu.LaunchKernel(f, (unsigned)blocks, 1, 1, threads, 1,
                                       1, 0, q->stream, args, NULL),
                    "cuLaunchKernel (reduction)");
}

int pc_dev_record(pc_devq *q, uintptr_t *ev)
{
    if (q->backend == PC_DEV_EMULATE) {
        *ev = (uintptr_t)q->queued + 1;   /* done once `queued` tasks ran */
        return 0;
    }
    void *e = NULL;
    if (cu_check(q, cu.CtxSetCurrent(q->ctx), "cuCtxSetCurrent") ||
        cu_check(q, cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING_),
                 "cuEventCreate"))
        return -1;
    if (cu_check(q, cu.EventRecord(e, q->stream), "cuEventRecord")) {
        cu.EventDestroy(e);
        return -1;
    }
    *ev = (uintptr_t)e;
    return 0;
}

int pc_dev_query(pc_devq *q, uintptr_t ev)
{
    if (q->backend == PC_DEV_EMULATE) {
        if (q->ran + 1 < ev && emu_coin(q))
            emu_run_one(q);
        return q->ran + 1 >= ev;
    }
    if (cu_check(q, cu.CtxSetCurrent(q->ctx), "cuCtxSetCurrent"))
        return -1;
    CUresult r = cu.EventQuery((void *)ev);
    if (r == CUDA_ERROR_NOT_READY_)
        return 0;
    if (cu_check(q, r, "cuEventQuery"))
        return -1;
    cu.EventDestroy((void *)ev);
    return 1;
}

int pc_dev_sync(pc_devq *q, uintptr_t ev)
{
    if (q->backend == PC_DEV_EMULATE) {
        while (q->ran + 1 < ev && emu_run_one(q))
            ;
        return 0;
    }
    if (cu_check(q, cu.CtxSetCurrent(q->ctx), "cuCtxSetCurrent"))
        return -1;
    CUresult r = cu.EventSynchronize((void *)ev);
    cu.EventDestroy((void *)ev);
    return cu_check(q, r, "cuEventSynchronize");
}
