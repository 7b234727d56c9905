/* transport_mpi.c -- the MPI transport: one request table for the whole
 * process, tested with one MPI_Testsome per poll.
 *
 * Requests are kept dense (positions 0..n-1, swap-remove on completion) so
 * MPI_Testsome sees no holes.  A handle names a request for cancel_recv():
 * it indexes a table of positions and carries a generation, so a stale
 * handle (its request already completed) is recognised instead of hitting
 * whatever request took its place. */
#include "transport/pc_transport.h"
#include "common/pc_common.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Open MPI keeps its fault-tolerance extensions (ULFM) in mpi-ext.h */
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define PC_FT 1
#else
#define PC_FT 0
#endif

typedef struct {
    void *owner;
    int64_t cookie;
    int send;
    int hidx;              /* index in the handle table */
} entry;

typedef struct {
    int pos;               /* the request's position, or -1 when free */
    uint32_t gen;
} handle_slot;

typedef struct {
    pc_transport base;
    int n, cap;
    /* by position; reqs, st and idx are MPI_Testsome's own arrays */
    MPI_Request *reqs;
    MPI_Status *st;
    int *idx;
    entry *ent;
    pc_done *done;
    /* by handle */
    handle_slot *handles;
    int *freeh;            /* free handles (a stack) */
    int nfree;
} mpi_tp;

/* Room for one more request: every table doubles.  Each array is counted
 * by the allocation-failure injection in this order (reqs first: see
 * tests/test_core_lifecycle.py); a failure leaves the tables valid. */
static int grow(mpi_tp *t)
{
    int cap = pc_grow_cap(t->cap, t->n + 1, 64);
    MPI_Request *r = pc_realloc(t->reqs, cap * sizeof(*r));
    if (r)
        t->reqs = r;
    MPI_Status *s = pc_realloc(t->st, cap * sizeof(*s));
    if (s)
        t->st = s;
    int *x = pc_realloc(t->idx, cap * sizeof(int));
    if (x)
        t->idx = x;
    entry *e = pc_realloc(t->ent, cap * sizeof(*e));
    if (e)
        t->ent = e;
    pc_done *d = pc_realloc(t->done, cap * sizeof(*d));
    if (d)
        t->done = d;
    handle_slot *h = pc_realloc(t->handles, cap * sizeof(*h));
    if (h)
        t->handles = h;
    int *f = pc_realloc(t->freeh, cap * sizeof(int));
    if (f)
        t->freeh = f;
    if (!r || !s || !x || !e || !d || !h || !f)
        return MPI_ERR_NO_MEM;
    for (int k = t->cap; k < cap; k++) {
        t->handles[k] = (handle_slot){-1, 0};
        t->freeh[t->nfree++] = k;
    }
    t->cap = cap;
    return MPI_SUCCESS;
}

/* ---- requests that survive a failure (pc_transport.h) */

#if PC_FT
/* 1 when the extensions are in use: Open MPI started with --with-ft ulfm,
 * which mpiexec passes on as OMPI_MCA_mpi_ft_enable (the Python side reads
 * the same).  Without them a failure ends the job, and the persistent
 * requests would only cost time (about 5 us more per 8-byte allreduce at
 * 4 ranks here). */
static int ft_in_use(void)
{
    static atomic_int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("OMPI_MCA_mpi_ft_enable");
        v = e && (!strcasecmp(e, "1") || !strcasecmp(e, "true") ||
                  !strcasecmp(e, "yes"));
        atomic_store_explicit(&on, v, memory_order_relaxed);
    }
    return v;
}

static int start_persistent(int rc, MPI_Request *req)
{
    if (rc != MPI_SUCCESS)
        return rc;
    rc = MPI_Start(req);
    if (rc != MPI_SUCCESS)
        MPI_Request_free(req);      /* never started: nothing in flight */
    return rc;
}
#endif

int pc_transport_isend(const void *buf, int count, MPI_Datatype dt, int peer,
                       int tag, MPI_Comm comm, MPI_Request *req)
{
#if PC_FT
    if (ft_in_use())
        return start_persistent(
            MPI_Send_init(buf, count, dt, peer, tag, comm, req), req);
#endif
    return MPI_Isend(buf, count, dt, peer, tag, comm, req);
}

static int start_recv(const pc_msg *m, MPI_Request *req)
{
#if PC_FT
    if (ft_in_use())
        return start_persistent(MPI_Recv_init(m->buf, m->count, m->dt,
                                              m->peer, m->tag, m->comm, req),
                                req);
#endif
    return MPI_Irecv(m->buf, m->count, m->dt, m->peer, m->tag, m->comm, req);
}

int pc_transport_request_done(MPI_Request *req, int err)
{
#if PC_FT
    if (!ft_in_use())
        return 0;
    if (err != MPI_SUCCESS) {
        *req = MPI_REQUEST_NULL;    /* MPI's for ever, never freed */
        return 1;
    }
    if (*req != MPI_REQUEST_NULL)
        MPI_Request_free(req);
#else
    (void)req;
    (void)err;
#endif
    return 0;
}

static int mpi_start(pc_transport *tp, const pc_msg *m, int64_t *handle)
{
    mpi_tp *t = (mpi_tp *)tp;
    int rc;
    if (!pc_alloc_ok() ||
        (t->n == t->cap && (rc = grow(t)) != MPI_SUCCESS))
        return MPI_ERR_NO_MEM;
    MPI_Request req;
    rc = m->send ? pc_transport_isend(m->buf, m->count, m->dt, m->peer,
                                      m->tag, m->comm, &req)
                 : start_recv(m, &req);
    if (rc != MPI_SUCCESS)
        return rc;
    int h = t->freeh[--t->nfree];
    t->handles[h].pos = t->n;
    t->reqs[t->n] = req;
    t->ent[t->n] = (entry){m->owner, m->cookie, m->send, h};
    t->n++;
    if (handle)
        *handle = ((int64_t)t->handles[h].gen << 32) | (uint32_t)h;
    return MPI_SUCCESS;
}

/* Remove the request at position p (already completed or freed). */
static void drop(mpi_tp *t, int p)
{
    int h = t->ent[p].hidx;
    t->handles[h].pos = -1;
    t->handles[h].gen++;
    t->freeh[t->nfree++] = h;
    int last = --t->n;
    if (p != last) {
        t->reqs[p] = t->reqs[last];
        t->ent[p] = t->ent[last];
        t->handles[t->ent[p].hidx].pos = p;
    }
}

static void describe(pc_done *d, const entry *e, const MPI_Status *st,
                     int err)
{
    int bytes = 0;
    d->owner = e->owner;
    d->cookie = e->cookie;
    d->send = e->send;
    d->outcome = PC_MSG_DELIVERED;
    d->mpi_error = err;
    d->source = e->send ? -1 : st->MPI_SOURCE;
    d->t_arrive = d->t_wire = 0;    /* MPI gives no wire times */
    if (!e->send && err == MPI_SUCCESS)
        MPI_Get_count(st, MPI_BYTE, &bytes);
    d->bytes = bytes;
}

static int cmp_desc(const void *a, const void *b)
{
    return *(const int *)b - *(const int *)a;
}

static int mpi_poll(pc_transport *tp, pc_done **out, int *n)
{
    mpi_tp *t = (mpi_tp *)tp;
    int outcount = 0;
    *n = 0;
    *out = t->done;
    if (t->n == 0)
        return MPI_SUCCESS;
    int rc = MPI_Testsome(t->n, t->reqs, &outcount, t->idx, t->st);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        /* the call itself failed: report it on every request it covered,
         * so each owner learns (receives are left posted; the owners'
         * error paths cancel them) */
        for (int p = 0; p < t->n; p++) {
            MPI_Status none = {0};
            describe(&t->done[p], &t->ent[p], &none, rc);
        }
        *n = t->n;
        return rc;
    }
    if (outcount == MPI_UNDEFINED || outcount == 0)
        return MPI_SUCCESS;
    for (int k = 0; k < outcount; k++) {
        int p = t->idx[k];
        int err = rc == MPI_ERR_IN_STATUS ? t->st[k].MPI_ERROR : MPI_SUCCESS;
        describe(&t->done[k], &t->ent[p], &t->st[k], err);
        pc_transport_request_done(&t->reqs[p], err);
    }
    /* swap-remove, highest position first so lower ones stay valid */
    qsort(t->idx, outcount, sizeof(int), cmp_desc);
    for (int k = 0; k < outcount; k++)
        drop(t, t->idx[k]);
    *n = outcount;
    return MPI_SUCCESS;
}

static int mpi_cancel_recv(pc_transport *tp, int64_t handle, pc_done *d)
{
    mpi_tp *t = (mpi_tp *)tp;
    int h = (int)(uint32_t)handle;
    uint32_t g = (uint32_t)(handle >> 32);
    if (h < 0 || h >= t->cap || t->handles[h].gen != g ||
        t->handles[h].pos < 0)
        return -1;                       /* already completed and reported */
    int p = t->handles[h].pos;
    MPI_Status st;
    int cancelled = 0;
    /* cancelling a receive is local: MPI_Wait returns at once */
    MPI_Cancel(&t->reqs[p]);
    int rc = MPI_Wait(&t->reqs[p], &st);
    if (rc == MPI_SUCCESS)
        MPI_Test_cancelled(&st, &cancelled);
    if (!cancelled && d)
        describe(d, &t->ent[p], &st, rc);
    pc_transport_request_done(&t->reqs[p], rc);
    drop(t, p);
    return cancelled ? 1 : 0;
}

static double mpi_next_poll(pc_transport *tp)
{
    (void)tp;
    return HUGE_VAL;
}

static int mpi_outstanding(pc_transport *tp)
{
    return ((mpi_tp *)tp)->n;
}

static void mpi_shutdown(pc_transport *tp)
{
    mpi_tp *t = (mpi_tp *)tp;
    free(t->reqs);
    free(t->st);
    free(t->idx);
    free(t->ent);
    free(t->done);
    free(t->handles);
    free(t->freeh);
    memset(t, 0, sizeof(*t));
}

/* MPICH: MPIX_Stream_progress drives every module's progress, with no
 * communicator (an MPI_Iprobe on MPI_COMM_SELF is served locally and moves
 * nothing; one on a shared communicator could raise a peer's failure).
 * Other MPI libraries: nothing. */
static void mpi_nudge(pc_transport *tp)
{
    (void)tp;
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40100000
    MPIX_Stream_progress(MPIX_STREAM_NULL);
#endif
}

static mpi_tp the_mpi;

/* ---- failures (pc_transport.h) */

int pc_transport_is_failure(int code)
{
    int cls = 0;
    if (code == MPI_SUCCESS || MPI_Error_class(code, &cls) != MPI_SUCCESS)
        return 0;
#ifdef MPIX_ERR_PROC_FAILED
    if (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED)
        return 1;
#endif
#ifdef MPIX_ERR_PROC_FAILED_PENDING
    if (cls == MPIX_ERR_PROC_FAILED_PENDING)
        return 1;
#endif
    return 0;
}

void pc_transport_revoke(MPI_Comm comm)
{
#if PC_FT
    int revoked = 0;
    if (MPIX_Comm_is_revoked(comm, &revoked) == MPI_SUCCESS && !revoked)
        MPIX_Comm_revoke(comm);
#else
    (void)comm;
#endif
}

int pc_transport_failed_ranks(MPI_Comm comm, int *out, int max)
{
#if PC_FT
    MPI_Group failed, all;
    int n = 0;
    if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS)
        return 0;
    if (MPI_Group_size(failed, &n) == MPI_SUCCESS && n > 0 &&
        MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
        int k = n < max ? n : max;
        int *idx = malloc((size_t)(k > 0 ? k : 1) * sizeof(int));
        if (idx) {
            for (int i = 0; i < k; i++)
                idx[i] = i;
            if (MPI_Group_translate_ranks(failed, k, idx, all, out) !=
                MPI_SUCCESS)
                n = 0;
            free(idx);
        } else {
            n = 0;
        }
        MPI_Group_free(&all);
    }
    MPI_Group_free(&failed);
    return n;
#else
    (void)comm;
    (void)out;
    (void)max;
    return 0;
#endif
}

pc_transport *pc_transport_mpi(void)
{
    the_mpi.base = (pc_transport){"mpi", mpi_start, mpi_poll,
                                  mpi_cancel_recv, mpi_next_poll,
                                  mpi_outstanding, mpi_shutdown, mpi_nudge,
                                  1, 2000};
    return &the_mpi.base;
}
