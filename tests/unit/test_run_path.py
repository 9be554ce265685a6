"""A socket read's deliveries taken at once (ConsumeLoop._take_run, RangeTracker.take_run) against the
same frames taken one by one, without a server.

The reader takes a run of frames in one go only when each frame would be a plain TAKE; anything else
(a lost delivery, a stream sequence taken before or past the range, ``pending == 0``, a status, a
frame that is no delivery, an ack subject of another layout) sends the whole run one frame at a
time. Seeded schedules of all of those, cut into runs at random points, must leave the reader where
feeding the frames one by one leaves it: the same batches (every column), the same queue of
outcomes, the same range and pull bookkeeping.
"""

from __future__ import annotations

import asyncio
import queue
import random

import pytest

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.read.partition_reader import PartitionReader
from pyspark_jetstream.source.read.range_tracker import RangeTracker

TS = 1_795_300_244_041_189_227
LAST = 60
STATUS = b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"


def _reply(layout: str, sseq: int, dseq: int, pending: int) -> bytes:
    fields = f"1.{sseq}.{dseq}.{TS + sseq}.{pending}"
    if layout == "v1":
        return f"$JS.ACK.S.c.{fields}".encode()
    if layout == "v2":
        return f"$JS.ACK.hub.ACCHASH.S.c.{fields}".encode()
    return f"$JS.ACK.hub.ACCHASH.S.c.{fields}.r4nd0m".encode()  # v2 with its random token


def schedule(rng: random.Random, layout: str) -> list[tuple[bytes, bytes, bytes, bytes | None]]:
    """A consumer's frames for the range 1..LAST: mostly plain deliveries, with the rare steps."""
    frames = []
    sseq = dseq = 0
    while sseq < LAST + 2 and len(frames) < 200:
        roll = rng.random()
        if roll < 0.03:
            frames.append((b"", b"", b"", STATUS))  # a status: its own step
            continue
        if roll < 0.04:
            frames.append((b"other", b"_INBOX.x", b"?", None))  # no delivery: skipped
            continue
        sseq += 1 if rng.random() < 0.9 else rng.randrange(2, 5)  # messages deleted or filtered out
        dseq += 1 if rng.random() < 0.985 else 2  # a delivery lost
        if rng.random() < 0.01:
            sseq -= rng.randrange(1, 3)  # taken before (a recreated consumer delivering again)
        # Past the range's end the stream may hold more (a read of a growing stream): pending > 0 there too.
        pending = max(LAST - sseq, 0) + rng.randrange(0, 3) if rng.random() < 0.97 else 0
        headers = None if rng.random() < 0.7 else b"NATS/1.0\r\nNats-TTL: 1h\r\n\r\n"
        frames.append((b"s.%d" % (sseq % 5), _reply(layout, sseq, dseq, pending), b"x" * rng.randrange(0, 40),
                       headers))
    return frames


def _runs(rng: random.Random, frames: list) -> list[list]:
    cuts = sorted(rng.sample(range(1, len(frames)), min(len(frames) - 1, rng.randrange(0, 12)))) if len(frames) > 1 \
        else []
    return [frames[a:b] for a, b in zip([0, *cuts], [*cuts, len(frames)], strict=True)]


def _outcome(frames: list, runs: list[list] | None, batch_size: int, bytes_mode: bool) -> tuple:
    """What a reader of 1..LAST holds after the frames: one by one (``runs`` None) or run by run."""
    raw = {"stream": "S", "batchSize": str(batch_size)}
    if bytes_mode:
        raw["consume.maxBytes"] = "100000"
    opts = parse_source_options(raw, streaming=False)
    out: queue.Queue = queue.Queue()

    async def go() -> tuple:
        reader = PartitionReader(opts, "S", 1, LAST, out)
        if runs is None:
            for frame in frames:
                reader._on_frame(*frame)
        else:
            for run in runs:
                reader._on_frames(run)
        engine = reader.engine
        state = (reader.range.last_sseq, reader.range.last_dseq, reader.resetting, reader.done,
                 engine.pending_msgs, engine.pending_bytes, engine.range_left, engine.delivered)
        await asyncio.sleep(0)  # a reset scheduled by a gap runs (and fails: no connection), the same in both
        return state

    state = asyncio.run(go())
    items = []
    while not out.empty():
        item = out.get_nowait()
        if isinstance(item, BaseException):
            items.append((type(item).__name__, str(item)))
        elif hasattr(item, "seqs"):
            items.append((item.subjects, item.datas, item.header_blocks, item.seqs, item.times))
        else:
            items.append(item)
    return state, items


@pytest.mark.parametrize("layout", ["v1", "v2", "v2-token"])
@pytest.mark.parametrize("bytes_mode", [False, True], ids=["messages", "bytes"])
def test_runs_taken_at_once_leave_the_reader_where_frames_one_by_one_do(layout, bytes_mode):
    taken_whole = 0
    for seed in range(400):
        rng = random.Random(seed)
        frames = schedule(rng, layout)
        runs = _runs(rng, frames)
        batch_size = rng.choice([1, 3, 7, 1000])
        assert _outcome(frames, runs, batch_size, bytes_mode) == _outcome(frames, None, batch_size, bytes_mode), \
            f"seed {seed}"
        taken_whole += sum(len(run) for run in runs)
    assert taken_whole  # the schedules are not all one-frame runs


def test_the_run_path_is_taken_for_plain_deliveries():
    """Without this, the differential test above would pass with the run path never used."""
    frames = [(b"s", _reply("v1", i, i, LAST - i), b"d", None) for i in range(1, 11)]
    opts = parse_source_options({"stream": "S"}, streaming=False)

    async def go() -> tuple[int, int]:
        reader = PartitionReader(opts, "S", 1, LAST, queue.Queue())
        assert reader._take_run(frames, 0.0)
        return reader.range.last_sseq, len(reader.builder)

    assert asyncio.run(go()) == (10, 10)


def test_take_run_refuses_what_needs_its_own_step():
    def tracker() -> RangeTracker:
        r = RangeTracker(1, 100, now=0.0)
        r.on_message(1, 1, pending=99, now=0.0)
        return r

    r = tracker()
    assert r.take_run((2, 2), (11, 11), 10, False, now=5.0) == 10
    assert (r.last_sseq, r.last_dseq, r.last_progress) == (11, 11, 5.0)
    assert tracker().take_run((2, 2), (14, 11), 10, False, 1.0) == 13  # sequences deleted in between
    refused = [
        ((2, 3), (11, 12), 10, False),  # the first delivery is not the next: one was lost
        ((2, 2), (12, 12), 10, False),  # 11 deliveries numbered for 10 frames: a gap inside
        ((1, 2), (10, 11), 10, False),  # the first was taken before
        ((2, 2), (100, 11), 10, False),  # the last is the range's last: it completes the range
        ((2, 2), (101, 11), 10, False),  # past the range
        ((2, 2), (11, 11), 10, True),  # a pending count of 0
        ((2, 2), (2, 2), 1, False),  # one frame: its own step
        ((2, 2), (9, 11), 10, False),  # fewer stream sequences than deliveries: not a consumer's order
    ]
    for first, last, count, drained in refused:
        r = tracker()
        assert r.take_run(first, last, count, drained, now=5.0) is None, (first, last, count, drained)
        assert (r.last_sseq, r.last_dseq, r.last_progress) == (1, 1, 0.0)  # nothing changed
