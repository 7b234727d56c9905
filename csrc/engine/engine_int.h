/* engine_int.h -- between the files of the engine.  Not for the binding
 * (pc_engine.h is its door) nor for any other part.
 *
 * The engine runs schedules: it interprets the graph sched/ builds, moves
 * messages through a transport (transport/), and keeps time.  It is ONE
 * unit split into files for size, so its files call each other in both
 * directions (a completion the wire reports runs the round, which starts
 * new messages on the wire); this header is where they meet:
 *
 *   engine.c    the progress thread: work lists, sweeps and pauses; post,
 *               free, shutdown, the transport's settings
 *   wait.c      the application's thread in the engine: fires, gates and
 *               blocking waits that drive progress themselves; timed
 *               sleeps on the engine's condition variables
 *   round.c     a schedule's rounds: readiness, starting ops, arming and
 *               finishing rounds, stamped fires
 *   inflight.c  ops in flight: device work, completions, deadlines, the
 *               discard receives that stand in for timed-out ones, stopping
 *   wire.c      the transport in use, the gates sends pass, receives, and
 *               the dispatch of completions to their schedules
 *   ctrl.c      the control channel of round-stamped messages, and the
 *               delivery of a stamped message or fire to its op
 *   timers.c    DELAY / START_AT ops and receive deadlines
 *
 * Everything below runs with the progress lock (pc_engine.prog) held,
 * unless it says otherwise. */
#ifndef PC_ENGINE_INT_H
#define PC_ENGINE_INT_H

#include <pthread.h>

#include "engine/pc_engine.h"
#include "sched/pc_sched.h"
#include "transport/pc_transport.h"
#include "common/pc_common.h"
#include "common/pc_trace.h"

/* ---- the engine's state (engine.c defines it; wait.c shares it) */
typedef struct {
    pthread_mutex_t mtx, prog;
    pthread_cond_t cv;                   /* the thread sleeps on it */
    pthread_cond_t gcv;                  /* gate waiters sleep on it */
    pc_sched *inbox;                     /* mtx */
    pc_sched *work, *work_tail, *polled; /* prog */
    pthread_t thread;
    int started, shutdown;
    int forever;            /* mtx: the thread sleeps until woken */
    double nap_us;          /* mtx: the length of its timed sleep (0: none) */
    int recheck;            /* mtx: a waiter left; look again before that */
    _Atomic int drivers;    /* application threads driving progress */
    _Atomic int quiet;                   /* last sweep: nothing outstanding */
    double last_event;
    long poll_max_us, idle_max_us;       /* design constraint 4 */
    /* pc_engine_settle: nudge the transport until then (0: not settling) */
    _Atomic double settle_from, settle_until;
    /* Callers that come back quickly drive their own rounds (wait.c): when
     * the last driver left, and whether it came back within HOLD_US of the
     * driver before it; until hold_until (mtx) the thread leaves the idle
     * receives to them. */
    _Atomic double left_at;
    _Atomic int came_back;
    double hold_until;
} pc_engine_state;

extern pc_engine_state pc_engine;

/* engine.c */
void pc_engine_init(void);           /* once per process; any thread */
void pc_engine_queue(pc_sched *s);   /* visit s in this sweep */
int pc_engine_sweep(void);           /* one sweep; how much happened */
/* how long to pause after `idle` sweeps without progress, in us (0: just
 * yield; HUGE_VAL: until woken) */
double pc_engine_pause_us(long idle);
/* a blocked caller's pause between sweeps (no lock held) */
void pc_engine_driver_pause(long idle, double us);
/* Sweeps without progress before a waiter starts yielding its core.  A sweep
 * with nothing ready costs about 0.1 us; a sched_yield about 1 us, which is
 * added to the latency of the message it was waiting for. */
#ifndef SPIN_SWEEPS
#define SPIN_SWEEPS 16
#endif
/* A caller that calls again within this many microseconds of its last
 * wait's end drives its own rounds: the thread does not poll the idle
 * receives for that long after a driver leaves (engine.c, constraint 5).
 * Longer than a loop's pause between calls here (a sleep(0) takes 60-70 us
 * of timer slack), far shorter than a skew or a compute step. */
#ifndef HOLD_US
#define HOLD_US 200
#endif
/* the timeline event of op (-1: the round) of s */
void pc_tl_op(int ev, const pc_sched *s, int op, int outcome);

/* wait.c */
void pc_engine_gate_ready(pc_sched *s, int op);
void pc_engine_timed_wait(pthread_cond_t *cv, double us);   /* mtx held */
/* the thread's hold after a driver left, in us (0: none); mtx held */
double pc_engine_hold_us(void);

/* ---- the round machinery: round.c and inflight.c */
enum { OP_IDLE = 0, OP_ACTIVE = 1, OP_DONE = 2 };     /* pc_op.state */

static inline void *pc_addr(pc_sched *s, int slot, int64_t off)
{
    return (char *)s->slots[slot].ptr + off;
}

/* round.c */
int pc_round_progress(pc_sched *s);  /* >0: something happened, <0: error */
int pc_round_busy(pc_sched *s);      /* a round in flight or about to start */
void pc_round_complete(pc_sched *s, int i, int oc);
int pc_round_run_ready(pc_sched *s);
void pc_round_mpi_failure(pc_sched *s, int i, const char *what, int code);
/* A peer of s's communicator failed (or another rank revoked it): revoke
 * it, so no survivor waits for the dead rank's messages, and fail s with
 * PC_EFAILED, the ranks known to have failed and "... failed: what". */
void pc_round_rank_failed(pc_sched *s, const char *what);

/* inflight.c */
int pc_round_is_device_op(pc_sched *s, pc_op *op);
int pc_round_start_device(pc_sched *s, int i);
int pc_round_test_device(pc_sched *s);
void pc_round_on_done(pc_sched *s, int64_t cookie, const pc_done *d);
void pc_round_on_timer(pc_sched *s, int op, uint64_t round, uint32_t gen);
void pc_round_stop(pc_sched *s);     /* cancel receives, keep sends going */

/* ---- messages: wire.c and ctrl.c */
/* cookies of messages that are not an op's: the control channel's
 * receive, and discard receives (PC_COOKIE_DISCARD and below) */
enum { PC_COOKIE_CTRL = -1, PC_COOKIE_DISCARD = -2 };

/* wire.c */
int pc_wire_init(void);              /* the MPI transport, once */
/* tag < 0: a round-stamped control message (the control channel) */
int pc_wire_send(pc_sched *s, int op, void *buf, int count, MPI_Datatype dt,
                 int tag);
/* cookie: the op index, or a discard receive's id (standing in for op) */
int pc_wire_recv(pc_sched *s, int op, void *buf, int count, MPI_Datatype dt,
                 int tag, int64_t cookie, int64_t *handle);
/* hot: a round-bound receive (counted in pc_wire_hot) */
int pc_wire_cancel_recv(int64_t handle, int hot, pc_done *d);
int pc_wire_start(const pc_msg *m, int64_t *handle);   /* not counted */
void pc_wire_unhold(pc_sched *s);    /* drop its gate-queued sends */
int pc_wire_poll(void);              /* test the transport once, dispatch */
int pc_wire_emulated_pending(void);  /* an emulator still holds messages */
int pc_wire_hot(void);               /* round-bound messages in flight */
int pc_wire_wait_yields(void);       /* the transport's (no lock needed) */
int pc_wire_outstanding(void);       /* messages of any kind in flight */
void pc_wire_nudge(void);            /* the transport's nudge() */
int pc_wire_sends_left(void);        /* sends not yet completed */
double pc_wire_next_poll(void);      /* the transport's own deadline */
int pc_wire_use_network(const char *config, char *err, int errlen);
void pc_wire_set_send_cap(int cap);
void pc_wire_stats(uint64_t *v, int n);
const char *pc_wire_transport_name(void);
int pc_wire_network_rate(int rank, int nic, double t, double *rate,
                         double *t0);
unsigned pc_wire_lossy(void);        /* no lock needed */
void pc_wire_shutdown(void);

/* ctrl.c */
/* a stamped message (data: bytes of it; NULL, 0 for a fire or a gate
 * opening) for op i in round r: now, or banked for its round */
void pc_round_deliver(pc_sched *s, int op, uint64_t round, const void *data,
                      int64_t bytes);
int pc_ctrl_register(pc_sched *s);
void pc_ctrl_unregister(pc_sched *s);
struct pc_ctrl_endpoint;                /* one per communicator */
struct pc_ctrl_slot;                    /* its receive from one rank */
void pc_ctrl_arrived(struct pc_ctrl_slot *sl, const pc_done *d);
void pc_ctrl_stats(uint64_t *foreign, uint64_t *unclaimed, uint64_t *posted);
void pc_ctrl_shutdown(void);

/* ---- timers.c */
int pc_timers_add(pc_sched *s, int op, double when);
double pc_timers_next(void);         /* earliest due time, HUGE_VAL: none */
int pc_timers_fire(double now);      /* fire what is due; how many */
void pc_timers_remove(pc_sched *s);  /* all of a schedule's */

#endif
