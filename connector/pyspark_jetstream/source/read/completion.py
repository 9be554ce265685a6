"""When a partition's read is complete: the range's end confirmed, a snapshot's subjects all taken.

The partition ends when it delivered the range's last sequence, when the consumer reports nothing
pending (the range's tail may have been deleted), or when it sees a sequence past the range. In a
cluster the consumer (one replica) may sit on a follower that is still catching up, whose pending
count says nothing of what the leader already holds: there, "nothing pending" before the range's end
is believed only once the stream's leader confirms that no sequence of the rest of the range is left
(``STREAM.MSG.GET`` is answered by the leader); otherwise the partition keeps pulling while the
replica catches up. A snapshot with an end (a streaming ``lastPerSubject``'s first micro-batch) is
held to its end the same way: its consumer's set is its replica's, and a replica that held less than
the range goes on with the changes after that set up to the end (``_to_changes``; issue #33, item 5).
An open snapshot ends once every subject listed for it was taken, each one's first delivery its value.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ...client.jsapi import last_message_of_subject, next_message, retrying
from ...client.nats_internals import is_clustered
from ...errors import PartitionReadError
from ...logs import get_logger
from ..columns.rows import BatchBuilder
from .range_tracker import Step

log = get_logger("source")

_PAST_END, _TAKEN_BEFORE = Step.PAST_END, Step.TAKEN_BEFORE

MAX_SNAPSHOT_RESETS = 10
"""Consumers an open snapshot recreates for subjects the leader holds but no consumer delivered."""


class Completion:
    """The end of a read of :class:`~.partition_reader.PartitionReader` (whose state it reads and sets:
    ``open_snapshot``, ``expected``, ``taken``, ``snapshot_resets``, ``set_left``, ``confirming``)."""

    def _on_set_message(self, step: Any, advance: int, subject: bytes, reply: bytes, data: bytes,
                        headers: bytes | None, sseq: int, dseq: int, ts: int, pending: int, now: float) -> None:
        """A delivery of a snapshot with an end (see ``set_left``). The consumer delivers its set, the last
        message of each subject as its replica held them when it was created, in sequence order, then every
        message after that: past the end on a replica that held the range, so such a message ends the read.
        One inside the range means that the replica held less than the range (it was catching up): the read
        goes on as a read of changes up to the end."""
        if self.set_left:
            self.set_left -= 1
        elif self.set_left is not None and step is not _PAST_END and step is not _TAKEN_BEFORE:
            self._to_changes(f"its consumer delivered sequence {sseq} of the range after its set", sseq - advance)
        self._on_step(step, advance, subject, reply, data, headers, sseq, dseq, ts, pending, now)

    def _to_changes(self, why: str, after: int) -> None:
        """Read the rest of a snapshot's range as changes: the set delivered so far is the one of a replica that
        held the stream up to some sequence before the end; every message after it up to the end follows it,
        deletes and purges of a bucket's keys included (as a KV watch started there would deliver them), so a
        job that applies the rows in order ends with the stream's state at the end. A consumer recreated
        from here on (a gap, a reconnect) is an ordinary one from the next sequence."""
        if self.set_left is None:
            return
        log.warning("stream %s: the snapshot's consumer sits on a replica that held less of the stream than the "
                    "snapshot's range (..%d): its replica lags (%s). Its set ends at sequence %d; every change after it "
                    "up to the end is read too.", self.stream, self.last, why, after)
        self.set_left = None
        self.last_per_subject = False
        if len(self.builder):
            self._emit()  # built with the snapshot's rule: deleted keys left out
        self.builder = BatchBuilder(self.stream, include_markers=self.opts.include_markers, kv_bucket=self.opts.key_bucket,
                                    max_age=self.max_age, columns=self.opts.columns)

    def _on_snapshot_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None, sseq: int,
                             ts: int, pending: int, advance: int, now: float) -> None:
        """A delivery of an open snapshot's consumer (see ``open_snapshot``)."""
        if self.done:
            return
        self.engine.on_message(len(subject) + len(reply) + len(data) + (len(headers) if headers else 0), advance, now)
        if subject not in self.taken and (self.keep is None or self.keep.keeps(subject)):
            self.taken.add(subject)
            self.builder.add(subject, data, headers, sseq, ts)
            if len(self.builder) >= self._batch_size:
                self._emit()
            if self.expected is not None:
                self.expected.discard(subject)
        if self.expected is not None and not self.expected:
            self._finish()
        elif pending == 0:
            self._nothing_pending()

    async def _confirm_snapshot(self) -> None:
        """The subjects listed for this snapshot that were not delivered: those the leader no longer holds
        (a subject purged meanwhile) are not waited for; for the others the consumer is recreated, and
        the new one delivers their last messages (what was taken is skipped)."""
        assert self.expected is not None
        asked = sorted(self.expected)
        deadline = time.monotonic() + self.opts.max_wait  # "not yet" (an election: 503/10008, 408): asked again
        try:
            present = {s for s in asked if await retrying(lambda t, s=s: last_message_of_subject(
                self.nc, self.stream, s.decode(), self.opts.api_prefix, t), deadline)}
        finally:
            self.confirming = False
        if self.done:
            return
        self.expected.difference_update(set(asked) - present)
        if not self.expected:
            self._finish()
            return
        self.snapshot_resets += 1
        if self.snapshot_resets > MAX_SNAPSHOT_RESETS:
            missing = ", ".join(sorted(s.decode() for s in self.expected)[:5])
            self._fail(PartitionReadError(
                f"Reading the last message of each subject of stream '{self.stream}' failed: the server's "
                f"consumers reported nothing pending {MAX_SNAPSHOT_RESETS} times while it still holds {missing}"
                f"{' ...' if len(self.expected) > 5 else ''}. Check the stream's replicas (a lagging one?)."))
            return
        await asyncio.sleep(min(0.05 * (self.snapshot_resets - 1), 1.0))
        self._schedule_reset(f"{len(self.expected)} subjects listed for the snapshot were not delivered "
                             f"(the consumer reported nothing pending)")

    def _nothing_pending(self) -> None:
        """The consumer says nothing is pending before the range's end."""
        if self.open_snapshot and self.expected:
            # nats-server's pending count of a last-per-subject consumer can reach 0 one message early when
            # a subject's last message is replaced before it is delivered (seen under a writer): the
            # subjects still expected are confirmed with the leader, never dropped on that count alone.
            if not self.confirming:
                self.confirming = True
                self._track(self._confirm_snapshot())
            return
        # An open snapshot's set is the consumer's replica's, as a KV watch's is: there is no range to confirm.
        # One with an end is confirmed as a range is: its consumer's replica may hold less than the range.
        if self.range.complete or self.open_snapshot or not is_clustered(self.nc):
            self._finish()
            return
        if not self.confirming:
            self.confirming = True
            self._track(self._confirm_end())
        self._maybe_pull()

    async def _confirm_end(self) -> None:
        """Finish only if the stream's leader holds no sequence of the rest of the range."""
        after = self.last_sseq
        deadline = time.monotonic() + self.opts.max_wait  # "not yet" (an election: 503/10008, 408): asked again
        try:
            message = await retrying(lambda t: next_message(self.nc, self.stream, after + 1, self.filters,
                                                            self.opts.api_prefix, t), deadline)
        finally:
            self.confirming = False
        if self.done or self.last_sseq > after:
            return  # the partition moved on meanwhile
        if message is None or message.seq > self.last:
            self._finish()
            return
        if self.set_left is not None:
            self._to_changes(f"it reported nothing pending after sequence {after}, and the stream's leader holds "
                             f"sequence {message.seq}", after)
            self._maybe_pull()
            return
        log.warning("stream %s: the consumer's replica reports nothing pending after sequence %d, but the stream's "
                    "leader holds sequence %d of the range (..%d); waiting for the replica to catch up",
                    self.stream, after, message.seq, self.last)
