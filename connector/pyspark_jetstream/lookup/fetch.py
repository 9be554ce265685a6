"""The entries of a batch's keys, fetched from the bucket: batched direct gets (``multi_last``, up to 1,024
keys a request, several requests in flight), answered by any replica or mirror of a bucket that allows
them, as nats-py's ``kv.get`` is; a key they report missing is asked of the stream's leader
(client/direct_get.py), so a replica that is behind never makes a key look missing. A bucket without
direct gets is asked on its leader, key by key, pipelined. Transient failures (an election, no quorum)
are asked again until the lookup's ``timeout``; then the task fails naming the bucket.

:class:`Target` is what the driver learned of the bucket when the DataFrame was defined
(:func:`resolve_target`): its stream, the bucket its subjects name (a mirror holds its origin's), whether
it allows direct gets, and the sequence a pinned lookup (``asOf...``) reads at.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..client import jsapi, runtime
from ..client.direct_get import LEADER_WINDOW, last_of_subjects, leader_last
from ..errors import JetStreamConnectorError, StreamConfigError
from ..options import LookupOptions
from ..protocol.direct_get import DirectMessage
from ..source.columns.rows import BatchBuilder
from .join import Found

WINDOW = 8
"""Direct-get requests in flight at once (each up to 1,024 keys)."""


@dataclass(frozen=True)
class Target:
    """Module docstring."""

    stream: str
    key_bucket: str
    direct: bool
    up_to: int | None


def resolve_target(opts: LookupOptions) -> Target:
    """The bucket as the lookup reads it (module docstring), asked once on the driver."""

    async def ask() -> Target:
        nc = await runtime.connection(opts.connection)
        info = await jsapi.retrying(lambda timeout: jsapi.stream_info(nc, opts.stream, opts.api_prefix, timeout),
                                    deadline=time.monotonic() + opts.timeout)
        if info is None:
            raise StreamConfigError(f"KV bucket '{opts.bucket}' (stream {opts.stream}) does not exist. Check the "
                                    "lookup's option 'bucket'.")
        config = info["config"]
        origin = str((config.get("mirror") or {}).get("name") or "")
        key_bucket = origin[3:] if origin.startswith("KV_") and len(origin) > 3 else opts.bucket
        up_to = opts.as_of_sequence
        if opts.as_of_timestamp is not None:
            after = await jsapi.first_seq_at_or_after(nc, opts.stream, opts.as_of_timestamp, opts.api_prefix)
            up_to = (after - 1) if after is not None else int(info["state"].get("last_seq", 0))
            if up_to < 1:
                raise StreamConfigError(f"KV bucket '{opts.bucket}' holds nothing stored at or before "
                                        f"{opts.as_of_timestamp.isoformat()} (option 'asOfTimestamp').")
        direct = bool(config.get("allow_direct") or config.get("mirror_direct"))
        if up_to and not direct:
            raise StreamConfigError(f"KV bucket '{opts.bucket}' does not allow direct gets (allow_direct): a lookup "
                                    "pinned to a sequence (asOfSequence, asOfTimestamp) needs them.")
        return Target(opts.stream, key_bucket, direct, up_to)

    return runtime.run(ask(), timeout=opts.timeout + opts.connection.connect_timeout + 30)


async def _messages(opts: LookupOptions, target: Target, subjects: list[str]) -> list[DirectMessage]:
    nc = await runtime.connection(opts.connection)
    if target.direct:
        return await last_of_subjects(nc, target.stream, subjects, up_to=target.up_to, prefix=opts.api_prefix,
                                      timeout=min(opts.timeout, 30.0), patience=opts.timeout, newer=False,
                                      window=WINDOW)
    gate = asyncio.Semaphore(LEADER_WINDOW)

    async def one(subject: str) -> DirectMessage | None:
        async with gate:
            found = await leader_last(nc, target.stream, subject, prefix=opts.api_prefix,
                                      timeout=min(opts.timeout, 30.0))
        return found

    return [m for m in await asyncio.gather(*(one(s) for s in subjects)) if m is not None]


async def _fetch(opts: LookupOptions, target: Target, subjects: list[str]) -> list[DirectMessage]:
    """:func:`_messages`, asked again while the failure is transient, until the lookup's ``timeout``."""
    deadline = time.monotonic() + opts.timeout
    delays = jsapi.retry_delays()
    while True:
        try:
            return await _messages(opts, target, subjects)
        except Exception as exc:
            delay = next(delays)
            if not jsapi.is_transient(exc) or time.monotonic() + delay > deadline:
                raise JetStreamConnectorError(
                    f"Looking up {len(subjects)} keys in KV bucket '{opts.bucket}' failed: {type(exc).__name__}: "
                    f"{exc} (option 'timeout': {opts.timeout:g}s)") from None
            await asyncio.sleep(delay)


def fetch(opts: LookupOptions, target: Target, keys: list[str]) -> Found:
    """The live entries of ``keys`` (deleted, purged and expired keys left out, as ``kv.get`` leaves them)."""
    if not keys:
        return Found.empty()
    prefix = f"$KV.{target.key_bucket}."
    messages = runtime.run(_fetch(opts, target, [prefix + key for key in keys]),
                           timeout=opts.timeout + opts.connection.connect_timeout + 30)
    builder = BatchBuilder(target.stream, kv_bucket=target.key_bucket, drop_removed_keys=True,
                           columns=("key", "data", "seq", "timestamp"))
    for m in messages:
        builder.add(m.subject, m.data, m.headers, m.seq, m.ts_ns)
    batch = builder.build()
    return Found(batch.column("key"), batch.column("data"), batch.column("seq"), batch.column("timestamp"))
