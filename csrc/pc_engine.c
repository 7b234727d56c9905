/* pc_engine.c -- the progress thread.
 *
 * Design constraints, in order:
 *  1. Never touch Python: the thread runs plain C and never holds the GIL.
 *  2. Never block inside the loop: requests are tested, never waited on.
 *  3. Burn no CPU when nothing is active: with no schedule posted the thread
 *     sleeps on a condition variable.  While schedules wait on the network it
 *     polls with exponential back-off (a timed condition wait, so a post or a
 *     fire wakes it at once).  On an oversubscribed machine a spinning thread
 *     steals the core from ranks that have work.
 *  4. A blocking wait drives progress itself: the waiting application thread
 *     (GIL released) takes the progress lock and sweeps, while the background
 *     thread parks.  No hand-off between threads on the latency path.
 *  5. Locks: `mtx` protects the active list and wake-ups and is held only to
 *     touch them; `prog` serialises sweeps (the executor state of every
 *     schedule).  Lock order: prog, then mtx.
 *  6. Shut down with a flag and a join; pending requests are cancelled, never
 *     left for MPI_Finalize to complain about.
 */
#include "pc_sched.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

static struct {
    pthread_mutex_t mtx, prog;
    pthread_cond_t cv;
    pc_sched *head;
    pthread_t thread;
    int started, shutdown;
    _Atomic int drivers;
    pc_sched **snap;
    int capsnap;
} E = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
       PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0, NULL, 0};

_Atomic int pc_engine_thread_running = 0;
static long poll_max_us = -1;

static long max_backoff_us(void)
{
    if (poll_max_us < 0) {
        const char *v = getenv("PARTIALCOLL_POLL_MAX_US");
        long x = v ? atol(v) : 100;
        poll_max_us = x > 0 ? x : 1;
    }
    return poll_max_us;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void list_remove(pc_sched *s)   /* mtx held */
{
    for (pc_sched **p = &E.head; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    s->next = NULL;
    s->active = 0;
}

/* One pass over every active schedule.  Caller holds `prog`. */
static int sweep_all(void)
{
    int n = 0, progressed = 0;
    pthread_mutex_lock(&E.mtx);
    for (pc_sched *s = E.head; s; s = s->next)
        n++;
    if (n > E.capsnap) {
        pc_sched **p = realloc(E.snap, (size_t)n * 2 * sizeof(*p));
        if (!p) {
            pthread_mutex_unlock(&E.mtx);
            return 0;
        }
        E.snap = p;
        E.capsnap = n * 2;
    }
    n = 0;
    for (pc_sched *s = E.head; s; s = s->next)
        E.snap[n++] = s;
    pthread_mutex_unlock(&E.mtx);

    for (int k = 0; k < n; k++) {
        int r = pc_sched_progress(E.snap[k]);
        if (r != 0)
            progressed = 1;
    }
    pthread_mutex_lock(&E.mtx);
    for (int k = 0; k < n; k++) {
        pc_sched *s = E.snap[k];
        if (atomic_load(&s->error) != PC_OK) {
            pc_sched_cancel_all(s);
            list_remove(s);
        } else if (!s->persistent && !s->armed &&
                   atomic_load(&s->posted) == s->round) {
            list_remove(s);   /* idle until the next post */
        }
    }
    pthread_mutex_unlock(&E.mtx);
    return progressed;
}

static void timed_wait_us(long us)    /* mtx held */
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += us * 1000;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&E.cv, &E.mtx, &ts);
}

static void *progress_main(void *arg)
{
    (void)arg;
    int idle = 0;
    pthread_mutex_lock(&E.mtx);
    while (!E.shutdown) {
        if (!E.head) {                       /* nothing active: sleep */
            pthread_cond_wait(&E.cv, &E.mtx);
            idle = 0;
            continue;
        }
        if (atomic_load(&E.drivers) > 0) {   /* a waiter drives: park */
            timed_wait_us(1000);
            idle = 0;
            continue;
        }
        pthread_mutex_unlock(&E.mtx);
        pthread_mutex_lock(&E.prog);
        int p = sweep_all();
        pthread_mutex_unlock(&E.prog);
        pthread_mutex_lock(&E.mtx);
        if (p) {
            idle = 0;
        } else if (++idle < 8) {
            pthread_mutex_unlock(&E.mtx);
            sched_yield();
            pthread_mutex_lock(&E.mtx);
        } else {
            long us = 1L << (idle - 8 < 20 ? idle - 8 : 20);
            long cap = max_backoff_us();
            timed_wait_us(us < cap ? us : cap);
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
    pthread_mutex_lock(&E.mtx);
    if (E.shutdown) {
        rc = PC_EINVAL;
        goto out;
    }
    if (s->persistent) {
        if (atomic_load(&s->posted)) {
            rc = PC_EBUSY;
            goto out;
        }
    }
    atomic_fetch_add(&s->posted, 1);
    if (!s->active) {
        s->active = 1;
        s->next = E.head;
        E.head = s;
    }
    if (!E.started) {
        if (pthread_create(&E.thread, NULL, progress_main, NULL) != 0) {
            rc = PC_ENOMEM;
            goto out;
        }
        E.started = 1;
        atomic_store(&pc_engine_thread_running, 1);
    }
    if (wake)
        pthread_cond_signal(&E.cv);
out:
    pthread_mutex_unlock(&E.mtx);
    return rc;
}

int pc_engine_fire(pc_sched *s, int op, int64_t round)
{
    if (op < 0 || op >= s->nops || s->ops[op].kind != PC_TRIGGER)
        return PC_EINVAL;
    if (round < 0) {
        atomic_fetch_add(&s->ops[op].fires, 1);
    } else {
        pthread_mutex_lock(&s->fire_mtx);
        if (s->nsfire == s->capsfire) {
            int cap = s->capsfire ? 2 * s->capsfire : 8;
            uint64_t *r = realloc(s->sfire_round, cap * sizeof(uint64_t));
            if (r)
                s->sfire_round = r;
            int *o = realloc(s->sfire_op, cap * sizeof(int));
            if (o)
                s->sfire_op = o;
            if (!r || !o) {
                pthread_mutex_unlock(&s->fire_mtx);
                return PC_ENOMEM;
            }
            s->capsfire = cap;
        }
        s->sfire_round[s->nsfire] = (uint64_t)round;
        s->sfire_op[s->nsfire] = op;
        atomic_fetch_add(&s->nsfire, 1);
        pthread_mutex_unlock(&s->fire_mtx);
    }
    pc_engine_wake();
    return PC_OK;
}

/* Wait until at least `upto` rounds of s completed.  Drives progress. */
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout)
{
    int rc = PC_OK;
    long idle = 0;
    double t0 = timeout >= 0 ? now() : 0;
    if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
        return atomic_load(&s->error);
    atomic_fetch_add(&E.drivers, 1);
    for (;;) {
        if (atomic_load(&s->error) != PC_OK) {
            rc = atomic_load(&s->error);
            break;
        }
        if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
            break;
        int p = 0;
        if (pthread_mutex_trylock(&E.prog) == 0) {
            p = sweep_all();
            pthread_mutex_unlock(&E.prog);
        }
        if (p) {
            idle = 0;
            continue;
        }
        idle++;
        if (idle > 2000) {       /* long wait: sleep, bounded by the cap */
            long us = (idle - 2000) / 16 + 1, cap = max_backoff_us();
            struct timespec ts = {0, 1000L * (us < cap ? us : cap)};
            nanosleep(&ts, NULL);
        } else if (idle > 16) {
            sched_yield();
        }
        if (timeout >= 0 && (idle & 15) == 0 && now() - t0 > timeout) {
            rc = PC_ETIMEOUT;
            break;
        }
    }
    if (atomic_fetch_sub(&E.drivers, 1) == 1) {
        /* hand the remaining work (if any) back to the progress thread */
        pthread_mutex_lock(&E.mtx);
        if (E.head)
            pthread_cond_signal(&E.cv);
        pthread_mutex_unlock(&E.mtx);
    }
    return rc;
}

int pc_engine_busy(pc_sched *s)
{
    pthread_mutex_lock(&E.prog);
    sweep_all();
    int b = pc_sched_busy(s);
    pthread_mutex_unlock(&E.prog);
    return b;
}

int pc_engine_free(pc_sched *s)
{
    pthread_mutex_lock(&E.prog);
    pthread_mutex_lock(&E.mtx);
    if (s->active)
        list_remove(s);
    pthread_mutex_unlock(&E.mtx);
    pc_sched_cancel_all(s);
    pthread_mutex_unlock(&E.prog);
    pc_sched_destroy(s);
    return PC_OK;
}

void pc_engine_shutdown(void)
{
    pthread_mutex_lock(&E.mtx);
    int started = E.started;
    E.shutdown = 1;
    pthread_cond_broadcast(&E.cv);
    pthread_mutex_unlock(&E.mtx);
    if (started)
        pthread_join(E.thread, NULL);
    atomic_store(&pc_engine_thread_running, 0);
    pthread_mutex_lock(&E.prog);
    pthread_mutex_lock(&E.mtx);
    while (E.head) {
        pc_sched *s = E.head;
        pc_sched_cancel_all(s);
        list_remove(s);
    }
    E.started = 0;
    pthread_mutex_unlock(&E.mtx);
    pthread_mutex_unlock(&E.prog);
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
