/*
 * pc_sched.h -- the partialcoll schedule executor.
 *
 * A schedule is a directed acyclic graph of operations executed in ROUNDS.
 * The executor knows nothing about collectives: builders (in Python) append
 * operations, name buffers by slot, and hand the finished graph to this core.
 *
 * Operation kinds
 *   NOP       completes as soon as it is started (joins dependencies).
 *   TRIGGER   a NOP that only the application fires (pc_engine_fire); it
 *             never has dependencies.  The "internal activation".
 *   SEND      sends `count` elements of `dtype` from buffer a to `peer`.
 *   RECV      receives into buffer a from `peer`.
 *   REDUCE    a[i] = a[i] <redop> b[i], elementwise, on the executing thread.
 *   COPY      a[i] = b[i].
 *   SCALE     a[i] = a[i] / (delivered inputs of op `ref` this round + add):
 *             averaging over the messages that arrived (float types).
 *   FENCE     completes once all device work queued before it has run (at
 *             once in a schedule without device buffers).
 *   DELAY     completes `value` seconds after it becomes ready (a constant, or
 *             a float64 read from a slot element when it becomes ready).
 *   START_AT  completes at the absolute time `value` (pc_now() seconds, the
 *             same clock on every process of a host; constant or from a slot).
 *             Timed ops cost no CPU: the progress thread sleeps until the
 *             earliest deadline.  They stand in for compute and planned starts.
 *   GATE      becomes ready by its dependencies, completes only when the
 *             application opens it (pc_engine_open_gate); the application
 *             learns of ready gates without polling (pc_engine_wait_gate).
 *   CALLBACK  reserved (a Python callable); rejected today.
 *
 * Outcomes
 *   Every op of a round ends with an outcome.  A RECV ends DELIVERED (OK),
 *   DROPPED (the emulated network said the message was lost) or TIMEDOUT
 *   (its optional deadline, `timeout` after it became ready, passed).  Other
 *   ops end OK, or SKIPPED when they did not perform their action:
 *     - a REDUCE, COPY or SCALE whose direct RECV predecessors were not all
 *       delivered does nothing ("skips inputs that were not delivered");
 *     - an op flagged DELIVERED counts only OK inputs towards `need`; when
 *       too many inputs failed for `need` to be reached it ends SKIPPED
 *       without running.  Other ops accept any outcome of their inputs.
 *   The outcomes and delivered-input counts of the last completed round are
 *   readable (pc_sched_last_outcomes), with each op's completion time and,
 *   for a RECV that took a message (delivered or dropped), its arrival
 *   time: the transport's stamp (the emulated network's model), else the
 *   completion time; on the emulated network also when the message's first
 *   byte went on the sender's wire (0 elsewhere).  A timed-out receive is cancelled (a
 *   local operation) and replaced by a discard receive, so its late message
 *   is consumed in order and never taken by the next round's receive.
 *
 * Dependencies
 *   Each op lists its predecessors and a mode: ALL (fires when every
 *   predecessor completed in the current round), ANY (the first one) or
 *   ATLEAST k.  Ops with no predecessors start when the round is armed
 *   (triggers and stamped receives excepted).  Ops are CONSUMABLE: an op
 *   executes at most once per round; a surplus input (an ANY op's second
 *   input in the same round) is discarded and counted.
 *
 * Start order
 *   Ready ops start lowest `prio` first, ties in index order.  An op's
 *   `prio` may be read from a slot (one int64, `prslot`) each time the op
 *   becomes ready, so one schedule can start the same ops in a different
 *   order every round (RPS draws a fresh send order per call).  Ops that
 *   become ready together start in that order, and device ops complete in
 *   queue order, so builders may split a message into pieces with the same
 *   peer and tag: both sides post them in order and MPI's non-overtaking rule
 *   matches them.  Sends then pass two gates of the engine (pc_engine.c):
 *   `order` k (>= 0) holds a send until the schedule has released k earlier
 *   ordered sends to that peer in this round (TicTac's enforcement), and the
 *   per-destination cap on sends in flight releases queued sends lowest
 *   `prio` first (default cap: unlimited, no queueing).
 *
 * Rounds
 *   A round completes when every REQUIRED op has completed and nothing it
 *   started is still in flight.  Ops flagged OPTIONAL may stay unexecuted.
 *   Rounds are numbered from 0 and never overlap.  A persistent schedule
 *   re-arms itself after each round; a non-persistent one runs one round per
 *   pc_engine_post().
 *
 * Round-stamped messages (flag STAMPED, SEND/RECV with count == 0)
 *   carry {schedule stamp id, round, tag}.  They travel on the engine's
 *   control channel (one receive per communicator, pc_engine.c), not one
 *   posted receive per op, so idle schedules cost nothing.  A message stamped
 *   with round s is: stale (s < current round) -> discarded, counted; for the
 *   current round -> completes the op (or is a surplus); for a later round ->
 *   banked until that round is armed.  A message with another stamp id
 *   (another schedule on a communicator with the same context) is foreign.
 *
 * Triggers
 *   pc_engine_fire(op, -1) banks one fire (consumed by exactly one round);
 *   pc_engine_fire(op, r) fires round r only, discarded if r is over.
 *
 * Locked ops (flag LOCKED; NOP, REDUCE, COPY, SCALE) run while holding the
 *   schedule's data lock; a chain of them that become ready one after another
 *   runs inside one hold.  The progress side only ever TRIES the lock: while
 *   the application holds it, that schedule's locked ops wait and every other
 *   schedule goes on.
 *
 * Lifetime
 *   A schedule is reference counted (pc_sched_ref/unref): the Python object
 *   holds one reference, every thread blocked in a wait or lock another.
 *   pc_engine_free() marks it closing (waiters return PC_EFREED), cancels its
 *   receives and keeps its sends going: they complete (the engine keeps
 *   polling them) and only then may the buffers go (pc_sched_sends_left()).
 *
 * Buffers are named by slot; the application binds memory to slots between
 * rounds (pc_sched_bind), so one schedule can serve every call of a
 * collective.  Offsets are in bytes.  The schedule copies the op
 * descriptors; bound buffers are owned by the caller.
 */
#ifndef PC_SCHED_H
#define PC_SCHED_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_device.h"
#include "pc_transport.h"

/* ---- error codes (mapped to Python exceptions by partialcoll/core/errors.py) */
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
    PC_NCODES = 9,
};

enum { PC_NOP = 0, PC_TRIGGER = 1, PC_SEND = 2, PC_RECV = 3,
       PC_REDUCE = 4, PC_COPY = 5, PC_CALLBACK = 6, PC_FENCE = 7,
       PC_DELAY = 8, PC_START_AT = 9, PC_GATE = 10, PC_SCALE = 11,
       PC_NKINDS = 12 };
enum { PC_ALL = 0, PC_ANY = 1, PC_ATLEAST = 2 };
enum { PC_F_OPTIONAL = 1, PC_F_STAMPED = 2, PC_F_LOCKED = 4,
       PC_F_DELIVERED = 8 };
/* outcome of an op in a round */
enum { PC_OC_NONE = 0, PC_OC_OK = 1, PC_OC_DROPPED = 2, PC_OC_TIMEDOUT = 3,
       PC_OC_SKIPPED = 4 };

/* Layout of one op descriptor as handed over by the builder: an array of
 * PC_DESC_LEN int64 values per op, followed by a flat array of dependencies.
 * Times are in nanoseconds; a negative TIMEOUT/ORDER means none. */
enum { PC_D_KIND, PC_D_MODE, PC_D_FLAGS, PC_D_ASLOT, PC_D_AOFF, PC_D_BSLOT,
       PC_D_BOFF, PC_D_COUNT, PC_D_DTYPE, PC_D_REDOP, PC_D_PEER, PC_D_TAG,
       PC_D_PRIO, PC_D_NDEPS, PC_D_DEPOFF, PC_D_NEED, PC_D_TIMEOUT,
       PC_D_TCLASS, PC_D_ORDER, PC_D_VALUE, PC_D_PSLOT, PC_D_POFF, PC_D_REF,
       PC_D_ADD, PC_D_PRSLOT, PC_D_PROFF, PC_DESC_LEN };

/* ---- datatypes and reduction operators (pc_types.c) */
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
extern const char *const pc_kind_names[PC_NKINDS];
MPI_Datatype pc_mpi_dtype(int dtype, int redop);
MPI_Op pc_mpi_op(int redop);
int pc_redop_valid(int redop, int dtype);
/* dst[i] = dst[i] op src[i]: MPI_Reduce_local for the types MPI has, our
 * own loop for float16 (widened to float, combined, rounded to nearest
 * even).  Returns an MPI error code. */
int pc_reduce_local(const void *src, void *dst, int64_t count, int dtype,
                    int redop);
int pc_scale(void *buf, int64_t count, int dtype, double divisor);
/* Allocation points on the progress path ask pc_alloc_ok() first, so a test
 * can make the n-th one fail (pc_inject_alloc_failure(n); -1: never). */
int pc_alloc_ok(void);
void pc_inject_alloc_failure(int n);
void *pc_realloc(void *p, size_t n);      /* realloc, or NULL when injected */

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
    int dtype, redop, peer, wpeer, tag, prio, tclass;
    int ndeps, nsucc, need;   /* need: inputs that fire it (ALL: ndeps) */
    int *succ, *pred;         /* into sched->succ / sched->pred */
    int64_t timeout_ns;       /* RECV deadline after ready; -1 none */
    int64_t value_ns;         /* DELAY length / START_AT time */
    int64_t order;            /* counter-gate position; -1 none */
    int pslot;                /* parameter slot (-1: use the constants) */
    int64_t poff;
    int prslot;               /* slot `prio` is read from when ready (-1:
                                 the constant) */
    int64_t proff;
    int ref, add;             /* SCALE */
    /* runtime state, touched only under the progress lock */
    int ndone, nok, nfail;    /* inputs completed this round: any, OK, failed */
    int state;                /* OP_IDLE / OP_ACTIVE / OP_DONE (this round) */
    int outcome;              /* PC_OC_* of this round */
    int skip;                 /* readied only to end SKIPPED */
    int64_t cur_order;        /* this round's order (counter gate) */
    int64_t req;              /* transport handle in flight, -1 none */
    uint32_t tgen;            /* timer generation (stale timers are ignored) */
    double t_ready, t_done;   /* pc_now() when started / completed */
    double t_arrive;          /* RECV: the transport's arrival time, 0 none */
    double t_wire;            /* RECV: its first byte on the wire, 0 none */
    uint64_t stamp[4];        /* stamped payload {stamp id, round, tag, 0} */
    uint64_t *bank;           /* stamped recv: banked future rounds */
    int nbank, capbank;
    _Atomic uint64_t fires;   /* triggers: fires requested (monotonic) */
    uint64_t fires_used;
} pc_op;

typedef struct pc_sched pc_sched;
struct pc_sched {
    int nops, nslots, persistent;
    pc_op *ops;
    int *succ, *pred;
    pc_slot *slots;
    MPI_Comm comm;
    int comm_size;
    int tag_base, max_tag, tag_ub;  /* tags of un-stamped ops are offset */
    uint64_t stamp_id;              /* carried by stamped messages */
    int reliable;                   /* a lost message fails the round */
    unsigned classes;               /* bit c: a receive of traffic class c */
    uint64_t serial;                /* process-local id (timeline) */

    /* shared between the application and the progress side */
    _Atomic int refs;
    _Atomic int closing;            /* freed: waiters give up */
    _Atomic uint64_t posted;        /* rounds requested (non-persistent) */
    _Atomic uint64_t done;          /* rounds completed (monotonic)       */
    _Atomic int error;              /* first error, PC_OK if none; set  */
    _Atomic int error_claimed;      /* after errmsg is written           */
    _Atomic uint64_t stale, surplus, dropped, timedout, late, swallowed;
    _Atomic int sends_left;         /* sends handed on, not yet completed */
    char errmsg[512];
    pthread_mutex_t fire_mtx;       /* protects the stamped-fire list */
    pthread_mutex_t data_mtx;       /* LOCKED ops and the application */
    _Atomic int lock_held;          /* the application holds data_mtx */
    pthread_t lock_owner;
    uint64_t *sfire_round; int *sfire_op; int capsfire;
    _Atomic int nsfire;
    /* ready gates the application has not taken yet (fire_mtx) */
    int *gate_op; uint64_t *gate_round; int ngate, capgate;
    _Atomic int gates_ready;

    /* engine bookkeeping (progress lock; `inbox` under the engine mutex) */
    int on_work, on_inbox, on_poll, registered, cleaned;
    int lock_deferred, again;
    _Atomic int unlock_wakes;   /* ops wait for the data lock: the
                                   application's unlock() notifies */
    pc_sched *work_next, *inbox_next, *poll_next, *ep_next;
    void *endpoint;                 /* control channel of comm */

    /* round state (progress lock) */
    int armed;                      /* a round is armed */
    int touched;                    /* an op of the armed round completed */
    uint64_t round;                 /* number of the armed round */
    int required_left;              /* required ops not yet done */
    int inflight;                   /* round-bound messages / device ops */
    int *heap; int nheap;           /* ready ops, by (prio, index) */
    int *defer; int ndefer;         /* locked ops waiting for the lock */
    int *triggers; int ntriggers;
    int *srecv; int nsrecv;         /* stamped receives, by (peer, tag) */
    int64_t *next_order;            /* counter gate: per peer, this round */
    int *held; int nheld;           /* sends waiting for their order */
    uint8_t *last_outcome;          /* per op, last completed round */
    int *last_nok;
    double *last_t;                 /* completion time (pc_now), 0: none */
    double *last_arrive;            /* RECV: arrival time, 0: none */
    double *last_wire;              /* RECV: first byte on the wire, 0: none */
    uint64_t last_round_ok;         /* rounds whose outcomes are in last_* */
    /* discard receives standing in for timed-out ones */
    int64_t *disc_req, *disc_id; void **disc_buf; int ndisc, capdisc;
    int64_t next_disc;
    /* device ops in flight, in queue order (they complete in that order) */
    pc_devq dq;
    int has_devq;
    int ndev, capdev;
    int *dev_op;
    uintptr_t *dev_ev;
};

/* pc_sched.c: building and the round machinery */
int pc_sched_create(const int64_t *desc, int nops, const int64_t *deps,
                    int64_t ndeps, int nslots, MPI_Comm comm, int persistent,
                    uint64_t stamp_id, pc_sched **out, char *err,
                    size_t errlen);
int pc_sched_bind(pc_sched *s, int slot, void *ptr, int64_t len, int writable,
                  int space);
void pc_sched_unbind(pc_sched *s, int slot);
int pc_sched_set_device(pc_sched *s, int backend, void *ctx, void *stream,
                        const int64_t *kernels, int nkernels, char *err,
                        size_t errlen);
int pc_sched_set_tag_base(pc_sched *s, int base);
int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen);
int pc_sched_idle(pc_sched *s);
void pc_sched_ref(pc_sched *s);
void pc_sched_unref(pc_sched *s);
void pc_sched_destroy(pc_sched *s);
/* the data lock, taken by the application (blocking) */
void pc_sched_lock(pc_sched *s);
void pc_sched_unlock(pc_sched *s);
int pc_sched_lock_mine(pc_sched *s);
int pc_sched_has_locked_ops(pc_sched *s);
/* last completed round: outcome, delivered-input count, completion time
 * and (receives that took a message) arrival time of every op */
int pc_sched_last_outcomes(pc_sched *s, uint8_t *outcome, int *nok,
                           double *t_done, double *t_arrive, double *t_wire,
                           uint64_t *round);

/* called by the engine, progress lock held */
int pc_sched_progress(pc_sched *s);
void pc_sched_on_done(pc_sched *s, int64_t cookie, const pc_done *d);
void pc_sched_on_timer(pc_sched *s, int op, uint64_t round, uint32_t gen);
void pc_sched_deliver(pc_sched *s, int op, uint64_t round);
int pc_sched_find_srecv(pc_sched *s, int peer, int tag);
int pc_sched_busy(pc_sched *s);
int pc_sched_test_device(pc_sched *s);
void pc_sched_stop(pc_sched *s);     /* cancel receives, keep sends going */
void pc_sched_set_error(pc_sched *s, int code, const char *fmt, ...);
int pc_sched_hot(pc_sched *s);       /* something round-bound in flight */

/* cookies of messages that are not an op's */
enum { PC_COOKIE_DISCARD = -2 };

/* pc_engine.c: the progress engine.  Called by the schedule layer, with the
 * progress lock held, to put messages, timers and gates in motion. */
/* tag < 0: a round-stamped control message (the control channel) */
int pc_engine_start_send(pc_sched *s, int op, void *buf, int count,
                         MPI_Datatype dt, int tag);
/* cookie: the op index, or a discard receive's id (standing in for op) */
int pc_engine_start_recv(pc_sched *s, int op, void *buf, int count,
                         MPI_Datatype dt, int tag, int64_t cookie,
                         int64_t *handle);
int pc_engine_cancel_recv(int64_t handle, int hot, pc_done *d);
int pc_engine_add_timer(pc_sched *s, int op, double when);
void pc_engine_gate_ready(pc_sched *s, int op);
void pc_engine_queue(pc_sched *s);   /* visit s in this sweep */
int pc_engine_register_stamped(pc_sched *s);
void pc_engine_unregister_stamped(pc_sched *s);
void pc_engine_unhold(pc_sched *s);  /* drop its gate-queued sends */
void pc_engine_send_released(void);  /* a send completed: reopen gates */

/* ... and by the Python binding */
int pc_engine_post(pc_sched *s, int wake);
int pc_engine_fire(pc_sched *s, int op, int64_t round);
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout);
int pc_engine_wait_gate(pc_sched *s, double timeout, int *op,
                        uint64_t *round);
int pc_engine_open_gate(pc_sched *s, int op, uint64_t round);
int pc_engine_free(pc_sched *s);     /* 1: sends still draining */
int pc_engine_busy(pc_sched *s);
void pc_engine_notify(pc_sched *s);  /* application-side change: visit s */
void pc_engine_shutdown(double drain_timeout);
double pc_engine_thread_cputime(void);
void pc_engine_wake(void);
int pc_engine_set_send_cap(int cap);
int pc_engine_set_network(const char *config, char *err, int errlen);
int pc_engine_sends_left(void);
const char *pc_engine_transport_name(void);
void pc_engine_stats(uint64_t *v, int n);
extern _Atomic int pc_engine_thread_running;

/* pc_timeline.c: events for a trace viewer (off unless enabled).
 *   READY     the op's dependencies are met      START     it started
 *   GATED     a send waits in a gate (order, cap) RELEASED  handed to the wire
 *   WIRE_*    bytes on the emulated wire          DELIVERED/DROPPED/TIMEDOUT
 *   COMPLETE  the op ended (with its outcome)     ROUND     a round armed */
extern _Atomic int pc_tl_on;
enum { PC_EV_READY = 1, PC_EV_START, PC_EV_COMPLETE, PC_EV_GATED,
       PC_EV_RELEASED, PC_EV_WIRE_START, PC_EV_WIRE_END, PC_EV_DELIVERED,
       PC_EV_DROPPED, PC_EV_TIMEDOUT, PC_EV_ROUND, PC_NEVENTS };
void pc_tl_op(int ev, const pc_sched *s, int op, int outcome);
/* t < 0: now */
void pc_tl_msg(int ev, double t, uint64_t sched, int op, uint64_t round,
               int peer, int tag, int64_t bytes, int prio, int outcome);
int pc_tl_enable(int on);
int64_t pc_tl_take(void *buf, int64_t cap);   /* drain recorded events */
int64_t pc_tl_count(void);

#endif
