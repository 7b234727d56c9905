/* pysched.c -- partialcoll._core.Sched, the Python face of one schedule.
 * Each method normalises its arguments, takes a reference on the C schedule
 * before releasing the GIL around anything that can block, calls the core
 * and maps the return code through pc_raise().  Its waits are in pysync.c,
 * its attributes in pyattrs.c, freeing it in pypark.c. */
#include "python/module.h"

static int sched_init(SchedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"desc", "deps", "nslots", "comm_addr",
                             "persistent", "comm", "stamp_id", NULL};
    Py_buffer desc, deps;
    int nslots, persistent;
    unsigned long long comm_addr, stamp_id = 0;
    PyObject *comm;
    char err[512] = "";
    if (self->s) {
        pc_raise(PC_EINVAL, "Sched objects cannot be re-initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*y*iKpO|K", kwlist, &desc,
                                     &deps, &nslots, &comm_addr, &persistent,
                                     &comm, &stamp_id))
        return -1;
    int rc = PC_EINVAL, flag = 0, level = 0;
    if (desc.len % (PC_DESC_LEN * 8) || deps.len % 8) {
        snprintf(err, sizeof err, "malformed op descriptors");
        goto out;
    }
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
    pc_reap();
    MPI_Comm c = *(MPI_Comm *)(uintptr_t)comm_addr;
    rc = pc_sched_create((const int64_t *)desc.buf,
                         (int)(desc.len / (PC_DESC_LEN * 8)),
                         (const int64_t *)deps.buf, deps.len / 8, nslots, c,
                         persistent, stamp_id, &self->s, err, sizeof err);
    if (rc == PC_OK) {
        self->nslots = nslots;
        self->views = PyMem_Calloc((size_t)nslots + 1, sizeof(Py_buffer));
        self->has_view = PyMem_Calloc((size_t)nslots + 1, 1);
        if (!self->views || !self->has_view) {
            rc = PC_ENOMEM;
            snprintf(err, sizeof err, "out of memory");
        }
        Py_INCREF(comm);
        self->comm = comm;
    }
out:
    PyBuffer_Release(&desc);
    PyBuffer_Release(&deps);
    if (rc != PC_OK) {
        pc_raise(rc, err);
        return -1;
    }
    return 0;
}

static void sched_dealloc(SchedObject *self)
{
    if (self->locked) {
        pc_sched_unlock(self->locked);
        pc_sched_unref(self->locked);
        self->locked = NULL;
    }
    pc_py_free(self);
    if (self->has_view)
        pc_py_release_views(self->views, self->has_view, self->nslots);
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
        pc_raise(PC_EINVAL, writable
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

static int slot_arg(SchedObject *self, int slot)
{
    if (slot < 0 || slot >= self->nslots) {
        pc_raise(PC_EINVAL, "buffer slot out of range");
        return -1;
    }
    if (!pc_sched_idle(self->s)) {
        pc_raise(PC_EBUSY, "cannot rebind buffers while a round runs");
        return -1;
    }
    return 0;
}

/* bind(slot, obj, writable): export obj's buffer into a slot. */
static PyObject *sched_bind(SchedObject *self, PyObject *args)
{
    int slot, writable;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "iOp", &slot, &obj, &writable) ||
        pc_check_open(self) || slot_arg(self, slot) ||
        bind_slot(self, slot, obj, writable) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* unbind(slot): forget the slot's buffer (the caller's array is released). */
static PyObject *sched_unbind(SchedObject *self, PyObject *args)
{
    int slot;
    if (!PyArg_ParseTuple(args, "i", &slot) || pc_check_open(self) ||
        slot_arg(self, slot))
        return NULL;
    if (self->has_view[slot]) {
        PyBuffer_Release(&self->views[slot]);
        self->has_view[slot] = 0;
    }
    pc_sched_unbind(self->s, slot);
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
                          &space) || pc_check_open(self) || slot_arg(self, slot))
        return NULL;
    if (nbytes < 0 || (space != PC_HOST && space != PC_DEVICE))
        return pc_raise(PC_EINVAL, "bad size or memory space");
    if (self->has_view[slot]) {
        PyBuffer_Release(&self->views[slot]);
        self->has_view[slot] = 0;
    }
    pc_sched_bind(self->s, slot, (void *)(uintptr_t)ptr, nbytes, writable,
                  space);
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
    if (pc_check_open(self)) {
        PyBuffer_Release(&kernels);
        return NULL;
    }
    int rc = pc_sched_set_device(self->s, backend, (void *)(uintptr_t)ctx,
                                 (void *)(uintptr_t)stream,
                                 (const int64_t *)kernels.buf,
                                 (int)(kernels.len / 8), err, sizeof err);
    PyBuffer_Release(&kernels);
    if (rc != PC_OK)
        return pc_raise(rc, err);
    Py_RETURN_NONE;
}

static PyObject *do_post(SchedObject *self, int wake)
{
    char err[512] = "";
    int rc = pc_sched_check_buffers(self->s, err, sizeof err);
    if (rc != PC_OK)
        return pc_raise(rc, err);
    rc = pc_engine_post(self->s, wake);
    if (rc == PC_EBUSY)
        return pc_raise(rc, "a persistent schedule is posted once; it re-arms "
                            "itself after every round");
    if (rc != PC_OK)
        return pc_raise(rc, "cannot post (interpreter shutting down?)");
    return PyLong_FromUnsignedLongLong(atomic_load(&self->s->posted));
}

/* A reliable schedule cannot run on a network that may lose its messages:
 * refused before anything is sent (the network's description is the same
 * on every rank, so every rank refuses). */
static int check_lossless(SchedObject *self)
{
    pc_sched *s = self->s;
    if (!s->reliable || !(pc_engine_lossy_classes() & s->classes))
        return 0;
    pc_raise(PC_EINVAL, "this schedule needs every message (it is "
             "reliable), and the emulated network in use may drop its "
             "traffic class (a drop probability, or a low priority level's "
             "finite buffer): give lossy traffic a traffic class of its own");
    return -1;
}

static PyObject *sched_post(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (pc_check_open(self) || check_lossless(self))
        return NULL;
    return do_post(self, 1);
}

static PyObject *sched_set_tag_base(SchedObject *self, PyObject *args)
{
    int base;
    if (!PyArg_ParseTuple(args, "i", &base) || pc_check_open(self))
        return NULL;
    int rc = pc_sched_set_tag_base(self->s, base);
    if (rc != PC_OK)
        return pc_raise(rc, rc == PC_EBUSY ? "cannot change tags while a "
                        "round runs" : "tag base + largest tag reaches "
                        "MPI_TAG_UB (reserved for control messages)");
    Py_RETURN_NONE;
}

/* set_reliable(flag): a message the transport loses (an emulated network's
 * drop, told or silent) fails the round with a transport error instead of
 * ending its receive "dropped": for schedules that need every message. */
static PyObject *sched_set_reliable(SchedObject *self, PyObject *args)
{
    int flag;
    if (!PyArg_ParseTuple(args, "p", &flag) || pc_check_open(self))
        return NULL;
    self->s->reliable = flag;
    self->s->classes = 0;
    for (int i = 0; i < self->s->nops; i++)
        if (self->s->ops[i].kind == PC_RECV && self->s->ops[i].tclass >= 0 &&
            self->s->ops[i].tclass < 32)
            self->s->classes |= 1u << self->s->ops[i].tclass;
    Py_RETURN_NONE;
}

int pc_py_fire(SchedObject *self, int op, long long round, int wake)
{
    if (pc_check_open(self))
        return -1;
    int rc = pc_engine_fire(self->s, op, round, wake);
    if (rc != PC_OK) {
        pc_raise(rc, rc == PC_EINVAL ? "fire() needs the index of a trigger "
                 "op" : "out of memory");
        return -1;
    }
    return 0;
}

static PyObject *sched_fire(SchedObject *self, PyObject *args)
{
    int op, wake = 1;
    long long round = -1;
    if (!PyArg_ParseTuple(args, "i|Lp", &op, &round, &wake) ||
        pc_py_fire(self, op, round, wake) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* run(send, recv, tag_base, timeout=-1): the blocking fast path of one-shot
 * collectives: bind slots 0 and 1, set the tag block, post one round without
 * waking the progress thread, drive it to completion on this thread, and
 * release the caller's buffers. */
static PyObject *sched_run(SchedObject *self, PyObject *args)
{
    PyObject *send, *recv;
    int tag_base;
    double timeout = -1.0;
    if (!PyArg_ParseTuple(args, "OOi|d", &send, &recv, &tag_base, &timeout) ||
        pc_check_open(self))
        return NULL;
    if (!pc_sched_idle(self->s))
        return pc_raise(PC_EBUSY, "the schedule is running");
    if (check_lossless(self))
        return NULL;
    if (bind_slot(self, 0, send, 0) < 0 || bind_slot(self, 1, recv, 1) < 0)
        return NULL;
    int rc = pc_sched_set_tag_base(self->s, tag_base);
    if (rc != PC_OK)
        return pc_raise(rc, "tag base + largest tag reaches MPI_TAG_UB");
    PyObject *posted = do_post(self, 0);
    if (!posted)
        return NULL;
    unsigned long long upto = PyLong_AsUnsignedLongLong(posted);
    Py_DECREF(posted);
    rc = pc_py_wait_upto(self, upto, timeout, NULL);
    if (self->s && pc_sched_idle(self->s))
        for (int slot = 0; slot < 2; slot++) {
            PyBuffer_Release(&self->views[slot]);
            self->has_view[slot] = 0;
            pc_sched_unbind(self->s, slot);
        }
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The data lock that LOCKED ops hold while they run, taken and given back
 * by a thread that holds the GIL (lock() and unlock() below, and the C API
 * of pycapi.c). */
int pc_py_lock_data(pc_sched *s)
{
    if (pc_sched_lock_mine(s)) {
        pc_raise(PC_EINVAL, "this thread already holds the schedule's data "
                 "lock");
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    pc_sched_lock(s);
    Py_END_ALLOW_THREADS
    return 0;
}

void pc_py_unlock_data(pc_sched *s)
{
    pc_sched_unlock(s);
    /* wake the progress thread only when locked ops were deferred: a wake
     * per unlock (two per partial-collective call) costs a context switch */
    if (!atomic_load(&s->closing) && atomic_exchange(&s->unlock_wakes, 0))
        pc_engine_notify(s);
}

static PyObject *sched_lock(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (pc_check_open(self))
        return NULL;
    pc_sched *s = self->s;
    pc_sched_ref(s);            /* another thread may free it meanwhile */
    if (pc_py_lock_data(s) < 0) {
        pc_sched_unref(s);
        return NULL;
    }
    self->locked = s;
    Py_RETURN_NONE;
}

static PyObject *sched_unlock(SchedObject *self, PyObject *unused)
{
    (void)unused;
    pc_sched *s = self->locked;
    if (!s || !pc_sched_lock_mine(s))
        return pc_raise(PC_EINVAL, "unlock() without lock() on this thread");
    self->locked = NULL;
    pc_py_unlock_data(s);
    pc_sched_unref(s);
    Py_RETURN_NONE;
}

static PyObject *sched_free(SchedObject *self, PyObject *unused)
{
    (void)unused;
    pc_py_free(self);
    Py_RETURN_NONE;
}

static PyObject *sched_open_gate(SchedObject *self, PyObject *args)
{
    int op;
    unsigned long long round;
    if (!PyArg_ParseTuple(args, "iK", &op, &round) || pc_check_open(self))
        return NULL;
    int rc = pc_engine_open_gate(self->s, op, round);
    if (rc != PC_OK)
        return pc_raise(rc, "open_gate() needs the index of a gate op");
    Py_RETURN_NONE;
}

/* idle(): no round posted and unfinished (a non-persistent schedule may be
 * bound and posted again); the blocking allreduce asks it every call, before
 * it takes the call's tags. */
static PyObject *sched_idle(SchedObject *self, PyObject *unused)
{
    (void)unused;
    if (pc_check_open(self))
        return NULL;
    return PyBool_FromLong(pc_sched_idle(self->s));
}

static PyMethodDef sched_methods[] = {
    {"bind", (PyCFunction)sched_bind, METH_VARARGS, "bind(slot, obj, writable)"},
    {"unbind", (PyCFunction)sched_unbind, METH_VARARGS, "unbind(slot)"},
    {"post", (PyCFunction)sched_post, METH_NOARGS, "post() -> round count"},
    {"bind_ptr", (PyCFunction)sched_bind_ptr, METH_VARARGS,
     "bind_ptr(slot, address, nbytes, writable, space)"},
    {"set_device", (PyCFunction)sched_set_device, METH_VARARGS,
     "set_device(backend, ctx, stream, kernels)"},
    {"set_tag_base", (PyCFunction)sched_set_tag_base, METH_VARARGS,
     "set_tag_base(base)"},
    {"set_reliable", (PyCFunction)sched_set_reliable, METH_VARARGS,
     "set_reliable(flag): a lost message fails the round"},
    {"fire", (PyCFunction)sched_fire, METH_VARARGS,
     "fire(op, round=-1, wake=True)"},
    {"wait", (PyCFunction)pc_py_wait, METH_VARARGS, "wait(upto, timeout=-1)"},
    {"test", (PyCFunction)pc_py_test, METH_VARARGS, "test(upto) -> bool"},
    {"run", (PyCFunction)sched_run, METH_VARARGS,
     "run(send, recv, tag_base, timeout=-1)"},
    {"idle", (PyCFunction)sched_idle, METH_NOARGS,
     "idle() -> no round posted and unfinished"},
    {"free", (PyCFunction)sched_free, METH_NOARGS, "free()"},
    {"lock", (PyCFunction)sched_lock, METH_NOARGS, "take the data lock"},
    {"unlock", (PyCFunction)sched_unlock, METH_NOARGS, "release it"},
    {"wait_gate", (PyCFunction)pc_py_wait_gate, METH_VARARGS,
     "wait_gate(timeout=-1) -> (op, round)"},
    {"open_gate", (PyCFunction)sched_open_gate, METH_VARARGS,
     "open_gate(op, round)"},
    {"outcomes", (PyCFunction)pc_py_outcomes, METH_NOARGS,
     "outcomes() -> (round, outcome bytes, int32 delivered counts, float64 "
     "completion, arrival and first-byte-on-the-wire times)"},
    {NULL, NULL, 0, NULL}};

PyTypeObject pc_SchedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "partialcoll._core.Sched",
    .tp_basicsize = sizeof(SchedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level executor schedule; use partialcoll.Schedule.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sched_init,
    .tp_dealloc = (destructor)sched_dealloc,
    .tp_methods = sched_methods,
    .tp_getset = pc_py_getset,
};
