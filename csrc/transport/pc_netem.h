/* pc_netem.h -- the emulated network: what it models, and what the engine
 * may ask of it.  Its insides are in netem_int.h.
 *
 * The model (one host; every rank sees the same CLOCK_MONOTONIC):
 *   - every rank r has an outgoing and an incoming NIC with a rate (bytes/s,
 *     INFINITY for unlimited); rates may follow seeded piecewise-constant
 *     traces: every `every` seconds a new rate is drawn, independently per
 *     NIC, from a discrete distribution (absolute rates or factors of the
 *     NIC's base rate);
 *   - each ordered pair (src, dst) is a FIFO channel: its messages go on the
 *     wire one after another, and each arrives `latency(src, dst)` after its
 *     last byte left;
 *   - a per-message cost (`overhead`, 0 by default): a message at the head
 *     of its channel holds it that long before its first byte moves, taking
 *     no share of a NIC meanwhile (a sender's per-message work: a system
 *     call, protocol processing, handling a request), so back-to-back
 *     messages of s bytes on one channel move at most s / (overhead +
 *     s / rate) bytes/s;
 *   - messages on the wire at the same time share the NICs max-min fairly
 *     (progressive filling over the out-NIC of the sender and the in-NIC of
 *     the receiver: two senders into one receiver get half each);
 *   - a message is lost with probability drop(src, dst, traffic class),
 *     decided by the sender from a counter-based hash of (seed, src, dst,
 *     class, message number): the same messages are lost in every run.  A
 *     lost message still uses the wire; the receiver is told (mode "told")
 *     or not ("silent": its receive must time out).  Class -1 (the control
 *     channel of round-stamped messages) is never dropped;
 *   - two priority levels: each traffic class is "high" (the default) or
 *     "low"; a channel is FIFO per level, and flows share a NIC by weight
 *     (weighted max-min: a high flow gets `weight` times a low one's share;
 *     a very large weight is strict priority).  A sender's NIC holds at
 *     most `low_buffer` bytes of low-priority data waiting or on the wire: a
 *     low message that does not fit is dropped at once (tail drop, it never
 *     uses the wire), told or silent as above.
 * Not modelled: switch buffers and queueing inside the network, congestion
 * control, multiple hosts.
 *
 * The state every rank must agree on (channel queues, flows, the model's
 * time) lives in a POSIX shared-memory segment guarded by a process-shared
 * mutex; any rank may advance the model, which is analytic between events.
 *
 * Like every transport it is called with the engine's progress lock held,
 * the queries below included: the engine reads them under that lock, so a
 * query never races the network's shutdown.
 */
#ifndef PC_NETEM_H
#define PC_NETEM_H

#include "transport/pc_transport.h"

enum { NIC_OUT = 0, NIC_IN = 1 };

/* The emulated network over `wire` (the MPI transport), from its
 * description (one directive per line, as partialcoll/transport/network.py
 * writes it); NULL with err set if it cannot start. */
pc_transport *pc_netem_create(pc_transport *wire, const char *config,
                              char *err, int errlen);
/* The rate of the network in use for a NIC (NIC_OUT, NIC_IN) at time t,
 * and its time zero; -1 when no network is in use. */
int pc_netem_query(int rank, int nic, double t, double *rate, double *t0);
/* Bit c set: the network in use may lose a message of traffic class c (a
 * drop probability on some pair, or a low level's finite buffer); 0
 * without one. */
unsigned pc_netem_lossy(void);
/* The fluid model alone on a private segment, for tests: no MPI, no
 * shared memory (netem_model.c says what it takes and returns). */
double netem_model_probe(const char *config, double t0, double t,
                         const double *msgs, int n, double now, double *out,
                         double *event, char *err, int errlen);

#endif
