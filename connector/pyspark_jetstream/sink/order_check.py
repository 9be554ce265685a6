"""Noticing, cheaply, rows of a copy whose source order was broken before they reached the sink.

**Why.** A copy keeps each subject's order when one task publishes a subject's rows in source
order (the source's split by subject does that; see the README's "Splits"). A shuffle between read
and write (``repartition``, a join, an aggregation) can hand a task a subject's rows out of order,
and the target then stores them so, silently. The sink sees the source's ``stream`` and ``seq``
columns of rows as read, so within a task it can count the rows that arrive after a later sequence
of the same source stream and target subject (or key), and say so in its commit log line. Rows of
one subject split over several tasks cannot be seen from any one task: the README says what to do.

Column-wise per batch (one stable sort by stream and subject, neighbours compared); Python only per
distinct (stream, subject) of a batch, to carry each one's last sequence into the next batch.
"""

from __future__ import annotations

from typing import Any


class OrderCheck:
    """Where one task's rows of a (source stream, subject) go backwards in source sequence: each row
    right after a higher sequence of its own (stream, subject), within a batch or across batches."""

    def __init__(self, subject: str | None, stream: str, seq: str) -> None:
        self.columns = (subject, stream, seq)  # subject None: every row goes to the one default subject
        self.last: dict[tuple[Any, Any], int] = {}
        self.behind = 0

    def add(self, batch: Any) -> None:
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
        table = pa.table({"stream": streams, "subject": subjects, "seq": seqs, "at": pa.array(range(n))})
        table = table.sort_by([("stream", "ascending"), ("subject", "ascending"), ("at", "ascending")])
        st, sj, sq = table.column("stream"), table.column("subject"), table.column("seq")
        if n > 1:
            same = pc.and_(pc.equal(st.slice(1), st.slice(0, n - 1)).fill_null(True),
                           pc.equal(sj.slice(1), sj.slice(0, n - 1)).fill_null(True))
            # Nulls compare as equal here only when both are null (one default subject, no stream).
            same = pc.and_(same, pc.equal(pc.is_null(sj.slice(1)), pc.is_null(sj.slice(0, n - 1))))
            down = pc.less(sq.slice(1), sq.slice(0, n - 1))
            self.behind += pc.sum(pc.and_(same, down).cast(pa.int64())).as_py() or 0
            starts = [0] + [i + 1 for i in pc.indices_nonzero(pc.invert(same)).to_pylist()]
        else:
            starts = [0]
        lasts = [i - 1 for i in starts[1:]] + [n - 1]
        first_seq, last_seq = pc.take(sq, starts).to_pylist(), pc.take(sq, lasts).to_pylist()
        keys = zip(pc.take(st, starts).to_pylist(), pc.take(sj, starts).to_pylist(), strict=True)
        for key, first, last in zip(keys, first_seq, last_seq, strict=True):  # carry each one's last sequence
            before = self.last.get(key)
            if before is not None and first < before:
                self.behind += 1
            self.last[key] = last if before is None else max(last, before)
