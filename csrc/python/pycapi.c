/* pycapi.c -- the executor's C API for the package's other extensions
 * (capi/pc_capi.h), over the Sched objects of this binding. */
#include "python/module.h"
#include "capi/pc_capi.h"
#include "sched/types.h"

static int capi_check(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &pc_SchedType)) {
        PyErr_SetString(PyExc_TypeError, "not a partialcoll._core.Sched");
        return -1;
    }
    return pc_check_open((SchedObject *)obj);
}

static int capi_lock(PyObject *obj)
{
    if (capi_check(obj) < 0)
        return -1;
    return pc_py_lock_data(((SchedObject *)obj)->s);
}

static void capi_unlock(PyObject *obj)
{
    pc_py_unlock_data(((SchedObject *)obj)->s);
}

static int capi_reduce(const void *src, void *dst, int64_t count, int dtype,
                       int redop)
{
    if (!pc_redop_valid(redop, dtype) || count < 0 || count > INT32_MAX) {
        pc_raise(PC_EINVAL, "reduce: no such reduction of this dtype, or "
                 "a count out of range");
        return -1;
    }
    if (pc_reduce_local(src, dst, count, dtype, redop) != MPI_SUCCESS) {
        pc_raise(PC_EMPI, "reduce: MPI_Reduce_local failed");
        return -1;
    }
    return 0;
}

static int capi_fire(PyObject *obj, int op, int64_t round, int wake)
{
    if (capi_check(obj) < 0)
        return -1;
    return pc_py_fire((SchedObject *)obj, op, round, wake);
}

static int capi_wait(PyObject *obj, uint64_t upto, double timeout)
{
    if (capi_check(obj) < 0)
        return -1;
    return pc_py_wait_upto((SchedObject *)obj, upto, timeout, NULL);
}

static int capi_register_callback(const char *name, pc_callback_fn fn)
{
    int id = pc_sched_register_callback(name, fn);
    if (id < 0)
        pc_raise(PC_EINVAL, "cannot register a callback under this name (the "
                 "name is another function's, too long, or the table of "
                 "callbacks is full)");
    return id;
}

_Static_assert(PC_CAPI_DECLINE == PC_CALLBACK_DECLINE,
               "the C API's decline is the executor's");

static pc_capi api = {PC_CAPI_VERSION, capi_check, capi_lock, capi_unlock,
                      capi_reduce, capi_fire, capi_wait, pc_fill,
                      capi_register_callback};

int pc_py_add_capi(PyObject *module)
{
    PyObject *cap = PyCapsule_New(&api, PC_CAPI_NAME, NULL);
    if (!cap || PyModule_AddObject(module, "_C_API", cap) < 0) {
        Py_XDECREF(cap);
        return -1;
    }
    return 0;
}
