"""Exactly-once past the duplicate window: what a replayed write already stored is not published again.

The server drops a repeated ``Nats-Msg-Id`` only within the target's duplicate window, counted
from the id's first publish (2 minutes by default; nats-server #7302). A micro-batch replayed
after a night's outage, or a batch job a scheduler retries, comes later than that. So before a
task publishes, it records in a small KV bucket the sink owns (option ``sinkState``) where the
target stood: its last sequence, under the key ``<run>.<partition>`` (``run``: the query id and
batch id, or ``w_<writeId>``). The record names the attempt that made it: a token drawn when the
query or ``save()`` started, and the Spark task attempt (``taskAttemptId``, unique in the
application: a stage Spark resubmits after a lost shuffle output runs its tasks again with
``attemptNumber`` 0, and only the task attempt tells them apart). While the task publishes, it
puts the record again every :data:`HEARTBEAT` seconds (the record's server time says it was
alive then), and when it has every PubAck, once more with ``done`` and the target's last
sequence (``upto``).

* first run: one ``STREAM.INFO`` and one create of the record at the start, the heartbeats, one
  ``STREAM.INFO`` and one put at the end (measured in the bench);
* a replay or a retry (a record of another attempt, or a retried task): it reads the target's
  messages, headers only, in the window where an earlier attempt of the run can have stored
  anything, and keeps the ids of this run (``<run>:`` prefixed); rows whose id is among them are
  not published again (counted as ``already stored``), unless an earlier row of their subject is
  missing: then they are moved behind it (:mod:`~pyspark_jetstream.sink.publish.retry_order`). The window starts at the earliest
  recorded position of the run's earlier attempts (all partitions: a retried ``save()`` may
  split its rows otherwise) and ends at what their records say: ``upto`` for an attempt that
  finished, else the first message stored after its last heartbeat plus :data:`HEARTBEAT` and
  ``ackTimeout`` (frames it had in flight when it died land before that). So a late replay reads
  what the earlier attempts wrote and what other writers stored meanwhile, never the traffic
  since (issue #33: 1,000,000 messages of another writer after a write used to cost its retry
  56 s).

Rows the run wrote over itself in a target that keeps only the last messages of each subject are
skipped too (``superseded``). What it cannot see: rows stored and then removed from the target by
something else (limits, a purge) before the replay are published again; the record itself expires
after ``sinkState.ttl``. The driver deletes a micro-batch's records once the next micro-batch has committed (it can no longer be
replayed). Rows with their own ``msg_id`` are found the same way only if it starts with the run;
they rely on the duplicate window.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...client import jsapi
from ...errors import JetStreamApiError
from ...logs import get_logger
from ...protocol import kv
from ...protocol.ack_subject import fast_fields
from ..encode.msg_ids import base_id
from .superseded import Superseded

log = get_logger("sink")

WRONG_LAST_SEQUENCE = kv.WRONG_LAST_SEQUENCE
"""A create (expected last subject sequence 0) of a key that exists: 10071 on a single server, 10164
("wrong last sequence" without a number) from a clustered stream (seen in the chaos soak)."""
SCAN_BATCH = 2000
HEARTBEAT = 5.0
"""Seconds between the puts of a publishing task's record (its last one dates the attempt's end)."""


@dataclass(frozen=True)
class GuardPlan:
    """Made on the driver, pickled to the tasks: where the records live and which attempt this is."""

    bucket: str
    target_stream: str
    token: str  # drawn once per query start or save(): tells this attempt's tasks from a replay's
    api_prefix: str = jsapi.API_PREFIX
    ack_timeout: float = 30.0  # the write's ackTimeout: how long after its last heartbeat a dead attempt's frames land


def new_token() -> str:
    return uuid.uuid4().hex[:16]


def record_key(run: str, partition: int) -> str:
    """``<run>.<partition>``, as a KV key (a query id's dashes and a batch id are valid key characters)."""
    safe = run.replace(":", "_")
    return f"{safe}.{partition}"


def run_key(run: str) -> str:
    """``<run>.run``: the record of the attempt that started the run (its first task makes it)."""
    return f"{run.replace(':', '_')}.run"


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


@dataclass(frozen=True)
class Record:
    """A record as stored: where the target stood when the run's first attempt of this partition
    started (``after``), which attempt wrote it last, and what bounds the earlier attempts' messages."""

    after: int
    attempt: str  # "<token>/<task attempt id>" (records of earlier releases: "<token>/<stage>")
    done: bool = False  # the attempt had every PubAck: its messages are all at or before ``upto``
    upto: int | None = None
    prior_end: int | None = None  # a replay's bound on what the attempts before it stored
    time: Any = None  # when the server stored it (a datetime), from a read; None when written here

    @property
    def token(self) -> str:
        return self.attempt.split("/", 1)[0]

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"after": self.after, "attempt": self.attempt}
        if self.done:
            body.update(done=True, upto=self.upto)
        if self.prior_end is not None:
            body["prior_end"] = self.prior_end
        return json.dumps(body).encode()

    @classmethod
    def from_json(cls, data: bytes, time: Any = None) -> Record:
        body = json.loads(data or b"{}")
        return cls(int(body.get("after", 0)), str(body.get("attempt", "")), bool(body.get("done", False)),
                   body.get("upto"), body.get("prior_end"), time)


@dataclass
class Attempt:
    """What a task learnt at its start: whether it replays, the ids already stored, and its record."""

    replay: bool
    after: int
    stored: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # id -> its copies' sequences
    record: Record | None = None  # what this task puts while it publishes (heartbeats, then done)
    scanned: int = 0  # the target's messages read to find ``stored``
    window: tuple[int, int] | None = None  # the sequences read: (after, end]
    superseded: Superseded | None = None  # rows stored and then replaced by later ones of their subject
    deny_delete: bool = False  # the target refuses deletes: rows stored out of order stay (retry_order)


def _subject(plan: GuardPlan, run: str, partition: int) -> str:
    return f"{kv.subject_prefix(plan.bucket)}{record_key(run, partition)}"


async def begin(nc: Any, plan: GuardPlan, run: str, partition: int, attempt_id: str, retried: bool,
                deadline: float = 60.0) -> Attempt:
    """Record where the target stands (first run) or find what an earlier attempt stored (replay).
    ``attempt_id``: ``<token>/<task attempt id>``; ``retried``: Spark says this task ran before."""
    last = await _target_last(nc, plan)
    # The run's own record names the attempt that started it: a task of a later attempt replays even
    # when its partition is new (a retried save() whose rows are split otherwise).
    started_by = await _create_or_read(nc, plan, f"{kv.subject_prefix(plan.bucket)}{run_key(run)}",
                                       Record(last, attempt_id))
    later_attempt = started_by is not None and started_by.token != plan.token
    subject = _subject(plan, run, partition)
    mine = Record(last, attempt_id)
    earlier = await _create_or_read(nc, plan, subject, mine)
    if earlier is None:
        if not retried and not later_attempt:
            return Attempt(replay=False, after=last, record=mine)
        return await _replay(nc, plan, run, subject, mine, mine, deadline)
    if earlier.attempt == attempt_id:
        return Attempt(replay=False, after=earlier.after, record=earlier)  # this very task wrote it
    return await _replay(nc, plan, run, subject, earlier, Record(earlier.after, attempt_id), deadline)


async def _create_or_read(nc: Any, plan: GuardPlan, subject: str, record: Record) -> Record | None:
    """Create ``record`` at ``subject`` (None: done), or read the one already there."""
    reply = await nc.request(subject, record.to_json(), timeout=10,
                             headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    error = json.loads(reply.data or b"{}").get("error")
    if not error:
        return None
    if int(error.get("err_code", 0)) not in WRONG_LAST_SEQUENCE:
        raise JetStreamApiError(f"PUB {subject}", int(error.get("code", 0)), int(error.get("err_code", 0)),
                                error.get("description", ""))
    found = await jsapi.request(nc, f"STREAM.MSG.GET.{kv.stream_name(plan.bucket)}", {"last_by_subj": subject},
                                prefix=plan.api_prefix)
    message = found["message"]
    return Record.from_json(base64.b64decode(message.get("data") or b""), _server_time(message.get("time")))


async def _replay(nc: Any, plan: GuardPlan, run: str, subject: str, earlier: Record, mine: Record,
                  deadline: float) -> Attempt:
    """Read the window where the run's earlier attempts can have stored rows (module docstring), then
    make this task's record carry that bound for the attempts after it."""
    records = [earlier] if earlier is not mine else []
    for r in await run_records(nc, plan, run):
        if r.token != plan.token:
            records.append(r)
        elif r.prior_end is not None:  # a task of this replay that already read its window: that window
            records.append(Record(r.after, r.attempt, True, r.prior_end))
    info = await jsapi.stream_info(nc, plan.target_stream, plan.api_prefix) or {}
    last = int((info.get("state") or {}).get("last_seq", 0))
    first, end = await window(nc, plan, records, last) if records else (mine.after, mine.after)
    superseded = Superseded(run, int((info.get("config") or {}).get("max_msgs_per_subject") or 0))
    stored, scanned = await stored_ids(nc, plan, run, first, end, deadline, superseded)
    record = Record(earlier.after, mine.attempt, prior_end=end)
    await put_record(nc, plan, subject, record)
    return Attempt(replay=True, after=first, stored=stored, record=record, scanned=scanned, window=(first, end),
                   superseded=superseded, deny_delete=bool((info.get("config") or {}).get("deny_delete")))


async def _target_last(nc: Any, plan: GuardPlan) -> int:
    info = await jsapi.stream_info(nc, plan.target_stream, plan.api_prefix)
    return int(info["state"].get("last_seq", 0)) if info else 0


async def window(nc: Any, plan: GuardPlan, records: list[Record], last: int) -> tuple[int, int]:
    """``(after, end]``: where the attempts that wrote ``records`` can have stored messages. ``after``
    is the earliest recorded position; each record bounds its attempts by ``upto`` (it finished), or
    by ``prior_end`` and the time of its last put (it did not: frames in flight when it died land
    within ``HEARTBEAT`` and ``ackTimeout`` of that). A task of this very replay that already read its
    window is given here as done, up to that window's end (its own puts date this attempt, not the
    earlier ones). Never past ``last``, the target's last sequence now."""
    import datetime as dt

    first = min(r.after for r in records)
    end = first
    alive_until = None
    for r in records:
        if r.done and r.upto is not None:
            end = max(end, int(r.upto))
            continue
        end = max(end, int(r.prior_end or 0))
        if r.time is not None and (alive_until is None or r.time > alive_until):
            alive_until = r.time
    if alive_until is not None:
        until = alive_until + dt.timedelta(seconds=HEARTBEAT + plan.ack_timeout)
        after_it = await jsapi.first_seq_at_or_after(nc, plan.target_stream, until, plan.api_prefix)
        end = max(end, last if after_it is None else after_it - 1)
    return first, min(end, last)


def _server_time(text: str | None) -> Any:
    """A STREAM.MSG.GET ``time`` (RFC 3339, nanoseconds) as an aware datetime (microseconds); None when
    there is none or it does not parse."""
    from ...protocol.direct_get import time_ns

    if not text:
        return None
    try:
        return _ns_time(time_ns(text))
    except ValueError:
        return None


async def run_records(nc: Any, plan: GuardPlan, run: str) -> list[Record]:
    """Every record of ``run`` (one per partition), with the server time of its last put: one
    ephemeral last-per-subject consumer over the run's keys."""
    stream = kv.stream_name(plan.bucket)
    name = f"sparkjs_runs_{uuid.uuid4().hex[:16]}"
    config = {"name": name, "deliver_policy": "last_per_subject", "ack_policy": "none",
              "filter_subject": batch_filter(plan.bucket, run), "mem_storage": True, "num_replicas": 1,
              "inactive_threshold": 30 * 10**9}
    created = await jsapi.request(nc, f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                  prefix=plan.api_prefix)
    want = int(created.get("num_pending", 0))
    records: list[Record] = []
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            while len(records) < want:
                await nc.publish(f"{plan.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}",
                                 json.dumps({"batch": want - len(records), "expires": 5 * 10**9}).encode(),
                                 reply=inbox)
                got = 0
                while len(records) < want:
                    try:
                        msg = await sub.next_msg(timeout=6)
                    except Exception:
                        break
                    if not msg.reply:
                        break  # a status: ask again
                    _, _, ts, _ = fast_fields(msg.reply.encode())
                    if (msg.headers and msg.headers.get("KV-Operation")) or msg.subject.endswith(".run"):
                        want -= 1
                        continue
                    records.append(Record.from_json(msg.data, _ns_time(ts)))
                    got += 1
                if not got:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        try:
            await jsapi.request(nc, f"CONSUMER.DELETE.{stream}.{name}", prefix=plan.api_prefix)
        except Exception:  # ephemeral: the inactive threshold reaps it
            log.debug("could not delete consumer %s", name)
    return records


def _ns_time(ns: int) -> Any:
    """Nanoseconds since the epoch as an aware datetime, to the microsecond (exact: no float)."""
    import datetime as dt

    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)


async def put_record(nc: Any, plan: GuardPlan, subject: str, record: Record) -> None:
    reply = await nc.request(subject, record.to_json(), timeout=10)
    error = json.loads(reply.data or b"{}").get("error")
    if error:
        raise JetStreamApiError(f"PUB {subject}", int(error.get("code", 0)), int(error.get("err_code", 0)),
                                error.get("description", ""))


async def heartbeat(nc: Any, plan: GuardPlan, run: str, partition: int, record: Record) -> None:
    """Put ``record`` again every :data:`HEARTBEAT` seconds until cancelled (the task ended): a
    failure is logged and tried again at the next beat, never raised into the write."""
    subject = _subject(plan, run, partition)
    while True:
        await asyncio.sleep(HEARTBEAT)
        try:
            await put_record(nc, plan, subject, record)
        except Exception as exc:
            log.debug("could not renew the replay record %s: %s", subject, exc)


async def finished(nc: Any, plan: GuardPlan, run: str, partition: int, record: Record) -> None:
    """The task has every PubAck: its messages are all at or before the target's last sequence now."""
    upto = await _target_last(nc, plan)
    done = Record(record.after, record.attempt, True, upto, record.prior_end)
    await put_record(nc, plan, _subject(plan, run, partition), done)


async def stored_ids(nc: Any, plan: GuardPlan, run: str, after: int, end: int, deadline: float,
                     superseded: Superseded | None = None) -> tuple[dict[str, tuple[int, ...]], int]:
    """The ``Nats-Msg-Id``s starting with ``<run>:`` among the target's messages in ``(after, end]``,
    each (without a moved copy's suffix) with the sequences of its copies (a retry that finds a hole
    in a subject moves the copies behind it: :mod:`~pyspark_jetstream.sink.publish.retry_order`), and how many messages were read:
    an ephemeral headers-only consumer. Each is also given to ``superseded`` with its subject (which
    earlier rows of the run it replaced)."""
    prefix = f"{run}:"
    found: dict[str, tuple[int, ...]] = {}

    def visit(msg: Any, seq: int) -> bool:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        if msg_id and msg_id.startswith(prefix):
            own = base_id(msg_id)  # a message moved back into order carries a suffix (reorder)
            found[own] = found.get(own, ()) + (seq,)
            if superseded is not None:
                superseded.note_stored(msg.subject, own, (msg.headers or {}).get("Nats-Rollup") == "sub")
        return False

    read = await scan_headers(nc, plan.target_stream, plan.api_prefix, after, end, deadline, visit)
    return found, read


async def stored_sequences(nc: Any, stream: str, api_prefix: str, after: int, wanted: set[str],
                           deadline: float) -> dict[str, int]:
    """Where ``stream`` holds the messages whose ``Nats-Msg-Id`` is in ``wanted``, among those after
    ``after`` up to its last one now: ``{id: sequence}`` (the publisher's PubAcks lost with a leader).
    Asked right after a leader change, every request here may meet a stream still without a leader (no
    reply) or a JetStream without quorum (503): each is asked again until ``deadline`` seconds passed."""
    give_up = time.monotonic() + deadline
    info = await jsapi.retrying(lambda timeout: jsapi.stream_info(nc, stream, api_prefix, timeout), give_up)
    end = int(info["state"].get("last_seq", 0)) if info else 0
    found: dict[str, int] = {}

    def visit(msg: Any, seq: int) -> bool:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        if msg_id in wanted:
            found[msg_id] = seq
        return len(found) == len(wanted)

    await scan_headers(nc, stream, api_prefix, after, end, max(give_up - time.monotonic(), 1.0), visit)
    return found


async def moved_copies(nc: Any, stream: str, api_prefix: str, after: int, bases: set[str],
                       deadline: float) -> dict[str, list[int]]:
    """The sequences after ``after`` where ``stream`` holds a moved copy (``<base>:o<n>``) of a row whose id is
    in ``bases``: a retry's check of a predecessor's repair (a copy deleted only once its moved copy is
    stored, publish/moves.py). Read to the stream's last message: a row may have been moved more than once."""
    give_up = time.monotonic() + deadline
    info = await jsapi.retrying(lambda timeout: jsapi.stream_info(nc, stream, api_prefix, timeout), give_up)
    end = int(info["state"].get("last_seq", 0)) if info else 0
    found: dict[str, list[int]] = {}

    def visit(msg: Any, seq: int) -> bool:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id") or ""
        base = base_id(msg_id)
        if base != msg_id and base in bases:
            found.setdefault(base, []).append(seq)
        return False

    await scan_headers(nc, stream, api_prefix, after, end, max(give_up - time.monotonic(), 1.0), visit)
    return found


async def scan_headers(nc: Any, stream: str, api_prefix: str, after: int, end: int, deadline: float,
                       visit: Any) -> int:
    """Read ``stream``'s messages in ``(after, end]``, headers only, with an ephemeral consumer, giving each
    to ``visit(msg, seq)`` (True: stop); returns how many were read. Ends early only when the stream's
    leader confirms nothing is left (:func:`_nothing_left`); fails after ``deadline`` seconds (requests that
    meet no leader or no quorum are asked again until then, :func:`~pyspark_jetstream.client.jsapi.retrying`)."""
    if end <= after:
        return 0
    give_up = time.monotonic() + deadline
    name = f"sparkjs_guard_{uuid.uuid4().hex[:16]}"
    config = {"name": name, "deliver_policy": "by_start_sequence", "opt_start_seq": after + 1,
              "ack_policy": "none", "headers_only": True, "mem_storage": True, "num_replicas": 1,
              "inactive_threshold": 30 * 10**9}
    # A create asked again after a lost reply finds its consumer made, with this config: the same answer.
    await jsapi.retrying(lambda timeout: jsapi.request(
        nc, f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config}, timeout, api_prefix),
        give_up)
    queue: asyncio.Queue = asyncio.Queue()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=queue.put)
    seen = after
    read = 0
    try:
        while seen < end:
            await nc.publish(f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}",
                             json.dumps({"batch": min(SCAN_BATCH, end - seen), "expires": 2 * 10**9}).encode(),
                             reply=inbox)
            got = 0
            while got < SCAN_BATCH and seen < end:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise JetStreamApiError("CONSUMER.MSG.NEXT", 408, 0, f"reading what stream "
                                            f"'{stream}' holds in sequences {after + 1}..{end} took "
                                            f"over {deadline:g}s")
                try:
                    msg = await asyncio.wait_for(queue.get(), min(left, 5.0))
                except asyncio.TimeoutError:
                    break  # the pull expired: ask again
                if not msg.reply:  # a status (408 expired, 404 none): done, or the replica still catching up
                    if await _nothing_left(nc, stream, api_prefix, seen, end, give_up):
                        return read
                    break
                got += 1
                seen, _, _, pending = fast_fields(msg.reply.encode())
                if seen > end:
                    break
                read += 1
                if visit(msg, seen):
                    return read
                if pending == 0 and await _nothing_left(nc, stream, api_prefix, seen, end, give_up):
                    return read
    finally:
        await sub.unsubscribe()
        try:
            await jsapi.request(nc, f"CONSUMER.DELETE.{stream}.{name}", prefix=api_prefix)
        except Exception:  # ephemeral: the inactive threshold reaps it
            log.debug("could not delete consumer %s", name)
    return read


async def _nothing_left(nc: Any, stream: str, api_prefix: str, seen: int, end: int, give_up: float) -> bool:
    """Whether the stream's leader holds no message after ``seen`` up to ``end``.

    The consumer's ``pending`` (and a pull that expires empty) speak for the replica holding
    the consumer, and nats-server places an R1 consumer on any peer of a replicated stream: a
    follower that lags (a node just restarted or thawed) says 0 while the leader holds more.
    Ending the scan there let a replay publish again what was stored (the chaos soak's R3
    bucket copy). ``STREAM.MSG.GET`` is answered by the leader."""
    if seen >= end:
        return True
    following = await jsapi.retrying(
        lambda timeout: jsapi.next_message(nc, stream, seen + 1, prefix=api_prefix, timeout=timeout), give_up)
    return following is None or following.seq > end


async def forget(nc: Any, plan: GuardPlan, run: str) -> None:
    """Delete every record of ``run`` (a micro-batch that can no longer be replayed)."""
    await jsapi.request(nc, f"STREAM.PURGE.{kv.stream_name(plan.bucket)}", {"filter": batch_filter(plan.bucket, run)},
                        prefix=plan.api_prefix)
