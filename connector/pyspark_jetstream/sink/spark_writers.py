"""The Spark-facing sink: the writer classes Spark calls, thin on purpose.

Spark pickles a writer (with its :class:`~pyspark_jetstream.sink.plan.sink_plan.SinkPlan`) to the
executors and calls ``write`` once per task: each hands its batches to
:func:`~pyspark_jetstream.sink.task.write.write_partition`, which runs the task's stages. On the
driver, ``commit`` logs the totals of the tasks' commit messages
(:func:`~pyspark_jetstream.sink.task.commit.log_totals`) and, for a micro-batch, forgets the replay
records of the batch before it. Nothing else happens here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter

from ..client import runtime
from ..logs import get_logger
from ..spark_api import StreamWriterBase
from .plan.sink_plan import SinkPlan
from .task.commit import SinkCommitMessage, describe_target, log_totals
from .task.write import write_partition

log = get_logger("sink")


class JetStreamBatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[Any]) -> None:
        log_totals(messages, target=describe_target(self.plan.options))

    def abort(self, messages: list[Any]) -> None:
        log.warning("JetStream batch write aborted; rows already stored stay in the stream (ids are idempotent).")


class JetStreamStreamWriter(StreamWriterBase):
    """Arrow batches from PySpark 4.1 on; rows on 4.0, gathered into batches first (``row_batches``)."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        if self.plan.row_schema is not None:  # set by plan_sink where Spark gives rows (PySpark 4.0)
            from .encode.row_batches import row_batches

            iterator = row_batches(iterator, self.plan.row_schema)
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        log_totals(messages, batchId, target=describe_target(self.plan.options))
        self._forget_previous(messages, batchId)

    def _forget_previous(self, messages: list[Any], batch_id: int) -> None:
        """Batch ``batch_id - 1`` can no longer be replayed (Spark logged its commit before planning this
        one): delete its replay records. A failure only leaves them to the bucket's MaxAge."""
        guard = self.plan.guard
        run = next((m.run for m in messages if isinstance(m, SinkCommitMessage) and m.run), None)
        if guard is None or run is None or batch_id < 1:
            return
        from .records import replay_guard

        previous = f"{run.rsplit(':', 1)[0]}:{batch_id - 1}"

        async def forget() -> None:
            nc = await runtime.connection(self.plan.options.connection)
            await replay_guard.forget(nc, guard, previous)

        try:
            runtime.run(forget(), timeout=30)
        except Exception as exc:
            log.warning("Could not delete the replay records of %s from KV bucket %s: %s", previous, guard.bucket, exc)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("JetStream micro-batch %s aborted; its replay re-publishes the same msg ids.", batchId)
