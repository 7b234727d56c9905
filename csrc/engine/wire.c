/* wire.c -- the engine's side of the wire: which transport carries the
 * messages, the gates sends pass, the control channel of round-stamped
 * messages (ctrl.c), and the dispatch of completions back to their
 * schedules.
 *
 * Design constraints:
 *  1. Cost follows work: one transport poll per sweep covers every message
 *     of the process; a schedule is visited only when one of its messages
 *     completed.  Idle persistent schedules post nothing: their stamped
 *     receives are served by one receive per peer rank and communicator
 *     (the control channel, ctrl.c), routed by {stamp id, source, tag}.
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
#include "engine/engine_int.h"
#include "transport/pc_netem.h"

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

static struct {
    pc_transport *tp;          /* the transport in use */
    int nhot, nsends;
    int cap;                   /* sends in flight per destination; 0: any */
    int nqueued;               /* sends waiting in gates */
    sendgate *gates;           /* by destination (world rank) */
    int ngates;
    uint64_t seq;
    uint64_t nudges;           /* pc_wire_nudge calls (engine_stats) */
} wire;

/* read outside the progress lock: copies of the transport's, written
 * under it (waiters read wait_yields; the binding reads lossy before a
 * post, so it never touches a network a change is shutting down) */
static atomic_int wait_yields = 2000;
static atomic_uint lossy;

static void set_tp(pc_transport *tp)          /* prog held */
{
    wire.tp = tp;
    atomic_store(&wait_yields, tp->wait_yields);
    atomic_store(&lossy, tp == pc_transport_mpi() ? 0u : pc_netem_lossy());
}

int pc_wire_init(void)
{
    if (!wire.tp)
        set_tp(pc_transport_mpi());
    if (!wire.gates) {
        int n = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        wire.gates = calloc((size_t)n + 1, sizeof(sendgate));
        if (!wire.gates)
            return PC_ENOMEM;
        wire.ngates = n;
    }
    return PC_OK;
}

int pc_wire_hot(void) { return wire.nhot; }
int pc_wire_wait_yields(void) { return atomic_load(&wait_yields); }
int pc_wire_sends_left(void) { return wire.nsends; }
unsigned pc_wire_lossy(void) { return atomic_load(&lossy); }
int pc_wire_outstanding(void)
{
    return wire.tp ? wire.tp->outstanding(wire.tp) : 0;
}

void pc_wire_nudge(void)
{
    if (wire.tp) {
        wire.tp->nudge(wire.tp);
        wire.nudges++;
    }
}

/* messages an emulated network holds or still hands over to MPI */
int pc_wire_emulated_pending(void)
{
    pc_transport *mpi = pc_transport_mpi();
    return wire.tp && wire.tp != mpi &&
           wire.tp->outstanding(wire.tp) != mpi->outstanding(mpi);
}

double pc_wire_next_poll(void)
{
    return wire.tp ? wire.tp->next_poll(wire.tp) : HUGE_VAL;
}

const char *pc_wire_transport_name(void)
{
    return wire.tp ? wire.tp->name : "mpi";
}

int pc_wire_network_rate(int rank, int nic, double t, double *rate,
                         double *t0)
{
    return pc_netem_query(rank, nic, t, rate, t0);
}

/* pure computation on a private model: no lock, no network in use */
double pc_engine_network_model(const char *config, double t0, double t,
                               const double *msgs, int n, double now,
                               double *out, double *event, char *err,
                               int errlen)
{
    return netem_model_probe(config, t0, t, msgs, n, now, out, event, err,
                             errlen);
}

/* progress lock held, no message in flight (checked by the caller) */
int pc_wire_use_network(const char *config, char *err, int errlen)
{
    if (pc_wire_init() != PC_OK)
        return PC_ENOMEM;
    pc_transport *mpi = pc_transport_mpi();
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
                 "change it while no message is in flight");
        return PC_EBUSY;
    }
    if (wire.tp != mpi) {              /* replace an earlier emulation */
        wire.tp->shutdown(wire.tp);
        set_tp(mpi);
    }
    if (!config || !*config)
        return PC_OK;
    pc_transport *net = pc_netem_create(mpi, config, err, errlen);
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
    wire.cap = cap > 0 ? cap : 0;
    for (int p = 0; p < wire.ngates; p++)  /* a larger cap frees queued sends */
        release_gated(&wire.gates[p]);
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
    int rc = wire.tp->start(wire.tp, &m, NULL);
    if (rc != MPI_SUCCESS)
        return rc;
    wire.nhot++;
    wire.nsends++;
    atomic_fetch_add(&s->sends_left, 1);
    if (pc_tl_on)
        pc_tl_msg(PC_EV_RELEASED, -1, s->serial, op, s->round, o->wpeer,
                  o->tag, m.bytes, o->prio, 0);
    return MPI_SUCCESS;
}

static int release_one(sendgate *g);

static int release_gated(sendgate *g)
{
    while (g->n > 0 && g->inflight < wire.cap)
        release_one(g);
    return PC_OK;
}

/* a stalled gate lets one more send go (design constraint 3) */
static void unstall_gates(void)
{
    if (!wire.nqueued || !wire.tp->sends_wait)
        return;
    double now = pc_now();
    for (int p = 0; p < wire.ngates; p++) {
        sendgate *g = &wire.gates[p];
        if (g->n > 0 && now - g->t_moved > GATE_STALL)
            release_one(g);
    }
}

static int release_one(sendgate *g)
{
    gated x = gate_pop(g);
    wire.nqueued--;
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

int pc_wire_send(pc_sched *s, int op, void *buf, int count, MPI_Datatype dt,
                 int tag)
{
    pc_op *o = &s->ops[op];
    if (tag < 0)                               /* control channel */
        return transmit(s, op, buf, count, dt, s->tag_ub, op, -1);
    if (wire.cap == 0 || o->wpeer < 0 || o->wpeer >= wire.ngates)
        return transmit(s, op, buf, count, dt, tag, op, o->tclass);
    sendgate *g = &wire.gates[o->wpeer];
    gated *q = pc_grow(g->q, &g->cap, g->n + 1, sizeof(gated), 16);
    if (!q)
        return MPI_ERR_NO_MEM;
    g->q = q;
    gate_push(g, (gated){s, op, count, tag, o->prio, wire.seq++, buf, dt});
    wire.nqueued++;
    if (g->n == 1 && g->inflight >= wire.cap)
        g->t_moved = pc_now();             /* starts waiting now */
    if (pc_tl_on && g->inflight >= wire.cap)
        pc_tl_op(PC_EV_GATED, s, op, 0);
    return release_gated(g);
}

/* Drop the schedule's sends still queued in gates (never transmitted). */
void pc_wire_unhold(pc_sched *s)
{
    for (int p = 0; p < wire.ngates; p++) {
        sendgate *g = &wire.gates[p];
        int keep = 0;
        for (int k = 0; k < g->n; k++)
            if (g->q[k].s != s)
                g->q[keep++] = g->q[k];
        if (keep == g->n)
            continue;
        wire.nqueued -= g->n - keep;
        int n = keep;
        g->n = 0;
        for (int k = 0; k < n; k++)   /* re-heapify what is left */
            gate_push(g, g->q[k]);
    }
}

/* ---- receives */
int pc_wire_recv(pc_sched *s, int op, void *buf, int count, MPI_Datatype dt,
                 int tag, int64_t cookie, int64_t *handle)
{
    int size = 0;
    MPI_Type_size(dt, &size);
    pc_op *o = &s->ops[op];
    /* a discard receive (cookie < 0) takes its message into host memory */
    int space = cookie < 0 ? PC_HOST : s->slots[o->aslot].space;
    pc_msg m = {0, buf, count, dt, (int64_t)count * size, o->peer, tag,
                o->wpeer, s->comm, o->tclass, s, cookie, s->serial, s->round,
                op, o->prio, space};
    int rc = wire.tp->start(wire.tp, &m, handle);
    if (rc == MPI_SUCCESS && cookie >= 0)
        wire.nhot++;
    return rc;
}

int pc_wire_cancel_recv(int64_t handle, int hot, pc_done *d)
{
    int r = wire.tp->cancel_recv(wire.tp, handle, d);
    if (r >= 0 && hot)
        wire.nhot--;
    return r;
}

int pc_wire_start(const pc_msg *m, int64_t *handle)
{
    return wire.tp->start(wire.tp, m, handle);
}

/* ---- completions */
int pc_wire_poll(void)
{
    pc_done *d;
    int n = 0;
    if (!wire.tp)
        return 0;
    wire.tp->poll(wire.tp, &d, &n);
    unstall_gates();
    for (int k = 0; k < n; k++) {
        if (d[k].cookie == PC_COOKIE_CTRL) {
            pc_ctrl_arrived(d[k].owner, &d[k]);
            continue;
        }
        pc_sched *s = d[k].owner;
        int64_t c = d[k].cookie;
        if (c >= 0)
            wire.nhot--;
        if (d[k].send && (c & CK_GATED) && wire.gates) {
            sendgate *g = &wire.gates[s->ops[CK_OP(c)].wpeer];
            g->inflight--;
            g->t_moved = pc_now();
            release_gated(g);
        }
        pc_round_on_done(s, c >= 0 ? CK_OP(c) : c, &d[k]);
        pc_engine_queue(s);
        if (d[k].send) {
            /* last touch: a freed schedule may be released (pc_reap) as
             * soon as its sends_left reaches 0 */
            wire.nsends--;
            atomic_fetch_sub_explicit(&s->sends_left, 1,
                                      memory_order_release);
        }
    }
    return n;
}

void pc_wire_shutdown(void)
{
    pc_ctrl_shutdown();
    if (wire.tp && wire.tp != pc_transport_mpi()) {      /* leave the network */
        wire.tp->shutdown(wire.tp);
        set_tp(pc_transport_mpi());
    }
    for (int p = 0; p < wire.ngates; p++)
        free(wire.gates[p].q);
    free(wire.gates);
    wire.gates = NULL;
    wire.ngates = 0;
}

void pc_wire_stats(uint64_t *v, int n)
{
    uint64_t foreign, unclaimed, posted;
    pc_ctrl_stats(&foreign, &unclaimed, &posted);
    uint64_t all[8] = {foreign, unclaimed, (uint64_t)wire.nhot,
                       (uint64_t)wire.nsends,
                       (uint64_t)(wire.tp ? wire.tp->outstanding(wire.tp) : 0),
                       (uint64_t)wire.cap, posted, wire.nudges};
    for (int k = 0; k < n && k < 8; k++)
        v[k] = all[k];
}
