/* pc_trace.h -- the timeline: a record of what the executor and the wire
 * did, for a trace viewer (partialcoll/transport/timeline.py reads the
 * events, laid out as pc_tl_event, and turns them into Chrome trace JSON).
 *
 * Off by default: every recording site tests pc_tl_on first, so the cost
 * when off is one predictable branch.  The recorder knows nothing of
 * schedules; the engine fills an event from an op (engine_int.h, pc_tl_op),
 * the emulated network from a message (pc_tl_msg).
 *
 * Events:
 *   READY     the op's dependencies are met      START     it started
 *   GATED     a send waits in a gate (order, cap) RELEASED  handed to the wire
 *   WIRE_*    bytes on the emulated wire          DELIVERED/DROPPED/TIMEDOUT
 *   COMPLETE  the op ended (with its outcome)     ROUND     a round armed */
#ifndef PC_TRACE_H
#define PC_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

extern _Atomic int pc_tl_on;

enum { PC_EV_READY = 1, PC_EV_START, PC_EV_COMPLETE, PC_EV_GATED,
       PC_EV_RELEASED, PC_EV_WIRE_START, PC_EV_WIRE_END, PC_EV_DELIVERED,
       PC_EV_DROPPED, PC_EV_TIMEDOUT, PC_EV_ROUND, PC_NEVENTS };

/* Outcome of an op in a round (sched/pc_sched.h says when each happens);
 * events carry one. */
/* an op event's flags: the op's own (PC_F_*), and this bit when the event
 * was recorded on an application thread (a caller driving progress while
 * it waits), not on the progress thread */
enum { PC_TL_CALLER = 1 << 16 };

enum { PC_OC_NONE = 0, PC_OC_OK = 1, PC_OC_DROPPED = 2, PC_OC_TIMEDOUT = 3,
       PC_OC_SKIPPED = 4 };

typedef struct {
    double t;           /* pc_now() */
    uint64_t sched;     /* schedule serial (process-local) */
    uint64_t round;
    int64_t bytes;
    int32_t op, ev, kind, peer;   /* peer: rank in MPI_COMM_WORLD */
    int32_t tag, prio, outcome, flags;
} pc_tl_event;

void pc_tl_record(const pc_tl_event *e);
/* a message's event (kind -1, no flags); t < 0: now */
void pc_tl_msg(int ev, double t, uint64_t sched, int op, uint64_t round,
               int peer, int tag, int64_t bytes, int prio, int outcome);
int pc_tl_enable(int on);                      /* returns bytes per event */
int64_t pc_tl_take(void *buf, int64_t cap);   /* drain recorded events */
int64_t pc_tl_count(void);

#endif
