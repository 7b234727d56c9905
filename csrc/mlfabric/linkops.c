/* partialcoll.mlfabric.scheduler._linkops: the hot loops of
 * partialcoll/mlfabric/scheduler/links.py in C (t_en, a transfer's
 * profile, the latest start that meets a floor, adding a profile to a
 * link's reservation timeline), and Algorithm 3's trial cases
 * (linkops_agg.c).
 *
 * Pure arithmetic on the Timeline objects' lists of floats: no MPI, and
 * nothing to do with the executor (the rest of csrc/).  Each function performs the
 * same floating-point operations in the same order as its Python twin in
 * links.py (_py_finish_time, _py_fill, _py_latest_start,
 * Timeline._py_added), so results are bit-identical;
 * tests/test_mlfabric_links.py compares them on random timelines.  Built
 * with -ffp-contract=off (no fused multiply-add).  links.py uses the
 * Python versions when this module is not built.
 *
 * A Timeline has ``cap`` (float), ``times`` and ``used`` (lists of floats
 * of equal length, times increasing): used[i] is reserved on
 * [times[i], times[i+1]), the last segment runs to +inf.
 */
#include "mlfabric/linkops.h"

#include <math.h>
#include <stdlib.h>

#define TOL LINKOPS_TOL
#define SMALL LINKOPS_SMALL

void out_init(Out *o)
{
    o->v = o->small;
    o->n = 0;
    o->cap = SMALL;
}

int out_push(Out *o, double x)
{
    if (o->n == o->cap) {
        double *bigger = malloc(sizeof(double) * o->cap * 2);
        if (!bigger) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < o->n; i++)
            bigger[i] = o->v[i];
        if (o->v != o->small)
            free(o->v);
        o->v = bigger;
        o->cap *= 2;
    }
    o->v[o->n++] = x;
    return 0;
}

void out_free(Out *o)
{
    if (o->v != o->small)
        free(o->v);
    out_init(o);
}

int out_read(PyObject *list, Out *o)
{
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of floats");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(PyList_GET_ITEM(list, i));
        if ((x == -1.0 && PyErr_Occurred()) || out_push(o, x))
            return -1;
    }
    return 0;
}

PyObject *out_list(const Out *o)
{
    PyObject *list = PyList_New(o->n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < o->n; i++) {
        PyObject *f = PyFloat_FromDouble(o->v[i]);
        if (!f) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, f);
    }
    return list;
}

static PyObject *s_cap, *s_times, *s_used;

int link_read(PyObject *obj, Link *l)
{
    PyObject *cap = PyObject_GetAttr(obj, s_cap);
    if (!cap)
        return -1;
    l->cap = PyFloat_AsDouble(cap);
    Py_DECREF(cap);
    if (l->cap == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *times = PyObject_GetAttr(obj, s_times);
    if (!times)
        return -1;
    int rc = out_read(times, &l->t);
    Py_DECREF(times);
    if (rc)
        return -1;
    PyObject *used = PyObject_GetAttr(obj, s_used);
    if (!used)
        return -1;
    rc = out_read(used, &l->u);
    Py_DECREF(used);
    if (rc)
        return -1;
    if (l->t.n != l->u.n || l->t.n == 0) {
        PyErr_SetString(PyExc_ValueError, "a timeline's times and used "
                        "must be non-empty and of equal length");
        return -1;
    }
    return 0;
}

void link_free(Link *l)
{
    out_free(&l->t);
    out_free(&l->u);
}

View link_view(const Link *l)
{
    View v = {l->t.v, l->u.v, l->t.n, l->cap};
    return v;
}

double tolerance(double ca, double cb)
{
    double c = ca < cb ? ca : cb;
    return c < INFINITY ? c * TOL : 0.0;
}

/* Python's bisect_right(v, x) - 1, never below 0. */
Py_ssize_t segment(const double *v, Py_ssize_t n, double x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > 0 ? lo - 1 : 0;
}

double walk(View a, View b, double start, double size, Out *points,
            Out *rates, int *err)
{
    Py_ssize_t ia = segment(a.t, a.n, start), ib = segment(b.t, b.n, start);
    double t = start, left = size;
    double floor = tolerance(a.cap, b.cap), dust = size * TOL;
    *err = 0;
    for (;;) {
        double ra = a.cap - a.u[ia], rb = b.cap - b.u[ib];
        double r = ra < rb ? ra : rb;
        double ea = ia + 1 < a.n ? a.t[ia + 1] : INFINITY;
        double eb = ib + 1 < b.n ? b.t[ib + 1] : INFINITY;
        double e = ea < eb ? ea : eb;
        if (r > floor) {
            if (r == INFINITY) {
                if (points)
                    points->n = rates->n = 0;
                return t;
            }
            if (points && (rates->n == 0 || rates->v[rates->n - 1] != r)) {
                if (out_push(points, t) || out_push(rates, r))
                    goto oom;
            }
            double room = r * (e - t);
            if (room >= left - dust) {
                double end = t + left / r;
                if (end > e)
                    end = e;
                if (points && out_push(points, end))
                    goto oom;
                return end;
            }
            left -= room;
        } else if (e == INFINITY) {
            if (points)
                points->n = rates->n = 0;
            return INFINITY;
        } else if (points && rates->n && rates->v[rates->n - 1] != 0.0) {
            if (out_push(points, t) || out_push(rates, 0.0))
                goto oom;
        }
        t = e;
        if (ea == e)
            ia++;
        if (eb == e)
            ib++;
    }
oom:
    *err = 1;
    return 0.0;
}

double latest(View a, View b, double earliest, double end, double size,
              int *err)
{
    /* the segments of min(residual a, residual b) on [earliest, end), as
     * _walk yields them, then filled backwards from end */
    Out st, se, sr;
    out_init(&st);
    out_init(&se);
    out_init(&sr);
    double floor = tolerance(a.cap, b.cap), t = earliest, res = NAN;
    Py_ssize_t ia = segment(a.t, a.n, earliest);
    Py_ssize_t ib = segment(b.t, b.n, earliest);
    *err = 0;
    while (t < end) {
        double ra = a.cap - a.u[ia], rb = b.cap - b.u[ib];
        double r = ra < rb ? ra : rb;
        double ea = ia + 1 < a.n ? a.t[ia + 1] : INFINITY;
        double eb = ib + 1 < b.n ? b.t[ib + 1] : INFINITY;
        double e = ea < eb ? ea : eb;
        if (out_push(&st, t) || out_push(&se, e < end ? e : end) ||
                out_push(&sr, r > floor ? r : 0.0)) {
            *err = 1;
            goto done;
        }
        if (e == INFINITY)
            break;
        t = e;
        if (ea == e)
            ia++;
        if (eb == e)
            ib++;
    }
    double left = size, dust = size * TOL;
    for (Py_ssize_t k = st.n - 1; k >= 0; k--) {
        double r = sr.v[k], room = r * (se.v[k] - st.v[k]);
        if (r > 0 && room >= left - dust) {
            double s = se.v[k] - left / r;
            res = s > earliest ? s : earliest;
            break;
        }
        left -= room;
    }
done:
    out_free(&st);
    out_free(&se);
    out_free(&sr);
    return res;
}

int merge(View l, const double *points, Py_ssize_t n_points,
          const double *rates, double sign, Out *nt, Out *nu)
{
    const double *times = l.t, *used = l.u;
    Py_ssize_t n_t = l.n;
    double cap = l.cap, tol = tolerance(cap, cap);
    double p0 = points[0], last = points[n_points - 1];
    Py_ssize_t i = segment(times, n_t, p0), k = segment(times, n_t, last);
    for (Py_ssize_t q = 0; q <= i; q++)
        if (out_push(nt, times[q]) || out_push(nu, used[q]))
            return -1;
    if (times[i] < p0 && (out_push(nt, p0) || out_push(nu, used[i])))
        return -1;
    Py_ssize_t ia = i, j = 0;
    double t = p0;
    while (t < last) {
        double u = used[ia] + sign * rates[j];
        if (cap - u <= tol)
            u = cap;
        else if (u <= tol)
            u = 0.0;
        if (nu->v[nu->n - 1] == u) {
            /* same level: coalesce */
        } else if (nt->v[nt->n - 1] == t) {
            nu->v[nu->n - 1] = u;
            if (nu->n > 1 && nu->v[nu->n - 2] == u) {
                nt->n--;
                nu->n--;
            }
        } else if (out_push(nt, t) || out_push(nu, u)) {
            return -1;
        }
        double ta = ia + 1 < n_t ? times[ia + 1] : INFINITY;
        double tp = points[j + 1];
        t = ta < tp ? ta : tp;
        if (ta == t)
            ia++;
        if (tp == t)
            j++;
    }
    if (nu->v[nu->n - 1] != used[k] &&
            (out_push(nt, last) || out_push(nu, used[k])))
        return -1;
    for (Py_ssize_t q = k + 1; q < n_t; q++) {
        if (used[q] == nu->v[nu->n - 1])
            continue;
        if (out_push(nt, times[q]) || out_push(nu, used[q]))
            return -1;
    }
    return 0;
}

/* Two Timeline arguments, read. */
static int two_links(PyObject *oa, PyObject *ob, Link *a, Link *b)
{
    out_init(&a->t);
    out_init(&a->u);
    out_init(&b->t);
    out_init(&b->u);
    if (link_read(oa, a) || link_read(ob, b)) {
        link_free(a);
        link_free(b);
        return -1;
    }
    return 0;
}

static PyObject *finish_time(PyObject *self, PyObject *args)
{
    PyObject *oa, *ob;
    Link a, b;
    double start, size;
    int err = 0;
    if (!PyArg_ParseTuple(args, "OOdd", &oa, &ob, &start, &size) ||
            two_links(oa, ob, &a, &b))
        return NULL;
    double end = size <= 0 ? start : walk(link_view(&a), link_view(&b),
                                          start, size, NULL, NULL, &err);
    link_free(&a);
    link_free(&b);
    return PyFloat_FromDouble(end);
}

static PyObject *fill(PyObject *self, PyObject *args)
{
    PyObject *oa, *ob, *res = NULL;
    Link a, b;
    double start, size, end;
    int err = 0;
    if (!PyArg_ParseTuple(args, "OOdd", &oa, &ob, &start, &size) ||
            two_links(oa, ob, &a, &b))
        return NULL;
    Out points, rates;
    out_init(&points);
    out_init(&rates);
    if (size <= 0) {
        end = start;
        err = out_push(&points, start) || out_push(&points, start);
    } else {
        end = walk(link_view(&a), link_view(&b), start, size, &points,
                   &rates, &err);
        if (!err && points.n == 0) {           /* inf rate, or never */
            double at = end == INFINITY ? start : end;
            err = out_push(&points, at) || out_push(&points, at);
        }
    }
    link_free(&a);
    link_free(&b);
    if (!err) {
        PyObject *p = out_list(&points), *r = p ? out_list(&rates) : NULL;
        if (p && r)
            res = Py_BuildValue("(dNN)", end, p, r);
        else {
            Py_XDECREF(p);
            Py_XDECREF(r);
        }
    }
    out_free(&points);
    out_free(&rates);
    return res;
}

static PyObject *latest_start(PyObject *self, PyObject *args)
{
    PyObject *oa, *ob;
    Link a, b;
    double earliest, end, size;
    int err = 0;
    if (!PyArg_ParseTuple(args, "OOddd", &oa, &ob, &earliest, &end, &size)
            || two_links(oa, ob, &a, &b))
        return NULL;
    double s = latest(link_view(&a), link_view(&b), earliest, end, size,
                      &err);
    link_free(&a);
    link_free(&b);
    if (err)
        return NULL;
    if (isnan(s))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(s);
}

/* A new object of ``like``'s type with its cap and these lists (no
 * __init__: the cap was checked when the first timeline was made). */
static PyObject *new_timeline(PyObject *like, const Out *nt, const Out *nu)
{
    PyTypeObject *type = Py_TYPE(like);
    PyObject *empty = PyTuple_New(0), *obj, *cap, *t = NULL, *u = NULL;
    if (!empty)
        return NULL;
    obj = type->tp_new(type, empty, NULL);
    Py_DECREF(empty);
    if (!obj)
        return NULL;
    cap = PyObject_GetAttr(like, s_cap);
    t = cap ? out_list(nt) : NULL;
    u = t ? out_list(nu) : NULL;
    if (!u || PyObject_SetAttr(obj, s_cap, cap) ||
            PyObject_SetAttr(obj, s_times, t) ||
            PyObject_SetAttr(obj, s_used, u))
        Py_CLEAR(obj);
    Py_XDECREF(cap);
    Py_XDECREF(t);
    Py_XDECREF(u);
    return obj;
}

static PyObject *added(PyObject *self, PyObject *args)
{
    PyObject *ol, *op, *orr, *res = NULL;
    double sign;
    if (!PyArg_ParseTuple(args, "OO!O!d", &ol, &PyList_Type, &op,
                          &PyList_Type, &orr, &sign))
        return NULL;
    Out pts, rts, nt, nu;
    Link l;
    out_init(&pts);
    out_init(&rts);
    out_init(&nt);
    out_init(&nu);
    out_init(&l.t);
    out_init(&l.u);
    if (out_read(op, &pts))
        goto done;
    if (pts.n < 2 || pts.v[pts.n - 1] <= pts.v[0]) {
        Py_INCREF(ol);
        res = ol;
        goto done;
    }
    if (out_read(orr, &rts) || link_read(ol, &l))
        goto done;
    if (rts.n < pts.n - 1) {
        PyErr_SetString(PyExc_ValueError, "one rate per segment needed");
        goto done;
    }
    if (pts.v[0] < l.t.v[0]) {
        PyErr_SetString(PyExc_ValueError,
                        "a reservation cannot start before the timeline");
        goto done;
    }
    if (merge(link_view(&l), pts.v, pts.n, rts.v, sign, &nt, &nu) == 0)
        res = new_timeline(ol, &nt, &nu);
done:
    out_free(&pts);
    out_free(&rts);
    out_free(&nt);
    out_free(&nu);
    link_free(&l);
    return res;
}

static PyMethodDef methods[] = {
    {"finish_time", finish_time, METH_VARARGS,
     "finish_time(a, b, start, size): t_en (links.py)"},
    {"fill", fill, METH_VARARGS,
     "fill(a, b, start, size): (t_en, points, rates)"},
    {"latest_start", latest_start, METH_VARARGS,
     "latest_start(a, b, earliest, end, size): the latest start or None"},
    {"added", added, METH_VARARGS,
     "added(timeline, points, rates, sign): a new timeline, or the same "
     "one when the reservation is empty"},
    {"det_agg_trial", det_agg_trial, METH_VARARGS, det_agg_trial_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_linkops",
    "C versions of partialcoll.mlfabric.links' hot loops.", -1, methods,
};

PyMODINIT_FUNC PyInit__linkops(void)
{
    s_cap = PyUnicode_InternFromString("cap");
    s_times = PyUnicode_InternFromString("times");
    s_used = PyUnicode_InternFromString("used");
    if (!s_cap || !s_times || !s_used)
        return NULL;
    return PyModule_Create(&module);
}
