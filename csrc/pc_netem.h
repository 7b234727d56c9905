/* pc_netem.h -- the emulated network's model, shared by pc_netem.c (the
 * transport) and pc_netem_model.c (configuration, rates, the fluid model).
 *
 * The model (one host; every rank sees the same CLOCK_MONOTONIC):
 *   - every rank r has an outgoing and an incoming NIC with a rate (bytes/s,
 *     INFINITY for unlimited); rates may follow seeded piecewise-constant
 *     traces: every `every` seconds a new rate is drawn, independently per
 *     NIC, from a discrete distribution (absolute rates or factors of the
 *     NIC's base rate);
 *   - each ordered pair (src, dst) is a FIFO channel: its messages go on the
 *     wire one after another, and each arrives `latency(src, dst)` after its
 *     last byte left;
 *   - a per-message cost (`overhead`, 0 by default): a message at the head
 *     of its channel holds it that long before its first byte moves, taking
 *     no share of a NIC meanwhile (a sender's per-message work: a system
 *     call, protocol processing, handling a request), so back-to-back
 *     messages of s bytes on one channel move at most s / (overhead +
 *     s / rate) bytes/s;
 *   - messages on the wire at the same time share the NICs max-min fairly
 *     (progressive filling over the out-NIC of the sender and the in-NIC of
 *     the receiver: two senders into one receiver get half each);
 *   - a message is lost with probability drop(src, dst, traffic class),
 *     decided by the sender from a counter-based hash of (seed, src, dst,
 *     class, message number): the same messages are lost in every run.  A
 *     lost message still uses the wire; the receiver is told (mode "told")
 *     or not ("silent": its receive must time out).  Class -1 (the control
 *     channel of round-stamped messages) is never dropped;
 *   - two priority levels: each traffic class is "high" (the default) or
 *     "low"; a channel is FIFO per level, and flows share a NIC by weight
 *     (weighted max-min: a high flow gets `weight` times a low one's share;
 *     a very large weight is strict priority).  A sender's NIC holds at
 *     most `low_buffer` bytes of low-priority data waiting or on the wire: a
 *     low message that does not fit is dropped at once (tail drop, it never
 *     uses the wire), told or silent as above.
 * Not modelled: switch buffers and queueing inside the network, congestion
 * control, multiple hosts.
 *
 * The state every rank must agree on (channel queues, flows, the model's
 * time) lives in a POSIX shared-memory segment guarded by a process-shared
 * mutex; any rank may advance the model, which is analytic between events.
 */
#ifndef PC_NETEM_H
#define PC_NETEM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

enum { NETEM_QCAP = 256, NETEM_NCLASS = 16, NETEM_MAXRANKS = 256,
       NETEM_NLEVEL = 2 };
enum { NIC_OUT = 0, NIC_IN = 1 };

/* channels: one FIFO per (src, dst, priority level) */
static inline int netem_chan_at(int P, int src, int dst, int level)
{
    return (src * P + dst) * NETEM_NLEVEL + level;
}
static inline int netem_chan_src(int P, int x) { return x / (P * NETEM_NLEVEL); }
static inline int netem_chan_dst(int P, int x) { return (x / NETEM_NLEVEL) % P; }
static inline int netem_chan_level(int x) { return x % NETEM_NLEVEL; }

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

/* one message in a channel's ring (shared memory) */
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
     * skip the model until then (pc_netem.c, netem_poll) */
    _Atomic uint64_t gen;
    netem_chan ch[];            /* P * P * NLEVEL, see netem_chan_at() */
} netem_shm;

int netem_parse(netem_config *c, const char *text, char *err, int errlen);
void netem_config_free(netem_config *c);
double netem_latency(const netem_config *c, int src, int dst);
double netem_drop_p(const netem_config *c, int src, int dst, int tclass);
int netem_lost(const netem_config *c, int src, int dst, int tclass,
               uint64_t k);
int netem_level(const netem_config *c, int tclass);
/* bytes of low-priority data rank src's NIC holds (mutex held) */
double netem_low_backlog(const netem_config *c, netem_shm *S, int src);
/* advance the fluid model to `now` (mutex held) */
void netem_advance(const netem_config *c, netem_shm *S, double now);
/* when the first of src's messages on the wire would finish at the
 * current rates, or the first hold of one ends (mutex held); INFINITY if
 * none.  *event (if not NULL): the model's next event of any rank at the
 * current rates, the first flow's end, hold's end or rate redraw
 * (INFINITY if none): until then, and while no message joins a channel,
 * the rates stay as they are. */
double netem_next_finish(const netem_config *c, netem_shm *S, int src,
                         double *event);
/* the rate of a NIC at time t */
double netem_rate(const netem_config *c, double t0, int rank, int nic,
                  double t);
/* the model alone on a private segment, for tests (pc_netem_model.c) */
double netem_model_probe(const char *config, double t0, double t,
                         const double *msgs, int n, double now, double *out,
                         double *event, char *err, int errlen);

#endif
