/* netem_model.c -- the emulated network's rates, drops and fluid model
 * (see pc_netem.h), and the model alone for tests (netem_model_probe).
 * Pure computation: no MPI, no I/O. */
#include "transport/netem_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t z)            /* splitmix64 finaliser */
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c,
                      uint64_t d)
{
    uint64_t z = mix(seed + 0x9E3779B97F4A7C15ULL);
    z = mix(z ^ (a + 0x632BE59BD9B4E019ULL));
    z = mix(z ^ (b + 0x8CB92BA72F3D8DD7ULL));
    z = mix(z ^ (c + 0x52DCE729DA3ED4B3ULL));
    z = mix(z ^ (d + 0x2545F4914F6CDD1DULL));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- drops: decided by the sender, the same in every run */
double netem_drop_p(const netem_config *c, int src, int dst, int tclass)
{
    if (tclass < 0)
        return 0.0;                         /* control messages */
    double p = tclass < NETEM_NCLASS ? c->drop_class[tclass] : 0.0;
    for (int k = 0; k < c->ndrops; k++) {   /* later lines override */
        const netem_drop *d = &c->drops[k];
        if (d->src == src && d->dst == dst &&
            (d->tclass == tclass || d->tclass == -2))
            p = d->drop;
    }
    return p;
}

int netem_lost(const netem_config *c, int src, int dst, int tclass,
               uint64_t k)
{
    double p = netem_drop_p(c, src, dst, tclass);
    return p > 0 && uniform(c->seed ^ 0xD70BULL, (uint64_t)src,
                            (uint64_t)dst, (uint64_t)tclass, k) < p;
}

/* ---- rates and the fluid model */
double netem_rate(const netem_config *c, double t0, int rank, int nic,
                  double t)
{
    double r = nic == NIC_OUT ? c->out_rate[rank] : c->in_rate[rank];
    for (int k = 0; k < c->ntraces; k++) {
        const netem_trace *tr = &c->traces[k];
        if (tr->nic != 2 && tr->nic != nic)
            continue;
        int in = 0;
        for (int j = 0; j < tr->nranks && !in; j++)
            in = tr->ranks[j] == rank;
        if (!in)
            continue;
        uint64_t epoch = (uint64_t)floor((t - t0) / tr->every);
        double u = uniform(c->seed, (uint64_t)k, (uint64_t)rank,
                           (uint64_t)nic, epoch);
        int j = 0;
        while (j < tr->nvalues - 1 && u >= tr->cum[j])
            j++;
        r = tr->factors ? r * tr->values[j] : tr->values[j];
    }
    return r;
}

/* the next time after t at which some NIC's rate may change */
static double next_boundary(const netem_config *c, double t0, double t)
{
    double next = INFINITY;
    for (int k = 0; k < c->ntraces; k++) {
        double e = c->traces[k].every;
        double b = t0 + (floor((t - t0) / e) + 1) * e;
        if (b <= t)
            b += e;
        if (b < next)
            next = b;
    }
    return next;
}

/* Scratch for the flows on the wire.  The model runs under the engine's
 * progress lock (one thread per process), so one set of buffers serves. */
static int *flow_buf;
static double *rate_buf, *finish_buf;
static char *frozen_buf;
static int flow_cap;

static int scratch(int n)
{
    if (n <= flow_cap)
        return 0;
    int *f = realloc(flow_buf, n * sizeof(int));
    if (f)
        flow_buf = f;
    double *r = realloc(rate_buf, n * sizeof(double));
    if (r)
        rate_buf = r;
    double *e = realloc(finish_buf, n * sizeof(double));
    if (e)
        finish_buf = e;
    char *z = realloc(frozen_buf, n);
    if (z)
        frozen_buf = z;
    if (!f || !r || !e || !z)
        return -1;
    flow_cap = n;
    return 0;
}

/* Weighted max-min fair rates of the flows on the wire (progressive
 * filling: every unfrozen flow's rate grows with its level's weight until
 * a NIC it uses is full; those flows freeze at that rate). */
static void fair_rates(const netem_config *c, netem_shm *S, double t,
                       const int *flow, int nf, double *rate)
{
    int P = c->P;
    double cap[2 * NETEM_MAXRANKS], wsum[2 * NETEM_MAXRANKS];
    char *fz = frozen_buf;
    memset(fz, 0, nf);
    for (int r = 0; r < P; r++) {
        cap[r] = netem_rate(c, S->t0, r, NIC_OUT, t);
        cap[P + r] = netem_rate(c, S->t0, r, NIC_IN, t);
    }
    for (int left = nf; left > 0;) {
        memset(wsum, 0, sizeof(double) * 2 * P);
        for (int f = 0; f < nf; f++)
            if (!fz[f]) {
                double w = c->weight[netem_chan_level(flow[f])];
                wsum[netem_chan_src(P, flow[f])] += w;
                wsum[P + netem_chan_dst(P, flow[f])] += w;
            }
        int best = -1;
        double share = INFINITY;             /* rate per unit of weight */
        for (int x = 0; x < 2 * P; x++)
            if (wsum[x] > 0 && cap[x] / wsum[x] < share) {
                share = cap[x] / wsum[x];
                best = x;
            }
        for (int f = 0; f < nf; f++) {
            int o = netem_chan_src(P, flow[f]), i = P + netem_chan_dst(P, flow[f]);
            if (fz[f] || (best >= 0 && o != best && i != best))
                continue;
            rate[f] = share * c->weight[netem_chan_level(flow[f])];
            fz[f] = 1;
            left--;
            if (isfinite(rate[f])) {
                cap[o] = fmax(cap[o] - rate[f], 0);
                cap[i] = fmax(cap[i] - rate[f], 0);
            }
        }
    }
}

static netem_ent *head_of(netem_chan *ch)
{
    return ch->cur < ch->n ? &ch->e[(ch->head + ch->cur) % NETEM_QCAP]
                           : NULL;
}

/* When a head's per-message hold ends and its bytes start to flow (always
 * computed this way, so an event at that time compares equal). */
static double ready_at(const netem_ent *e)
{
    return e->t_start + e->hold;
}

/* Event by event: the next event is the first end of a message on the
 * wire (or a trace's redraw); every flow moves rate x step.  A flow whose
 * end the step reaches is over there, whatever rounding left of its
 * bytes: times are absolute CLOCK_MONOTONIC seconds, so a step is a
 * multiple of the clock's resolution at t (7e-12 s after 9 hours of
 * uptime), and rate x step can miss the bytes left by a millibyte at a
 * few hundred MB/s.  Judged by its bytes alone, such a remainder (above
 * the tolerance, below half a step: t + left / rate == t) made the next
 * event t itself, forever: the model stood still and every message on
 * the network with it. */
void netem_advance(const netem_config *c, netem_shm *S, double now)
{
    int P = c->P, nf, nch = P * P * NETEM_NLEVEL;
    if (scratch(nch) < 0)
        return;                /* no memory: the model waits (never wrong) */
    int *flow = flow_buf;
    double *rate = rate_buf, *finish = finish_buf;
    for (int guard = 0; guard < 1000000; guard++) {
        double t = S->t_model;
        if (now <= t)
            return;
        nf = 0;
        double t_evt = INFINITY;           /* the first hold to end */
        for (int x = 0; x < nch; x++) {
            netem_ent *e = head_of(&S->ch[x]);
            if (!e)
                continue;
            if (ready_at(e) <= t)
                flow[nf++] = x;
            else if (ready_at(e) < t_evt)
                t_evt = ready_at(e);
        }
        if (!nf && isinf(t_evt)) {
            S->t_model = now;
            return;
        }
        if (nf)
            fair_rates(c, S, t, flow, nf, rate);
        double b = next_boundary(c, S->t0, t);
        if (b < t_evt)
            t_evt = b;
        for (int f = 0; f < nf; f++) {
            netem_ent *e = head_of(&S->ch[flow[f]]);
            finish[f] = rate[f] > 0 ? t + e->left / rate[f] : INFINITY;
            if (finish[f] < t_evt)
                t_evt = finish[f];
        }
        double until = t_evt < now ? t_evt : now;
        for (int f = 0; f < nf; f++) {
            netem_ent *e = head_of(&S->ch[flow[f]]);
            e->left = isinf(rate[f]) || finish[f] <= until
                          ? 0 : e->left - rate[f] * (until - t);
        }
        S->t_model = until;
        for (int f = 0; f < nf; f++) {
            netem_chan *ch = &S->ch[flow[f]];
            netem_ent *e = head_of(ch);
            if (e->left > 1e-6 * (double)e->bytes + 1e-3)
                continue;
            e->state = ENT_DONE;
            e->t_end = until;
            ch->cur++;
            netem_ent *nx = head_of(ch);
            if (nx) {
                nx->state = ENT_WIRE;
                nx->t_start = until;
                nx->left = (double)nx->bytes;
            }
        }
        if (until >= now)
            return;
    }
}

double netem_next_finish(const netem_config *c, netem_shm *S, int src,
                         double *event)
{
    int P = c->P, nf = 0, mine = -1, nch = P * P * NETEM_NLEVEL;
    double best = INFINITY, any = next_boundary(c, S->t0, S->t_model);
    if (event)
        *event = S->t_model;       /* unknown: no skipping */
    if (scratch(nch) < 0)
        return INFINITY;
    int *flow = flow_buf;
    double *rate = rate_buf;
    for (int x = 0; x < nch; x++) {
        netem_ent *e = head_of(&S->ch[x]);
        if (!e)
            continue;
        if (ready_at(e) > S->t_model) {    /* held: its flow starts then */
            if (ready_at(e) < any)
                any = ready_at(e);
            if (netem_chan_src(P, x) == src && ready_at(e) < best)
                best = ready_at(e);
            continue;
        }
        if (netem_chan_src(P, x) == src && mine < 0)
            mine = nf;
        flow[nf++] = x;
    }
    if (mine < 0 && !event)
        return best;
    if (nf)
        fair_rates(c, S, S->t_model, flow, nf, rate);
    for (int f = 0; f < nf; f++) {
        if (!(rate[f] > 0))
            continue;
        double tf = S->t_model + head_of(&S->ch[flow[f]])->left / rate[f];
        if (tf < any)
            any = tf;
        if (netem_chan_src(P, flow[f]) == src && tf < best)
            best = tf;
    }
    if (event)
        *event = any;
    return best;
}

/* The model alone, on a private segment: no MPI, no shared memory (what
 * the tests check it with).  msgs: n x {src, dst, level, bytes, left},
 * queued in that order; a channel's first message is on the wire from
 * time t with `left` bytes to go.  Advances to `now`; out: n x {state,
 * left, t_end}.  Returns the model's time after, NAN on error (err). */
double netem_model_probe(const char *config, double t0, double t,
                         const double *msgs, int n, double now, double *out,
                         double *event, char *err, int errlen)
{
    netem_config c;
    double t_after = NAN;
    netem_shm *S = NULL;
    if (netem_parse(&c, config, err, errlen) != 0)
        goto out;
    size_t nch = (size_t)c.P * c.P * NETEM_NLEVEL;
    S = calloc(1, sizeof(netem_shm) + nch * sizeof(netem_chan));
    if (!S) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    S->P = c.P;
    S->t0 = t0;
    S->t_model = t;
    int *slot = calloc((size_t)n + 1, sizeof(int));
    for (int k = 0; slot && k < n; k++) {
        const double *m = msgs + 5 * k;
        int src = (int)m[0], dst = (int)m[1], lv = (int)m[2];
        if (src < 0 || src >= c.P || dst < 0 || dst >= c.P || lv < 0 ||
            lv >= NETEM_NLEVEL) {
            snprintf(err, errlen, "message %d: no channel %d -> %d, level "
                     "%d", k, src, dst, lv);
            free(slot);
            goto out;
        }
        netem_chan *ch = &S->ch[netem_chan_at(c.P, src, dst, lv)];
        if (ch->n >= NETEM_QCAP) {
            snprintf(err, errlen, "more than %d messages in a channel",
                     NETEM_QCAP);
            free(slot);
            goto out;
        }
        netem_ent *e = &ch->e[ch->n];
        *e = (netem_ent){(int64_t)m[3], (uint64_t)k, m[3], 0, 0,
                         ENT_QUEUED, c.overhead};
        if (ch->n == 0) {
            e->state = ENT_WIRE;
            e->t_start = t;
            e->left = m[4];
        }
        slot[k] = netem_chan_at(c.P, src, dst, lv) * NETEM_QCAP + ch->n++;
    }
    if (!slot) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    netem_advance(&c, S, now);
    netem_next_finish(&c, S, 0, event);
    for (int k = 0; k < n; k++) {
        netem_ent *e = &S->ch[slot[k] / NETEM_QCAP].e[slot[k] % NETEM_QCAP];
        out[3 * k] = e->state;
        out[3 * k + 1] = e->left;
        out[3 * k + 2] = e->t_end;
    }
    free(slot);
    t_after = S->t_model;
out:
    free(S);
    netem_config_free(&c);
    return t_after;
}
