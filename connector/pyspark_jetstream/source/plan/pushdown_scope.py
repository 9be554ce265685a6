"""Which SQL execution a pushed read belongs to: the rule that keeps a pushed filter to its own query.

**Why.** PySpark 4.1 to 4.3 keep the read a scan's filter pushdown planned (the read function and
the partitions) on the data source object that every scan of the same DataFrame or view shares, and
a later scan with nothing to push reuses it: after ``SELECT ... WHERE key = 'a'`` on a view,
``SELECT count(*)`` on the same view read only key ``a``. Nothing of the later query reaches Python
on the driver (Spark reuses what it kept), so the only place to tell the queries apart is the task.

**The rule.** A pushed plan is made while its query's SQL execution runs: Spark plans a query inside
``SQLExecution.withNewExecutionId``, after the execution got its id. PySpark 4.2 and 4.3 give every
execution a UUIDv7 query id (``spark.sql.execution.query.id``, a task's local property), whose first
48 bits are the execution's start, in Unix milliseconds of the driver's clock, the clock the planner
worker reads too. So a task whose execution started at or before the moment the pushed plan was
made runs the query that planned it; one whose execution started later runs another query (or the
same DataFrame's plan again), and reads what the plan without the pushed filters reads. Spark keeps
every pushed filter in the plan (they are all returned), so reading more than the filter keeps is
never wrong, only slower.

Without the query id (PySpark 4.1) no task can tell, and a pushed filter does not narrow
the read at all (:data:`SCOPED`).

What the rule cannot see: one query that scans the same view or DataFrame twice, once with a
narrowing filter and once with no filter at all (``UNION ALL`` of a lookup and the whole view, a
scalar subquery over it): both scans run in one execution and Spark gives both the pushed plan.
:mod:`.pushdown_registry` catches the case where both scans push filters (joins do: Spark adds
``IsNotNull`` on join keys); docs/source.md states the rest.
"""

from __future__ import annotations

import uuid


def start_ms(query_id: str | None) -> int | None:
    """The start of the execution whose query id is ``query_id`` (Unix ms), or None when it is not a
    UUIDv7 (no id, or an id of another kind: nothing can be said about that execution)."""
    if not query_id:
        return None
    try:
        parsed = uuid.UUID(query_id)
    except ValueError:
        return None
    if parsed.version != 7:
        return None
    return parsed.int >> 80


def narrowed_applies(planned_ms: int, execution_start_ms: int | None) -> bool:
    """Whether a task of the execution that started at ``execution_start_ms`` reads the narrowed plan
    made at ``planned_ms``: only an execution that had started when the plan was made can be the
    one that made it. Unknown start: no (the whole read is always right)."""
    return execution_start_ms is not None and execution_start_ms <= planned_ms
