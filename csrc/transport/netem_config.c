/* netem_config.c -- the emulated network's description: one directive per
 * line (partialcoll/transport/network.py writes it from the TOML users
 * write; see there), parsed into a netem_config.  Its tables grow with
 * plain realloc: parsing is not on the progress path, and the
 * allocation-failure injection leaves it alone. */
#include "transport/netem_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *err, int errlen, const char *what, int line)
{
    snprintf(err, errlen, "network description, line %d: %s", line, what);
    return -1;
}

/* ---- the directives: each parses the rest of its line into c */
typedef int (*directive_fn)(netem_config *c, char *rest, char *err,
                            int errlen, int line);

static int d_ranks(netem_config *c, char *rest, char *err, int errlen,
                   int line)
{
    if (c->P)
        return bad(err, errlen, "'ranks' given twice", line);
    c->P = atoi(rest);
    if (c->P <= 0 || c->P > NETEM_MAXRANKS)
        return bad(err, errlen, "ranks out of range", line);
    c->out_rate = calloc(c->P, sizeof(double));
    c->in_rate = calloc(c->P, sizeof(double));
    c->latency = calloc((size_t)c->P * c->P, sizeof(double));
    if (!c->out_rate || !c->in_rate || !c->latency)
        return bad(err, errlen, "out of memory", line);
    for (int k = 0; k < c->P; k++)
        c->out_rate[k] = c->in_rate[k] = INFINITY;
    for (int k = 0; k < c->P * c->P; k++)
        c->latency[k] = NAN;
    return 0;
}

static int d_shm(netem_config *c, char *rest, char *err, int errlen, int line)
{
    (void)err, (void)errlen, (void)line;
    snprintf(c->shm, sizeof c->shm, "%s", rest);
    return 0;
}

static int d_seed(netem_config *c, char *rest, char *err, int errlen,
                  int line)
{
    (void)err, (void)errlen, (void)line;
    c->seed = strtoull(rest, NULL, 10);
    return 0;
}

static int d_mode(netem_config *c, char *rest, char *err, int errlen,
                  int line)
{
    (void)err, (void)errlen, (void)line;
    c->silent = !strcmp(rest, "silent");
    return 0;
}

static int d_tick(netem_config *c, char *rest, char *err, int errlen,
                  int line)
{
    (void)err, (void)errlen, (void)line;
    c->tick = atof(rest);
    return 0;
}

static int d_level(netem_config *c, char *rest, char *err, int errlen,
                   int line)
{
    int k, lv;
    if (sscanf(rest, "%d %d", &k, &lv) != 2 || k < 0 || k >= NETEM_NCLASS ||
        lv < 0 || lv >= NETEM_NLEVEL)
        return bad(err, errlen, "level <class> <0|1>", line);
    c->class_level[k] = lv;
    return 0;
}

static int d_weights(netem_config *c, char *rest, char *err, int errlen,
                     int line)
{
    if (sscanf(rest, "%lf %lf", &c->weight[0], &c->weight[1]) != 2 ||
        !(c->weight[0] > 0) || !(c->weight[1] > 0))
        return bad(err, errlen, "weights <high> <low>", line);
    return 0;
}

static int d_low_buffer(netem_config *c, char *rest, char *err, int errlen,
                        int line)
{
    (void)err, (void)errlen, (void)line;
    double b = atof(rest);
    c->low_buffer = b < 0 ? INFINITY : b;
    return 0;
}

static int d_overhead(netem_config *c, char *rest, char *err, int errlen,
                      int line)
{
    c->overhead = atof(rest);
    if (!(c->overhead >= 0) || !isfinite(c->overhead))
        return bad(err, errlen, "overhead <seconds >= 0>", line);
    return 0;
}

static int d_nic(netem_config *c, char *rest, char *err, int errlen, int line)
{
    int r;
    double o, i;
    if (sscanf(rest, "%d %lf %lf", &r, &o, &i) != 3 || r < 0 || r >= c->P)
        return bad(err, errlen, "nic <rank> <out> <in>", line);
    c->out_rate[r] = o < 0 ? INFINITY : o;
    c->in_rate[r] = i < 0 ? INFINITY : i;
    return 0;
}

static int d_latency_default(netem_config *c, char *rest, char *err,
                             int errlen, int line)
{
    (void)err, (void)errlen, (void)line;
    c->latency_default = atof(rest);
    return 0;
}

static int d_latency(netem_config *c, char *rest, char *err, int errlen,
                     int line)
{
    int s, d;
    double v;
    if (sscanf(rest, "%d %d %lf", &s, &d, &v) != 3 || s < 0 || d < 0 ||
        s >= c->P || d >= c->P)
        return bad(err, errlen, "latency <src> <dst> <s>", line);
    c->latency[s * c->P + d] = v;
    return 0;
}

static int d_drop_class(netem_config *c, char *rest, char *err, int errlen,
                        int line)
{
    int k;
    double p;
    if (sscanf(rest, "%d %lf", &k, &p) != 2 || k < 0 || k >= NETEM_NCLASS)
        return bad(err, errlen, "drop_class <class> <p>", line);
    c->drop_class[k] = p;
    return 0;
}

static int d_drop(netem_config *c, char *rest, char *err, int errlen,
                  int line)
{
    netem_drop d;
    if (sscanf(rest, "%d %d %d %lf", &d.src, &d.dst, &d.tclass, &d.drop) !=
            4 || d.src < 0 || d.dst < 0 || d.src >= c->P || d.dst >= c->P)
        return bad(err, errlen, "drop <src> <dst> <class> <p>", line);
    netem_drop *p = realloc(c->drops, (c->ndrops + 1) * sizeof(*p));
    if (!p)
        return bad(err, errlen, "out of memory", line);
    c->drops = p;
    c->drops[c->ndrops++] = d;
    return 0;
}

/* trace <n> <rank>... <nic> <every> <factors> <m> <value>... <p>... */
static int d_trace(netem_config *c, char *rest, char *err, int errlen,
                   int line)
{
    netem_trace t = {0};
    char *tok = strtok(rest, " \t");
    if (!tok || (t.nranks = atoi(tok)) <= 0 || t.nranks > c->P)
        return bad(err, errlen, "trace: rank count", line);
    t.ranks = calloc(t.nranks, sizeof(int));
    if (!t.ranks)
        return bad(err, errlen, "out of memory", line);
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
    if (!t.values || !t.cum) {
        free(t.ranks);
        free(t.values);
        free(t.cum);
        return bad(err, errlen, "out of memory", line);
    }
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

/* needs_ranks: the directive may come only after the 'ranks' line (it
 * names ranks, fills a per-rank table, or always came after it) */
static const struct {
    const char *key;
    int needs_ranks;
    directive_fn parse;
} directives[] = {
    {"ranks", 0, d_ranks},          {"shm", 0, d_shm},
    {"seed", 0, d_seed},            {"mode", 0, d_mode},
    {"tick", 0, d_tick},            {"level", 0, d_level},
    {"weights", 0, d_weights},      {"low_buffer", 0, d_low_buffer},
    {"overhead", 1, d_overhead},    {"nic", 1, d_nic},
    {"latency_default", 1, d_latency_default},
    {"latency", 1, d_latency},      {"drop_class", 1, d_drop_class},
    {"drop", 1, d_drop},            {"trace", 1, d_trace},
};

static int parse_line(netem_config *c, const char *key, char *rest,
                      char *err, int errlen, int line)
{
    for (size_t k = 0; k < sizeof directives / sizeof directives[0]; k++) {
        if (strcmp(key, directives[k].key))
            continue;
        if (directives[k].needs_ranks && !c->P)
            return bad(err, errlen, "'ranks' must come first", line);
        return directives[k].parse(c, rest, err, errlen, line);
    }
    return bad(err, errlen, "unknown directive", line);
}

/* On error c may hold part of the description: netem_config_free() it. */
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
        rc = parse_line(c, key, rest, err, errlen, line);
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

int netem_level(const netem_config *c, int tclass)
{
    return tclass >= 0 && tclass < NETEM_NCLASS ? c->class_level[tclass] : 0;
}
