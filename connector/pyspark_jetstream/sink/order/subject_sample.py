"""A small sample of the subjects each task wrote, for the driver to see a subject written by two tasks.

Rows that reach the sink by a way no task can check (a cache, a shuffle by something else than the
subject) may have one subject in several tasks, whose order in the target is then not kept: each
task reports a bottom-k sample of its subjects' hashes in its commit message, and the driver warns
when two samples share a subject (:func:`shared_subjects`, logged by
:func:`~pyspark_jetstream.sink.task.commit.log_totals`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SubjectSample:
    """The subjects with the smallest hashes among those a task wrote (a bottom-k sample): two tasks'
    samples share a subject only if both wrote it, and when many subjects are in several tasks
    (a narrow read split by sequence, a shuffle by something else) the smallest hashes are the
    same in each, so the driver sees it. Rare shared subjects may be missed: it is a warning, the
    refusal in :func:`decide` is the guard."""

    entries: tuple[tuple[int, str], ...] = ()

    K = 64

    def merged(self, subjects: Any) -> SubjectSample:
        """With the distinct values of an Arrow string array ``subjects`` (nulls skipped)."""
        import pyarrow.compute as pc

        found = dict(self.entries)
        bound = max(found) if len(found) >= self.K else None
        for subject in pc.unique(subjects.drop_null()).to_pylist():
            text = subject if isinstance(subject, str) else bytes(subject).decode("utf-8", "replace")
            h = zlib.crc32(text.encode()) << 32 | zlib.adler32(text.encode())
            if bound is not None and h >= bound:
                continue
            found[h] = text
            if len(found) > self.K:
                del found[max(found)]
                bound = max(found)
        return SubjectSample(tuple(sorted(found.items())))


def shared_subjects(samples: Sequence[tuple[int, SubjectSample]]) -> dict[str, list[int]]:
    """Subjects that appear in the samples of more than one task: subject -> the tasks' partitions."""
    seen: dict[str, list[int]] = {}
    for partition, sample in samples:
        for _, subject in sample.entries:
            seen.setdefault(subject, []).append(partition)
    return {s: sorted(p) for s, p in seen.items() if len(set(p)) > 1}
