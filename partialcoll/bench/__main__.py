"""``partialcoll-bench COMMAND [options]`` (or ``python -m
partialcoll.bench``): partialcoll's benchmarks, run under mpiexec.

One argparse parser with a subparser per benchmark, so ``--help`` lists every
command with a line about it and ``partialcoll-bench COMMAND --help`` shows
that benchmark's options (each module's ``add_args``) and its description
(the module docstring).
"""
import importlib
import logging
import sys

from ..core.failfast import abort_on_error
from ._common import HelpFormatter, Parser, plain, versions_line
from . import (allreduce, aware, breakdown, cnn, failure, hyperplane,
               latency,
               lstm,
               mlfabric,
               mlfabric_replica, mlfabric_retarget,
               mlfabric_sched, netcal, overhead, overlap, rps, sweep, tictac,
               tictac_allreduce)

#: name -> (module, one line for the top-level --help)
COMMANDS = {
    "allreduce": (allreduce, "allreduce latency and bandwidth over message "
                             "sizes, OSU and nccl-tests style: MPI, "
                             "partialcoll and the partial collectives"),
    "latency": (latency, "the eager-SGD paper's latency experiment: "
                         "MPI_Allreduce, allreduce, majority, quorum, solo "
                         "under skew"),
    "breakdown": (breakdown, "one partial round, stage by stage, with "
                             "the timeline: where its time goes"),
    "failure": (failure, "a rank dies mid-run (Open MPI's fault-tolerance "
                         "extensions): time until every survivor knows"),
    "sweep": (sweep, "message-size sweep of allreduce against "
                     "MPI_Allreduce"),
    "overhead": (overhead, "executor costs: per op, post-to-completion, "
                           "progress-thread CPU, scale"),
    "hyperplane": (hyperplane, "hyperplane regression with an injected "
                               "delay (the paper's Figure 10)"),
    "cnn": (cnn, "eager-SGD on a small CNN against DDP over gloo, on the "
                 "GPU or the CPU: steps/s and the replicas after flush "
                 "(needs torch, scikit-learn)"),
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
    "mlfabric-replica": (mlfabric_replica, "MLfabric's replica against "
                                           "checkpointing: data to the "
                                           "replica and throughput by "
                                           "Div_max"),
    "mlfabric-retarget": (mlfabric_retarget, "speed-ups over ring read "
                                             "again from saved loss curves "
                                             "(one process)"),
}


#: name -> the optional packages (import name, pip requirement) it needs,
#: checked on every rank before it runs anything
NEEDS = {
    "cnn": [("torch", "partialcoll[torch]"),
            ("sklearn", "partialcoll[bench]")],
    "lstm": [("torch", "partialcoll[torch]")],
    "rps": [("sklearn", "partialcoll[bench]")],
    "tictac": [("torch", "partialcoll[torch]"),
               ("torchvision", "partialcoll[vision]")],
    "tictac-allreduce": [("torch", "partialcoll[torch]"),
                         ("torchvision", "partialcoll[vision]")],
    "overlap": [("torch", "partialcoll[torch]")],
}


def require(needs, command):
    """Import each of ``needs`` ((module, pip requirement) pairs) here, on
    this rank, before any collective: a missing one raises ImportError
    naming the command and what to install, and the fail-fast hook ends
    the whole job rather than leave the other ranks waiting."""
    for module, requirement in needs:
        try:
            if module == "torchvision":    # its models, even where its
                from ..tictac.graphs import torchvision_models  # operators
                torchvision_models()       # do not load (see there)
            else:
                importlib.import_module(module)
        except ImportError as e:
            raise ImportError(f"partialcoll-bench {command} needs {module} "
                              f"({e}): pip install '{requirement}'") from e


def build_parser():
    """The ``partialcoll-bench`` parser: a subparser per entry of
    ``COMMANDS``, its options from the module's ``add_args`` and its
    ``run`` as the ``run`` default."""
    parser = Parser(
        prog="partialcoll-bench",
        description="partialcoll's benchmarks. Run them under mpiexec, e.g. "
                    "'mpiexec -n 8 partialcoll-bench latency'; "
                    "'partialcoll-bench COMMAND --help' shows a command's "
                    "options.")
    parser.add_argument("--version", action="version",
                        version=versions_line())
    commands = parser.add_subparsers(title="commands", dest="command",
                                     metavar="COMMAND", required=True)
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(
            name, help=summary, description=plain(module.__doc__),
            formatter_class=HelpFormatter)
        module.add_args(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None):
    # the library's warnings, on every rank that has one (facts every rank
    # shares are said by rank 0 only); the benchmarks inject the lateness
    # they measure and report it in their tables, so the straggler warning
    # would only repeat it
    abort_on_error()      # a rank that fails ends the job, none waits
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("partialcoll.stragglers").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    require(NEEDS.get(args.command, ()), args.command)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
