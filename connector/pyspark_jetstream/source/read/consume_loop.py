"""The consume loop: pull requests out, frames in, rows appended; the read's hot path.

Frames arrive on the loop thread, as many as one socket read brought (the fast frame path of
nats_internals). A message taken mid-range is appended to the :class:`~..columns.rows.BatchBuilder`
and counted for the :class:`~pyspark_jetstream.protocol.pull_engine.PullEngine` in one pass;
every other step (a gap, the range's end, a status, a snapshot's delivery) leaves that pass for its
own method. Nothing but list appends runs inside nats-py's read loop, and a frame handler never
raises into it: a message it cannot take fails the partition, naming the stream and the sequence.
Spark's thread builds the Arrow batch.
"""

from __future__ import annotations

import time
from itertools import islice
from operator import lt
from typing import Any

from ...client.jsapi import next_message
from ...client.nats_internals import send_raw
from ...errors import PartitionReadError
from ...logs import get_logger
from ...protocol.ack_subject import fast_fields
from ...protocol.frames import pub_frame
from ...protocol.headers import PENDING_BYTES, PENDING_MESSAGES, parse_headers, parse_status
from ...protocol.pull_engine import Outcome
from .range_tracker import Step

log = get_logger("source")

_GAP, _PAST_END, _TAKE, _TAKE_LAST, _TAKE_DRAINED, _TAKEN_BEFORE = (
    Step.GAP, Step.PAST_END, Step.TAKE, Step.TAKE_LAST, Step.TAKE_DRAINED, Step.TAKEN_BEFORE)
_monotonic = time.monotonic

MAX_BATCHES_AHEAD = 2
_ACK_PREFIX = b"$JS.ACK."


def _int_header(headers: dict[str, list[str]], name: str) -> int | None:
    values = headers.get(name)
    try:
        return int(values[-1]) if values else None
    except ValueError:
        return None


class ConsumeLoop:
    """The pulls and frames of :class:`~.partition_reader.PartitionReader` (whose state it reads: the
    engine, the range tracker, the builder, ``ahead``)."""

    # ---------------------------------------------------------------- pulls

    def _maybe_pull(self) -> None:
        if self.done or self.resetting or self.ahead >= MAX_BATCHES_AHEAD or self.consumer is None:
            return
        request_ = self.engine.next_pull()
        if request_ is None:
            return
        self.engine.on_pull_sent(request_)
        body = request_.to_json()
        frame = pub_frame(self.pull_subject, self.inbox, body)
        self._track(send_raw(self.nc, frame))

    def batch_consumed(self) -> None:
        """Called (on the loop) when Spark's thread took a batch: room for more pulls."""
        self.ahead -= 1
        self._maybe_pull()

    def _emit(self) -> None:
        self.ahead += 1
        self.out.put(self.builder.take())

    # ---------------------------------------------------------------- frames

    def _on_frame(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Called by nats-py's parser for a frame on the inbox: must never raise into it."""
        self._on_frames(((subject, reply, data, headers),))

    def _on_frames(self, frames: Any) -> None:
        """Called with the frames on the inbox that one socket read brought, in order (the fast frame
        path of nats_internals): must never raise into it.

        The hot path (the loop thread is the read's bottleneck): a message taken mid-range is
        appended and counted here, and the engine is told of those messages at once, before any
        other step and at the end; the next pull is decided once, after the run."""
        if self.done:
            return
        subject = reply = b""
        now = _monotonic()
        engine, tracker, builder, batch_size = self.engine, self.range, self.builder, self._batch_size
        bytes_mode = engine.config.bytes_mode
        snapshot = self.open_snapshot
        ranged = self.set_left is not None  # the whole run goes message by message: the builder may change
        keeps = self.keep.keeps if self.keep is not None else None
        count = size = advance = 0
        try:
            if keeps is None and not snapshot and not ranged and self._take_run(frames, now):
                self._maybe_pull()
                return
            for subject, reply, data, headers in frames:
                if self.done:
                    break
                if not reply.startswith(_ACK_PREFIX):
                    if headers is not None:
                        engine.on_messages(count, size, advance, now)
                        count = size = advance = 0
                        self._on_status(headers)
                    continue
                sseq, dseq, ts, pending = fast_fields(reply)
                if self.resetting:
                    continue
                step, moved = tracker.on_message(sseq, dseq, pending, now)
                if snapshot and step is not _GAP:
                    engine.on_messages(count, size, advance, now)
                    count = size = advance = 0
                    self._on_snapshot_message(subject, reply, data, headers, sseq, ts, pending, moved, now)
                    continue
                if ranged and step is not _GAP:
                    engine.on_messages(count, size, advance, now)
                    count = size = advance = 0
                    self._on_set_message(step, moved, subject, reply, data, headers, sseq, dseq, ts, pending, now)
                    continue
                if step is _TAKE:
                    count += 1
                    advance += moved
                    if bytes_mode:
                        size += len(subject) + len(reply) + len(data) + (len(headers) if headers else 0)
                    if keeps is None or keeps(subject):
                        builder.add(subject, data, headers, sseq, ts)
                        if len(builder.seqs) >= batch_size:
                            self._emit()
                    continue
                engine.on_messages(count, size, advance, now)
                count = size = advance = 0
                self._on_step(step, moved, subject, reply, data, headers, sseq, dseq, ts, pending, now)
            engine.on_messages(count, size, advance, now)
            count = 0
            self._maybe_pull()
        except Exception as exc:  # one bad frame fails this partition, never the shared connection
            engine.on_messages(count, size, advance, now)
            log.debug("frame handler failed", exc_info=True)
            self._fail(PartitionReadError(
                f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed after sequence "
                f"{self.last_sseq}: a frame on subject {subject[:200]!r} with reply {reply[:200]!r} could not be "
                f"read ({type(exc).__name__}: {exc})."
            ))

    def _take_run(self, frames: Any, now: float) -> bool:
        """Take a socket read's deliveries in one go when each would be a plain TAKE (the range
        tracker's :meth:`~.range_tracker.RangeTracker.take_run` decides, from the first's and the last's
        sequences): their columns are appended at once and only the stream sequence and the time of
        each are read from its ack subject. False, with nothing changed, when any frame needs its own
        step (a status or another frame, a gap, the range's end, ``pending == 0``)."""
        count = len(frames)
        if count < 2 or self.resetting or self.done:
            return False
        subjects, replies, datas, headers = zip(*frames, strict=True)
        block = b"\n" + b"\n".join(replies) + b"\n"
        dots = replies[0].count(b".")
        if block.count(b"\n" + _ACK_PREFIX) != count or dots not in (8, 10) or replies[-1].count(b".") != dots:
            return False  # a status or a frame that is no delivery; or an ack subject of another layout
        tails = [reply.rsplit(b".", 4) for reply in replies]  # ..., stream seq, consumer seq, time, pending
        try:
            seqs = [int(tail[1]) for tail in tails]
            times = [int(tail[3]) for tail in tails]
            first, last = (seqs[0], int(tails[0][2])), (seqs[-1], int(tails[-1][2]))
        except ValueError:  # one by one, the frame that cannot be read is named
            return False
        if not all(map(lt, seqs, islice(seqs, 1, None))):
            return False  # not one consumer's order: each goes through the tracker's rules
        advance = self.range.take_run(first, last, count, block.find(b".0\n") >= 0, now)  # ".0": pending 0
        if advance is None:
            return False
        size = 0
        if self.engine.config.bytes_mode:
            size = (sum(map(len, subjects)) + len(block) - count - 1 + sum(map(len, datas))
                    + sum(len(h) for h in headers if h))
        self.engine.on_messages(count, size, advance, now)
        builder, batch_size, at = self.builder, self._batch_size, 0
        while at < count:
            end = min(count, at + batch_size - len(builder))
            builder.extend(subjects[at:end], datas[at:end], headers[at:end], seqs[at:end], times[at:end])
            if len(builder) >= batch_size:
                self._emit()
            at = end
        return True

    def _on_step(self, step: Any, advance: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None,
                 sseq: int, dseq: int, ts: int, pending: int, now: float) -> None:
        """A message whose step is not the common one (:meth:`_on_frames` took those)."""
        if step is _GAP:  # deliveries were lost (e.g. during a reconnect)
            self._schedule_reset(f"consumer sequence jumped from {self.range.last_dseq} to {dseq}")
            return
        if step is _PAST_END:
            self._finish()
            return
        self.engine.on_message(len(subject) + len(reply) + len(data) + (len(headers) if headers else 0), advance, now)
        if step is _TAKEN_BEFORE:
            if pending == 0:
                self._nothing_pending()
            return
        if self.keep is None or self.keep.keeps(subject):
            builder = self.builder
            builder.add(subject, data, headers, sseq, ts)
            if len(builder) >= self._batch_size:
                self._emit()
        if step is _TAKE_LAST:
            self._finish()
        elif step is _TAKE_DRAINED:
            self._nothing_pending()

    def _on_status(self, block: bytes) -> None:
        code, description = parse_status(block)
        headers = parse_headers(block)
        verdict = self.engine.on_status(
            code, description, _int_header(headers, PENDING_MESSAGES),
            _int_header(headers, PENDING_BYTES), time.monotonic(),
        )
        if verdict.outcome is Outcome.RECREATE:
            self._schedule_reset(f"the consumer is gone ({code} {description or 'no responders'})")
            return
        if verdict.outcome is Outcome.FAIL:
            self._fail(PartitionReadError(
                f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed: the server answered "
                f"the pull request with {code} {description}."
            ))
            return
        if verdict.outcome is Outcome.TOO_LARGE:
            self.resetting = True  # no more pulls or messages; the error follows the lookup below
            self._track(self._fail_too_large())
            return
        if verdict.outcome in (Outcome.WARN, Outcome.REPULL):
            log.warning("stream %s: pull request ended with %s %s", self.stream, code, description)
        self._maybe_pull()

    async def _fail_too_large(self) -> None:
        """Fail naming the message that no pull within ``consume.maxBytes`` can fetch."""
        budget = self.opts.consume.max_bytes
        what = f"the next message after sequence {self.last_sseq}"
        try:
            message = await next_message(self.nc, self.stream, self.last_sseq + 1, self.filters,
                                         self.opts.api_prefix)
            if message is not None:
                what = f"the message at sequence {message.seq} is {message.size} bytes (subject, headers and data)"
        except Exception as exc:  # the lookup only improves the message
            log.debug("looking up the oversized message failed: %s", exc)
        self._fail(PartitionReadError(
            f"Reading stream '{self.stream}' sequences {self.first}..{self.last} cannot go on: {what}, and the "
            f"server counts its ack subject too; that is more than option 'consume.maxBytes' ({budget} bytes) "
            "lets one pull request carry. Raise 'consume.maxBytes' above the message size."
        ))
