"""The partition's consumer: created, recreated after a loss of deliveries, watched for stalls.

A consumer starts at the range's next sequence with a fresh inbox, so that no frame of an earlier
one can reach it. Consumer-sequence gaps (messages lost in flight), a deleted or vanished consumer
and reconnects recreate it from the last delivered sequence + 1, as nats.go's ordered consumer does;
a transient failure to create it is asked again with backoff, and ``consume.maxWait`` without
progress ends the partition with an error. A new consumer the server started past the asked
sequence skipped messages: ``failOnDataLoss`` decides (:meth:`ConsumerLifecycle._lost_below_first_seq`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ...client.jsapi import ERR_MAXIMUM_CONSUMERS, is_transient, request, retry_delays
from ...client.nats_internals import raw_subscribe, raw_unsubscribe
from ...errors import DataLossError, JetStreamApiError, PartitionReadError
from ...logs import get_logger

log = get_logger("source")


class ConsumerLifecycle:
    """The consumer part of :class:`~.partition_reader.PartitionReader` (whose state it reads and sets:
    ``consumer``, ``sub``, ``inbox``, ``pull_subject``, ``resetting``, ``set_left``)."""

    async def _create_consumer(self, start_seq: int) -> None:
        """A consumer from ``start_seq``, with a fresh inbox so that no frame of an
        earlier consumer (late messages, statuses of old pulls) can reach this one."""
        if self.sub is not None:
            old, self.sub = self.sub, None
            await raw_unsubscribe(self.nc, old)
        self.inbox = self.nc.new_inbox()
        sub = await raw_subscribe(self.nc, self.inbox, self._on_frame, self._on_frames)
        if self.done:  # closed while subscribing: close() did not see this subscription
            await raw_unsubscribe(self.nc, sub)
            return
        self.sub = sub
        name = f"sparkjs_{uuid.uuid4().hex[:20]}"
        config: dict[str, Any] = {
            "name": name,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": start_seq,
            "ack_policy": "none",
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": int(max(2 * self.opts.consume.expires, 30) * 1e9),
        }
        filters = self.filters
        if self.last_per_subject:
            # The server delivers the last message of each subject in sequence order, then what follows;
            # it needs a filter. A recreated consumer delivers the set again: the tracker skips what was taken.
            del config["opt_start_seq"]
            config["deliver_policy"] = "last_per_subject"
            filters = filters or (">",)
        if filters:
            config["filter_subjects"] = list(filters)
        reply = await request(self.nc, f"CONSUMER.CREATE.{self.stream}.{name}",
                              {"stream_name": self.stream, "config": config}, prefix=self.opts.api_prefix)
        if self.done:  # closed while the consumer was being created: close() did not know its name
            self._delete_consumer(name)
            return
        self.consumer = name
        self.range.consumer_created()
        self.engine.reset_pending()
        self.pull_subject = f"{self.opts.api_prefix}.CONSUMER.MSG.NEXT.{self.stream}.{name}"
        if not self.last_per_subject and not self.from_earliest and self._lost_below_first_seq(start_seq, reply):
            return
        if self.last_per_subject and not self.open_snapshot:
            self.set_left = int(reply.get("num_pending", 0))
        if reply.get("num_pending", 0) == 0:
            self._nothing_pending()  # the range's tail was deleted or filtered, or a replica lags
        else:
            self._maybe_pull()

    def _lost_below_first_seq(self, start_seq: int, reply: dict[str, Any]) -> bool:
        """Apply ``failOnDataLoss`` when the server moved the new consumer past ``start_seq``.

        A consumer asked to start below the stream's first sequence starts at the
        first sequence without a word (``delivered.stream_seq`` is one below where it
        starts), so limits, MaxAge or a purge that removed the head of the range
        after planning would be skipped silently. Filtered-out sequences never move
        the start, so they are not reported. True when the partition ended here.
        """
        delivered = (reply.get("delivered") or {}).get("stream_seq")
        lost = self.range.lost_range(start_seq, None if delivered is None else int(delivered))
        if lost is None:
            return False
        _, lost_last, moved_to = lost
        error = DataLossError(self.stream, start_seq, lost_last, moved_to)
        if self.opts.fail_on_data_loss:
            self._fail(error)
            return True
        log.warning("%s Going on from sequence %d (failOnDataLoss=false).", error, lost_last + 1)
        skipped = self.range.skip_to(lost_last)
        if self.engine.range_left is not None:
            self.engine.range_left = max(self.engine.range_left - skipped, 0)
        if self.range.complete:
            self._finish()
            return True
        return False

    # ---------------------------------------------------------------- recovery

    def _schedule_reset(self, why: str) -> None:
        if self.resetting or self.done:
            return
        self.resetting = True
        old, self.consumer = self.consumer, None
        self._delete_consumer(old)
        log.warning("stream %s: recreating the partition's consumer from sequence %d: %s",
                    self.stream, self.last_sseq + 1, why)
        self._track(self._reset())

    async def _reset(self) -> None:
        await self._create_consumer_retrying(self.range.next_seq)

    async def _create_consumer_retrying(self, start_seq: int) -> None:
        """Create the consumer, asking again with backoff while the failure is
        transient (a clustered stream between leaders, a node gone), for at most
        ``consume.maxWait`` without progress."""
        delays = retry_delays()
        while not self.done:
            try:
                self.resetting = False
                await self._create_consumer(start_seq)
                return
            except Exception as exc:
                if isinstance(exc, JetStreamApiError) and exc.err_code == ERR_MAXIMUM_CONSUMERS:
                    self._fail(PartitionReadError(
                        f"Reading stream '{self.stream}' sequences {self.first}..{self.last} needs a consumer, and "
                        f"the stream's consumer limit (max_consumers) is reached: {exc.description}. Each partition "
                        "of a read holds one consumer while it reads: lower the option 'numPartitions', or raise "
                        "the stream's max_consumers."))
                    return
                if not is_transient(exc):
                    self._fail(exc)
                    return
                self.resetting = True
                if self.range.stalled(time.monotonic(), self.opts.max_wait):
                    self._fail(self.stalled_error(f"the consumer could not be created: {exc}"))
                    return
                log.warning("stream %s: creating the consumer from sequence %d failed (%s); retrying",
                            self.stream, start_seq, exc)
                await asyncio.sleep(next(delays))

    def stalled_error(self, why: str) -> PartitionReadError:
        return PartitionReadError(
            f"Reading stream '{self.stream}' sequences {self.first}..{self.last} made no progress for "
            f"{self.opts.max_wait:g}s after sequence {self.last_sseq} ({why}). Check the server; raise the "
            "option 'consume.maxWait' if it is only slow."
        )

    async def _watch(self) -> None:
        interval = min(0.5, self.opts.consume.idle_heartbeat / 2)
        while not self.done:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if self.engine.heartbeat_missed(now):
                log.warning("stream %s: missed heartbeats; pulling again", self.stream)
                self._maybe_pull()
            if not self.resetting and self.ahead == 0 and self.range.stalled(now, self.opts.max_wait):
                self._fail(self.stalled_error("no message, heartbeat or status"))
