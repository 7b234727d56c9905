/* pc_module.c -- partialcoll._core, the Python face of the executor.
 * Each method normalises its arguments, releases the GIL around anything that
 * can block, calls the C core and maps the return code through raise_rc(). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pc_sched.h"

static PyObject *exc_for_code[PC_NCODES];   /* set by partialcoll._errors */

static PyObject *raise_rc(int rc, const char *msg)
{
    PyObject *cls = (rc > 0 && rc < PC_NCODES && exc_for_code[rc]) ? exc_for_code[rc]
                                                           : PyExc_RuntimeError;
    PyErr_SetString(cls, msg && *msg ? msg : "partialcoll error");
    return NULL;
}

typedef struct {
    PyObject_HEAD
    pc_sched *s;
    int nslots;
    Py_buffer *views;
    char *has_view;
    PyObject *comm;            /* keeps the mpi4py communicator alive */
} SchedObject;

static int check_open(SchedObject *self)
{
    if (!self->s) {
        raise_rc(PC_EFREED, "the schedule has been freed");
        return -1;
    }
    return 0;
}

static void release_views(SchedObject *self)
{
    for (int i = 0; i < self->nslots; i++)
        if (self->has_view[i]) {
            PyBuffer_Release(&self->views[i]);
            self->has_view[i] = 0;
        }
}

static int sched_init(SchedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"desc", "deps", "nslots", "comm_addr",
                             "persistent", "comm", "stamp_id", NULL};
    Py_buffer desc, deps;
    int nslots, persistent;
    unsigned long long comm_addr;
    PyObject *comm;
    unsigned long long stamp_id = 0;
    char err[512] = "";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*y*iKpO|K", kwlist, &desc,
                                     &deps, &nslots, &comm_addr, &persistent,
                                     &comm, &stamp_id))
        return -1;
    int rc = PC_EINVAL;
    if (desc.len % (PC_DESC_LEN * 8) || deps.len % 8) {
        snprintf(err, sizeof err, "malformed op descriptors");
        goto out;
    }
    int flag = 0, level = 0;
    MPI_Initialized(&flag);
    if (!flag) {
        rc = PC_ETHREAD;
        snprintf(err, sizeof err, "MPI is not initialised");
        goto out;
    }
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        rc = PC_ETHREAD;
        snprintf(err, sizeof err,
                 "partialcoll needs MPI_THREAD_MULTIPLE, MPI was initialised "
                 "with level %d; set mpi4py.rc.thread_level = 'multiple' "
                 "before importing mpi4py.MPI", level);
        goto out;
    }
    MPI_Comm c = *(MPI_Comm *)(uintptr_t)comm_addr;
    rc = pc_sched_create((const int64_t *)desc.buf,
                         (int)(desc.len / (PC_DESC_LEN * 8)),
                         (const int64_t *)deps.buf, deps.len / 8, nslots, c,
                         persistent, stamp_id, &self->s, err, sizeof err);
    if (rc == PC_OK) {
        self->nslots = nslots;
        self->views = PyMem_Calloc((size_t)nslots + 1, sizeof(Py_buffer));
        self->has_view = PyMem_Calloc((size_t)nslots + 1, 1);
        Py_INCREF(comm);
        self->comm = comm;
    }
out:
    PyBuffer_Release(&desc);
    PyBuffer_Release(&deps);
    if (rc != PC_OK) {
        raise_rc(rc, err);
        return -1;
    }
    return 0;
}

static void do_free(SchedObject *self)
{
    if (self->s) {
        pc_sched *s = self->s;
        self->s = NULL;
        Py_BEGIN_ALLOW_THREADS
        pc_engine_free(s);
        Py_END_ALLOW_THREADS
    }
    if (self->has_view)
        release_views(self);
}

static void sched_dealloc(SchedObject *self)
{
    do_free(self);
    PyMem_Free(self->views);
    PyMem_Free(self->has_view);
    Py_XDECREF(self->comm);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Export obj's buffer into a slot (the slot must be idle). */
static int bind_slot(SchedObject *self, int slot, PyObject *obj, int writable)
{
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &view, flags) < 0) {
        PyErr_Clear();
        raise_rc(PC_EINVAL, writable
                 ? "buffer must be a writable, C-contiguous buffer"
                 : "buffer must be a C-contiguous buffer");
        return -1;
    }
    if (self->has_view[slot])
        PyBuffer_Release(&self->views[slot]);
    self->views[slot] = view;
    self->has_view[slot] = 1;
    pc_sched_bind(self->s, slot, view.buf, view.len, writable, PC_HOST);
    return 0;
}

/* bind(slot, obj, writable): export obj's buffer into a slot. */
static PyObject *sched_bind(SchedObject *self, PyObject *args)
{
    int slot, writable;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "iOp", &slot, &obj, &writable) ||
        check_open(self))
        return NULL;
    if (slot < 0 || slot >= self->nslots)
        return raise_rc(PC_EINVAL, "buffer slot out of range");
    if (!pc_sched_idle(self->s))
        return raise_rc(PC_EBUSY, "cannot rebind buffers while a round runs");
    if (bind_slot(self, slot, obj, writable) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* bind_ptr(slot, address, nbytes, writable, space): bind raw memory (device
 * memory, or pinned host memory); the caller keeps its owner alive. */
static PyObject *sched_bind_ptr(SchedObject *self, PyObject *args)
{
    int slot, writable, space;
    unsigned long long ptr;
    long long nbytes;
    if (!PyArg_ParseTuple(args, "iKLpi", &slot, &ptr, &nbytes, &writable,
                          &space) || check_open(self))
        return NULL;
    if (slot < 0 || slot >= self->nslots)
        return raise_rc(PC_EINVAL, "buffer slot out of range");
    if (nbytes < 0 || (space != PC_HOST && space != PC_DEVICE))
        return raise_rc(PC_EINVAL, "bad size or memory space");
    if (!pc_sched_idle(self->s))
        return raise_rc(PC_EBUSY, "cannot rebind buffers while a round runs");
    if (self->has_view[slot]) {
        PyBuffer_Release(&self->views[slot]);
        self->has_view[slot] = 0;
    }
    pc_sched_bind(self->s, slot, (void *)(uintptr_t)ptr, nbytes, writable,
                  space);
    Py_RETURN_NONE;
}

/* unbind(slot): forget a slot's buffer and release its exported view, so
 * the schedule keeps no caller's object alive between rounds.  Refused
 * (PC_EBUSY) while a round runs. */
static PyObject *sched_unbind(SchedObject *self, PyObject *args)
{
    int slot;
    if (!PyArg_ParseTuple(args, "i", &slot) || check_open(self))
        return NULL;
    int rc = pc_sched_unbind(self->s, slot);
    if (rc == PC_EBUSY)
        return raise_rc(rc, "cannot unbind buffers while a round runs");
    if (rc != PC_OK)
        return raise_rc(rc, "buffer slot out of range");
    if (self->has_view[slot]) {
        PyBuffer_Release(&self->views[slot]);
        self->has_view[slot] = 0;
    }
    Py_RETURN_NONE;
}

/* set_device(backend, ctx, stream, kernels): the schedule's device queue;
 * kernels are int64 CUfunction handles indexed [dtype * NREDOPS + redop]. */
static PyObject *sched_set_device(SchedObject *self, PyObject *args)
{
    int backend;
    unsigned long long ctx, stream;
    Py_buffer kernels;
    char err[256] = "";
    if (!PyArg_ParseTuple(args, "iKKy*", &backend, &ctx, &stream, &kernels))
        return NULL;
    if (check_open(self)) {
        PyBuffer_Release(&kernels);
        return NULL;
    }
    int rc = pc_sched_set_device(self->s, backend, (void *)(uintptr_t)ctx,
                                 (void *)(uintptr_t)stream,
                                 (const int64_t *)kernels.buf,
                                 (int)(kernels.len / 8), err, sizeof err);
    PyBuffer_Release(&kernels);
    if (rc != PC_OK)
        return raise_rc(rc, err);
    Py_RETURN_NONE;
}

static PyObject *do_post(SchedObject *self, int wake)
{
    char err[512] = "";
    int rc = pc_sched_check_buffers(self->s, err, sizeof err);
    if (rc != PC_OK)
        return raise_rc(rc, err);
    rc = pc_engine_post(self->s, wake);
    if (rc == PC_EBUSY)
        return raise_rc(rc, "a persistent schedule is posted once; it re-arms "
                            "itself after every round");
    if (rc != PC_OK)
        return raise_rc(rc, "cannot post (interpreter shutting down?)");
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->posted));
}

static PyObject *sched_post(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self))
        return NULL;
    return do_post(self, 1);
}

static PyObject *sched_set_tag_base(SchedObject *self, PyObject *args)
{
    int base;
    if (!PyArg_ParseTuple(args, "i", &base) || check_open(self))
        return NULL;
    int rc = pc_sched_set_tag_base(self->s, base);
    if (rc != PC_OK)
        return raise_rc(rc, rc == PC_EBUSY ? "cannot change tags while a round "
                        "runs" : "tag base + largest tag exceeds MPI_TAG_UB");
    Py_RETURN_NONE;
}

static PyObject *sched_fire(SchedObject *self, PyObject *args)
{
    int op;
    long long round = -1;
    if (!PyArg_ParseTuple(args, "i|L", &op, &round) || check_open(self))
        return NULL;
    int rc = pc_engine_fire(self->s, op, round);
    if (rc != PC_OK)
        return raise_rc(rc, "fire() needs the index of a trigger op");
    Py_RETURN_NONE;
}

static PyObject *check_error(SchedObject *self)
{
    int e = atomic_load(&self->s->error);
    if (e != PC_OK)
        return raise_rc(e, self->s->errmsg);
    return NULL;
}

static int wait_upto(SchedObject *self, unsigned long long upto, double timeout)
{
    int rc;
    if (!self->s->persistent && upto > atomic_load(&self->s->posted)) {
        raise_rc(PC_EINVAL, "waiting for a round that was never posted");
        return -1;
    }
    /* Wait in slices so that signals (Ctrl-C) are handled while blocked. */
    pc_sched *s = self->s;
    double left = timeout;
    for (;;) {
        double slice = (left >= 0 && left < 0.1) ? left : 0.1;
        Py_BEGIN_ALLOW_THREADS
        rc = pc_engine_wait(s, upto, slice);
        Py_END_ALLOW_THREADS
        if (rc != PC_ETIMEOUT || (left >= 0 && (left -= slice) <= 0))
            break;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
    if (rc == PC_ETIMEOUT) {
        char msg[128];
        snprintf(msg, sizeof msg, "round %llu did not complete within %.3f s",
                 upto - 1, timeout);
        raise_rc(PC_ETIMEOUT, msg);
        return -1;
    }
    if (rc != PC_OK) {
        check_error(self);
        return -1;
    }
    return 0;
}

/* wait(upto, timeout=-1): block until `upto` rounds have completed. */
static PyObject *sched_wait(SchedObject *self, PyObject *args)
{
    unsigned long long upto;
    double timeout = -1.0;
    if (!PyArg_ParseTuple(args, "K|d", &upto, &timeout) || check_open(self))
        return NULL;
    if (wait_upto(self, upto, timeout) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->done));
}

static PyObject *sched_test(SchedObject *self, PyObject *args)
{
    unsigned long long upto;
    if (!PyArg_ParseTuple(args, "K", &upto) || check_open(self))
        return NULL;
    if (atomic_load(&self->s->error) != PC_OK)
        return check_error(self);
    if (atomic_load_explicit(&self->s->done, memory_order_acquire) >= upto)
        Py_RETURN_TRUE;
    /* nudge the engine so test() loops make progress even without a thread */
    pc_engine_wake();
    Py_RETURN_FALSE;
}

/* run(send, recv, tag_base, timeout=-1): the blocking fast path of one-shot
 * collectives: bind slots 0 and 1, set the tag block, post one round without
 * waking the progress thread and drive it to completion on this thread. */
static PyObject *sched_run(SchedObject *self, PyObject *args)
{
    PyObject *send, *recv;
    int tag_base;
    double timeout = -1.0;
    if (!PyArg_ParseTuple(args, "OOi|d", &send, &recv, &tag_base, &timeout) ||
        check_open(self))
        return NULL;
    if (!pc_sched_idle(self->s))
        return raise_rc(PC_EBUSY, "the schedule is running");
    if (bind_slot(self, 0, send, 0) < 0 || bind_slot(self, 1, recv, 1) < 0)
        return NULL;
    int rc = pc_sched_set_tag_base(self->s, tag_base);
    if (rc != PC_OK)
        return raise_rc(rc, "tag base + largest tag exceeds MPI_TAG_UB");
    PyObject *posted = do_post(self, 0);
    if (!posted)
        return NULL;
    unsigned long long upto = PyLong_AsUnsignedLongLong(posted);
    Py_DECREF(posted);
    if (wait_upto(self, upto, timeout) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* lock()/unlock(): the data lock that LOCKED ops hold while they run. */
static PyObject *sched_lock(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self))
        return NULL;
    pc_sched *s = self->s;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->data_mtx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *sched_unlock(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self))
        return NULL;
    pthread_mutex_unlock(&self->s->data_mtx);
    Py_RETURN_NONE;
}

static PyObject *sched_free(SchedObject *self, PyObject *unused)
{
    (void)unused;
    do_free(self);
    Py_RETURN_NONE;
}

static PyObject *sched_get_done(SchedObject *self, void *c)
{
    (void)c;
    if (check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->done));
}

static PyObject *sched_get_posted(SchedObject *self, void *c)
{
    (void)c;
    if (check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->posted));
}

static PyObject *sched_get_stats(SchedObject *self, void *c)
{
    (void)c;
    if (check_open(self))
        return NULL;
    return Py_BuildValue("{sKsKsK}", "stale",
                         (unsigned long long)atomic_load(&self->s->stale),
                         "surplus",
                         (unsigned long long)atomic_load(&self->s->surplus),
                         "foreign",
                         (unsigned long long)atomic_load(&self->s->foreign));
}

static PyObject *sched_get_device_stats(SchedObject *self, void *c)
{
    (void)c;
    if (check_open(self))
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
    if (check_open(self))
        return NULL;
    int b;
    pc_sched *s = self->s;
    Py_BEGIN_ALLOW_THREADS
    b = pc_engine_busy(s);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(b);
}

static PyObject *sched_get_freed(SchedObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->s == NULL);
}

static PyMethodDef sched_methods[] = {
    {"bind", (PyCFunction)sched_bind, METH_VARARGS, "bind(slot, obj, writable)"},
    {"post", (PyCFunction)sched_post, METH_NOARGS, "post() -> round count"},
    {"bind_ptr", (PyCFunction)sched_bind_ptr, METH_VARARGS,
     "bind_ptr(slot, address, nbytes, writable, space)"},
    {"unbind", (PyCFunction)sched_unbind, METH_VARARGS,
     "unbind(slot): forget the slot's buffer (between rounds)"},
    {"set_device", (PyCFunction)sched_set_device, METH_VARARGS,
     "set_device(backend, ctx, stream, kernels)"},
    {"set_tag_base", (PyCFunction)sched_set_tag_base, METH_VARARGS,
     "set_tag_base(base)"},
    {"fire", (PyCFunction)sched_fire, METH_VARARGS, "fire(op, round=-1)"},
    {"wait", (PyCFunction)sched_wait, METH_VARARGS, "wait(upto, timeout=-1)"},
    {"test", (PyCFunction)sched_test, METH_VARARGS, "test(upto) -> bool"},
    {"run", (PyCFunction)sched_run, METH_VARARGS, "run(send, recv, timeout)"},
    {"free", (PyCFunction)sched_free, METH_NOARGS, "free()"},
    {"lock", (PyCFunction)sched_lock, METH_NOARGS, "take the data lock"},
    {"unlock", (PyCFunction)sched_unlock, METH_NOARGS, "release it"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef sched_getset[] = {
    {"done", (getter)sched_get_done, NULL, "rounds completed", NULL},
    {"posted", (getter)sched_get_posted, NULL, "rounds posted", NULL},
    {"stats", (getter)sched_get_stats, NULL, "discarded inputs", NULL},
    {"device_stats", (getter)sched_get_device_stats, NULL,
     "bytes copied by direction, device reductions queued", NULL},
    {"freed", (getter)sched_get_freed, NULL, "freed?", NULL},
    {"busy", (getter)sched_get_busy, NULL,
     "a round is in flight or about to start (one progress sweep first)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject SchedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "partialcoll._core.Sched",
    .tp_basicsize = sizeof(SchedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level executor schedule; use partialcoll.Schedule.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sched_init,
    .tp_dealloc = (destructor)sched_dealloc,
    .tp_methods = sched_methods,
    .tp_getset = sched_getset,
};

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

static PyObject *mod_shutdown(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    pc_engine_shutdown();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *mod_thread_cputime(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyFloat_FromDouble(pc_engine_thread_cputime());
}

static PyObject *mod_cuda_context(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    void *ctx = NULL;
    char err[256] = "";
    if (pc_cuda_current_context(&ctx, err, sizeof err) < 0)
        return raise_rc(PC_EDEVICE, err);
    return PyLong_FromUnsignedLongLong((uintptr_t)ctx);
}

static PyObject *mod_mpi_cuda_aware(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromLong(pc_mpi_cuda_aware());
}

static PyObject *mod_constants(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    PyObject *d = PyDict_New(), *dt = PyDict_New(), *ops = PyDict_New();
    if (!d || !dt || !ops)
        return NULL;
#define SETI(dict, k, v) PyDict_SetItemString(dict, k, PyLong_FromLong(v))
    SETI(d, "NOP", PC_NOP); SETI(d, "TRIGGER", PC_TRIGGER);
    SETI(d, "SEND", PC_SEND); SETI(d, "RECV", PC_RECV);
    SETI(d, "REDUCE", PC_REDUCE); SETI(d, "COPY", PC_COPY);
    SETI(d, "CALLBACK", PC_CALLBACK); SETI(d, "FENCE", PC_FENCE);
    SETI(d, "HOST", PC_HOST); SETI(d, "DEVICE", PC_DEVICE);
    SETI(d, "DEV_EMULATE", PC_DEV_EMULATE); SETI(d, "DEV_CUDA", PC_DEV_CUDA);
    SETI(d, "EDEVICE", PC_EDEVICE); SETI(d, "NREDOPS", PC_NREDOPS);
    SETI(d, "NDTYPES", PC_NDTYPES);
    SETI(d, "ALL", PC_ALL); SETI(d, "ANY", PC_ANY);
    SETI(d, "ATLEAST", PC_ATLEAST); SETI(d, "F_LOCKED", PC_F_LOCKED);
    SETI(d, "F_OPTIONAL", PC_F_OPTIONAL); SETI(d, "F_STAMPED", PC_F_STAMPED);
    SETI(d, "DESC_LEN", PC_DESC_LEN);
    SETI(d, "EINVAL", PC_EINVAL); SETI(d, "EBUSY", PC_EBUSY);
    SETI(d, "EMPI", PC_EMPI); SETI(d, "ETIMEOUT", PC_ETIMEOUT);
    SETI(d, "ENOMEM", PC_ENOMEM); SETI(d, "EFREED", PC_EFREED);
    SETI(d, "ETHREAD", PC_ETHREAD);
    for (int i = 0; i < PC_NDTYPES; i++) {
        PyObject *t = Py_BuildValue("(iiC)", i, pc_dtypes[i].size,
                                    pc_dtypes[i].kind);
        PyDict_SetItemString(dt, pc_dtypes[i].name, t);
        Py_DECREF(t);
    }
    for (int i = 0; i < PC_NREDOPS; i++) {
        PyObject *valid = PyList_New(0);
        for (int t = 0; t < PC_NDTYPES; t++)
            if (pc_redop_valid(i, t)) {
                PyObject *n = PyUnicode_FromString(pc_dtypes[t].name);
                PyList_Append(valid, n);
                Py_DECREF(n);
            }
        PyObject *t = Py_BuildValue("(iN)", i, valid);
        PyDict_SetItemString(ops, pc_redop_names[i], t);
        Py_DECREF(t);
    }
#undef SETI
    PyDict_SetItemString(d, "dtypes", dt);
    PyDict_SetItemString(d, "redops", ops);
    Py_DECREF(dt);
    Py_DECREF(ops);
    return d;
}

static PyMethodDef mod_methods[] = {
    {"set_exceptions", mod_set_exceptions, METH_O, "map codes to classes"},
    {"shutdown", mod_shutdown, METH_NOARGS, "stop the progress thread"},
    {"thread_cputime", mod_thread_cputime, METH_NOARGS,
     "CPU seconds used by the progress thread"},
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
    if (!m || PyType_Ready(&SchedType) < 0)
        return NULL;
    Py_INCREF(&SchedType);
    PyModule_AddObject(m, "Sched", (PyObject *)&SchedType);
    return m;
}
