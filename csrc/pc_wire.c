/* pc_wire.c -- the engine's side of the wire: which transport carries the
 * messages, the gates sends pass, the control channel of round-stamped
 * messages, and the dispatch of completions back to their schedules.
 *
 * Design constraints:
 *  1. Cost follows work: one transport poll per sweep covers every message
 *     of the process; a schedule is visited only when one of its messages
 *     completed.  Idle persistent schedules post nothing: their stamped
 *     receives are served by one wildcard receive per communicator (the
 *     control channel), routed by {stamp id, source, tag}.
 *  2. Sends are never cancelled.  A freed or failed schedule's sends run to
 *     completion; the binding keeps their buffers until sends_left is 0.
 *  3. Priority orders the wire: with a cap on sends in flight per
 *     destination process, queued sends leave lowest `prio` first (then
 *     in the order they became ready).  Without a cap nothing queues.
 *     Where a send completes only once its receiver posted the receive
 *     (MPI's rendezvous), a send in flight may wait for a receive that
 *     its receiver posts only after a message queued behind it: so when a
 *     destination's gate has moved nothing for GATE_STALL seconds while
 *     sends queue, one more leaves (the cap bends, nothing hangs).
 *  4. Everything runs under the engine's progress lock.
 */
#include "pc_engine_int.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* cookie bits of an op's message: op index in the low 32 bits */
#define CK_GATED (1LL << 40)      /* counted in its destination's gate */
#define CK_OP(c) ((int)((c) & 0xffffffffLL))

typedef struct {
    pc_sched *s;
    int op, count, tag, prio;
    uint64_t seq;
    void *buf;
    MPI_Datatype dt;
} gated;

typedef struct {
    int inflight;
    gated *q;                  /* heap by (prio, seq) */
    int n, cap;
    double t_moved;            /* last release or completion */
} sendgate;

/* seconds a gate may stand still with sends queued before one more leaves
 * (transports whose sends wait for the receiver only) */
#define GATE_STALL 0.005

typedef struct endpoint {
    MPI_Comm comm;
    int tag;                   /* MPI_TAG_UB of comm, reserved for us */
    int refs;                  /* registered schedules */
    uint64_t buf[4];           /* {stamp id, round, tag, 0} */
    int64_t handle;            /* the posted wildcard receive, -1 none */
    pc_sched **bucket;         /* stamp id -> schedules (chained by ep_next) */
    int nbucket;
    struct { uint64_t id, round; int src, tag; } *bank;   /* not yet claimed */
    int nbank, capbank;
    uint64_t freed[64];        /* recently unregistered stamp ids */
    int nfreed;
    struct endpoint *next;
} endpoint;

static struct {
    pc_transport *tp;
    int nhot, nsends;
    int cap;                   /* sends in flight per destination; 0: any */
    int nqueued;               /* sends waiting in gates */
    sendgate *gates;
    int ngates;
    uint64_t seq;
    endpoint *eps;
    uint64_t foreign, unclaimed;
} W = {NULL, 0, 0, 0, 0, NULL, 0, 0, NULL, 0, 0};

enum { BANK_MAX = 4096 };

/* read by waiters outside the progress lock: a copy of the transport's */
static atomic_int wait_yields = 2000;

static void set_tp(pc_transport *tp)          /* prog held */
{
    W.tp = tp;
    atomic_store(&wait_yields, tp->wait_yields);
}

int pc_wire_init(void)
{
    if (!W.tp)
        set_tp(pc_transport_mpi());
    if (!W.gates) {
        int n = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        W.gates = calloc((size_t)n + 1, sizeof(sendgate));
        if (!W.gates)
            return PC_ENOMEM;
        W.ngates = n;
    }
    return PC_OK;
}

int pc_wire_hot(void) { return W.nhot; }
int pc_wire_wait_yields(void) { return atomic_load(&wait_yields); }
int pc_wire_sends_left(void) { return W.nsends; }
int pc_wire_outstanding(void) { return W.tp ? W.tp->outstanding(W.tp) : 0; }
/* messages an emulated network holds or still hands over to MPI */
int pc_wire_emulated_pending(void)
{
    pc_transport *wire = pc_transport_mpi();
    return W.tp && W.tp != wire &&
           W.tp->outstanding(W.tp) != wire->outstanding(wire);
}

double pc_wire_next_poll(void)
{
    return W.tp ? W.tp->next_poll(W.tp) : HUGE_VAL;
}

const char *pc_engine_transport_name(void)
{
    return W.tp ? W.tp->name : "mpi";
}

/* progress lock held, no message in flight (checked by the caller) */
int pc_wire_use_network(const char *config, char *err, int errlen)
{
    if (pc_wire_init() != PC_OK)
        return PC_ENOMEM;
    pc_transport *wire = pc_transport_mpi();
    /* messages already handed to MPI go on as they are; an emulator may
     * not be dropped while it still holds messages of its own.  Those it
     * delivered and MPI still sends (their receivers, done with their
     * collectives, have posted the receives) complete as MPI progresses:
     * poll for them a while (the caller holds the progress lock) */
    double t0 = pc_now();
    while (pc_wire_emulated_pending() && pc_now() - t0 < 5.0) {
        if (pc_wire_poll() == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    if (pc_wire_emulated_pending()) {
        snprintf(err, errlen, "the emulated network still carries messages: "
                 "change it between collectives");
        return PC_EBUSY;
    }
    if (W.tp != wire) {             /* replace an earlier emulation */
        W.tp->shutdown(W.tp);
        set_tp(wire);
    }
    if (!config || !*config)
        return PC_OK;
    pc_transport *net = pc_netem_create(wire, config, err, errlen);
    if (!net)
        return PC_EINVAL;
    set_tp(net);
    return PC_OK;
}

/* ---- the send cap */
static int release_gated(sendgate *g);

static int gate_before(const gated *a, const gated *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->seq < b->seq);
}

static void gate_push(sendgate *g, gated x)
{
    int k = g->n++;
    while (k > 0) {
        int up = (k - 1) / 2;
        if (!gate_before(&x, &g->q[up]))
            break;
        g->q[k] = g->q[up];
        k = up;
    }
    g->q[k] = x;
}

static gated gate_pop(sendgate *g)
{
    gated top = g->q[0], last = g->q[--g->n];
    int k = 0;
    for (;;) {
        int c = 2 * k + 1;
        if (c >= g->n)
            break;
        if (c + 1 < g->n && gate_before(&g->q[c + 1], &g->q[c]))
            c++;
        if (!gate_before(&g->q[c], &last))
            break;
        g->q[k] = g->q[c];
        k = c;
    }
    if (g->n)
        g->q[k] = last;
    return top;
}

void pc_wire_set_send_cap(int cap)
{
    W.cap = cap > 0 ? cap : 0;
    for (int p = 0; p < W.ngates; p++)     /* a larger cap frees queued sends */
        release_gated(&W.gates[p]);
}

/* tclass -1: a control message (the emulated network never loses one) */
static int transmit(pc_sched *s, int op, void *buf, int count,
                    MPI_Datatype dt, int tag, int64_t cookie, int tclass)
{
    pc_op *o = &s->ops[op];
    int size = 0;
    MPI_Type_size(dt, &size);
    /* a stamped op sends its stamp, from op memory */
    int space = (o->flags & PC_F_STAMPED) ? PC_HOST
                                          : s->slots[o->aslot].space;
    pc_msg m = {1, buf, count, dt, (int64_t)count * size, o->peer, tag,
                o->wpeer, s->comm, tclass, s, cookie, s->serial, s->round,
                op, o->prio, space};
    int rc = W.tp->start(W.tp, &m, NULL);
    if (rc != MPI_SUCCESS)
        return rc;
    W.nhot++;
    W.nsends++;
    atomic_fetch_add(&s->sends_left, 1);
    if (pc_tl_on)
        pc_tl_msg(PC_EV_RELEASED, -1, s->serial, op, s->round, o->wpeer,
                  o->tag, m.bytes, o->prio, 0);
    return MPI_SUCCESS;
}

static int release_one(sendgate *g);

static int release_gated(sendgate *g)
{
    while (g->n > 0 && g->inflight < W.cap)
        release_one(g);
    return PC_OK;
}

/* a stalled gate lets one more send go (design constraint 3) */
static void unstall_gates(void)
{
    if (!W.nqueued || !W.tp->sends_wait)
        return;
    double now = pc_now();
    for (int p = 0; p < W.ngates; p++) {
        sendgate *g = &W.gates[p];
        if (g->n > 0 && now - g->t_moved > GATE_STALL)
            release_one(g);
    }
}

static int release_one(sendgate *g)
{
    gated x = gate_pop(g);
    W.nqueued--;
    g->t_moved = pc_now();
    int rc = transmit(x.s, x.op, x.buf, x.count, x.dt, x.tag,
                      x.op | CK_GATED, x.s->ops[x.op].tclass);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        pc_sched_set_error(x.s, PC_EMPI, "send failed: op %d (to rank "
                           "%d, tag %d) in round %llu: %s", x.op,
                           x.s->ops[x.op].peer, x.tag,
                           (unsigned long long)x.s->round, msg);
        pc_engine_queue(x.s);
        return PC_OK;
    }
    g->inflight++;
    return PC_OK;
}

int pc_engine_start_send(pc_sched *s, int op, void *buf, int count,
                         MPI_Datatype dt, int tag)
{
    pc_op *o = &s->ops[op];
    if (tag < 0)                               /* control channel */
        return transmit(s, op, buf, count, dt, s->tag_ub, op, -1);
    if (W.cap == 0 || o->wpeer < 0 || o->wpeer >= W.ngates)
        return transmit(s, op, buf, count, dt, tag, op, o->tclass);
    sendgate *g = &W.gates[o->wpeer];
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        gated *q = pc_realloc(g->q, (size_t)cap * sizeof(gated));
        if (!q)
            return MPI_ERR_NO_MEM;
        g->q = q;
        g->cap = cap;
    }
    gate_push(g, (gated){s, op, count, tag, o->prio, W.seq++, buf, dt});
    W.nqueued++;
    if (g->n == 1 && g->inflight >= W.cap)
        g->t_moved = pc_now();             /* starts waiting now */
    if (pc_tl_on && g->inflight >= W.cap)
        pc_tl_op(PC_EV_GATED, s, op, 0);
    return release_gated(g);
}

/* Drop the schedule's sends still queued in gates (never transmitted). */
void pc_engine_unhold(pc_sched *s)
{
    for (int p = 0; p < W.ngates; p++) {
        sendgate *g = &W.gates[p];
        int keep = 0;
        for (int k = 0; k < g->n; k++)
            if (g->q[k].s != s)
                g->q[keep++] = g->q[k];
        if (keep == g->n)
            continue;
        W.nqueued -= g->n - keep;
        int n = keep;
        g->n = 0;
        for (int k = 0; k < n; k++)   /* re-heapify what is left */
            gate_push(g, g->q[k]);
    }
}

/* ---- receives */
int pc_engine_start_recv(pc_sched *s, int op, void *buf, int count,
                         MPI_Datatype dt, int tag, int64_t cookie,
                         int64_t *handle)
{
    int size = 0;
    MPI_Type_size(dt, &size);
    pc_op *o = &s->ops[op];
    /* a discard receive (cookie < 0) takes its message into host memory */
    int space = cookie < 0 ? PC_HOST : s->slots[o->aslot].space;
    pc_msg m = {0, buf, count, dt, (int64_t)count * size, o->peer, tag,
                o->wpeer, s->comm, o->tclass, s, cookie, s->serial, s->round,
                op, o->prio, space};
    int rc = W.tp->start(W.tp, &m, handle);
    if (rc == MPI_SUCCESS && cookie >= 0)
        W.nhot++;
    return rc;
}

int pc_engine_cancel_recv(int64_t handle, int hot, pc_done *d)
{
    int r = W.tp->cancel_recv(W.tp, handle, d);
    if (r >= 0 && hot)
        W.nhot--;
    return r;
}

/* ---- the control channel */
static endpoint *ep_find(MPI_Comm comm)
{
    for (endpoint *e = W.eps; e; e = e->next)
        if (e->comm == comm)
            return e;
    return NULL;
}

static int ep_post(endpoint *e)
{
    pc_msg m = {0, e->buf, 4, MPI_UINT64_T, 32, MPI_ANY_SOURCE, e->tag, -1,
                e->comm, 0, e, -1, 0, 0, -1, 0};
    return W.tp->start(W.tp, &m, &e->handle);
}

static unsigned bucket_of(endpoint *e, uint64_t id)
{
    return (unsigned)((id * 0x9E3779B97F4A7C15ULL) >> 32) % e->nbucket;
}

static int ep_grow(endpoint *e)
{
    int nb = e->nbucket ? 2 * e->nbucket : 16;
    pc_sched **b = calloc((size_t)nb, sizeof(*b));
    if (!b)
        return PC_ENOMEM;
    pc_sched **old = e->bucket;
    int nold = e->nbucket;
    e->bucket = b;
    e->nbucket = nb;
    for (int k = 0; k < nold; k++)
        for (pc_sched *s = old[k], *nx; s; s = nx) {
            nx = s->ep_next;
            unsigned h = bucket_of(e, s->stamp_id);
            s->ep_next = e->bucket[h];
            e->bucket[h] = s;
        }
    free(old);
    return PC_OK;
}

/* Route a stamped message; 1 if a schedule took it. */
static int route(endpoint *e, uint64_t id, uint64_t round, int src, int tag)
{
    for (pc_sched *s = e->bucket[bucket_of(e, id)]; s; s = s->ep_next) {
        if (s->stamp_id != id || s->cleaned)
            continue;
        int op = pc_sched_find_srecv(s, src, tag);
        if (op < 0)
            continue;
        pc_sched_deliver(s, op, round);
        pc_engine_queue(s);
        return 1;
    }
    return 0;
}

int pc_engine_register_stamped(pc_sched *s)
{
    if (s->registered || s->nsrecv == 0)
        return PC_OK;
    endpoint *e = ep_find(s->comm);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e || ep_grow(e) != PC_OK) {
            free(e);
            return PC_ENOMEM;
        }
        e->comm = s->comm;
        e->tag = s->tag_ub;
        e->handle = -1;
        if (ep_post(e) != MPI_SUCCESS) {
            free(e->bucket);
            free(e);
            return PC_EMPI;
        }
        e->next = W.eps;
        W.eps = e;
    }
    if (e->refs + 1 > 2 * e->nbucket && ep_grow(e) != PC_OK)
        return PC_ENOMEM;
    unsigned h = bucket_of(e, s->stamp_id);
    s->ep_next = e->bucket[h];
    e->bucket[h] = s;
    e->refs++;
    s->endpoint = e;
    s->registered = 1;
    /* messages that came before this schedule was posted */
    int keep = 0;
    for (int k = 0; k < e->nbank; k++) {
        if (e->bank[k].id == s->stamp_id &&
            route(e, e->bank[k].id, e->bank[k].round, e->bank[k].src,
                  e->bank[k].tag))
            continue;
        e->bank[keep++] = e->bank[k];
    }
    e->nbank = keep;
    return PC_OK;
}

static void ep_destroy(endpoint *e)
{
    for (int k = 0; k < e->nbucket; k++)
        for (pc_sched *s = e->bucket[k]; s; s = s->ep_next) {
            s->registered = 0;
            s->endpoint = NULL;
        }
    if (e->handle >= 0) {
        pc_done d;
        W.tp->cancel_recv(W.tp, e->handle, &d);
    }
    for (endpoint **p = &W.eps; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    free(e->bucket);
    free(e->bank);
    free(e);
}

void pc_engine_unregister_stamped(pc_sched *s)
{
    endpoint *e = s->endpoint;
    if (!s->registered || !e)
        return;
    for (pc_sched **p = &e->bucket[bucket_of(e, s->stamp_id)]; *p;
         p = &(*p)->ep_next)
        if (*p == s) {
            *p = s->ep_next;
            break;
        }
    e->freed[e->nfreed++ % 64] = s->stamp_id;
    s->registered = 0;
    s->endpoint = NULL;
    if (--e->refs == 0)
        ep_destroy(e);
}

static void ctrl_arrived(endpoint *e, const pc_done *d)
{
    uint64_t id = e->buf[0], round = e->buf[1];
    int tag = (int)e->buf[2];
    e->handle = -1;
    if (d->mpi_error == MPI_SUCCESS && d->bytes == 32 &&
        !route(e, id, round, d->source, tag)) {
        int known = 0;
        for (int k = 0; k < 64 && k < e->nfreed; k++)
            known |= e->freed[k] == id;
        for (pc_sched *s = e->bucket[bucket_of(e, id)]; s; s = s->ep_next)
            known |= s->stamp_id == id;
        if (known || e->nbank >= BANK_MAX) {
            W.foreign++;
        } else {
            if (e->nbank == e->capbank) {
                int cap = e->capbank ? 2 * e->capbank : 16;
                void *b = pc_realloc(e->bank, (size_t)cap * sizeof(*e->bank));
                if (!b) {
                    W.foreign++;
                    goto repost;
                }
                e->bank = b;
                e->capbank = cap;
            }
            e->bank[e->nbank].id = id;
            e->bank[e->nbank].round = round;
            e->bank[e->nbank].src = d->source;
            e->bank[e->nbank++].tag = tag;
            W.unclaimed++;
        }
    }
repost:
    if (ep_post(e) != MPI_SUCCESS) {
        /* every schedule listening here is stuck: tell them */
        for (int k = 0; k < e->nbucket; k++)
            for (pc_sched *s = e->bucket[k]; s; s = s->ep_next) {
                pc_sched_set_error(s, PC_EMPI, "re-posting the control "
                                   "channel receive failed");
                pc_engine_queue(s);
            }
    }
}

/* ---- completions */
int pc_wire_poll(void)
{
    pc_done *d;
    int n = 0;
    if (!W.tp)
        return 0;
    W.tp->poll(W.tp, &d, &n);
    unstall_gates();
    for (int k = 0; k < n; k++) {
        if (d[k].cookie == -1) {
            ctrl_arrived((endpoint *)d[k].owner, &d[k]);
            continue;
        }
        pc_sched *s = d[k].owner;
        int64_t c = d[k].cookie;
        if (c >= 0)
            W.nhot--;
        if (d[k].send && (c & CK_GATED) && W.gates) {
            sendgate *g = &W.gates[s->ops[CK_OP(c)].wpeer];
            g->inflight--;
            g->t_moved = pc_now();
            release_gated(g);
        }
        pc_sched_on_done(s, c >= 0 ? CK_OP(c) : c, &d[k]);
        pc_engine_queue(s);
        if (d[k].send) {
            /* last touch: a freed schedule may be released (pc_reap) as
             * soon as its sends_left reaches 0 */
            W.nsends--;
            atomic_fetch_sub_explicit(&s->sends_left, 1,
                                      memory_order_release);
        }
    }
    return n;
}

void pc_wire_shutdown(void)
{
    while (W.eps)
        ep_destroy(W.eps);
    if (W.tp && W.tp != pc_transport_mpi()) {      /* leave the network */
        W.tp->shutdown(W.tp);
        set_tp(pc_transport_mpi());
    }
    for (int p = 0; p < W.ngates; p++)
        free(W.gates[p].q);
    free(W.gates);
    W.gates = NULL;
    W.ngates = 0;
}

void pc_wire_stats(uint64_t *v, int n)
{
    uint64_t all[6] = {W.foreign, W.unclaimed, (uint64_t)W.nhot,
                       (uint64_t)W.nsends,
                       (uint64_t)(W.tp ? W.tp->outstanding(W.tp) : 0),
                       (uint64_t)W.cap};
    for (int k = 0; k < n && k < 6; k++)
        v[k] = all[k];
}
