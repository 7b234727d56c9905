/* Algorithm 3's trial cases in C: the cost of DetAgg(n) after its direct
 * updates, or inf as soon as it cannot beat the best found so far; the
 * same operations, in the same order, as aggregation._det_agg_rest with
 * trial=True, on C copies of the links it touches (the Python network is
 * not changed).  tests/test_mlfabric_aggregation.py compares the two.
 *
 * det_agg_trial(links, m, upd_node, upd_size, upd_nb, i0, agg_nodes, dst,
 *               now, start, t_max, ordered, bound, tie_ok,
 *               suffix, capsum, fwd_rate, smallest)
 *   links     [out-link of node 0 .. m-1, in-link of node 0 .. m-1]
 *             (Timeline or None); nodes are numbered by the caller
 *   upd_node, upd_size, upd_nb   per update of the order: its worker's
 *             node number, bytes, and the time its commit may not end
 *             before (-inf: none)
 *   i0        the case's n: updates i0.. are left
 *   agg_nodes the k aggregators' node numbers; dst the destination's
 *   now, start, t_max, ordered   as in _det_agg_rest
 *   bound, tie_ok  give up (inf) once a value > bound (>= unless tie_ok)
 *             is sure
 *   suffix[j][i], capsum[j], fwd_rate[j], smallest[i]   _RestBounds
 */
#include "mlfabric/linkops.h"

#include <math.h>
#include <stdlib.h>

const char det_agg_trial_doc[] =
    "det_agg_trial(...): the cost of a trial case of Algorithm 3 "
    "(aggregation.py), inf when it cannot win";

/* The links, read from Python when first touched, then changed in C. */
typedef struct {
    PyObject *links;
    Py_ssize_t count;
    Link **l;
} Table;

static Link *table_get(Table *tb, long idx)
{
    if (idx < 0 || idx >= tb->count) {
        PyErr_SetString(PyExc_IndexError, "node number out of range");
        return NULL;
    }
    if (!tb->l[idx]) {
        PyObject *obj = PyList_GET_ITEM(tb->links, idx);
        if (obj == Py_None) {
            PyErr_SetString(PyExc_KeyError, "a node without that link");
            return NULL;
        }
        Link *l = malloc(sizeof(Link));
        if (!l) {
            PyErr_NoMemory();
            return NULL;
        }
        out_init(&l->t);
        out_init(&l->u);
        tb->l[idx] = l;
        if (link_read(obj, l))
            return NULL;
    }
    return tb->l[idx];
}

static void table_free(Table *tb)
{
    for (Py_ssize_t i = 0; tb->l && i < tb->count; i++) {
        if (tb->l[i]) {
            link_free(tb->l[i]);
            free(tb->l[i]);
        }
    }
    free(tb->l);
}

/* Out moved by value: repoint an inline buffer at the copy's. */
static void out_move(Out *dst, Out *src)
{
    int inline_buf = src->v == src->small;
    *dst = *src;
    if (inline_buf)
        dst->v = dst->small;
    out_init(src);
}

/* Reserve a profile on a link (NetUp on one side). */
static int table_add(Link *l, const Out *points, const Out *rates)
{
    if (points->n < 2 || points->v[points->n - 1] <= points->v[0])
        return 0;
    Out nt, nu;
    out_init(&nt);
    out_init(&nu);
    if (merge(link_view(l), points->v, points->n, rates->v, 1.0, &nt,
              &nu)) {
        out_free(&nt);
        out_free(&nu);
        return -1;
    }
    link_free(l);
    out_move(&l->t, &nt);
    out_move(&l->u, &nu);
    return 0;
}

typedef struct {
    double *v;
    Py_ssize_t n;
} Array;

static int array_read(PyObject *list, Array *a)
{
    a->v = NULL;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "expected a list");
        return -1;
    }
    a->n = PyList_GET_SIZE(list);
    a->v = malloc(sizeof(double) * (a->n ? a->n : 1));
    if (!a->v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < a->n; i++) {
        a->v[i] = PyFloat_AsDouble(PyList_GET_ITEM(list, i));
        if (a->v[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

typedef struct {
    Table tb;
    Array node, size, nb, aggs, capsum, fwd, smallest;
    Array *suffix;
    Py_ssize_t m, k, n_upd;
    long dst;
    double now, start, bound;
    int ordered, tie_ok;
} Trial;

static int over(const Trial *c, double v)
{
    return c->tie_ok ? v > c->bound : v >= c->bound;
}

static double lower(const Trial *c, Py_ssize_t i, Py_ssize_t j)
{
    return c->start + c->suffix[j].v[i] / c->capsum.v[j] +
           c->smallest.v[i] / c->fwd.v[j];
}

/* NetworkState.reserve(node, dst, ready, size, floor): its end. */
static double forward(Trial *c, long node, double ready, double size,
                      double floor, int *err)
{
    Link *a = table_get(&c->tb, node);
    Link *b = a ? table_get(&c->tb, c->m + c->dst) : NULL;
    double start = ready >= c->now ? ready : c->now, end = start;
    Out points, rates;
    out_init(&points);
    out_init(&rates);
    *err = !a || !b;
    if (!*err && size > 0)
        end = walk(link_view(a), link_view(b), start, size, &points, &rates,
                   err);
    if (!*err && end < floor) {
        double late = latest(link_view(a), link_view(b), start, floor, size,
                             err);
        if (!*err && !isnan(late) && size > 0) {
            start = late;
            points.n = rates.n = 0;
            end = walk(link_view(a), link_view(b), start, size, &points,
                       &rates, err);
        } else if (!*err && !isnan(late)) {
            end = start = late;
        }
        if (end < floor)
            end = floor;
    }
    if (!*err && end == INFINITY) {
        PyErr_Format(PyExc_ValueError, "no bandwidth from node %ld to %ld "
                     "after %g: cannot schedule %g bytes", node, c->dst,
                     start, size);
        *err = 1;
    }
    if (!*err && (table_add(a, &points, &rates) ||
                  table_add(b, &points, &rates)))
        *err = 1;
    out_free(&points);
    out_free(&rates);
    return end;
}

/* When update i would reach aggregator a (joining it when join != 0). */
static double arrive(Trial *c, Py_ssize_t i, Py_ssize_t a, int join,
                     int *err)
{
    long w = (long)c->node.v[i], node = (long)c->aggs.v[a];
    double size = c->size.v[i], t = c->start;
    *err = 0;
    if (w == node || size <= 0)
        return t;
    Link *lo = table_get(&c->tb, w);
    Link *li = lo ? table_get(&c->tb, c->m + node) : NULL;
    if (!li) {
        *err = 1;
        return 0.0;
    }
    Out points, rates;
    out_init(&points);
    out_init(&rates);
    t = walk(link_view(lo), link_view(li), c->start, size,
             join ? &points : NULL, join ? &rates : NULL, err);
    if (!*err && join && !over(c, t))
        *err = table_add(li, &points, &rates) ||
               table_add(lo, &points, &rates);
    out_free(&points);
    out_free(&rates);
    return t;
}

/* The loop of _det_agg_rest (trial=True). */
static double run(Trial *c, Py_ssize_t i, double t_max, int *err)
{
    Py_ssize_t a = 0, members = 0;
    double ready = 0.0, msize = 0.0, mnb = 0.0, t;
    *err = 0;
    if (over(c, lower(c, i, 0)))
        return INFINITY;
    while (i < c->n_upd) {
        int join = !(members && a + 1 < c->k);
        t = arrive(c, i, a, join, err);
        if (*err)
            return 0.0;
        if (!join && t > t_max) {              /* close the group */
            double floor = c->ordered ? t_max : -INFINITY;
            if (mnb > floor)
                floor = mnb;
            double end = forward(c, (long)c->aggs.v[a], ready, msize, floor,
                                 err);
            if (*err)
                return 0.0;
            t_max = t_max >= end ? t_max : end;
            members = 0;
            a++;
            if (over(c, t_max) || over(c, lower(c, i, a)))
                return INFINITY;
            continue;
        }
        if (!join) {                           /* it fits: join */
            t = arrive(c, i, a, 1, err);
            if (*err)
                return 0.0;
        }
        if (over(c, t))
            return INFINITY;
        ready = members && ready >= t ? ready : t;
        msize = members && msize >= c->size.v[i] ? msize : c->size.v[i];
        mnb = members && mnb >= c->nb.v[i] ? mnb : c->nb.v[i];
        members++;
        i++;
    }
    if (members) {
        double floor = c->ordered ? t_max : -INFINITY;
        if (mnb > floor)
            floor = mnb;
        double end = forward(c, (long)c->aggs.v[a], ready, msize, floor,
                             err);
        if (*err)
            return 0.0;
        t_max = t_max >= end ? t_max : end;
        if (over(c, t_max))
            return INFINITY;
    }
    return t_max;
}

static int read_suffix(PyObject *list, Trial *c)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != c->k) {
        PyErr_SetString(PyExc_ValueError, "one suffix list per aggregator");
        return -1;
    }
    c->suffix = calloc(c->k ? c->k : 1, sizeof(Array));
    if (!c->suffix) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < c->k; j++)
        if (array_read(PyList_GET_ITEM(list, j), &c->suffix[j]))
            return -1;
    return 0;
}

PyObject *det_agg_trial(PyObject *self, PyObject *args)
{
    PyObject *links, *node, *size, *nb, *aggs, *suffix, *capsum, *fwd, *sm;
    Py_ssize_t m, i0;
    double t_max;
    Trial c = {0};
    PyObject *res = NULL;
    if (!PyArg_ParseTuple(args, "O!nOOOnOlddddipOOOO", &PyList_Type,
                          &links, &m, &node, &size, &nb, &i0, &aggs, &c.dst,
                          &c.now, &c.start, &t_max, &c.bound, &c.ordered,
                          &c.tie_ok, &suffix, &capsum, &fwd, &sm))
        return NULL;
    c.m = m;
    c.tb.links = links;
    c.tb.count = PyList_GET_SIZE(links);
    c.tb.l = calloc(c.tb.count ? c.tb.count : 1, sizeof(Link *));
    if (!c.tb.l) {
        PyErr_NoMemory();
        return NULL;
    }
    if (array_read(node, &c.node) || array_read(size, &c.size) ||
            array_read(nb, &c.nb) || array_read(aggs, &c.aggs) ||
            array_read(capsum, &c.capsum) || array_read(fwd, &c.fwd) ||
            array_read(sm, &c.smallest))
        goto done;
    c.k = c.aggs.n;
    c.n_upd = c.node.n;
    if (c.k == 0 || c.size.n != c.n_upd || c.nb.n != c.n_upd ||
            c.smallest.n <= c.n_upd || c.capsum.n != c.k ||
            c.fwd.n != c.k || i0 < 0 || i0 >= c.n_upd) {
        PyErr_SetString(PyExc_ValueError, "inconsistent trial arguments");
        goto done;
    }
    if (read_suffix(suffix, &c))
        goto done;
    int err;
    double cost = run(&c, i0, t_max, &err);
    if (!err)
        res = PyFloat_FromDouble(cost);
done:
    table_free(&c.tb);
    free(c.node.v);
    free(c.size.v);
    free(c.nb.v);
    free(c.aggs.v);
    free(c.capsum.v);
    free(c.fwd.v);
    free(c.smallest.v);
    for (Py_ssize_t j = 0; c.suffix && j < c.k; j++)
        free(c.suffix[j].v);
    free(c.suffix);
    return res;
}
