"""``partialcoll-bench COMMAND [options]`` (or ``python -m
partialcoll.bench``): partialcoll's benchmarks, run under mpiexec.

One argparse parser with a subparser per benchmark, so ``--help`` lists every
command with a line about it and ``partialcoll-bench COMMAND --help`` shows
that benchmark's options (each module's ``add_args``) and its description
(the module docstring).
"""
import argparse
import re
import sys

from . import (aware, hyperplane, latency, lstm, mlfabric, mlfabric_retarget,
               mlfabric_sched, netcal, overhead, overlap, rps, sweep, tictac,
               tictac_allreduce)

#: name -> (module, one line for the top-level --help)
COMMANDS = {
    "latency": (latency, "the eager-SGD paper's latency experiment: "
                         "MPI_Allreduce, allreduce, majority, quorum, solo "
                         "under skew"),
    "sweep": (sweep, "message-size sweep of allreduce against "
                     "MPI_Allreduce"),
    "overhead": (overhead, "executor costs: per op, post-to-completion, "
                           "progress-thread CPU, scale"),
    "hyperplane": (hyperplane, "hyperplane regression with an injected "
                               "delay (the paper's Figure 10)"),
    "lstm": (lstm, "LSTM over sequences of uneven length: inherent load "
                   "imbalance (needs torch)"),
    "netcal": (netcal, "calibrate the emulated network against its model"),
    "rps": (rps, "RPS: training over a network that loses messages "
                 "(needs scikit-learn)"),
    "aware": (aware, "network-aware parameter-server load balancing on "
                     "uneven links"),
    "tictac": (tictac, "TicTac's transfer orders for a parameter server "
                       "(needs torch, torchvision)"),
    "tictac-allreduce": (tictac_allreduce, "TicTac's priorities for "
                                           "bucketed allreduce (needs torch, "
                                           "torchvision)"),
    "mlfabric-sched": (mlfabric_sched, "MLfabric's scheduler time per "
                                       "batch (one process)"),
    "overlap": (overlap, "step time of the eager optimizer with and "
                         "without overlap with backward (needs torch)"),
    "mlfabric": (mlfabric, "MLfabric against asynchronous PS, ring and tree "
                           "allreduce under stragglers and uneven links"),
    "mlfabric-retarget": (mlfabric_retarget, "speed-ups over ring read "
                                             "again from saved loss curves "
                                             "(one process)"),
}


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?: <[^>]*>)?`")


def plain(text):
    """A module docstring as a command's description: Sphinx roles
    (``:func:`~.mod.name```) as plain names, for a terminal."""
    def name(m):
        target = m.group(1)
        return "``" + (target.rsplit(".", 1)[-1] if m.group(0)[m.group(0)
                       .index("`") + 1] == "~" else target.lstrip(".")) + "``"
    return _ROLE.sub(name, text or "")


def build_parser():
    """The ``partialcoll-bench`` parser: a subparser per entry of
    ``COMMANDS``, its options from the module's ``add_args`` and its
    ``run`` as the ``run`` default."""
    parser = argparse.ArgumentParser(
        prog="partialcoll-bench",
        description="partialcoll's benchmarks. Run them under mpiexec, e.g. "
                    "'mpiexec -n 8 partialcoll-bench latency'; "
                    "'partialcoll-bench COMMAND --help' shows a command's "
                    "options.")
    commands = parser.add_subparsers(title="commands", dest="command",
                                     metavar="COMMAND", required=True)
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(
            name, help=summary, description=plain(module.__doc__),
            formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_args(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
