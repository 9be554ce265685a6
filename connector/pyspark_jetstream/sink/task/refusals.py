"""Settling what the server refused: dead letters, a failure naming the row, or a refusal that stands not.

After each slice (and until the end) the task takes the publishes the server refused since the last
look. Two refusals are not the row's fault: a compare-and-set row refused because an earlier attempt
stored it (found by its ``Nats-Msg-Id``, :mod:`~pyspark_jetstream.sink.records.cas_replay`) counts as
stored, and a KV ``create`` refused because the key's last entry is a tombstone is put again, once, as
nats-py does. A row the server dropped because the stream's ingest queue was full (429/10167) is not
the row's fault either: the task fails saying so (:class:`~pyspark_jetstream.errors.StreamBusyError`),
never a dead letter. Every other refusal is diverted (:mod:`.dead_letters`), a 503 naming the streams
that capture subjects beside the row's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ...client import jsapi, runtime
from ...errors import PublishError, StreamBusyError
from ...logs import get_logger
from ...protocol import kv
from ...protocol.frames import hpub_frame
from ...protocol.puback import STREAM_TOO_MANY_REQUESTS
from ..encode.frames import OutFrame
from ..encode.rows import RowRejection
from .key_barrier import is_checked

log = get_logger("sink")

NOT_YET = (kv.ERR_LAST_SEQUENCE_IN_PROCESS, kv.ERR_JETSTREAM_UNAVAILABLE)
"""A compare-and-set row's refusals that mean "not yet" (docs/guarantees.md): sent again (:meth:`Refusals.again`)."""


class Refusals:
    """One task's refused publishes (module docstring); ``task``: its
    :class:`~pyspark_jetstream.sink.task.write.WriteTask` (its publisher, dead letters and retry order)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.plan, self.opts, self.partition = task.plan, task.opts, task.partition
        self.already_stored = 0  # compare-and-set rows an earlier attempt stored (stored_before)
        self.recreated: set[int] = set()  # positions of KV creates put again after a tombstone (once each)
        self._streams_near: dict[str, list[tuple[str, list[str]]] | None] = {}  # see _where_subjects_go
        self._not_yet: dict[int, float] = {}  # position: when the row was first answered "not yet" (again)
        self._not_yet_rounds = 0

    def settle(self) -> bool:
        """Turn the publishes the server refused since the last call into dead letters (or a failure);
        a compare-and-set row that an earlier attempt stored is counted as stored (:meth:`stored_before`)
        and a KV ``create`` refused because the key's last entry is a tombstone is put again first
        (:meth:`recreate`). Whether anything was published meanwhile (that ``WriteTask.finish`` drains)."""
        async def take() -> list:
            taken, self.task.pub.failures = self.task.pub.failures, []
            return taken

        failures = runtime.run(take())
        if not failures:
            return False
        if self.task.retry is not None:  # their stale copies stay; a moved row's old copy stands for it (retry_order.py)
            kept = self.task.retry.keep_refused({f.position for f in failures if not f.dead_letter})
            failures = [f for f in failures if f.dead_letter or f.position not in kept]
            if not failures:
                return True
        dead = [f for f in failures if f.dead_letter]
        if dead:
            f = dead[0]
            raise PublishError(subject=self.opts.dead_letter_subject, position=f.position, partition=self.partition,
                               reason=f"the dead-letter publish was rejected: {f.description}", err_code=f.err_code)
        dropped = [f for f in failures if f.err_code == STREAM_TOO_MANY_REQUESTS]
        if dropped:  # back-pressure, not the rows' fault: never dead letters
            first = min(dropped, key=lambda f: f.position)
            raise StreamBusyError(subject=OutFrame._make(first.sent).subject, position=first.position,
                                  partition=self.partition, rows=len(dropped))
        failures = self.recreate(self.stored_before(self.again(failures)))
        if not failures:
            return True
        rejections, originals = [], {}
        for f in failures:
            sent = OutFrame._make(f.sent)
            reason = f.description or f"status {f.code}"
            if f.err_code is None:
                reason += f" (status {f.code})"
                if f.code == 503:
                    reason += self._where_subjects_go(sent.subject)
            rejections.append(RowRejection(f.position, sent.subject, reason, err_code=f.err_code,
                                           status=None if f.err_code is not None else f.code,
                                           payload=sent.payload, ttl=sent.ttl, value=sent.ttl, msg_id=sent.msg_id))
            originals[f.position] = sent.header_block
        self.task.divert(rejections, originals)
        return True

    def again(self, failures: list) -> list:
        """Compare-and-set rows of a bucket answered "not yet" (:data:`NOT_YET`: the key's previous row
        still in process on a replicated stream, or JetStream briefly without a leader) are sent again after
        a pause, for at most ``ackTimeout`` seconds from their first such answer: neither answer stored the
        row, and the check it carries stores it at most once. The task's key barrier keeps the key's later
        rows behind it (key_barrier.py). Returns the failures that stand."""
        if self.opts.bucket is None:
            return failures
        now = time.monotonic()
        retry = [f for f in failures if f.err_code in NOT_YET and is_checked(f.sent)
                 and now - self._not_yet.setdefault(f.position, now) < self.opts.ack_timeout]
        if not retry:
            return failures
        self._not_yet_rounds += 1
        pause = min(1.0, 0.02 * 2 ** min(6, self._not_yet_rounds))

        async def send_again() -> None:
            await asyncio.sleep(pause)
            await self.task.pub.publish([tuple(f.sent) for f in retry])

        runtime.run(send_again())
        again = {f.position for f in retry}
        return [f for f in failures if f.position not in again]

    def stored_before(self, failures: list) -> list:
        """Compare-and-set rows refused with 10071 whose ``Nats-Msg-Id`` the bucket shows stored (a retry,
        a replay or a resend of a row its first attempt stored: sink/records/cas_replay.py) are counted among the
        rows already stored, neither failed nor dead-lettered. Returns the failures that stand."""
        candidates = [] if self.opts.bucket is None else [
            f for f in failures if f.err_code == kv.ERR_WRONG_LAST_SEQUENCE and OutFrame._make(f.sent).msg_id]
        if not candidates:
            return failures
        from ..records.cas_replay import stored_already

        stream, prefix = kv.stream_name(self.opts.bucket), self.opts.api_prefix
        rows = [(sent.subject, sent.msg_id, kv.expected_revision_of(sent.header_block))
                for sent in (OutFrame._make(f.sent) for f in candidates)]

        async def look() -> list[bool]:
            nc = await runtime.connection(self.opts.connection)
            return await stored_already(nc, stream, rows, prefix, deadline=time.monotonic() + self.opts.ack_timeout)

        stored = {f.position for f, found in zip(candidates, runtime.run(look()), strict=True) if found}
        if not stored:
            return failures
        self.already_stored += len(stored)
        log.info("JetStream sink: %d compare-and-set rows of partition %d were refused (wrong last sequence) because "
                 "an earlier attempt stored them; counted as stored", len(stored), self.partition)
        return [f for f in failures if f.position not in stored]

    def recreate(self, failures: list) -> list:
        """nats-py's ``kv.create``: a create (``expected_revision`` 0) refused with 10071 is put again,
        once, expecting the key's last revision when that is a DEL or PURGE tombstone (a deleted or
        purged key may be created again). Returns the failures that stand."""
        bucket = self.opts.bucket
        candidates = [] if bucket is None else [
            f for f in failures if f.err_code == kv.ERR_WRONG_LAST_SEQUENCE and f.position not in self.recreated
            and kv.is_create(OutFrame._make(f.sent).header_block)]
        if not candidates:
            return failures
        stream, prefix = kv.stream_name(bucket), self.opts.api_prefix

        deadline = time.monotonic() + self.opts.ack_timeout

        async def last_entries() -> list:
            # An R3 bucket may answer 503/10008 or nothing while its leader changes: asked again until the deadline.
            nc = await runtime.connection(self.opts.connection)
            return await asyncio.gather(*(jsapi.retrying(
                lambda timeout, subject=f.sent[2]: jsapi.last_message_of_subject(nc, stream, subject, prefix, timeout),
                deadline) for f in candidates))

        frames, retried = [], set()
        for f, last in zip(candidates, runtime.run(last_entries()), strict=True):
            revision = None if last is None else kv.tombstone_revision(*last)
            if revision is None:
                continue  # a live key (or none at all): the refusal stands, as for nats-py
            sent = OutFrame._make(f.sent)
            block = kv.recreate_block(sent.header_block, revision)
            frame = hpub_frame(sent.subject, f"{self.task.pub.reply_prefix}{f.position}", block, sent.payload)
            frames.append(sent._replace(frame=frame, header_len=len(block)))
            retried.add(f.position)
        self.recreated |= retried
        if frames:
            runtime.run(self.task.pub.publish([tuple(frame) for frame in frames]))
        return [f for f in failures if f.position not in retried]

    def _where_subjects_go(self, subject: str) -> str:
        """For a row no stream took (503): the subjects of option 'stream', or else the streams that
        capture subjects beside it (one ``STREAM.LIST`` per first token, remembered by the task)."""
        opts = self.opts
        if opts.stream is not None and self.plan.stream_subjects is not None:
            return (f"; stream '{opts.stream}' (option 'stream') captures "
                    f"{', '.join(repr(s) for s in self.plan.stream_subjects) or 'no subjects'}")
        near = f"{subject.split('.', 1)[0]}.>"
        if near not in self._streams_near:
            async def ask() -> list[tuple[str, list[str]]]:
                nc = await runtime.connection(opts.connection)
                return await jsapi.streams_capturing(nc, near, opts.api_prefix)

            try:
                found = runtime.run(ask(), timeout=30)
            except Exception:  # the refusal is reported all the same, without the neighbours
                found = None
            if len(self._streams_near) < 64:
                self._streams_near[near] = found
        found = self._streams_near.get(near)
        if found is None:
            return ""
        if not found:
            return f"; no stream captures any subject under '{near}'"
        shown = "; ".join(f"stream '{name}' captures {', '.join(repr(s) for s in subjects)}"
                          for name, subjects in found[:5])
        return f"; under '{near}': {shown}" + (f" (and {len(found) - 5} more streams)" if len(found) > 5 else "")
