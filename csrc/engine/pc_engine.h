/* pc_engine.h -- the engine as the binding sees it: post a schedule, fire
 * its triggers, open its gates, wait for its rounds, free it; shut down;
 * choose the transport and its settings.  The engine's insides are in
 * engine_int.h; engine.c opens with its design constraints.
 *
 * Every call takes the engine's locks itself: call it with no lock held
 * (and, from Python, with the GIL released around anything that can
 * block). */
#ifndef PC_ENGINE_H
#define PC_ENGINE_H

#include <stdint.h>

#include "sched/pc_sched.h"

/* ---- a schedule's rounds (engine.c, wait.c) */
/* wake = 0: the caller drives progress itself next (a blocking call) */
int pc_engine_post(pc_sched *s, int wake);
/* wake 0: the caller waits for the round right away and drives it on its
 * own thread, so the progress thread is not woken for it */
int pc_engine_fire(pc_sched *s, int op, int64_t round, int wake);
/* until `upto` rounds of s completed; the caller holds a reference */
int pc_engine_wait(pc_sched *s, uint64_t upto, double timeout);
int pc_engine_wait_gate(pc_sched *s, double timeout, int *op,
                        uint64_t *round);
int pc_engine_open_gate(pc_sched *s, int op, uint64_t round);
int pc_engine_busy(pc_sched *s);     /* after one sweep */
void pc_engine_notify(pc_sched *s);  /* application-side change: visit s */
void pc_engine_enqueue(pc_sched *s); /* the same, not waking the thread */
void pc_engine_wake(void);
/* After the library's own blocking exchanges (the Python side's control
 * collectives): keep the transport moving for `seconds` even with nothing
 * outstanding, so that bytes of sends MPI has completed leave this process
 * before the application blocks outside MPI (pc_transport.h, nudge). */
void pc_engine_settle(double seconds);
/* 1: its sends still drain (keep the buffers until sends_left is 0) */
int pc_engine_free(pc_sched *s);

/* ---- the process (engine.c) */
/* stop the thread, drain sends for at most drain_timeout seconds */
void pc_engine_shutdown(double drain_timeout);
double pc_engine_thread_cputime(void);
void pc_engine_stats(uint64_t *v, int n);
int pc_engine_set_send_cap(int cap);

/* ---- the transport (engine.c, wire.c) */
/* the emulated network from its description, "" for plain MPI */
int pc_engine_set_network(const char *config, char *err, int errlen);
const char *pc_engine_transport_name(void);
/* the emulated network's rate for a NIC (0 out, 1 in) at time t, and its
 * time zero; -1 when no network is in use */
int pc_engine_network_rate(int rank, int nic, double t, double *rate,
                           double *t0);
/* bit c: the network in use may lose a message of traffic class c */
unsigned pc_engine_lossy_classes(void);
/* the emulated network's fluid model alone, for tests (transport/
 * netem_model.c, netem_model_probe, says what it takes) */
double pc_engine_network_model(const char *config, double t0, double t,
                               const double *msgs, int n, double now,
                               double *out, double *event, char *err,
                               int errlen);

#endif
