/* build.c -- building a schedule from the builder's op descriptors:
 * checking each op, linking the dependency graph, mapping peers to world
 * ranks; and the checks of its buffers before each post.  Semantics are
 * documented in pc_sched.h; the application's side (binding, locks,
 * outcomes, lifetime) is in sched.c. */
#include "sched/pc_sched.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const pc_kind_names[PC_NKINDS] = {
    "nop", "trigger", "send", "recv", "reduce", "copy", "callback", "fence",
    "delay", "start_at", "gate", "scale"};

static _Atomic uint64_t next_serial = 1;

static int uses_a(int kind)
{
    return kind == PC_SEND || kind == PC_RECV || kind == PC_REDUCE ||
           kind == PC_COPY || kind == PC_SCALE || kind == PC_CALLBACK;
}

static int writes_a(int kind)
{
    return kind == PC_RECV || kind == PC_REDUCE || kind == PC_COPY ||
           kind == PC_SCALE || kind == PC_CALLBACK;
}

static int takes_param(int kind)
{
    return kind == PC_DELAY || kind == PC_START_AT || kind == PC_SEND;
}

/* err <- the message; returns PC_EINVAL (every check below is misuse) */
static int reject(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return PC_EINVAL;
}

/* ---- one op descriptor, checked in this order (the first error wins) */
/* Fields kept as int: a value outside int would wrap when cast (peer
 * 2^32 + 1 would become 1). */
static int check_int_fields(int i, const int64_t *d, char *err,
                            size_t errlen)
{
    static const struct { int field; const char *name; } ints[] = {
        {PC_D_PEER, "peer"}, {PC_D_TAG, "tag"}, {PC_D_PRIO, "priority"},
        {PC_D_TCLASS, "traffic class"}, {PC_D_REF, "count_of"},
        {PC_D_ADD, "add"}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (d[ints[k].field] < INT_MIN || d[ints[k].field] > INT_MAX)
            return reject(err, errlen, "op %d: %s %lld does not fit in a C "
                          "int", i, ints[k].name,
                          (long long)d[ints[k].field]);
    return PC_OK;
}

static void fill_op(pc_op *op, const int64_t *d)
{
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
    if (op->kind == PC_CALLBACK) {   /* in fields the kind has no use for */
        op->bbytes = d[PC_D_BBYTES];
        op->arg = d[PC_D_ARG];
    }
    op->req = -1;
}

/* the kind, and the dependencies that fire it */
static int check_kind_deps(pc_op *op, int i, const int64_t *d, int64_t ndeps,
                           char *err, size_t errlen)
{
    if (op->kind < 0 || op->kind >= PC_NKINDS)
        return reject(err, errlen, "op %d: unknown kind %d", i, op->kind);
    if (op->kind == PC_CALLBACK && !pc_sched_callback(op->redop))
        return reject(err, errlen, "op %d: no callback is registered with "
                      "id %d", i, op->redop);
    if (op->mode == PC_ALL)
        op->need = op->ndeps;
    else if (op->mode == PC_ANY)
        op->need = 1;
    else if (op->mode == PC_ATLEAST)
        op->need = (int)d[PC_D_NEED];
    else
        return reject(err, errlen, "op %d: dependency mode must be ALL, ANY "
                      "or ATLEAST", i);
    if (op->ndeps < 0 || d[PC_D_DEPOFF] < 0 ||
        d[PC_D_DEPOFF] + op->ndeps > ndeps)
        return reject(err, errlen, "op %d: dependency list out of range", i);
    if (op->ndeps && (op->need < 1 || op->need > op->ndeps))
        return reject(err, errlen, "op %d: needs %d of %d inputs", i,
                      op->need, op->ndeps);
    return PC_OK;
}

/* LOCKED, STAMPED, and what only some kinds may have */
static int check_flags(const pc_op *op, int i, char *err, size_t errlen)
{
    if ((op->flags & PC_F_LOCKED) && op->kind != PC_NOP &&
        op->kind != PC_REDUCE && op->kind != PC_COPY &&
        op->kind != PC_SCALE && op->kind != PC_CALLBACK)
        return reject(err, errlen, "op %d: only nop, reduce, copy, scale and "
                      "callback can be locked", i);
    if ((op->flags & PC_F_FILL) && op->kind != PC_COPY)
        return reject(err, errlen, "op %d: only a copy can fill", i);
    if (op->kind == PC_TRIGGER && op->ndeps)
        return reject(err, errlen, "op %d: a trigger cannot have "
                      "dependencies", i);
    if (op->flags & PC_F_STAMPED) {
        if (op->kind != PC_SEND && op->kind != PC_RECV)
            return reject(err, errlen, "op %d: only send/recv can be "
                          "stamped", i);
        if (op->count < 0 ||
            (op->count > 0 && (op->dtype < 0 || op->dtype >= PC_NDTYPES ||
                               op->count * (int64_t)pc_dtypes[op->dtype].size
                                   > PC_STAMP_DATA_MAX)))
            return reject(err, errlen, "op %d: a stamped message carries at "
                          "most %d bytes of data", i, PC_STAMP_DATA_MAX);
        if (op->kind == PC_RECV && op->ndeps)
            return reject(err, errlen, "op %d: a stamped recv has no "
                          "dependencies", i);
        if (op->timeout_ns >= 0)
            return reject(err, errlen, "op %d: a stamped recv cannot time "
                          "out", i);
    }
    if (op->timeout_ns >= 0 && op->kind != PC_RECV)
        return reject(err, errlen, "op %d: only a receive can have a "
                      "timeout", i);
    return PC_OK;
}

/* slots, counts, dtypes and reductions (binding is checked per post) */
static int check_buffers_of(const pc_sched *s, const pc_op *op, int i,
                            char *err, size_t errlen)
{
    int nslots = s->nslots;
    if (uses_a(op->kind)) {
        if (op->count < 0 || op->count > INT_MAX)
            return reject(err, errlen, "op %d: count %lld out of range", i,
                          (long long)op->count);
        if (op->dtype < 0 || op->dtype >= PC_NDTYPES)
            return reject(err, errlen, "op %d: unknown dtype %d", i,
                          op->dtype);
        if ((!(op->flags & PC_F_STAMPED) || op->count > 0) &&
            (op->aslot < 0 || op->aslot >= nslots || op->aoff < 0))
            return reject(err, errlen, "op %d: buffer slot %d out of range",
                          i, op->aslot);
    }
    if ((op->kind == PC_REDUCE || op->kind == PC_COPY ||
         op->kind == PC_CALLBACK) &&
        (op->bslot < 0 || op->bslot >= nslots || op->boff < 0))
        return reject(err, errlen, "op %d: source slot %d out of range", i,
                      op->bslot);
    if (op->kind == PC_CALLBACK && op->bbytes < 0)
        return reject(err, errlen, "op %d: a callback's second buffer of "
                      "%lld bytes", i, (long long)op->bbytes);
    if (op->kind == PC_REDUCE && !pc_redop_valid(op->redop, op->dtype))
        return reject(err, errlen, "op %d: reduction %s is not defined for "
                      "%s", i, op->redop >= 0 && op->redop < PC_NREDOPS
                                   ? pc_redop_names[op->redop] : "?",
                      pc_dtypes[op->dtype].name);
    if (op->kind == PC_SCALE) {
        int k = pc_dtypes[op->dtype].kind;
        if (k != 'f' && k != 'c')
            return reject(err, errlen, "op %d: scale needs a float or "
                          "complex buffer, not %s", i,
                          pc_dtypes[op->dtype].name);
        if (op->ref < 0 || op->ref >= s->nops)
            return reject(err, errlen, "op %d: scale counts the inputs of op "
                          "%d, which does not exist", i, op->ref);
    }
    if (op->pslot >= 0 && (!takes_param(op->kind) || op->pslot >= nslots ||
                           op->poff < 0))
        return reject(err, errlen, "op %d: bad parameter slot %d", i,
                      op->pslot);
    if (op->prslot >= 0 && (op->prslot >= nslots || op->proff < 0))
        return reject(err, errlen, "op %d: bad priority slot %d", i,
                      op->prslot);
    return PC_OK;
}

/* a message's peer and tag; only a send has an order */
static int check_peer_tag(pc_sched *s, const pc_op *op, int i, char *err,
                          size_t errlen)
{
    if (op->kind != PC_SEND && op->kind != PC_RECV) {
        if (op->order >= 0)
            return reject(err, errlen, "op %d: only a send can have an "
                          "order", i);
        return PC_OK;
    }
    if (op->peer < 0 || op->peer >= s->comm_size)
        return reject(err, errlen, "op %d: peer %d not in communicator of "
                      "size %d", i, op->peer, s->comm_size);
    if (op->tag < 0 || op->tag >= s->tag_ub)
        return reject(err, errlen, "op %d: tag %d outside [0, MPI_TAG_UB) "
                      "(MPI_TAG_UB = %d is reserved for the executor's "
                      "control messages)", i, op->tag, s->tag_ub);
    if (!(op->flags & PC_F_STAMPED) && op->tag > s->max_tag)
        s->max_tag = op->tag;
    return PC_OK;
}

/* Check one descriptor and fill op i.  Returns PC_OK or an error in err. */
static int parse_op(pc_sched *s, int i, const int64_t *d, int64_t ndeps,
                    char *err, size_t errlen)
{
    pc_op *op = &s->ops[i];
    int rc = check_int_fields(i, d, err, errlen);
    if (rc != PC_OK)
        return rc;
    fill_op(op, d);
    if ((rc = check_kind_deps(op, i, d, ndeps, err, errlen)) != PC_OK ||
        (rc = check_flags(op, i, err, errlen)) != PC_OK ||
        (rc = check_buffers_of(s, op, i, err, errlen)) != PC_OK ||
        (rc = check_peer_tag(s, op, i, err, errlen)) != PC_OK)
        return rc;
    if (op->kind == PC_TRIGGER)
        s->triggers[s->ntriggers++] = i;
    if (op->kind == PC_RECV && (op->flags & PC_F_STAMPED))
        s->srecv[s->nsrecv++] = i;
    if (op->kind == PC_SEND && (op->flags & PC_F_STAMPED) && op->count > 0) {
        int64_t bytes = op->count * pc_dtypes[op->dtype].size;
        op->stampbuf = calloc((size_t)((PC_STAMP_HEADER + bytes + 7) / 8),
                              8);
        if (!op->stampbuf)
            return reject(err, errlen, "op %d: out of memory", i);
    }
    return PC_OK;
}

/* ---- the graph */
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

/* Successor and predecessor lists (flat arrays, offsets per op). */
static int link_graph(pc_sched *s, const int64_t *desc, const int64_t *deps,
                      char *err, size_t errlen)
{
    int nops = s->nops, rc = PC_OK;
    int *nsucc = calloc((size_t)nops + 1, sizeof(int));
    if (!nsucc) {
        snprintf(err, errlen, "out of memory");
        return PC_ENOMEM;
    }
    int64_t pre = 0;
    for (int i = 0; i < nops && rc == PC_OK; i++) {
        const int64_t *d = desc + (size_t)i * PC_DESC_LEN;
        s->ops[i].pred = s->pred + pre;
        for (int k = 0; k < s->ops[i].ndeps && rc == PC_OK; k++) {
            int64_t p = deps[d[PC_D_DEPOFF] + k];
            if (p < 0 || p >= nops || p == i) {
                rc = reject(err, errlen, "op %d: bad dependency on op %lld",
                            i, (long long)p);
                break;
            }
            s->pred[pre++] = (int)p;
            nsucc[p]++;
        }
    }
    if (rc != PC_OK)
        goto out;
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
        rc = reject(err, errlen, "the dependency graph has a cycle");
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

static int by_peer_tag(const void *a, const void *b, void *ctx)
{
    const pc_op *x = &((pc_sched *)ctx)->ops[*(const int *)a];
    const pc_op *y = &((pc_sched *)ctx)->ops[*(const int *)b];
    if (x->peer != y->peer)
        return x->peer < y->peer ? -1 : 1;
    return x->tag < y->tag ? -1 : x->tag > y->tag;
}

/* The stamped receives, sorted by (peer, tag) for pc_sched_find_srecv:
 * two with the same pair could not be told apart. */
static int sort_srecv(pc_sched *s, char *err, size_t errlen)
{
    qsort_r(s->srecv, s->nsrecv, sizeof(int), by_peer_tag, s);
    for (int k = 1; k < s->nsrecv; k++)
        if (by_peer_tag(&s->srecv[k - 1], &s->srecv[k], s) == 0)
            return reject(err, errlen, "ops %d and %d: two stamped receives "
                          "from rank %d with tag %d", s->srecv[k - 1],
                          s->srecv[k], s->ops[s->srecv[k]].peer,
                          s->ops[s->srecv[k]].tag);
    return PC_OK;
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

/* ---- creating */
/* The arrays of a schedule of nops ops; PC_ENOMEM if one is missing. */
static int alloc_arrays(pc_sched *s, int64_t ndeps)
{
    size_t n1 = (size_t)s->nops + 1;
    s->ops = calloc(n1, sizeof(pc_op));
    s->slots = calloc((size_t)s->nslots + 1, sizeof(pc_slot));
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
        return PC_ENOMEM;
    return PC_OK;
}

#define FAIL(code, ...)                                   \
    do {                                                  \
        snprintf(err, errlen, __VA_ARGS__);               \
        rc = (code);                                      \
        goto out;                                         \
    } while (0)

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
    if (alloc_arrays(s, ndeps) != PC_OK)
        FAIL(PC_ENOMEM, "out of memory");
    for (int i = 0; i < nops; i++)
        if ((rc = parse_op(s, i, desc + (size_t)i * PC_DESC_LEN, ndeps, err,
                           errlen)) != PC_OK)
            goto out;
    if ((rc = link_graph(s, desc, deps, err, errlen)) != PC_OK)
        goto out;
    if ((rc = world_peers(s)) != PC_OK)
        FAIL(rc, "cannot map the communicator's ranks to MPI_COMM_WORLD");
    rc = sort_srecv(s, err, errlen);
out:
    if (rc != PC_OK) {
        pc_sched_unref(s);          /* the only reference: destroys it */
        s = NULL;
    }
    *out = s;
    return rc;
}

/* ---- before each post */
static int check_slot(pc_sched *s, int i, int slot, int64_t off,
                      int64_t bytes, const char *what, char *err,
                      size_t errlen)
{
    pc_slot *a = &s->slots[slot];
    if (!a->bound)
        return reject(err, errlen, "op %d: %s slot %d is not bound", i, what,
                      slot);
    if (off + bytes > a->len)
        return reject(err, errlen, "op %d: needs bytes [%lld, %lld) of %s "
                      "slot %d, which has %lld", i, (long long)off,
                      (long long)(off + bytes), what, slot,
                      (long long)a->len);
    return PC_OK;
}

/* a reduce or copy: its source, and where both buffers live */
static int check_source(pc_sched *s, int i, int64_t bytes, char *err,
                        size_t errlen)
{
    pc_op *op = &s->ops[i];
    int rc = check_slot(s, i, op->bslot, op->boff, bytes, "source", err,
                        errlen);
    if (rc != PC_OK)
        return rc;
    pc_slot *a = &s->slots[op->aslot], *b = &s->slots[op->bslot];
    if (op->kind == PC_REDUCE && a->space != b->space)
        return reject(err, errlen, "op %d: a reduction cannot mix host and "
                      "device memory (slots %d and %d)", i, op->aslot,
                      op->bslot);
    if ((a->space == PC_DEVICE || b->space == PC_DEVICE) && !s->has_devq)
        return reject(err, errlen, "op %d: device memory in a schedule with "
                      "no device queue", i);
    return PC_OK;
}

static int check_op_buffers(pc_sched *s, int i, char *err, size_t errlen)
{
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
    if (!uses_a(op->kind) || ((op->flags & PC_F_STAMPED) && !op->count))
        return PC_OK;
    if ((rc = check_slot(s, i, op->aslot, op->aoff, bytes, "buffer", err,
                         errlen)) != PC_OK)
        return rc;
    pc_slot *a = &s->slots[op->aslot];
    if ((op->flags & PC_F_STAMPED) && a->space != PC_HOST)
        return reject(err, errlen, "op %d: a stamped message carries host "
                      "memory only", i);
    if (writes_a(op->kind) && !a->writable)
        return reject(err, errlen, "op %d: slot %d is read-only but the op "
                      "writes to it", i, op->aslot);
    if (op->kind == PC_SCALE && a->space == PC_DEVICE)
        return reject(err, errlen, "op %d: scale of device memory is not "
                      "supported", i);
    if (op->flags & PC_F_FILL) {        /* one element, repeated */
        if ((rc = check_source(s, i, pc_dtypes[op->dtype].size, err,
                               errlen)) != PC_OK)
            return rc;
        if (a->space == PC_DEVICE || s->slots[op->bslot].space == PC_DEVICE)
            return reject(err, errlen, "op %d: a fill needs host memory", i);
        return PC_OK;
    }
    if (op->kind == PC_CALLBACK) {
        if ((rc = check_slot(s, i, op->bslot, op->boff, op->bbytes,
                             "second", err, errlen)) != PC_OK)
            return rc;
        pc_slot *b = &s->slots[op->bslot];
        if (a->space != PC_HOST || b->space != PC_HOST)
            return reject(err, errlen, "op %d: a callback takes host memory "
                          "only", i);
        if (!b->writable)
            return reject(err, errlen, "op %d: slot %d is read-only but a "
                          "callback may write to it", i, op->bslot);
        return PC_OK;
    }
    if (op->kind == PC_REDUCE || op->kind == PC_COPY)
        return check_source(s, i, bytes, err, errlen);
    return PC_OK;
}

int pc_sched_check_buffers(pc_sched *s, char *err, size_t errlen)
{
    for (int i = 0; i < s->nops; i++) {
        int rc = check_op_buffers(s, i, err, errlen);
        if (rc != PC_OK)
            return rc;
    }
    return PC_OK;
}
