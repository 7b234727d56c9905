/* module.c -- partialcoll._core: module functions (engine control, the
 * emulated network, the timeline) and the constants of the C core.  The
 * Sched type is in pysched.c (module.h lists the binding's files). */
#include "python/module.h"
#include "common/pc_trace.h"

#include <math.h>
#include <string.h>

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

/* settle(seconds): pc_engine_settle */
static PyObject *mod_settle(PyObject *m, PyObject *args)
{
    (void)m;
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds))
        return NULL;
    if (!(seconds >= 0 && seconds <= 60))
        return pc_raise(PC_EINVAL, "settle takes 0 to 60 seconds");
    pc_engine_settle(seconds);
    Py_RETURN_NONE;
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
    double after = pc_engine_network_model(config, t0, t, msgs, (int)n, now,
                                           out, &event, err, sizeof err);
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
    int rank, nic, rc;
    double t, rate, t0;
    if (!PyArg_ParseTuple(args, "iid", &rank, &nic, &t))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = pc_engine_network_rate(rank, nic, t, &rate, &t0);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return pc_raise(PC_EINVAL, "no emulated network in use, or no such "
                        "rank/NIC");
    return Py_BuildValue("(dd)", rate, t0);
}

static PyObject *mod_engine_stats(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    uint64_t v[8] = {0};
    pc_engine_stats(v, 8);
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "foreign",
                         (unsigned long long)v[0], "unclaimed",
                         (unsigned long long)v[1], "hot",
                         (unsigned long long)v[2], "sends_left",
                         (unsigned long long)v[3], "outstanding",
                         (unsigned long long)v[4], "send_cap",
                         (unsigned long long)v[5], "control_receives",
                         (unsigned long long)v[6], "nudges",
                         (unsigned long long)v[7]);
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

/* ---- constants(): the C core's, so Python never copies one by hand */
static int set_int(PyObject *d, const char *k, long v)
{
    PyObject *o = PyLong_FromLong(v);
    int rc = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* d[k] = v, v's reference taken (also on failure) */
static int set_new(PyObject *d, const char *k, PyObject *v)
{
    int rc = v ? PyDict_SetItemString(d, k, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* each name is its value's without the PC_ prefix: they cannot drift */
#define K(name) {#name, PC_##name}
static const struct { const char *name; long value; } constants[] = {
    K(NOP), K(TRIGGER), K(SEND), K(RECV), K(REDUCE), K(COPY), K(CALLBACK),
    K(FENCE), K(DELAY), K(START_AT), K(GATE), K(SCALE),
    K(HOST), K(DEVICE), K(DEV_EMULATE), K(DEV_CUDA),
    K(NREDOPS), K(NDTYPES), K(NCLASS),
    K(ALL), K(ANY), K(ATLEAST),
    K(F_LOCKED), K(F_OPTIONAL), K(F_STAMPED), K(F_DELIVERED), K(F_FILL),
    K(STAMP_DATA_MAX), K(STAMP_HEADER),
    K(TL_CALLER),
    K(OC_NONE), K(OC_OK), K(OC_DROPPED), K(OC_TIMEDOUT), K(OC_SKIPPED),
    K(DESC_LEN), K(D_KIND), K(D_MODE), K(D_FLAGS), K(D_ASLOT), K(D_AOFF),
    K(D_BSLOT), K(D_BOFF), K(D_COUNT), K(D_DTYPE), K(D_REDOP), K(D_PEER),
    K(D_TAG), K(D_PRIO), K(D_NDEPS), K(D_DEPOFF), K(D_NEED), K(D_TIMEOUT),
    K(D_TCLASS), K(D_ORDER), K(D_VALUE), K(D_PSLOT), K(D_POFF), K(D_REF),
    K(D_ADD), K(D_PRSLOT), K(D_PROFF), K(D_BBYTES), K(D_ARG),
    K(MAX_CALLBACKS),
    K(EINVAL), K(EBUSY), K(EMPI), K(ETIMEOUT), K(ENOMEM), K(EFREED),
    K(ETHREAD), K(EDEVICE), K(EFAILED),
    K(EV_READY), K(EV_START), K(EV_COMPLETE), K(EV_GATED), K(EV_RELEASED),
    K(EV_WIRE_START), K(EV_WIRE_END), K(EV_DELIVERED), K(EV_DROPPED),
    K(EV_TIMEDOUT), K(EV_ROUND),
};
#undef K

/* [name of kind 0, name of kind 1, ...] */
static PyObject *kind_names(void)
{
    PyObject *kinds = PyList_New(PC_NKINDS);
    for (int i = 0; kinds && i < PC_NKINDS; i++) {
        PyObject *n = PyUnicode_FromString(pc_kind_names[i]);
        if (!n)
            Py_CLEAR(kinds);
        else
            PyList_SET_ITEM(kinds, i, n);
    }
    return kinds;
}

/* {dtype name: (code, bytes, kind)} */
static PyObject *dtypes(void)
{
    PyObject *dt = PyDict_New();
    for (int i = 0; dt && i < PC_NDTYPES; i++)
        if (set_new(dt, pc_dtypes[i].name,
                    Py_BuildValue("(iiC)", i, pc_dtypes[i].size,
                                  pc_dtypes[i].kind)) < 0)
            Py_CLEAR(dt);
    return dt;
}

/* the names of the dtypes redop is defined for */
static PyObject *valid_dtypes(int redop)
{
    PyObject *valid = PyList_New(0);
    for (int t = 0; valid && t < PC_NDTYPES; t++) {
        if (!pc_redop_valid(redop, t))
            continue;
        PyObject *n = PyUnicode_FromString(pc_dtypes[t].name);
        if (!n || PyList_Append(valid, n) < 0)
            Py_CLEAR(valid);
        Py_XDECREF(n);
    }
    return valid;
}

/* {redop name: (code, [dtype names it is defined for])} */
static PyObject *redops(void)
{
    PyObject *ops = PyDict_New();
    for (int i = 0; ops && i < PC_NREDOPS; i++) {
        PyObject *valid = valid_dtypes(i);
        if (set_new(ops, pc_redop_names[i],
                    valid ? Py_BuildValue("(iN)", i, valid) : NULL) < 0)
            Py_CLEAR(ops);
    }
    return ops;
}

static PyObject *mod_constants(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (set_int(d, constants[i].name, constants[i].value) < 0)
            goto fail;
    if (set_new(d, "dtypes", dtypes()) < 0 ||
        set_new(d, "redops", redops()) < 0 ||
        set_new(d, "kinds", kind_names()) < 0)
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *mod_callback_id(PyObject *m, PyObject *name)
{
    (void)m;
    const char *n = PyUnicode_AsUTF8(name);
    if (!n)
        return NULL;
    int id = pc_sched_callback_id(n);
    if (id < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(id);
}

/* apart(send, recv): whether a cached plan's call may take these two
 * buffers as they are: C-contiguous, of one format and length, recv
 * writable, their memory apart.  Never an error: on False the caller takes
 * its checked path, which says what is wrong. */
static PyObject *mod_apart(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "apart() takes two buffers");
        return NULL;
    }
    Py_buffer a, b;
    if (PyObject_GetBuffer(args[0], &a, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) <
        0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[1], &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                            PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&a);
        Py_RETURN_FALSE;
    }
    const char *pa = a.buf, *pb = b.buf;
    int ok = a.len == b.len && a.itemsize == b.itemsize &&
             strcmp(a.format ? a.format : "B", b.format ? b.format : "B") ==
                 0 &&
             (pa + a.len <= pb || pb + b.len <= pa);
    PyBuffer_Release(&b);
    PyBuffer_Release(&a);
    return PyBool_FromLong(ok);
}

static PyMethodDef mod_methods[] = {
    {"apart", (PyCFunction)(void (*)(void))mod_apart, METH_FASTCALL,
     "two buffers alike and apart (a cached plan's check)"},
    {"set_exceptions", pc_set_exceptions, METH_O, "map codes to classes"},
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
    {"settle", mod_settle, METH_VARARGS,
     "settle(seconds): keep the transport moving that long (pc_engine_settle)"},
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
    {"callback_id", mod_callback_id, METH_O,
     "callback_id(name) -> the id of a registered native callback, or None"},
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
    if (pc_py_add_capi(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
