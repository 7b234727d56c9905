/* pyerrors.c -- the binding's errors: each C return code raises the
 * exception class partialcoll/core/errors.py registered for it
 * (set_exceptions), so Python sees misuse, transport errors and timeouts
 * as different classes. */
#include "python/module.h"

static PyObject *exc_for_code[PC_NCODES];   /* set by partialcoll.core.errors */

PyObject *pc_set_exceptions(PyObject *m, PyObject *mapping)
{
    (void)m;
    for (int i = 1; i < PC_NCODES; i++) {
        PyObject *k = PyLong_FromLong(i);
        if (!k)
            return NULL;
        PyObject *v = PyDict_GetItemWithError(mapping, k);
        Py_DECREF(k);
        if (v) {
            Py_INCREF(v);
            Py_XSETREF(exc_for_code[i], v);
        } else if (PyErr_Occurred()) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

PyObject *pc_raise(int rc, const char *msg)
{
    PyObject *cls = (rc > 0 && rc < PC_NCODES && exc_for_code[rc])
                        ? exc_for_code[rc] : PyExc_RuntimeError;
    PyErr_SetString(cls, msg && *msg ? msg : "partialcoll error");
    return NULL;
}

PyObject *pc_raise_sched_error(pc_sched *s, int rc)
{
    if (rc == PC_EFREED)
        return pc_raise(rc, "the schedule was freed while this thread was "
                            "waiting for it");
    int e = atomic_load(&s->error);
    if (e == PC_EFAILED && exc_for_code[e]) {
        /* RankFailedError(message, ranks) */
        int n = s->nfailed, max = (int)(sizeof s->failed /
                                        sizeof s->failed[0]);
        PyObject *ranks = PyTuple_New(n < max ? n : max);
        if (!ranks)
            return NULL;
        for (int k = 0; k < n && k < max; k++) {
            PyObject *r = PyLong_FromLong(s->failed[k]);
            if (!r) {
                Py_DECREF(ranks);
                return NULL;
            }
            PyTuple_SET_ITEM(ranks, k, r);
        }
        PyObject *exc = PyObject_CallFunction(exc_for_code[e], "sO",
                                              s->errmsg, ranks);
        Py_DECREF(ranks);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return pc_raise(e != PC_OK ? e : rc, e != PC_OK ? s->errmsg
                                                    : "partialcoll error");
}

int pc_check_open(SchedObject *self)
{
    if (!self->s) {
        pc_raise(PC_EFREED, "the schedule has been freed");
        return -1;
    }
    return 0;
}
