/*
 * pc_transport.h -- the narrow interface between the executor and the wire.
 *
 * The executor (engine/) hands a transport whole messages (pc_msg) and gets
 * back completions (pc_done); it never sees an MPI_Request, and a transport
 * never sees a schedule: this part includes only common/.  Two transports:
 *
 *   mpi    (transport_mpi.c) MPI_Isend/MPI_Irecv.  Every outstanding
 *          request of the process lives in one table, tested with one
 *          MPI_Testsome per poll, so the cost of a poll follows the number
 *          of messages in flight, not the number of schedules.
 *   netem  (netem*.c, pc_netem.h) an emulated network for one host: NIC
 *          rates shared fairly between concurrent flows, per-pair latency,
 *          seeded drops.  It decides when a message arrives and hands it
 *          to the mpi transport at that moment, the arrival time in a
 *          header.
 *
 * Contract, for every transport:
 *   - start() never blocks.  A receive can be cancelled (cancel_recv); a send
 *     never is: it completes, or the engine keeps its buffer alive until it
 *     does (MPI-4 deprecates cancelling sends, and MPICH crashes on it).
 *   - poll() tests everything once and returns the completions in an array
 *     owned by the transport, valid until the next poll().  Dispatching a
 *     completion may start new messages.
 *   - next_poll() is the absolute time (pc_now()) by which the transport
 *     needs poll() again even if nothing else happens (an emulated message
 *     due for delivery); HUGE_VAL when it waits only on the network.
 *   - A receive's completion may carry an arrival time (pc_done.t_arrive):
 *     when the message's last byte reached this rank by the transport's own
 *     account, as a NIC's hardware receive timestamp would give it; 0 when
 *     the transport has none (mpi: the engine's completion time stands in).
 *   - Everything is called with the engine's progress lock held: transports
 *     need no locking of their own.
 */
#ifndef PC_TRANSPORT_H
#define PC_TRANSPORT_H

#include <mpi.h>
#include <stdint.h>

#include "common/pc_common.h"

/* How a message ended, as the receiver sees it. */
enum {
    PC_MSG_DELIVERED = 1,   /* the data arrived */
    PC_MSG_DROPPED = 2,     /* lost, and the network said so */
    PC_MSG_SWALLOWED = 3,   /* lost silently: the receive must time out */
};

typedef struct {
    int send;               /* 1: send, 0: receive */
    void *buf;
    int count;              /* elements of dt */
    MPI_Datatype dt;
    int64_t bytes;          /* count * size of dt */
    int peer, tag;          /* ranks and tags of comm */
    int wpeer;              /* peer's rank in MPI_COMM_WORLD (netem) */
    MPI_Comm comm;
    int tclass;             /* traffic class (pc_common.h), -1: control */
    void *owner;            /* completion cookie: who ... */
    int64_t cookie;         /* ... and which of its messages */
    /* for the timeline only (pc_tl_msg); opaque to transports */
    uint64_t trace_sched, trace_round;
    int trace_op, prio;
    int space;              /* PC_HOST or PC_DEVICE: where buf lives */
} pc_msg;

typedef struct {
    void *owner;
    int64_t cookie;
    int send;
    int outcome;            /* PC_MSG_* */
    int64_t bytes;          /* received bytes */
    int source;             /* sender's rank (receives) */
    int mpi_error;          /* MPI_SUCCESS, or the request's error */
    double t_arrive;        /* receives: arrival (pc_now() clock), 0: none */
    double t_wire;          /* receives: the message's first byte on the
                               sender's wire (pc_now() clock), 0: none */
} pc_done;

typedef struct pc_transport pc_transport;
struct pc_transport {
    const char *name;
    int (*start)(pc_transport *tp, const pc_msg *m, int64_t *handle);
    int (*poll)(pc_transport *tp, pc_done **out, int *n);
    /* 1: cancelled before anything matched it; 0: it had completed, *d
     * says how (the completion is not reported by poll() again). */
    int (*cancel_recv)(pc_transport *tp, int64_t handle, pc_done *d);
    double (*next_poll)(pc_transport *tp);
    int (*outstanding)(pc_transport *tp);   /* messages not yet completed */
    void (*shutdown)(pc_transport *tp);
    /* Let the network library move what it still holds, with nothing of
     * ours outstanding to test.  Under weak progress a send can complete
     * before its bytes leave the process (MPICH over OFI's TCP provider
     * writes them to the socket only inside a later MPI call): a process
     * that then blocks outside MPI (a gloo collective, a socket) would
     * keep its peers waiting for ever.  The engine nudges for a moment
     * after the library's own blocking exchanges (pc_engine_settle). */
    void (*nudge)(pc_transport *tp);
    /* 1: a send may complete only once its receiver has posted the
     * receive (MPI's rendezvous), so a send in flight may wait on the
     * receiver's schedule; 0: sends complete when the wire delivered them */
    int sends_wait;
    /* Empty sweeps a blocked caller spends yielding its core before it
     * sleeps.  Long (mpi: 2000) where a message ends within microseconds
     * of being polled for and a sleeping waiter would slow it (MPICH moves
     * a large message in pieces, each needing both processes to poll);
     * short (netem: 64) where the transport paces deliveries itself, most
     * waits last as long as an emulated transfer (milliseconds), and the
     * yields would only take CPU from the ranks sharing the host. */
    int wait_yields;
};

/* The MPI transport (one per process). */
pc_transport *pc_transport_mpi(void);

/* ---- a rank that fails (MPI's fault-tolerance extensions, ULFM: Open MPI
 * started with --with-ft ulfm).  Without them a failure ends the job and
 * none of this is reached. */

/* 1 when the MPI error `code` says that a peer failed or that the
 * communicator was revoked. */
int pc_transport_is_failure(int code);
/* Revoke comm: every rank's pending and later operations on it fail with
 * a revoked error, so no survivor waits for a message that will not come.
 * Nothing without the extensions. */
void pc_transport_revoke(MPI_Comm comm);
/* The ranks of comm known to have failed, in order: up to max of them in
 * out; returns how many there are (0 without the extensions). */
int pc_transport_failed_ranks(MPI_Comm comm, int *out, int max);

/* Requests that survive a failure.  With the extensions, when MPI_Test*
 * finds a request in error, Open MPI frees every request of the array
 * whose status holds an error, persistent ones excepted, even one still
 * in flight: the extensions mark a send on a revoked communicator failed
 * while its rendezvous with a living peer goes on.  When that message's
 * last fragment comes back, Open MPI ends the job ("Send error after
 * request freed").  So while the extensions are in use (Open MPI started
 * with --with-ft ulfm) every request here is persistent (MPI_Send_init or
 * MPI_Recv_init, then MPI_Start), and one that ended in error is never
 * freed: it is MPI's for ever, and so is its buffer (a few per failure).
 * Otherwise: MPI_Isend and MPI_Irecv. */
int pc_transport_isend(const void *buf, int count, MPI_Datatype dt, int peer,
                       int tag, MPI_Comm comm, MPI_Request *req);
/* After MPI_Test* or MPI_Wait reported *req complete with MPI error err
 * (a request of the MPI transport or of pc_transport_isend): frees it if
 * it is persistent and ended well.  Returns 1 when it ended in error
 * while the extensions are in use (keep its buffer for ever), else 0. */
int pc_transport_request_done(MPI_Request *req, int err);

#endif
