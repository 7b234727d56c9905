/*
 * pc_sched.h -- the partialcoll schedule executor.
 *
 * A schedule is a directed acyclic graph of operations executed in ROUNDS.
 * The executor knows nothing about collectives: builders (in Python) append
 * operations, name buffers by slot, and hand the finished graph to this core.
 *
 * Operation kinds
 *   NOP      completes as soon as it is started (used to join dependencies).
 *   TRIGGER  a NOP that only the application fires (pc_sched_fire); it never
 *            has dependencies.  This is the "internal activation".
 *   SEND     transport isend of `count` elements of `dtype` from buffer a.
 *   RECV     transport irecv into buffer a.
 *   REDUCE   a[i] = a[i] <redop> b[i], elementwise, on the executing thread.
 *   COPY     a[i] = b[i].
 *   CALLBACK reserved (a Python callable); rejected today.
 *   FENCE    completes once all device work queued before it has run
 *            (at once in a schedule without device buffers).
 *
 * Device memory (pc_device.h): a slot bound to device memory makes REDUCE
 * and COPY ops on it device ops, queued on the schedule's device queue and
 * in flight until they have really run.  SEND/RECV hand the device pointer
 * to MPI (a CUDA-aware MPI); builders for other MPIs stage through host
 * slots with COPY ops instead.
 *
 * Start order: ops that become ready together (at arming, or on one
 * completion) start in index order, and device ops complete in queue order
 * with their successors started before the next completion is seen.  So
 * builders may split a message into pieces with the same peer and tag:
 * receives and sends are posted piece by piece in the same order on both
 * sides, and MPI's non-overtaking rule matches them.
 *
 * Dependencies
 *   Each op lists its predecessors and a mode: ALL (fires when every
 *   predecessor has completed in the current round), ANY (fires when the
 *   first predecessor completes) or ATLEAST k (fires when k of them have).  Ops with no predecessors start when the
 *   round is armed (triggers excepted).  Ops are CONSUMABLE: an op executes at
 *   most once per round, so a predecessor completion is consumed by exactly one
 *   execution of each successor.  Surplus inputs to an ANY op (a second
 *   predecessor completing in the same round) are discarded by round number:
 *   they belong to a round whose execution of that op has already happened.
 *
 * Rounds
 *   A round completes when every REQUIRED op has completed and no request it
 *   started is still in flight.  Ops flagged OPTIONAL may stay unexecuted in a
 *   round (e.g. activation sends/receives of a solo collective).  Rounds are
 *   numbered from 0 and never overlap: round r+1 is armed only after round r
 *   completed.  A persistent schedule re-arms itself immediately after each
 *   round; a non-persistent one runs one round per pc_sched_post().
 *
 * Round-stamped messages (flag STAMPED, SEND/RECV with count == 0)
 *   The message carries the sender's round number.  A stamped RECV is posted
 *   for the whole life of the schedule, independent of rounds, and re-posted
 *   after each message.  A message stamped with round s is
 *     s <  current round: stale (its round is over here) -> discarded, counted;
 *     s == current round: completes the op for this round (or is a surplus if
 *                         the op already ran this round -> discarded, counted);
 *     s >  current round: banked, delivered when round s is armed.
 *   This is what keeps a late activation message of round r from being taken
 *   for round r+1, without the wrapping tag-version scheme of the prior art.
 *   The message also carries the schedule's stamp id (agreed by the builder
 *   across ranks): a message left over from another schedule whose
 *   communicator had the same context id is dropped (counted as foreign).
 *
 * Triggers
 *   pc_sched_fire(op, -1) banks one fire: each banked fire is consumed by
 *   exactly one round's execution of the trigger (never lost).
 *   pc_sched_fire(op, r) is round-stamped: it fires the trigger in round r
 *   only, and is discarded if round r has already executed the trigger or is
 *   over.
 *
 * Locked ops (flag LOCKED; NOP, REDUCE and COPY)
 *   run while holding the schedule's data lock, and a chain of LOCKED ops
 *   that become ready one after another runs inside one hold.  The
 *   application takes the same lock (pc_sched_lock) to deposit into or read
 *   from buffers that the schedule snapshots or fills while it runs.
 *
 * Buffers are named by slot; the application binds memory to slots between
 * rounds (pc_sched_bind), so one schedule can serve every call of a
 * collective.  Offsets are in bytes.
 *
 * Ownership: the schedule copies the op descriptors.  Bound buffers are owned
 * by the caller (the Python layer keeps the exporting objects alive).
 */
#ifndef PC_SCHED_H
#define PC_SCHED_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_device.h"

/* ---- error codes (mapped to Python exceptions by partialcoll/_errors.py) */
enum {
    PC_OK = 0,
    PC_EINVAL = 1,     /* misuse: bad graph, bad buffer, bad argument */
    PC_EBUSY = 2,      /* operation not allowed while a round is running */
    PC_EMPI = 3,       /* the transport (MPI) reported an error */
    PC_ETIMEOUT = 4,   /* wait() ran out of time */
    PC_ENOMEM = 5,
    PC_EFREED = 6,     /* schedule used after free */
    PC_ETHREAD = 7,    /* MPI not initialised with MPI_THREAD_MULTIPLE */
    PC_EDEVICE = 8,    /* the device (CUDA) reported an error */
    PC_NCODES = 9,
};

enum { PC_NOP = 0, PC_TRIGGER = 1, PC_SEND = 2, PC_RECV = 3,
       PC_REDUCE = 4, PC_COPY = 5, PC_CALLBACK = 6, PC_FENCE = 7,
       PC_NKINDS = 8 };
enum { PC_ALL = 0, PC_ANY = 1, PC_ATLEAST = 2 };
enum { PC_F_OPTIONAL = 1, PC_F_STAMPED = 2, PC_F_LOCKED = 4 };

/* Layout of one op descriptor as handed over by the builder: an array of
 * PC_DESC_LEN int64 values per op, followed by a flat array of dependencies. */
enum { PC_D_KIND, PC_D_MODE, PC_D_FLAGS, PC_D_ASLOT, PC_D_AOFF, PC_D_BSLOT,
       PC_D_BOFF, PC_D_COUNT, PC_D_DTYPE, PC_D_REDOP, PC_D_PEER, PC_D_TAG,
       PC_D_PRIO, PC_D_NDEPS, PC_D_DEPOFF, PC_D_NEED, PC_DESC_LEN };

/* ---- datatypes and reduction operators (pc_types.c) */
enum { PC_INT8, PC_INT16, PC_INT32, PC_INT64, PC_UINT8, PC_UINT16, PC_UINT32,
       PC_UINT64, PC_FLOAT32, PC_FLOAT64, PC_LONGDOUBLE, PC_COMPLEX64,
       PC_COMPLEX128, PC_CLONGDOUBLE, PC_BOOL, PC_NDTYPES };
enum { PC_SUM, PC_PROD, PC_MIN, PC_MAX, PC_LAND, PC_LOR, PC_LXOR, PC_BAND,
       PC_BOR, PC_BXOR, PC_NREDOPS };

typedef struct {
    const char *name;   /* numpy dtype name */
    int size;           /* bytes per element */
    int kind;           /* 'i', 'u', 'f', 'c', 'b' */
} pc_dtype_info;

extern const pc_dtype_info pc_dtypes[PC_NDTYPES];
extern const char *const pc_redop_names[PC_NREDOPS];
MPI_Datatype pc_mpi_dtype(int dtype, int redop);
MPI_Op pc_mpi_op(int redop);
int pc_redop_valid(int redop, int dtype);

/* ---- transport: the narrow interface the executor talks to (pc_transport.c)
 * A transport that emulates slow or lossy links slots in here. */
typedef struct {
    int (*isend)(const void *buf, int count, MPI_Datatype dt, int peer,
                 int tag, MPI_Comm comm, MPI_Request *req);
    int (*irecv)(void *buf, int count, MPI_Datatype dt, int peer, int tag,
                 MPI_Comm comm, MPI_Request *req);
    int (*testsome)(int n, MPI_Request *reqs, int *outcount, int *idx);
    int (*cancel)(MPI_Request *req);   /* cancel and release, never blocks long */
} pc_transport;

extern const pc_transport pc_transport_mpi;

/* ---- schedule */
typedef struct {
    void *ptr;
    int64_t len;       /* bytes */
    int writable;
    int bound;
    int space;         /* PC_HOST or PC_DEVICE */
} pc_slot;

typedef struct pc_op {
    int kind, mode, flags;
    int aslot, bslot;
    int64_t aoff, boff, count;
    int dtype, redop, peer, tag, prio;
    int ndeps, nsucc, need;  /* need: inputs that fire it (ALL: ndeps) */
    int *succ;              /* successor indices (points into sched->succ) */
    /* runtime state, touched only by whoever holds the progress lock */
    int ndone;              /* predecessors completed this round */
    int state;              /* OP_IDLE / OP_ACTIVE / OP_DONE (this round) */
    uint64_t stamp[2];      /* stamped ops: payload {stamp id, round} */
    uint64_t *bank;         /* stamped recv: banked future rounds (sorted) */
    int nbank, capbank;
    /* triggers: fires requested by the application (monotonic) and used */
    _Atomic uint64_t fires;
    uint64_t fires_used;
} pc_op;

typedef struct pc_sched pc_sched;
struct pc_sched {
    int nops, nslots, persistent;
    pc_op *ops;
    int *succ;
    pc_slot *slots;
    MPI_Comm comm;
    const pc_transport *tp;
    int tag_base, max_tag, tag_ub;  /* tags of un-stamped ops are offset */
    uint64_t stamp_id;            /* carried by stamped messages */

    /* shared between the application and the progress side */
    _Atomic uint64_t posted;      /* rounds requested (non-persistent) */
    _Atomic uint64_t done;        /* rounds completed (monotonic)       */
    _Atomic int error;            /* first error, PC_OK if none; set  */
    _Atomic int error_claimed;    /* after errmsg is written           */
    _Atomic uint64_t stale, surplus; /* discarded stamped inputs (stats) */
    _Atomic uint64_t foreign;     /* stamped messages of another schedule */
    char errmsg[256];
    pthread_mutex_t fire_mtx;     /* protects the stamped-fire list */
    pthread_mutex_t data_mtx;     /* held by LOCKED ops and the application */
    uint64_t *sfire_round; int *sfire_op; int capsfire;
    _Atomic int nsfire;
    int active;                   /* on the engine's active list (engine mtx) */
    int freed;

    /* progress-side state */
    int armed;                    /* a round is armed */
    int touched;                  /* an op of the armed round completed */
    uint64_t round;               /* number of the armed round */
    int required_left;            /* required ops not yet done this round */
    int inflight;                 /* round-bound requests in flight */
    int nreq, capreq;
    MPI_Request *reqs;
    int *req_op;
    int *ready; int nready;       /* stack of ops ready to start */
    int *triggers; int ntriggers;
    int *indices;                 /* scratch for testsome */
    int has_stamped_recv, stamped_posted;
    /* device ops in flight, in queue order (they complete in that order) */
    pc_devq dq;
    int has_devq;
    int ndev, capdev;
    int *dev_op;
    uintptr_t *dev_ev;
    pc_sched *next;               /* engine active list */
};

/* pc_sched.c */
int pc_sched_create(const int64_t *desc, int nops, const int64_t *deps,
                    int64_t ndeps, int nslots, MPI_Comm comm, int persistent,
                    uint64_t stamp_id, pc_sched **out, char *err,
                    size_t errlen);
int pc_sched_bind(pc_sched *s, int slot, void *ptr, int64_t len, int writable,
                  int space);
int pc_sched_unbind(pc_sched *s, int slot);
int pc_sched_set_device(pc_sched *s, int backend, void *ctx, void *stream,
                        const int64_t *kernels, int nkernels, char *err,
                        size_t errlen);
int pc_sched_set_tag_base(pc_sched *s, int base);
int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen);
int pc_sched_progress(pc_sched *s);            /* progress lock held */
void pc_sched_cancel_all(pc_sched *s);         /* progress lock held */
void pc_sched_destroy(pc_sched *s);
int pc_sched_idle(pc_sched *s);
int pc_sched_busy(pc_sched *s);                /* progress lock held */
int pc_engine_busy(pc_sched *s);

/* pc_engine.c: the progress thread and waiting */
int pc_engine_post(pc_sched *s, int wake);
int pc_engine_fire(pc_sched *s, int op, int64_t round);
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout);
int pc_engine_free(pc_sched *s);
void pc_engine_shutdown(void);
double pc_engine_thread_cputime(void);
void pc_engine_wake(void);
extern _Atomic int pc_engine_thread_running;

#endif
