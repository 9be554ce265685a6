"""A bucket's latest view of a few keys, by batched direct get (option ``keys``): the last message of
each key, deleted and purged keys left out as the latest view leaves them out
(:class:`~..columns.rows.BatchBuilder` with ``drop_removed_keys``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from ...client import runtime
from ...client.direct_get import last_of_subjects
from ...client.jsapi import is_transient, retry_delays, stream_info
from ...errors import PartitionReadError
from ...options import SourceOptions
from ...protocol.direct_get import MULTI_LAST_MAX, DirectMessage
from ..columns.rows import BatchBuilder


async def _fetch(opts: SourceOptions, stream: str, subjects: list[str], up_to: int | None) -> list[DirectMessage]:
    """:func:`last_of_subjects` at ``up_to``, asked again while the failure is transient, for at most
    ``consume.maxWait``."""
    nc = await runtime.connection(opts.connection)
    delays = retry_delays()
    deadline = time.monotonic() + opts.max_wait
    while True:
        try:
            return await last_of_subjects(nc, stream, subjects, up_to=up_to, prefix=opts.api_prefix,
                                          timeout=min(opts.max_wait, 30.0), patience=opts.max_wait)
        except Exception as exc:
            delay = next(delays)
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise PartitionReadError(
                    f"Reading the last values of {len(subjects)} keys of stream '{stream}' by direct get failed: "
                    f"{type(exc).__name__}: {exc}") from None
            await asyncio.sleep(delay)


async def _last_seq(opts: SourceOptions, stream: str) -> int | None:
    nc = await runtime.connection(opts.connection)
    info = await stream_info(nc, stream, opts.api_prefix, timeout=min(opts.max_wait, 30.0))
    return None if info is None else int(info["state"]["last_seq"])


def read_keys(opts: SourceOptions, stream: str, subjects: tuple[str, ...], max_age: float,
              up_to: int | None = None) -> Iterator[Any]:
    """Arrow batches of the last message of each of ``subjects`` that is a live key, at sequence
    ``up_to`` (a read's explicit end), or as the keys are now: a task with more keys than one request
    takes asks every request at the stream's last sequence when it starts, so that they all read the
    same point in time."""
    if up_to is None and len(subjects) > MULTI_LAST_MAX:
        up_to = runtime.run(_last_seq(opts, stream), timeout=opts.max_wait + 60) or None
    builder = BatchBuilder(stream, include_markers=opts.include_markers, kv_bucket=opts.key_bucket, max_age=max_age,
                           drop_removed_keys=True, columns=opts.columns)
    for i in range(0, len(subjects), MULTI_LAST_MAX):
        chunk = list(subjects[i:i + MULTI_LAST_MAX])
        found = runtime.run(_fetch(opts, stream, chunk, up_to), timeout=opts.max_wait + 60)
        for m in sorted(found, key=lambda m: m.seq):
            builder.add(m.subject, m.data, m.headers, m.seq, m.ts_ns)
            if len(builder) >= opts.batch_size:
                yield builder.build()
    if len(builder):
        yield builder.build()
