/* pc_module.h -- shared by the two files of the Python binding. */
#ifndef PC_MODULE_H
#define PC_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pc_sched.h"

extern PyTypeObject pc_SchedType;
/* raise the exception class registered for code rc; returns NULL */
PyObject *pc_raise(int rc, const char *msg);
/* release the buffers of freed schedules whose sends have drained;
 * returns how many are still draining */
int pc_reap(void);

#endif
