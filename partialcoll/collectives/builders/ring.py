"""The ring: bandwidth optimal for any P (each rank sends 2 (P - 1) / P
of the vector), for large messages."""
import numpy as np


def build_ring(s, ctx):
    """Append a ring reduce-scatter and a ring allgather to schedule ``s``
    (see :class:`~partialcoll.collectives.context.BuildContext`).

    The vector is cut into P chunks.  In reduce-scatter step t, rank r sends
    chunk (r - t) to r + 1 and adds chunk (r - t - 1) received from r - 1;
    after P - 1 steps rank r owns the full sum of chunk (r + 1).  The
    allgather passes finished chunks around the ring for P - 1 more steps::

        P = 3, chunk owned after reduce-scatter:  r0: c1  r1: c2  r2: c0
        step   0          1
        r0     send c0    send c2      (then allgather c1, c0)
        r1     send c1    send c0
        r2     send c2    send c1

    Received chunks land in two alternating halves of ``tmp``.  Tags
    ``tag0 .. tag0 + 2P - 3``.
    """
    size, rank, recv, tmp, tag0 = ctx.size, ctx.rank, ctx.recv, ctx.tmp, \
        ctx.tag0
    n = recv.size
    counts = [n // size + (1 if i < n % size else 0) for i in range(size)]
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    half = max(counts)
    chunk = [recv[offs[i]:offs[i + 1]] for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    init = ctx.start(s)
    reds, snds = [], []
    for t in range(size - 1):
        sc, rc = (rank - t) % size, (rank - t - 1) % size
        buf = tmp[(t % 2) * half:(t % 2) * half + counts[rc]]
        snds.append(s.send(chunk[sc], right, tag=tag0 + t,
                           after=reds[-1:] or init))
        rcv = s.recv(buf, left, tag=tag0 + t, after=reds[-2:-1] or ctx.after)
        reds.append(s.reduce(chunk[rc], buf, ctx.op, after=[rcv] + init))
    last = reds[-1:]
    for t in range(size - 1):
        sc, rc = (rank + 1 - t) % size, (rank - t) % size
        s.send(chunk[sc], right, tag=tag0 + size - 1 + t, after=last)
        last = [s.recv(chunk[rc], left, tag=tag0 + size - 1 + t,
                       after=[reds[-1], snds[t]] + last)]
