/* pc_engine_int.h -- between the two halves of the engine: pc_engine.c (the
 * progress thread, work lists, timers, waits, lifecycle) and pc_wire.c
 * (the transport, send gates, the control channel).  Not for the schedule
 * layer or the binding. */
#ifndef PC_ENGINE_INT_H
#define PC_ENGINE_INT_H

#include "pc_sched.h"

/* pc_wire.c, progress lock held */
int pc_wire_emulated_pending(void);  /* an emulator still holds messages */
int pc_wire_poll(void);              /* test the transport once, dispatch */
int pc_wire_hot(void);               /* round-bound messages in flight */
int pc_wire_wait_yields(void);       /* the transport's wait_yields */
int pc_wire_outstanding(void);       /* messages of any kind in flight */
int pc_wire_sends_left(void);        /* sends not yet completed */
double pc_wire_next_poll(void);      /* the transport's own deadline */
void pc_wire_shutdown(void);
int pc_wire_init(void);              /* the MPI transport, once */
int pc_wire_use_network(const char *config, char *err, int errlen);
void pc_wire_set_send_cap(int cap);
void pc_wire_stats(uint64_t *v, int n);

/* pc_timers.c, progress lock held (pc_engine_add_timer is in pc_sched.h) */
double pc_timers_next(void);         /* earliest due time, HUGE_VAL: none */
int pc_timers_fire(double now);      /* fire what is due; how many */
void pc_timers_remove(pc_sched *s);  /* all of a schedule's */

/* pc_engine.c, progress lock held */
void pc_engine_mark_event(void);

#endif
