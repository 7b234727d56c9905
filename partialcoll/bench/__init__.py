"""Benchmarks, run under mpiexec: ``python -m partialcoll.bench {sweep,overhead}``."""
