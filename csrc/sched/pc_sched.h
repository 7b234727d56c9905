/*
 * pc_sched.h -- the schedule: the data structure the executor runs.
 *
 * A schedule is a directed acyclic graph of operations executed in ROUNDS.
 * The executor knows nothing about collectives: builders (in Python) append
 * operations, name buffers by slot, and hand the finished graph to this core.
 * As in libNBC, the schedule is data and the engine interprets it: this
 * part (sched/) builds and checks a schedule (build.c), binds its buffers,
 * keeps its locks, outcomes and lifetime (sched.c), its dtypes and
 * reductions (types.h) and its device queue (device.h); it knows no engine
 * and no transport.  The engine (engine/) runs its rounds.
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
 *   CALLBACK  calls a native function registered with the executor
 *             (pc_sched_register_callback, by name; never Python: no GIL)
 *             with its two buffers, a (count elements of dtype, from aoff)
 *             and b (bbytes bytes from boff), and an int64 argument.  The
 *             function may write both; it is the schedule's, once per
 *             round, like a REDUCE (LOCKED allowed, host memory only, does
 *             nothing when a direct RECV input was not delivered).  It
 *             may decline (ends SKIPPED, see pc_callback_fn).  A
 *             collective folds many small locked steps into one this way.
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
 *   matches them.  Sends then pass two gates of the engine (engine/wire.c):
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
 * Round-stamped messages (flag STAMPED, SEND/RECV)
 *   carry {schedule stamp id, round, tag, data bytes} and up to
 *   PC_STAMP_DATA_MAX bytes of host data (count > 0: the send's buffer,
 *   written into the receive's on delivery; both ops give the same size).
 *   They travel on the engine's control channel (one receive per peer rank
 *   and communicator, engine/ctrl.c), not one posted receive per op, so
 *   idle schedules cost nothing.  A message stamped with round s is: stale
 *   (s < current round) -> discarded, counted; for the current round ->
 *   completes the op (or is a surplus); for a later round -> banked, with
 *   its data, until that round is armed.  A message with another stamp id
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
 *   polling them) and only then may the buffers go (sends_left is 0).
 *
 * Buffers are named by slot; the application binds memory to slots between
 * rounds (pc_sched_bind), so one schedule can serve every call of a
 * collective.  Offsets are in bytes.  The schedule copies the op
 * descriptors; bound buffers are owned by the caller.
 *
 * Runtime state.  The structs below also carry what the engine keeps per
 * schedule and per op while rounds run (marked so); this part only
 * allocates and frees it, the engine reads and writes it under its
 * progress lock.
 */
#ifndef PC_SCHED_H
#define PC_SCHED_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/pc_common.h"
#include "common/pc_trace.h"
#include "sched/device.h"
#include "sched/types.h"

enum { PC_NOP = 0, PC_TRIGGER = 1, PC_SEND = 2, PC_RECV = 3,
       PC_REDUCE = 4, PC_COPY = 5, PC_CALLBACK = 6, PC_FENCE = 7,
       PC_DELAY = 8, PC_START_AT = 9, PC_GATE = 10, PC_SCALE = 11,
       PC_NKINDS = 12 };
enum { PC_ALL = 0, PC_ANY = 1, PC_ATLEAST = 2 };
/* data bytes a round-stamped message carries at most (a multiple of 8),
 * and the words of such a message: the header {stamp id, round, tag, data
 * bytes}, then the data */
#define PC_STAMP_DATA_MAX 224
#define PC_STAMP_HEADER 32
#define PC_STAMP_WORDS ((PC_STAMP_HEADER + PC_STAMP_DATA_MAX) / 8)

enum { PC_F_OPTIONAL = 1, PC_F_STAMPED = 2, PC_F_LOCKED = 4,
       PC_F_DELIVERED = 8, PC_F_FILL = 16 };
/* an op's outcome in a round: PC_OC_* (common/pc_trace.h) */

/* Layout of one op descriptor as handed over by the builder: an array of
 * PC_DESC_LEN int64 values per op, followed by a flat array of dependencies.
 * Times are in nanoseconds; a negative TIMEOUT/ORDER means none. */
enum { PC_D_KIND, PC_D_MODE, PC_D_FLAGS, PC_D_ASLOT, PC_D_AOFF, PC_D_BSLOT,
       PC_D_BOFF, PC_D_COUNT, PC_D_DTYPE, PC_D_REDOP, PC_D_PEER, PC_D_TAG,
       PC_D_PRIO, PC_D_NDEPS, PC_D_DEPOFF, PC_D_NEED, PC_D_TIMEOUT,
       PC_D_TCLASS, PC_D_ORDER, PC_D_VALUE, PC_D_PSLOT, PC_D_POFF, PC_D_REF,
       PC_D_ADD, PC_D_PRSLOT, PC_D_PROFF, PC_D_BBYTES, PC_D_ARG,
       PC_DESC_LEN };

/* A CALLBACK op's function: a and b its buffers (abytes, bbytes long), arg
 * its argument.  Returns 0 (the op ends OK), PC_CALLBACK_DECLINE (it did
 * nothing this round: the op ends SKIPPED, so a successor flagged
 * DELIVERED does not count it; a callback may gate a path this way on
 * what it reads), or anything else with a message in err (the schedule
 * then fails with it).  Called with the progress lock held (and the data
 * lock for a LOCKED op), on whichever thread drives progress: it must not
 * block, call MPI or touch Python. */
typedef int (*pc_callback_fn)(void *a, int64_t abytes, void *b,
                              int64_t bbytes, int64_t arg, char *err,
                              size_t errlen);
#define PC_CALLBACK_DECLINE 1
#define PC_MAX_CALLBACKS 32

extern const char *const pc_kind_names[PC_NKINDS];

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
    union {
        int64_t value_ns;     /* DELAY length / START_AT time */
        int64_t arg;          /* CALLBACK: its argument */
    };
    int64_t order;            /* counter-gate position; -1 none */
    int pslot;                /* parameter slot (-1: use the constants) */
    union {
        int64_t poff;
        int64_t bbytes;       /* CALLBACK (no parameter slot): its second
                                 buffer's bytes */
    };
    int prslot;               /* slot `prio` is read from when ready (-1:
                                 the constant) */
    int64_t proff;
    int ref, add;             /* SCALE */
    /* runtime state (the engine's), touched only under the progress lock */
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
    uint64_t stamp[4];        /* stamped send: {stamp id, round, tag, 0} */
    uint64_t *stampbuf;       /* stamped send with data: the header, then
                                 the data (PC_STAMP_WORDS at most) */
    uint64_t *bank;           /* stamped recv: banked future rounds */
    unsigned char *bankdata;  /* ... and their data (count > 0) */
    int nbank, capbank, capbankdata;
    _Atomic uint64_t fires;   /* triggers: fires requested (monotonic) */
    uint64_t fires_used;
} pc_op;

/* an op and a round: a stamped fire or gate opening, a ready gate */
typedef struct { int op; uint64_t round; } pc_op_round;
/* a discard receive standing in for a timed-out one */
typedef struct { int64_t req, id; void *buf; } pc_discard;
/* a device op in flight and the event recorded after it */
typedef struct { int op; uintptr_t ev; } pc_dev_op;

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
    int nfailed;                    /* PC_EFAILED: ranks known failed ... */
    int failed[8];                  /* ... and the first of them */
    pthread_mutex_t fire_mtx;       /* protects the stamped-fire list */
    pthread_mutex_t data_mtx;       /* LOCKED ops and the application */
    _Atomic int lock_held;          /* the application holds data_mtx */
    pthread_t lock_owner;
    pc_op_round *sfire; int capsfire;
    _Atomic int nsfire;
    /* ready gates the application has not taken yet (fire_mtx) */
    pc_op_round *gate_ready; int ngate, capgate;
    _Atomic int gates_ready;

    /* engine bookkeeping (progress lock; `inbox` under the engine mutex) */
    int on_work, on_inbox, on_poll, registered, cleaned;
    int lock_deferred, again;
    _Atomic int unlock_wakes;   /* ops wait for the data lock: the
                                   application's unlock() notifies */
    pc_sched *work_next, *inbox_next, *poll_next, *ep_next;
    void *endpoint;                 /* control channel of comm */

    /* round state (the engine's; progress lock) */
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
    pc_discard *disc; int ndisc, capdisc;
    int64_t next_disc;
    /* device ops in flight, in queue order (they complete in that order) */
    pc_devq dq;
    int has_devq;
    pc_dev_op *dev; int ndev, capdev;
};

/* ---- building and checking (build.c) */
int pc_sched_create(const int64_t *desc, int nops, const int64_t *deps,
                    int64_t ndeps, int nslots, MPI_Comm comm, int persistent,
                    uint64_t stamp_id, pc_sched **out, char *err,
                    size_t errlen);
/* Register a CALLBACK op's function under `name` (at most
 * PC_MAX_CALLBACKS names; registering a name again replaces nothing and
 * returns its id if fn is the same).  Returns its id, or -1: the table is
 * full, or the name is taken by another function. */
int pc_sched_register_callback(const char *name, pc_callback_fn fn);
/* the id of a registered callback, or -1 */
int pc_sched_callback_id(const char *name);
/* the function registered with id `id`, or NULL (no lock: the engine
 * calls it for every CALLBACK op it runs) */
pc_callback_fn pc_sched_callback(int id);
/* Called before each post: every op's byte range must lie in its slot. */
int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen);
/* the stamped receive from `peer` with `tag`, or -1 */
int pc_sched_find_srecv(pc_sched *s, int peer, int tag);

/* ---- the application's side (sched.c) */
int pc_sched_bind(pc_sched *s, int slot, void *ptr, int64_t len, int writable,
                  int space);
void pc_sched_unbind(pc_sched *s, int slot);
int pc_sched_set_device(pc_sched *s, int backend, void *ctx, void *stream,
                        const int64_t *kernels, int nkernels, char *err,
                        size_t errlen);
int pc_sched_set_tag_base(pc_sched *s, int base);
int pc_sched_idle(pc_sched *s);      /* no round posted and not done */
void pc_sched_ref(pc_sched *s);
void pc_sched_unref(pc_sched *s);    /* the last reference destroys it */
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
/* the schedule's error: the first one wins (any thread) */
void pc_sched_set_error(pc_sched *s, int code, const char *fmt, ...);

#endif
