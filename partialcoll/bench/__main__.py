"""``partialcoll-bench {latency,sweep,overhead,hyperplane,lstm}`` (or ``python -m
partialcoll.bench``), run under mpiexec."""
import sys

from . import (aware, hyperplane, latency, lstm, netcal, overhead, overlap,
               rps, sweep, tictac, tictac_allreduce)

COMMANDS = {"latency": latency, "sweep": sweep, "overhead": overhead,
            "hyperplane": hyperplane, "lstm": lstm, "netcal": netcal,
            "rps": rps, "aware": aware, "tictac": tictac,
            "tictac-allreduce": tictac_allreduce, "overlap": overlap}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        print("commands: " + ", ".join(COMMANDS), file=sys.stderr)
        return 2
    COMMANDS[argv[0]].main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
