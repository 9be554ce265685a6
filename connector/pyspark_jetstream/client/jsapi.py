"""Minimal JetStream API requests over a nats-py connection.

Every request goes to ``<prefix>.<api>``: ``$JS.API`` by default, ``$JS.<domain>.API``
for another JetStream domain (a hub seen from a leaf node), or the prefix under which
an account imports another account's JetStream API (options ``domain`` /
``apiPrefix``, :func:`pyspark_jetstream.options.connection.api_prefix`).

The connector needs a handful of calls (stream info/create/update, stream names
by subject) and wants every error as a typed :class:`JetStreamApiError` with the
server's ``err_code``, which nats-py's JetStreamManager does not give uniformly.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as _dt
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple, TypeVar

from ..errors import JetStreamApiError
from ..protocol.direct_get import start_time

API_PREFIX = "$JS.API"

# JetStream err_codes the connector reacts to (server/errors.json).
ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_INVALID_CONFIG = 10052
ERR_STREAM_SUBJECT_OVERLAP = 10065
ERR_EXPECTED_STREAM_MISMATCH = 10060
ERR_MESSAGE_TTL_INVALID = 10165
ERR_MESSAGE_TTL_DISABLED = 10166
ERR_NO_MESSAGE_FOUND = 10037
ERR_CONSUMER_NOT_FOUND = 10014
ERR_MAXIMUM_CONSUMERS = 10026


def is_transient(exc: BaseException) -> bool:
    """Worth asking again: no reply in time (a node died, a leader is being
    elected) or 503 (no responders, JetStream temporarily unavailable). A
    refusal with an err_code (stream not found, bad config) is not."""
    if isinstance(exc, JetStreamApiError):
        return exc.code in (408, 503)
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError, OSError))


def retry_delays() -> Iterator[float]:
    """Seconds to wait before each new attempt after a transient failure: 0.25s,
    doubling, at most 5s (the caller bounds the total by its own deadline)."""
    delay = 0.25
    while True:
        yield delay
        delay = min(delay * 2, 5.0)


T = TypeVar("T")


async def retrying(call: Callable[[float], Awaitable[T]], deadline: float, timeout: float = 10.0) -> T:
    """``call(timeout)``, asked again after :func:`retry_delays` while it fails transiently (:func:`is_transient`:
    a stream leader being elected answers nothing, a JetStream without quorum answers 503) until ``deadline``
    (a :func:`time.monotonic` instant), when the last failure is raised. Each attempt waits at most
    ``timeout`` for its reply, and never past the deadline (but at least a second)."""
    delays = retry_delays()
    while True:
        try:
            return await call(max(1.0, min(timeout, deadline - time.monotonic())))
        except Exception as exc:
            delay = next(delays)
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)


async def request(nc, api: str, body: dict[str, Any] | None = None, timeout: float = 10.0,
                  prefix: str = API_PREFIX) -> dict[str, Any]:
    """Send ``<prefix>.<api>`` and return the JSON reply; raise on an error reply."""
    import nats.errors

    payload = json.dumps(body).encode() if body is not None else b""
    try:
        msg = await nc.request(f"{prefix}.{api}", payload, timeout=timeout)
    except nats.errors.NoRespondersError:
        raise JetStreamApiError(api, 503, 0, "no responders: is JetStream enabled on the server?") from None
    except nats.errors.TimeoutError:
        from .nats_internals import events_of

        refused = events_of(nc).permission_error_for(f"{prefix}.{api}")
        if refused is not None:
            raise JetStreamApiError(api, 403, 0, f"the server refused it: {refused}") from None
        raise JetStreamApiError(api, 408, 0, f"no reply within {timeout:g}s") from None
    reply = json.loads(msg.data or b"{}")
    error = reply.get("error")
    if error:
        raise JetStreamApiError(api, int(error.get("code", 0)), int(error.get("err_code", 0)), error.get("description", ""))
    return reply


async def request_unless(missing: int, nc, api: str, body: dict[str, Any] | None = None, timeout: float = 10.0,
                         prefix: str = API_PREFIX) -> dict[str, Any] | None:
    """:func:`request`, but ``None`` when the server answers with err_code ``missing`` (the stream,
    consumer or message asked for does not exist)."""
    try:
        return await request(nc, api, body, timeout, prefix)
    except JetStreamApiError as exc:
        if exc.err_code == missing:
            return None
        raise


def server_version(nc) -> tuple[int, int, int] | None:
    """The connected server's version (from its INFO), or None when it does not parse."""
    version = nc.connected_server_version
    try:
        return version.major, version.minor, version.patch
    except (TypeError, ValueError):
        return None


async def stream_info(nc, stream: str, prefix: str = API_PREFIX, timeout: float = 10.0) -> dict[str, Any] | None:
    """``STREAM.INFO`` reply, or ``None`` when the stream does not exist."""
    return await request_unless(ERR_STREAM_NOT_FOUND, nc, f"STREAM.INFO.{stream}", timeout=timeout, prefix=prefix)


async def stream_subjects(nc, stream: str, filters: tuple[str, ...] = (),
                          prefix: str = API_PREFIX) -> tuple[dict[str, Any] | None, list[str]]:
    """``STREAM.INFO`` (the first reply: its state is as old as the listing) and every subject stored
    that matches ``filters`` (all when empty), asking page after page (the server lists at most
    100,000 subjects per reply); ``(None, [])`` when the stream does not exist."""
    first: dict[str, Any] | None = None
    subjects: list[str] = []
    for subject_filter in filters or (">",):
        offset = 0
        while True:
            reply = await request_unless(ERR_STREAM_NOT_FOUND, nc, f"STREAM.INFO.{stream}",
                                         {"subjects_filter": subject_filter, "offset": offset}, prefix=prefix)
            if reply is None:
                return None, []
            if first is None:
                first = reply
            page = (reply.get("state") or {}).get("subjects") or {}
            subjects.extend(page)
            offset += len(page)
            if not page or offset >= int(reply.get("total") or 0):
                break
    return first, subjects


async def stream_names_for_subject(nc, subject: str, prefix: str = API_PREFIX) -> list[str]:
    reply = await request(nc, "STREAM.NAMES", {"subject": subject}, prefix=prefix)
    return list(reply.get("streams") or [])


async def streams_capturing(nc, subject: str, prefix: str = API_PREFIX) -> list[tuple[str, list[str]]]:
    """(name, subjects) of the streams whose subjects overlap ``subject`` (wildcards too), from one
    ``STREAM.LIST`` page (256 streams): for error messages, which name what is there."""
    reply = await request(nc, "STREAM.LIST", {"subject": subject}, prefix=prefix)
    return [(s["config"]["name"], list(s["config"].get("subjects") or [])) for s in reply.get("streams") or []]


async def create_stream(nc, config: dict[str, Any], prefix: str = API_PREFIX) -> dict[str, Any]:
    return await request(nc, f"STREAM.CREATE.{config['name']}", config, prefix=prefix)


async def update_stream(nc, config: dict[str, Any], prefix: str = API_PREFIX) -> dict[str, Any]:
    return await request(nc, f"STREAM.UPDATE.{config['name']}", config, prefix=prefix)


LAST_NANOSECOND_TIME = _dt.datetime(2262, 4, 11, 23, 47, 16, tzinfo=_dt.timezone.utc)
"""Past this, a time no longer fits int64 nanoseconds: nats-server 2.15.1 answers a ``start_time``
beyond it with sequence 1 (the time wraps), so such a time is answered here: nothing is that recent."""


async def first_seq_at_or_after(nc, stream: str, when, prefix: str = API_PREFIX) -> int | None:
    """The first sequence stored at or after ``when`` (server-side binary search), or None."""
    if when >= LAST_NANOSECOND_TIME:
        return None
    reply = await request_unless(ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}", {"start_time": start_time(when)},
                                 prefix=prefix)
    return None if reply is None else int(reply["message"]["seq"])


async def last_message_of_subject(nc, stream: str, subject: str, prefix: str = API_PREFIX,
                                  timeout: float = 10.0) -> tuple[int, bytes] | None:
    """(seq, header block) of the last message on ``subject`` (``last_by_subj``), or None."""
    reply = await request_unless(ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject},
                                 timeout=timeout, prefix=prefix)
    if reply is None:
        return None
    m = reply["message"]
    return int(m["seq"]), base64.b64decode(m.get("hdrs") or "")


class StoredMessage(NamedTuple):
    seq: int
    size: int  # subject + header block + payload, as the server counts a message (without the ack subject)


async def next_message(nc, stream: str, seq: int, filters: tuple[str, ...] = (),
                       prefix: str = API_PREFIX, timeout: float = 10.0) -> StoredMessage | None:
    """The first message at or after ``seq`` matching ``filters`` (all when empty), or None."""
    found: list[StoredMessage] = []
    for subject in filters or (">",):
        reply = await request_unless(ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}",
                                     {"seq": seq, "next_by_subj": subject}, timeout, prefix)
        if reply is None:
            continue
        m = reply["message"]
        size = len(m["subject"]) + len(base64.b64decode(m.get("hdrs") or "")) + len(base64.b64decode(m.get("data") or ""))
        found.append(StoredMessage(int(m["seq"]), size))
    return min(found) if found else None


async def consumer_info(nc, stream: str, consumer: str, prefix: str = API_PREFIX) -> dict[str, Any] | None:
    """``CONSUMER.INFO`` reply, or ``None`` when the consumer does not exist."""
    return await request_unless(ERR_CONSUMER_NOT_FOUND, nc, f"CONSUMER.INFO.{stream}.{consumer}", prefix=prefix)


async def move_bookmark(nc, stream: str, consumer: str, next_seq: int, filters: tuple[str, ...],
                        prefix: str = API_PREFIX) -> None:
    """Point durable AckNone consumer ``consumer`` at ``next_seq`` (consumer reset API, nats-server 2.14+)."""
    if await consumer_info(nc, stream, consumer, prefix) is None:
        config: dict[str, Any] = {
            "durable_name": consumer, "name": consumer, "ack_policy": "none",
            "deliver_policy": "by_start_sequence", "opt_start_seq": max(next_seq, 1),
            "description": "pyspark-jetstream bookmark: the next sequence the Spark query will read",
        }
        if filters:
            config["filter_subjects"] = list(filters)
        await request(nc, f"CONSUMER.CREATE.{stream}.{consumer}", {"stream_name": stream, "config": config},
                      prefix=prefix)
        return
    await request(nc, f"CONSUMER.RESET.{stream}.{consumer}", {"seq": max(next_seq, 1)}, prefix=prefix)


ERR_WRONG_LAST_SEQUENCE = 10071
"""A publish with ``Nats-Expected-Last-Subject-Sequence`` whose subject has moved on (compare-and-set lost)."""


class LastMessage(NamedTuple):
    """A subject's last message as a compare-and-set needs it: its sequence (0: the subject has
    none) and its headers (one value per name, the last, as nats-py keeps them)."""

    seq: int
    headers: dict[str, str]


def _header(headers: dict[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


async def last_message(nc, stream: str, subject: str, *, direct: bool, prefix: str = API_PREFIX,
                       timeout: float = 10.0) -> LastMessage:
    """The last message of ``subject`` in ``stream``: a direct get (``DIRECT.GET.<stream>.<subject>``,
    answered by any replica; a KV bucket allows them) or, with ``direct`` false, ``STREAM.MSG.GET``
    ``last_by_subj`` (answered by the leader)."""
    if not direct:
        reply = await request_unless(ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject},
                                     timeout, prefix)
        if reply is None:
            return LastMessage(0, {})
        from ..protocol.headers import parse_headers

        m = reply["message"]
        block = base64.b64decode(m.get("hdrs") or "")
        parsed = parse_headers(block) if block else {}
        return LastMessage(int(m["seq"]), {k: v[-1] for k, v in parsed.items()})
    import nats.errors

    api = f"DIRECT.GET.{stream}.{subject}"
    try:
        msg = await nc.request(f"{prefix}.{api}", b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        raise JetStreamApiError(api, 503, 0, "no responders: does the stream allow direct gets?") from None
    except nats.errors.TimeoutError:
        raise JetStreamApiError(api, 408, 0, f"no reply within {timeout:g}s") from None
    headers = msg.headers or {}
    status = _header(headers, "Status")
    if status == "404":
        return LastMessage(0, {})
    if status:
        raise JetStreamApiError(api, int(status) if status.isdigit() else 0, 0,
                                _header(headers, "Description") or f"status {status}")
    seq = _header(headers, "Nats-Sequence")
    if seq is None:
        raise JetStreamApiError(api, 0, 0, "a direct get reply without Nats-Sequence")
    return LastMessage(int(seq), dict(headers))


async def last_messages(nc, stream: str, subjects: list[str], *, direct: bool, prefix: str = API_PREFIX,
                        window: int = 512, timeout: float = 10.0) -> list[LastMessage]:
    """:func:`last_message` of each subject, at most ``window`` requests in flight (pipelined on the
    connection); in the order of ``subjects``."""
    out: list[LastMessage | None] = [None] * len(subjects)
    gate = asyncio.Semaphore(window)

    async def one(i: int, subject: str) -> None:
        async with gate:
            out[i] = await last_message(nc, stream, subject, direct=direct, prefix=prefix, timeout=timeout)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(subjects)))
    return out  # type: ignore[return-value]


def header_of(message: LastMessage, name: str) -> str | None:
    """A header of ``message`` by name, case-insensitively."""
    return _header(message.headers, name)
