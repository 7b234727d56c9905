"""A mistake one rank makes in a collective's setup raises the same error
on every rank, of the kind that rank found: a wrong type on the last rank
only is an :class:`~partialcoll.ArgumentTypeError` (a ``TypeError``) on
every rank, with one message naming the rank and what it passed; a bad
value a :class:`~partialcoll.ScheduleError`.  Before, the other ranks
raised a plain ScheduleError (the agreement carried only the text), or
waited for the rank that had raised alone.  At the running comm size."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.eager import EagerAverager

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
LAST = P - 1


def raised_everywhere(make, kind):
    """Call ``make()`` on every rank; each must raise exactly ``kind``
    (not a subclass, not a base class) with the same message.  Returns
    this rank's exception."""
    with pytest.raises(pc.Error) as info:
        make()
    kinds = COMM.allgather(type(info.value).__name__)
    assert kinds == [kind.__name__] * P, kinds
    messages = COMM.allgather(str(info.value))
    assert all(m == messages[0] for m in messages), messages
    return info.value


def only_last(bad, good):
    return bad if RANK == LAST else good


@pytest.mark.parametrize("make, what", [
    (lambda: pc.SoloAllreduce(np.zeros(3), priority=only_last(2.0, 0)),
     "priority"),
    (lambda: pc.MajorityAllreduce(np.zeros(3), seed=only_last("1", 0)),
     "seed"),
    (lambda: pc.QuorumAllreduce(np.zeros(3), quorum=only_last(1.5, 1)),
     "quorum"),
    (lambda: EagerAverager([((3,), np.float32)],
                           seed=only_last(1.5, 0)), "seed"),
    (lambda: EagerAverager([((3,), np.float32)],
                           mode=only_last(2.5, "solo")), "mode"),
], ids=["solo", "majority", "quorum", "averager-seed", "averager-mode"])
def test_a_wrong_type_on_one_rank_is_a_type_error_on_every_rank(make, what):
    error = raised_everywhere(make, pc.ArgumentTypeError)
    assert isinstance(error, TypeError)
    assert f"rank {LAST}: {what}" in str(error), str(error)
    # the rank that found it keeps its own error as the cause
    assert (error.__cause__ is not None) == (RANK == LAST)
    pc.close_partials(COMM)


def test_a_builtin_type_error_travels_as_partialcolls():
    """A TypeError raised by Python itself (iterating an int) is an
    ArgumentTypeError everywhere, its name kept in the message."""
    error = raised_everywhere(
        lambda: EagerAverager(only_last(5, [((3,), np.float32)])),
        pc.ArgumentTypeError)
    assert f"rank {LAST}: TypeError: 'int' object is not iterable" in \
        str(error)


def test_a_bad_value_on_one_rank_stays_a_value_error():
    error = raised_everywhere(
        lambda: pc.QuorumAllreduce(np.zeros(3), quorum=only_last(P + 1, 1)),
        pc.ScheduleError)
    assert not isinstance(error, TypeError)
    assert f"QuorumAllreduce not created: rank {LAST}: quorum" in str(error)


def test_different_kinds_on_different_ranks_give_their_common_kind():
    """A wrong type on the last rank and a bad value on rank 0: both named,
    raised as ScheduleError, which each rank's own kind is."""
    if P == 1:
        pytest.skip("needs two ranks to differ")
    seed = {0: -1, LAST: 1.5}.get(RANK, 0)
    error = raised_everywhere(
        lambda: pc.MajorityAllreduce(np.zeros(3), seed=seed),
        pc.ScheduleError)
    assert "rank 0: seed" in str(error) and f"rank {LAST}: seed" in \
        str(error), str(error)


def test_the_ranks_go_on_after_a_refusal():
    """Nothing is left half made: the next collective object works."""
    with pytest.raises(pc.ArgumentTypeError):
        pc.SoloAllreduce(np.zeros(2), priority=only_last(0.5, 0))
    ar = pc.QuorumAllreduce(np.zeros(2), quorum=P, comm=COMM)
    assert ar(np.ones(2)).data.tolist() == [P, P]
    ar.close()


def test_torch_wrappers_and_broadcasts_carry_the_kind():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import partialcoll.torch as pct
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    error = raised_everywhere(
        lambda: pct.EagerOptimizer(only_last("sgd", opt),
                                   net.named_parameters()),
        pc.ArgumentTypeError)
    assert f"rank {LAST}: EagerOptimizer wraps a torch.optim.Optimizer, " \
           f"not str" in str(error)
    error = raised_everywhere(
        lambda: pct.EagerHook(only_last(opt, net)), pc.ArgumentTypeError)
    assert f"rank {LAST}: EagerHook takes the DDP model" in str(error)
    error = raised_everywhere(
        lambda: pct.broadcast_parameters(
            only_last([net.weight, 5], list(net.parameters()))),
        pc.ArgumentTypeError)
    assert f"rank {LAST}: [1] is int, not a tensor" in str(error)
    error = raised_everywhere(
        lambda: pct.broadcast_object("x", root_rank=only_last("0", 0)),
        pc.ArgumentTypeError)
    assert f"rank {LAST}: root_rank must be an int, not '0'" in str(error)
    COMM.Barrier()
