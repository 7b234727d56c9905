/* pc_sched.c -- building, validating, binding and releasing a schedule.
 * Semantics are documented in pc_sched.h; the round machinery is in
 * pc_round.c. */
#include "pc_sched.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(code, ...)                                   \
    do {                                                  \
        snprintf(err, errlen, __VA_ARGS__);               \
        rc = (code);                                      \
        goto out;                                         \
    } while (0)

static _Atomic uint64_t next_serial = 1;

static int uses_a(int kind)
{
    return kind == PC_SEND || kind == PC_RECV || kind == PC_REDUCE ||
           kind == PC_COPY || kind == PC_SCALE;
}

static int writes_a(int kind)
{
    return kind == PC_RECV || kind == PC_REDUCE || kind == PC_COPY ||
           kind == PC_SCALE;
}

static int takes_param(int kind)
{
    return kind == PC_DELAY || kind == PC_START_AT || kind == PC_SEND;
}

/* Kahn's algorithm: returns 1 when the graph has a cycle. */
static int has_cycle(pc_sched *s)
{
    int n = s->nops, head = 0, tail = 0, seen = 0, rc = 1;
    int *indeg = calloc((size_t)n + 1, sizeof(int));
    int *queue = malloc(((size_t)n + 1) * sizeof(int));
    if (!indeg || !queue)
        goto out;
    for (int i = 0; i < n; i++) {
        indeg[i] = s->ops[i].ndeps;
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

/* Check one descriptor; fills op.  Returns PC_OK or an error in err. */
static int parse_op(pc_sched *s, int i, const int64_t *d, int64_t ndeps,
                    char *err, size_t errlen)
{
    pc_op *op = &s->ops[i];
    int rc = PC_OK, size = s->comm_size, nslots = s->nslots;
    /* fields kept as int: a value outside int would wrap when cast (peer
     * 2^32 + 1 would become 1) */
    static const struct { int field; const char *name; } ints[] = {
        {PC_D_PEER, "peer"}, {PC_D_TAG, "tag"}, {PC_D_PRIO, "priority"},
        {PC_D_TCLASS, "traffic class"}, {PC_D_REF, "count_of"},
        {PC_D_ADD, "add"}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (d[ints[k].field] < INT_MIN || d[ints[k].field] > INT_MAX)
            FAIL(PC_EINVAL, "op %d: %s %lld does not fit in a C int", i,
                 ints[k].name, (long long)d[ints[k].field]);
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
    op->timeout_ns = d[PC_D_TIMEOUT];
    op->tclass = (int)d[PC_D_TCLASS];
    op->order = d[PC_D_ORDER];
    op->value_ns = d[PC_D_VALUE];
    op->pslot = (int)d[PC_D_PSLOT];
    op->poff = d[PC_D_POFF];
    op->ref = (int)d[PC_D_REF];
    op->add = (int)d[PC_D_ADD];
    op->prslot = (int)d[PC_D_PRSLOT];
    op->proff = d[PC_D_PROFF];
    op->req = -1;
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
        FAIL(PC_EINVAL, "op %d: dependency mode must be ALL, ANY or ATLEAST",
             i);
    if (op->ndeps < 0 || d[PC_D_DEPOFF] < 0 ||
        d[PC_D_DEPOFF] + op->ndeps > ndeps)
        FAIL(PC_EINVAL, "op %d: dependency list out of range", i);
    if (op->ndeps && (op->need < 1 || op->need > op->ndeps))
        FAIL(PC_EINVAL, "op %d: needs %d of %d inputs", i, op->need,
             op->ndeps);
    if ((op->flags & PC_F_LOCKED) && op->kind != PC_NOP &&
        op->kind != PC_REDUCE && op->kind != PC_COPY && op->kind != PC_SCALE)
        FAIL(PC_EINVAL, "op %d: only nop, reduce, copy and scale can be "
             "locked", i);
    if (op->kind == PC_TRIGGER && op->ndeps)
        FAIL(PC_EINVAL, "op %d: a trigger cannot have dependencies", i);
    if (op->flags & PC_F_STAMPED) {
        if (op->kind != PC_SEND && op->kind != PC_RECV)
            FAIL(PC_EINVAL, "op %d: only send/recv can be stamped", i);
        if (op->count != 0)
            FAIL(PC_EINVAL, "op %d: stamped messages carry no data", i);
        if (op->kind == PC_RECV && op->ndeps)
            FAIL(PC_EINVAL, "op %d: a stamped recv has no dependencies", i);
        if (op->timeout_ns >= 0)
            FAIL(PC_EINVAL, "op %d: a stamped recv cannot time out", i);
    }
    if (op->timeout_ns >= 0 && op->kind != PC_RECV)
        FAIL(PC_EINVAL, "op %d: only a receive can have a timeout", i);
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
    if (op->kind == PC_SCALE) {
        int k = pc_dtypes[op->dtype].kind;
        if (k != 'f' && k != 'c')
            FAIL(PC_EINVAL, "op %d: scale needs a float or complex buffer, "
                 "not %s", i, pc_dtypes[op->dtype].name);
        if (op->ref < 0 || op->ref >= s->nops)
            FAIL(PC_EINVAL, "op %d: scale counts the inputs of op %d, which "
                 "does not exist", i, op->ref);
    }
    if (op->pslot >= 0 && (!takes_param(op->kind) || op->pslot >= nslots ||
                           op->poff < 0))
        FAIL(PC_EINVAL, "op %d: bad parameter slot %d", i, op->pslot);
    if (op->prslot >= 0 && (op->prslot >= nslots || op->proff < 0))
        FAIL(PC_EINVAL, "op %d: bad priority slot %d", i, op->prslot);
    if (op->kind == PC_SEND || op->kind == PC_RECV) {
        if (op->peer < 0 || op->peer >= size)
            FAIL(PC_EINVAL, "op %d: peer %d not in communicator of size %d",
                 i, op->peer, size);
        if (op->tag < 0 || op->tag >= s->tag_ub)
            FAIL(PC_EINVAL, "op %d: tag %d outside [0, MPI_TAG_UB) (MPI_TAG_UB "
                 "= %d is reserved for the executor's control messages)", i,
                 op->tag, s->tag_ub);
        if (!(op->flags & PC_F_STAMPED) && op->tag > s->max_tag)
            s->max_tag = op->tag;
    } else if (op->order >= 0) {
        FAIL(PC_EINVAL, "op %d: only a send can have an order", i);
    }
    if (op->kind == PC_TRIGGER)
        s->triggers[s->ntriggers++] = i;
    if (op->kind == PC_RECV && (op->flags & PC_F_STAMPED))
        s->srecv[s->nsrecv++] = i;
out:
    return rc;
}

static int by_peer_tag(const void *a, const void *b, void *ctx)
{
    const pc_op *x = &((pc_sched *)ctx)->ops[*(const int *)a];
    const pc_op *y = &((pc_sched *)ctx)->ops[*(const int *)b];
    if (x->peer != y->peer)
        return x->peer < y->peer ? -1 : 1;
    return x->tag < y->tag ? -1 : x->tag > y->tag;
}

/* Successor and predecessor lists (flat arrays, offsets per op). */
static int link_graph(pc_sched *s, const int64_t *desc, const int64_t *deps,
                      char *err, size_t errlen)
{
    int nops = s->nops, rc = PC_OK;
    int *nsucc = calloc((size_t)nops + 1, sizeof(int));
    if (!nsucc)
        FAIL(PC_ENOMEM, "out of memory");
    int64_t pre = 0;
    for (int i = 0; i < nops; i++) {
        const int64_t *d = desc + (size_t)i * PC_DESC_LEN;
        s->ops[i].pred = s->pred + pre;
        for (int k = 0; k < s->ops[i].ndeps; k++) {
            int64_t p = deps[d[PC_D_DEPOFF] + k];
            if (p < 0 || p >= nops || p == i)
                FAIL(PC_EINVAL, "op %d: bad dependency on op %lld", i,
                     (long long)p);
            s->pred[pre++] = (int)p;
            nsucc[p]++;
        }
    }
    int64_t off = 0;
    for (int i = 0; i < nops; i++) {
        s->ops[i].succ = s->succ + off;
        off += nsucc[i];
    }
    for (int i = 0; i < nops; i++)
        for (int k = 0; k < s->ops[i].ndeps; k++) {
            pc_op *p = &s->ops[s->ops[i].pred[k]];
            p->succ[p->nsucc++] = i;
        }
    if (has_cycle(s))
        FAIL(PC_EINVAL, "the dependency graph has a cycle");
out:
    free(nsucc);
    return rc;
}

/* World ranks of the peers (the engine's gates and the emulated network
 * name processes, not ranks of one communicator). */
static int world_peers(pc_sched *s)
{
    MPI_Group g, w;
    int n = s->comm_size, rc = PC_OK;
    int *in = malloc(n * sizeof(int)), *outw = malloc(n * sizeof(int));
    if (!in || !outw) {
        rc = PC_ENOMEM;
        goto out;
    }
    for (int r = 0; r < n; r++)
        in[r] = r;
    if (MPI_Comm_group(s->comm, &g) != MPI_SUCCESS ||
        MPI_Comm_group(MPI_COMM_WORLD, &w) != MPI_SUCCESS) {
        rc = PC_EINVAL;
        goto out;
    }
    MPI_Group_translate_ranks(g, n, in, w, outw);
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        if (op->kind == PC_SEND || op->kind == PC_RECV)
            op->wpeer = outw[op->peer] == MPI_UNDEFINED ? -1 : outw[op->peer];
    }
out:
    free(in);
    free(outw);
    return rc;
}

int pc_sched_create(const int64_t *desc, int nops, const int64_t *deps,
                    int64_t ndeps, int nslots, MPI_Comm comm, int persistent,
                    uint64_t stamp_id, pc_sched **out, char *err,
                    size_t errlen)
{
    int rc = PC_OK, tag_ub_flag = 0, *tag_ub = NULL;
    pc_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return PC_ENOMEM;
    s->nops = nops;
    s->nslots = nslots;
    s->persistent = persistent;
    s->stamp_id = stamp_id;
    s->serial = atomic_fetch_add(&next_serial, 1);
    s->comm = comm;
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->fire_mtx, NULL);
    pthread_mutex_init(&s->data_mtx, NULL);
    if (nops < 0 || nslots < 0 || ndeps < 0)
        FAIL(PC_EINVAL, "negative sizes");
    if (MPI_Comm_size(comm, &s->comm_size) != MPI_SUCCESS)
        FAIL(PC_EINVAL, "invalid communicator");
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &tag_ub_flag);
    s->tag_ub = tag_ub_flag ? *tag_ub : 32767;
    size_t n1 = (size_t)nops + 1;
    s->ops = calloc(n1, sizeof(pc_op));
    s->slots = calloc((size_t)nslots + 1, sizeof(pc_slot));
    s->succ = malloc(((size_t)ndeps + 1) * sizeof(int));
    s->pred = malloc(((size_t)ndeps + 1) * sizeof(int));
    s->heap = malloc(n1 * sizeof(int));
    s->defer = malloc(n1 * sizeof(int));
    s->held = malloc(n1 * sizeof(int));
    s->triggers = malloc(n1 * sizeof(int));
    s->srecv = malloc(n1 * sizeof(int));
    s->last_outcome = calloc(n1, 1);
    s->last_nok = calloc(n1, sizeof(int));
    s->last_t = calloc(n1, sizeof(double));
    s->last_arrive = calloc(n1, sizeof(double));
    s->last_wire = calloc(n1, sizeof(double));
    s->next_order = calloc((size_t)s->comm_size + 1, sizeof(int64_t));
    if (!s->ops || !s->slots || !s->succ || !s->pred || !s->heap ||
        !s->defer || !s->held || !s->triggers || !s->srecv ||
        !s->last_outcome || !s->last_nok || !s->last_t ||
        !s->last_arrive || !s->last_wire || !s->next_order)
        FAIL(PC_ENOMEM, "out of memory");
    for (int i = 0; i < nops; i++)
        if ((rc = parse_op(s, i, desc + (size_t)i * PC_DESC_LEN, ndeps, err,
                           errlen)) != PC_OK)
            goto out;
    if ((rc = link_graph(s, desc, deps, err, errlen)) != PC_OK)
        goto out;
    if ((rc = world_peers(s)) != PC_OK)
        FAIL(rc, "cannot map the communicator's ranks to MPI_COMM_WORLD");
    qsort_r(s->srecv, s->nsrecv, sizeof(int), by_peer_tag, s);
    for (int k = 1; k < s->nsrecv; k++)
        if (by_peer_tag(&s->srecv[k - 1], &s->srecv[k], s) == 0)
            FAIL(PC_EINVAL, "ops %d and %d: two stamped receives from rank "
                 "%d with tag %d", s->srecv[k - 1], s->srecv[k],
                 s->ops[s->srecv[k]].peer, s->ops[s->srecv[k]].tag);
out:
    if (rc != PC_OK) {
        pc_sched_destroy(s);
        s = NULL;
    }
    *out = s;
    return rc;
}

int pc_sched_find_srecv(pc_sched *s, int peer, int tag)
{
    int lo = 0, hi = s->nsrecv - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        pc_op *op = &s->ops[s->srecv[mid]];
        int c = op->peer != peer ? (op->peer < peer ? -1 : 1)
                                 : (op->tag < tag ? -1 : op->tag > tag);
        if (c == 0)
            return s->srecv[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
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

void pc_sched_unbind(pc_sched *s, int slot)
{
    if (slot >= 0 && slot < s->nslots)
        s->slots[slot] = (pc_slot){0};
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
    if (base < 0 || (int64_t)base + s->max_tag >= s->tag_ub)
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->tag_base = base;
    return PC_OK;
}

static int check_slot(pc_sched *s, int i, int slot, int64_t off,
                      int64_t bytes, const char *what, char *err,
                      size_t errlen)
{
    pc_slot *a = &s->slots[slot];
    if (!a->bound) {
        snprintf(err, errlen, "op %d: %s slot %d is not bound", i, what, slot);
        return PC_EINVAL;
    }
    if (off + bytes > a->len) {
        snprintf(err, errlen, "op %d: needs bytes [%lld, %lld) of %s slot %d, "
                 "which has %lld", i, (long long)off, (long long)(off + bytes),
                 what, slot, (long long)a->len);
        return PC_EINVAL;
    }
    return PC_OK;
}

/* Called before each post: every op's byte range must lie in its slot. */
int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen)
{
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        int64_t bytes = op->count * pc_dtypes[op->dtype].size;
        int rc;
        if (op->pslot >= 0 &&
            (rc = check_slot(s, i, op->pslot, op->poff, 8, "parameter", err,
                             errlen)) != PC_OK)
            return rc;
        if (op->prslot >= 0 &&
            (rc = check_slot(s, i, op->prslot, op->proff, 8, "priority", err,
                             errlen)) != PC_OK)
            return rc;
        if (!uses_a(op->kind) || (op->flags & PC_F_STAMPED))
            continue;
        if ((rc = check_slot(s, i, op->aslot, op->aoff, bytes, "buffer", err,
                             errlen)) != PC_OK)
            return rc;
        pc_slot *a = &s->slots[op->aslot];
        if (writes_a(op->kind) && !a->writable) {
            snprintf(err, errlen, "op %d: slot %d is read-only but the op "
                     "writes to it", i, op->aslot);
            return PC_EINVAL;
        }
        if (op->kind == PC_SCALE && a->space == PC_DEVICE) {
            snprintf(err, errlen, "op %d: scale of device memory is not "
                     "supported", i);
            return PC_EINVAL;
        }
        if (op->kind == PC_REDUCE || op->kind == PC_COPY) {
            if ((rc = check_slot(s, i, op->bslot, op->boff, bytes, "source",
                                 err, errlen)) != PC_OK)
                return rc;
            pc_slot *b = &s->slots[op->bslot];
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

/* ---- errors: the first one wins, published only once its text is there */
void pc_sched_set_error(pc_sched *s, int code, const char *fmt, ...)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->error_claimed, &expected, 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
    va_end(ap);
    atomic_store(&s->error, code);
}

/* ---- the data lock */
void pc_sched_lock(pc_sched *s)
{
    pthread_mutex_lock(&s->data_mtx);
    s->lock_owner = pthread_self();
    atomic_store(&s->lock_held, 1);
}

void pc_sched_unlock(pc_sched *s)
{
    atomic_store(&s->lock_held, 0);
    pthread_mutex_unlock(&s->data_mtx);
}

int pc_sched_lock_mine(pc_sched *s)
{
    return atomic_load(&s->lock_held) &&
           pthread_equal(s->lock_owner, pthread_self());
}

int pc_sched_has_locked_ops(pc_sched *s)
{
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].flags & PC_F_LOCKED)
            return 1;
    return 0;
}

/* ---- lifetime */
void pc_sched_ref(pc_sched *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void pc_sched_unref(pc_sched *s)
{
    if (atomic_fetch_sub(&s->refs, 1) == 1)
        pc_sched_destroy(s);
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
    free(s->pred);
    free(s->heap);
    free(s->defer);
    free(s->held);
    free(s->triggers);
    free(s->srecv);
    free(s->last_outcome);
    free(s->last_nok);
    free(s->last_t);
    free(s->last_arrive);
    free(s->last_wire);
    free(s->next_order);
    free(s->sfire_round);
    free(s->sfire_op);
    free(s->gate_op);
    free(s->gate_round);
    for (int k = 0; k < s->ndisc; k++)
        free(s->disc_buf[k]);
    free(s->disc_req);
    free(s->disc_id);
    free(s->disc_buf);
    for (int k = 0; k < s->ndev; k++)
        pc_dev_sync(&s->dq, s->dev_ev[k]);
    free(s->dev_op);
    free(s->dev_ev);
    pc_devq_fini(&s->dq);
    pthread_mutex_destroy(&s->fire_mtx);
    pthread_mutex_destroy(&s->data_mtx);
    free(s);
}

/* The arrays are written at the end of each round under fire_mtx. */
int pc_sched_last_outcomes(pc_sched *s, uint8_t *outcome, int *nok,
                           double *t_done, double *t_arrive, double *t_wire,
                           uint64_t *round)
{
    pthread_mutex_lock(&s->fire_mtx);
    memcpy(outcome, s->last_outcome, (size_t)s->nops);
    memcpy(nok, s->last_nok, (size_t)s->nops * sizeof(int));
    memcpy(t_done, s->last_t, (size_t)s->nops * sizeof(double));
    memcpy(t_arrive, s->last_arrive, (size_t)s->nops * sizeof(double));
    memcpy(t_wire, s->last_wire, (size_t)s->nops * sizeof(double));
    *round = s->last_round_ok;
    pthread_mutex_unlock(&s->fire_mtx);
    return PC_OK;
}
