"""Benchmarks, run under mpiexec: ``partialcoll-bench COMMAND`` (or
``python -m partialcoll.bench COMMAND``); ``--help`` lists the commands."""
