"""The last message of each of a list of subjects, by batched direct get (``multi_last``).

One request per :data:`~pyspark_jetstream.protocol.direct_get.MULTI_LAST_MAX` subjects, answered
by any replica of a stream that allows direct gets (a KV bucket does), or by a mirror of it (a
mirror of a bucket answers them by default), each reply a raw message read from a raw subscription
(the stored header block is kept intact). Every request has a deadline.

A read asks every request at one sequence, ``up_to`` (``up_to_seq``): the view of the stream when
the read was planned, the same for every chunk and every partition. A batch is continued by the
subjects still missing, never by ``Nats-Num-Pending`` (wrong on nats-server 2.11). What the direct
gets report missing is looked up on the stream's leader (``STREAM.MSG.GET``): an answering replica
or mirror behind ``up_to`` says "No Results" for keys it has not got yet, and no direct-get reply
tells how far its store had got when ``up_to_seq`` is asked (the server echoes it).
"""

from __future__ import annotations

import asyncio
import json
import time

from ..errors import JetStreamApiError
from ..protocol.direct_get import (
    MULTI_LAST_MAX,
    UP_TO_SEQUENCE,
    BadReply,
    BatchEnd,
    DirectMessage,
    Outcome,
    message,
    still_missing,
    stored_message,
)
from ..protocol.headers import parse_headers, parse_status
from .jsapi import API_PREFIX, ERR_NO_MESSAGE_FOUND, request_unless, retry_delays
from .nats_internals import raw_subscribe, raw_unsubscribe

LEADER_WINDOW = 64
"""Most leader lookups of missing keys in flight at once."""


async def _batch(nc, api: str, prefix: str, body: dict, timeout: float) -> tuple[list[DirectMessage], BatchEnd]:
    """One batched request: its messages, and the status that ended it."""
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
    up_to = (headers.get(UP_TO_SEQUENCE) or [""])[-1].strip()
    end = BatchEnd(code, description or "", int(up_to) if up_to.isdigit() else None)
    if end.outcome is Outcome.FAIL:
        raise JetStreamApiError(api, code, 0, description or f"status {code}")
    return got, end


async def _direct(nc, stream: str, subjects: list[str], up_to: int | None, prefix: str, timeout: float,
                  patience: float) -> tuple[dict[bytes, DirectMessage], list[str]]:
    """The direct gets of one chunk: the messages found, by subject, and the subjects still missing.

    Asked again, for at most ``patience`` seconds: a batch ended by ``404 Message Not Found`` (a
    message expired or replaced between the server's lookup and its load), by ``503`` (no store
    answers direct gets just now) or by an EOB not of the view asked for. Messages a batch delivered
    before such an end are kept: each is the subject's last at ``up_to``, whoever sent it."""
    api = f"DIRECT.GET.{stream}"
    found: dict[bytes, DirectMessage] = {}
    missing = list(subjects)
    deadline = time.monotonic() + patience
    delays = retry_delays()
    while missing:
        body: dict = {"multi_last": missing, "batch": len(missing)}
        if up_to:
            body["up_to_seq"] = up_to
        got, end = await _batch(nc, api, prefix, body, timeout)
        for m in got:
            found.setdefault(m.subject, m)
        left = still_missing(missing, set(found))
        outcome = end.outcome
        if outcome is Outcome.NONE:
            return found, left
        if outcome is Outcome.END and end.of_view(up_to) and len(left) < len(missing):
            missing = left
            continue
        # 404 Message Not Found; 503; an EOB of another view; an EOB that answered nothing new: ask again.
        delay = next(delays)
        if time.monotonic() + delay > deadline:
            why = (f"the server kept failing to load messages it had found ({end.code} {end.description})"
                   if outcome is Outcome.RETRY else
                   "no responders (503): does the stream still exist and allow direct gets (allow_direct)?"
                   if outcome is Outcome.UNANSWERED else
                   f"the answers were not of the read's view (Nats-UpTo-Sequence {end.up_to}, asked {up_to})"
                   if not end.of_view(up_to) else "the server ended batches without answering any key asked")
            raise JetStreamApiError(api, end.code, 0, f"direct gets of {len(left)} keys gave up after "
                                                      f"{patience:g}s: {why}")
        await asyncio.sleep(delay)
        missing = left
    return found, []


async def leader_last(nc, stream: str, subject: str, *, prefix: str = API_PREFIX,
                      timeout: float = 10.0) -> DirectMessage | None:
    """The last message of ``subject`` as the stream's leader holds it (``STREAM.MSG.GET``
    ``last_by_subj``; no replica or mirror answers it), or None."""
    reply = await request_unless(ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject},
                                 timeout, prefix)
    return None if reply is None else stored_message(reply)


async def last_of_subjects(nc, stream: str, subjects: list[str], *, up_to: int | None = None,
                           prefix: str = API_PREFIX, timeout: float = 10.0, patience: float = 30.0,
                           newer: bool = True, window: int = 1) -> list[DirectMessage]:
    """The last message at ``up_to`` (None or 0: now) of each of ``subjects`` (literal subjects) that
    has one, in stream order per request; ``window`` requests in flight at once.

    A subject the direct gets find nothing for at ``up_to`` is looked up on the leader: absent there,
    it has no message; found at or before ``up_to``, the direct get was answered by a store behind
    ``up_to`` and the leader's message is the answer; found after it, the subject was written since,
    and its value at ``up_to`` may be gone (a bucket that keeps one value per key): its newer message
    is the answer (a key is never left out while it exists), unless ``newer`` is off (a lookup pinned to
    ``up_to``: the subject had no message there that the stream still holds)."""
    gate = asyncio.Semaphore(LEADER_WINDOW)
    requests = asyncio.Semaphore(window)

    async def confirm(subject: str) -> DirectMessage | None:
        async with gate:
            found = await leader_last(nc, stream, subject, prefix=prefix, timeout=timeout)
        return found if found is None or newer or not up_to or found.seq <= up_to else None

    async def chunk(asked: list[str]) -> list[DirectMessage]:
        async with requests:
            found, missing = await _direct(nc, stream, asked, up_to, prefix, timeout, patience)
        confirmed = await asyncio.gather(*(confirm(s) for s in missing))
        return sorted([*found.values(), *(m for m in confirmed if m is not None)], key=lambda m: m.seq)

    answers = await asyncio.gather(*(chunk(subjects[i:i + MULTI_LAST_MAX])
                                     for i in range(0, len(subjects), MULTI_LAST_MAX)))
    return [m for answer in answers for m in answer]
