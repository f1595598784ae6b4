"""Tag numbering: one range per owner (plane, each feature, jobs), no overlaps."""

from __future__ import annotations

import itertools

import pytest

from conduit_hpc.protocol import JOB_TAGS, TAG_RANGES, Tag, tag_owner


def test_tag_ranges_do_not_overlap() -> None:
    for (a, ra), (b, rb) in itertools.combinations(TAG_RANGES.items(), 2):
        assert not set(ra) & set(rb), (a, ra, b, rb)
        assert len(ra) > 0, a


def test_every_tag_lies_in_exactly_one_range() -> None:
    for tag in Tag:
        owners = [name for name, r in TAG_RANGES.items() if tag in r]
        assert len(owners) == 1, (tag, owners)
        assert tag_owner(tag) == owners[0]


def test_features_take_tags_from_their_own_range() -> None:
    assert {tag_owner(t) for t in Tag if t.name.startswith("CKPT_")} == {"checkpointing"}
    assert tag_owner(Tag.STOP) == "checkpointing"
    assert {tag_owner(t) for t in Tag if t.name.startswith("REPLACE_")} == {"replace"}
    assert tag_owner(Tag.FORWARD) == "longhaul"
    assert {tag_owner(t) for t in (Tag.DONE, Tag.SAMPLE, Tag.SAMPLE_REPLY, Tag.PRIORITY,
                                   Tag.SERVICE, Tag.SERVICE_REPLY)} == {"plane"}


def test_the_library_declares_no_job_tag_and_jobs_get_theirs_from_the_job_range() -> None:
    from conduit_hpc.rl.episodes import EPISODES_TAG

    assert not [t for t in Tag if t in JOB_TAGS]
    assert EPISODES_TAG in JOB_TAGS
    assert max(r.stop for r in TAG_RANGES.values()) <= 32767  # MPI guarantees MPI_TAG_UB >= 32767


def test_a_tag_outside_every_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="got 90"):
        tag_owner(90)
