"""Library state per user communicator: identity, sharing, freeing."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll import _comm

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank


def test_split_free_split_gives_the_new_groups_sums():
    """MPICH reuses a freed communicator's handle: nothing cached for the
    freed 2-rank groups may serve the new 4-rank groups."""
    sub = COMM.Split(RANK // 2, RANK)
    assert (pc.allreduce(np.ones(3), np.empty(3), comm=sub) == sub.size).all()
    assert (pc.allreduce(np.ones(3), comm=sub) == sub.size).all()
    sub.Free()
    sub2 = COMM.Split(RANK // 4, RANK)
    for _ in range(2):                    # the cached fast path, then again
        got = pc.allreduce(np.ones(3), np.empty(3), comm=sub2)
        assert (got == sub2.size).all(), (got, sub2.size)
    assert (pc.allreduce(np.ones(3), comm=sub2) == sub2.size).all()
    sub2.Free()


def test_split_free_split_function_forms_follow_the_new_group():
    sub = COMM.Split(RANK // 2, RANK)
    pc.solo_allreduce(np.ones(2), comm=sub)
    sub.Free()
    sub2 = COMM.Split(RANK // 4, RANK)
    pc.solo_allreduce(np.ones(2), comm=sub2)
    forms = _comm.find(sub2).cache["partial.forms"]
    assert [ar.size for ar in forms.values()] == [sub2.size]
    sub2.Free()


def test_duplicates_are_freed_with_the_user_communicator():
    before = _comm.live_duplicates()
    sub = COMM.Split(RANK % 2, RANK)
    pc.allreduce(np.ones(4), comm=sub)
    pc.solo_allreduce(np.ones(4), comm=sub)
    pc.majority_allreduce(np.ones(4), comm=sub)
    assert _comm.live_duplicates() > before
    sub.Free()                     # closes the function forms collectively
    assert _comm.live_duplicates() == before
    assert all(lc.attached or lc.refs > 0 for lc in _comm.live())
