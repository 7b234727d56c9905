/* module.h -- between the files of the Python binding, partialcoll._core:
 *
 *   module.c    the module: engine control, the emulated network, the
 *               timeline, the constants of the C core; registers Sched
 *   pycapi.c    the executor's C API for the package's other extensions
 *               (capi/pc_capi.h), a capsule of the module, over Sched
 *   pysched.c   Sched, the Python face of one schedule: building, binding
 *               buffers, posting, fires, gates, the data lock, free
 *   pysync.c    Sched's waits (wait, test, wait_gate, and run's)
 *   pyattrs.c   Sched's read-only attributes and outcomes()
 *   pypark.c    freeing a Sched, and the buffers of freed schedules whose
 *               sends still drain
 *   pyerrors.c  return codes to the exception classes of
 *               partialcoll/core/errors.py
 *
 * Calls go down that list (module.c uses pysched.c, pysched.c uses the
 * files below it), never back up.  The binding talks to the engine
 * (engine/pc_engine.h) and to the schedule (sched/pc_sched.h), never to a
 * transport. */
#ifndef PC_MODULE_H
#define PC_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine/pc_engine.h"
#include "sched/pc_sched.h"
#include "common/pc_common.h"

typedef struct {
    PyObject_HEAD
    pc_sched *s;
    pc_sched *locked;          /* held by lock() until unlock() */
    int nslots;
    Py_buffer *views;
    char *has_view;
    PyObject *comm;            /* keeps the mpi4py communicator alive */
} SchedObject;

/* pysched.c: the Sched type; fire, and the data lock taken and given
 * back with the GIL held (0, or -1 with an exception set) */
extern PyTypeObject pc_SchedType;
int pc_py_fire(SchedObject *self, int op, long long round, int wake);
int pc_py_lock_data(pc_sched *s);
void pc_py_unlock_data(pc_sched *s);

/* pysync.c: Sched methods, and the wait of run() */
PyObject *pc_py_wait(SchedObject *self, PyObject *args);
PyObject *pc_py_test(SchedObject *self, PyObject *args);
PyObject *pc_py_wait_gate(SchedObject *self, PyObject *args);
/* 0, or -1 with an exception set; *done (if not NULL): rounds completed */
int pc_py_wait_upto(SchedObject *self, unsigned long long upto,
                    double timeout, unsigned long long *done);

/* pyattrs.c: read-only attributes and outcomes() of Sched */
extern PyGetSetDef pc_py_getset[];
PyObject *pc_py_outcomes(SchedObject *self, PyObject *unused);

/* pypark.c */
void pc_py_free(SchedObject *self);        /* the schedule goes; GIL held */
void pc_py_release_views(Py_buffer *views, char *has_view, int n);
/* release the buffers of freed schedules whose sends have drained;
 * returns how many are still draining */
int pc_reap(void);

/* pycapi.c: add the capsule _C_API to the module; 0, or -1 */
int pc_py_add_capi(PyObject *module);

/* pyerrors.c */
/* raise the exception class registered for code rc; returns NULL */
PyObject *pc_raise(int rc, const char *msg);
/* the schedule's error (or rc's); returns NULL */
PyObject *pc_raise_sched_error(pc_sched *s, int rc);
/* -1 with an exception set when self's schedule was freed */
int pc_check_open(SchedObject *self);
/* set_exceptions({code: class}), a module function */
PyObject *pc_set_exceptions(PyObject *m, PyObject *mapping);

#endif
