"""Replayed compare-and-set rows (``expected_revision``): refused, yet stored by an earlier attempt.

A row that carries ``expected_revision`` is published with ``Nats-Expected-Last-Subject-Sequence``.
When a retried task, a replayed micro-batch, a ``save()`` retried with its ``writeId`` or a resend
after a reconnect sends such a row again after its first attempt stored it, the key has moved on
(to the row's own revision, or past it) and the server refuses it with 10071, on nats-server 2.12 and
later even inside the duplicate window: a single server checks the expected sequence before the
``Nats-Msg-Id`` (``processJetStreamMsg``; 2.11, and clustered streams, de-duplicate first). The sink's replay
records (``replay_guard``) keep most such rows from being sent at all, but not rows whose message a
later row of their key replaced (history 1), nor any row with ``sinkState=none``.

So a row refused with 10071 that carries a ``Nats-Msg-Id`` is looked for, and counted as stored
(``already stored``, not failed, not dead-lettered) when the bucket shows its id:

1. the key's last message carries it (one ``STREAM.MSG.GET``: the common replay);
2. the duplicate window holds it (one empty publish that stores nothing,
   :func:`~pyspark_jetstream.protocol.kv.duplicate_probe_headers`): a row replaced since. Asked of a
   single-replica bucket only: a replicated stream checks ``Nats-Expected-Last-Msg-Id`` when it applies
   the proposal, and nats-server 2.15.1 takes the mismatch there for a critical write error on every
   replica, leaving the stream without a leader (reproduced here: ``last msgid mismatch``, every
   ``STREAM.MSG.GET`` then unanswered or 503/10008; issue #54);
3. one of the key's older messages carries it (buckets with history > 1: a walk by subject).

Ids are compared as rows (:func:`same_row`): a row an ordered write moved back into its key's order after
a leader change is stored under its id with a ``:o<round>`` suffix (:mod:`~pyspark_jetstream.sink.publish.reorder`), its first copy
deleted; the duplicate window is asked for the row's own id, which its first copy carried.

Otherwise the refusal stands, as for any stale row. What this cannot see: a row stored by an
earlier attempt, past the duplicate window, whose message the bucket no longer holds (replaced by
later values of its key beyond the bucket's history, purged, expired): it is refused (docs/kv.md).
A row the first attempt refused is refused again (its id was never stored).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

from ...client import jsapi
from ...logs import get_logger
from ...protocol import kv
from ...protocol.puback import parse_puback
from ..encode.msg_ids import base_id

log = get_logger("sink")

WINDOW = 256
"""Rows looked for at once (their requests pipelined on the task's connection)."""


def same_row(stored_id: str | None, msg_id: str) -> bool:
    """Whether a message stored with ``stored_id`` is the row published as ``msg_id``: the same id once a
    copy moved back into order (``:o<round>``, :func:`~pyspark_jetstream.sink.encode.msg_ids.base_id`) is read as the row's own."""
    return stored_id is not None and base_id(stored_id) == base_id(msg_id)


async def stored_already(nc: Any, stream: str, rows: list[tuple[str, str, int]], prefix: str = jsapi.API_PREFIX,
                         timeout: float = 10.0, deadline: float | None = None) -> list[bool]:
    """For each (subject, msg id, expected revision) of a refused compare-and-set row: whether ``stream``
    shows that id stored on that subject (in the order of ``rows``). Each look-up is asked again while the
    stream has no leader (408, 503) until ``deadline`` (a :func:`time.monotonic` instant; default: 30 s)."""
    never = f"sparkjs-none-{uuid.uuid4().hex}"  # no message carries it: the probe never stores
    gate = asyncio.Semaphore(WINDOW)
    deadline = deadline if deadline is not None else time.monotonic() + 30.0

    def again(call):  # a look-up asked again through an election (jsapi.retrying)
        return jsapi.retrying(lambda t: call(t), deadline, timeout)

    info = await again(lambda t: jsapi.stream_info(nc, stream, prefix, t))
    config = (info or {}).get("config", {})
    history = int(config.get("max_msgs_per_subject") or -1)  # -1: unlimited
    probe = int(config.get("num_replicas") or 1) == 1  # never on a replicated stream (module docstring, 2.)

    async def one(subject: str, msg_id: str, expected: int) -> bool:
        async with gate:
            last = await again(lambda t: jsapi.last_message_of_subject(nc, stream, subject, prefix, t))  # None: nothing
            if last is not None and same_row(kv.msg_id_of(last[1]), msg_id):
                return True
            if probe and await in_duplicate_window(nc, subject, base_id(msg_id), never, timeout):  # replaced since
                return True
            return (last is not None and history != 1
                    and await again(lambda t: among_older(nc, stream, subject, msg_id, expected + 1, last[0], prefix,
                                                          t)))

    return list(await asyncio.gather(*(one(*row) for row in rows)))


async def in_duplicate_window(nc: Any, subject: str, msg_id: str, never: str, timeout: float) -> bool:
    """Whether the duplicate window of the stream capturing ``subject`` holds ``msg_id`` (a publish that
    stores nothing either way). An answer that tells neither (a timeout, another error) is a no."""
    import nats.errors

    try:
        reply = await nc.request(subject, b"", timeout=timeout, headers=kv.duplicate_probe_headers(msg_id, never))
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError) as exc:
        log.debug("duplicate-window probe of %s on %s: %r", msg_id, subject, exc)
        return False
    ack = parse_puback(reply.data or b"")
    answer = kv.probe_answer(ack.outcome, ack.err_code)
    if answer is None:
        log.debug("duplicate-window probe of %s on %s answered %s", msg_id, subject, ack)
    return bool(answer)


async def among_older(nc: Any, stream: str, subject: str, msg_id: str, first: int, last: int,
                      prefix: str = jsapi.API_PREFIX, timeout: float = 10.0) -> bool:
    """Whether a message of ``subject`` from sequence ``first`` to before ``last`` carries ``msg_id``: the
    key's history after the revision the row expected (where it would be had it been stored), oldest
    first, one ``STREAM.MSG.GET`` (``next_by_subj``) per message (a bucket keeps at most 64 per key)."""
    seq = max(first, 1)
    while seq < last:
        reply = await jsapi.request_unless(jsapi.ERR_NO_MESSAGE_FOUND, nc, f"STREAM.MSG.GET.{stream}",
                                           {"seq": seq, "next_by_subj": subject}, timeout, prefix)
        if reply is None:
            return False
        message = reply["message"]
        if int(message["seq"]) >= last:
            return False
        if same_row(kv.msg_id_of(base64.b64decode(message.get("hdrs") or "")), msg_id):
            return True
        seq = int(message["seq"]) + 1
    return False
