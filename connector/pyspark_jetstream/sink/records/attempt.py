"""The replay records of one task attempt: what an earlier attempt of the run stored, and this one's record.

A task of a run with replay records (option ``sinkState``, :mod:`.replay_guard`) reads, before it
publishes, which of the run's ids the target holds already: the rows that carry them are skipped
(counted as stored), as are rows stored and then replaced by later rows of their subject
(:mod:`.superseded`). Its own record is renewed while it publishes and marked done when every
PubAck came, so that a replay reads no further than this attempt's last message.
"""

from __future__ import annotations

from typing import Any

from ...client import runtime
from ...logs import get_logger
from . import replay_guard

log = get_logger("sink")


class ReplayRecords:
    """One task attempt's replay records (module docstring): :meth:`begin`, :meth:`not_stored` each batch's
    frames, and :meth:`end`. Without a guard (or without generated ids) it holds nothing and does nothing."""

    def __init__(self, plan: Any, msg_ids: Any, partition: int) -> None:
        self.plan, self.opts, self.msg_ids, self.partition = plan, plan.options, msg_ids, partition
        self.already: Any = {}  # the ids an earlier attempt of this run stored in the target
        self.superseded = None  # ... and those later rows of their subject replaced (superseded.Superseded)
        self.attempt: replay_guard.Attempt | None = None
        self.attempt_id: str | None = None
        self.scanned = 0
        self.already_stored = 0  # rows skipped here: stored by an earlier attempt
        self._beat = self._record = None

    def begin(self) -> ReplayRecords:
        """Read what an earlier attempt of this run already stored in the target; this attempt's record is then
        renewed while the task publishes (:meth:`end` ends it)."""
        guard = self.plan.guard
        if guard is None or self.msg_ids is None:
            return self
        from pyspark import TaskContext

        ctx = TaskContext.get()
        # The task attempt, not the stage and attempt number: a stage Spark resubmits (a lost shuffle
        # output) runs its tasks again with attemptNumber 0 (issue #33).
        self.attempt_id = attempt_id = f"{guard.token}/{ctx.taskAttemptId() if ctx is not None else 0}"
        retried = ctx is not None and ctx.attemptNumber() > 0

        async def begin() -> replay_guard.Attempt:
            nc = await runtime.connection(self.opts.connection)
            return await replay_guard.begin(nc, guard, self.msg_ids.run, self.partition, attempt_id, retried)

        self.attempt = attempt = runtime.run(begin(), timeout=300)
        if attempt.replay:
            first, end = attempt.window or (attempt.after, attempt.after)
            log.info("JetStream sink: run %s partition %d replays; %d of its ids are in stream %s already (read "
                     "%d messages, sequences %d..%d)", self.msg_ids.run, self.partition, len(attempt.stored),
                     guard.target_stream, attempt.scanned, first + 1, end)
        self.scanned = attempt.scanned
        self._record = attempt.record
        self.superseded = attempt.superseded if attempt.superseded else None

        async def beat() -> None:
            nc = await runtime.connection(self.opts.connection)
            await replay_guard.heartbeat(nc, guard, self.msg_ids.run, self.partition, attempt.record)

        if attempt.record is not None:
            self._beat = runtime.submit(beat())
        self.already = attempt.stored
        return self

    def not_stored(self, frames: list[tuple]) -> list[tuple]:
        """``frames`` (OutFrame layout) but those an earlier attempt stored, or stored and then replaced by later
        rows of their subject: those are counted as stored."""
        if not self.already or not frames:
            return frames
        kept = [f for f in frames if f[4] not in self.already]  # OutFrame.msg_id
        if self.superseded is not None:  # stored, then replaced by later rows of their subject
            kept = [f for f in kept if not self.superseded.covers(f[2], f[4])]  # OutFrame.subject
        self.already_stored += len(frames) - len(kept)
        return kept

    def end(self, finished: bool) -> None:
        """Stop renewing this attempt's record; when every PubAck came, mark it done (its messages are
        all at or before the target's last sequence now: a replay reads no further)."""
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.cancel()
        record = self._record
        if not finished or record is None:
            return

        async def done() -> None:
            nc = await runtime.connection(self.opts.connection)
            await replay_guard.finished(nc, self.plan.guard, self.msg_ids.run, self.partition, record)

        try:
            runtime.run(done(), timeout=30)
        except Exception as exc:  # the record stays: a replay then bounds this attempt by its last heartbeat
            log.warning("Could not mark the replay record of run %s partition %d done: %s", self.msg_ids.run,
                        self.partition, exc)
