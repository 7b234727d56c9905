/* netem_send.c -- the emulated network's sends: each joins this rank's
 * queue for its channel, enters the shared ring when there is room, leaves
 * the emulated wire when the model says, waits for its delivery time in a
 * heap, and is then handed to MPI as a copy behind a header (netem.c's
 * design constraints 1 to 4 and 6).  Its completion is reported at that
 * hand-over. */
#include "transport/netem_int.h"
#include "common/pc_trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the channels (segment mutex held) */
/* bytes of low-priority data rank src's NIC holds */
static double low_backlog(const netem_config *c, netem_shm *S, int src)
{
    double b = 0;
    for (int d = 0; d < c->P; d++) {
        netem_chan *ch = &S->ch[netem_chan_at(c->P, src, d, 1)];
        for (uint32_t k = ch->cur; k < ch->n; k++) {
            netem_ent *e = &ch->e[(ch->head + k) % NETEM_QCAP];
            b += e->state == ENT_WIRE ? e->left : (double)e->bytes;
        }
    }
    return b;
}

static int channel_push(netem *N, nsend *x)
{
    int level = netem_level(&N->cfg, x->m.tclass);
    netem_chan *ch = &N->S->ch[netem_chan_at(N->P, N->me, x->m.wpeer, level)];
    if (ch->n >= NETEM_QCAP)
        return 0;
    int64_t bytes = x->m.bytes > 0 ? x->m.bytes : 0;
    double hold = N->cfg.overhead;       /* the per-message cost */
    if (level == 1 && isfinite(N->cfg.low_buffer) && !x->lost &&
        low_backlog(&N->cfg, N->S, N->me) + (double)bytes >
            N->cfg.low_buffer) {
        x->lost = 1;                     /* tail drop: it never goes on */
        bytes = 0;                       /* the wire */
        hold = 0;
    }
    netem_ent *e = &ch->e[(ch->head + ch->n) % NETEM_QCAP];
    *e = (netem_ent){bytes, x->id, 0, 0, 0, ENT_QUEUED, hold};
    if (ch->cur == ch->n) {              /* the channel is idle: go now */
        e->state = ENT_WIRE;
        e->t_start = N->S->t_model;
        e->left = (double)e->bytes;
    }
    ch->n++;
    atomic_fetch_add(&N->S->gen, 1);
    return 1;
}

/* ---- sends waiting for their delivery time: a heap by t_deliver */
/* (never grows in fact: netem_reserve made room for every queued send) */
static int heap_push(netem *N, nsend *x)
{
    nsend **h = pc_grow(N->heap, &N->capheap, N->nheap + 1, sizeof(*h), 64);
    if (!h)
        return -1;
    N->heap = h;
    int k = N->nheap++;
    while (k > 0 && N->heap[(k - 1) / 2]->t_deliver > x->t_deliver) {
        N->heap[k] = N->heap[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    N->heap[k] = x;
    return 0;
}

static nsend *heap_pop(netem *N)
{
    nsend *top = N->heap[0], *last = N->heap[--N->nheap];
    int k = 0;
    for (;;) {
        int c = 2 * k + 1;
        if (c >= N->nheap)
            break;
        if (c + 1 < N->nheap &&
            N->heap[c + 1]->t_deliver < N->heap[c]->t_deliver)
            c++;
        if (last->t_deliver <= N->heap[c]->t_deliver)
            break;
        N->heap[k] = N->heap[c];
        k = c;
    }
    if (N->nheap)
        N->heap[k] = last;
    return top;
}

/* A new send joins the queue of its channel (the segment is synced by the
 * caller). */
void netem_enqueue(netem *N, nsend *x)
{
    int cls = x->m.tclass, dst = x->m.wpeer;
    if (cls >= 0 && cls < NETEM_NCLASS)
        x->lost = netem_lost(&N->cfg, N->me, dst, cls,
                             N->counter[dst * NETEM_NCLASS + cls]++);
    int q = dst * NETEM_NLEVEL + netem_level(&N->cfg, cls);
    if (N->out[q].tail)
        N->out[q].tail->next = x;
    else
        N->out[q].head = x;
    N->out[q].tail = x;
    N->queued++;
}

/* This rank's messages of queue q (a destination and level) that left the
 * wire go to the heap; returns how many.  *stuck: the heap had no room
 * (the rest stay in the ring and are collected later). */
static int collect_done(netem *N, int q, int *stuck)
{
    int d = q / NETEM_NLEVEL, lv = q % NETEM_NLEVEL, moved = 0;
    netem_chan *ch = &N->S->ch[netem_chan_at(N->P, N->me, d, lv)];
    while (ch->n > 0 && ch->e[ch->head].state == ENT_DONE) {
        netem_ent *e = &ch->e[ch->head];
        nsend *x = N->out[q].head;
        if (x && x->id == e->id) {
            x->t_start = e->t_start;
            x->t_end = e->t_end;
            x->t_deliver = e->t_end + netem_latency(&N->cfg, N->me, d);
            if (heap_push(N, x) < 0) {
                *stuck = 1;
                break;
            }
        }
        ch->head = (ch->head + 1) % NETEM_QCAP;
        ch->n--;
        ch->cur--;
        if (!x || x->id != e->id)
            continue;                 /* cannot happen: FIFO both */
        N->out[q].head = x->next;
        if (!x->next)
            N->out[q].tail = NULL;
        N->out[q].in_shm--;
        moved++;
    }
    return moved;
}

/* With the segment locked: bring the model to now, collect this rank's
 * messages that left the wire, push waiting ones into free ring places. */
int netem_sync_model(netem *N, double now)
{
    int moved = 0, stuck = 0;
    netem_shm_lock(N);
    netem_advance(&N->cfg, N->S, now);
    for (int q = 0; q < N->P * NETEM_NLEVEL; q++) {
        moved += collect_done(N, q, &stuck);  /* stuck: no memory, later */
        /* waiting sends take free places, in order */
        nsend *x = N->out[q].head;
        for (int k = 0; x && k < N->out[q].in_shm; k++)
            x = x->next;
        for (; x && channel_push(N, x); x = x->next)
            N->out[q].in_shm++;
    }
    N->next_finish = netem_next_finish(&N->cfg, N->S, N->me,
                                       &N->skip_until);
    N->seen_gen = atomic_load(&N->S->gen);
    if (stuck)
        N->skip_until = -INFINITY;        /* retry at the next poll */
    pthread_mutex_unlock(&N->S->mtx);
    return moved;
}

/* ---- room for what a poll reports */
int netem_reserve_done(netem *N, int need)
{
    if (need <= N->capdone)
        return 0;
    pc_done *d = pc_grow(N->done, &N->capdone, need, sizeof(*d), 64);
    if (!d)
        return -1;
    N->done = d;
    return 0;
}

/* A poll reports at most a completion per send not yet handed to MPI
 * (queued) and per message the wire holds; the delivery heap holds at most
 * the queued sends.  Both have that room before start() takes a message,
 * where a failure is the start's own error: once taken, a message's
 * completion always has a place, and an allocation that fails later can
 * neither lose it nor leave it stuck. */
int netem_reserve(netem *N)
{
    if (netem_reserve_done(N, N->queued + N->wire->outstanding(N->wire) + 1))
        return -1;
    nsend **h = pc_grow(N->heap, &N->capheap, N->queued + 1, sizeof(*h), 64);
    if (!h)
        return -1;
    N->heap = h;
    return 0;
}

/* ---- hand-over to MPI */

/* Start x's copy (header, then data unless it was lost) on the wire, its
 * request kept with ours. */
static int send_copy(netem *N, nsend *x)
{
    if (N->nsent == N->capsent) {
        int cap = pc_grow_cap(N->capsent, N->nsent + 1, 64);
        MPI_Request *r = pc_realloc(N->sreq, cap * sizeof(*r));
        if (r)
            N->sreq = r;
        nsend **p = pc_realloc(N->sent, cap * sizeof(*p));
        if (p)
            N->sent = p;
        int *k = pc_realloc(N->sidx, cap * sizeof(*k));
        if (k)
            N->sidx = k;
        MPI_Status *st = pc_realloc(N->sst, cap * sizeof(*st));
        if (st)
            N->sst = st;
        if (!r || !p || !k || !st)
            return MPI_ERR_NO_MEM;
        N->capsent = cap;
    }
    double hdr[2] = {x->lost ? -x->t_deliver : x->t_deliver, x->t_start};
    int64_t data = x->lost ? 0 : x->m.bytes;
    x->copy = malloc(sizeof hdr + (size_t)data);
    if (!x->copy)
        return MPI_ERR_NO_MEM;
    memcpy(x->copy, hdr, sizeof hdr);
    if (data)
        memcpy(x->copy + sizeof hdr, x->m.buf, (size_t)data);
    int rc = pc_transport_isend(x->copy, (int)(sizeof hdr + data), MPI_BYTE,
                                x->m.peer, x->m.tag, x->m.comm,
                                &N->sreq[N->nsent]);
    if (rc != MPI_SUCCESS) {
        free(x->copy);
        x->copy = NULL;
        return rc;
    }
    N->sent[N->nsent++] = x;
    return MPI_SUCCESS;
}

static void trace_wire(const nsend *x)
{
    int oc = x->lost ? PC_OC_DROPPED : 0;
    pc_tl_msg(PC_EV_WIRE_START, x->t_start, x->m.trace_sched, x->m.trace_op,
              x->m.trace_round, x->m.wpeer, x->m.tag, x->m.bytes, x->m.prio,
              oc);
    pc_tl_msg(PC_EV_WIRE_END, x->t_end, x->m.trace_sched, x->m.trace_op,
              x->m.trace_round, x->m.wpeer, x->m.tag, x->m.bytes, x->m.prio,
              oc);
}

/* Hand due messages to MPI, their completions appended to N->done after
 * the n there; a failure becomes the send's completion.  A message is
 * taken only once its completion has a place (netem_reserve made it). */
int netem_deliver(netem *N, double now, int n)
{
    while (N->nheap > 0 && N->heap[0]->t_deliver <= now &&
           netem_reserve_done(N, n + 1) == 0) {
        nsend *x = heap_pop(N);
        if (pc_tl_on && x->m.tclass >= 0)
            trace_wire(x);
        N->queued--;
        int rc = send_copy(N, x);
        /* delivered: the send is complete (design constraint 6), whenever
         * MPI is done with the copy */
        N->done[n++] = (pc_done){x->m.owner, x->m.cookie, 1, PC_MSG_DELIVERED,
                                 0, -1, rc, 0};
        if (rc != MPI_SUCCESS)
            free(x);
    }
    return n;
}

/* Sends whose copies MPI has finished with: free them (their sends were
 * reported complete at delivery; an MPI error now can only be told). */
static void copy_failed(int err)
{
    fprintf(stderr, "partialcoll: the emulated network's hand-over of a "
            "delivered message to MPI failed (MPI error %d); its receiver "
            "will not get it\n", err);
}

/* Returns MPI_SUCCESS, or the error of an MPI_Testsome that failed. */
int netem_sends_done(netem *N)
{
    int out = 0;
    if (N->nsent == 0)
        return MPI_SUCCESS;
    int r = MPI_Testsome(N->nsent, N->sreq, &out, N->sidx, N->sst);
    if (r != MPI_SUCCESS && r != MPI_ERR_IN_STATUS) {
        /* the call itself failed; the copies stay, MPI may still read
         * them */
        copy_failed(r);
        for (int k = 0; k < N->nsent; k++)
            free(N->sent[k]);
        N->nsent = 0;
        return r;
    }
    if (out == MPI_UNDEFINED || out == 0)
        return MPI_SUCCESS;
    for (int k = 0; k < out; k++) {
        nsend *x = N->sent[N->sidx[k]];
        int err = r == MPI_ERR_IN_STATUS ? N->sst[k].MPI_ERROR : MPI_SUCCESS;
        if (err != MPI_SUCCESS)
            copy_failed(err);
        if (!pc_transport_request_done(&N->sreq[N->sidx[k]], err))
            free(x->copy);          /* else MPI keeps it (pc_transport.h) */
        free(x);
        N->sent[N->sidx[k]] = NULL;
    }
    int keep = 0;                         /* compact, in order */
    for (int k = 0; k < N->nsent; k++)
        if (N->sent[k]) {
            N->sent[keep] = N->sent[k];
            N->sreq[keep++] = N->sreq[k];
        }
    N->nsent = keep;
    return MPI_SUCCESS;
}
