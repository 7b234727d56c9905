/* pc_module.h -- shared by the two files of the Python binding. */
#ifndef PC_MODULE_H
#define PC_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pc_sched.h"

typedef struct {
    PyObject_HEAD
    pc_sched *s;
    pc_sched *locked;          /* held by lock() until unlock() */
    int nslots;
    Py_buffer *views;
    char *has_view;
    PyObject *comm;            /* keeps the mpi4py communicator alive */
} SchedObject;

extern PyTypeObject pc_SchedType;
/* pc_pyattrs.c: read-only attributes and outcomes() of Sched */
extern PyGetSetDef pc_sched_getset[];
PyObject *pc_sched_outcomes(SchedObject *self, PyObject *unused);
int pc_check_open(SchedObject *self);
/* raise the exception class registered for code rc; returns NULL */
PyObject *pc_raise(int rc, const char *msg);
/* release the buffers of freed schedules whose sends have drained;
 * returns how many are still draining */
int pc_reap(void);

#endif
