"""MLfabric over MPI: the parameter server, its workers and replica, and
MLfabric's allreduce, on the executor and the emulated network.  The
modules are imported on first use (see :mod:`partialcoll.mlfabric`)."""
