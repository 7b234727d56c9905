/* pc_module.c -- partialcoll._core: module functions (engine control, the
 * emulated network, the timeline) and the constants of the C core.  The
 * Sched type is in pc_pysched.c. */
#include "pc_module.h"
#include "pc_netem.h"

#include <math.h>

static PyObject *exc_for_code[PC_NCODES];   /* set by partialcoll.core.errors */

PyObject *pc_raise(int rc, const char *msg)
{
    PyObject *cls = (rc > 0 && rc < PC_NCODES && exc_for_code[rc])
                        ? exc_for_code[rc] : PyExc_RuntimeError;
    PyErr_SetString(cls, msg && *msg ? msg : "partialcoll error");
    return NULL;
}

static PyObject *mod_set_exceptions(PyObject *m, PyObject *mapping)
{
    (void)m;
    for (int i = 1; i < PC_NCODES; i++) {
        PyObject *k = PyLong_FromLong(i);
        PyObject *v = PyDict_GetItemWithError(mapping, k);
        Py_DECREF(k);
        if (v) {
            Py_INCREF(v);
            Py_XSETREF(exc_for_code[i], v);
        }
    }
    Py_RETURN_NONE;
}

/* shutdown(drain_timeout) -> sends that never completed */
static PyObject *mod_shutdown(PyObject *m, PyObject *args)
{
    (void)m;
    double drain = 5.0;
    if (!PyArg_ParseTuple(args, "|d", &drain))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pc_engine_shutdown(drain);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(pc_reap());
}

static PyObject *mod_reap(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromLong(pc_reap());
}

static PyObject *mod_inject_alloc_failure(PyObject *m, PyObject *args)
{
    (void)m;
    int n;
    if (!PyArg_ParseTuple(args, "i", &n))
        return NULL;
    pc_inject_alloc_failure(n);
    Py_RETURN_NONE;
}

static PyObject *mod_thread_cputime(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyFloat_FromDouble(pc_engine_thread_cputime());
}

static PyObject *mod_now(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyFloat_FromDouble(pc_now());
}

static PyObject *mod_set_send_cap(PyObject *m, PyObject *args)
{
    (void)m;
    int cap;
    if (!PyArg_ParseTuple(args, "i", &cap))
        return NULL;
    if (cap < 0)
        return pc_raise(PC_EINVAL, "the send cap must be >= 0 (0: no cap)");
    pc_engine_set_send_cap(cap);
    Py_RETURN_NONE;
}

/* set_network(config): the emulated network from a normalised description
 * (partialcoll/transport/network.py writes it), or "" for plain MPI. */
static PyObject *mod_set_network(PyObject *m, PyObject *args)
{
    (void)m;
    const char *config;
    char err[512] = "";
    int rc;
    if (!PyArg_ParseTuple(args, "s", &config))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = pc_engine_set_network(config, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != PC_OK)
        return pc_raise(rc, err);
    return PyUnicode_FromString(pc_engine_transport_name());
}

/* netem_model(config, t0, t, msgs, now) -> (time, [(state, left, t_end)],
 * next event): the emulated network's fluid model alone, advanced from t
 * to now with msgs [(src, dst, level, bytes, left)] in its channels, and
 * its next event after that (tests) */
static PyObject *mod_netem_model(PyObject *m, PyObject *args)
{
    (void)m;
    const char *config;
    double t0, t, now;
    PyObject *seq;
    char err[512] = "";
    if (!PyArg_ParseTuple(args, "sddOd", &config, &t0, &t, &seq, &now))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "msgs must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    double *msgs = calloc((size_t)n * 5 + 1, sizeof(double));
    double *out = calloc((size_t)n * 3 + 1, sizeof(double));
    PyObject *res = NULL;
    if (!msgs || !out) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
        double *x = msgs + 5 * k;
        if (!PyArg_ParseTuple(item, "ddddd", x, x + 1, x + 2, x + 3, x + 4))
            goto done;
    }
    double event = NAN;
    double after = netem_model_probe(config, t0, t, msgs, (int)n, now, out,
                                     &event, err, sizeof err);
    if (isnan(after)) {
        pc_raise(PC_EINVAL, err);
        goto done;
    }
    PyObject *list = PyList_New(n);
    for (Py_ssize_t k = 0; list && k < n; k++) {
        PyObject *e = Py_BuildValue("(idd)", (int)out[3 * k], out[3 * k + 1],
                                    out[3 * k + 2]);
        if (!e) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, k, e);
    }
    if (list)
        res = Py_BuildValue("(dNd)", after, list, event);
done:
    free(msgs);
    free(out);
    Py_DECREF(fast);
    return res;
}

/* network_rate(rank, nic, t) -> (bytes/s, the network's time zero) */
static PyObject *mod_network_rate(PyObject *m, PyObject *args)
{
    (void)m;
    int rank, nic;
    double t, rate, t0;
    if (!PyArg_ParseTuple(args, "iid", &rank, &nic, &t))
        return NULL;
    if (pc_netem_query(rank, nic, t, &rate, &t0) < 0)
        return pc_raise(PC_EINVAL, "no emulated network in use, or no such "
                        "rank/NIC");
    return Py_BuildValue("(dd)", rate, t0);
}

static PyObject *mod_engine_stats(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    uint64_t v[6] = {0};
    pc_engine_stats(v, 6);
    return Py_BuildValue("{sKsKsKsKsKsK}", "foreign",
                         (unsigned long long)v[0], "unclaimed",
                         (unsigned long long)v[1], "hot",
                         (unsigned long long)v[2], "sends_left",
                         (unsigned long long)v[3], "outstanding",
                         (unsigned long long)v[4], "send_cap",
                         (unsigned long long)v[5]);
}

static PyObject *mod_timeline_enable(PyObject *m, PyObject *args)
{
    (void)m;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
    return PyLong_FromLong(pc_tl_enable(on));
}

/* timeline_take() -> bytes of every event recorded so far (then cleared) */
static PyObject *mod_timeline_take(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    int64_t size = pc_tl_enable(atomic_load(&pc_tl_on));
    int64_t n = pc_tl_count() * size;
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!b)
        return NULL;
    int64_t got = pc_tl_take(PyBytes_AS_STRING(b), n);
    if (got != n)
        _PyBytes_Resize(&b, (Py_ssize_t)got);
    return b;
}

static PyObject *mod_cuda_context(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    void *ctx = NULL;
    char err[256] = "";
    if (pc_cuda_current_context(&ctx, err, sizeof err) < 0)
        return pc_raise(PC_EDEVICE, err);
    return PyLong_FromUnsignedLongLong((uintptr_t)ctx);
}

static PyObject *mod_mpi_cuda_aware(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromLong(pc_mpi_cuda_aware());
}

static int set_int(PyObject *d, const char *k, long v)
{
    PyObject *o = PyLong_FromLong(v);
    int rc = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return rc;
}

static PyObject *mod_constants(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    static const struct { const char *name; long value; } C[] = {
        {"NOP", PC_NOP}, {"TRIGGER", PC_TRIGGER}, {"SEND", PC_SEND},
        {"RECV", PC_RECV}, {"REDUCE", PC_REDUCE}, {"COPY", PC_COPY},
        {"CALLBACK", PC_CALLBACK}, {"FENCE", PC_FENCE}, {"DELAY", PC_DELAY},
        {"START_AT", PC_START_AT}, {"GATE", PC_GATE}, {"SCALE", PC_SCALE},
        {"HOST", PC_HOST}, {"DEVICE", PC_DEVICE},
        {"DEV_EMULATE", PC_DEV_EMULATE}, {"DEV_CUDA", PC_DEV_CUDA},
        {"NREDOPS", PC_NREDOPS}, {"NDTYPES", PC_NDTYPES},
        {"ALL", PC_ALL}, {"ANY", PC_ANY}, {"ATLEAST", PC_ATLEAST},
        {"F_LOCKED", PC_F_LOCKED}, {"F_OPTIONAL", PC_F_OPTIONAL},
        {"F_STAMPED", PC_F_STAMPED}, {"F_DELIVERED", PC_F_DELIVERED},
        {"OC_NONE", PC_OC_NONE}, {"OC_OK", PC_OC_OK},
        {"OC_DROPPED", PC_OC_DROPPED}, {"OC_TIMEDOUT", PC_OC_TIMEDOUT},
        {"OC_SKIPPED", PC_OC_SKIPPED},
        {"DESC_LEN", PC_DESC_LEN}, {"D_KIND", PC_D_KIND},
        {"D_MODE", PC_D_MODE}, {"D_FLAGS", PC_D_FLAGS},
        {"D_ASLOT", PC_D_ASLOT}, {"D_AOFF", PC_D_AOFF},
        {"D_BSLOT", PC_D_BSLOT}, {"D_BOFF", PC_D_BOFF},
        {"D_COUNT", PC_D_COUNT}, {"D_DTYPE", PC_D_DTYPE},
        {"D_REDOP", PC_D_REDOP}, {"D_PEER", PC_D_PEER}, {"D_TAG", PC_D_TAG},
        {"D_PRIO", PC_D_PRIO}, {"D_NDEPS", PC_D_NDEPS},
        {"D_DEPOFF", PC_D_DEPOFF}, {"D_NEED", PC_D_NEED},
        {"D_TIMEOUT", PC_D_TIMEOUT}, {"D_TCLASS", PC_D_TCLASS},
        {"D_ORDER", PC_D_ORDER}, {"D_VALUE", PC_D_VALUE},
        {"D_PSLOT", PC_D_PSLOT}, {"D_POFF", PC_D_POFF}, {"D_REF", PC_D_REF},
        {"D_ADD", PC_D_ADD}, {"D_PRSLOT", PC_D_PRSLOT},
        {"D_PROFF", PC_D_PROFF}, {"NCLASS", NETEM_NCLASS},
        {"EINVAL", PC_EINVAL}, {"EBUSY", PC_EBUSY}, {"EMPI", PC_EMPI},
        {"ETIMEOUT", PC_ETIMEOUT}, {"ENOMEM", PC_ENOMEM},
        {"EFREED", PC_EFREED}, {"ETHREAD", PC_ETHREAD},
        {"EDEVICE", PC_EDEVICE},
        {"EV_READY", PC_EV_READY}, {"EV_START", PC_EV_START},
        {"EV_COMPLETE", PC_EV_COMPLETE}, {"EV_GATED", PC_EV_GATED},
        {"EV_RELEASED", PC_EV_RELEASED}, {"EV_WIRE_START", PC_EV_WIRE_START},
        {"EV_WIRE_END", PC_EV_WIRE_END}, {"EV_DELIVERED", PC_EV_DELIVERED},
        {"EV_DROPPED", PC_EV_DROPPED}, {"EV_TIMEDOUT", PC_EV_TIMEDOUT},
        {"EV_ROUND", PC_EV_ROUND},
    };
    PyObject *d = PyDict_New(), *dt = PyDict_New(), *ops = PyDict_New();
    PyObject *kinds = PyList_New(0);
    if (!d || !dt || !ops || !kinds)
        goto fail;
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++)
        if (set_int(d, C[i].name, C[i].value) < 0)
            goto fail;
    for (int i = 0; i < PC_NKINDS; i++) {
        PyObject *n = PyUnicode_FromString(pc_kind_names[i]);
        if (!n || PyList_Append(kinds, n) < 0) {
            Py_XDECREF(n);
            goto fail;
        }
        Py_DECREF(n);
    }
    for (int i = 0; i < PC_NDTYPES; i++) {
        PyObject *t = Py_BuildValue("(iiC)", i, pc_dtypes[i].size,
                                    pc_dtypes[i].kind);
        if (!t || PyDict_SetItemString(dt, pc_dtypes[i].name, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
    }
    for (int i = 0; i < PC_NREDOPS; i++) {
        PyObject *valid = PyList_New(0);
        for (int t = 0; valid && t < PC_NDTYPES; t++)
            if (pc_redop_valid(i, t)) {
                PyObject *n = PyUnicode_FromString(pc_dtypes[t].name);
                PyList_Append(valid, n);
                Py_XDECREF(n);
            }
        PyObject *t = valid ? Py_BuildValue("(iN)", i, valid) : NULL;
        if (!t || PyDict_SetItemString(ops, pc_redop_names[i], t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
    }
    PyDict_SetItemString(d, "dtypes", dt);
    PyDict_SetItemString(d, "redops", ops);
    PyDict_SetItemString(d, "kinds", kinds);
    Py_DECREF(dt);
    Py_DECREF(ops);
    Py_DECREF(kinds);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(dt);
    Py_XDECREF(ops);
    Py_XDECREF(kinds);
    return NULL;
}

static PyMethodDef mod_methods[] = {
    {"set_exceptions", mod_set_exceptions, METH_O, "map codes to classes"},
    {"shutdown", mod_shutdown, METH_VARARGS,
     "shutdown(drain_timeout=5.0) -> schedules whose sends never completed"},
    {"reap", mod_reap, METH_NOARGS,
     "release buffers of freed schedules whose sends completed; returns "
     "how many still drain"},
    {"inject_alloc_failure", mod_inject_alloc_failure, METH_VARARGS,
     "testing aid: make the n-th allocation on the progress path fail "
     "(-1: never)"},
    {"thread_cputime", mod_thread_cputime, METH_NOARGS,
     "CPU seconds used by the progress thread"},
    {"now", mod_now, METH_NOARGS,
     "the executor's clock (CLOCK_MONOTONIC seconds, shared by a host)"},
    {"set_send_cap", mod_set_send_cap, METH_VARARGS,
     "set_send_cap(n): sends in flight per destination (0: no cap)"},
    {"set_network", mod_set_network, METH_VARARGS,
     "set_network(config) -> transport name"},
    {"engine_stats", mod_engine_stats, METH_NOARGS, "engine counters"},
    {"netem_model", mod_netem_model, METH_VARARGS,
     "netem_model(config, t0, t, msgs, now) -> (time, states, next event) "
     "(tests)"},
    {"network_rate", mod_network_rate, METH_VARARGS,
     "network_rate(rank, nic, t) -> (rate, t0): the emulated NIC's rate"},
    {"timeline_enable", mod_timeline_enable, METH_VARARGS,
     "timeline_enable(on) -> bytes per event"},
    {"timeline_take", mod_timeline_take, METH_NOARGS,
     "the recorded events (cleared)"},
    {"constants", mod_constants, METH_NOARGS, "constants of the C core"},
    {"cuda_context", mod_cuda_context, METH_NOARGS,
     "the calling thread's current CUcontext (loads libcuda.so.1)"},
    {"mpi_cuda_aware", mod_mpi_cuda_aware, METH_NOARGS,
     "1/0 from MPIX_Query_cuda_support, -1 when MPI lacks it"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_core",
                                    "partialcoll C executor", -1, mod_methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m || PyType_Ready(&pc_SchedType) < 0)
        return NULL;
    Py_INCREF(&pc_SchedType);
    PyModule_AddObject(m, "Sched", (PyObject *)&pc_SchedType);
    return m;
}
