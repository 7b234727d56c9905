/* pypark.c -- freeing a Sched.  Sends are never cancelled (engine.c,
 * design constraint 7), so a schedule freed with sends in flight keeps
 * the buffers MPI still reads: they go, with the schedule, to the park,
 * and are released with the GIL once its sends completed (pc_reap). */
#include "python/module.h"

typedef struct {
    pc_sched *s;
    Py_buffer *views;
    char *has_view;
    int nslots;
} parked;
static parked *park;
static int npark, cappark;

void pc_py_release_views(Py_buffer *views, char *has_view, int n)
{
    for (int i = 0; i < n; i++)
        if (has_view[i]) {
            PyBuffer_Release(&views[i]);
            has_view[i] = 0;
        }
}

int pc_reap(void)
{
    int keep = 0;
    for (int k = 0; k < npark; k++) {
        parked *p = &park[k];
        if (atomic_load_explicit(&p->s->sends_left,
                                 memory_order_acquire) > 0) {
            park[keep++] = *p;
            continue;
        }
        pc_py_release_views(p->views, p->has_view, p->nslots);
        PyMem_Free(p->views);
        PyMem_Free(p->has_view);
        pc_sched_unref(p->s);
    }
    npark = keep;
    return npark;
}

static int park_push(parked p)
{
    if (npark == cappark) {
        int cap = pc_grow_cap(cappark, npark + 1, 8);
        parked *q = PyMem_Realloc(park, (size_t)cap * sizeof(parked));
        if (!q)
            return -1;
        park = q;
        cappark = cap;
    }
    park[npark++] = p;
    return 0;
}

void pc_py_free(SchedObject *self)
{
    pc_sched *s = self->s;
    if (!s)
        return;
    self->s = NULL;
    int draining;
    Py_BEGIN_ALLOW_THREADS
    draining = pc_engine_free(s);
    Py_END_ALLOW_THREADS
    if (!draining) {
        pc_py_release_views(self->views, self->has_view, self->nslots);
        pc_sched_unref(s);
    } else {
        /* MPI still reads the send buffers: they go with the schedule to
         * the park, released by pc_reap() once its sends completed */
        Py_buffer *v = PyMem_Calloc((size_t)self->nslots + 1,
                                    sizeof(Py_buffer));
        char *h = PyMem_Calloc((size_t)self->nslots + 1, 1);
        if (v && h && park_push((parked){s, self->views, self->has_view,
                                         self->nslots}) == 0) {
            self->views = v;
            self->has_view = h;
        } else {
            /* no memory to park: keep the views (and the schedule) for
             * ever rather than let MPI read freed memory */
            PyMem_Free(v);
            PyMem_Free(h);
            memset(self->has_view, 0, (size_t)self->nslots);
        }
    }
    pc_reap();
}
