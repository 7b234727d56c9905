/* pysync.c -- Sched's waits: the GIL is released around the engine's
 * wait, in slices of 0.1 s so that signals (Ctrl-C) are handled while a
 * thread is blocked; a reference on the schedule is held throughout, so
 * another thread may free it meanwhile (the wait then raises). */
#include "python/module.h"

#include <math.h>

int pc_py_wait_upto(SchedObject *self, unsigned long long upto,
                    double timeout, unsigned long long *done)
{
    pc_sched *s = self->s;
    int rc;
    if (!s->persistent && upto > atomic_load(&s->posted)) {
        pc_raise(PC_EINVAL, "waiting for a round that was never posted");
        return -1;
    }
    if (pc_sched_lock_mine(s) && pc_sched_has_locked_ops(s) &&
        atomic_load(&s->done) < upto) {
        pc_raise(PC_EINVAL, "this thread holds the schedule's data lock, "
                 "which its locked ops need: release it before waiting");
        return -1;
    }
    pc_sched_ref(s);
    /* Wait in slices so that signals (Ctrl-C) are handled while blocked;
     * the deadline is on the clock, not a count of slices (a slice may
     * overrun its 0.1 s). */
    double deadline = timeout >= 0 ? pc_now() + timeout : HUGE_VAL;
    for (;;) {
        double left = deadline - pc_now();
        double slice = left < 0.1 ? (left > 0 ? left : 0) : 0.1;
        Py_BEGIN_ALLOW_THREADS
        rc = pc_engine_wait(s, upto, slice);
        Py_END_ALLOW_THREADS
        if (rc != PC_ETIMEOUT || pc_now() >= deadline)
            break;
        if (PyErr_CheckSignals() < 0) {
            pc_sched_unref(s);
            return -1;
        }
    }
    if (rc == PC_ETIMEOUT) {
        char msg[128];
        snprintf(msg, sizeof msg, "round %llu did not complete within %.3f s",
                 upto - 1, timeout);
        pc_raise(PC_ETIMEOUT, msg);
    } else if (rc != PC_OK) {
        pc_raise_sched_error(s, rc);
    }
    if (done)
        *done = atomic_load(&s->done);
    pc_sched_unref(s);
    return rc == PC_OK ? 0 : -1;
}

/* wait(upto, timeout=-1): block until `upto` rounds have completed. */
PyObject *pc_py_wait(SchedObject *self, PyObject *args)
{
    unsigned long long upto, done = 0;
    double timeout = -1.0;
    if (!PyArg_ParseTuple(args, "K|d", &upto, &timeout) || pc_check_open(self))
        return NULL;
    if (pc_py_wait_upto(self, upto, timeout, &done) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(done);
}

PyObject *pc_py_test(SchedObject *self, PyObject *args)
{
    unsigned long long upto;
    if (!PyArg_ParseTuple(args, "K", &upto) || pc_check_open(self))
        return NULL;
    if (atomic_load(&self->s->error) != PC_OK)
        return pc_raise_sched_error(self->s, PC_OK);
    if (atomic_load_explicit(&self->s->done, memory_order_acquire) >= upto)
        Py_RETURN_TRUE;
    /* nudge the engine so test() loops make progress even without a thread */
    pc_engine_wake();
    Py_RETURN_FALSE;
}

/* wait_gate(timeout=-1) -> (op, round): the next gate op made ready. */
PyObject *pc_py_wait_gate(SchedObject *self, PyObject *args)
{
    double timeout = -1.0;
    int op = -1, rc;
    uint64_t round = 0;
    if (!PyArg_ParseTuple(args, "|d", &timeout) || pc_check_open(self))
        return NULL;
    pc_sched *s = self->s;
    pc_sched_ref(s);
    double left = timeout;
    for (;;) {
        double slice = (left >= 0 && left < 0.1) ? left : 0.1;
        Py_BEGIN_ALLOW_THREADS
        rc = pc_engine_wait_gate(s, slice, &op, &round);
        Py_END_ALLOW_THREADS
        if (rc != PC_ETIMEOUT || (left >= 0 && (left -= slice) <= 0))
            break;
        if (PyErr_CheckSignals() < 0) {
            pc_sched_unref(s);
            return NULL;
        }
    }
    PyObject *res = NULL;
    if (rc == PC_OK)
        res = Py_BuildValue("(iK)", op, (unsigned long long)round);
    else if (rc == PC_ETIMEOUT)
        pc_raise(rc, "no gate became ready in time");
    else
        pc_raise_sched_error(s, rc);
    pc_sched_unref(s);
    return res;
}

