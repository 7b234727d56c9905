"""An mpi4py program that sums a vector over the ranks with partialcoll's
solo allreduce, while one rank is slow.

    mpiexec -n 4 python examples/solo_allreduce_mpi4py.py --steps 20

A solo round starts as soon as the first rank calls, so the fast ranks never
wait for the slow one; the slow rank's data is not lost but carried into a
later round.  The program checks the library's promise: what a rank receives
over all its calls plus the final flush is the sum of every contribution of
every rank, exactly once.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=1000,
                        help="elements in the vector (default 1000)")
    parser.add_argument("--slow-rank", type=int, default=None,
                        help="the rank that sleeps before every call "
                             "(default: the last one)")
    parser.add_argument("--delay-ms", type=float, default=5.0,
                        help="how long it sleeps (default 5 ms)")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    slow = size - 1 if args.slow_rank is None else args.slow_rank
    if not 0 <= slow < size:
        parser.error(f"--slow-rank must be in 0..{size - 1}")

    received = np.zeros(args.size)          # everything this rank got back
    for step in range(args.steps):
        if rank == slow:
            time.sleep(args.delay_ms / 1000)    # a straggler
        # this rank's contribution: small integers, so the sums are exact
        x = np.full(args.size, float(rank + 1 + step))
        # collective, like comm.Allreduce: every rank calls it every step.
        # The first call creates one persistent SoloAllreduce for this
        # (communicator, shape, dtype, op); later calls reuse it.
        res = pc.solo_allreduce(x)
        received += res.data
        if rank == 0 and step < 3:
            # data: the sum of the rounds this call returns; included: is
            # this call's x in it; round: the last round it covers; rounds:
            # how many rounds it combines (a rank that was late gets every
            # round it missed at once); active: the ranks whose *fresh* data
            # made that round (the paper's NAP); sync: a synchronous round
            print(f"step {step}: data[0]={res.data[0]:g} "
                  f"included={res.included} round={res.round} "
                  f"rounds={res.rounds} active={res.active}/{size} "
                  f"sync={res.sync}", flush=True)

    # Collective: one synchronous round on every open partial object of
    # comm, returning what is still pending (contributions carried past the
    # last round).  Call it before any other collective on these ranks: a
    # rank may still be waiting for the others.  Apply what it returns, or
    # that data is lost.
    for label, res in pc.flush_partials(comm):
        received += res.data

    # The exactly-once promise, checked against a plain MPI reduction.
    mine = sum(float(rank + 1 + s) for s in range(args.steps))
    expected = comm.allreduce(mine) * np.ones(args.size)
    ok = comm.allreduce(bool(np.array_equal(received, expected)), op=MPI.LAND)
    if rank == 0:
        print(f"{size} ranks, {args.steps} steps, rank {slow} slow: every "
              f"contribution received exactly once: {ok}", flush=True)

    # Collective: close the function forms' objects (a final synchronous
    # round; nothing is pending after the flush).  At exit partialcoll
    # would close them too, but closing here is explicit and free.
    pc.close_partials(comm)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
