/* pyattrs.c -- the read-only side of partialcoll._core.Sched: rounds,
 * counters, the last round's outcomes. */
#include "python/module.h"

/* outcomes() -> (round, outcome bytes, delivered-input counts as int32
 * bytes, completion times and arrival times as float64 bytes) of the last
 * completed round (round -1: none yet). */
PyObject *pc_py_outcomes(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (pc_check_open(self))
        return NULL;
    pc_sched *s = self->s;
    PyObject *oc = PyBytes_FromStringAndSize(NULL, s->nops);
    PyObject *nok = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->nops * 4);
    PyObject *t = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->nops * 8);
    PyObject *ta = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->nops * 8);
    PyObject *tw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->nops * 8);
    if (!oc || !nok || !t || !ta || !tw) {
        Py_XDECREF(oc);
        Py_XDECREF(nok);
        Py_XDECREF(t);
        Py_XDECREF(ta);
        Py_XDECREF(tw);
        return NULL;
    }
    uint64_t round;
    pc_sched_last_outcomes(s, (uint8_t *)PyBytes_AS_STRING(oc),
                           (int *)PyBytes_AS_STRING(nok),
                           (double *)PyBytes_AS_STRING(t),
                           (double *)PyBytes_AS_STRING(ta),
                           (double *)PyBytes_AS_STRING(tw), &round);
    long long r = atomic_load(&s->done) ? (long long)round : -1;
    return Py_BuildValue("(LNNNNN)", r, oc, nok, t, ta, tw);
}

static PyObject *sched_get_done(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->done));
}

static PyObject *sched_get_posted(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->posted));
}

static PyObject *sched_get_stats(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    pc_sched *s = self->s;
#define U(x) (unsigned long long)atomic_load(&s->x)
    return Py_BuildValue("{sKsKsKsKsKsK}", "stale", U(stale), "surplus",
                         U(surplus), "dropped", U(dropped), "timedout",
                         U(timedout), "late", U(late), "swallowed",
                         U(swallowed));
#undef U
}

static PyObject *sched_get_device_stats(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    pc_devq *q = &self->s->dq;
    return Py_BuildValue("{sKsKsKsKsK}", "h2d", (unsigned long long)q->h2d,
                         "d2h", (unsigned long long)q->d2h,
                         "d2d", (unsigned long long)q->d2d,
                         "h2h", (unsigned long long)q->h2h,
                         "reductions", (unsigned long long)q->reductions);
}

static PyObject *sched_get_busy(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    int b;
    pc_sched *s = self->s;
    Py_BEGIN_ALLOW_THREADS
    b = pc_engine_busy(s);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(b);
}

static PyObject *sched_get_serial(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(self->s->serial);
}

static PyObject *sched_get_sends_left(SchedObject *self, void *c)
{
    (void)c;
    if (pc_check_open(self))
        return NULL;
    return PyLong_FromLong(atomic_load(&self->s->sends_left));
}

static PyObject *sched_get_freed(SchedObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->s == NULL);
}

PyGetSetDef pc_py_getset[] = {
    {"done", (getter)sched_get_done, NULL, "rounds completed", NULL},
    {"posted", (getter)sched_get_posted, NULL, "rounds posted", NULL},
    {"stats", (getter)sched_get_stats, NULL, "discarded inputs, outcomes",
     NULL},
    {"device_stats", (getter)sched_get_device_stats, NULL,
     "bytes copied by direction, device reductions queued", NULL},
    {"freed", (getter)sched_get_freed, NULL, "freed?", NULL},
    {"sends_left", (getter)sched_get_sends_left, NULL,
     "sends handed to the wire and not yet complete", NULL},
    {"serial", (getter)sched_get_serial, NULL,
     "process-local id (the timeline's `sched`)", NULL},
    {"busy", (getter)sched_get_busy, NULL,
     "a round is in flight or about to start (one progress sweep first)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};
