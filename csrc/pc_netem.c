/* pc_netem.c -- the emulated network as a transport (model: pc_netem.h).
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
#include "pc_netem.h"
#include "pc_sched.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NETEM_MAGIC 0x70636e6574656d31ULL      /* "pcnetem1" */
enum { COOKIE_NETEM_RECV = -4 };

typedef struct nsend {
    pc_msg m;
    uint64_t id;
    int lost;
    double t_start, t_end, t_deliver;
    unsigned char *copy;               /* header + data, once handed over */
    struct nsend *next;
} nsend;

typedef struct nrecv {
    void *owner;
    int64_t cookie, expect, handle;
    double hdr[2];                     /* the sender's header lands here:
                                          {arrival (< 0: lost), wire start} */
    struct nrecv *prev, *next;         /* every live receive (for cancel) */
} nrecv;

typedef struct {
    pc_transport base;
    pc_transport *wire;
    netem_config cfg;
    netem_shm *S;
    size_t shm_size;
    int me, P;
    struct { nsend *head, *tail; int in_shm; } *out;   /* by dst, level */
    uint64_t next_id, *counter;     /* [dst * NCLASS + class] */
    int queued;                     /* sends not yet handed to MPI */
    /* sends handed to MPI, their copies in flight (their own requests) */
    MPI_Request *sreq;
    nsend **sent;
    int *sidx;
    MPI_Status *sst;
    int nsent, capsent;
    nsend **heap;                   /* waiting for their delivery time */
    int nheap, capheap;
    nrecv *recs;                    /* live receives */
    pc_done *done;
    int capdone;
    double next_finish;
    /* the model needs no advancing before skip_until while S->gen is
     * seen_gen (netem_poll) */
    uint64_t seen_gen;
    double skip_until;
    unsigned lossy;                 /* bit c: class c may lose a message */
} netem;

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

/* ---- the shared segment */
static void shm_lock(netem *N)
{
    if (pthread_mutex_lock(&N->S->mtx) == EOWNERDEAD)
        pthread_mutex_consistent(&N->S->mtx);   /* a rank died holding it */
}

static int attach(netem *N, char *err, int errlen)
{
    size_t size = sizeof(netem_shm) + (size_t)N->P * N->P * NETEM_NLEVEL *
                                          sizeof(netem_chan);
    int fd = shm_open(N->cfg.shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    int creator = fd >= 0;
    if (!creator && errno == EEXIST)
        fd = shm_open(N->cfg.shm, O_RDWR, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "emulated network: shm_open(%s): %s",
                 N->cfg.shm, strerror(errno));
        return -1;
    }
    struct stat st;
    double t_give_up = pc_now() + 30;
    if (creator) {
        if (ftruncate(fd, (off_t)size) != 0)
            goto fail;
    } else {
        while (fstat(fd, &st) == 0 && (size_t)st.st_size < size &&
               pc_now() < t_give_up) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    N->S = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    fd = -1;
    if (N->S == MAP_FAILED) {
        N->S = NULL;
        goto fail;
    }
    N->shm_size = size;
    netem_shm *S = N->S;
    if (creator) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&S->mtx, &a);
        pthread_mutexattr_destroy(&a);
        S->P = N->P;
        S->t0 = S->t_model = pc_now();
        S->magic = NETEM_MAGIC;
        atomic_store(&S->ready, 1);
    }
    while (!atomic_load(&S->ready) && pc_now() < t_give_up) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (!atomic_load(&S->ready) || S->magic != NETEM_MAGIC || S->P != N->P) {
        snprintf(err, errlen, "emulated network: segment %s is not a "
                 "network of %d ranks (another job's, or a rank never "
                 "created it)", N->cfg.shm, N->P);
        munmap(S, size);
        N->S = NULL;
        return -1;
    }
    /* Once every rank has it mapped the name has done its work: unlink it
     * now, so that a job that dies (MPI_Abort, a signal) leaves nothing in
     * /dev/shm.  The mapping lives until each rank's detach. */
    if (atomic_fetch_add(&S->attached, 1) + 1 == N->P &&
        atomic_exchange(&S->unlinked, 1) == 0)
        shm_unlink(N->cfg.shm);
    return 0;
fail:
    snprintf(err, errlen, "emulated network: setting up %s: %s", N->cfg.shm,
             strerror(errno));
    if (fd >= 0)
        close(fd);
    if (creator)
        shm_unlink(N->cfg.shm);
    return -1;
}

static void detach(netem *N)
{
    if (!N->S)
        return;
    if (atomic_fetch_sub(&N->S->attached, 1) == 1 &&
        atomic_exchange(&N->S->unlinked, 1) == 0)
        shm_unlink(N->cfg.shm);     /* a rank left before all attached */
    munmap(N->S, N->shm_size);
    N->S = NULL;
}

/* ---- sends */
static int channel_push(netem *N, nsend *x)
{
    int level = netem_level(&N->cfg, x->m.tclass);
    netem_chan *ch = &N->S->ch[netem_chan_at(N->P, N->me, x->m.wpeer, level)];
    if (ch->n >= NETEM_QCAP)
        return 0;
    int64_t bytes = x->m.bytes > 0 ? x->m.bytes : 0;
    double hold = N->cfg.overhead;       /* the per-message cost */
    if (level == 1 && isfinite(N->cfg.low_buffer) && !x->lost &&
        netem_low_backlog(&N->cfg, N->S, N->me) + (double)bytes >
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

static int heap_push(netem *N, nsend *x)
{
    if (N->nheap == N->capheap) {
        int cap = N->capheap ? 2 * N->capheap : 64;
        nsend **h = pc_realloc(N->heap, cap * sizeof(*h));
        if (!h)
            return -1;
        N->heap = h;
        N->capheap = cap;
    }
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

/* With the segment locked: bring the model to now, collect this rank's
 * messages that left the wire, push waiting ones into free ring places. */
static int sync_model(netem *N, double now)
{
    int moved = 0, stuck = 0;
    shm_lock(N);
    netem_advance(&N->cfg, N->S, now);
    for (int x_ = 0; x_ < N->P * NETEM_NLEVEL; x_++) {
        int d = x_ / NETEM_NLEVEL, lv = x_ % NETEM_NLEVEL;
        netem_chan *ch = &N->S->ch[netem_chan_at(N->P, N->me, d, lv)];
        while (ch->n > 0 && ch->e[ch->head].state == ENT_DONE) {
            netem_ent *e = &ch->e[ch->head];
            nsend *x = N->out[x_].head;
            if (x && x->id == e->id) {
                x->t_start = e->t_start;
                x->t_end = e->t_end;
                x->t_deliver = e->t_end + netem_latency(&N->cfg, N->me, d);
                if (heap_push(N, x) < 0) {
                    stuck = 1;            /* no memory: collect it later */
                    break;
                }
            }
            ch->head = (ch->head + 1) % NETEM_QCAP;
            ch->n--;
            ch->cur--;
            if (!x || x->id != e->id)
                continue;                 /* cannot happen: FIFO both */
            N->out[x_].head = x->next;
            if (!x->next)
                N->out[x_].tail = NULL;
            N->out[x_].in_shm--;
            moved++;
        }
        /* waiting sends take free places, in order */
        nsend *x = N->out[x_].head;
        for (int k = 0; x && k < N->out[x_].in_shm; k++)
            x = x->next;
        for (; x && channel_push(N, x); x = x->next)
            N->out[x_].in_shm++;
    }
    N->next_finish = netem_next_finish(&N->cfg, N->S, N->me,
                                       &N->skip_until);
    N->seen_gen = atomic_load(&N->S->gen);
    if (stuck)
        N->skip_until = -INFINITY;        /* retry at the next poll */
    pthread_mutex_unlock(&N->S->mtx);
    return moved;
}

static int netem_start(pc_transport *tp, const pc_msg *m, int64_t *handle)
{
    netem *N = (netem *)tp;
    if (m->space != PC_HOST)
        return err_device;
    if (!m->send) {
        /* receives go to MPI now; their completions are mapped in poll() */
        nrecv *r = malloc(sizeof(*r));
        if (!r)
            return MPI_ERR_NO_MEM;
        *r = (nrecv){m->owner, m->cookie, m->bytes, -1, {0, 0}, NULL,
                     N->recs};
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
    if (m->wpeer < 0 || m->wpeer >= N->P)
        return MPI_ERR_RANK;
    nsend *x = malloc(sizeof(*x));
    if (!x)
        return MPI_ERR_NO_MEM;
    int cls = m->tclass;
    *x = (nsend){*m, N->next_id++, 0, 0, 0, 0, NULL, NULL};
    if (cls >= 0 && cls < NETEM_NCLASS)
        x->lost = netem_lost(&N->cfg, N->me, m->wpeer, cls,
                             N->counter[m->wpeer * NETEM_NCLASS + cls]++);
    int q = m->wpeer * NETEM_NLEVEL + netem_level(&N->cfg, cls);
    if (N->out[q].tail)
        N->out[q].tail->next = x;
    else
        N->out[q].head = x;
    N->out[q].tail = x;
    N->queued++;
    sync_model(N, pc_now());
    if (handle)
        *handle = -1;                   /* sends are never cancelled */
    return MPI_SUCCESS;
}

static int add_done(netem *N, int n, const pc_done *d)
{
    if (n == N->capdone) {
        int cap = N->capdone ? 2 * N->capdone : 64;
        pc_done *p = pc_realloc(N->done, cap * sizeof(*p));
        if (!p)
            return n;                   /* reported on a later poll */
        N->done = p;
        N->capdone = cap;
    }
    N->done[n] = *d;
    return n + 1;
}

/* Start x's copy (header, then data unless it was lost) on the wire, its
 * request kept with ours. */
static int send_copy(netem *N, nsend *x)
{
    if (N->nsent == N->capsent) {
        int cap = N->capsent ? 2 * N->capsent : 64;
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
    int rc = MPI_Isend(x->copy, (int)(sizeof hdr + data), MPI_BYTE, x->m.peer,
                       x->m.tag, x->m.comm, &N->sreq[N->nsent]);
    if (rc != MPI_SUCCESS) {
        free(x->copy);
        x->copy = NULL;
        return rc;
    }
    N->sent[N->nsent++] = x;
    return MPI_SUCCESS;
}

/* Hand due messages to MPI; a failure becomes the send's completion. */
static int deliver(netem *N, double now, int n)
{
    while (N->nheap > 0 && N->heap[0]->t_deliver <= now) {
        nsend *x = heap_pop(N);
        if (pc_tl_on && x->m.tclass >= 0) {
            pc_tl_msg(PC_EV_WIRE_START, x->t_start, x->m.trace_sched,
                      x->m.trace_op, x->m.trace_round, x->m.wpeer, x->m.tag,
                      x->m.bytes, x->m.prio, x->lost ? PC_OC_DROPPED : 0);
            pc_tl_msg(PC_EV_WIRE_END, x->t_end, x->m.trace_sched,
                      x->m.trace_op, x->m.trace_round, x->m.wpeer, x->m.tag,
                      x->m.bytes, x->m.prio, x->lost ? PC_OC_DROPPED : 0);
        }
        N->queued--;
        int rc = send_copy(N, x);
        /* delivered: the send is complete (design constraint 6), whenever
         * MPI is done with the copy */
        pc_done d = {x->m.owner, x->m.cookie, 1, PC_MSG_DELIVERED, 0, -1,
                     rc, 0};
        n = add_done(N, n, &d);
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

static int sends_done(netem *N, int n, int *rc)
{
    int out = 0;
    if (N->nsent == 0)
        return n;
    int r = MPI_Testsome(N->nsent, N->sreq, &out, N->sidx, N->sst);
    if (r != MPI_SUCCESS && r != MPI_ERR_IN_STATUS) {
        /* the call itself failed; the copies stay, MPI may still read
         * them */
        copy_failed(r);
        for (int k = 0; k < N->nsent; k++)
            free(N->sent[k]);
        N->nsent = 0;
        *rc = r;
        return n;
    }
    if (out == MPI_UNDEFINED || out == 0)
        return n;
    for (int k = 0; k < out; k++) {
        nsend *x = N->sent[N->sidx[k]];
        if (r == MPI_ERR_IN_STATUS && N->sst[k].MPI_ERROR != MPI_SUCCESS)
            copy_failed(N->sst[k].MPI_ERROR);
        free(x->copy);
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
    return n;
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
        sync_model(N, now);
    k = deliver(N, now, k);
    int rc_sent = MPI_SUCCESS;
    k = sends_done(N, k, &rc_sent);
    pc_done *d;
    int m = 0;
    int rc = N->wire->poll(N->wire, &d, &m);
    for (int j = 0; j < m; j++) {
        if (d[j].cookie == COOKIE_NETEM_RECV)
            map_recv(N, &d[j]);
        k = add_done(N, k, &d[j]);
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

static void netem_shutdown(pc_transport *tp)
{
    netem *N = (netem *)tp;
    if (current == N)
        current = NULL;
    detach(N);
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
                             netem_outstanding, netem_shutdown, 0, 64};
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
    if (attach(N, err, errlen) != 0)
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
