"""Network-aware load distribution for parameter servers over heterogeneous
links: :mod:`.plan` (the algorithms, no MPI) and ``allreduce``
(:class:`partialcoll.LoadBalancedAllreduce`, which measures the links and
runs plans as schedules)."""
