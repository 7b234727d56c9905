/* round.c -- executing a schedule's rounds: readiness, starting ops,
 * arming and finishing rounds, stamped fires (their delivery to an op, as
 * a stamped message's: ctrl.c).  Semantics in sched/pc_sched.h; ops in
 * flight (device work, completions, deadlines) are in inflight.c.
 *
 * Everything here runs with the engine's progress lock held, by the
 * progress thread or by an application thread that drives progress while it
 * waits.  Messages, timers and gates are put in motion through the wire
 * (wire.c), the timers (timers.c) and the gate list (wait.c), which call
 * back pc_round_on_done / pc_round_on_timer (inflight.c). */
#include "engine/engine_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ready ops: a binary heap ordered by (prio, index) */
static int before(const pc_sched *s, int a, int b)
{
    int pa = s->ops[a].prio, pb = s->ops[b].prio;
    return pa < pb || (pa == pb && a < b);
}

static void heap_push(pc_sched *s, int i)
{
    int k = s->nheap++;
    while (k > 0) {
        int up = (k - 1) / 2;
        if (!before(s, i, s->heap[up]))
            break;
        s->heap[k] = s->heap[up];
        k = up;
    }
    s->heap[k] = i;
}

static int heap_pop(pc_sched *s)
{
    int top = s->heap[0], last = s->heap[--s->nheap], k = 0;
    for (;;) {
        int c = 2 * k + 1;
        if (c >= s->nheap)
            break;
        if (c + 1 < s->nheap && before(s, s->heap[c + 1], s->heap[c]))
            c++;
        if (!before(s, s->heap[c], last))
            break;
        s->heap[k] = s->heap[c];
        k = c;
    }
    if (s->nheap)
        s->heap[k] = last;
    return top;
}

/* Ops that wait on something outside the schedule (a message, a timer, the
 * application, the device) have their completion time recorded; a local
 * op ends at its last input's time: not worth a clock read per NOP. */
static int waits_outside(int kind)
{
    return kind == PC_SEND || kind == PC_RECV || kind == PC_DELAY ||
           kind == PC_START_AT || kind == PC_GATE || kind == PC_FENCE;
}

static void ready(pc_sched *s, int i, int skip)
{
    pc_op *op = &s->ops[i];
    op->state = OP_ACTIVE;
    op->skip = skip;
    if (op->prslot >= 0)        /* this round's priority (see pc_sched.h) */
        op->prio = (int)*(int64_t *)pc_addr(s, op->prslot, op->proff);
    heap_push(s, i);
    if (pc_tl_on)
        pc_tl_op(PC_EV_READY, s, i, 0);
}

void pc_round_complete(pc_sched *s, int i, int oc)
{
    pc_op *op = &s->ops[i];
    op->state = OP_DONE;
    op->outcome = oc;
    op->t_done = waits_outside(op->kind) ? pc_now() : 0.0;
    s->touched = 1;
    if (!(op->flags & PC_F_OPTIONAL))
        s->required_left--;
    if (pc_tl_on)
        pc_tl_op(PC_EV_COMPLETE, s, i, oc);
    for (int k = 0; k < op->nsucc; k++) {
        int j = op->succ[k];
        pc_op *n = &s->ops[j];
        n->ndone++;
        if (oc == PC_OC_OK)
            n->nok++;
        else
            n->nfail++;
        int delivered_only = n->flags & PC_F_DELIVERED;
        int got = delivered_only ? n->nok : n->ndone;
        if (n->state == OP_IDLE) {
            if (got == n->need)
                ready(s, j, 0);
            else if (delivered_only && n->ndeps - n->nfail < n->need)
                ready(s, j, 1);        /* can no longer fire: skip it */
        } else if (got > n->need) {
            atomic_fetch_add(&s->surplus, 1);
        }
    }
}

/* "rank 3" or "ranks 1, 3" (and how many more) into buf */
static void list_ranks(char *buf, size_t cap, const int *r, int n, int known)
{
    int w = snprintf(buf, cap, "rank%s", n > 1 ? "s" : "");
    for (int k = 0; k < known && w > 0 && (size_t)w < cap; k++)
        w += snprintf(buf + w, cap - (size_t)w, "%s %d", k ? "," : "", r[k]);
    if (n > known && w > 0 && (size_t)w < cap)
        snprintf(buf + w, cap - (size_t)w, " and %d more", n - known);
}

void pc_round_rank_failed(pc_sched *s, const char *what)
{
    int max = (int)(sizeof s->failed / sizeof s->failed[0]);
    char who[128] = "a rank";
    pc_transport_revoke(s->comm);
    s->nfailed = pc_transport_failed_ranks(s->comm, s->failed, max);
    if (s->nfailed > 0)
        list_ranks(who, sizeof who, s->failed, s->nfailed,
                   s->nfailed < max ? s->nfailed : max);
    pc_sched_set_error(s, PC_EFAILED, "%s of the communicator failed: %s",
                       who, what);
}

void pc_round_mpi_failure(pc_sched *s, int i, const char *what, int code)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0, cls = 0;
    pc_op *op = &s->ops[i];
    MPI_Error_string(code, msg, &len);
    if (pc_transport_is_failure(code)) {
        /* this round can end nowhere */
        char detail[MPI_MAX_ERROR_STRING + 128];
        snprintf(detail, sizeof detail, "%s (op %d: %s, peer %d) in round "
                 "%llu: %s", what, i, pc_kind_names[op->kind], op->peer,
                 (unsigned long long)s->round, msg);
        pc_round_rank_failed(s, detail);
        return;
    }
    MPI_Error_class(code, &cls);
    if (cls == MPI_ERR_NO_MEM)
        snprintf(msg, sizeof msg, "out of memory");
    pc_sched_set_error(s, cls == MPI_ERR_NO_MEM ? PC_ENOMEM : PC_EMPI,
                       "%s: op %d (%s %s rank %d, tag %d, %lld "
                       "bytes) in round %llu: %s", what, i,
                       pc_kind_names[op->kind],
                       op->kind == PC_SEND ? "to" : "from", op->peer,
                       op->tag, (long long)(op->count *
                                            pc_dtypes[op->dtype].size),
                       (unsigned long long)s->round, msg);
}

static double param_seconds(pc_sched *s, pc_op *op)
{
    if (op->pslot >= 0)
        return *(double *)pc_addr(s, op->pslot, op->poff);
    return 1e-9 * (double)op->value_ns;
}

/* ---- sends: the counter gate, then the wire (cap gate, transport) */
static int release_send(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    int rc = pc_wire_send(s, i, pc_addr(s, op->aslot, op->aoff),
                          (int)op->count, pc_mpi_dtype(op->dtype, PC_SUM),
                          op->tag + s->tag_base);
    if (rc != MPI_SUCCESS) {
        pc_round_mpi_failure(s, i, "send failed", rc);
        return PC_EMPI;
    }
    return PC_OK;
}

/* Release the held sends to `peer` whose turn has come. */
static int release_held(pc_sched *s, int peer)
{
    for (int found = 1; found;) {
        found = 0;
        for (int k = 0; k < s->nheld; k++) {
            pc_op *op = &s->ops[s->held[k]];
            if (op->peer != peer || op->cur_order != s->next_order[peer])
                continue;
            int i = s->held[k];
            s->held[k] = s->held[--s->nheld];
            s->next_order[peer]++;
            if (release_send(s, i) != PC_OK)
                return PC_EMPI;
            found = 1;
            break;
        }
    }
    return PC_OK;
}

static int start_send(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    s->inflight++;
    if (op->flags & PC_F_STAMPED) {
        /* the header, then the data copied behind it (the message leaves
         * from op memory: the buffer is free again at once) */
        uint64_t *m = op->stampbuf ? op->stampbuf : op->stamp;
        int64_t bytes = op->count ? op->count * pc_dtypes[op->dtype].size
                                  : 0;
        m[0] = s->stamp_id;
        m[1] = s->round;
        m[2] = (uint64_t)op->tag;
        m[3] = (uint64_t)bytes;
        int hw = PC_STAMP_HEADER / 8;
        if (bytes)
            memcpy(m + hw, pc_addr(s, op->aslot, op->aoff), (size_t)bytes);
        int rc = pc_wire_send(s, i, m, hw + (int)((bytes + 7) / 8),
                              MPI_UINT64_T, -1);
        if (rc != MPI_SUCCESS) {
            pc_round_mpi_failure(s, i, "stamped send failed", rc);
            return PC_EMPI;
        }
        return PC_OK;
    }
    op->cur_order = op->pslot >= 0 ? *(int64_t *)pc_addr(s, op->pslot, op->poff)
                                   : op->order;
    if (op->cur_order < 0)
        return release_send(s, i);
    s->held[s->nheld++] = i;
    if (pc_tl_on && op->cur_order != s->next_order[op->peer])
        pc_tl_op(PC_EV_GATED, s, i, 0);
    return release_held(s, op->peer);
}

static int start_recv(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    if (op->timeout_ns >= 0)
        op->t_ready = pc_now();
    s->inflight++;
    int rc = pc_wire_recv(s, i, pc_addr(s, op->aslot, op->aoff),
                          (int)op->count, pc_mpi_dtype(op->dtype, PC_SUM),
                          op->tag + s->tag_base, i, &op->req);
    if (rc != MPI_SUCCESS) {
        pc_round_mpi_failure(s, i, "receive failed", rc);
        return PC_EMPI;
    }
    if (op->timeout_ns >= 0)
        return pc_timers_add(s, i, op->t_ready + 1e-9 * op->timeout_ns);
    return PC_OK;
}

/* A reduce, copy or scale does nothing when a direct RECV predecessor that
 * ran this round was not delivered. */
static int recv_input_failed(pc_sched *s, pc_op *op)
{
    for (int k = 0; k < op->ndeps; k++) {
        pc_op *p = &s->ops[op->pred[k]];
        if (p->kind == PC_RECV && p->state == OP_DONE &&
            p->outcome != PC_OC_OK)
            return 1;
    }
    return 0;
}

static int start_local(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    if (recv_input_failed(s, op)) {
        pc_round_complete(s, i, PC_OC_SKIPPED);
        return PC_OK;
    }
    if (pc_round_is_device_op(s, op))
        return pc_round_start_device(s, i);
    if (op->kind == PC_REDUCE && op->count) {
        int rc = pc_reduce_local(pc_addr(s, op->bslot, op->boff),
                                 pc_addr(s, op->aslot, op->aoff), op->count,
                                 op->dtype, op->redop);
        if (rc != MPI_SUCCESS) {
            pc_round_mpi_failure(s, i, "local reduction failed", rc);
            return PC_EMPI;
        }
    } else if (op->kind == PC_COPY && (op->flags & PC_F_FILL)) {
        pc_fill(pc_addr(s, op->aslot, op->aoff),
                pc_addr(s, op->bslot, op->boff), op->count,
                pc_dtypes[op->dtype].size);
    } else if (op->kind == PC_COPY && op->count) {
        memmove(pc_addr(s, op->aslot, op->aoff), pc_addr(s, op->bslot, op->boff),
                (size_t)(op->count * pc_dtypes[op->dtype].size));
    } else if (op->kind == PC_SCALE) {
        int n = s->ops[op->ref].nok + op->add;
        if (n <= 0) {
            pc_round_complete(s, i, PC_OC_SKIPPED);
            return PC_OK;
        }
        pc_scale(pc_addr(s, op->aslot, op->aoff), op->count, op->dtype, n);
    }
    pc_round_complete(s, i, PC_OC_OK);
    return PC_OK;
}

static int start_callback(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    char err[256] = "";
    if (recv_input_failed(s, op)) {
        pc_round_complete(s, i, PC_OC_SKIPPED);
        return PC_OK;
    }
    pc_callback_fn fn = pc_sched_callback(op->redop);   /* checked built */
    int rc = fn(pc_addr(s, op->aslot, op->aoff),
                op->count * pc_dtypes[op->dtype].size,
                pc_addr(s, op->bslot, op->boff), op->bbytes, op->arg, err,
                sizeof err);
    if (rc == PC_CALLBACK_DECLINE) {
        pc_round_complete(s, i, PC_OC_SKIPPED);
        return PC_OK;
    }
    if (rc != 0) {
        pc_sched_set_error(s, PC_EINVAL, "op %d (callback) in round %llu: "
                           "%s", i, (unsigned long long)s->round,
                           err[0] ? err : "failed");
        return PC_EINVAL;
    }
    pc_round_complete(s, i, PC_OC_OK);
    return PC_OK;
}

static int start_timed(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    op->t_ready = pc_now();
    double v = param_seconds(s, op);
    if (!isfinite(v)) {     /* from a slot: NaN would never come due */
        pc_sched_set_error(s, PC_EINVAL, "op %d: its %s read from its slot "
                           "is %g, not a finite number", i,
                           op->kind == PC_DELAY ? "seconds" : "time", v);
        return PC_EINVAL;
    }
    double when = op->kind == PC_DELAY ? op->t_ready + v : v;
    if (when <= op->t_ready) {
        pc_round_complete(s, i, PC_OC_OK);
        return PC_OK;
    }
    return pc_timers_add(s, i, when);
}

static int start(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    op->tgen++;
    if (pc_tl_on)
        pc_tl_op(PC_EV_START, s, i, 0);
    if (op->skip) {
        pc_round_complete(s, i, PC_OC_SKIPPED);
        return PC_OK;
    }
    switch (op->kind) {
    case PC_NOP:
        pc_round_complete(s, i, PC_OC_OK);
        return PC_OK;
    case PC_FENCE:
        if (s->has_devq)
            return pc_round_start_device(s, i);
        pc_round_complete(s, i, PC_OC_OK);
        return PC_OK;
    case PC_SEND:
        return start_send(s, i);
    case PC_RECV:
        return start_recv(s, i);
    case PC_REDUCE:
    case PC_COPY:
    case PC_SCALE:
        return start_local(s, i);
    case PC_CALLBACK:
        return start_callback(s, i);
    case PC_DELAY:
    case PC_START_AT:
        return start_timed(s, i);
    case PC_GATE:
        pc_engine_gate_ready(s, i);
        return PC_OK;
    default:
        pc_sched_set_error(s, PC_EINVAL, "op %d: kind %d cannot be started",
                           i, op->kind);
        return PC_EINVAL;
    }
}

/* Start ready ops, lowest (prio, index) first.  A LOCKED op runs only if the
 * data lock can be taken now; otherwise it waits (deferred) and the engine
 * visits the schedule again, so the application's hold never stalls the
 * progress of other schedules. */
int pc_round_run_ready(pc_sched *s)
{
    int n = 0, rc = PC_OK;
    while (s->nheap > 0 && rc == PC_OK) {
        int i = heap_pop(s);
        if (!(s->ops[i].flags & PC_F_LOCKED)) {
            rc = start(s, i);
            n++;
            continue;
        }
        if (pthread_mutex_trylock(&s->data_mtx) != 0) {
            s->defer[s->ndefer++] = i;
            continue;
        }
        rc = start(s, i);
        n++;
        while (rc == PC_OK && s->nheap > 0 &&
               (s->ops[s->heap[0]].flags & PC_F_LOCKED)) {
            rc = start(s, heap_pop(s));
            n++;
        }
        pthread_mutex_unlock(&s->data_mtx);
    }
    s->lock_deferred = s->ndefer > 0;
    if (s->lock_deferred)
        atomic_store(&s->unlock_wakes, 1);  /* unlock() should wake us */
    while (s->ndefer > 0)
        heap_push(s, s->defer[--s->ndefer]);
    return rc == PC_OK ? n : -1;
}

/* ---- arming a round (its banked stamped messages delivered) */
static void arm(pc_sched *s)
{
    s->armed = 1;
    s->touched = 0;
    s->required_left = 0;
    s->nheap = s->ndefer = s->nheld = 0;
    memset(s->next_order, 0, (size_t)s->comm_size * sizeof(int64_t));
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        op->ndone = op->nok = op->nfail = 0;
        op->state = OP_IDLE;
        op->outcome = PC_OC_NONE;
        op->t_arrive = op->t_wire = 0;
        op->skip = 0;
        if (!(op->flags & PC_F_OPTIONAL))
            s->required_left++;
    }
    if (pc_tl_on)
        pc_tl_op(PC_EV_ROUND, s, -1, 0);
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        int stamped_recv = op->kind == PC_RECV && (op->flags & PC_F_STAMPED);
        if (op->ndeps == 0 && op->kind != PC_TRIGGER && !stamped_recv)
            ready(s, i, 0);
        if (stamped_recv && op->nbank) {   /* banked messages of this round */
            size_t b = op->count ? (size_t)op->count *
                                       pc_dtypes[op->dtype].size : 0;
            int keep = 0;
            for (int k = 0; k < op->nbank; k++) {
                if (op->bank[k] <= s->round) {
                    pc_round_deliver(s, i, op->bank[k],
                                     b ? op->bankdata + k * b : NULL,
                                     (int64_t)b);
                } else {
                    if (b && keep != k)
                        memcpy(op->bankdata + keep * b, op->bankdata + k * b,
                               b);
                    op->bank[keep++] = op->bank[k];
                }
            }
            op->nbank = keep;
        }
    }
}

/* A receive that took a message: the transport's arrival stamp, or where
 * it has none (plain MPI, activation messages) the completion time. */
static double arrival(const pc_op *op)
{
    if (op->kind != PC_RECV ||
        (op->outcome != PC_OC_OK && op->outcome != PC_OC_DROPPED))
        return 0.0;
    return op->t_arrive > 0 ? op->t_arrive : op->t_done;
}

static void finish_round(pc_sched *s)
{
    s->armed = 0;
    pthread_mutex_lock(&s->fire_mtx);
    for (int i = 0; i < s->nops; i++) {
        s->last_outcome[i] = (uint8_t)s->ops[i].outcome;
        s->last_nok[i] = s->ops[i].nok;
        s->last_t[i] = s->ops[i].outcome ? s->ops[i].t_done : 0.0;
        s->last_arrive[i] = arrival(&s->ops[i]);
        s->last_wire[i] = s->last_arrive[i] > 0 ? s->ops[i].t_wire : 0.0;
    }
    s->last_round_ok = s->round;
    pthread_mutex_unlock(&s->fire_mtx);
    s->round++;
    atomic_store_explicit(&s->done, s->round, memory_order_release);
}

/* Absorb the application's trigger fires. */
static int absorb_fires(pc_sched *s)
{
    int n = 0;
    for (int k = 0; k < s->ntriggers; k++) {
        pc_op *op = &s->ops[s->triggers[k]];
        if (op->state == OP_IDLE && atomic_load(&op->fires) > op->fires_used) {
            op->fires_used++;
            pc_round_complete(s, s->triggers[k], PC_OC_OK);
            n++;
        }
    }
    if (atomic_load(&s->nsfire)) {
        pthread_mutex_lock(&s->fire_mtx);
        int keep = 0;
        for (int k = 0; k < s->nsfire; k++) {
            pc_op_round f = s->sfire[k];
            if (f.round > s->round || (f.round == s->round && !s->armed)) {
                s->sfire[keep++] = f;
            } else {
                pc_round_deliver(s, f.op, f.round, NULL, 0);
                n++;
            }
        }
        s->nsfire = keep;
        pthread_mutex_unlock(&s->fire_mtx);
    }
    return n;
}

/* One step of progress.  Returns >0 when anything happened, 0 when nothing
 * did, <0 on error (recorded in s->error). */
int pc_round_progress(pc_sched *s)
{
    int progressed = 0;
    if (atomic_load(&s->error) != PC_OK)
        return -1;
    if (s->cleaned)
        return 0;
    s->again = 0;
    for (int iter = 0; iter < 64; iter++) {
        int n = 0, r;
        if (iter == 63)
            s->again = 1;           /* more to do: visit again next sweep */
        if (!s->armed) {
            if (!s->persistent && atomic_load(&s->posted) <= s->round)
                break;
            arm(s);
            n++;
        }
        n += absorb_fires(s);
        if ((r = pc_round_run_ready(s)) < 0)
            return -1;
        n += r;
        if (atomic_load(&s->error) != PC_OK)
            return -1;
        if (s->armed && s->required_left == 0 && s->inflight == 0) {
            finish_round(s);
            n++;
        }
        if (!n)
            break;
        progressed += n;
    }
    return progressed;
}

/* Is a round in flight or about to start?  Quiet means: nothing in flight,
 * nothing of the armed round has happened, and no fire or early message is
 * waiting for a later round. */
int pc_round_busy(pc_sched *s)
{
    if (s->inflight > 0 || (s->armed && s->touched) ||
        atomic_load(&s->nsfire) > 0)
        return 1;
    if (!s->persistent && atomic_load(&s->posted) > atomic_load(&s->done))
        return 1;
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        if (op->nbank > 0 || atomic_load(&op->fires) > op->fires_used)
            return 1;
    }
    return 0;
}
