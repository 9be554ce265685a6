"""The per-row publisher's recovery and moves, proven by seeded fault schedules (issue #54).

Each schedule writes a task's rows through a :class:`~pyspark_jetstream.sink.publish.publisher.Publisher` on the
model of tests/unit/per_row_model.py, in one of three modes: ``ordered`` (ids, a cluster, one stream: the
ordered recovery that finds, resends and moves rows after a leader change), ``idempotent`` (ids, resends after
a 503, silence or a reconnect) and ``no-ids`` (a 503 is the only resend). The model loses messages with an old
leader, answers 503, loses, repeats and delays PubAcks, reconnects, refuses rows and moved copies, keeps a short
duplicate window, and may kill the task before any change of the stream. A write that failed is aborted; with
ids, Spark's retry of the task then runs (``after_retry``, its PubAcks telling what the first attempt stored).

The oracles, after every schedule:

- **at most once**: once the write ends well, each row is stored once (with ids, by the row's id, moved
  copies included); without ids, no payload is ever stored twice, even by a write that failed;
- **nothing lost by a move**: after a kill, every row the stream ever held still has a copy;
- **order**: ordered, each subject's rows are in the task's order, unless the write counts rows left out of
  order (a moved copy the stream refused keeps its old copy);
- **nothing after a failure**: once the write failed and its publisher aborted, nothing is sent;
- **exact counts**: a write that ends well reports the refused rows as its failures, none stored, and
  counts every other row (``stored + duplicates``);
- **no hang**: every wait has a deadline (the virtual loop raises :class:`Hang` otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from pyspark_jetstream.errors import JetStreamConnectorError
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.encode.msg_ids import base_id
from pyspark_jetstream.sink.publish import recovery as recovery_module
from pyspark_jetstream.sink.publish import reorder
from pyspark_jetstream.sink.publish.acks import AckFailure, AckTracker
from pyspark_jetstream.sink.publish.moves import Mover
from pyspark_jetstream.sink.publish.publisher import Publisher
from pyspark_jetstream.sink.publish.retry_order import RetryMoves
from pyspark_jetstream.sink.records import replay_guard

from .fast_ingest_model import Hang, VirtualLoop
from .per_row_model import STREAM, Killed, RowFaults, RowStream

SCHEDULES = 20_000
CHUNK = 1_000
MODES = ("ordered", "ordered", "idempotent", "no-ids")
RECORDS = 0.5  # of the ordered retries read the stream first (the replay records), the others learn from PubAcks


@dataclass
class Outcome:
    mode: str
    rows: list[tuple[int, str, str | None, bytes]]  # position, subject, msg id, payload
    model: RowStream
    errors: list[BaseException] = field(default_factory=list)  # what ended each attempt that failed
    lost_by_kill: set = field(default_factory=set)  # rows the stream held once and held no copy of after the kill
    sent_after_stop: int = 0
    failures: tuple[int, ...] = ()  # of the last attempt
    counted: int = 0  # stored + duplicates, of the last attempt
    left_out_of_order: int = 0  # all attempts
    moved: int = 0  # all attempts
    ended_well: bool = False


def _rows(rng: random.Random, mode: str) -> list[tuple[int, str, str | None, bytes]]:
    return [(p, f"S.{rng.randint(0, 2)}", None if mode == "no-ids" else f"r:{p}", b"p%d" % p)
            for p in range(rng.randint(1, 40))]


def _frame(row: tuple, reply_prefix: str) -> tuple:
    position, subject, msg_id, payload = row
    block = (f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n" if msg_id else "NATS/1.0\r\nX-Row: x\r\n\r\n").encode()
    frame = hpub_frame(subject, f"{reply_prefix}{position}", block, payload)
    return (position, frame, subject, None, msg_id, len(block), len(payload))


async def _attempt(model: RowStream, rows: list, mode: str, rng: random.Random, retry: bool,
                   records: bool = False) -> tuple:
    """One attempt of the task: (its publisher, what ended it or None). ``records``: a retry that reads what the
    stream holds of its rows first (the replay records' scan, :mod:`~pyspark_jetstream.sink.publish.retry_order`),
    else one that learns it from its PubAcks."""
    moves = None
    if records:
        stored: dict[str, tuple[int, ...]] = {}
        for seq, (_, msg_id, _) in sorted(model.messages.items()):  # every copy, by the row's id
            stored[base_id(msg_id)] = (*stored.get(base_id(msg_id), ()), seq)
        moves = RetryMoves(stored, False, "attempt-2", False)
    pub = await Publisher(model, transport=model, max_pending=rng.choice((1, 2, 4, 16)), ack_timeout=5.0,
                          idempotent=mode != "no-ids", ordered_stream=STREAM if mode == "ordered" else None,
                          move_base=moves.move_base if moves else 7000 if retry else 0, after_retry=retry).start()
    frames = [_frame(row, pub.reply_prefix) for row in rows]
    if moves is not None:
        frames = moves.in_order_behind(frames, set(stored), None, pub)
    error = None
    try:
        i = 0
        while i < len(frames):
            step = rng.randint(1, 12)
            await pub.publish(frames[i:i + step])
            i += step
        await pub.drain()
        if moves is not None:
            await pub.delete_stored(moves.take_stale())
    except Exception as exc:  # noqa: BLE001 - what ended the write is judged below
        error = exc
    if error is not None:
        await pub.abort()  # WriteTask.close(failed=True)
    else:
        await pub.close()
    model.stopped = True
    await asyncio.sleep(60)  # anything still scheduled runs (on virtual time): it must send nothing
    pub.skipped = moves.already_stored if moves is not None else 0  # the commit counts them "stored before"
    return pub, error


async def _write(seed: int) -> Outcome:
    rng = random.Random(seed)
    mode = rng.choice(MODES)
    rows = _rows(rng, mode)
    clustered = mode == "ordered" or rng.random() < 0.7
    model = RowStream(RowFaults.draw(rng, [row[3] for row in rows], clustered, mode == "ordered"), is_clustered=clustered)
    out = Outcome(mode, rows, model)
    pub, error = await _attempt(model, rows, mode, rng, retry=False)
    out.left_out_of_order += pub.left_out_of_order
    out.moved += pub.reordered
    out.sent_after_stop += model.sent_after_stop
    if error is not None:
        out.errors.append(error)
        held = {base_id(m[1]) if m[1] else m[2] for m in model.messages.values()}
        out.lost_by_kill = model.ever_stored - held
        if mode == "no-ids":
            return out
        # Spark retries the task on a new connection, soon: the stream refuses what it refused, nothing else.
        model.revive(RowFaults(rng, refused=model.faults.refused))
        pub, error = await _attempt(model, rows, mode, rng, retry=True,
                                    records=mode == "ordered" and rng.random() < RECORDS)
        out.left_out_of_order += pub.left_out_of_order
        out.moved += pub.reordered
        out.sent_after_stop += model.sent_after_stop
        if error is not None:
            out.errors.append(error)
            return out
    out.ended_well = True
    out.failures = tuple(sorted(f.position for f in pub.failures))
    out.counted = pub.stored + pub.duplicates + pub.skipped
    return out


def run_schedule(seed: int, monkeypatch) -> Outcome:
    loop = VirtualLoop()
    logging.disable(logging.WARNING)  # an outage's WARNING and INFO per schedule (tested in test_publisher_recovery)
    try:
        # The recovery's two stream scans read the model's messages (what replay_guard reads from a real stream).
        async def stored_sequences(nc, *args, **kwargs):
            return await nc.stored_sequences(nc, *args, **kwargs)

        async def moved_copies(nc, *args, **kwargs):
            return await nc.moved_copies(nc, *args, **kwargs)

        monkeypatch.setattr(replay_guard, "stored_sequences", stored_sequences)
        monkeypatch.setattr(replay_guard, "moved_copies", moved_copies)
        return loop.run_until_complete(_write(seed))
    finally:
        logging.disable(logging.NOTSET)
        loop.close()


def check(out: Outcome, seed: int) -> None:
    """The oracles of the module docstring."""
    rows, model = out.rows, out.model
    where = f"seed {seed} ({out.mode}): {model.faults}, errors {out.errors!r}"
    for error in out.errors:
        if isinstance(error, Hang):
            raise AssertionError(f"{where}: a wait without a deadline") from error
        assert isinstance(error, (JetStreamConnectorError, Killed)), f"{where}: {error!r}"
    assert out.sent_after_stop == 0, f"{where}: {out.sent_after_stop} sends after the write failed"
    assert not out.lost_by_kill, f"{where}: rows with no copy left after the kill: {sorted(out.lost_by_kill)}"
    by_key = {(row[2] or row[3]): row for row in rows}
    stored = [by_key[base_id(m[1]) if m[1] else m[2]] for _, m in sorted(model.messages.items())]
    twice = [row for row, n in Counter(stored).items() if n > 1]
    if out.mode == "no-ids" or out.ended_well:
        assert not twice, f"{where}: stored twice: {twice}"
    if not out.ended_well:
        return
    refused = {row[0] for row in rows if row[3] in model.faults.refused}
    assert set(out.failures) == refused, f"{where}: failures {out.failures}, refused {refused}"
    if out.mode == "ordered" and out.left_out_of_order == 0:
        for subject in {row[1] for row in rows}:
            positions = [row[0] for row in stored if row[1] == subject]
            assert positions == sorted(positions), f"{where}: {subject} out of order: {positions}"
    assert sorted(row[0] for row in stored) == [row[0] for row in rows if row[0] not in refused], \
        f"{where}: stored {sorted(row[0] for row in stored)}"
    assert out.counted == len(rows) - len(refused), f"{where}: counted {out.counted}"


@pytest.mark.parametrize("first", range(0, SCHEDULES, CHUNK))
def test_schedules(first, monkeypatch):
    ended = Counter()
    for seed in range(first, first + CHUNK):
        out = run_schedule(seed, monkeypatch)
        check(out, seed)
        ended[f"{out.mode} {'well' if out.ended_well else 'failed'}{' after a retry' if out.ended_well and out.errors else ''}"] += 1
        ended["moved rows"] += out.moved > 0
        ended["kept a refused move"] += out.left_out_of_order > 0
    assert ended["ordered well"] > CHUNK // 5, ended  # most end well: the faults do not hide the oracles
    for branch in ("ordered well after a retry", "no-ids failed", "moved rows", "kept a refused move"):
        assert ended[branch] > 0, ended  # the rare branches are taken


def _caught(wanted: str, seeds: range, monkeypatch) -> bool:
    """Whether an oracle whose message says ``wanted`` fails in one of ``seeds``."""
    for seed in seeds:
        try:
            check(run_schedule(seed, monkeypatch), seed)
        except AssertionError as exc:
            if wanted in str(exc):
                return True
    return False


def test_the_oracles_catch(monkeypatch):
    """Each guard broken once, its oracle fails within the first schedules: the look in the stream before an
    ordered resend (at most once), the background sends cancelled at an abort (nothing after a failure), a move
    that publishes before it deletes (nothing lost by a move), the frames stored ahead moved (order), a refused
    moved copy kept (the failures) and counted (exact counts)."""

    async def blind(self, tokens):  # resend without looking: the copies stored with a lost PubAck go twice
        return tokens

    monkeypatch.setattr(recovery_module.OrderedRecovery, "_find_stored", blind)
    assert _caught("stored twice", range(3_000), monkeypatch)
    monkeypatch.undo()

    async def careless_close(self) -> None:  # the resends and the recovery left running
        self._net.unwatch(self)

    monkeypatch.setattr(Publisher, "close", careless_close)
    assert _caught("sends after the write failed", range(3_000), monkeypatch)
    monkeypatch.undo()

    move = Mover.move

    async def delete_first(self, frames, reply_prefix, round_no, delete_first=False):
        return await move(self, frames, reply_prefix, round_no, True)  # the old copy deleted before the new is sent

    monkeypatch.setattr(Mover, "move", delete_first)
    assert _caught("no copy left", range(3_000), monkeypatch)
    monkeypatch.undo()

    monkeypatch.setattr(reorder, "ahead", lambda stored: [])  # nothing moved
    assert _caught("out of order", range(3_000), monkeypatch)
    monkeypatch.undo()

    monkeypatch.setattr(Mover, "keep_refused", lambda self, token: False)  # a refused moved copy as a refused row
    assert _caught("failures", range(3_000), monkeypatch)
    monkeypatch.undo()

    def forgetful_fail(self, token, sent, code, err_code, description, dead_letter) -> None:
        if not dead_letter and self._pub.mover.keep_refused(token):
            return  # the old copy stands, but the row is no longer counted as stored
        self.failures.append(AckFailure(int(token), sent, code, err_code, description, dead_letter))

    monkeypatch.setattr(AckTracker, "_fail", forgetful_fail)
    assert _caught("counted", range(3_000), monkeypatch)
    monkeypatch.undo()
