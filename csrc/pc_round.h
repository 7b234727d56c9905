/* pc_round.h -- shared by the two files of the round machinery:
 * pc_round.c (readiness, starting ops, arming and finishing rounds) and
 * pc_inflight.c (ops in flight: device work, message completions,
 * deadlines, discards, stopping).  Not for other layers. */
#ifndef PC_ROUND_H
#define PC_ROUND_H

#include "pc_sched.h"

enum { OP_IDLE = 0, OP_ACTIVE = 1, OP_DONE = 2 };

static inline void *pc_addr(pc_sched *s, int slot, int64_t off)
{
    return (char *)s->slots[slot].ptr + off;
}

void pc_round_complete(pc_sched *s, int i, int oc);
int pc_round_run_ready(pc_sched *s);
void pc_round_mpi_failure(pc_sched *s, int i, const char *what, int code);
int pc_round_is_device_op(pc_sched *s, pc_op *op);
int pc_round_start_device(pc_sched *s, int i);

#endif
