"""Noticing, cheaply, rows of a copy whose source order was broken before they reached the sink.

**Why.** A copy keeps each subject's order when one task publishes a subject's rows in source
order (the source's split by subject does that; see docs/source.md, "Splits: order per subject").
A shuffle between read and write (``repartition``, a join, an aggregation) can hand a task a subject's rows out of order,
and the target then stores them so, silently. The sink sees the source's ``stream`` and ``seq``
columns of rows as read, so within a task it can count the rows that arrive after a later sequence
of the same source stream and target subject (or key), and say so in its commit log line. Rows of
one subject split over several tasks cannot be seen from any one task: docs/source.md says what to do.

Column-wise per batch, in Arrow's C++ kernels only: a batch whose sequences never go down needs no
sort (rows as read come so); otherwise one stable sort by stream and subject and neighbours compared.
Across batches, each (stream, subject)'s lowest sequence in the batch is joined with the highest
one seen before in the task.

**Memory.** The table of highest sequences holds at most ``max_subjects`` (stream, subject) pairs
(:data:`MAX_SUBJECTS`): past that, those whose highest sequence is lowest are forgotten (rows as read
come in sequence order, so they are the subjects the task met longest ago). A forgotten subject seen
again below its old highest sequence is not counted: the count is a lower bound, never a false alarm,
and the check costs the same per batch whatever the number of subjects a task writes.
"""

from __future__ import annotations

from typing import Any

MAX_SUBJECTS = 100_000
"""(Source stream, subject) pairs whose highest sequence a task remembers (about 30 bytes each plus the names)."""


class OrderCheck:
    """Where one task's rows of a (source stream, subject) go backwards in source sequence: each row
    right after a higher sequence of its own (stream, subject) in a batch, and each (stream, subject)
    whose lowest sequence in a batch is below the highest of an earlier batch."""

    KEYS = ("stream", "subject")

    def __init__(self, subject: str | None, stream: str, seq: str, max_subjects: int = MAX_SUBJECTS) -> None:
        self.columns = (subject, stream, seq)  # subject None: every row goes to the one default subject
        self.seen: Any = None  # (stream, subject, top): the highest sequence of each, over earlier batches
        self.behind = 0
        self.max_subjects = max_subjects
        self.forgotten = 0  # (stream, subject) pairs dropped from ``seen`` to keep it within max_subjects

    def check(self, batch: Any) -> None:
        """Count the rows of ``batch`` that step back in their (stream, subject)'s source sequence."""
        import pyarrow as pa
        import pyarrow.compute as pc

        subject, stream, seq = self.columns
        seqs = batch.column(seq)
        streams = batch.column(stream)
        subjects = batch.column(subject) if subject is not None else pa.nulls(batch.num_rows, pa.string())
        keep = pc.is_valid(seqs)
        if keep.false_count:
            seqs, streams, subjects = seqs.filter(keep), streams.filter(keep), subjects.filter(keep)
        n = len(seqs)
        if n == 0:
            return
        table = pa.table({"stream": pc.fill_null(streams.cast(pa.string()), ""),
                          "subject": pc.fill_null(subjects.cast(pa.string()), ""), "seq": seqs.cast(pa.int64())})
        if n > 1 and (pc.min(pc.subtract(seqs.slice(1), seqs.slice(0, n - 1))).as_py() or 0) < 0:
            ordered = table.append_column("at", pa.array(range(n))).sort_by(
                [("stream", "ascending"), ("subject", "ascending"), ("at", "ascending")])
            st, sj, sq = ordered.column("stream"), ordered.column("subject"), ordered.column("seq")
            same = pc.and_(pc.equal(st.slice(1), st.slice(0, n - 1)), pc.equal(sj.slice(1), sj.slice(0, n - 1)))
            self.behind += pc.sum(pc.and_(same, pc.less(sq.slice(1), sq.slice(0, n - 1)))).as_py() or 0
        groups = table.group_by(list(self.KEYS), use_threads=False).aggregate([("seq", "min"), ("seq", "max")])
        if self.seen is not None:
            joined = groups.join(self.seen, keys=list(self.KEYS), join_type="inner", use_threads=False)
            self.behind += pc.sum(pc.less(joined.column("seq_min"), joined.column("top"))).as_py() or 0
            tops = pa.concat_tables([self.seen, groups.select([*self.KEYS, "seq_max"]).rename_columns(
                [*self.KEYS, "top"])])
            self.seen = tops.group_by(list(self.KEYS), use_threads=False).aggregate([("top", "max")]) \
                .select([*self.KEYS, "top_max"]).rename_columns([*self.KEYS, "top"])
        else:
            self.seen = groups.select([*self.KEYS, "seq_max"]).rename_columns([*self.KEYS, "top"])
        if self.seen.num_rows > self.max_subjects:
            keep = pc.select_k_unstable(self.seen, self.max_subjects, sort_keys=[("top", "descending")])
            self.forgotten += self.seen.num_rows - self.max_subjects
            self.seen = self.seen.take(keep)
