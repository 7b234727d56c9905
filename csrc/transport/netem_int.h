/* netem_int.h -- between the files of the emulated network (the model is
 * described in pc_netem.h):
 *
 *   netem.c         the transport: receives, poll, cancel, create, shutdown
 *   netem_send.c    sends: the channels, the delivery heap, hand-over to MPI
 *   netem_shm.c     the shared segment every rank maps
 *   netem_model.c   rates, drops and the fluid model (pure computation)
 *   netem_config.c  the description's parser
 *
 * Calls go down that list, never back up.  Not for the engine. */
#ifndef NETEM_INT_H
#define NETEM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "transport/pc_netem.h"
#include "common/pc_common.h"

enum { NETEM_QCAP = 256, NETEM_NCLASS = PC_NCLASS, NETEM_MAXRANKS = 256,
       NETEM_NLEVEL = 2 };

/* ---- the description (netem_config.c) */
typedef struct {
    int nranks;                 /* ranks covered */
    int *ranks;
    int nic;                    /* NIC_OUT, NIC_IN, or 2: both */
    double every;
    int factors;                /* values are factors of the base rate */
    int nvalues;
    double *values, *cum;       /* cumulative probabilities */
} netem_trace;

typedef struct {
    int src, dst, tclass;       /* tclass -2: every class */
    double drop;
} netem_drop;

typedef struct {
    char shm[128];
    int P;
    uint64_t seed;
    int silent;                 /* drop mode */
    double tick;                /* longest sleep while own flows are on */
    double overhead;            /* per message, seconds (see the model) */
    double *out_rate, *in_rate; /* base rates, bytes/s (INFINITY: none) */
    double latency_default, *latency;   /* P*P, NAN: default */
    double drop_class[NETEM_NCLASS];
    int class_level[NETEM_NCLASS];      /* 0: high (default), 1: low */
    double weight[NETEM_NLEVEL];        /* NIC share per level (1, 1) */
    double low_buffer;                  /* bytes (INFINITY: no limit) */
    netem_drop *drops;
    int ndrops;
    netem_trace *traces;
    int ntraces;
} netem_config;

int netem_parse(netem_config *c, const char *text, char *err, int errlen);
void netem_config_free(netem_config *c);
double netem_latency(const netem_config *c, int src, int dst);
int netem_level(const netem_config *c, int tclass);

/* ---- the shared state (netem_shm.c maps it) */
/* one message in a channel's ring */
typedef struct {
    int64_t bytes;
    uint64_t id;
    double left;                /* bytes not yet on the wire */
    double t_start, t_end;
    int state;                  /* ENT_QUEUED, ENT_WIRE, ENT_DONE */
    double hold;                /* seconds at the head before bytes flow */
} netem_ent;

enum { ENT_QUEUED = 0, ENT_WIRE = 1, ENT_DONE = 2 };

typedef struct {
    uint32_t head, n;           /* entries head .. head + n - 1 (mod QCAP) */
    uint32_t cur;               /* offset of the first entry not done */
    netem_ent e[NETEM_QCAP];
} netem_chan;

typedef struct {
    uint64_t magic;
    _Atomic int ready, attached;
    _Atomic int unlinked;       /* the name is gone: every rank attached */
    pthread_mutex_t mtx;        /* process-shared */
    int P;
    double t0;                  /* the network's time zero */
    double t_model;             /* the model is advanced up to here */
    /* bumped (mutex held) whenever a message joins a channel: the only
     * change to the flows that does not happen at a model event (a flow's
     * end, a rate redraw), so a rank that saw `gen` and the next event may
     * skip the model until then (netem.c, netem_poll) */
    _Atomic uint64_t gen;
    netem_chan ch[];            /* P * P * NLEVEL, see netem_chan_at() */
} netem_shm;

/* channels: one FIFO per (src, dst, priority level) */
static inline int netem_chan_at(int P, int src, int dst, int level)
{
    return (src * P + dst) * NETEM_NLEVEL + level;
}
static inline int netem_chan_src(int P, int x) { return x / (P * NETEM_NLEVEL); }
static inline int netem_chan_dst(int P, int x) { return (x / NETEM_NLEVEL) % P; }
static inline int netem_chan_level(int x) { return x % NETEM_NLEVEL; }

/* ---- the model (netem_model.c), segment mutex held where it takes one */
double netem_drop_p(const netem_config *c, int src, int dst, int tclass);
int netem_lost(const netem_config *c, int src, int dst, int tclass,
               uint64_t k);
/* advance the fluid model to `now` */
void netem_advance(const netem_config *c, netem_shm *S, double now);
/* when the first of src's messages on the wire would finish at the
 * current rates, or the first hold of one ends; INFINITY if none.  *event
 * (if not NULL): the model's next event of any rank at the current rates,
 * the first flow's end, hold's end or rate redraw (INFINITY if none):
 * until then, and while no message joins a channel, the rates stay as
 * they are. */
double netem_next_finish(const netem_config *c, netem_shm *S, int src,
                         double *event);
/* the rate of a NIC at time t */
double netem_rate(const netem_config *c, double t0, int rank, int nic,
                  double t);

/* ---- this rank's side of the network (the transport's state) */
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
    /* sends handed to MPI, their copies in flight (their own requests):
     * sreq, sidx and sst are MPI_Testsome's arrays, sent[k] is sreq[k]'s */
    MPI_Request *sreq;
    nsend **sent;
    int *sidx;
    MPI_Status *sst;
    int nsent, capsent;
    nsend **heap;                   /* waiting for their delivery time */
    int nheap, capheap;
    nrecv *recs;                    /* live receives */
    pc_done *done;                  /* this poll's completions */
    int capdone;
    double next_finish;
    /* the model needs no advancing before skip_until while S->gen is
     * seen_gen (netem_poll) */
    uint64_t seen_gen;
    double skip_until;
    unsigned lossy;                 /* bit c: class c may lose a message */
} netem;

/* netem_shm.c */
int netem_attach(netem *N, char *err, int errlen);
void netem_detach(netem *N);
void netem_shm_lock(netem *N);

/* netem_send.c */
int netem_reserve(netem *N);         /* room to take one more message */
void netem_enqueue(netem *N, nsend *x);
int netem_sync_model(netem *N, double now);
/* room for `need` completions in N->done; -1: none (report nothing more) */
int netem_reserve_done(netem *N, int need);
int netem_deliver(netem *N, double now, int n);
int netem_sends_done(netem *N);

#endif
