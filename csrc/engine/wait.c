/* wait.c -- the application's thread inside the engine: fires and gate
 * openings it sends into a schedule, the gates a round readies for it, and
 * blocking waits, which drive progress on the caller's thread (engine.c,
 * design constraint 5). */
#include "engine/engine_int.h"

#include <math.h>
#include <string.h>
#include <time.h>

/* ---- sleeping on one of the engine's condition variables */
void pc_engine_timed_wait(pthread_cond_t *cv, double us)    /* mtx held */
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
    pthread_cond_timedwait(cv, &pc_engine.mtx, &ts);
}

/* ---- fires and gate openings for a round (fire_mtx; absorbed by the
 * round machinery, round.c) */
static int push_sfire(pc_sched *s, int op, uint64_t round)
{
    pthread_mutex_lock(&s->fire_mtx);
    pc_op_round *f = pc_grow(s->sfire, &s->capsfire, s->nsfire + 1,
                             sizeof(*f), 8);
    if (!f) {
        pthread_mutex_unlock(&s->fire_mtx);
        return PC_ENOMEM;
    }
    s->sfire = f;
    s->sfire[s->nsfire] = (pc_op_round){op, round};
    atomic_fetch_add(&s->nsfire, 1);
    pthread_mutex_unlock(&s->fire_mtx);
    return PC_OK;
}

int pc_engine_fire(pc_sched *s, int op, int64_t round, int wake)
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
    if (wake)
        pc_engine_notify(s);
    else
        pc_engine_enqueue(s);
    return PC_OK;
}

/* ---- gates the application opens */
void pc_engine_gate_ready(pc_sched *s, int op)
{
    pthread_mutex_lock(&s->fire_mtx);
    pc_op_round *g = pc_grow(s->gate_ready, &s->capgate, s->ngate + 1,
                             sizeof(*g), 8);
    if (!g) {
        pthread_mutex_unlock(&s->fire_mtx);
        pc_sched_set_error(s, PC_ENOMEM, "out of memory readying gate "
                           "op %d", op);
        return;
    }
    s->gate_ready = g;
    s->gate_ready[s->ngate++] = (pc_op_round){op, s->round};
    atomic_fetch_add(&s->gates_ready, 1);
    pthread_mutex_unlock(&s->fire_mtx);
    pthread_mutex_lock(&pc_engine.mtx);
    pthread_cond_broadcast(&pc_engine.gcv);
    pthread_mutex_unlock(&pc_engine.mtx);
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
    pthread_mutex_lock(&pc_engine.mtx);
    for (;;) {
        pthread_mutex_lock(&s->fire_mtx);
        if (s->ngate > 0) {
            *op = s->gate_ready[0].op;
            *round = s->gate_ready[0].round;
            s->ngate--;
            memmove(s->gate_ready, s->gate_ready + 1,
                    s->ngate * sizeof(*s->gate_ready));
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
        pc_engine_timed_wait(&pc_engine.gcv, 1e6 * (left < 0.1 ? left : 0.1));
        if (timeout < 0)
            continue;
    }
    pthread_mutex_unlock(&pc_engine.mtx);
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
/* Does the thread need waking now (prog held)?  Work to run, data messages
 * to poll at full speed, or a timer due within its 1 ms park; if it sleeps
 * until woken (it had nothing when it last looked), also any message in
 * flight or timer.  Otherwise idle receives and far timers are picked up
 * when its timed sleep ends. */
static int thread_needed(int forever)
{
    if (pc_engine.work || pc_engine.polled || pc_wire_hot() > 0)
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
    int need = 1, idle_recvs = 0;
    pthread_mutex_lock(&pc_engine.mtx);
    int forever = pc_engine.forever;
    pthread_mutex_unlock(&pc_engine.mtx);
    if (pthread_mutex_trylock(&pc_engine.prog) == 0) {
        need = thread_needed(forever);
        idle_recvs = pc_wire_outstanding() > 0;
        pthread_mutex_unlock(&pc_engine.prog);
    }
    double now = pc_now();
    atomic_store(&pc_engine.left_at, now);
    pthread_mutex_lock(&pc_engine.mtx);
    pc_engine.recheck = 1;
    /* nothing but idle receives left, and a caller that came back quickly
     * last time: it will likely sweep them itself before the thread would
     * (the thread taking a round between two calls of a loop made both
     * ranks' calls slower, and left the caller's data out of the round).
     * With nothing outstanding at all the thread goes to sleep instead. */
    pc_engine.hold_until = !need && idle_recvs &&
        atomic_load(&pc_engine.came_back) ? now + 1e-6 * HOLD_US : 0;
    if (need || pc_engine.inbox || pc_engine.forever != forever)
        pthread_cond_signal(&pc_engine.cv);
    pthread_mutex_unlock(&pc_engine.mtx);
}

/* How long the thread leaves the idle receives to a caller that will
 * likely be back (mtx held): 0 once the hold is over, or with work in its
 * inbox. */
double pc_engine_hold_us(void)
{
    if (pc_engine.hold_until <= 0 || pc_engine.inbox)
        return 0;
    double left = pc_engine.hold_until - pc_now();
    if (left <= 0)
        pc_engine.hold_until = 0;
    return left > 0 ? 1e6 * left : 0;
}

/* The first driver arrives: did it come back within HOLD_US of the last
 * one's leaving? */
static void driver_arrives(void)
{
    double left = atomic_load(&pc_engine.left_at);
    atomic_store(&pc_engine.came_back,
                 left > 0 && pc_now() - left < 1e-6 * HOLD_US);
}

/* Wait until at least `upto` rounds of s completed.  The caller holds a
 * reference on s. */
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout)
{
    int rc = PC_OK;
    long idle = 0;
    double t0 = timeout >= 0 ? pc_now() : 0;
    pc_engine_init();
    if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
        return atomic_load(&s->error);
    if (atomic_fetch_add(&pc_engine.drivers, 1) == 0)
        driver_arrives();
    for (;;) {
        if ((rc = ended(s)) != PC_OK)
            break;
        if (atomic_load_explicit(&s->done, memory_order_acquire) >= upto)
            break;
        int p = 0;
        double us = pc_engine.poll_max_us;
        if (pthread_mutex_trylock(&pc_engine.prog) == 0) {
            p = pc_engine_sweep();
            if (!p)
                us = pc_engine_pause_us(idle + 1);
            pthread_mutex_unlock(&pc_engine.prog);
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
        pc_engine_driver_pause(idle, us);
    }
    if (atomic_fetch_sub(&pc_engine.drivers, 1) == 1)
        hand_back();
    return rc;
}

