/* trace.c -- the timeline recorder (see pc_trace.h).  Events append to one
 * array under a mutex (the recording sites already hold the progress lock,
 * so the mutex is uncontended; it only guards against pc_tl_take()).  The
 * array grows with plain realloc, not pc_realloc: a timeline is best effort
 * and never fails a round, so allocation-failure tests leave it alone. */
#include "common/pc_trace.h"
#include "common/pc_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

_Atomic int pc_tl_on = 0;
static pthread_mutex_t tl_mtx = PTHREAD_MUTEX_INITIALIZER;
static pc_tl_event *ev;
static int64_t nev, capev;

int pc_tl_enable(int on)
{
    atomic_store(&pc_tl_on, on ? 1 : 0);
    return (int)sizeof(pc_tl_event);
}

void pc_tl_record(const pc_tl_event *e)
{
    pthread_mutex_lock(&tl_mtx);
    if (nev == capev) {
        int64_t cap = capev ? 2 * capev : 4096;
        pc_tl_event *p = realloc(ev, (size_t)cap * sizeof(*p));
        if (!p) {
            pthread_mutex_unlock(&tl_mtx);
            return;                 /* a timeline is best effort */
        }
        ev = p;
        capev = cap;
    }
    ev[nev++] = *e;
    pthread_mutex_unlock(&tl_mtx);
}

void pc_tl_msg(int what, double t, uint64_t sched, int op, uint64_t round,
               int peer, int tag, int64_t bytes, int prio, int outcome)
{
    pc_tl_event e = {t < 0 ? pc_now() : t, sched, round, bytes, op, what, -1,
                     peer, tag, prio, outcome, 0};
    pc_tl_record(&e);
}

int64_t pc_tl_count(void)
{
    pthread_mutex_lock(&tl_mtx);
    int64_t n = nev;
    pthread_mutex_unlock(&tl_mtx);
    return n;
}

/* Move up to `cap` bytes' worth of events into buf; returns bytes. */
int64_t pc_tl_take(void *buf, int64_t cap)
{
    pthread_mutex_lock(&tl_mtx);
    int64_t n = cap / (int64_t)sizeof(pc_tl_event);
    if (n > nev)
        n = nev;
    memcpy(buf, ev, (size_t)n * sizeof(pc_tl_event));
    memmove(ev, ev + n, (size_t)(nev - n) * sizeof(pc_tl_event));
    nev -= n;
    pthread_mutex_unlock(&tl_mtx);
    return n * (int64_t)sizeof(pc_tl_event);
}
