"""What a task reports, and what the driver makes of the reports.

A task returns a :class:`SinkCommitMessage` with its counts (pickled back to the driver);
:func:`log_totals` adds them up in one log line per commit, naming the target and the query, and
warns when the subject samples of the tasks show a subject written by more than one task
(:mod:`~pyspark_jetstream.sink.order.subject_sample`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from ...logs import get_logger
from ...options import SinkOptions

log = get_logger("sink")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    partition: int = 0
    published: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    expired: int = 0
    markers_skipped: int = 0
    already_stored: int = 0  # rows an earlier attempt of this run stored (replay_guard), not published again
    older_in_write: int = 0  # sequenceBy: rows left out for a newer row of their key in the same task
    older_than_stored: int = 0  # sequenceBy: rows not newer than their key's stored value
    out_of_order: int = 0  # rows as read that came right after a later source sequence of their subject (order_check)
    subjects: Any = None  # order=subject, rows held and sorted: a sample of their subjects (order.subject_sample.SubjectSample)
    reordered: int = 0  # messages moved back into their subject's order after a leader change (reorder)
    left_out_of_order: int = 0  # ... that the stream would not let the sink delete
    unpositioned: int = 0  # order=subject: rows published as they came, without 'seq', not straight from a read
    batches: int = 0  # fast-ingest batches the rows went in (publish.mode; 0: a PubAck per row)
    run: str | None = None  # the task's run id (``<queryId>:<batchId>`` for a micro-batch)
    query_id: str | None = None  # a streaming write's query (the task's local properties), for the driver's log
    query_name: str | None = None


def describe_target(opts: SinkOptions) -> str:
    """Where a write goes, as its options name it (for the commit log line)."""
    if opts.bucket is not None:
        return f"bucket '{opts.bucket}'"
    if opts.stream is not None:
        return f"stream '{opts.stream}'"
    if opts.subject is not None:
        return f"subject '{opts.subject}'"
    return "the rows' subjects"


def log_totals(messages: Iterable[Any], batch_id: int | None = None, target: str | None = None) -> dict[str, int]:
    """Log a commit's totals, naming the target (:func:`describe_target`) and, for a streaming write,
    the query (its name, else its id, as the tasks saw them), so that the lines of two queries in one
    driver can be told apart."""
    totals = {"published": 0, "duplicates": 0, "dead_lettered": 0, "expired": 0, "markers_skipped": 0,
              "already_stored": 0, "older_in_write": 0, "older_than_stored": 0, "out_of_order": 0, "reordered": 0,
              "left_out_of_order": 0, "unpositioned": 0, "batches": 0}
    query = None
    samples = []
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            for key in totals:
                totals[key] += getattr(m, key)
            if query is None and m.query_id is not None:
                query = f"query '{m.query_name}'" if m.query_name else f"query id {m.query_id}"
            if m.subjects is not None and m.subjects.entries:
                samples.append((m.partition, m.subjects))
    totals["shared_subjects"] = _warn_shared(samples, target)
    where = f"batch {batch_id}" if batch_id is not None else "write"
    whose = ", ".join(part for part in (query, f"to {target}" if target else None) if part)
    whose = f" ({whose})" if whose else ""
    log.info("JetStream sink %s committed: %s%s", where, count_line(totals), whose)
    _warn_order(totals, where, whose)
    return totals


def count_line(totals: dict[str, int]) -> str:
    """A commit's counts in one short line: the four always there, then the others that are not zero.
    What each means is in docs/sink.md, "The commit line"."""
    parts = [f"{totals['published']} published", f"{totals['duplicates']} duplicates",
             f"{totals['dead_lettered']} dead-lettered", f"{totals['expired']} expired"]
    older = totals["older_in_write"] + totals["older_than_stored"]
    for count, label in ((totals["batches"], "fast-ingest batches"), (totals["markers_skipped"], "markers skipped"),
                         (totals["already_stored"], "stored before"), (totals["reordered"], "moved"),
                         (totals["left_out_of_order"], "out of order"), (totals["unpositioned"], "unpositioned"),
                         (totals["out_of_order"], "out of source order")):
        if count:
            parts.append(f"{count} {label}")
    if older:
        parts.append(f"{older} older skipped ({totals['older_than_stored']} not newer than the stored value, "
                     f"{totals['older_in_write']} superseded)")
    return ", ".join(parts)


def _warn_order(totals: dict[str, int], where: str, whose: str) -> None:
    """A WARNING per order problem a commit counted: what happened and what to do."""
    if totals["left_out_of_order"]:
        log.warning("JetStream sink %s%s: %d messages stay ahead of an earlier one of their subject (a leader change "
                    "or a failed attempt stored them so, and the stream would not let the sink delete or store their "
                    "moved copy: it denies deletes, or a limit refused the copy); see docs/guarantees.md, "
                    "'Clustered JetStream'", where, whose, totals["left_out_of_order"])
    if totals["unpositioned"]:
        log.warning("JetStream sink %s%s: %d rows published in the order they arrived, without the column 'seq': if "
                    "they are a copy of a JetStream read through a shuffle, each subject's order was not kept (keep the "
                    "columns 'stream' and 'seq' after `.repartition(n, \"subject\")`: docs/source.md, 'Splits: order "
                    "per subject')", where, whose, totals["unpositioned"])
    if totals["out_of_order"]:
        log.warning("JetStream sink %s%s: %d rows came after a later source sequence of their subject in the same "
                    "task: the source order was broken between the read and this write (a shuffle?), and the target "
                    "stores them so (docs/source.md, 'Splits: order per subject')", where, whose,
                    totals["out_of_order"])


def _warn_shared(samples: list, target: str | None) -> int:
    """Warn when a sample shows a subject written by several tasks (sink/order/decide.py): their rows were put in
    source order within each task, but the tasks published at the same time. How many sampled subjects."""
    from ..order.subject_sample import shared_subjects

    shared = shared_subjects(samples)
    if shared:
        subject, tasks = next(iter(sorted(shared.items())))
        log.warning(
            "JetStream sink%s: %d of the subjects sampled from this write were written by more than one task (e.g. "
            "%r by tasks %s), so their order in the target is not guaranteed: the rows did not come through "
            "`.repartition(n, \"subject\")` (for a bucket, \"key\") after the read (a cache, or a shuffle by "
            "something else?). See docs/source.md, 'Splits: order per subject'.",
            f" (to {target})" if target else "", len(shared), subject, ", ".join(map(str, tasks)))
    return len(shared)
