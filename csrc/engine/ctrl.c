/* ctrl.c -- the control channel of round-stamped messages (the engine's
 * side: wire.c design constraint 1), and their delivery, data and all, to
 * the op they are for (pc_round_deliver, which takes stamped fires too).
 * Idle persistent schedules post nothing: their stamped receives are
 * served by one receive per source rank and communicator, on the tag
 * MPI_TAG_UB reserves for the executor, and each message is routed by
 * {stamp id, source, tag} to the schedule it is for.  A message for a
 * schedule not registered yet is banked until it is; one for a schedule
 * that was freed is foreign.  Progress lock held.
 *
 * One receive per source, not one MPI_ANY_SOURCE receive: an ANY_SOURCE
 * receive is matched by MPICH's shared-memory and network modules at once
 * when the communicator spans hosts (it posts a partner request in each and
 * cancels the loser); with the UCX module and a progress thread beside the
 * caller, a message could be lost in that race and a round never started.
 * Per-source receives are matched by one module only. */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pc_ctrl_endpoint endpoint;

/* the receive posted for one source rank */
typedef struct pc_ctrl_slot {
    endpoint *e;
    int src;
    uint64_t buf[PC_STAMP_WORDS];  /* {stamp id, round, tag, data bytes},
                                      then the data */
    int64_t handle;            /* the posted receive, -1 none */
} slot;

struct pc_ctrl_endpoint {
    MPI_Comm comm;
    int tag;                   /* MPI_TAG_UB of comm, reserved for us */
    int refs;                  /* registered schedules */
    slot *slots;               /* by source rank of comm */
    int nslots;
    pc_sched **bucket;         /* stamp id -> schedules (chained by ep_next) */
    int nbucket;
    struct {                   /* not yet claimed */
        uint64_t id, round;
        int src, tag;
        int64_t bytes;
        uint64_t data[PC_STAMP_DATA_MAX / 8];
    } *bank;
    int nbank, capbank;
    uint64_t freed[64];        /* recently unregistered stamp ids */
    int nfreed;
    struct pc_ctrl_endpoint *next;
};

static struct {
    endpoint *eps;             /* one per communicator in use */
    uint64_t foreign, unclaimed;
    uint64_t posted;           /* control receives posted now */
} ctrl;

enum { BANK_MAX = 4096 };

static endpoint *ep_find(MPI_Comm comm)
{
    for (endpoint *e = ctrl.eps; e; e = e->next)
        if (e->comm == comm)
            return e;
    return NULL;
}

static int ep_post(slot *sl)
{
    endpoint *e = sl->e;
    pc_msg m = {0, sl->buf, PC_STAMP_WORDS, MPI_UINT64_T,
                8 * PC_STAMP_WORDS, sl->src, e->tag, -1, e->comm, 0, sl,
                PC_COOKIE_CTRL, 0, 0, -1, 0};
    int rc = pc_wire_start(&m, &sl->handle);
    if (rc == MPI_SUCCESS)
        ctrl.posted++;
    return rc;
}

static void ep_cancel(endpoint *e)
{
    for (int k = 0; k < e->nslots; k++)
        if (e->slots[k].handle >= 0) {
            pc_done d;
            pc_wire_cancel_recv(e->slots[k].handle, 0, &d);
            e->slots[k].handle = -1;
            ctrl.posted--;
        }
}

/* a receive from every rank of comm; PC_OK, or nothing left posted */
static int ep_post_all(endpoint *e)
{
    int n;
    if (MPI_Comm_size(e->comm, &n) != MPI_SUCCESS)
        return PC_EMPI;
    e->slots = calloc((size_t)n, sizeof(*e->slots));
    if (!e->slots)
        return PC_ENOMEM;
    e->nslots = n;
    for (int k = 0; k < n; k++)
        e->slots[k] = (slot){e, k, {0}, -1};
    for (int k = 0; k < n; k++)
        if (ep_post(&e->slots[k]) != MPI_SUCCESS) {
            ep_cancel(e);
            free(e->slots);
            e->slots = NULL;
            return PC_EMPI;
        }
    return PC_OK;
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

/* ---- delivery to an op (the schedule's side; round.c's arm() delivers
 * what was banked) */
/* A message of a future round, kept with its data until that round. */
static void bank(pc_sched *s, int i, uint64_t r, const void *data,
                 int64_t bytes)
{
    pc_op *op = &s->ops[i];
    uint64_t *b = pc_grow(op->bank, &op->capbank, op->nbank + 1,
                          sizeof(uint64_t), 4);
    unsigned char *d = NULL;
    if (b) {
        op->bank = b;
        if (bytes && (d = pc_grow(op->bankdata, &op->capbankdata,
                                  op->nbank + 1, (size_t)bytes, 4)) != NULL)
            op->bankdata = d;
    }
    if (!b || (bytes && !d)) {
        pc_sched_set_error(s, PC_ENOMEM, "out of memory banking a message "
                           "of round %llu for op %d", (unsigned long long)r,
                           i);
        return;
    }
    if (bytes)
        memcpy(d + (size_t)op->nbank * bytes, data, (size_t)bytes);
    op->bank[op->nbank++] = r;
}

void pc_round_deliver(pc_sched *s, int i, uint64_t r, const void *data,
                      int64_t bytes)
{
    pc_op *op = &s->ops[i];
    int64_t want = op->kind == PC_RECV && op->count
                       ? op->count * pc_dtypes[op->dtype].size : 0;
    if (bytes != want) {
        pc_sched_set_error(s, PC_EINVAL, "op %d: a stamped message of %lld "
                           "data bytes for a receive of %lld", i,
                           (long long)bytes, (long long)want);
        return;
    }
    if (op->kind == PC_GATE) {                 /* the application opened it */
        if (r == s->round && s->armed && op->state == OP_ACTIVE)
            pc_round_complete(s, i, PC_OC_OK);
        else
            atomic_fetch_add(&s->stale, 1);
        return;
    }
    if (r < s->round) {
        atomic_fetch_add(&s->stale, 1);
    } else if (r == s->round && s->armed) {
        if (op->state == OP_IDLE) {
            if (bytes)
                memcpy(pc_addr(s, op->aslot, op->aoff), data, (size_t)bytes);
            pc_round_complete(s, i, PC_OC_OK);
        } else {
            atomic_fetch_add(&s->surplus, 1);
        }
    } else if (op->kind == PC_RECV) {          /* future round: bank it */
        bank(s, i, r, data, bytes);
    }
}

/* Route a stamped message (and its data); 1 if a schedule took it. */
static int route(endpoint *e, uint64_t id, uint64_t round, int src, int tag,
                 const void *data, int64_t bytes)
{
    for (pc_sched *s = e->bucket[bucket_of(e, id)]; s; s = s->ep_next) {
        if (s->stamp_id != id || s->cleaned)
            continue;
        int op = pc_sched_find_srecv(s, src, tag);
        if (op < 0)
            continue;
        pc_round_deliver(s, op, round, data, bytes);
        pc_engine_queue(s);
        return 1;
    }
    return 0;
}

int pc_ctrl_register(pc_sched *s)
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
        int rc = ep_post_all(e);
        if (rc != PC_OK) {
            free(e->bucket);
            free(e);
            return rc;
        }
        e->next = ctrl.eps;
        ctrl.eps = e;
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
                  e->bank[k].tag, e->bank[k].data, e->bank[k].bytes))
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
    ep_cancel(e);
    free(e->slots);
    for (endpoint **p = &ctrl.eps; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    free(e->bucket);
    free(e->bank);
    free(e);
}

void pc_ctrl_unregister(pc_sched *s)
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

/* every schedule listening on e is stuck: tell them (PC_EFAILED: a rank
 * failed, so the communicator is revoked too, listeners or not) */
static void fail_listeners(endpoint *e, int code, const char *what)
{
    if (code == PC_EFAILED)
        pc_transport_revoke(e->comm);
    for (int k = 0; k < e->nbucket; k++)
        for (pc_sched *s = e->bucket[k]; s; s = s->ep_next) {
            if (code == PC_EFAILED)
                pc_round_rank_failed(s, what);
            else
                pc_sched_set_error(s, code, "%s", what);
            pc_engine_queue(s);
        }
}

void pc_ctrl_arrived(slot *sl, const pc_done *d)
{
    endpoint *e = sl->e;
    uint64_t id = sl->buf[0], round = sl->buf[1], bytes = sl->buf[3];
    int tag = (int)sl->buf[2];
    sl->handle = -1;
    ctrl.posted--;
    if (pc_transport_is_failure(d->mpi_error)) {
        /* a rank failed (or another rank revoked the communicator): no
         * activation from it will come, and the schedules listening here
         * could wait for one.  Not re-posted: the communicator is dead. */
        char what[96];
        snprintf(what, sizeof what, "the control channel's receive from "
                 "rank %d ended", sl->src);
        fail_listeners(e, PC_EFAILED, what);
        return;
    }
    /* a header, and as many words of data as it says */
    const uint64_t *data = sl->buf + PC_STAMP_HEADER / 8;
    int whole = d->bytes >= PC_STAMP_HEADER && bytes <= PC_STAMP_DATA_MAX &&
                d->bytes == PC_STAMP_HEADER + 8 * (int64_t)((bytes + 7) / 8);
    if (d->mpi_error == MPI_SUCCESS && !whole)
        ctrl.foreign++;              /* not one of ours */
    else if (d->mpi_error == MPI_SUCCESS &&
             !route(e, id, round, sl->src, tag, data, (int64_t)bytes)) {
        int known = 0;
        for (int k = 0; k < 64 && k < e->nfreed; k++)
            known |= e->freed[k] == id;
        for (pc_sched *s = e->bucket[bucket_of(e, id)]; s; s = s->ep_next)
            known |= s->stamp_id == id;
        if (known || e->nbank >= BANK_MAX) {
            ctrl.foreign++;
        } else {
            void *b = pc_grow(e->bank, &e->capbank, e->nbank + 1,
                              sizeof(*e->bank), 16);
            if (!b) {
                ctrl.foreign++;
                goto repost;
            }
            e->bank = b;
            e->bank[e->nbank].id = id;
            e->bank[e->nbank].round = round;
            e->bank[e->nbank].src = sl->src;
            e->bank[e->nbank].tag = tag;
            e->bank[e->nbank].bytes = (int64_t)bytes;
            memcpy(e->bank[e->nbank++].data, data, (size_t)bytes);
            ctrl.unclaimed++;
        }
    }
repost:
    int rc = ep_post(sl);
    if (rc != MPI_SUCCESS)
        fail_listeners(e, pc_transport_is_failure(rc) ? PC_EFAILED : PC_EMPI,
                       "re-posting the control channel receive failed");
}

void pc_ctrl_stats(uint64_t *foreign, uint64_t *unclaimed, uint64_t *posted)
{
    *foreign = ctrl.foreign;
    *unclaimed = ctrl.unclaimed;
    *posted = ctrl.posted;
}

void pc_ctrl_shutdown(void)
{
    while (ctrl.eps)
        ep_destroy(ctrl.eps);
}
