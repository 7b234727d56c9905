"""The allreduce algorithms as builders: each only appends operations to a
:class:`~partialcoll.Schedule`, given a
:class:`~partialcoll.collectives.context.BuildContext` (libNBC's
``allred_sched_*``).  The reduced vector ends in ``recv`` on every rank,
bit-identical across ranks (every combining step computes ``a op b`` on
one side and ``b op a`` on the other, and the ops are commutative
elementwise).  :mod:`..algorithm` chooses among them; the full allreduce
(:mod:`..pool`) and the partial collectives build them into their
schedules."""
from .rabenseifner import build_rabenseifner
from .recursive_doubling import build_recursive_doubling
from .ring import build_ring

BUILDERS = {"recursive_doubling": build_recursive_doubling,
            "ring": build_ring, "rabenseifner": build_rabenseifner}

__all__ = ["BUILDERS", "build_rabenseifner", "build_recursive_doubling",
           "build_ring"]
