/* engine.c -- the progress engine: one thread, work lists, sweeps, and the
 * lifecycle of schedules (waiting on the caller's thread: wait.c; the
 * engine's other files: engine_int.h).
 *
 * Design constraints, in order:
 *  1. Never touch Python: the thread runs plain C and never holds the GIL.
 *  2. Never block inside the loop: messages are tested, never waited on.
 *  3. Cost follows work, not open objects.  A sweep tests the transport once
 *     (wire.c) and visits only the schedules that have something to do:
 *     those the application posted, fired, unlocked or opened a gate of (the
 *     inbox), those a completion or a timer concerns (the work list), and
 *     those with device work or a deferred locked op (the poll list).
 *  4. Burn no CPU when nothing is active: with nothing outstanding the thread
 *     sleeps on a condition variable; with only timers it sleeps until the
 *     earliest; with round-bound messages in flight it polls with
 *     exponential back-off capped at PARTIALCOLL_POLL_MAX_US (100 us); with
 *     only long-lived receives (the control channel) the cap grows with the
 *     time since anything happened, up to PARTIALCOLL_IDLE_MAX_US (2 ms).
 *     For a moment after the library's own blocking exchanges
 *     (pc_engine_settle) it nudges the transport even with nothing
 *     outstanding, ever more sparsely (at most SETTLE_MAX_US apart), then
 *     sleeps.
 *  5. A blocking wait drives progress itself: the waiting application thread
 *     (GIL released) takes the progress lock and sweeps while the thread
 *     parks, so the latency path has no hand-off between threads.  A caller
 *     that calls again soon after (within HOLD_US) keeps that: until it is
 *     back the thread leaves the idle receives alone (wait.c, hand_back).
 *  6. Locks: `prog` serialises sweeps (all executor state, the transport,
 *     timers, gates); `mtx` protects the inbox and wake-ups and is held only
 *     to touch them; a schedule's fire_mtx guards its fire and gate lists.
 *     Order: prog, then mtx, then fire_mtx.  The data lock of a schedule is
 *     only ever tried by the progress side.
 *  7. Shut down with a flag and a join.  Receives are cancelled (local);
 *     sends are never cancelled: shutdown drains them for a bounded time.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

pc_engine_state pc_engine = {.mtx = PTHREAD_MUTEX_INITIALIZER,
                             .prog = PTHREAD_MUTEX_INITIALIZER,
                             .poll_max_us = 100, .idle_max_us = 2000};
static pthread_once_t once = PTHREAD_ONCE_INIT;

static long env_us(const char *name, long dflt)
{
    const char *v = getenv(name);
    long x = v ? atol(v) : dflt;
    return x > 0 ? x : dflt;
}

static void init_once(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&pc_engine.cv, &a);
    pthread_cond_init(&pc_engine.gcv, &a);
    pthread_condattr_destroy(&a);
    pc_engine.poll_max_us = env_us("PARTIALCOLL_POLL_MAX_US", 100);
    pc_engine.idle_max_us = env_us("PARTIALCOLL_IDLE_MAX_US", 2000);
    if (pc_engine.idle_max_us < pc_engine.poll_max_us)
        pc_engine.idle_max_us = pc_engine.poll_max_us;
    pthread_mutex_lock(&pc_engine.prog);
    pc_wire_init();
    pc_engine.last_event = pc_now();
    pthread_mutex_unlock(&pc_engine.prog);
}

void pc_engine_init(void)
{
    pthread_once(&once, init_once);
}

static void mark_event(void) { pc_engine.last_event = pc_now(); }

/* the longest pause between two nudges while settling, in us */
#define SETTLE_MAX_US 10000

/* Settling (pc_engine_settle): 1 while it lasts, 0 once over (and then
 * settle_until is cleared, so that later sweeps read no clock). */
static int settling(double now)
{
    double until = atomic_load(&pc_engine.settle_until);
    if (until <= 0)
        return 0;
    if (now < until)
        return 1;
    atomic_compare_exchange_strong(&pc_engine.settle_until, &until, 0.0);
    return 0;
}

/* ---- lists (prog held) */
void pc_engine_queue(pc_sched *s)
{
    if (s->on_work || s->cleaned)
        return;
    s->on_work = 1;
    s->work_next = NULL;
    if (pc_engine.work_tail)
        pc_engine.work_tail->work_next = s;
    else
        pc_engine.work = s;
    pc_engine.work_tail = s;
}

static void unlink_all(pc_sched *s)      /* prog held */
{
    pthread_mutex_lock(&pc_engine.mtx);
    for (pc_sched **p = &pc_engine.inbox; *p; p = &(*p)->inbox_next)
        if (*p == s) {
            *p = s->inbox_next;
            break;
        }
    s->on_inbox = 0;
    pthread_mutex_unlock(&pc_engine.mtx);
    pc_sched *prev = NULL;
    for (pc_sched *x = pc_engine.work; x; prev = x, x = x->work_next)
        if (x == s) {
            if (prev)
                prev->work_next = s->work_next;
            else
                pc_engine.work = s->work_next;
            if (pc_engine.work_tail == s)
                pc_engine.work_tail = prev;
            break;
        }
    s->on_work = 0;
    for (pc_sched **p = &pc_engine.polled; *p; p = &(*p)->poll_next)
        if (*p == s) {
            *p = s->poll_next;
            break;
        }
    s->on_poll = 0;
}

/* The inbox is a stack (push is O(1) under mtx); take_inbox reverses it so
 * schedules start in the order they were posted, as MPI users expect of
 * nonblocking calls made one after another. */
static void inbox_push(pc_sched *s)      /* mtx held */
{
    if (!s->on_inbox) {
        s->on_inbox = 1;
        s->inbox_next = pc_engine.inbox;
        pc_engine.inbox = s;
    }
}

void pc_engine_notify(pc_sched *s)
{
    pthread_mutex_lock(&pc_engine.mtx);
    inbox_push(s);
    pthread_cond_signal(&pc_engine.cv);
    pthread_mutex_unlock(&pc_engine.mtx);
}

/* The inbox without a wake-up: whoever sweeps next takes it (a caller about
 * to wait; else the thread's timed sleep ends, or a driver leaving wakes
 * it: hand_back looks at the inbox). */
void pc_engine_enqueue(pc_sched *s)
{
    pthread_mutex_lock(&pc_engine.mtx);
    inbox_push(s);
    pthread_mutex_unlock(&pc_engine.mtx);
}

static void take_inbox(void)             /* prog held */
{
    pthread_mutex_lock(&pc_engine.mtx);
    pc_sched *fifo = NULL;
    for (pc_sched *s = pc_engine.inbox, *nx; s; s = nx) {      /* reverse */
        nx = s->inbox_next;
        s->on_inbox = 0;
        s->inbox_next = fifo;
        fifo = s;
    }
    pc_engine.inbox = NULL;
    for (pc_sched *s = fifo; s; s = s->inbox_next)   /* inbox_next: mtx */
        pc_engine_queue(s);
    pthread_mutex_unlock(&pc_engine.mtx);
}

/* ---- sweeping (prog held) */
static void on_error(pc_sched *s)
{
    pc_round_stop(s);
    pc_timers_remove(s);
    pthread_mutex_lock(&pc_engine.mtx);
    pthread_cond_broadcast(&pc_engine.gcv);
    pthread_mutex_unlock(&pc_engine.mtx);
}

static int run_work(void)
{
    int n = 0;
    pc_sched *s = pc_engine.work;
    pc_engine.work = pc_engine.work_tail = NULL;
    while (s) {
        pc_sched *nx = s->work_next;
        s->on_work = 0;
        if (!s->registered && s->nsrecv && !s->cleaned &&
            atomic_load(&s->error) == PC_OK &&
            pc_ctrl_register(s) != PC_OK)
            pc_sched_set_error(s, PC_EMPI, "cannot open the control channel "
                               "for round-stamped messages");
        int r = atomic_load(&s->error) == PC_OK ? pc_round_progress(s) : -1;
        if (r < 0) {
            on_error(s);
        } else {
            n += r;
            if ((s->ndev || s->lock_deferred) && !s->on_poll) {
                s->on_poll = 1;
                s->poll_next = pc_engine.polled;
                pc_engine.polled = s;
            }
            if (s->again)
                pc_engine_queue(s);
        }
        s = nx;
    }
    return n;
}

static int run_polled(void)
{
    int n = 0;
    for (pc_sched **p = &pc_engine.polled; *p;) {
        pc_sched *s = *p;
        if (s->ndev) {
            int r = pc_round_test_device(s);
            if (r < 0) {
                on_error(s);
            } else if (r > 0) {
                n += r;
                pc_engine_queue(s);
            }
        }
        if (s->lock_deferred)
            pc_engine_queue(s);        /* try the data lock again */
        if (!s->ndev && !s->lock_deferred) {
            *p = s->poll_next;
            s->on_poll = 0;
        } else {
            p = &s->poll_next;
        }
    }
    return n;
}

int pc_engine_sweep(void)
{
    int n = 0;
    take_inbox();
    n += run_work();
    n += pc_wire_poll();
    if (atomic_load_explicit(&pc_engine.settle_until, memory_order_relaxed) >
            0 && pc_wire_outstanding() == 0 && settling(pc_now()))
        pc_wire_nudge();        /* nothing to test: move what MPI holds */
    if (pc_timers_next() < HUGE_VAL)        /* no clock read without timers */
        n += pc_timers_fire(pc_now());
    n += run_polled();
    n += run_work();
    if (n)
        mark_event();
    atomic_store(&pc_engine.quiet, !pc_engine.work && !pc_engine.polled &&
                                       pc_timers_next() == HUGE_VAL &&
                                       pc_wire_outstanding() == 0);
    return n;
}

/* How long to pause after `idle` sweeps without progress, in microseconds
 * (0: just yield; HUGE_VAL: until woken).  prog held. */
double pc_engine_pause_us(long idle)
{
    double now = 0, until = HUGE_VAL, us;
    if (pc_engine.work)
        return 0;
    double next = pc_timers_next();
    double tp = pc_wire_next_poll();
    if (tp < next)
        next = tp;
    int hot = pc_wire_hot() > 0 || pc_engine.polled;
    if (idle < 8 && hot)
        return 0;               /* spinning: no clock read */
    if (next < HUGE_VAL || !hot)
        now = pc_now();
    if (next < HUGE_VAL)
        until = next > now ? (next - now) * 1e6 : 0;
    double backoff = idle < 8 ? 0 : (double)(1L << (idle - 8 < 20 ? idle - 8
                                                                    : 20));
    if (backoff > pc_engine.poll_max_us)
        backoff = pc_engine.poll_max_us;
    if (hot) {
        us = backoff;
    } else if (pc_wire_outstanding() > 0) {
        double since = (now - pc_engine.last_event) * 1e6 / 64;
        us = backoff > since ? backoff : since;
        if (us > pc_engine.idle_max_us)
            us = pc_engine.idle_max_us;
    } else if (settling(now)) {
        /* the bytes left behind go at the first nudge, if the socket
         * takes them; a few more, ever sparser, for those it did not */
        double since = (now - atomic_load(&pc_engine.settle_from)) * 1e6 / 4;
        us = pc_engine.poll_max_us > since ? pc_engine.poll_max_us : since;
        if (us > SETTLE_MAX_US)
            us = SETTLE_MAX_US;
    } else {
        us = HUGE_VAL;
    }
    return us < until ? us : until;
}

/* set on the progress thread: timeline events say which thread ran them */
static _Thread_local int on_progress_thread;

/* the thread's timed sleep (mtx held), its length in nap_us meanwhile */
static void nap(double us)
{
    pc_engine.nap_us = us;
    pc_engine_timed_wait(&pc_engine.cv, us);
    pc_engine.nap_us = 0;
}

static void *progress_main(void *arg)
{
    (void)arg;
    on_progress_thread = 1;
    long idle = 0;
    pthread_mutex_lock(&pc_engine.mtx);
    while (!pc_engine.shutdown) {
        if (atomic_load(&pc_engine.drivers) > 0) {   /* a waiter drives: park */
            nap(1000);
            idle = 0;
            continue;
        }
        double hold = pc_engine_hold_us();
        if (hold > 0) {
            nap(hold);
            continue;
        }
        pc_engine.recheck = 0;
        pthread_mutex_unlock(&pc_engine.mtx);
        pthread_mutex_lock(&pc_engine.prog);
        int p = pc_engine_sweep();
        double us = p ? 0 : pc_engine_pause_us(idle + 1);
        pthread_mutex_unlock(&pc_engine.prog);
        pthread_mutex_lock(&pc_engine.mtx);
        if (p || pc_engine.inbox || pc_engine.shutdown) {
            idle = 0;        /* re-check under mtx: a wake sent during the */
            continue;        /* sweep must not be slept through */
        }
        idle++;
        if (us <= 0) {
            pthread_mutex_unlock(&pc_engine.mtx);
            sched_yield();
            pthread_mutex_lock(&pc_engine.mtx);
        } else if (us == HUGE_VAL) {
            if (pc_engine.recheck) {        /* the sweep may predate its post */
                idle = 0;
                continue;
            }
            pc_engine.forever = 1;
            pthread_cond_wait(&pc_engine.cv, &pc_engine.mtx);
            pc_engine.forever = 0;
            idle = 0;
        } else {
            nap(us);
        }
    }
    pthread_mutex_unlock(&pc_engine.mtx);
    return NULL;
}

void pc_engine_wake(void)
{
    pthread_mutex_lock(&pc_engine.mtx);
    pthread_cond_signal(&pc_engine.cv);
    pthread_mutex_unlock(&pc_engine.mtx);
}

static int start_thread(void)          /* mtx held */
{
    if (!pc_engine.started) {
        if (pthread_create(&pc_engine.thread, NULL, progress_main,
                           NULL) != 0)
            return PC_ENOMEM;
        pc_engine.started = 1;
    }
    return PC_OK;
}

void pc_engine_settle(double seconds)
{
    pc_engine_init();
    double now = pc_now();
    pthread_mutex_lock(&pc_engine.mtx);
    if (!pc_engine.shutdown && start_thread() == PC_OK) {
        atomic_store(&pc_engine.settle_from, now);
        atomic_store(&pc_engine.settle_until, now + seconds);
        /* a thread awake or in a sleep no longer than the idle poll's sees
         * it soon enough: a wake costs the caller more than the exchange */
        if (pc_engine.forever || pc_engine.nap_us > pc_engine.idle_max_us)
            pthread_cond_signal(&pc_engine.cv);
    }
    pthread_mutex_unlock(&pc_engine.mtx);
}

/* wake = 0: the caller is about to drive progress itself (a blocking call),
 * so the background thread is left asleep. */
int pc_engine_post(pc_sched *s, int wake)
{
    int rc = PC_OK;
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.mtx);
    if (pc_engine.shutdown) {
        rc = PC_EINVAL;
        goto out;
    }
    if (s->persistent && atomic_load(&s->posted)) {
        rc = PC_EBUSY;
        goto out;
    }
    if ((rc = start_thread()) != PC_OK)
        goto out;
    atomic_fetch_add(&s->posted, 1);
    inbox_push(s);
    if (wake)
        pthread_cond_signal(&pc_engine.cv);
out:
    pthread_mutex_unlock(&pc_engine.mtx);
    return rc;
}

/* ---- a thread that drives progress (wait.c, shutdown) pauses */
/* A waiter spins SPIN_SWEEPS sweeps (engine_int.h), then yields its core
 * until the transport's wait_yields sweeps (pc_transport.h), then sleeps. */
void pc_engine_driver_pause(long idle, double us)
{
    if (idle <= SPIN_SWEEPS)
        return;
    if (idle <= pc_wire_wait_yields() && us < 1000) {
        sched_yield();
        return;
    }
    if (us == HUGE_VAL || us > 1e5)
        us = 1e5;            /* recheck the caller's own state now and then */
    if (us < 1)
        us = 1;
    struct timespec ts = {0, (long)(us * 1000)};
    if (us >= 1e6) {
        ts.tv_sec = (time_t)(us / 1e6);
        ts.tv_nsec = (long)((us - 1e6 * ts.tv_sec) * 1000);
    }
    nanosleep(&ts, NULL);
}

int pc_engine_busy(pc_sched *s)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.prog);
    pc_engine_sweep();
    int b = pc_round_busy(s);
    pthread_mutex_unlock(&pc_engine.prog);
    return b;
}

/* Returns 1 while the schedule's sends are still draining (the caller must
 * keep their buffers until pc_sched's sends_left reaches 0). */
int pc_engine_free(pc_sched *s)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.prog);
    atomic_store(&s->closing, 1);
    unlink_all(s);
    pc_timers_remove(s);
    pc_round_stop(s);
    int left = atomic_load(&s->sends_left);
    pthread_mutex_unlock(&pc_engine.prog);
    pthread_mutex_lock(&pc_engine.mtx);
    pthread_cond_broadcast(&pc_engine.gcv);
    pthread_mutex_unlock(&pc_engine.mtx);
    return left > 0;
}

/* Stop the thread, then drain what is still in flight for at most
 * drain_timeout seconds (sends of freed schedules; the caller frees every
 * schedule first).  Returns nothing; pc_wire_sends_left() tells the rest. */
void pc_engine_shutdown(double drain_timeout)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.mtx);
    int started = pc_engine.started;
    pc_engine.shutdown = 1;
    pthread_cond_broadcast(&pc_engine.cv);
    pthread_mutex_unlock(&pc_engine.mtx);
    if (started)
        pthread_join(pc_engine.thread, NULL);
    double t0 = pc_now();
    long idle = 0;
    pthread_mutex_lock(&pc_engine.prog);
    while ((pc_wire_sends_left() > 0 || pc_wire_emulated_pending()) &&
           pc_now() - t0 < drain_timeout) {
        idle = pc_engine_sweep() ? 0 : idle + 1;
        pthread_mutex_unlock(&pc_engine.prog);
        pc_engine_driver_pause(idle, pc_engine.poll_max_us);
        pthread_mutex_lock(&pc_engine.prog);
    }
    pc_wire_shutdown();
    pc_engine.started = 0;
    pthread_mutex_unlock(&pc_engine.prog);
}

int pc_engine_set_network(const char *config, char *err, int errlen)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.prog);
    int rc = pc_wire_use_network(config, err, errlen);
    pthread_mutex_unlock(&pc_engine.prog);
    return rc;
}

/* The transport's name and the network's rates are read under the
 * progress lock, so that a query never races a change of network (the
 * emulated network's shutdown frees what they read). */
const char *pc_engine_transport_name(void)
{
    pthread_mutex_lock(&pc_engine.prog);
    const char *name = pc_wire_transport_name();   /* a static string */
    pthread_mutex_unlock(&pc_engine.prog);
    return name;
}

int pc_engine_network_rate(int rank, int nic, double t, double *rate,
                           double *t0)
{
    pthread_mutex_lock(&pc_engine.prog);
    int rc = pc_wire_network_rate(rank, nic, t, rate, t0);
    pthread_mutex_unlock(&pc_engine.prog);
    return rc;
}

/* a copy the wire keeps, written under the progress lock */
unsigned pc_engine_lossy_classes(void)
{
    return pc_wire_lossy();
}

int pc_engine_set_send_cap(int cap)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.prog);
    pc_wire_set_send_cap(cap);
    pthread_mutex_unlock(&pc_engine.prog);
    return PC_OK;
}

void pc_engine_stats(uint64_t *v, int n)
{
    pc_engine_init();
    pthread_mutex_lock(&pc_engine.prog);
    pc_wire_stats(v, n);
    pthread_mutex_unlock(&pc_engine.prog);
}

double pc_engine_thread_cputime(void)
{
    clockid_t cid;
    struct timespec ts;
    if (!pc_engine.started ||
        pthread_getcpuclockid(pc_engine.thread, &cid) != 0 ||
        clock_gettime(cid, &ts) != 0)
        return 0.0;
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- the timeline: an op's event, from the schedule (common/pc_trace.h
 * records it) */
void pc_tl_op(int what, const pc_sched *s, int op, int outcome)
{
    pc_tl_event e = {pc_now(), s->serial, s->round, 0, op, what, -1, -1,
                     -1, 0, outcome, on_progress_thread ? 0 : PC_TL_CALLER};
    if (op >= 0) {
        const pc_op *o = &s->ops[op];
        e.kind = o->kind;
        e.prio = o->prio;
        e.flags |= o->flags;
        if (o->kind == PC_SEND || o->kind == PC_RECV) {
            e.peer = o->wpeer;
            e.tag = o->tag;
            e.bytes = o->count ? o->count * pc_dtypes[o->dtype].size : 0;
            if (o->flags & PC_F_STAMPED)        /* the header too */
                e.bytes += PC_STAMP_HEADER;
        }
    }
    pc_tl_record(&e);
}
