"""What a partition settles when its task runs: the stream still the one planned, its end, its subjects.

A plan names a stream (and its creation time), a range and a split; the task settles the rest from
one ``STREAM.INFO`` (with the subjects listed for a split by subject): that the stream was neither
deleted nor recreated since (:mod:`.stream_checks`), the end of a read planned without one, and the
consumers it runs, each with the filter subjects of the groups it owns and the
:class:`~..plan.subject_split.SubjectKeep` that keeps its messages when the server does not filter
them exactly (:func:`~..plan.subject_split.consumers_for`).
"""

from __future__ import annotations

import asyncio
import time

from ...client import runtime
from ...client.jsapi import is_transient, retry_delays, stream_info, stream_subjects
from ...options import SourceOptions
from ..plan.subject_split import ALL, SubjectKeep, consumers_for, sequence_consumer
from .stream_checks import still_the_planned_stream


async def resolve(opts: SourceOptions, stream: str, first: int, last: int | None, created: str | None,
                  last_per_subject: bool, split: tuple[int | None, int] | None,
                  index: int) -> tuple[int | None, list[tuple[tuple[str, ...], SubjectKeep | None]]] | None:
    """What a partition settles when it runs, from one ``STREAM.INFO`` (with the subjects listed for a
    split by subject): that the stream is still the one planned, the end of a read without one (the
    stream's last sequence now; a snapshot's consumers decide their own), and the filter subjects of
    each consumer it runs. None when the partition has nothing to read (a recreated stream whose
    range is skipped, ``failOnDataLoss=false``): each with the :class:`~..plan.subject_split.SubjectKeep` that
    keeps its messages when the server does not filter them exactly (:func:`~..plan.subject_split.consumers_for`)."""
    depth, parts = split if split is not None else (ALL, 1)
    listing = split is not None and depth != ALL
    if not listing and created is None and (last is not None or last_per_subject):
        if split is None:
            return last, [sequence_consumer(opts.filter_subjects)]
        return last, consumers_for((), depth, parts, index, opts.filter_subjects, by_owner=not last_per_subject)
    nc = await runtime.connection(opts.connection)
    delays = retry_delays()
    deadline = time.monotonic() + opts.max_wait
    while True:
        try:
            if listing:
                info, subjects = await stream_subjects(nc, stream, opts.filter_subjects, opts.api_prefix)
            else:
                info, subjects = await stream_info(nc, stream, opts.api_prefix), []
            break
        except Exception as exc:
            delay = next(delays)
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
    if not still_the_planned_stream(opts, stream, info, created, first, last):
        return None
    if last is None and not last_per_subject:
        last = int(info["state"].get("last_seq", 0))
    if split is None:
        return last, [sequence_consumer(opts.filter_subjects)]
    return last, consumers_for(subjects, depth, parts, index, opts.filter_subjects, by_owner=not last_per_subject)


def listed_subjects(filters: tuple[str, ...]) -> tuple[str, ...] | None:
    """The subjects an open snapshot's consumer must deliver once each before it is complete: its filters,
    when they name subjects (a split by literal subject); None for wildcard filters."""
    return None if any("*" in f or ">" in f for f in filters) else filters
