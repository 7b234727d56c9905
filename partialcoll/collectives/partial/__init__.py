"""Partial allreduce: solo, majority and quorum(k), the eager-SGD paper's
partial collectives.

* :mod:`.handles` -- the objects users hold (:class:`SoloAllreduce`,
  :class:`MajorityAllreduce`, :class:`QuorumAllreduce`);
* :mod:`.forms` -- the function forms (``solo_allreduce(x)`` ...) and the
  collective flush and close of every object on a communicator;
* :mod:`.rounds` -- an object's state and protocol (deposits, rounds,
  synchronous rounds, lifetime), :mod:`.kinds` who may start a round;
* :mod:`.schedule` -- the persistent schedule a round runs;
* :mod:`.stragglers` -- the straggler report; :mod:`.result` --
  :class:`PartialResult`.
"""
from .forms import (close_partials, flush_partials, majority_allreduce,
                    partials, quorum_allreduce, solo_allreduce)
from .handles import (MajorityAllreduce, PartialAllreduce, QuorumAllreduce,
                      SoloAllreduce)
from .kinds import designated
from .result import PartialResult
from .schedule import tag_block_size

__all__ = ["SoloAllreduce", "MajorityAllreduce", "QuorumAllreduce",
           "PartialAllreduce", "PartialResult", "solo_allreduce",
           "majority_allreduce", "quorum_allreduce", "flush_partials",
           "close_partials", "partials", "designated", "tag_block_size"]
