/* sched.c -- the application's side of a schedule: binding buffers to
 * slots, its device queue and tag block, the data lock, the last round's
 * outcomes, its error, and its lifetime (reference counted; see
 * "Lifetime" in pc_sched.h).  Building it is in build.c. */
#include "sched/pc_sched.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pc_sched_bind(pc_sched *s, int slot, void *ptr, int64_t len, int writable,
                  int space)
{
    if (slot < 0 || slot >= s->nslots || (space != PC_HOST &&
                                          space != PC_DEVICE))
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->slots[slot] = (pc_slot){ptr, len, writable, 1, space};
    return PC_OK;
}

void pc_sched_unbind(pc_sched *s, int slot)
{
    if (slot >= 0 && slot < s->nslots)
        s->slots[slot] = (pc_slot){0};
}

int pc_sched_set_device(pc_sched *s, int backend, void *ctx, void *stream,
                        const int64_t *kernels, int nkernels, char *err,
                        size_t errlen)
{
    if (!pc_sched_idle(s)) {
        snprintf(err, errlen, "cannot change the device queue while a round "
                 "runs");
        return PC_EBUSY;
    }
    if (pc_devq_init(&s->dq, backend, ctx, stream, kernels, nkernels) < 0) {
        snprintf(err, errlen, "%s", s->dq.err);
        s->has_devq = 0;
        return PC_EDEVICE;
    }
    s->has_devq = 1;
    return PC_OK;
}

int pc_sched_set_tag_base(pc_sched *s, int base)
{
    if (base < 0 || (int64_t)base + s->max_tag >= s->tag_ub)
        return PC_EINVAL;
    if (!pc_sched_idle(s))
        return PC_EBUSY;
    s->tag_base = base;
    return PC_OK;
}

int pc_sched_idle(pc_sched *s)
{
    if (s->persistent)
        return atomic_load(&s->posted) == 0;
    return atomic_load(&s->posted) == atomic_load(&s->done);
}

/* ---- errors: the first one wins, published only once its text is there */
void pc_sched_set_error(pc_sched *s, int code, const char *fmt, ...)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->error_claimed, &expected, 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
    va_end(ap);
    atomic_store(&s->error, code);
}

/* ---- the data lock */
void pc_sched_lock(pc_sched *s)
{
    pthread_mutex_lock(&s->data_mtx);
    s->lock_owner = pthread_self();
    atomic_store(&s->lock_held, 1);
}

void pc_sched_unlock(pc_sched *s)
{
    atomic_store(&s->lock_held, 0);
    pthread_mutex_unlock(&s->data_mtx);
}

int pc_sched_lock_mine(pc_sched *s)
{
    return atomic_load(&s->lock_held) &&
           pthread_equal(s->lock_owner, pthread_self());
}

int pc_sched_has_locked_ops(pc_sched *s)
{
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].flags & PC_F_LOCKED)
            return 1;
    return 0;
}

/* The arrays are written at the end of each round under fire_mtx. */
int pc_sched_last_outcomes(pc_sched *s, uint8_t *outcome, int *nok,
                           double *t_done, double *t_arrive, double *t_wire,
                           uint64_t *round)
{
    pthread_mutex_lock(&s->fire_mtx);
    memcpy(outcome, s->last_outcome, (size_t)s->nops);
    memcpy(nok, s->last_nok, (size_t)s->nops * sizeof(int));
    memcpy(t_done, s->last_t, (size_t)s->nops * sizeof(double));
    memcpy(t_arrive, s->last_arrive, (size_t)s->nops * sizeof(double));
    memcpy(t_wire, s->last_wire, (size_t)s->nops * sizeof(double));
    *round = s->last_round_ok;
    pthread_mutex_unlock(&s->fire_mtx);
    return PC_OK;
}

/* ---- lifetime */
static void destroy(pc_sched *s)
{
    for (int i = 0; s->ops && i < s->nops; i++) {
        free(s->ops[i].bank);
        free(s->ops[i].bankdata);
        free(s->ops[i].stampbuf);
    }
    free(s->ops);
    free(s->slots);
    free(s->succ);
    free(s->pred);
    free(s->heap);
    free(s->defer);
    free(s->held);
    free(s->triggers);
    free(s->srecv);
    free(s->last_outcome);
    free(s->last_nok);
    free(s->last_t);
    free(s->last_arrive);
    free(s->last_wire);
    free(s->next_order);
    free(s->sfire);
    free(s->gate_ready);
    for (int k = 0; k < s->ndisc; k++)
        free(s->disc[k].buf);
    free(s->disc);
    for (int k = 0; k < s->ndev; k++)
        pc_dev_sync(&s->dq, s->dev[k].ev);
    free(s->dev);
    pc_devq_fini(&s->dq);
    pthread_mutex_destroy(&s->fire_mtx);
    pthread_mutex_destroy(&s->data_mtx);
    free(s);
}

void pc_sched_ref(pc_sched *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void pc_sched_unref(pc_sched *s)
{
    if (atomic_fetch_sub(&s->refs, 1) == 1)
        destroy(s);
}
