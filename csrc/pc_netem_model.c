/* pc_netem_model.c -- the emulated network's configuration, rates, drops and
 * fluid model (see pc_netem.h).  Pure computation: no MPI, no I/O. */
#include "pc_netem.h"

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

/* ---- configuration: one directive per line (partialcoll/transport/network.py
 * writes it; see there for the TOML users write) */
static int bad(char *err, int errlen, const char *what, int line)
{
    snprintf(err, errlen, "network description, line %d: %s", line, what);
    return -1;
}

static int parse_trace(netem_config *c, char *rest, char *err, int errlen,
                       int line)
{
    netem_trace t = {0};
    char *tok = strtok(rest, " \t");
    if (!tok || (t.nranks = atoi(tok)) <= 0 || t.nranks > c->P)
        return bad(err, errlen, "trace: rank count", line);
    t.ranks = calloc(t.nranks, sizeof(int));
    for (int k = 0; k < t.nranks; k++) {
        tok = strtok(NULL, " \t");
        if (!tok || (t.ranks[k] = atoi(tok)) < 0 || t.ranks[k] >= c->P)
            goto fail;
    }
    char *nic = strtok(NULL, " \t"), *every = strtok(NULL, " \t");
    char *kind = strtok(NULL, " \t"), *nv = strtok(NULL, " \t");
    if (!nic || !every || !kind || !nv)
        goto fail;
    t.nic = atoi(nic);
    t.every = atof(every);
    t.factors = atoi(kind);
    t.nvalues = atoi(nv);
    if (t.nic < 0 || t.nic > 2 || !(t.every > 0) || t.nvalues <= 0)
        goto fail;
    t.values = calloc(t.nvalues, sizeof(double));
    t.cum = calloc(t.nvalues, sizeof(double));
    double sum = 0;
    for (int k = 0; k < 2 * t.nvalues; k++) {
        tok = strtok(NULL, " \t");
        if (!tok)
            goto fail;
        if (k < t.nvalues) {
            t.values[k] = atof(tok);
        } else {
            sum += atof(tok);
            t.cum[k - t.nvalues] = sum;
        }
    }
    if (fabs(sum - 1.0) > 1e-6)
        goto fail;
    netem_trace *p = realloc(c->traces, (c->ntraces + 1) * sizeof(*p));
    if (!p)
        goto fail;
    c->traces = p;
    c->traces[c->ntraces++] = t;
    return 0;
fail:
    free(t.ranks);
    free(t.values);
    free(t.cum);
    return bad(err, errlen, "malformed trace", line);
}

int netem_parse(netem_config *c, const char *text, char *err, int errlen)
{
    memset(c, 0, sizeof(*c));
    c->tick = 1e-3;
    c->weight[0] = c->weight[1] = 1.0;
    c->low_buffer = INFINITY;
    char *buf = strdup(text), *save = NULL;
    int line = 0, rc = 0;
    if (!buf)
        return bad(err, errlen, "out of memory", 0);
    for (char *l = strtok_r(buf, "\n", &save); l && rc == 0;
         l = strtok_r(NULL, "\n", &save)) {
        char key[32], rest[4096] = "";
        line++;
        if (sscanf(l, "%31s %4095[^\n]", key, rest) < 1 || key[0] == '#')
            continue;
        if (!strcmp(key, "ranks")) {
            c->P = atoi(rest);
            if (c->P <= 0 || c->P > NETEM_MAXRANKS)
                rc = bad(err, errlen, "ranks out of range", line);
            c->out_rate = calloc(c->P, sizeof(double));
            c->in_rate = calloc(c->P, sizeof(double));
            c->latency = calloc((size_t)c->P * c->P, sizeof(double));
            if (!c->out_rate || !c->in_rate || !c->latency)
                rc = bad(err, errlen, "out of memory", line);
            for (int k = 0; rc == 0 && k < c->P; k++)
                c->out_rate[k] = c->in_rate[k] = INFINITY;
            for (int k = 0; rc == 0 && k < c->P * c->P; k++)
                c->latency[k] = NAN;
        } else if (!strcmp(key, "level")) {
            int k, lv;
            if (sscanf(rest, "%d %d", &k, &lv) != 2 || k < 0 ||
                k >= NETEM_NCLASS || lv < 0 || lv >= NETEM_NLEVEL)
                rc = bad(err, errlen, "level <class> <0|1>", line);
            else
                c->class_level[k] = lv;
        } else if (!strcmp(key, "weights")) {
            if (sscanf(rest, "%lf %lf", &c->weight[0], &c->weight[1]) != 2 ||
                !(c->weight[0] > 0) || !(c->weight[1] > 0))
                rc = bad(err, errlen, "weights <high> <low>", line);
        } else if (!strcmp(key, "low_buffer")) {
            double b = atof(rest);
            c->low_buffer = b < 0 ? INFINITY : b;
        } else if (!c->P && strcmp(key, "shm") && strcmp(key, "seed") &&
                   strcmp(key, "mode") && strcmp(key, "tick")) {
            rc = bad(err, errlen, "'ranks' must come first", line);
        } else if (!strcmp(key, "shm")) {
            snprintf(c->shm, sizeof c->shm, "%s", rest);
        } else if (!strcmp(key, "seed")) {
            c->seed = strtoull(rest, NULL, 10);
        } else if (!strcmp(key, "mode")) {
            c->silent = !strcmp(rest, "silent");
        } else if (!strcmp(key, "tick")) {
            c->tick = atof(rest);
        } else if (!strcmp(key, "overhead")) {
            c->overhead = atof(rest);
            if (!(c->overhead >= 0) || !isfinite(c->overhead))
                rc = bad(err, errlen, "overhead <seconds >= 0>", line);
        } else if (!strcmp(key, "nic")) {
            int r;
            double o, i;
            if (sscanf(rest, "%d %lf %lf", &r, &o, &i) != 3 || r < 0 ||
                r >= c->P)
                rc = bad(err, errlen, "nic <rank> <out> <in>", line);
            else {
                c->out_rate[r] = o < 0 ? INFINITY : o;
                c->in_rate[r] = i < 0 ? INFINITY : i;
            }
        } else if (!strcmp(key, "latency_default")) {
            c->latency_default = atof(rest);
        } else if (!strcmp(key, "latency")) {
            int s, d;
            double v;
            if (sscanf(rest, "%d %d %lf", &s, &d, &v) != 3 || s < 0 ||
                d < 0 || s >= c->P || d >= c->P)
                rc = bad(err, errlen, "latency <src> <dst> <s>", line);
            else
                c->latency[s * c->P + d] = v;
        } else if (!strcmp(key, "drop_class")) {
            int k;
            double p;
            if (sscanf(rest, "%d %lf", &k, &p) != 2 || k < 0 ||
                k >= NETEM_NCLASS)
                rc = bad(err, errlen, "drop_class <class> <p>", line);
            else
                c->drop_class[k] = p;
        } else if (!strcmp(key, "drop")) {
            netem_drop d;
            if (sscanf(rest, "%d %d %d %lf", &d.src, &d.dst, &d.tclass,
                       &d.drop) != 4 || d.src < 0 || d.dst < 0 ||
                d.src >= c->P || d.dst >= c->P)
                rc = bad(err, errlen, "drop <src> <dst> <class> <p>", line);
            else {
                netem_drop *p = realloc(c->drops,
                                        (c->ndrops + 1) * sizeof(*p));
                if (!p)
                    rc = bad(err, errlen, "out of memory", line);
                else {
                    c->drops = p;
                    c->drops[c->ndrops++] = d;
                }
            }
        } else if (!strcmp(key, "trace")) {
            rc = parse_trace(c, rest, err, errlen, line);
        } else {
            rc = bad(err, errlen, "unknown directive", line);
        }
    }
    free(buf);
    if (rc == 0 && !c->P)
        rc = bad(err, errlen, "no 'ranks' line", line);
    if (rc == 0 && !c->shm[0])
        rc = bad(err, errlen, "no 'shm' line", line);
    return rc;
}

void netem_config_free(netem_config *c)
{
    free(c->out_rate);
    free(c->in_rate);
    free(c->latency);
    free(c->drops);
    for (int k = 0; k < c->ntraces; k++) {
        free(c->traces[k].ranks);
        free(c->traces[k].values);
        free(c->traces[k].cum);
    }
    free(c->traces);
    memset(c, 0, sizeof(*c));
}

double netem_latency(const netem_config *c, int src, int dst)
{
    double v = c->latency[src * c->P + dst];
    return isnan(v) ? c->latency_default : v;
}

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

int netem_level(const netem_config *c, int tclass)
{
    return tclass >= 0 && tclass < NETEM_NCLASS ? c->class_level[tclass] : 0;
}

double netem_low_backlog(const netem_config *c, netem_shm *S, int src)
{
    double b = 0;
    for (int d = 0; d < c->P; d++) {
        netem_chan *ch = &S->ch[netem_chan_at(c->P, src, d, 1)];
        for (uint32_t k = ch->cur; k < ch->n; k++) {
            netem_ent *e = &ch->e[(ch->head + k) % NETEM_QCAP];
            b += e->state == ENT_WIRE ? e->left : (double)e->bytes;
        }
    }
    return b;
}

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
