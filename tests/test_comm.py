"""Library state per user communicator: identity, sharing, freeing."""
import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc
from partialcoll.core import libcomm

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
    got = sum(pc.solo_allreduce(np.ones(2), comm=sub2).data for _ in range(5))
    got += sum(res.data for _, res in pc.close_partials(sub2))
    assert (got == 5 * sub2.size).all(), (got, sub2.size)
    sub2.Free()


def test_duplicates_are_freed_with_the_user_communicator():
    before = libcomm.live_duplicates()
    sub = COMM.Split(RANK % 2, RANK)
    pc.allreduce(np.ones(4), comm=sub)
    pc.solo_allreduce(np.ones(4), comm=sub)
    pc.majority_allreduce(np.ones(4), comm=sub)
    assert libcomm.live_duplicates() > before
    sub.Free()                     # closes the function forms collectively
    assert libcomm.live_duplicates() == before
    assert all(lc.attached or lc.refs > 0 for lc in libcomm.live())


def rss_kib():
    import resource
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


KINDS = [(pc.SoloAllreduce, {}), (pc.MajorityAllreduce, {"seed": 1}),
         (pc.QuorumAllreduce, {"quorum": 1})]


def test_objects_share_two_duplicates_and_give_their_tags_back():
    tags = libcomm.library_comm(COMM).tags     # made on first use
    before = libcomm.live_duplicates()
    held, blocks = tags.held, tags.blocks
    objs = [cls(np.zeros(3), **kw) for _ in range(10) for cls, kw in KINDS]
    assert libcomm.live_duplicates() == before
    assert tags.blocks == blocks + len(objs)
    ranges = sorted((ar._rounds._tag0, ar._rounds._tag0 + ar._rounds._ntags)
                    for ar in objs)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    assert ranges[-1][1] <= tags.one_shot_lo
    res = objs[0](np.ones(3))            # solo: this rank starts a round
    final = objs[0].close()
    for ar in objs[1:]:
        ar.close()
    assert (res.data + final.data == P).all()
    assert (tags.held, tags.blocks) == (held, blocks)
    assert libcomm.live_duplicates() == before


@pytest.mark.max_ranks(4)
def test_create_and_close_in_sequence_stays_flat():
    """10,000 in sequence were checked by hand; here enough to see a leak of
    a communicator, a tag block or a few KiB per object."""
    tags = libcomm.library_comm(COMM).tags
    before = libcomm.live_duplicates()

    def cycle(n):
        for i in range(n):
            cls, kw = KINDS[i % 3]
            cls(np.zeros(4), **kw).close()

    cycle(40)
    held, rss = tags.held, rss_kib()
    cycle(200)
    assert tags.held == held and libcomm.live_duplicates() == before
    grown = rss_kib() - rss
    assert grown < 2048, f"RSS grew by {grown} KiB over 200 objects"
