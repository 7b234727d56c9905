/* pc_timeline.c -- a record of what the executor and the wire did, for a
 * trace viewer (partialcoll/transport/timeline.py turns it into Chrome trace JSON).
 *
 * Off by default: every recording site tests pc_tl_on first, so the cost
 * when off is one predictable branch.  When on, events append to one array
 * under a mutex (the recording sites already hold the progress lock, so the
 * mutex is uncontended; it only guards against pc_tl_take()). */
#include "pc_sched.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double t;           /* pc_now() */
    uint64_t sched;     /* schedule serial (process-local) */
    uint64_t round;
    int64_t bytes;
    int32_t op, ev, kind, peer;   /* peer: rank in MPI_COMM_WORLD */
    int32_t tag, prio, outcome, flags;
} pc_tl_event;

_Atomic int pc_tl_on = 0;
static pthread_mutex_t tl_mtx = PTHREAD_MUTEX_INITIALIZER;
static pc_tl_event *ev;
static int64_t nev, capev;

int pc_tl_enable(int on)
{
    atomic_store(&pc_tl_on, on ? 1 : 0);
    return (int)sizeof(pc_tl_event);
}

static void add(const pc_tl_event *e)
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

void pc_tl_op(int what, const pc_sched *s, int op, int outcome)
{
    pc_tl_event e = {pc_now(), s->serial, s->round, 0, op, what, -1, -1,
                     -1, 0, outcome, 0};
    if (op >= 0) {
        const pc_op *o = &s->ops[op];
        e.kind = o->kind;
        e.prio = o->prio;
        if (o->kind == PC_SEND || o->kind == PC_RECV) {
            e.peer = o->wpeer;
            e.tag = o->tag;
            e.bytes = (o->flags & PC_F_STAMPED)
                          ? 32 : o->count * pc_dtypes[o->dtype].size;
            e.flags = o->flags;
        }
    }
    add(&e);
}

void pc_tl_msg(int what, double t, uint64_t sched, int op, uint64_t round,
               int peer, int tag, int64_t bytes, int prio, int outcome)
{
    pc_tl_event e = {t < 0 ? pc_now() : t, sched, round, bytes, op, what, -1,
                     peer, tag, prio, outcome, 0};
    add(&e);
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
