/* partialcoll.mlfabric._linkops: the three hot loops of
 * partialcoll/mlfabric/links.py in C (t_en, a transfer's profile, adding a
 * profile to a link's reservation timeline).
 *
 * Pure arithmetic on the Timeline objects' lists of floats: no MPI, and
 * nothing to do with the executor in csrc/.  Each function performs the
 * same floating-point operations in the same order as its Python twin in
 * links.py (_py_finish_time, _py_fill, Timeline._py_added), so results are
 * bit-identical; tests/test_mlfabric_links.py compares them on random
 * timelines.  Built with -ffp-contract=off (no fused multiply-add).
 * links.py uses the Python versions when this module is not built.
 *
 * A Timeline has ``cap`` (float), ``times`` and ``used`` (lists of floats
 * of equal length, times increasing): used[i] is reserved on
 * [times[i], times[i+1]), the last segment runs to +inf.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#define TOL 1e-9
#define SMALL 64

/* A list of floats read into C, in a small inline buffer when it fits. */
typedef struct {
    double *v;
    Py_ssize_t n;
    double small[SMALL];
} Vec;

static void vec_free(Vec *x)
{
    if (x->v && x->v != x->small)
        free(x->v);
    x->v = NULL;
}

static int vec_read(PyObject *list, Vec *x)
{
    x->v = NULL;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of floats");
        return -1;
    }
    x->n = PyList_GET_SIZE(list);
    x->v = x->n <= SMALL ? x->small : malloc(sizeof(double) * x->n);
    if (!x->v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < x->n; i++) {
        x->v[i] = PyFloat_AsDouble(PyList_GET_ITEM(list, i));
        if (x->v[i] == -1.0 && PyErr_Occurred()) {
            vec_free(x);
            return -1;
        }
    }
    return 0;
}

/* A growable output list of doubles. */
typedef struct {
    double *v;
    Py_ssize_t n, cap;
    double small[SMALL];
} Out;

static void out_init(Out *o)
{
    o->v = o->small;
    o->n = 0;
    o->cap = SMALL;
}

static int out_push(Out *o, double x)
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

static void out_free(Out *o)
{
    if (o->v != o->small)
        free(o->v);
}

static PyObject *out_list(const Out *o)
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

/* A Timeline's fields. */
typedef struct {
    double cap;
    Vec t, u;
} Link;

static PyObject *s_cap, *s_times, *s_used;

static int link_read(PyObject *obj, Link *l)
{
    l->t.v = l->u.v = NULL;
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
    int rc = vec_read(times, &l->t);
    Py_DECREF(times);
    if (rc)
        return -1;
    PyObject *used = PyObject_GetAttr(obj, s_used);
    if (!used)
        goto fail;
    rc = vec_read(used, &l->u);
    Py_DECREF(used);
    if (rc)
        goto fail;
    if (l->t.n != l->u.n || l->t.n == 0) {
        PyErr_SetString(PyExc_ValueError, "a timeline's times and used "
                        "must be non-empty and of equal length");
        goto fail;
    }
    return 0;
fail:
    vec_free(&l->t);
    vec_free(&l->u);
    return -1;
}

static void link_free(Link *l)
{
    vec_free(&l->t);
    vec_free(&l->u);
}

static double tolerance(double ca, double cb)
{
    double c = ca < cb ? ca : cb;
    return c < INFINITY ? c * TOL : 0.0;
}

/* Python's bisect_right(v, x) - 1, never below 0. */
static Py_ssize_t segment(const Vec *v, double x)
{
    Py_ssize_t lo = 0, hi = v->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < v->v[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > 0 ? lo - 1 : 0;
}

/* The walk of _py_fill / _py_finish_time over min(residual_a, residual_b)
 * from start; records the profile when points != NULL. */
static double walk(const Link *a, const Link *b, double start, double size,
                   Out *points, Out *rates, int *err)
{
    const double *ta = a->t.v, *ua = a->u.v, *tb = b->t.v, *ub = b->u.v;
    double ca = a->cap, cb = b->cap;
    Py_ssize_t ia = segment(&a->t, start), ib = segment(&b->t, start);
    Py_ssize_t na = a->t.n, nb = b->t.n;
    double t = start, left = size;
    double floor = tolerance(ca, cb), dust = size * TOL;
    *err = 0;
    for (;;) {
        double ra = ca - ua[ia], rb = cb - ub[ib];
        double r = ra < rb ? ra : rb;
        double ea = ia + 1 < na ? ta[ia + 1] : INFINITY;
        double eb = ib + 1 < nb ? tb[ib + 1] : INFINITY;
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

static int path_args(PyObject *args, Link *a, Link *b, double *start,
                     double *size)
{
    PyObject *oa, *ob;
    if (!PyArg_ParseTuple(args, "OOdd", &oa, &ob, start, size))
        return -1;
    if (link_read(oa, a))
        return -1;
    if (link_read(ob, b)) {
        link_free(a);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(finish_doc, "finish_time(a, b, start, size): t_en (links.py)");

static PyObject *finish_time(PyObject *self, PyObject *args)
{
    Link a, b;
    double start, size;
    int err;
    if (path_args(args, &a, &b, &start, &size))
        return NULL;
    double end = size <= 0 ? start : walk(&a, &b, start, size, NULL, NULL,
                                          &err);
    link_free(&a);
    link_free(&b);
    return PyFloat_FromDouble(end);
}

PyDoc_STRVAR(fill_doc, "fill(a, b, start, size): (t_en, points, rates)");

static PyObject *fill(PyObject *self, PyObject *args)
{
    Link a, b;
    double start, size;
    int err = 0;
    if (path_args(args, &a, &b, &start, &size))
        return NULL;
    Out points, rates;
    out_init(&points);
    out_init(&rates);
    double end;
    if (size <= 0) {
        end = start;
        out_push(&points, start);
        out_push(&points, start);
    } else {
        end = walk(&a, &b, start, size, &points, &rates, &err);
        if (!err && points.n == 0) {           /* inf rate, or never */
            double at = end == INFINITY ? start : end;
            out_push(&points, at);
            out_push(&points, at);
        }
    }
    link_free(&a);
    link_free(&b);
    PyObject *res = NULL;
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

PyDoc_STRVAR(latest_doc, "latest_start(a, b, earliest, end, size): the "
             "latest start or None (links.py)");

static PyObject *latest_start(PyObject *self, PyObject *args)
{
    PyObject *oa, *ob;
    double earliest, end, size;
    Link a, b;
    if (!PyArg_ParseTuple(args, "OOddd", &oa, &ob, &earliest, &end, &size))
        return NULL;
    if (link_read(oa, &a))
        return NULL;
    if (link_read(ob, &b)) {
        link_free(&a);
        return NULL;
    }
    /* the segments of min(residual_a, residual_b) on [earliest, end),
     * as _walk yields them, then filled backwards from end */
    Out st, se, sr;
    out_init(&st);
    out_init(&se);
    out_init(&sr);
    const double *ta = a.t.v, *ua = a.u.v, *tb = b.t.v, *ub = b.u.v;
    double ca = a.cap, cb = b.cap, floor = tolerance(ca, cb);
    Py_ssize_t ia = segment(&a.t, earliest), ib = segment(&b.t, earliest);
    double t = earliest;
    int err = 0;
    for (;;) {
        if (t >= end)
            break;
        double ra = ca - ua[ia], rb = cb - ub[ib];
        double r = ra < rb ? ra : rb;
        double ea = ia + 1 < a.t.n ? ta[ia + 1] : INFINITY;
        double eb = ib + 1 < b.t.n ? tb[ib + 1] : INFINITY;
        double e = ea < eb ? ea : eb;
        if (out_push(&st, t) || out_push(&se, e < end ? e : end) ||
                out_push(&sr, r > floor ? r : 0.0)) {
            err = 1;
            break;
        }
        if (e == INFINITY)
            break;
        t = e;
        if (ea == e)
            ia++;
        if (eb == e)
            ib++;
    }
    link_free(&a);
    link_free(&b);
    PyObject *res = NULL;
    if (!err) {
        double left = size, dust = size * TOL;
        for (Py_ssize_t k = st.n - 1; k >= 0; k--) {
            double r = sr.v[k], room = r * (se.v[k] - st.v[k]);
            if (r > 0 && room >= left - dust) {
                double s = se.v[k] - left / r;
                res = PyFloat_FromDouble(s > earliest ? s : earliest);
                break;
            }
            left -= room;
        }
        if (!res) {
            Py_INCREF(Py_None);
            res = Py_None;
        }
    }
    out_free(&st);
    out_free(&se);
    out_free(&sr);
    return res;
}

/* Timeline._py_added's merge. */
static int merge(const Link *l, const Vec *pts, const Vec *rts, double sign,
                 Out *nt, Out *nu)
{
    const double *times = l->t.v, *used = l->u.v;
    const double *points = pts->v, *rates = rts->v;
    Py_ssize_t n_t = l->t.n;
    double cap = l->cap, tol = tolerance(cap, cap);
    double p0 = points[0], last = points[pts->n - 1];
    Py_ssize_t i = segment(&l->t, p0), k = segment(&l->t, last);
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

/* A new object of timeline's type with its cap and these lists (no
 * __init__: the cap was checked when the first timeline was made). */
static PyObject *new_timeline(PyObject *like, const Out *nt, const Out *nu)
{
    PyTypeObject *type = Py_TYPE(like);
    PyObject *empty = PyTuple_New(0), *obj = NULL, *cap = NULL;
    PyObject *t = NULL, *u = NULL;
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

PyDoc_STRVAR(added_doc, "added(timeline, points, rates, sign): a new "
             "timeline, or the same one when the reservation is empty");

static PyObject *added(PyObject *self, PyObject *args)
{
    PyObject *ol, *op, *orr;
    double sign;
    if (!PyArg_ParseTuple(args, "OO!O!d", &ol, &PyList_Type, &op,
                          &PyList_Type, &orr, &sign))
        return NULL;
    Link l;
    Vec pts, rts;
    if (vec_read(op, &pts))
        return NULL;
    if (pts.n < 2 || pts.v[pts.n - 1] <= pts.v[0]) {
        vec_free(&pts);
        Py_INCREF(ol);
        return ol;
    }
    if (vec_read(orr, &rts)) {
        vec_free(&pts);
        return NULL;
    }
    PyObject *res = NULL;
    if (rts.n < pts.n - 1) {
        PyErr_SetString(PyExc_ValueError, "one rate per segment needed");
        goto done_vecs;
    }
    if (link_read(ol, &l))
        goto done_vecs;
    if (pts.v[0] < l.t.v[0]) {
        PyErr_SetString(PyExc_ValueError,
                        "a reservation cannot start before the timeline");
        goto done_link;
    }
    Out nt, nu;
    out_init(&nt);
    out_init(&nu);
    if (merge(&l, &pts, &rts, sign, &nt, &nu) == 0)
        res = new_timeline(ol, &nt, &nu);
    out_free(&nt);
    out_free(&nu);
done_link:
    link_free(&l);
done_vecs:
    vec_free(&pts);
    vec_free(&rts);
    return res;
}

static PyMethodDef methods[] = {
    {"finish_time", finish_time, METH_VARARGS, finish_doc},
    {"fill", fill, METH_VARARGS, fill_doc},
    {"added", added, METH_VARARGS, added_doc},
    {"latest_start", latest_start, METH_VARARGS, latest_doc},
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
