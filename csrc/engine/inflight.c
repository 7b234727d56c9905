/* inflight.c -- ops of a round that are in flight: device work queued
 * on the schedule's device queue, messages the wire reports complete
 * (with their outcome), deadlines, the discard receives that stand in for
 * timed-out ones, and stopping a schedule (error or free).  Progress lock
 * held throughout; see round.c for the rest of the round machinery. */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- device ops (sched/device.h) */
int pc_round_is_device_op(pc_sched *s, pc_op *op)
{
    return (op->kind == PC_COPY || op->kind == PC_REDUCE) &&
           (s->slots[op->aslot].space == PC_DEVICE ||
            s->slots[op->bslot].space == PC_DEVICE);
}

static int add_dev(pc_sched *s, int op, uintptr_t ev)
{
    pc_dev_op *d = pc_grow(s->dev, &s->capdev, s->ndev + 1, sizeof(*d), 16);
    if (!d) {
        pc_dev_sync(&s->dq, ev);
        pc_sched_set_error(s, PC_ENOMEM, "out of memory queueing device "
                           "op %d (round %llu)", op,
                           (unsigned long long)s->round);
        return PC_ENOMEM;
    }
    s->dev = d;
    s->dev[s->ndev++] = (pc_dev_op){op, ev};
    s->inflight++;
    return PC_OK;
}

/* Queue a device op (or a fence) and put it in flight; a LOCKED one is run
 * to completion here, inside the caller's hold of the data lock. */
int pc_round_start_device(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    uintptr_t ev = 0;
    int rc = 0;
    if (op->kind == PC_COPY && op->count)
        rc = pc_dev_copy(&s->dq, pc_addr(s, op->aslot, op->aoff),
                         s->slots[op->aslot].space,
                         pc_addr(s, op->bslot, op->boff),
                         s->slots[op->bslot].space,
                         (size_t)(op->count * pc_dtypes[op->dtype].size));
    else if (op->kind == PC_REDUCE && op->count)
        rc = pc_dev_reduce(&s->dq, pc_addr(s, op->aslot, op->aoff),
                           pc_addr(s, op->bslot, op->boff), op->count, op->dtype,
                           op->redop);
    if (rc == 0)
        rc = pc_dev_record(&s->dq, &ev);
    if (rc == 0 && (op->flags & PC_F_LOCKED)) {
        rc = pc_dev_sync(&s->dq, ev);
        if (rc == 0) {
            pc_round_complete(s, i, PC_OC_OK);
            return PC_OK;
        }
    }
    if (rc != 0) {
        pc_sched_set_error(s, PC_EDEVICE, "device %s failed in op %d (round "
                           "%llu): %s", op->kind == PC_REDUCE ? "reduction"
                           : "copy", i, (unsigned long long)s->round,
                           s->dq.err);
        return PC_EDEVICE;
    }
    return add_dev(s, i, ev);
}

/* Complete device ops whose work has run, in queue order. */
int pc_round_test_device(pc_sched *s)
{
    int n = 0, k = 0;
    while (k < s->ndev) {
        int r = pc_dev_query(&s->dq, s->dev[k].ev);
        if (r < 0) {
            pc_sched_set_error(s, PC_EDEVICE, "device work of op %d failed "
                               "(round %llu): %s", s->dev[k].op,
                               (unsigned long long)s->round, s->dq.err);
            return -1;
        }
        if (r == 0)
            break;
        k++;
    }
    for (int j = 0; j < k; j++) {
        s->inflight--;
        pc_round_complete(s, s->dev[j].op, PC_OC_OK);
        n++;
    }
    if (k) {
        s->ndev -= k;
        memmove(s->dev, s->dev + k, (size_t)s->ndev * sizeof(*s->dev));
        if (pc_round_run_ready(s) < 0)
            return -1;
    }
    return n;
}

/* ---- completions from the wire */
static void discard_done(pc_sched *s, int64_t id)
{
    for (int k = 0; k < s->ndisc; k++)
        if (s->disc[k].id == id) {
            free(s->disc[k].buf);
            s->disc[k] = s->disc[--s->ndisc];
            atomic_fetch_add(&s->late, 1);
            return;
        }
}

/* A timed-out receive was cancelled before its message came: a discard
 * receive takes its place in MPI's matching order, so the late message is
 * consumed and counted, never taken by the next round's receive. */
static void post_discard(pc_sched *s, int i)
{
    pc_op *op = &s->ops[i];
    int64_t bytes = op->count * pc_dtypes[op->dtype].size, h = -1;
    pc_discard *disc = pc_grow(s->disc, &s->capdisc, s->ndisc + 1,
                               sizeof(*disc), 4);
    if (!disc)
        goto oom;
    s->disc = disc;
    void *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!buf)
        goto oom;
    int64_t id = PC_COOKIE_DISCARD - s->next_disc++;
    int rc = pc_wire_recv(s, i, buf, (int)bytes, MPI_BYTE,
                          op->tag + s->tag_base, id, &h);
    if (rc != MPI_SUCCESS) {
        free(buf);
        pc_round_mpi_failure(s, i, "posting the discard receive of a "
                             "timed-out receive failed", rc);
        return;
    }
    s->disc[s->ndisc++] = (pc_discard){h, id, buf};
    return;
oom:
    pc_sched_set_error(s, PC_ENOMEM, "out of memory replacing timed-out "
                       "op %d (round %llu)", i, (unsigned long long)s->round);
}

void pc_round_on_done(pc_sched *s, int64_t cookie, const pc_done *d)
{
    if (cookie <= PC_COOKIE_DISCARD) {
        discard_done(s, cookie);
        return;
    }
    if (s->cleaned || atomic_load(&s->error) != PC_OK)
        return;                 /* stopped: its sends only drain */
    int i = (int)cookie;
    pc_op *op = &s->ops[i];
    pc_engine_queue(s);
    if (d->mpi_error != MPI_SUCCESS) {
        pc_round_mpi_failure(s, i, d->send ? "send failed" : "receive failed",
                             d->mpi_error);
        return;
    }
    if (!d->send) {
        op->req = -1;
        op->t_arrive = d->t_arrive;
        op->t_wire = d->t_wire;
    }
    s->inflight--;
    if (d->send || d->outcome == PC_MSG_DELIVERED) {
        if (pc_tl_on && !d->send)
            pc_tl_op(PC_EV_DELIVERED, s, i, PC_OC_OK);
        pc_round_complete(s, i, PC_OC_OK);
    } else if (s->reliable) {
        /* told or silent: the transport knows; a reliable schedule cannot
         * go on without the message */
        atomic_fetch_add(d->outcome == PC_MSG_DROPPED ? &s->dropped
                                                       : &s->swallowed, 1);
        pc_sched_set_error(s, PC_EMPI, "op %d (receive from rank %d, tag "
                           "%d) in round %llu: the message was lost on the "
                           "emulated network, and this schedule needs every "
                           "message (it is reliable; send lossy traffic in a "
                           "traffic class of its own)", i, op->peer, op->tag,
                           (unsigned long long)s->round);
    } else if (d->outcome == PC_MSG_DROPPED) {
        atomic_fetch_add(&s->dropped, 1);
        if (pc_tl_on)
            pc_tl_op(PC_EV_DROPPED, s, i, PC_OC_DROPPED);
        pc_round_complete(s, i, PC_OC_DROPPED);
    } else {
        /* lost silently: the op stays active until its deadline */
        atomic_fetch_add(&s->swallowed, 1);
    }
}

void pc_round_on_timer(pc_sched *s, int i, uint64_t round, uint32_t gen)
{
    pc_op *op = &s->ops[i];
    if (s->cleaned || !s->armed || s->round != round ||
        op->state != OP_ACTIVE || op->tgen != gen)
        return;                     /* a timer of an earlier round or run */
    pc_engine_queue(s);
    if (op->kind != PC_RECV) {
        pc_round_complete(s, i, PC_OC_OK);
        return;
    }
    if (op->req >= 0) {
        pc_done d;
        int r = pc_wire_cancel_recv(op->req, 1, &d);
        if (r == 0) {               /* it arrived meanwhile */
            pc_round_on_done(s, i, &d);
            return;
        }
        op->req = -1;
        s->inflight--;
        post_discard(s, i);
    }
    atomic_fetch_add(&s->timedout, 1);
    if (pc_tl_on)
        pc_tl_op(PC_EV_TIMEDOUT, s, i, PC_OC_TIMEDOUT);
    pc_round_complete(s, i, PC_OC_TIMEDOUT);
}

/* Error or free: cancel every receive (a local operation), drop sends that
 * were never handed to the transport, let the others complete. */
void pc_round_stop(pc_sched *s)
{
    if (s->cleaned)
        return;
    s->cleaned = 1;
    for (int i = 0; i < s->nops; i++) {
        pc_op *op = &s->ops[i];
        if (op->kind == PC_RECV && op->req >= 0) {
            pc_done d;
            pc_wire_cancel_recv(op->req, 1, &d);
            op->req = -1;
        }
    }
    for (int k = 0; k < s->ndisc; k++) {
        pc_done d;
        pc_wire_cancel_recv(s->disc[k].req, 0, &d);
        free(s->disc[k].buf);
    }
    s->ndisc = 0;
    pc_wire_unhold(s);
    s->nheld = 0;
    for (int k = 0; k < s->ndev; k++)
        pc_dev_sync(&s->dq, s->dev[k].ev);
    s->ndev = 0;
    pc_ctrl_unregister(s);
    s->armed = 0;
    s->inflight = 0;
    s->nheap = 0;
}
