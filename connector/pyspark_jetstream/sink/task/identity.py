"""Who a task is: its partition, its run's message ids, and the streaming query it writes for.

The run id makes the generated message ids of a retried task or a replayed micro-batch the same as
the first attempt's: fixed on the driver for a batch write (:class:`~pyspark_jetstream.sink.plan.sink_plan.SinkPlan`),
``<queryId>:<batchId>`` from the task's local properties for a micro-batch. The query's id and name
travel in the commit message, for the driver's log line.
"""

from __future__ import annotations

from ..encode.msg_ids import MsgIds, move_base
from ..plan.sink_plan import SinkPlan


def task_identity(plan: SinkPlan) -> tuple[int, MsgIds | None]:
    """(partition id, msg-id generator) for the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    if not plan.options.idempotent:
        return partition, None
    run_id = plan.run_id
    if run_id is None:
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        run_id = f"{query_id}:{batch_id}"
    return partition, MsgIds(run_id, partition)


def retried_attempt() -> tuple[int, bool]:
    """(the number this attempt's moved copies start from, whether it is a retry of the task): a retry's
    moved copies are numbered apart from its predecessors' (:func:`~pyspark_jetstream.sink.encode.msg_ids.moved_id`),
    whose ids the server may still remember."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or ctx.attemptNumber() == 0:
        return 0, False
    return move_base(str(ctx.taskAttemptId())), True


def query_of_task() -> tuple[str | None, str | None]:
    """(id, name) of the streaming query running this task, or (None, None) for a batch write.

    Spark sets the id as the local property ``sql.streaming.queryId`` and has no property for the
    name (``sql.streaming.queryName`` does not exist, checked on Spark 4.3); the name is the first
    line of the job description it sets for each micro-batch (``<name>\\nid = <id>\\nrunId = ...``,
    an empty first line for an unnamed query)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    if not query_id:
        return None, None
    lines = (ctx.getLocalProperty("spark.job.description") or "").split("\n")
    name = lines[0] if len(lines) > 1 and lines[1] == f"id = {query_id}" and lines[0] else None
    return query_id, name
