"""What a partition settles when its task runs (source/read/ownership.py, source/read/stream_checks.py),
without a server: the stream still the one planned, and the consumers it runs when nothing needs asking."""

from __future__ import annotations

import asyncio

import pytest

from pyspark_jetstream.errors import StreamConfigError, StreamRecreatedError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.plan.subject_split import SubjectKeep
from pyspark_jetstream.source.read.ownership import listed_subjects, resolve
from pyspark_jetstream.source.read.stream_checks import still_the_planned_stream

INFO = {"created": "t1", "state": {"first_seq": 1, "last_seq": 50}}


def options(**more: str):
    return parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S", **more}, streaming=False)


def test_the_planned_stream_goes_on():
    assert still_the_planned_stream(options(), "S", INFO, "t1", 1, 10) is True
    assert still_the_planned_stream(options(), "S", INFO, None, 1, None) is True  # nothing recorded: not checked


def test_a_deleted_stream_fails_naming_the_range():
    with pytest.raises(StreamConfigError, match=r"Stream 'S' was deleted after this read was planned "
                                                r"\(sequences 5\.\.9 were to be read\)"):
        still_the_planned_stream(options(), "S", None, "t1", 5, 9)
    with pytest.raises(StreamConfigError, match=r"sequences from 5 on were to be read"):
        still_the_planned_stream(options(), "S", None, None, 5, None)


def test_a_recreated_stream_fails_or_is_skipped_per_fail_on_data_loss(caplog):
    with pytest.raises(StreamRecreatedError):
        still_the_planned_stream(options(), "S", INFO, "t0", 5, 9)
    assert still_the_planned_stream(options(failOnDataLoss="false"), "S", INFO, "t0", 5, 9) is False
    assert "Sequences 5..9 of the old stream are skipped (failOnDataLoss=false)." in caplog.text


def test_a_partition_that_needs_no_answer_settles_without_asking():
    """A sequence range with its end, planned without the stream's identity: its one consumer, no I/O."""
    opts = options(subjects="S.a")
    last, consumers = asyncio.run(resolve(opts, "S", 1, 10, None, False, None, 0))
    assert last == 10 and consumers == [(("S.a",), None)]
    # Split into one group (depth ALL) over two partitions: the first reads it all, the second nothing.
    assert asyncio.run(resolve(opts, "S", 1, 10, None, False, (0, 2), 0))[1] == [(("S.a",), None)]
    assert asyncio.run(resolve(opts, "S", 1, 10, None, False, (0, 2), 1))[1] == []


def test_filters_overlapping_in_part_are_read_through_a_cover_and_kept_by_pattern():
    _, [(server, keep)] = asyncio.run(resolve(options(subjects="S.*.x,S.a.*"), "S", 1, 10, None, False, None, 0))
    assert server == ("S.*.*",) and isinstance(keep, SubjectKeep)
    assert keep.keeps(b"S.b.x") and keep.keeps(b"S.a.y") and not keep.keeps(b"S.b.y")


def test_an_open_snapshot_awaits_literal_filters_only():
    assert listed_subjects(("S.a", "S.b")) == ("S.a", "S.b")
    assert listed_subjects(("S.a", "S.*")) is None
    assert listed_subjects(("S.>",)) is None
