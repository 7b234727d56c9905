/* pc_engine.c -- the progress engine: one thread, work lists, timers,
 * waiting, and the lifecycle of schedules.
 *
 * Design constraints, in order:
 *  1. Never touch Python: the thread runs plain C and never holds the GIL.
 *  2. Never block inside the loop: messages are tested, never waited on.
 *  3. Cost follows work, not open objects.  A sweep tests the transport once
 *     (pc_wire.c) and visits only the schedules that have something to do:
 *     those the application posted, fired, unlocked or opened a gate of (the
 *     inbox), those a completion or a timer concerns (the work list), and
 *     those with device work or a deferred locked op (the poll list).
 *  4. Burn no CPU when nothing is active: with nothing outstanding the thread
 *     sleeps on a condition variable; with only timers it sleeps until the
 *     earliest; with round-bound messages in flight it polls with
 *     exponential back-off capped at PARTIALCOLL_POLL_MAX_US (100 us); with
 *     only long-lived receives (the control channel) the cap grows with the
 *     time since anything happened, up to PARTIALCOLL_IDLE_MAX_US (2 ms).
 *  5. A blocking wait drives progress itself: the waiting application thread
 *     (GIL released) takes the progress lock and sweeps while the thread
 *     parks, so the latency path has no hand-off between threads.
 *  6. Locks: `prog` serialises sweeps (all executor state, the transport,
 *     timers, gates); `mtx` protects the inbox and wake-ups and is held only
 *     to touch them; a schedule's fire_mtx guards its fire and gate lists.
 *     Order: prog, then mtx, then fire_mtx.  The data lock of a schedule is
 *     only ever tried by the progress side.
 *  7. Shut down with a flag and a join.  Receives are cancelled (local);
 *     sends are never cancelled: shutdown drains them for a bounded time.
 */
#include "pc_engine_int.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    pthread_mutex_t mtx, prog;
    pthread_cond_t cv, gcv;
    pc_sched *inbox;                     /* mtx */
    pc_sched *work, *work_tail, *polled; /* prog */
    pthread_t thread;
    int started, shutdown;
    int forever;            /* mtx: the thread sleeps until woken */
    int recheck;            /* mtx: a waiter left; look again before that */
    _Atomic int drivers;
    _Atomic int quiet;                   /* last sweep: nothing outstanding */
    double last_event;
} E = {.mtx = PTHREAD_MUTEX_INITIALIZER, .prog = PTHREAD_MUTEX_INITIALIZER};

_Atomic int pc_engine_thread_running = 0;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static long poll_max_us = 100, idle_max_us = 2000;

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
    pthread_cond_init(&E.cv, &a);
    pthread_cond_init(&E.gcv, &a);
    pthread_condattr_destroy(&a);
    poll_max_us = env_us("PARTIALCOLL_POLL_MAX_US", 100);
    idle_max_us = env_us("PARTIALCOLL_IDLE_MAX_US", 2000);
    if (idle_max_us < poll_max_us)
        idle_max_us = poll_max_us;
    pthread_mutex_lock(&E.prog);
    pc_wire_init();
    E.last_event = pc_now();
    pthread_mutex_unlock(&E.prog);
}

static void timed_wait(pthread_cond_t *cv, double us)    /* mtx held */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = (long)(us * 1000.0);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec += ns % 1000000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, &E.mtx, &ts);
}

void pc_engine_mark_event(void) { E.last_event = pc_now(); }

/* ---- lists (prog held) */
void pc_engine_queue(pc_sched *s)
{
    if (s->on_work || s->cleaned)
        return;
    s->on_work = 1;
    s->work_next = NULL;
    if (E.work_tail)
        E.work_tail->work_next = s;
    else
        E.work = s;
    E.work_tail = s;
}

static void unlink_all(pc_sched *s)      /* prog held */
{
    pthread_mutex_lock(&E.mtx);
    for (pc_sched **p = &E.inbox; *p; p = &(*p)->inbox_next)
        if (*p == s) {
            *p = s->inbox_next;
            break;
        }
    s->on_inbox = 0;
    pthread_mutex_unlock(&E.mtx);
    pc_sched *prev = NULL;
    for (pc_sched *x = E.work; x; prev = x, x = x->work_next)
        if (x == s) {
            if (prev)
                prev->work_next = s->work_next;
            else
                E.work = s->work_next;
            if (E.work_tail == s)
                E.work_tail = prev;
            break;
        }
    s->on_work = 0;
    for (pc_sched **p = &E.polled; *p; p = &(*p)->poll_next)
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
        s->inbox_next = E.inbox;
        E.inbox = s;
    }
}

void pc_engine_notify(pc_sched *s)
{
    pthread_mutex_lock(&E.mtx);
    inbox_push(s);
    pthread_cond_signal(&E.cv);
    pthread_mutex_unlock(&E.mtx);
}

static void take_inbox(void)             /* prog held */
{
    pthread_mutex_lock(&E.mtx);
    pc_sched *fifo = NULL;
    for (pc_sched *s = E.inbox, *nx; s; s = nx) {      /* reverse */
        nx = s->inbox_next;
        s->on_inbox = 0;
        s->inbox_next = fifo;
        fifo = s;
    }
    E.inbox = NULL;
    for (pc_sched *s = fifo; s; s = s->inbox_next)   /* inbox_next: mtx */
        pc_engine_queue(s);
    pthread_mutex_unlock(&E.mtx);
}

/* ---- sweeping (prog held) */
static void on_error(pc_sched *s)
{
    pc_sched_stop(s);
    pc_timers_remove(s);
    pthread_mutex_lock(&E.mtx);
    pthread_cond_broadcast(&E.gcv);
    pthread_mutex_unlock(&E.mtx);
}

static int run_work(void)
{
    int n = 0;
    pc_sched *s = E.work;
    E.work = E.work_tail = NULL;
    while (s) {
        pc_sched *nx = s->work_next;
        s->on_work = 0;
        if (!s->registered && s->nsrecv && !s->cleaned &&
            atomic_load(&s->error) == PC_OK &&
            pc_engine_register_stamped(s) != PC_OK)
            pc_sched_set_error(s, PC_EMPI, "cannot open the control channel "
                               "for round-stamped messages");
        int r = atomic_load(&s->error) == PC_OK ? pc_sched_progress(s) : -1;
        if (r < 0) {
            on_error(s);
        } else {
            n += r;
            if ((s->ndev || s->lock_deferred) && !s->on_poll) {
                s->on_poll = 1;
                s->poll_next = E.polled;
                E.polled = s;
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
    for (pc_sched **p = &E.polled; *p;) {
        pc_sched *s = *p;
        if (s->ndev) {
            int r = pc_sched_test_device(s);
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

static int sweep(void)
{
    int n = 0;
    take_inbox();
    n += run_work();
    n += pc_wire_poll();
    if (pc_timers_next() < HUGE_VAL)        /* no clock read without timers */
        n += pc_timers_fire(pc_now());
    n += run_polled();
    n += run_work();
    if (n)
        pc_engine_mark_event();
    atomic_store(&E.quiet, !E.work && !E.polled && pc_timers_next() == HUGE_VAL &&
                               pc_wire_outstanding() == 0);
    return n;
}

/* How long to pause after `idle` sweeps without progress, in microseconds
 * (0: just yield; HUGE_VAL: until woken).  prog held. */
static double pause_us(long idle)
{
    double now = 0, until = HUGE_VAL, us;
    if (E.work)
        return 0;
    double next = pc_timers_next();
    double tp = pc_wire_next_poll();
    if (tp < next)
        next = tp;
    int hot = pc_wire_hot() > 0 || E.polled;
    if (idle < 8 && hot)
        return 0;               /* spinning: no clock read */
    if (next < HUGE_VAL || !hot)
        now = pc_now();
    if (next < HUGE_VAL)
        until = next > now ? (next - now) * 1e6 : 0;
    double backoff = idle < 8 ? 0 : (double)(1L << (idle - 8 < 20 ? idle - 8
                                                                    : 20));
    if (backoff > poll_max_us)
        backoff = poll_max_us;
    if (hot) {
        us = backoff;
    } else if (pc_wire_outstanding() > 0) {
        double since = (now - E.last_event) * 1e6 / 64;
        us = backoff > since ? backoff : since;
        if (us > idle_max_us)
            us = idle_max_us;
    } else {
        us = HUGE_VAL;
    }
    return us < until ? us : until;
}

static void *progress_main(void *arg)
{
    (void)arg;
    long idle = 0;
    pthread_mutex_lock(&E.mtx);
    while (!E.shutdown) {
        if (atomic_load(&E.drivers) > 0) {   /* a waiter drives: park */
            timed_wait(&E.cv, 1000);
            idle = 0;
            continue;
        }
        E.recheck = 0;
        pthread_mutex_unlock(&E.mtx);
        pthread_mutex_lock(&E.prog);
        int p = sweep();
        double us = p ? 0 : pause_us(idle + 1);
        pthread_mutex_unlock(&E.prog);
        pthread_mutex_lock(&E.mtx);
        if (p || E.inbox || E.shutdown) {   /* re-check under mtx: a wake */
            idle = 0;                        /* sent during the sweep must */
            continue;                        /* not be slept through */
        }
        idle++;
        if (us <= 0) {
            pthread_mutex_unlock(&E.mtx);
            sched_yield();
            pthread_mutex_lock(&E.mtx);
        } else if (us == HUGE_VAL) {
            if (E.recheck) {        /* the sweep may predate its post */
                idle = 0;
                continue;
            }
            E.forever = 1;
            pthread_cond_wait(&E.cv, &E.mtx);
            E.forever = 0;
            idle = 0;
        } else {
            timed_wait(&E.cv, us);
        }
    }
    pthread_mutex_unlock(&E.mtx);
    return NULL;
}

void pc_engine_wake(void)
{
    pthread_mutex_lock(&E.mtx);
    pthread_cond_signal(&E.cv);
    pthread_mutex_unlock(&E.mtx);
}

/* wake = 0: the caller is about to drive progress itself (a blocking call),
 * so the background thread is left asleep. */
int pc_engine_post(pc_sched *s, int wake)
{
    int rc = PC_OK;
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.mtx);
    if (E.shutdown) {
        rc = PC_EINVAL;
        goto out;
    }
    if (s->persistent && atomic_load(&s->posted)) {
        rc = PC_EBUSY;
        goto out;
    }
    if (!E.started) {
        if (pthread_create(&E.thread, NULL, progress_main, NULL) != 0) {
            rc = PC_ENOMEM;
            goto out;
        }
        E.started = 1;
        atomic_store(&pc_engine_thread_running, 1);
    }
    atomic_fetch_add(&s->posted, 1);
    inbox_push(s);
    if (wake)
        pthread_cond_signal(&E.cv);
out:
    pthread_mutex_unlock(&E.mtx);
    return rc;
}

/* Room for one more (op, round) pair in two parallel arrays of capacity
 * *cap holding n: doubles both (fire_mtx held).  PC_ENOMEM leaves them as
 * they were, still valid. */
static int grow_pairs(int **ops, uint64_t **rounds, int *cap, int n)
{
    if (n < *cap)
        return PC_OK;
    int c = *cap ? 2 * *cap : 8;
    uint64_t *r = pc_realloc(*rounds, c * sizeof(uint64_t));
    if (r)
        *rounds = r;
    int *o = pc_realloc(*ops, c * sizeof(int));
    if (o)
        *ops = o;
    if (!r || !o)
        return PC_ENOMEM;
    *cap = c;
    return PC_OK;
}

static int push_sfire(pc_sched *s, int op, uint64_t round)
{
    pthread_mutex_lock(&s->fire_mtx);
    if (grow_pairs(&s->sfire_op, &s->sfire_round, &s->capsfire,
                   s->nsfire) != PC_OK) {
        pthread_mutex_unlock(&s->fire_mtx);
        return PC_ENOMEM;
    }
    s->sfire_round[s->nsfire] = round;
    s->sfire_op[s->nsfire] = op;
    atomic_fetch_add(&s->nsfire, 1);
    pthread_mutex_unlock(&s->fire_mtx);
    return PC_OK;
}

int pc_engine_fire(pc_sched *s, int op, int64_t round)
{
    if (op < 0 || op >= s->nops || s->ops[op].kind != PC_TRIGGER)
        return PC_EINVAL;
    if (round < 0) {
        atomic_fetch_add(&s->ops[op].fires, 1);
    } else {
        int rc = push_sfire(s, op, (uint64_t)round);
        if (rc != PC_OK)
            return rc;
    }
    pc_engine_notify(s);
    return PC_OK;
}

/* ---- gates the application opens */
void pc_engine_gate_ready(pc_sched *s, int op)
{
    pthread_mutex_lock(&s->fire_mtx);
    if (grow_pairs(&s->gate_op, &s->gate_round, &s->capgate,
                   s->ngate) != PC_OK) {
        pthread_mutex_unlock(&s->fire_mtx);
        pc_sched_set_error(s, PC_ENOMEM, "out of memory readying gate "
                           "op %d", op);
        return;
    }
    s->gate_op[s->ngate] = op;
    s->gate_round[s->ngate++] = s->round;
    atomic_fetch_add(&s->gates_ready, 1);
    pthread_mutex_unlock(&s->fire_mtx);
    pthread_mutex_lock(&E.mtx);
    pthread_cond_broadcast(&E.gcv);
    pthread_mutex_unlock(&E.mtx);
}

/* Why a waiter on s must stop now: freed, or its error; PC_OK if neither. */
static int ended(pc_sched *s)
{
    if (atomic_load(&s->closing))
        return PC_EFREED;
    return atomic_load(&s->error);
}

int pc_engine_wait_gate(pc_sched *s, double timeout, int *op,
                        uint64_t *round)
{
    double t0 = pc_now();
    int rc = PC_ETIMEOUT;
    pthread_mutex_lock(&E.mtx);
    for (;;) {
        pthread_mutex_lock(&s->fire_mtx);
        if (s->ngate > 0) {
            *op = s->gate_op[0];
            *round = s->gate_round[0];
            s->ngate--;
            memmove(s->gate_op, s->gate_op + 1, s->ngate * sizeof(int));
            memmove(s->gate_round, s->gate_round + 1,
                    s->ngate * sizeof(uint64_t));
            pthread_mutex_unlock(&s->fire_mtx);
            rc = PC_OK;
            break;
        }
        pthread_mutex_unlock(&s->fire_mtx);
        if ((rc = ended(s)) != PC_OK)
            break;
        rc = PC_ETIMEOUT;
        double left = timeout < 0 ? 0.1 : timeout - (pc_now() - t0);
        if (left <= 0)
            break;
        timed_wait(&E.gcv, 1e6 * (left < 0.1 ? left : 0.1));
        if (timeout < 0)
            continue;
    }
    pthread_mutex_unlock(&E.mtx);
    return rc;
}

int pc_engine_open_gate(pc_sched *s, int op, uint64_t round)
{
    if (op < 0 || op >= s->nops || s->ops[op].kind != PC_GATE)
        return PC_EINVAL;
    int rc = push_sfire(s, op, round);
    if (rc == PC_OK)
        pc_engine_notify(s);
    return rc;
}

/* ---- waiting: drive progress on the caller's thread */
/* Sweeps without progress before a waiter starts yielding its core.  A sweep
 * with nothing ready costs about 0.1 us; a sched_yield about 1 us, which is
 * added to the latency of the message it was waiting for.  It yields until
 * the transport's wait_yields sweeps (pc_transport.h), then sleeps. */
#ifndef SPIN_SWEEPS
#define SPIN_SWEEPS 16
#endif
static void driver_pause(long idle, double us)
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

/* Does the thread need waking now (prog held)?  Work to run, data messages
 * to poll at full speed, or a timer due within its 1 ms park; if it sleeps
 * until woken (it had nothing when it last looked), also any message in
 * flight or timer.  Otherwise idle receives and far timers are picked up
 * when its timed sleep ends. */
static int thread_needed(int forever)
{
    if (E.work || E.polled || pc_wire_hot() > 0)
        return 1;
    double next = pc_timers_next(), tp = pc_wire_next_poll();
    if (tp < next)
        next = tp;
    if (forever)        /* asleep until woken: anything left needs it */
        return next < HUGE_VAL || pc_wire_outstanding() > 0;
    return next < HUGE_VAL && next - pc_now() < 1e-3;
}

/* The last driver leaves: hand the remaining work back to the thread.  A
 * blocking call that leaves nothing behind does not wake it (a futex wake and
 * two context switches per call, which on an oversubscribed node cost more
 * than the call itself). */
static void hand_back(void)
{
    int need = 1;
    pthread_mutex_lock(&E.mtx);
    int forever = E.forever;
    pthread_mutex_unlock(&E.mtx);
    if (pthread_mutex_trylock(&E.prog) == 0) {
        need = thread_needed(forever);
        pthread_mutex_unlock(&E.prog);
    }
    pthread_mutex_lock(&E.mtx);
    E.recheck = 1;
    if (need || E.inbox || E.forever != forever)
        pthread_cond_signal(&E.cv);
    pthread_mutex_unlock(&E.mtx);
}

/* Wait until at least `upto` rounds of s completed.  The caller holds a
 * reference on s. */
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout)
{
    int rc = PC_OK;
    long idle = 0;
    double t0 = timeout >= 0 ? pc_now() : 0;
    pthread_once(&once, init_once);
    if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
        return atomic_load(&s->error);
    atomic_fetch_add(&E.drivers, 1);
    for (;;) {
        if ((rc = ended(s)) != PC_OK)
            break;
        if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
            break;
        int p = 0;
        double us = poll_max_us;
        if (pthread_mutex_trylock(&E.prog) == 0) {
            p = sweep();
            if (!p)
                us = pause_us(idle + 1);
            pthread_mutex_unlock(&E.prog);
        }
        if (p) {
            idle = 0;
            continue;
        }
        idle++;
        /* the deadline: looked at every 16th sweep while spinning, then at
         * every pause, which never sleeps past it (a pause with nothing
         * in flight is 0.1 s long) */
        if (timeout >= 0 && (idle > SPIN_SWEEPS || (idle & 15) == 0)) {
            double left = timeout - (pc_now() - t0);
            if (left <= 0) {
                rc = PC_ETIMEOUT;
                break;
            }
            if (us > left * 1e6)
                us = left * 1e6;
        }
        driver_pause(idle, us);
    }
    if (atomic_fetch_sub(&E.drivers, 1) == 1)
        hand_back();
    return rc;
}

int pc_engine_busy(pc_sched *s)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.prog);
    sweep();
    int b = pc_sched_busy(s);
    pthread_mutex_unlock(&E.prog);
    return b;
}

/* Returns 1 while the schedule's sends are still draining (the caller must
 * keep their buffers until pc_sched's sends_left reaches 0). */
int pc_engine_free(pc_sched *s)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.prog);
    atomic_store(&s->closing, 1);
    unlink_all(s);
    pc_timers_remove(s);
    pc_sched_stop(s);
    int left = atomic_load(&s->sends_left);
    pthread_mutex_unlock(&E.prog);
    pthread_mutex_lock(&E.mtx);
    pthread_cond_broadcast(&E.gcv);
    pthread_mutex_unlock(&E.mtx);
    return left > 0;
}

/* Stop the thread, then drain what is still in flight for at most
 * drain_timeout seconds (sends of freed schedules; the caller frees every
 * schedule first).  Returns nothing; pc_wire_sends_left() tells the rest. */
void pc_engine_shutdown(double drain_timeout)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.mtx);
    int started = E.started;
    E.shutdown = 1;
    pthread_cond_broadcast(&E.cv);
    pthread_mutex_unlock(&E.mtx);
    if (started)
        pthread_join(E.thread, NULL);
    atomic_store(&pc_engine_thread_running, 0);
    double t0 = pc_now();
    long idle = 0;
    pthread_mutex_lock(&E.prog);
    while ((pc_wire_sends_left() > 0 || pc_wire_emulated_pending()) &&
           pc_now() - t0 < drain_timeout) {
        idle = sweep() ? 0 : idle + 1;
        pthread_mutex_unlock(&E.prog);
        driver_pause(idle, poll_max_us);
        pthread_mutex_lock(&E.prog);
    }
    pc_wire_shutdown();
    E.started = 0;
    pthread_mutex_unlock(&E.prog);
}

int pc_engine_set_network(const char *config, char *err, int errlen)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.prog);
    int rc = pc_wire_use_network(config, err, errlen);
    pthread_mutex_unlock(&E.prog);
    return rc;
}

int pc_engine_set_send_cap(int cap)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.prog);
    pc_wire_set_send_cap(cap);
    pthread_mutex_unlock(&E.prog);
    return PC_OK;
}

void pc_engine_stats(uint64_t *v, int n)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&E.prog);
    pc_wire_stats(v, n);
    pthread_mutex_unlock(&E.prog);
}

int pc_engine_sends_left(void)
{
    pthread_mutex_lock(&E.prog);
    int n = pc_wire_sends_left();
    pthread_mutex_unlock(&E.prog);
    return n;
}

double pc_engine_thread_cputime(void)
{
    clockid_t cid;
    struct timespec ts;
    if (!E.started || pthread_getcpuclockid(E.thread, &cid) != 0 ||
        clock_gettime(cid, &ts) != 0)
        return 0.0;
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
