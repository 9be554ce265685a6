"""The last message of each of a list of subjects, by batched direct get (``multi_last``).

One request per :data:`~pyspark_jetstream.protocol.direct_get.MULTI_LAST_MAX` subjects, answered
by any replica of a stream that allows direct gets (a KV bucket does), each reply a raw message
read from a raw subscription (the stored header block is kept intact). Every request has a deadline.
"""

from __future__ import annotations

import asyncio
import json

from ..errors import JetStreamApiError
from ..protocol.direct_get import (
    MULTI_LAST_MAX,
    NUM_PENDING,
    UP_TO_SEQUENCE,
    BadReply,
    DirectMessage,
    message,
)
from ..protocol.headers import parse_headers, parse_status
from .jsapi import API_PREFIX
from .nats_internals import raw_subscribe, raw_unsubscribe


async def _batch(nc, api: str, prefix: str, body: dict, timeout: float) -> tuple[list[DirectMessage], dict]:
    """One batched request: its messages, and the headers of the status that ended it."""
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    got: list[DirectMessage] = []

    def on_frame(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if done.done():
            return
        try:
            code, description = parse_status(headers or b"")
            if code:
                done.set_result((code, description, parse_headers(headers or b"")))
            else:
                got.append(message(subject, data, headers or b""))
        except BadReply as exc:
            done.set_exception(JetStreamApiError(api, 0, 0, f"a reply the connector cannot read: {exc}"))

    inbox = nc.new_inbox()
    sub = await raw_subscribe(nc, inbox, on_frame)
    try:
        await nc.publish(f"{prefix}.{api}", json.dumps(body).encode(), reply=inbox)
        try:
            code, description, headers = await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            raise JetStreamApiError(api, 408, 0, f"no end of the batch within {timeout:g}s") from None
    finally:
        await raw_unsubscribe(nc, sub)
    if code == 204 or (code == 404 and not got):
        return got, {k: v[-1] for k, v in headers.items()}
    if code == 503:
        description = "no responders: does the stream allow direct gets (allow_direct)?"
    raise JetStreamApiError(api, code, 0, description or f"status {code}")


async def last_of_subjects(nc, stream: str, subjects: list[str], *, prefix: str = API_PREFIX,
                           timeout: float = 10.0) -> list[DirectMessage]:
    """The last message of each of ``subjects`` (literal subjects) that has one, in stream order per
    request. A batch cut short by the server's byte limit is continued at the same ``up_to_seq``, so
    every answer is of one view of the stream per request."""
    api = f"DIRECT.GET.{stream}"
    out: list[DirectMessage] = []
    for i in range(0, len(subjects), MULTI_LAST_MAX):
        left = subjects[i:i + MULTI_LAST_MAX]
        up_to: int | None = None
        while left:
            body: dict = {"multi_last": left, "batch": len(left)}
            if up_to is not None:
                body["up_to_seq"] = up_to
            got, end = await _batch(nc, api, prefix, body, timeout)
            out.extend(got)
            if not got or int(end.get(NUM_PENDING) or 0) == 0:
                break
            up_to = int(end.get(UP_TO_SEQUENCE) or 0) or None
            taken = {m.subject for m in got}
            left = [s for s in left if s.encode() not in taken]
    return out
