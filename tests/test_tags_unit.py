"""The tag space of a library communicator, without MPI traffic."""
import pytest

from partialcoll import ScheduleError
from partialcoll.core.tags import TagSpace
from partialcoll.collectives.partial import tag_block_size


def test_blocks_are_disjoint_reused_and_below_the_one_shot_region():
    tags = TagSpace(32767, 8)
    n = tag_block_size(8)
    bases = [tags.block(n) for _ in range(10)]
    assert bases == [i * n for i in range(10)]
    tags.give_back(bases[3], n)
    tags.give_back(bases[4], n)          # merged with the block before
    assert tags.block(2 * n) == bases[3]
    assert tags.held == 10 * n and tags.blocks == 9
    for b in bases[:3] + bases[5:]:
        tags.give_back(b, n)
    tags.give_back(bases[3], 2 * n)
    assert tags.held == 0 and tags._free == [[0, tags.one_shot_lo]]


def test_one_shot_calls_rotate_above_the_blocks():
    tags = TagSpace(32767, 4)
    seen = [tags.one_shot(10) for _ in range(2000)]
    assert min(seen) == tags.one_shot_lo == 32767 - 32767 // 4
    assert max(seen) + 10 <= 32767      # MPI_TAG_UB: the control channel
    assert seen[1] == seen[0] + 10


def test_exhaustion_names_the_numbers():
    tags = TagSpace(32767, 8)
    n = tag_block_size(8)                # 28 tags at P = 8
    fit = tags.one_shot_lo // n          # 877 objects with the MPI minimum
    for _ in range(fit):
        tags.block(n)
    with pytest.raises(ScheduleError) as e:
        tags.block(n)
    msg = str(e.value)
    for number in (f"{fit} open", f"{fit * n} of the 24576", "32767",
                   "P = 8 needs 28"):
        assert number in msg, msg
