"""One clock for the ranks of a communicator: each rank's offset to the
clock of a reference rank, estimated by ping-pong (Cristian's method).

The executor's clock (:func:`partialcoll.now`, CLOCK_MONOTONIC) counts
from an arbitrary point per host.  The processes of one host share it; two
hosts' readings can be days apart.  So a time that one rank hands another
(a start time, an arrival reported to a planner, a timeline event) is
meaningless on the receiver's clock as it stands.  Times cross ranks on
the reference clock instead, rank 0's of the communicator: the sender
converts its local time with :meth:`Clock.to_reference`, the receiver
converts it back to its own with :meth:`Clock.to_local`.

The estimate (collective; :func:`of` makes it at first use per
communicator, :func:`reestimate` again on demand).  The reference serves
one rank at a time, ``exchanges`` round trips each::

    reference (rank 0)                      rank r
    t_send = now()   -- ping (k left) -->
                     <-- reply ---------    T = now()
    t_recv = now()

    offset_r = T - (t_send + t_recv) / 2      (rank r's clock minus rank 0's)
    error_r  = (t_recv - t_send) / 2          (of the smallest round trip)

Rank r read T at some instant between t_send and t_recv of the
reference's clock, whatever the two messages' delays, so the true offset
lies within error_r of the estimate; the smallest round trip gives the
tightest bound.  An offset within its error of zero is taken as zero (the
processes of one host convert times unchanged), and its error grows by
what was rounded away, so the bound still holds.  The reference then
broadcasts every rank's (offset, error).  Cost: about ``exchanges`` x
(P - 1) round trips, well under a millisecond on one host.

Messages: the exchanges run on a duplicate of the communicator made for
the estimate and freed after it, so no message of the library or of the
program can match theirs, and every ping is answered before the free.
Each ping says how many follow, so a rank answers exactly what the
reference sends.

The bound holds when the estimate is made.  The clocks of two hosts also
run at slightly different rates (parts per million; at 10 ppm they part
by 36 ms an hour), which the bound does not cover: re-estimate
(:func:`reestimate`, collective) in a long run that needs times tighter
than that.
"""
from __future__ import annotations

import logging
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from . import control, libcomm
from .checks import check_comm, check_int
from .engine import now
from .errors import PartialcollError

log = logging.getLogger("partialcoll")

#: the rank of a communicator whose clock is the reference
REFERENCE = 0
#: round trips per rank in one estimate (the smallest one counts)
EXCHANGES = 8
#: where :func:`of` keeps a communicator's estimate (``LibraryComm.cache``)
CACHE_KEY = "clock"
_PING, _REPLY = 1, 2

#: a time, or an array of times (converted element by element)
Times = TypeVar("Times", float, npt.NDArray[np.float64])


class Clock:
    """This rank's estimate of its clock's offset to a communicator's
    reference clock (rank 0's), made by :func:`estimate`.

    Attributes:
        rank, reference: this rank and the reference rank (0).
        offset: this rank's clock minus the reference's, in seconds (0 on
            the reference, and between processes that share a clock).
        error: a bound on how far the true offset was from ``offset`` when
            it was estimated, in seconds: half the round trip of the
            exchange it came from (0 on the reference).
        offsets, errors: every rank's ``offset`` and ``error``, by rank.
        estimated_at: when it was estimated, on this rank's clock.
    """

    rank: int
    reference: int
    offset: float
    error: float
    offsets: list[float]
    errors: list[float]
    estimated_at: float

    def __init__(self, rank: int, offsets: list[float],
                 errors: list[float], estimated_at: float,
                 reference: int = REFERENCE) -> None:
        self.rank, self.reference = rank, reference
        self.offsets, self.errors = list(offsets), list(errors)
        self.offset, self.error = self.offsets[rank], self.errors[rank]
        self.estimated_at = estimated_at

    def to_reference(self, t: Times) -> Times:
        """A time (or an array of times) on this rank's clock, as the
        reference clock reads it: what to send to another rank."""
        return t - self.offset

    def to_local(self, t: Times) -> Times:
        """A time (or array) on the reference clock, on this rank's clock:
        what to do with a time another rank sent."""
        return t + self.offset

    def reference_now(self) -> float:
        """The reference clock's time now, by this rank's estimate."""
        return now() - self.offset

    def age(self) -> float:
        """Seconds since the estimate (this rank's clock)."""
        return now() - self.estimated_at

    def __repr__(self) -> str:
        return (f"Clock(rank={self.rank}, offset={self.offset:.9g} s, "
                f"error={self.error:.3g} s)")


def estimate(comm: MPI.Comm | None = None,
             exchanges: int = EXCHANGES) -> Clock:
    """Collective over ``comm`` (default COMM_WORLD): estimate every rank's
    clock offset to rank 0's (see the module docstring).  Not cached: use
    :func:`of` where the estimate of a communicator may be shared.

    Args:
        comm: an mpi4py intracommunicator.
        exchanges: round trips per rank; the smallest one counts.  Only
            rank 0's value is used.
    Returns this rank's :class:`Clock`.

    Example::

        clock = estimate(comm)
        t = comm.bcast(clock.to_reference(pc.now() + 0.01), root=0)
        start = clock.to_local(t)     # the same instant on every rank
    """
    comm = check_comm(comm)
    size, rank = comm.Get_size(), comm.Get_rank()
    problem = None
    try:
        exchanges = check_int(exchanges, "exchanges", 1)
    except PartialcollError as e:
        problem = e
    if size == 1:
        if problem is not None:
            raise problem
        return Clock(0, [0.0], [0.0], now())
    # the same error on every rank, not a rank gone while the others wait
    control.gather_checked(comm, "clock.estimate()", None, problem)
    dup = comm.Dup()
    try:
        table = np.zeros((2, size))          # offsets, errors
        if rank == REFERENCE:
            for peer in range(size):
                if peer != REFERENCE:
                    table[:, peer] = _ping(dup, peer, exchanges)
        else:
            _answer(dup)
        control.wait_for(dup.Ibcast(table, root=REFERENCE))
        control.settle()
    finally:
        dup.Free()
    clock = Clock(rank, table[0].tolist(), table[1].tolist(), now())
    log.debug("clock of rank %d: %.9g s from rank %d's, error %.3g s",
              rank, clock.offset, REFERENCE, clock.error)
    return clock


def _ping(dup, peer, exchanges):
    """The reference's side with ``peer``: (offset, error) of the exchange
    with the smallest round trip."""
    ping, reply = np.zeros(1), np.zeros(1)
    best_rtt, best = np.inf, 0.0
    for k in range(exchanges):
        ping[0] = exchanges - 1 - k          # pings still to come
        t_send = now()
        dup.Send(ping, peer, _PING)
        dup.Recv(reply, peer, _REPLY)
        t_recv = now()
        if t_recv - t_send < best_rtt:
            best_rtt = t_recv - t_send
            best = float(reply[0]) - (t_send + t_recv) / 2
    error = best_rtt / 2
    if abs(best) <= error:
        # taken as zero (processes of one host convert times unchanged);
        # the bound grows by what was rounded away, so it still holds
        return 0.0, error + abs(best)
    return best, error


def _answer(dup):
    """A non-reference rank's side: answer every ping with this rank's
    clock.  The first may come only after the reference served the ranks
    before this one: waited for asleep (ranks waiting their turn must not
    take the CPU from the two that are exchanging); the rest at once."""
    ping, reply = np.zeros(1), np.zeros(1)
    control.wait_for(dup.Irecv(ping, REFERENCE, _PING), longest=0.0005)
    while True:
        reply[0] = now()
        dup.Send(reply, REFERENCE, _REPLY)
        if ping[0] <= 0:
            return
        dup.Recv(ping, REFERENCE, _PING)


def of(comm: MPI.Comm | None = None) -> Clock:
    """This rank's :class:`Clock` for ``comm`` (default COMM_WORLD): the
    estimate kept for the communicator, made on first use (then
    collective, as :func:`estimate`)."""
    comm = check_comm(comm)
    lc = libcomm.library_comm(comm)
    clock = lc.cache.get(CACHE_KEY)
    if clock is None:
        clock = lc.cache[CACHE_KEY] = estimate(comm)
    return clock


def reestimate(comm: MPI.Comm | None = None,
               exchanges: int = EXCHANGES) -> Clock:
    """Collective: estimate ``comm``'s clock offsets again and keep the
    new estimate for :func:`of`; returns it."""
    comm = check_comm(comm)
    clock = estimate(comm, exchanges)
    libcomm.library_comm(comm).cache[CACHE_KEY] = clock
    return clock
