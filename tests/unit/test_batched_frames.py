"""Frames made whole for a task's first fast-ingest batch (sink/publish/batched.py): they go out as
they are only where each reply names the row's own batch sequence, and what goes out is byte for byte
what cutting them and making them again gives. No server: frames and feeds only."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from pyspark_jetstream.client.fast_publisher import Feed
from pyspark_jetstream.protocol.batch_frames import batch_frames, cut_frame
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.encode.encoder import BatchEncoder
from pyspark_jetstream.sink.encode.frames import OutFrame, ReplyForm
from pyspark_jetstream.sink.encode.layout import EncoderConfig, layout_from_schema
from pyspark_jetstream.sink.encode.msg_ids import MsgIds
from pyspark_jetstream.sink.publish.batched import BatchedPublisher, reframed

HEAD = "_INBOX.abc.f00dr.500.fail."
FORM = ReplyForm(HEAD, ".1.$FI", 1)
SCHEMA = StructType([StructField("subject", StringType()), StructField("data", BinaryType())])


def _frames(n: int, first: int = 0, reply: str | ReplyForm = FORM) -> list[tuple]:
    cfg = EncoderConfig(default_subject=None, default_ttl=None, preserve_expiry=False, expected_stream="S",
                        allow_rollup=False, max_payload=1 << 20)
    encoder = BatchEncoder(layout_from_schema(SCHEMA, has_default_subject=False), cfg, MsgIds("run", 3))
    batch = pa.RecordBatch.from_pydict({"subject": [f"S.{i % 3}" for i in range(n)],
                                        "data": [b"v%d" % i for i in range(n)]})
    return encoder.encode(batch, first, reply).frames


class _Acked:
    reply_prefix, low_water = "_INBOX.acked.", 256
    reply_form = ReplyForm(reply_prefix)


def _publisher() -> BatchedPublisher:
    pub = BatchedPublisher(None, _Acked())
    pub._reply_form = FORM  # as start() sets it from its FastPublisher's reserved head
    return pub


def test_whole_frames_go_out_as_made_again_from_their_parts():
    frames = _frames(50)
    whole = [sent[1] for sent in frames]
    cut = [cut_frame(f) for f in whole]
    for commit in (0, 50):
        made = batch_frames(whole, 0, HEAD.encode(), 1, 50, commit, whole=True)
        assert made == batch_frames(cut, 0, HEAD.encode(), 1, 50, commit)
        assert made.count(b".1.$FI ") == 48 + (commit == 0)
    # Message 1 starts (op 0) and the commit commits (op 2), whole frames or not.
    assert batch_frames(whole, 0, HEAD.encode(), 1, 1, 0, whole=True).startswith(f"HPUB S.0 {HEAD}1.0.$FI ".encode())
    # Another batch (a resend under a new head) makes every frame again.
    other = batch_frames(whole, 9, b"_INBOX.abc.other.500.fail.", 1, 3, 0, whole=False)
    assert other.count(b"_INBOX.abc.other.500.fail.") == 3 and HEAD.encode() not in other


def test_a_batch_of_whole_frames_and_cut_ones_goes_out_as_all_made_again():
    """A feed holds whole frames and, after a skipped row, cut ones: each run of whole frames is joined
    at once, the others made again, every range of messages and every commit alike."""
    import random

    frames = [sent[1] for sent in _frames(40)]
    cut = [cut_frame(f) for f in frames]
    rng = random.Random(7)
    for _ in range(300):
        mixed = [c if rng.random() < 0.2 else f for f, c in zip(frames, cut, strict=True)]
        first = rng.randrange(1, 41)
        last = rng.randrange(first, 41)
        commit = rng.choice([0, last, rng.randrange(first, last + 1)])
        made = batch_frames(mixed, 0, HEAD.encode(), first, last, commit, whole=True)
        assert made == batch_frames(cut, 0, HEAD.encode(), first, last, commit), (first, last, commit)


def test_frames_go_whole_only_at_their_own_feed_positions_with_the_batch_reply():
    pub, feed = _publisher(), Feed()
    assert pub._whole_frames(feed, _frames(10))
    assert not pub._whole_frames(feed, _frames(10, first=1))  # a row before them was skipped
    assert not pub._whole_frames(feed, _frames(10, reply="_INBOX.acked."))  # made for the per-row publisher
    frames = _frames(10)
    assert not pub._whole_frames(feed, frames[:4] + frames[5:])  # one left out (stored by an earlier attempt)
    feed.add([sent[1] for sent in frames], [sent[2] for sent in frames], [sent[4] for sent in frames], frames)
    assert pub._whole_frames(feed, _frames(10, first=10))
    assert not pub._whole_frames(feed, _frames(10, first=11))


def test_rows_outside_the_target_go_to_the_per_row_publisher_under_its_reply():
    frames = _frames(3, first=7)
    again = reframed(frames, ReplyForm(_Acked.reply_prefix))
    for before, after in zip(frames, again, strict=True):
        sent = OutFrame._make(before)
        assert after == (sent.position, hpub_frame(sent.subject, f"_INBOX.acked.{sent.position}", sent.header_block,
                                                   sent.payload), *before[2:])


def test_an_abort_ends_a_batch_that_swallowed_its_first_cancellation():
    """Python 3.10 and 3.11's ``asyncio.wait_for`` can swallow a cancellation (cpython#86296): a job that
    lost one still ends, cancelled again."""
    import asyncio
    import contextlib

    from pyspark_jetstream.sink.publish.batched import cancel_and_wait

    async def stubborn(started: asyncio.Event) -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):  # what a swallowed cancellation looks like
            await asyncio.sleep(30)
        await asyncio.sleep(30)

    async def go() -> bool:
        started = asyncio.Event()
        job = asyncio.ensure_future(stubborn(started))
        await started.wait()
        await asyncio.wait_for(cancel_and_wait(job, every=0.01), 5)
        return job.cancelled()

    assert asyncio.run(go())
