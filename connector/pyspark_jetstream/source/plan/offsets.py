"""Offsets, read limits, range splitting and data-loss detection, free of I/O.

**What an offset means.** A checkpointed offset is ``{"stream": NAME, "seq": N,
"partitions": P, "created": T}``: every stream sequence up to and *including* N of
the stream created at T has been planned. A micro-batch from offset ``start`` to offset ``end`` reads the
sequences ``(start.seq, end.seq]``, split into at most ``end.partitions``
ranges. User-facing sequence numbers (``startingOffsets=42``,
``endingOffsets=99``) are inclusive; :func:`offset_before` is the one place
that converts an inclusive first sequence into an offset.

Replaying a range after a restart yields the same messages as long as they
are still in the stream, split exactly as the first attempt split them (the
count is read from the logged offset, not from the option or the host): that
determinism is what makes a query exactly-once with an idempotent sink.
Offsets written before ``partitions`` was recorded are read with the option's
value; offsets without ``created`` are checked by their sequence alone
(:func:`identity_change`), and the next offset records it.

A micro-batch that spans a recreation of the stream carries ``"reset": S`` in its
end offset: it reads ``(S, end.seq]`` of the new stream (everything the new stream
held when the batch was planned), and a replay reads the same range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import JetStreamConnectorError

if TYPE_CHECKING:
    from ...options import SourceOptions


@dataclass(frozen=True)
class StreamBounds:
    """The part of STREAM.INFO planning needs."""

    first_seq: int
    last_seq: int
    created: str | None = None  # the stream's creation time: its identity (a recreated stream restarts at 1)
    max_age: float = 0.0  # the stream's MaxAge in seconds when planned (0: none); bounds expires_at
    num_subjects: int = 0  # subjects holding messages (split=subject decides its grouping from it)
    subjects: tuple[str, ...] = ()  # the stream's configured subjects (empty for a mirror)
    stores_others: bool = False  # it may hold subjects not among ``subjects``: :func:`stores_other_subjects`
    allow_direct: bool = False  # the stream answers direct gets (a KV bucket made by a KV client does)


def stores_other_subjects(config: dict) -> bool:
    """Whether a stream (its STREAM.INFO ``config``) stores messages under subjects its ``subjects`` do
    not name: one with ``sources`` stores each sourced message under its origin's subject (or what the
    source's ``subject_transforms`` make of it), a ``mirror`` holds its origin's and has no subjects of
    its own, a ``subject_transform`` stores the transformed subject (seen on nats-server 2.15.1).
    ``republish`` does not count: it sends a copy on, the stream stores the subject as published."""
    return bool(config.get("sources") or config.get("mirror") or config.get("subject_transform"))


SPLIT_SUBJECT = "subject"
"""``offset["split"]`` of a micro-batch read by subject (``source/plan/subject_split.py``); ``offset["depth"]``
then says how its subjects were grouped. An offset without it was read by sequence ranges."""


def make_offset(stream: str, seq: int, partitions: int | None = None, created: str | None = None) -> dict:
    offset: dict = {"stream": stream, "seq": int(seq)}
    if partitions is not None:
        offset["partitions"] = int(partitions)
    if created is not None:
        offset["created"] = created
    return offset


def offset_split(offset: dict) -> tuple[bool, int | None]:
    """(read by subject, its grouping depth) of the batch ending at ``offset``."""
    return offset.get("split") == SPLIT_SUBJECT, offset.get("depth")


RECREATED = "recreated"
BACKWARDS = "backwards"


def identity_change(offset: dict, bounds: StreamBounds) -> str | None:
    """Whether the stream ``offset`` was planned against is not the one ``bounds`` describe.

    ``RECREATED`` when the recorded creation time differs (the stream was deleted and
    created again: its sequences restarted at 1 and mean other messages now). For an
    offset written before the identity was recorded, ``BACKWARDS`` when the stream's last
    sequence is below the offset's (a stream's last sequence never goes down otherwise:
    purges and deletes keep it). ``None`` when it is the same stream.
    """
    recorded = offset.get("created")
    if recorded is not None:
        return RECREATED if bounds.created is not None and recorded != bounds.created else None
    return BACKWARDS if int(offset["seq"]) > bounds.last_seq else None


def restart_seq(bounds: StreamBounds) -> int:
    """The offset from which a recreated stream is read: everything it holds."""
    return offset_before(bounds.first_seq) if bounds.first_seq else bounds.last_seq


def offset_partitions(offset: dict, default: int) -> int:
    """How many ranges the batch ending at ``offset`` is split into: as recorded, else ``default``."""
    recorded = offset.get("partitions")
    return int(recorded) if isinstance(recorded, int) and recorded >= 1 else default


def offset_seq(offset: dict, stream: str) -> int:
    if offset.get("stream") != stream:
        raise JetStreamConnectorError(
            f"The checkpoint's offset names stream {offset.get('stream')!r}, but the query reads {stream!r}. "
            "Start the query with a new checkpointLocation to read another stream."
        )
    return int(offset["seq"])


def offset_before(first_seq: int) -> int:
    """The offset that plans nothing before the inclusive sequence ``first_seq``."""
    return max(first_seq - 1, 0)


def initial_seq(mode: str, bounds: StreamBounds, *, sequence: int | None = None,
                timestamp_seq: int | None = None) -> int:
    """The starting offset's seq for ``earliest`` | ``latest`` | ``sequence`` | ``timestamp`` |
    ``last_per_subject`` (the snapshot covers the whole stream, as ``earliest``).

    ``timestamp_seq`` is the first sequence at or after the starting timestamp,
    or ``None`` when no message is that recent (the query then starts at the end).
    """
    if mode in ("earliest", "last_per_subject"):
        return offset_before(bounds.first_seq) if bounds.first_seq else 0
    if mode == "latest":
        return bounds.last_seq
    if mode == "sequence":
        assert sequence is not None
        return offset_before(sequence)
    if mode == "timestamp":
        return bounds.last_seq if timestamp_seq is None else offset_before(timestamp_seq)
    raise ValueError(mode)


def end_seq(start: int, latest: int, max_rows: int | None) -> int:
    """The end of the next micro-batch: all that is available, or ``max_rows`` sequences of it."""
    end = max(latest, start)
    if max_rows is not None:
        end = min(end, start + max_rows)
    return end


def waits_for_more(available: int, min_rows: int | None, since_last_batch: float, max_delay: float) -> bool:
    """Option ``minMessagesPerTrigger``: whether the next micro-batch waits for more sequences.

    As Spark's Kafka source does with ``minOffsetsPerTrigger``: a batch starts once at least
    ``min_rows`` new sequences are there, or once ``max_delay`` seconds (``maxTriggerDelay``)
    have passed since the last batch started with fewer. With nothing new there is nothing to
    wait for (no batch runs either way).
    """
    return min_rows is not None and 0 < available < min_rows and since_last_batch < max_delay


def last_seq_at_or_before(first_after: int | None, bounds: StreamBounds) -> int:
    """Option ``endingTimestamp``: the last sequence stored at or before the time, from the first
    sequence stored after it (``None``: no message is that recent, so the stream's last)."""
    return bounds.last_seq if first_after is None else offset_before(first_after)


@dataclass(frozen=True)
class SeqRange:
    """Inclusive sequence range ``first..last`` read by one Spark partition."""

    index: int
    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1


def split_range(start: int, end: int, num_partitions: int) -> list[SeqRange]:
    """Split ``(start, end]`` into at most ``num_partitions`` contiguous, non-empty, near-equal ranges."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(num_partitions, total))
    base, extra = divmod(total, parts)
    ranges, first = [], start + 1
    for i in range(parts):
        length = base + (1 if i < extra else 0)
        ranges.append(SeqRange(i, first, first + length - 1))
        first += length
    return ranges


def lost_range(start: int, end: int, bounds: StreamBounds) -> tuple[int, int] | None:
    """Sequences of ``(start, end]`` below the stream's first sequence, or None.

    Gaps *inside* the stream (deleted or expired messages) are normal and never loss.
    """
    if end <= start or start + 1 >= bounds.first_seq:
        return None
    return start + 1, min(bounds.first_seq - 1, end)


SNAPSHOT_NEXT = "lastPerSubject"
"""In a start offset (``startingOffsets=lastPerSubject``): the next micro-batch is the snapshot."""
SNAPSHOT = "snapshot"
"""In an end offset: this micro-batch read the last message per subject of ``(start, end]``, not the
range; a replay reads the last message per subject up to the same end again."""


def keeps_subject_split(opts: SourceOptions, start: dict) -> bool:
    """Whether a streaming query resumed from ``start`` (its checkpoint's last end offset) keeps reading split
    by subject: the offset records that split (releases before 0.2.0 split by subject by default, and
    their copies need no shuffle to keep each subject's order), and the user has not chosen a split.
    Without this, such a job would stop at its first micro-batch after the upgrade (a copy straight from
    a read split by sequence is refused)."""
    return not opts.split_given and opts.split != "subject" and start.get("split") == SPLIT_SUBJECT


def recreated_between(start: dict, end: dict) -> bool:
    """Whether ``start`` and ``end`` were planned against different streams of the same name."""
    before, after = start.get("created"), end.get("created")
    return before is not None and after is not None and before != after
