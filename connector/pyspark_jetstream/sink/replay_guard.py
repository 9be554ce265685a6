"""Exactly-once past the duplicate window: what a replayed write already stored is not published again.

The server drops a repeated ``Nats-Msg-Id`` only within the target's duplicate window, counted
from the id's first publish (2 minutes by default; nats-server #7302). A micro-batch replayed
after a night's outage, or a batch job a scheduler retries, comes later than that. So before a
task publishes, it records in a small KV bucket the sink owns (option ``sinkState``) where the
target stood: its last sequence, under the key ``<run>.<partition>`` (``run``: the query id and
batch id, or ``w_<writeId>``). The record also names the attempt that made it (a token drawn
when the query or ``save()`` started, and the Spark stage), so a task tells a replay or a retry
(a record of another attempt, or a retried task) from its own first run (no record yet, or one
its sibling tasks just made):

* first run: one ``STREAM.INFO`` and one create (or read) of the record, nothing else (measured
  in the bench);
* a replay or a retry: it reads the target's messages stored after the recorded sequence,
  headers only, and keeps the ids of this run (``<run>:`` prefixed); rows whose id is among them
  are not published again (counted as ``already stored``).

What it cannot see: rows stored and then removed from the target (limits, a purge) before the
replay are published again; the record itself expires after ``sinkState.ttl``. The driver
deletes a micro-batch's records once the next micro-batch has committed (it can no longer be
replayed). Rows with their own ``msg_id`` are found the same way only if it starts with the run;
they rely on the duplicate window.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..client import jsapi
from ..errors import JetStreamApiError
from ..logs import get_logger
from ..protocol import kv
from ..protocol.ack_subject import fast_fields

log = get_logger("sink")

ERR_WRONG_LAST_SEQUENCE = 10071
SCAN_BATCH = 2000


@dataclass(frozen=True)
class GuardPlan:
    """Made on the driver, pickled to the tasks: where the records live and which attempt this is."""

    bucket: str
    target_stream: str
    token: str  # drawn once per query start or save(): tells this attempt's tasks from a replay's
    api_prefix: str = jsapi.API_PREFIX


def new_token() -> str:
    return uuid.uuid4().hex[:16]


def record_key(run: str, partition: int) -> str:
    """``<run>.<partition>``, as a KV key (a query id's dashes and a batch id are valid key characters)."""
    safe = run.replace(":", "_")
    return f"{safe}.{partition}"


def batch_filter(bucket: str, run: str) -> str:
    """The subjects of every record of ``run`` (all partitions), for a purge."""
    return f"{kv.subject_prefix(bucket)}{run.replace(':', '_')}.>"


def bucket_config(bucket: str, ttl: float, replicas: int = 1) -> dict[str, Any]:
    settings = kv.BucketSettings(history=1, ttl=ttl, storage="file", replicas=replicas)
    return kv.new_bucket_config(bucket, settings)


async def ensure_bucket(nc: Any, bucket: str, ttl: float, prefix: str) -> None:
    """Create the state bucket when missing (driver, at query start)."""
    if await jsapi.stream_info(nc, kv.stream_name(bucket), prefix) is not None:
        return
    try:
        await jsapi.create_stream(nc, bucket_config(bucket, ttl), prefix)
    except JetStreamApiError as exc:
        if exc.err_code != 10058:  # created meanwhile by another query: fine
            raise


@dataclass
class Attempt:
    """What a task learnt at its start: whether it replays, and then the ids already stored."""

    replay: bool
    after: int
    stored: frozenset[str] = frozenset()


async def begin(nc: Any, plan: GuardPlan, run: str, partition: int, stage: str, retried: bool,
                deadline: float = 60.0) -> Attempt:
    """Record where the target stands (first run) or find what an earlier attempt stored (replay)."""
    info = await jsapi.stream_info(nc, plan.target_stream, plan.api_prefix)
    last = int(info["state"].get("last_seq", 0)) if info else 0
    key = record_key(run, partition)
    subject = f"{kv.subject_prefix(plan.bucket)}{key}"
    attempt_id = f"{plan.token}/{stage}"
    mine = json.dumps({"after": last, "attempt": attempt_id}).encode()
    reply = await nc.request(subject, mine, timeout=10,
                             headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    ack = json.loads(reply.data or b"{}")
    error = ack.get("error")
    if not error:
        return Attempt(replay=retried, after=last,
                       stored=await stored_ids(nc, plan, run, last, deadline) if retried else frozenset())
    if int(error.get("err_code", 0)) != ERR_WRONG_LAST_SEQUENCE:
        raise JetStreamApiError(f"PUB {subject}", int(error.get("code", 0)), int(error.get("err_code", 0)),
                                error.get("description", ""))
    found = await jsapi.request(nc, f"STREAM.MSG.GET.{kv.stream_name(plan.bucket)}", {"last_by_subj": subject},
                                prefix=plan.api_prefix)
    record = json.loads(base64.b64decode(found["message"].get("data") or b"") or b"{}")
    after = int(record.get("after", 0))
    if record.get("attempt") == attempt_id and not retried:
        return Attempt(replay=False, after=after)  # a sibling task of this very attempt made it
    return Attempt(replay=True, after=after, stored=await stored_ids(nc, plan, run, after, deadline))


async def stored_ids(nc: Any, plan: GuardPlan, run: str, after: int, deadline: float) -> frozenset[str]:
    """The ``Nats-Msg-Id``s starting with ``<run>:`` among the target's messages after ``after``: an
    ephemeral headers-only consumer read up to the last sequence the stream had when asked."""
    info = await jsapi.stream_info(nc, plan.target_stream, plan.api_prefix)
    if info is None:
        return frozenset()
    end = int(info["state"].get("last_seq", 0))
    if end <= after:
        return frozenset()
    prefix = f"{run}:"
    name = f"sparkjs_guard_{uuid.uuid4().hex[:16]}"
    config = {"name": name, "deliver_policy": "by_start_sequence", "opt_start_seq": after + 1,
              "ack_policy": "none", "headers_only": True, "mem_storage": True, "num_replicas": 1,
              "inactive_threshold": 30 * 10**9}
    await jsapi.request(nc, f"CONSUMER.CREATE.{plan.target_stream}.{name}",
                        {"stream_name": plan.target_stream, "config": config}, prefix=plan.api_prefix)
    found: set[str] = set()
    queue: asyncio.Queue = asyncio.Queue()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=queue.put)
    give_up = time.monotonic() + deadline
    seen = after
    try:
        while seen < end:  # messages stored since (a replay's own publishes) are not this attempt's concern
            await nc.publish(f"{plan.api_prefix}.CONSUMER.MSG.NEXT.{plan.target_stream}.{name}",
                             json.dumps({"batch": SCAN_BATCH, "expires": 2 * 10**9}).encode(), reply=inbox)
            got = 0
            while got < SCAN_BATCH and seen < end:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise JetStreamApiError("CONSUMER.MSG.NEXT", 408, 0, f"reading what stream "
                                            f"'{plan.target_stream}' holds after sequence {after} took over "
                                            f"{deadline:g}s")
                try:
                    msg = await asyncio.wait_for(queue.get(), min(left, 5.0))
                except asyncio.TimeoutError:
                    break  # the pull expired: ask again
                if not msg.reply:  # a status (408 expired, 404 none): done, or the replica still catching up
                    if await _nothing_left(nc, plan, seen, end):
                        return frozenset(found)
                    break
                got += 1
                seen, _, _, pending = fast_fields(msg.reply.encode())
                msg_id = (msg.headers or {}).get("Nats-Msg-Id")
                if msg_id and msg_id.startswith(prefix):
                    found.add(msg_id)
                if pending == 0 and await _nothing_left(nc, plan, seen, end):
                    return frozenset(found)
    finally:
        await sub.unsubscribe()
        try:
            await jsapi.request(nc, f"CONSUMER.DELETE.{plan.target_stream}.{name}", prefix=plan.api_prefix)
        except Exception:  # ephemeral: the inactive threshold reaps it
            log.debug("could not delete consumer %s", name)
    return frozenset(found)


async def _nothing_left(nc: Any, plan: GuardPlan, seen: int, end: int) -> bool:
    """Whether the stream's leader holds no message after ``seen`` up to ``end``.

    The consumer's ``pending`` (and a pull that expires empty) speak for the replica holding
    the consumer, and nats-server places an R1 consumer on any peer of a replicated stream: a
    follower that lags (a node just restarted or thawed) says 0 while the leader holds more.
    Ending the scan there let a replay publish again what was stored (the chaos soak's R3
    bucket copy). ``STREAM.MSG.GET`` is answered by the leader."""
    if seen >= end:
        return True
    following = await jsapi.next_message(nc, plan.target_stream, seen + 1, prefix=plan.api_prefix)
    return following is None or following.seq > end


async def forget(nc: Any, plan: GuardPlan, run: str) -> None:
    """Delete every record of ``run`` (a micro-batch that can no longer be replayed)."""
    await jsapi.request(nc, f"STREAM.PURGE.{kv.stream_name(plan.bucket)}", {"filter": batch_filter(plan.bucket, run)},
                        prefix=plan.api_prefix)
