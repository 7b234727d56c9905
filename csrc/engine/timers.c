/* timers.c -- the engine's timers: a heap by due time of (schedule, op,
 * round, generation).  DELAY/START_AT ops and receive deadlines put one in;
 * a fired timer whose op has moved on (another round, another run) is
 * ignored by pc_round_on_timer, so timers are never cancelled one by one,
 * only all of a schedule's at once when it stops.  Progress lock held. */
#include "engine/engine_int.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    double when;
    pc_sched *s;
    int op;
    uint32_t gen;
    uint64_t round;
} timer;

static struct {
    timer *heap;
    int n, cap;
} T;

double pc_timers_next(void)
{
    return T.n ? T.heap[0].when : HUGE_VAL;
}

static void timer_sift_up(int k)
{
    timer x = T.heap[k];
    while (k > 0) {
        int up = (k - 1) / 2;
        if (T.heap[up].when <= x.when)
            break;
        T.heap[k] = T.heap[up];
        k = up;
    }
    T.heap[k] = x;
}

static void timer_sift_down(int k)
{
    timer x = T.heap[k];
    for (;;) {
        int c = 2 * k + 1;
        if (c >= T.n)
            break;
        if (c + 1 < T.n && T.heap[c + 1].when < T.heap[c].when)
            c++;
        if (x.when <= T.heap[c].when)
            break;
        T.heap[k] = T.heap[c];
        k = c;
    }
    T.heap[k] = x;
}

int pc_timers_add(pc_sched *s, int op, double when)
{
    timer *t = pc_grow(T.heap, &T.cap, T.n + 1, sizeof(timer), 64);
    if (!t) {
        pc_sched_set_error(s, PC_ENOMEM, "out of memory adding a timer for "
                           "op %d", op);
        return PC_ENOMEM;
    }
    T.heap = t;
    T.heap[T.n] = (timer){when, s, op, s->ops[op].tgen, s->round};
    timer_sift_up(T.n++);
    return PC_OK;
}

void pc_timers_remove(pc_sched *s)
{
    int keep = 0;
    for (int k = 0; k < T.n; k++)
        if (T.heap[k].s != s)
            T.heap[keep++] = T.heap[k];
    T.n = keep;
    for (int k = T.n / 2 - 1; k >= 0; k--)
        timer_sift_down(k);
}

int pc_timers_fire(double now)
{
    int n = 0;
    while (T.n > 0 && T.heap[0].when <= now) {
        timer t = T.heap[0];
        T.heap[0] = T.heap[--T.n];
        if (T.n)
            timer_sift_down(0);
        pc_round_on_timer(t.s, t.op, t.round, t.gen);
        n++;
    }
    return n;
}
