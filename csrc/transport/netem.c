/* netem.c -- the emulated network as a transport (model: pc_netem.h; its
 * files: netem_int.h).
 *
 * Design constraints:
 *  1. It decides when a message arrives, then hands it to the MPI transport
 *     at that moment: the data only moves (over shared memory, in
 *     microseconds) once the emulated wire has carried it, so a receiver
 *     never sees data early and a lost message's data never moves at all.
 *  2. The order of a channel is kept: messages of one (src, dst) pair leave
 *     the emulated wire in order and are handed to MPI in order.
 *  3. Every message carries a 16-byte header in front of its data: the
 *     model's arrival time (its last byte off the wire, plus the latency)
 *     and when its first byte went on the wire.  The receiver reports them
 *     as the receive's t_arrive and t_wire, as NIC hardware timestamps
 *     would, however late its own progress thread (or the sender's, which
 *     hands the message over) ran on an oversubscribed host, and however
 *     long the message waited behind others in its channel.
 *     Header and data travel as one MPI message.  The sender copies them
 *     into one contiguous buffer (an MPI send from a struct datatype over
 *     two addresses, with no copy, took 100 to 1000 times longer for 4 MB
 *     on an oversubscribed host: MPICH packs it through small cells, each
 *     needing both processes to run); the receiver receives into a struct
 *     datatype over its header and the caller's buffer, which is about as
 *     fast as a contiguous receive.  The sender keeps its copies' requests
 *     itself (not in the MPI transport's table), so a transport holding
 *     them reports them as outstanding and is not replaced before they
 *     complete.  Device buffers (the CUDA-aware path) are refused: the
 *     copy and the header are host memory.
 *  4. A lost message is replaced by a header alone, its arrival negated, on the
 *     same communicator, peer and tag, so it keeps its place in MPI's
 *     matching order; the receiver maps it to DROPPED ("told") or SWALLOWED
 *     ("silent": the receive runs into its deadline).  A zero-byte payload
 *     is a header alone with a positive time.
 *  5. No thread of its own: the engine polls it, and asks next_poll() how
 *     long it may sleep (the next delivery, the next predicted end of one
 *     of its own transfers, or `tick` while its transfers share the wire
 *     with others whose ends may speed them up).
 *  6. A send completes when the emulated wire has delivered it, as on a
 *     real network whose NIC buffers what no receive is posted for yet:
 *     not when MPI is done with the copy, which for a large message waits
 *     until the receiver posts its receive (rendezvous).  Waiting for the
 *     receiver deadlocked the per-destination send cap: a send in flight
 *     to B, whose receive B posts only after a message queued behind it,
 *     held the slot forever.  (Transports say which they do: sends_wait.)
 */
#include "transport/netem_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static netem *current;       /* the network in use (for the queries) */
static int err_device = MPI_ERR_BUFFER;   /* refusing device buffers */

/* A receive of w's buffer behind the 16-byte header hdr, as one message:
 * a struct datatype of bytes over both addresses (w->buf becomes
 * MPI_BOTTOM), or the header alone when there is no buffer.  *made
 * (MPI_DATATYPE_NULL if none) is the caller's to free once the receive is
 * posted: MPI keeps it while the receive needs it. */
static int behind_header(pc_msg *w, double hdr[2], MPI_Datatype *made)
{
    *made = MPI_DATATYPE_NULL;
    if (w->bytes == 0) {
        w->buf = hdr;
        w->count = (int)(2 * sizeof *hdr);
        w->dt = MPI_BYTE;
        return MPI_SUCCESS;
    }
    int len[2] = {(int)(2 * sizeof *hdr), (int)w->bytes};
    MPI_Aint at[2];
    MPI_Datatype types[2] = {MPI_BYTE, MPI_BYTE};
    int rc = MPI_Get_address(hdr, &at[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Get_address(w->buf, &at[1]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_create_struct(2, len, at, types, made);
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(made)) != MPI_SUCCESS)
        MPI_Type_free(made);
    if (rc != MPI_SUCCESS) {
        *made = MPI_DATATYPE_NULL;
        return rc;
    }
    w->buf = MPI_BOTTOM;
    w->count = 1;
    w->dt = *made;
    return MPI_SUCCESS;
}

/* ---- receives go to MPI at once; their completions are mapped in poll() */
static int start_recv(netem *N, const pc_msg *m, int64_t *handle)
{
    nrecv *r = malloc(sizeof(*r));
    if (!r)
        return MPI_ERR_NO_MEM;
    *r = (nrecv){m->owner, m->cookie, m->bytes, -1, {0, 0}, NULL, N->recs};
    pc_msg w = *m;
    w.owner = r;
    w.cookie = COOKIE_NETEM_RECV;
    MPI_Datatype made;
    int rc = behind_header(&w, r->hdr, &made);
    if (rc == MPI_SUCCESS)
        rc = N->wire->start(N->wire, &w, &r->handle);
    if (made != MPI_DATATYPE_NULL)
        MPI_Type_free(&made);
    if (rc != MPI_SUCCESS) {
        free(r);
        return rc;
    }
    if (N->recs)
        N->recs->prev = r;
    N->recs = r;
    if (handle)
        *handle = r->handle;
    return MPI_SUCCESS;
}

static void unlink_recv(netem *N, nrecv *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        N->recs = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

static void map_recv(netem *N, pc_done *d)
{
    nrecv *r = d->owner;
    unlink_recv(N, r);
    d->owner = r->owner;
    d->cookie = r->cookie;
    if (d->mpi_error == MPI_SUCCESS) {
        int lost = r->hdr[0] < 0;
        d->t_arrive = fabs(r->hdr[0]);
        d->t_wire = r->hdr[1];
        d->bytes = d->bytes > (int64_t)sizeof r->hdr
                       ? d->bytes - (int64_t)sizeof r->hdr : 0;
        d->outcome = !lost ? PC_MSG_DELIVERED
                           : N->cfg.silent ? PC_MSG_SWALLOWED
                                           : PC_MSG_DROPPED;
    }
    free(r);
}

/* ---- the transport */
static int netem_start(pc_transport *tp, const pc_msg *m, int64_t *handle)
{
    netem *N = (netem *)tp;
    if (m->space != PC_HOST)
        return err_device;
    if (netem_reserve(N) != 0)
        return MPI_ERR_NO_MEM;
    if (!m->send)
        return start_recv(N, m, handle);
    if (m->wpeer < 0 || m->wpeer >= N->P)
        return MPI_ERR_RANK;
    nsend *x = malloc(sizeof(*x));
    if (!x)
        return MPI_ERR_NO_MEM;
    *x = (nsend){*m, N->next_id++, 0, 0, 0, 0, NULL, NULL};
    netem_enqueue(N, x);
    netem_sync_model(N, pc_now());
    if (handle)
        *handle = -1;                   /* sends are never cancelled */
    return MPI_SUCCESS;
}

static int netem_poll(pc_transport *tp, pc_done **out, int *n)
{
    netem *N = (netem *)tp;
    double now = pc_now();
    int k = 0;
    /* some are on (or wait for) the wire.  Between the model's events the
     * flows' rates are fixed and none of them ends, so a poll before the
     * next event, with no message queued anywhere since, has nothing to
     * collect: it skips the lock and the model (most polls, which cost
     * each rank about half a core on a wire of a few hundred MB/s). */
    if (N->queued > N->nheap &&
        (now >= N->skip_until || atomic_load(&N->S->gen) != N->seen_gen))
        netem_sync_model(N, now);
    k = netem_deliver(N, now, k);
    int rc_sent = netem_sends_done(N);
    /* the wire reports at most what it has outstanding, which has room
     * (netem_reserve); were there none, the wire would keep its
     * completions for a later poll rather than lose one */
    pc_done *d;
    int m = 0, rc = MPI_SUCCESS;
    if (netem_reserve_done(N, k + N->wire->outstanding(N->wire)) == 0) {
        rc = N->wire->poll(N->wire, &d, &m);
        for (int j = 0; j < m; j++) {
            if (d[j].cookie == COOKIE_NETEM_RECV)
                map_recv(N, &d[j]);
            N->done[k++] = d[j];
        }
    }
    *out = N->done;
    *n = k;
    return rc != MPI_SUCCESS ? rc : rc_sent;
}

static int netem_cancel_recv(pc_transport *tp, int64_t handle, pc_done *d)
{
    netem *N = (netem *)tp;
    nrecv *r = N->recs;
    while (r && r->handle != handle)
        r = r->next;
    pc_done tmp;
    int c = N->wire->cancel_recv(N->wire, handle, &tmp);
    if (c == 0 && tmp.cookie == COOKIE_NETEM_RECV) {
        map_recv(N, &tmp);                /* it had completed */
        if (d)
            *d = tmp;
    } else if (c == 1 && r) {
        unlink_recv(N, r);
        free(r);
    }
    return c;
}

static double netem_next_poll(pc_transport *tp)
{
    netem *N = (netem *)tp;
    double t = N->nheap ? N->heap[0]->t_deliver : INFINITY;
    if (N->queued > N->nheap) {           /* own messages on the wire */
        double cap = pc_now() + N->cfg.tick;
        double f = N->next_finish < cap ? N->next_finish : cap;
        if (f < t)
            t = f;
    }
    return t;
}

static int netem_outstanding(pc_transport *tp)
{
    netem *N = (netem *)tp;
    return N->wire->outstanding(N->wire) + N->queued + N->nsent;
}

static void netem_nudge(pc_transport *tp)
{
    netem *N = (netem *)tp;
    N->wire->nudge(N->wire);
}

static void netem_shutdown(pc_transport *tp)
{
    netem *N = (netem *)tp;
    if (current == N)
        current = NULL;
    netem_detach(N);
    for (int d = 0; N->out && d < N->P * NETEM_NLEVEL; d++)
        for (nsend *x = N->out[d].head, *nx; x; x = nx) {
            nx = x->next;
            free(x);
        }
    for (int k = 0; k < N->nheap; k++)
        free(N->heap[k]);
    /* a send MPI still has (the engine's drain ran out of time) keeps its
     * copy: MPI may yet read it; the records go */
    for (int k = 0; k < N->nsent; k++)
        free(N->sent[k]);
    free(N->sreq);
    free(N->sent);
    free(N->sidx);
    free(N->sst);
    for (nrecv *r = N->recs, *nx; r; r = nx) {
        nx = r->next;
        free(r);
    }
    free(N->out);
    free(N->counter);
    free(N->heap);
    free(N->done);
    netem_config_free(&N->cfg);
    free(N);
}

unsigned pc_netem_lossy(void)
{
    netem *N = current;
    return N ? N->lossy : 0;
}

int pc_netem_query(int rank, int nic, double t, double *rate, double *t0)
{
    netem *N = current;
    if (!N || rank < 0 || rank >= N->P || (nic != NIC_OUT && nic != NIC_IN))
        return -1;
    *t0 = N->S->t0;
    *rate = netem_rate(&N->cfg, N->S->t0, rank, nic, t);
    return 0;
}

/* An MPI error code of our own, so that a refused device buffer says why
 * (MPI_ERR_BUFFER if MPI has no room for it). */
static void name_device_error(void)
{
    static int named;
    int cls;
    if (named)
        return;
    named = 1;
    if (MPI_Add_error_class(&cls) == MPI_SUCCESS &&
        MPI_Add_error_string(cls, "the emulated network carries host "
                             "buffers only: give device buffers the staged "
                             "path (partialcoll.set_gpu_path(\"staged\"))")
            == MPI_SUCCESS)
        err_device = cls;
}

pc_transport *pc_netem_create(pc_transport *wire, const char *config,
                              char *err, int errlen)
{
    netem *N = calloc(1, sizeof(*N));
    if (!N) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    N->base = (pc_transport){"netem", netem_start, netem_poll,
                             netem_cancel_recv, netem_next_poll,
                             netem_outstanding, netem_shutdown, netem_nudge,
                             0, 64};
    N->wire = wire;
    N->next_finish = INFINITY;
    if (netem_parse(&N->cfg, config, err, errlen) != 0)
        goto fail;
    MPI_Comm_rank(MPI_COMM_WORLD, &N->me);
    MPI_Comm_size(MPI_COMM_WORLD, &N->P);
    if (N->P != N->cfg.P) {
        snprintf(err, errlen, "the network describes %d ranks, "
                 "MPI_COMM_WORLD has %d", N->cfg.P, N->P);
        goto fail;
    }
    N->out = calloc((size_t)N->P * NETEM_NLEVEL, sizeof(*N->out));
    N->counter = calloc((size_t)N->P * NETEM_NCLASS, sizeof(uint64_t));
    if (!N->out || !N->counter) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (netem_attach(N, err, errlen) != 0)
        goto fail;
    for (int c = 0; c < NETEM_NCLASS; c++) {
        /* a drop on some pair, or tail drops of a low level's buffer */
        int may = N->cfg.class_level[c] == 1 && isfinite(N->cfg.low_buffer);
        for (int a = 0; a < N->P && !may; a++)
            for (int b = 0; b < N->P && !may; b++)
                may = a != b && netem_drop_p(&N->cfg, a, b, c) > 0;
        N->lossy |= (unsigned)may << c;
    }
    name_device_error();
    current = N;
    return &N->base;
fail:
    netem_shutdown(&N->base);
    return NULL;
}
