/* calls.c -- partialcoll.collectives.partial._calls: the blocking call of a
 * partial allreduce (solo, majority, quorum) in C, for host buffers.
 *
 * The protocol is the one partialcoll/collectives/partial/rounds.py
 * writes in Python (Rounds._deposit, arrive, take): this file does the
 * same steps on the same buffers, with one C call instead of some forty
 * Python and NumPy ones, on the executor's C API (capi/pc_capi.h):
 *
 *   1. under the schedule's data lock: read the finished rounds waiting
 *      to be taken and the rounds started, decide whether the deposit is
 *      fresh, combine x into pending, count the deposit, set the flags;
 *   2. arrive: fire the kind's trigger for the round (not waking the
 *      progress thread: this thread runs the round);
 *   3. unless finished rounds wait, wait for the round;
 *   4. under the lock: take the accumulated result into `out`, reset it,
 *      and read what the result says (rounds, sequence numbers, NAP,
 *      marks, the straggler counters).
 *
 * The Python side builds the PartialResult from the numbers returned, and
 * takes over where a wait raises (a rank's death, a long wait): `seq`
 * then holds the deposit's number. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "capi/pc_capi.h"
#include "partial/book.h"

static pc_capi *api;

enum { KIND_SOLO, KIND_MAJORITY, KIND_QUORUM };

/* the object's buffers, in the order the constructor takes them */
enum { B_PENDING, B_ACC, B_IDENTITY, B_ACC_ROUNDS, B_SNAPS, B_FLUSH_TOTAL,
       B_FLAG, B_DEP_SEQ, B_ACC_SEQ, B_ACC_LO, B_LAST_ACTIVE, B_LAST_FLUSH,
       B_LAST_BYPASS, B_STAT_ROUNDS, B_LATE_TOTAL, B_ROUND_SEQ, NBUF };

typedef struct {
    PyObject_HEAD
    PyObject *sched;           /* the schedule's _core.Sched */
    Py_buffer buf[NBUF];
    int nheld;                 /* buffers held (the first nheld) */
    int size, rank, kind, marks_bypass, trigger, bypass, start, dtype,
        redop;
    int keeps;                 /* identity op x is x (see deposit) */
    uint64_t seed;
    int64_t base, count;
    long long seq;             /* the last call's deposit number, or -1 */
} CallsObject;

#define I64(o, b) ((int64_t *)(o)->buf[b].buf)

static void calls_dealloc(CallsObject *self)
{
    for (int i = 0; i < self->nheld; i++)
        PyBuffer_Release(&self->buf[i]);
    Py_XDECREF(self->sched);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The bytes each buffer must hold: n elements of the data, one int64, or
 * the flags (3 + 2P) and the per-rank counters (P). */
static Py_ssize_t buffer_bytes(CallsObject *o, int b, Py_ssize_t itemsize)
{
    if (b == B_IDENTITY)                /* one element, filled from */
        return itemsize;
    if (b < B_IDENTITY)
        return (Py_ssize_t)o->count * itemsize;
    if (b == B_FLAG)
        return (Py_ssize_t)(3 + 2 * o->size) * 8;
    if (b == B_LATE_TOTAL)
        return (Py_ssize_t)o->size * 8;
    return 8;
}

static int hold_buffers(CallsObject *o, PyObject *bufs, Py_ssize_t itemsize)
{
    if (!PyTuple_Check(bufs) || PyTuple_GET_SIZE(bufs) != NBUF) {
        PyErr_Format(PyExc_ValueError, "Calls needs a tuple of %d buffers",
                     NBUF);
        return -1;
    }
    for (int b = 0; b < NBUF; b++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(bufs, b), &o->buf[b],
                               PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            return -1;
        o->nheld = b + 1;
        if (o->buf[b].len != buffer_bytes(o, b, itemsize)) {
            PyErr_Format(PyExc_ValueError, "buffer %d holds %zd bytes, not "
                         "%zd", b, o->buf[b].len,
                         buffer_bytes(o, b, itemsize));
            return -1;
        }
    }
    return 0;
}

/* Calls(sched, buffers, size, rank, kind, marks_bypass, seed, trigger,
 *       bypass, start, base, count, itemsize, dtype, redop, keeps) */
static int calls_init(CallsObject *self, PyObject *args, PyObject *kw)
{
    PyObject *sched, *bufs;
    unsigned long long seed;
    long long base, count;
    Py_ssize_t itemsize;
    (void)kw;
    if (self->sched) {
        PyErr_SetString(PyExc_RuntimeError, "Calls is made once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OO!iiipKiiiLLniip", &sched, &PyTuple_Type,
                          &bufs, &self->size, &self->rank, &self->kind,
                          &self->marks_bypass, &seed, &self->trigger,
                          &self->bypass, &self->start, &base, &count,
                          &itemsize, &self->dtype, &self->redop,
                          &self->keeps) ||
        api->check(sched) < 0)
        return -1;
    if (self->size < 1 || self->rank < 0 || self->rank >= self->size ||
        self->kind < KIND_SOLO || self->kind > KIND_QUORUM || count < 0 ||
        itemsize < 1) {
        PyErr_SetString(PyExc_ValueError, "Calls: an argument out of range");
        return -1;
    }
    self->seed = seed;
    self->base = base;
    self->count = count;
    self->seq = -1;
    Py_INCREF(sched);
    self->sched = sched;
    return hold_buffers(self, bufs, itemsize);
}

/* Step 1, under the lock: the deposit.  Returns 0 and sets *waiting,
 * *rnd, *fresh, *flushing, or -1 with an exception. */
static int deposit(CallsObject *o, const void *x, long long observed,
                   long long epochs, int64_t *waiting, int64_t *rnd,
                   int *fresh, int *flushing)
{
    int64_t *flag = I64(o, B_FLAG);
    int P = o->size, rc = 0;
    if (api->lock(o->sched) < 0)
        return -1;
    *waiting = *I64(o, B_ACC_ROUNDS);
    *rnd = *I64(o, B_SNAPS);
    *flushing = *I64(o, B_FLUSH_TOTAL) > (int64_t)P * epochs;
    *fresh = !*waiting && *rnd == observed;
    if (*fresh && *flushing && o->marks_bypass) {
        flag[2] = 1;                  /* the round may miss its quorum */
        for (int i = 3 + P; i < 3 + 2 * P; i++)
            flag[i] = 1;
    }
    if (*I64(o, B_DEP_SEQ) == *I64(o, B_ROUND_SEQ) && o->keeps) {
        /* nothing deposited since the snapshot: pending holds the
         * identity, and identity op x is x (bit for bit but for the sign
         * of a zero; not for the reductions that give truth values) */
        memcpy(o->buf[B_PENDING].buf, x, (size_t)o->buf[B_PENDING].len);
    } else {
        rc = api->reduce(x, o->buf[B_PENDING].buf, o->count, o->dtype,
                         o->redop);
    }
    if (rc == 0) {
        o->seq = ++*I64(o, B_DEP_SEQ);
        if (*fresh) {
            flag[0] = 1;
            flag[3 + o->rank] = 0;
        }
    }
    api->unlock(o->sched);
    return rc;
}

/* Step 2: the arrival of a fresh call (kinds.py's arrive): majority's
 * callers other than the drawn one start their own part of the round
 * (`start`: it activates no one). */
static int arrive(CallsObject *o, int64_t rnd, int flushing)
{
    int op = o->trigger;
    if (o->kind == KIND_MAJORITY && !flushing &&
        pc_book_designated(o->seed, (uint64_t)rnd, o->size) != o->rank)
        op = o->start;
    if (o->kind == KIND_QUORUM && flushing)
        op = o->bypass;
    return api->fire(o->sched, op, rnd - o->base, 0);
}

/* Step 4, under the lock: the result into out, and its numbers. */
static PyObject *take(CallsObject *o, Py_buffer *out, Py_buffer *late)
{
    if (api->lock(o->sched) < 0)
        return NULL;
    int64_t nr = *I64(o, B_ACC_ROUNDS);
    *I64(o, B_ACC_ROUNDS) = 0;
    memcpy(out->buf, o->buf[B_ACC].buf, (size_t)out->len);
    api->fill(o->buf[B_ACC].buf, o->buf[B_IDENTITY].buf, o->count,
              (int)o->buf[B_IDENTITY].len);
    memcpy(late->buf, o->buf[B_LATE_TOTAL].buf, (size_t)late->len);
    long long acc_seq = *I64(o, B_ACC_SEQ), acc_lo = *I64(o, B_ACC_LO);
    long long active = *I64(o, B_LAST_ACTIVE);
    int marked = *I64(o, B_LAST_FLUSH) > 0 || *I64(o, B_LAST_BYPASS) > 0;
    long long stat_rounds = *I64(o, B_STAT_ROUNDS);
    api->unlock(o->sched);
    return Py_BuildValue("(LLLLLiL)", o->seq, (long long)nr, acc_seq, acc_lo,
                         active, marked, stat_rounds);
}

/* call(x, observed, epochs, timeout, out, late) -> (seq, rounds, acc_seq,
 * acc_lo, active, marked, stat_rounds): the blocking call.  x: the
 * contribution (count elements of the object's dtype); observed: rounds
 * taken by this rank; epochs: synchronous rounds done here; timeout: of
 * the wait (< 0: none); out: receives the result; late: receives the
 * late counters (P int64).  A wait that raises leaves `seq` set. */
static PyObject *calls_call(CallsObject *self, PyObject *args)
{
    PyObject *xo, *outo, *lateo, *res = NULL;
    long long observed, epochs;
    double timeout;
    Py_buffer x, out, late;
    int64_t waiting, rnd;
    int fresh, flushing;
    if (!PyArg_ParseTuple(args, "OLLdOO", &xo, &observed, &epochs, &timeout,
                          &outo, &lateo))
        return NULL;
    self->seq = -1;
    if (PyObject_GetBuffer(xo, &x, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(outo, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (PyObject_GetBuffer(lateo, &late, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE))
        goto release_out;
    if (x.len != self->buf[B_PENDING].len || out.len != x.len ||
        late.len != self->buf[B_LATE_TOTAL].len) {
        PyErr_SetString(PyExc_ValueError, "call: a buffer of the wrong size");
        goto release;
    }
    if (deposit(self, x.buf, observed, epochs, &waiting, &rnd, &fresh,
                &flushing) < 0 ||
        (fresh && arrive(self, rnd, flushing) < 0))
        goto release;
    if (!waiting && api->wait(self->sched,
                              (uint64_t)(observed - self->base + 1),
                              timeout) < 0)
        goto release;
    res = take(self, &out, &late);
release:
    PyBuffer_Release(&late);
release_out:
    PyBuffer_Release(&out);
    PyBuffer_Release(&x);
    return res;
}

static PyObject *calls_get_seq(CallsObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(self->seq);
}

static PyMethodDef calls_methods[] = {
    {"call", (PyCFunction)calls_call, METH_VARARGS,
     "call(x, observed, epochs, timeout, out, late) -> (seq, rounds, "
     "acc_seq, acc_lo, active, marked, stat_rounds)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef calls_getset[] = {
    {"seq", (getter)calls_get_seq, NULL,
     "the last call's deposit number (-1: it deposited nothing)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CallsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "partialcoll.collectives.partial._calls.Calls",
    .tp_basicsize = sizeof(CallsObject),
    .tp_dealloc = (destructor)calls_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A partial allreduce object's blocking call in C",
    .tp_methods = calls_methods,
    .tp_getset = calls_getset,
    .tp_init = (initproc)calls_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_calls",
    "A partial allreduce's blocking call in C (see csrc/partial/calls.c)",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__calls(void)
{
    api = (pc_capi *)PyCapsule_Import(PC_CAPI_NAME, 0);
    if (!api)
        return NULL;
    if (api->version != PC_CAPI_VERSION) {
        PyErr_SetString(PyExc_ImportError, "partialcoll._core's C API is of "
                        "another version");
        return NULL;
    }
    if (pc_book_register(api) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m || PyType_Ready(&CallsType) < 0)
        return NULL;
    Py_INCREF(&CallsType);
    PyModule_AddObject(m, "Calls", (PyObject *)&CallsType);
    PyObject *fields = PyTuple_New(0);
    for (int f = 0; fields && pc_book_fields[f]; f++) {
        PyObject *name = PyUnicode_FromString(pc_book_fields[f]);
        if (!name || _PyTuple_Resize(&fields, f + 1) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(fields);
            break;
        }
        PyTuple_SET_ITEM(fields, f, name);
    }
    int rc = fields ? PyModule_AddObjectRef(m, "BOOK_FIELDS", fields) : -1;
    Py_XDECREF(fields);
    if (rc < 0 ||
        PyModule_AddStringConstant(m, "SNAPSHOT", PC_BOOK_SNAPSHOT) < 0 ||
        PyModule_AddStringConstant(m, "ACCOUNT", PC_BOOK_ACCOUNT) < 0 ||
        PyModule_AddStringConstant(m, "DRAWN", PC_BOOK_DRAWN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
