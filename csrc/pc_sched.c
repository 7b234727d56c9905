/* pc_sched.c -- building, validating and executing one schedule.
 * Semantics are documented in pc_sched.h.  Everything below pc_sched_bind runs
 * with the engine's progress lock held, by the progress thread or by an
 * application thread that drives progress while it waits. */
#include "pc_sched.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_IDLE = 0, OP_ACTIVE = 1, OP_DONE = 2 };

#define FAIL(code, ...)                                   \
    do {                                                  \
        snprintf(err, errlen, __VA_ARGS__);               \
        rc = (code);                                      \
        goto out;                                         \
    } while (0)

static int uses_a(int kind)
{
    return kind == PC_SEND || kind == PC_RECV || kind == PC_REDUCE ||
           kind == PC_COPY;
}

static int writes_a(int kind)
{
    return kind == PC_RECV || kind == PC_REDUCE || kind == PC_COPY;
}

/* Kahn's algorithm: returns 1 when the graph has a cycle. */
static int has_cycle(pc_sched *s, const int64_t *desc)
{
    int n = s->nops, head = 0, tail = 0, seen = 0, rc = 1;
    int *indeg = calloc((size_t)n + 1, sizeof(int));
    int *queue = malloc(((size_t)n + 1) * sizeof(int));
    if (!indeg || !queue)
        goto out;
    for (int i = 0; i < n; i++) {
        indeg[i] = (int)desc[i * PC_DESC_LEN + PC_D_NDEPS];
        if (indeg[i] == 0)
            queue[tail++] = i;
    }
    while (head < tail) {
        pc_op *op = &s->ops[queue[head++]];
        seen++;
        for (int k = 0; k < op->nsucc; k++)
            if (--indeg[op->succ[k]] == 0)
                queue[tail++] = op->succ[k];
    }
    rc = seen != n;
out:
    free(indeg);
    free(queue);
    return rc;
}

int pc_sched_create(const int64_t *desc, int nops, const int64_t *deps,
                    int64_t ndeps, int nslots, MPI_Comm comm, int persistent,
                    uint64_t stamp_id, pc_sched **out, char *err,
                    size_t errlen)
{
    int rc = PC_OK, size = 0, tag_ub_flag = 0, *tag_ub = NULL;
    pc_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return PC_ENOMEM;
    s->nops = nops;
    s->nslots = nslots;
    s->persistent = persistent;
    s->stamp_id = stamp_id;
    s->comm = comm;
    s->tp = &pc_transport_mpi;
    pthread_mutex_init(&s->fire_mtx, NULL);
    pthread_mutex_init(&s->data_mtx, NULL);
    if (nops < 0 || nslots < 0 || ndeps < 0)
        FAIL(PC_EINVAL, "negative sizes");
    s->ops = calloc((size_t)nops + 1, sizeof(pc_op));
    s->slots = calloc((size_t)nslots + 1, sizeof(pc_slot));
    s->succ = malloc(((size_t)ndeps + 1) * sizeof(int));
    s->ready = malloc(((size_t)nops + 1) * sizeof(int));
    s->triggers = malloc(((size_t)nops + 1) * sizeof(int));
    if (!s->ops || !s->slots || !s->succ || !s->ready || !s->triggers)
        FAIL(PC_ENOMEM, "out of memory");
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS)
        FAIL(PC_EINVAL, "invalid communicator");
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &tag_ub_flag);
    s->tag_ub = tag_ub_flag ? *tag_ub : 32767;

    for (int i = 0; i < nops; i++) {
        const int64_t *d = desc + (size_t)i * PC_DESC_LEN;
        pc_op *op = &s->ops[i];
        op->kind = (int)d[PC_D_KIND];
        op->mode = (int)d[PC_D_MODE];
        op->flags = (int)d[PC_D_FLAGS];
        op->aslot = (int)d[PC_D_ASLOT];
        op->aoff = d[PC_D_AOFF];
        op->bslot = (int)d[PC_D_BSLOT];
        op->boff = d[PC_D_BOFF];
        op->count = d[PC_D_COUNT];
        op->dtype = (int)d[PC_D_DTYPE];
        op->redop = (int)d[PC_D_REDOP];
        op->peer = (int)d[PC_D_PEER];
        op->tag = (int)d[PC_D_TAG];
        op->prio = (int)d[PC_D_PRIO];
        op->ndeps = (int)d[PC_D_NDEPS];
        if (op->kind < 0 || op->kind >= PC_NKINDS)
            FAIL(PC_EINVAL, "op %d: unknown kind %d", i, op->kind);
        if (op->kind == PC_CALLBACK)
            FAIL(PC_EINVAL, "op %d: callback ops are not supported yet", i);
        if (op->mode == PC_ALL)
            op->need = op->ndeps;
        else if (op->mode == PC_ANY)
            op->need = 1;
        else if (op->mode == PC_ATLEAST)
            op->need = (int)d[PC_D_NEED];
        else
            FAIL(PC_EINVAL, "op %d: dependency mode must be ALL, ANY or "
                 "ATLEAST", i);
        if (op->ndeps && (op->need < 1 || op->need > op->ndeps))
            FAIL(PC_EINVAL, "op %d: needs %d of %d inputs", i, op->need,
                 op->ndeps);
        if ((op->flags & PC_F_LOCKED) && op->kind != PC_NOP &&
            op->kind != PC_REDUCE && op->kind != PC_COPY)
            FAIL(PC_EINVAL, "op %d: only nop, reduce and copy can be locked",
                 i);
        if (op->ndeps < 0 || d[PC_D_DEPOFF] < 0 ||
            d[PC_D_DEPOFF] + op->ndeps > ndeps)
            FAIL(PC_EINVAL, "op %d: dependency list out of range", i);
        if (op->kind == PC_TRIGGER && op->ndeps)
            FAIL(PC_EINVAL, "op %d: a trigger cannot have dependencies", i);
        if (op->flags & PC_F_STAMPED) {
            if (op->kind != PC_SEND && op->kind != PC_RECV)
                FAIL(PC_EINVAL, "op %d: only send/recv can be stamped", i);
            if (op->count != 0)
                FAIL(PC_EINVAL, "op %d: stamped messages carry no data", i);
            if (op->kind == PC_RECV && op->ndeps)
                FAIL(PC_EINVAL, "op %d: a stamped recv has no dependencies", i);
        }
        if (uses_a(op->kind)) {
            if (op->count < 0 || op->count > INT_MAX)
                FAIL(PC_EINVAL, "op %d: count %lld out of range", i,
                     (long long)op->count);
            if (op->dtype < 0 || op->dtype >= PC_NDTYPES)
                FAIL(PC_EINVAL, "op %d: unknown dtype %d", i, op->dtype);
            if (!(op->flags & PC_F_STAMPED) &&
                (op->aslot < 0 || op->aslot >= nslots || op->aoff < 0))
                FAIL(PC_EINVAL, "op %d: buffer slot %d out of range", i,
                     op->aslot);
        }
        if ((op->kind == PC_REDUCE || op->kind == PC_COPY) &&
            (op->bslot < 0 || op->bslot >= nslots || op->boff < 0))
            FAIL(PC_EINVAL, "op %d: source slot %d out of range", i, op->bslot);
        if (op->kind == PC_REDUCE && !pc_redop_valid(op->redop, op->dtype))
            FAIL(PC_EINVAL, "op %d: reduction %s is not defined for %s", i,
                 op->redop >= 0 && op->redop < PC_NREDOPS
                     ? pc_redop_names[op->redop] : "?",
                 pc_dtypes[op->dtype].name);
        if (op->kind == PC_SEND || op->kind == PC_RECV) {
            if (op->peer < 0 || op->peer >= size)
                FAIL(PC_EINVAL, "op %d: peer %d not in communicator of size %d",
                     i, op->peer, size);
            if (op->tag < 0 || (tag_ub_flag && op->tag > *tag_ub))
                FAIL(PC_EINVAL, "op %d: tag %d outside [0, MPI_TAG_UB]", i,
                     op->tag);
        }
        if ((op->kind == PC_SEND || op->kind == PC_RECV) &&
            !(op->flags & PC_F_STAMPED) && op->tag > s->max_tag)
            s->max_tag = op->tag;
        if (op->kind == PC_TRIGGER)
            s->triggers[s->ntriggers++] = i;
        if (op->kind == PC_RECV && (op->flags & PC_F_STAMPED))
            s->has_stamped_recv = 1;
    }
    /* successor lists: count, then fill */
    int *nsucc = calloc((size_t)nops + 1, sizeof(int));
    if (!nsucc)
        FAIL(PC_ENOMEM, "out of memory");
    for (int i = 0; i < nops; i++) {
        const int64_t *d = desc + (size_t)i * PC_DESC_LEN;
        for (int k = 0; k < s->ops[i].ndeps; k++) {
            int64_t p = deps[d[PC_D_DEPOFF] + k];
            if (p < 0 || p >= nops || p == i) {
                free(nsucc);
                FAIL(PC_EINVAL, "op %d: bad dependency on op %lld", i,
                     (long long)p);
            }
            nsucc[p]++;
        }
    }
    int64_t off = 0;
    for (int i = 0; i < nops; i++) {
        s->ops[i].succ = s->succ + off;
        off += nsucc[i];
    }
    free(nsucc);
    for (int i = 0; i < nops; i++) {
        const int64_t *d = desc + (size_t)i * PC_DESC_LEN;
        for (int k = 0; k < s->ops[i].ndeps; k++) {
            pc_op *p = &s->ops[deps[d[PC_D_DEPOFF] + k]];
            p->succ[p->nsucc++] = i;
        }
    }
    if (has_cycle(s, desc))
        FAIL(PC_EINVAL, "the dependency graph has a cycle");
out:
    if (rc != PC_OK) {
        pc_sched_destroy(s);
        s = NULL;
    }
    *out = s;
    return rc;
}

int pc_sched_bind(pc_sched *s, int slot, void *ptr, int64_t len, int writable,
                  int space)
{
    if (slot < 0 || slot >= s->nslots || (space != PC_HOST &&
                                          space != PC_DEVICE))
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->slots[slot] = (pc_slot){ptr, len, writable, 1, space};
    return PC_OK;
}

/* Forget a slot's buffer (between rounds), so that nothing the caller
 * passed stays referenced; posting again needs a new bind. */
int pc_sched_unbind(pc_sched *s, int slot)
{
    if (slot < 0 || slot >= s->nslots)
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->slots[slot] = (pc_slot){0};
    return PC_OK;
}

int pc_sched_set_device(pc_sched *s, int backend, void *ctx, void *stream,
                        const int64_t *kernels, int nkernels, char *err,
                        size_t errlen)
{
    if (!pc_sched_idle(s)) {
        snprintf(err, errlen, "cannot change the device queue while a round "
                 "runs");
        return PC_EBUSY;
    }
    if (pc_devq_init(&s->dq, backend, ctx, stream, kernels, nkernels) < 0) {
        snprintf(err, errlen, "%s", s->dq.err);
        s->has_devq = 0;
        return PC_EDEVICE;
    }
    s->has_devq = 1;
    return PC_OK;
}

int pc_sched_set_tag_base(pc_sched *s, int base)
{
    if (base < 0 || (int64_t)base + s->max_tag > s->tag_ub)
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->tag_base = base;
    return PC_OK;
}

/* Called before each post: every op's byte range must lie in its slot. */
int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen)
{
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        int64_t bytes = op->count * pc_dtypes[op->dtype].size;
        if (!uses_a(op->kind) || (op->flags & PC_F_STAMPED))
            continue;
        pc_slot *a = &s->slots[op->aslot];
        if (!a->bound) {
            snprintf(err, errlen, "op %d: buffer slot %d is not bound", i,
                     op->aslot);
            return PC_EINVAL;
        }
        if (op->aoff + bytes > a->len) {
            snprintf(err, errlen,
                     "op %d: needs bytes [%lld, %lld) of slot %d, which has "
                     "%lld", i, (long long)op->aoff, (long long)(op->aoff + bytes),
                     op->aslot, (long long)a->len);
            return PC_EINVAL;
        }
        if (writes_a(op->kind) && !a->writable) {
            snprintf(err, errlen, "op %d: slot %d is read-only but the op "
                     "writes to it", i, op->aslot);
            return PC_EINVAL;
        }
        if (op->kind == PC_REDUCE || op->kind == PC_COPY) {
            pc_slot *b = &s->slots[op->bslot];
            if (!b->bound || op->boff + bytes > b->len) {
                snprintf(err, errlen, "op %d: source slot %d is unbound or "
                         "too small", i, op->bslot);
                return PC_EINVAL;
            }
            if (op->kind == PC_REDUCE && a->space != b->space) {
                snprintf(err, errlen, "op %d: a reduction cannot mix host and "
                         "device memory (slots %d and %d)", i, op->aslot,
                         op->bslot);
                return PC_EINVAL;
            }
            if ((a->space == PC_DEVICE || b->space == PC_DEVICE) &&
                !s->has_devq) {
                snprintf(err, errlen, "op %d: device memory in a schedule "
                         "with no device queue", i);
                return PC_EINVAL;
            }
        }
    }
    return PC_OK;
}

int pc_sched_idle(pc_sched *s)
{
    if (s->persistent)
        return atomic_load(&s->posted) == 0;
    return atomic_load(&s->posted) == atomic_load(&s->done);
}

static void set_error(pc_sched *s, int code, const char *what, int mpirc)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->error_claimed, &expected, 1))
        return;                    /* the first error wins */
    char mpimsg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (mpirc != MPI_SUCCESS)
        MPI_Error_string(mpirc, mpimsg, &len);
    snprintf(s->errmsg, sizeof(s->errmsg), "%s (round %llu): %s", what,
             (unsigned long long)s->round, mpimsg);
    atomic_store(&s->error, code); /* publish only once the message is there */
}

static void set_device_error(pc_sched *s, const char *what)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->error_claimed, &expected, 1))
        return;
    snprintf(s->errmsg, sizeof(s->errmsg), "%s (round %llu): %s", what,
             (unsigned long long)s->round, s->dq.err);
    atomic_store(&s->error, PC_EDEVICE);
}

static int add_dev(pc_sched *s, int op, uintptr_t ev)
{
    if (s->ndev == s->capdev) {
        int cap = s->capdev ? 2 * s->capdev : 16;
        int *o = realloc(s->dev_op, (size_t)cap * sizeof(int));
        if (o)
            s->dev_op = o;
        uintptr_t *e = realloc(s->dev_ev, (size_t)cap * sizeof(uintptr_t));
        if (e)
            s->dev_ev = e;
        if (!o || !e)
            return PC_ENOMEM;
        s->capdev = cap;
    }
    s->dev_op[s->ndev] = op;
    s->dev_ev[s->ndev++] = ev;
    return PC_OK;
}

static int add_req(pc_sched *s, int op, MPI_Request req)
{
    if (s->nreq == s->capreq) {
        int cap = s->capreq ? 2 * s->capreq : 16;
        MPI_Request *r = realloc(s->reqs, (size_t)cap * sizeof(*r));
        if (r)
            s->reqs = r;
        int *o = realloc(s->req_op, (size_t)cap * sizeof(int));
        if (o)
            s->req_op = o;
        int *x = realloc(s->indices, (size_t)cap * sizeof(int));
        if (x)
            s->indices = x;
        if (!r || !o || !x)
            return PC_ENOMEM;
        s->capreq = cap;
    }
    s->reqs[s->nreq] = req;
    s->req_op[s->nreq++] = op;
    return PC_OK;
}

static void push_ready(pc_sched *s, int i) { s->ready[s->nready++] = i; }

static void complete(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    op->state = OP_DONE;
    s->touched = 1;
    if (!(op->flags & PC_F_OPTIONAL))
        s->required_left--;
    /* pushed last to first so that they start in index order */
    for (int k = op->nsucc - 1; k >= 0; k--) {
        pc_op *n = &s->ops[op->succ[k]];
        n->ndone++;
        /* an ANY op fires on its first input; later inputs of the same round
         * are surplus and consumed here without effect */
        if (n->state == OP_IDLE && n->ndone == n->need) {
            n->state = OP_ACTIVE;
            push_ready(s, op->succ[k]);
        } else if (n->ndone > n->need) {
            atomic_fetch_add(&s->surplus, 1);
        }
    }
}

static void *addr(pc_sched *s, int slot, int64_t off)
{
    return (char *)s->slots[slot].ptr + off;
}

static int is_device_op(pc_sched *s, pc_op *op)
{
    return (op->kind == PC_COPY || op->kind == PC_REDUCE) &&
           (s->slots[op->aslot].space == PC_DEVICE ||
            s->slots[op->bslot].space == PC_DEVICE);
}

static void complete(pc_sched *s, int i);

/* Queue a device op (or a fence) and put it in flight; a LOCKED one is run
 * to completion here, inside the caller's hold of the data lock. */
static int start_device(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    uintptr_t ev = 0;
    int rc = 0;
    if (op->kind == PC_COPY && op->count)
        rc = pc_dev_copy(&s->dq, addr(s, op->aslot, op->aoff),
                         s->slots[op->aslot].space,
                         addr(s, op->bslot, op->boff),
                         s->slots[op->bslot].space,
                         (size_t)(op->count * pc_dtypes[op->dtype].size));
    else if (op->kind == PC_REDUCE && op->count)
        rc = pc_dev_reduce(&s->dq, addr(s, op->aslot, op->aoff),
                           addr(s, op->bslot, op->boff), op->count, op->dtype,
                           op->redop);
    if (rc == 0)
        rc = pc_dev_record(&s->dq, &ev);
    if (rc == 0 && (op->flags & PC_F_LOCKED)) {
        rc = pc_dev_sync(&s->dq, ev);
        if (rc == 0) {
            complete(s, i);
            return PC_OK;
        }
    }
    if (rc != 0) {
        set_device_error(s, op->kind == PC_REDUCE ? "device reduction failed"
                                                  : "device copy failed");
        return PC_EDEVICE;
    }
    s->inflight++;
    return add_dev(s, i, ev);
}

static int start(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    MPI_Request req;
    int rc;
    if (op->kind == PC_FENCE ? s->has_devq : is_device_op(s, op))
        return start_device(s, i);
    switch (op->kind) {
    case PC_NOP:
    case PC_FENCE:
        complete(s, i);
        return PC_OK;
    case PC_SEND:
    case PC_RECV: {
        void *buf;
        int count = (int)op->count, tag = op->tag + s->tag_base;
        MPI_Datatype dt = pc_mpi_dtype(op->dtype, PC_SUM);
        if (op->flags & PC_F_STAMPED) {
            op->stamp[0] = s->stamp_id;
            op->stamp[1] = s->round;
            buf = op->stamp;
            count = 2;
            dt = MPI_UINT64_T;
            tag = op->tag;
        } else {
            buf = addr(s, op->aslot, op->aoff);
        }
        rc = op->kind == PC_SEND
                 ? s->tp->isend(buf, count, dt, op->peer, tag, s->comm, &req)
                 : s->tp->irecv(buf, count, dt, op->peer, tag, s->comm, &req);
        if (rc != MPI_SUCCESS) {
            set_error(s, PC_EMPI, op->kind == PC_SEND ? "send failed"
                                                      : "receive failed", rc);
            return PC_EMPI;
        }
        s->inflight++;
        return add_req(s, i, req);
    }
    case PC_REDUCE:
        if (op->count) {
            rc = MPI_Reduce_local(addr(s, op->bslot, op->boff),
                                  addr(s, op->aslot, op->aoff), (int)op->count,
                                  pc_mpi_dtype(op->dtype, op->redop),
                                  pc_mpi_op(op->redop));
            if (rc != MPI_SUCCESS) {
                set_error(s, PC_EMPI, "local reduction failed", rc);
                return PC_EMPI;
            }
        }
        complete(s, i);
        return PC_OK;
    case PC_COPY:
        if (op->count)
            memmove(addr(s, op->aslot, op->aoff), addr(s, op->bslot, op->boff),
                    (size_t)(op->count * pc_dtypes[op->dtype].size));
        complete(s, i);
        return PC_OK;
    default:
        return PC_EINVAL;
    }
}

static int run_ready(pc_sched *s)
{
    int n = 0;
    while (s->nready > 0) {
        int i = s->ready[--s->nready], rc;
        if (s->ops[i].flags & PC_F_LOCKED) {
            /* run this op and every LOCKED op it readies in one hold */
            pthread_mutex_lock(&s->data_mtx);
            rc = start(s, i);
            while (rc == PC_OK && s->nready > 0 &&
                   (s->ops[s->ready[s->nready - 1]].flags & PC_F_LOCKED)) {
                rc = start(s, s->ready[--s->nready]);
                n++;
            }
            pthread_mutex_unlock(&s->data_mtx);
        } else {
            rc = start(s, i);
        }
        if (rc != PC_OK)
            return -1;
        n++;
    }
    return n;
}

/* Deliver a stamped message or fire for round `r` to op i. */
static void deliver(pc_sched *s, int i, uint64_t r)
{
    pc_op *op = &s->ops[i];
    if (r < s->round) {
        atomic_fetch_add(&s->stale, 1);
    } else if (r == s->round && s->armed) {
        if (op->state == OP_IDLE)
            complete(s, i);
        else
            atomic_fetch_add(&s->surplus, 1);
    } else if (op->kind == PC_RECV) {          /* future round: bank it */
        if (op->nbank == op->capbank) {
            int cap = op->capbank ? 2 * op->capbank : 4;
            uint64_t *b = realloc(op->bank, (size_t)cap * sizeof(uint64_t));
            if (!b) {
                set_error(s, PC_ENOMEM, "out of memory banking a message", 0);
                return;
            }
            op->bank = b;
            op->capbank = cap;
        }
        op->bank[op->nbank++] = r;
    }
}

static void arm(pc_sched *s)
{
    s->armed = 1;
    s->touched = 0;
    s->required_left = 0;
    s->nready = 0;
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        op->ndone = 0;
        op->state = OP_IDLE;
        if (!(op->flags & PC_F_OPTIONAL))
            s->required_left++;
    }
    /* pushed last to first so that they start in index order */
    for (int i = s->nops - 1; i >= 0; i--) {
        pc_op *op = &s->ops[i];
        int stamped_recv = op->kind == PC_RECV && (op->flags & PC_F_STAMPED);
        if (op->ndeps == 0 && op->kind != PC_TRIGGER && !stamped_recv) {
            op->state = OP_ACTIVE;
            push_ready(s, i);
        }
        if (stamped_recv && op->nbank) {   /* banked messages of this round */
            int keep = 0;
            for (int k = 0; k < op->nbank; k++) {
                if (op->bank[k] <= s->round)
                    deliver(s, i, op->bank[k]);
                else
                    op->bank[keep++] = op->bank[k];
            }
            op->nbank = keep;
        }
    }
}

/* Absorb the application's trigger fires. */
static int absorb_fires(pc_sched *s)
{
    int n = 0;
    for (int k = 0; k < s->ntriggers; k++) {
        pc_op *op = &s->ops[s->triggers[k]];
        if (op->state == OP_IDLE && atomic_load(&op->fires) > op->fires_used) {
            op->fires_used++;
            complete(s, s->triggers[k]);
            n++;
        }
    }
    if (atomic_load(&s->nsfire)) {
        pthread_mutex_lock(&s->fire_mtx);
        int keep = 0;
        for (int k = 0; k < s->nsfire; k++) {
            if (s->sfire_round[k] > s->round ||
                (s->sfire_round[k] == s->round && !s->armed)) {
                s->sfire_round[keep] = s->sfire_round[k];
                s->sfire_op[keep++] = s->sfire_op[k];
            } else {
                deliver(s, s->sfire_op[k], s->sfire_round[k]);
                n++;
            }
        }
        s->nsfire = keep;
        pthread_mutex_unlock(&s->fire_mtx);
    }
    return n;
}

static int post_stamped_recv(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    MPI_Request req;
    int rc = s->tp->irecv(op->stamp, 2, MPI_UINT64_T, op->peer, op->tag,
                          s->comm, &req);
    if (rc != MPI_SUCCESS) {
        set_error(s, PC_EMPI, "stamped receive failed", rc);
        return PC_EMPI;
    }
    return add_req(s, i, req);
}

static int test_requests(pc_sched *s)
{
    int outcount = 0;
    if (s->nreq == 0)
        return 0;
    int rc = s->tp->testsome(s->nreq, s->reqs, &outcount, s->indices);
    if (rc != MPI_SUCCESS) {
        set_error(s, PC_EMPI, "request failed", rc);
        return -1;
    }
    if (outcount == MPI_UNDEFINED || outcount == 0)
        return 0;
    int nrepost = 0;
    for (int k = 0; k < outcount; k++) {
        int i = s->req_op[s->indices[k]];
        pc_op *op = &s->ops[i];
        if (op->kind == PC_RECV && (op->flags & PC_F_STAMPED)) {
            if (op->stamp[0] == s->stamp_id)
                deliver(s, i, op->stamp[1]);
            else
                atomic_fetch_add(&s->foreign, 1);
            s->indices[nrepost++] = i;   /* reuse: ops to re-post */
        } else {
            s->inflight--;
            complete(s, i);
        }
    }
    /* compact: completed requests were set to MPI_REQUEST_NULL */
    int keep = 0;
    for (int k = 0; k < s->nreq; k++) {
        if (s->reqs[k] != MPI_REQUEST_NULL) {
            s->reqs[keep] = s->reqs[k];
            s->req_op[keep++] = s->req_op[k];
        }
    }
    s->nreq = keep;
    for (int k = 0; k < nrepost; k++)
        if (post_stamped_recv(s, s->indices[k]) != PC_OK)
            return -1;
    return outcount;
}

/* Complete device ops whose work has run, in queue order, starting what
 * each one readies before looking at the next. */
static int test_device(pc_sched *s)
{
    int n = 0;
    while (s->ndev > 0) {
        int r = pc_dev_query(&s->dq, s->dev_ev[0]);
        if (r < 0) {
            set_device_error(s, "device work failed");
            return -1;
        }
        if (r == 0)
            break;
        int i = s->dev_op[0];
        s->ndev--;
        memmove(s->dev_op, s->dev_op + 1, (size_t)s->ndev * sizeof(int));
        memmove(s->dev_ev, s->dev_ev + 1, (size_t)s->ndev * sizeof(uintptr_t));
        s->inflight--;
        complete(s, i);
        n++;
        if (run_ready(s) < 0)
            return -1;
    }
    return n;
}

/* One step of progress.  Returns >0 when anything happened, 0 when nothing
 * did, <0 on error (recorded in s->error). */
int pc_sched_progress(pc_sched *s)
{
    int progressed = 0;
    if (atomic_load(&s->error) != PC_OK)
        return -1;
    if (!s->stamped_posted && s->has_stamped_recv) {
        for (int i = 0; i < s->nops; i++) {
            pc_op *op = &s->ops[i];
            if (op->kind == PC_RECV && (op->flags & PC_F_STAMPED) &&
                post_stamped_recv(s, i) != PC_OK)
                return -1;
        }
        s->stamped_posted = 1;
    }
    for (int iter = 0; iter < 64; iter++) {
        int n = 0, r;
        if (!s->armed) {
            if (!s->persistent && atomic_load(&s->posted) <= s->round)
                break;
            arm(s);
            n++;
        }
        n += absorb_fires(s);
        if ((r = run_ready(s)) < 0)
            return -1;
        n += r;
        if ((r = test_requests(s)) < 0)
            return -1;
        n += r;
        if (s->ndev && (r = test_device(s)) < 0)
            return -1;
        n += r;
        if ((r = run_ready(s)) < 0)
            return -1;
        n += r;
        if (atomic_load(&s->error) != PC_OK)
            return -1;
        if (s->armed && s->required_left == 0 && s->inflight == 0) {
            s->armed = 0;
            s->round++;
            atomic_store_explicit(&s->done, s->round, memory_order_release);
            n++;
        }
        if (!n)
            break;
        progressed += n;
    }
    return progressed;
}

/* Is a round in flight or about to start?  Quiet means: no round-bound
 * request in flight, nothing of the armed round has happened, and no fire
 * or early message is waiting for a later round. */
int pc_sched_busy(pc_sched *s)
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

void pc_sched_cancel_all(pc_sched *s)
{
    for (int k = 0; k < s->nreq; k++)
        s->tp->cancel(&s->reqs[k]);
    s->nreq = 0;
    /* queued device work cannot be cancelled: let it finish, so that no
     * kernel still writes to memory the application may free */
    for (int k = 0; k < s->ndev; k++)
        pc_dev_sync(&s->dq, s->dev_ev[k]);
    s->ndev = 0;
    s->inflight = 0;
    s->armed = 0;
}

void pc_sched_destroy(pc_sched *s)
{
    if (!s)
        return;
    if (s->ops)
        for (int i = 0; i < s->nops; i++)
            free(s->ops[i].bank);
    free(s->ops);
    free(s->slots);
    free(s->succ);
    free(s->ready);
    free(s->triggers);
    free(s->reqs);
    free(s->req_op);
    free(s->indices);
    free(s->sfire_round);
    free(s->sfire_op);
    for (int k = 0; k < s->ndev; k++)
        pc_dev_sync(&s->dq, s->dev_ev[k]);
    free(s->dev_op);
    free(s->dev_ev);
    pc_devq_fini(&s->dq);
    pthread_mutex_destroy(&s->fire_mtx);
    pthread_mutex_destroy(&s->data_mtx);
    free(s);
}
