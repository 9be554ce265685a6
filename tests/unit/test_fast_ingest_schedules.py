"""The fast path's rare branches, proven by seeded fault schedules (issue #54).

Each schedule writes a task's rows through a :class:`~pyspark_jetstream.sink.publish.batched.BatchedPublisher`
(its :class:`~pyspark_jetstream.client.fast_publisher.FastPublisher` on the model's transport,
tests/unit/fast_ingest_model.py): a few subjects, rows with or without ``Nats-Msg-Id``, in slices, while the
model loses, repeats and delays answers, loses messages (gaps), forgets the batch (10208), changes the leader
(503), has no room for a batch (429/10211), refuses rows (10166), and the task may be aborted after any send.

The oracles, after every schedule:

- **at most once**: each row is stored at most once (by its id; a row without one, by its payload);
- **order**: each subject's stored rows are in the task's order;
- **nothing after a failure**: once the write failed (or was aborted) and its publisher aborted, nothing is sent;
- **exact counts**: a write that ends well stored every row but the refused ones, each once, and its counts
  (``stored + duplicates``) say so; the refused rows are its failures, none stored;
- **no hang**: every wait has a deadline (the virtual loop raises :class:`Hang` otherwise).

``SCHEDULES`` of them run in CI (``-k schedules``); ``tests/unit/test_fast_ingest_schedules.py::test_the_oracles_catch``
breaks each guard once and shows its oracle failing.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from pyspark_jetstream.client import fast_publisher as fast_module
from pyspark_jetstream.client.fast_publisher import FastIngestUnavailable, FastPublisher
from pyspark_jetstream.errors import JetStreamConnectorError
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.publish import batched as batched_module
from pyspark_jetstream.sink.publish.batched import BatchedPublisher

from .fast_ingest_model import Faults, Hang, ModelServer, RecordingRows, VirtualLoop

SCHEDULES = 20_000
CHUNK = 1_000


@dataclass
class Outcome:
    rows: list[tuple[int, str, str | None, bytes]]  # position, subject, msg id, payload
    model: ModelServer
    error: BaseException | None
    aborted: bool
    stored: int = 0
    duplicates: int = 0
    failed_positions: tuple[int, ...] = ()
    batches: int = 0
    resent: int = 0
    per_row: bool = False


def _rows(rng: random.Random) -> list[tuple[int, str, str | None, bytes]]:
    n = rng.randint(1, 48)
    ids = rng.choice(("all", "all", "all", "none", "mixed"))
    out = []
    for p in range(n):
        with_id = ids == "all" or (ids == "mixed" and rng.random() < 0.5)
        out.append((p, f"S.{rng.randint(0, 2)}", f"run:{p}" if with_id else None, b"p%d" % p))
    return out


def _frame(row: tuple, reply_form) -> tuple:
    position, subject, msg_id, payload = row
    block = (f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n" if msg_id else "NATS/1.0\r\nX-Row: x\r\n\r\n").encode()
    frame = hpub_frame(subject, reply_form.of(position), block, payload)
    return (position, frame, subject, None, msg_id, len(block), len(payload))


async def _write(seed: int) -> Outcome:
    rng = random.Random(seed)
    rows = _rows(rng)
    faults = Faults.draw(rng, [row[3] for row in rows])
    model = ModelServer(faults, is_clustered=bool(faults.leader_change_at) or rng.random() < 0.3)
    fast = FastPublisher(None, transport=model, flow=rng.randint(1, 6), ping_after=0.05, ack_timeout=1.0,
                         busy_for=0.5, chunk=rng.randint(1, 8), give_way=True)
    acked = RecordingRows(model)
    pub = await BatchedPublisher(None, acked, fast=fast).start()
    frames = [_frame(row, pub.reply_form) for row in rows]
    abort_at = rng.randint(1, 40) if rng.random() < 0.25 else 0
    aborting = asyncio.Event()
    send = model.send

    async def counted(buffer: bytes) -> None:
        await send(buffer)
        if abort_at and len(model.sent) >= abort_at:
            aborting.set()

    model.send = counted

    async def task() -> None:
        i = 0
        while i < len(frames):
            step = rng.randint(1, 12)
            await pub.publish(frames[i:i + step])
            i += step
        await pub.drain()

    job = asyncio.ensure_future(task())
    stop = asyncio.ensure_future(aborting.wait())
    await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    aborted = not job.done()
    error: BaseException | None = None
    if aborted:
        job.cancel()
    try:
        await job
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - what ended the write is judged below
        error = exc
    stop.cancel()
    if aborted or error is not None:
        await pub.abort()  # WriteTask.close(failed=True)
    else:
        await pub.close()
    model.stopped = True
    await asyncio.sleep(60)  # anything still scheduled runs (on virtual time): it must send nothing
    return Outcome(rows, model, error, aborted, pub.stored, pub.duplicates,
                   tuple(sorted(f.position for f in pub.failures)), pub.batches, pub.resent, pub.per_row)


def run_schedule(seed: int) -> Outcome:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(_write(seed))
    finally:
        loop.close()


def check(outcome: Outcome, seed: int) -> None:
    """The oracles of the module docstring."""
    rows, model = outcome.rows, outcome.model
    where = f"seed {seed}: {outcome.model.faults}"
    by_payload = {row[3]: row for row in rows}
    stored = [by_payload[m.payload] for m in model.stored]
    twice = [row for row, n in Counter(stored).items() if n > 1]
    assert not twice, f"{where}: stored twice: {twice}"
    for subject in {row[1] for row in rows}:
        positions = [row[0] for row in stored if row[1] == subject]
        assert positions == sorted(positions), f"{where}: {subject} out of order: {positions}"
    assert model.sent_after_stop == 0, f"{where}: {model.sent_after_stop} sends after the write failed"
    if isinstance(outcome.error, Hang):
        raise AssertionError(f"{where}: a wait without a deadline") from outcome.error
    if outcome.error is not None:
        assert isinstance(outcome.error, (JetStreamConnectorError, FastIngestUnavailable)), \
            f"{where}: {outcome.error!r}"
        return
    if outcome.aborted:
        return
    refused = {row[0] for row in rows if row[3] in model.faults.refused}
    assert set(outcome.failed_positions) == refused, f"{where}: failures {outcome.failed_positions}, refused {refused}"
    assert sorted(row[0] for row in stored) == [row[0] for row in rows if row[0] not in refused], \
        f"{where}: stored {sorted(row[0] for row in stored)}"
    assert outcome.stored + outcome.duplicates == len(rows) - len(refused), \
        f"{where}: counted {outcome.stored} + {outcome.duplicates} duplicates"


@pytest.mark.parametrize("first", range(0, SCHEDULES, CHUNK))
def test_schedules(first):
    ended = Counter()
    for seed in range(first, first + CHUNK):
        outcome = run_schedule(seed)
        check(outcome, seed)
        ended["aborted" if outcome.aborted else "failed" if outcome.error else "stored"] += 1
    assert ended["stored"] > CHUNK // 3, ended  # most schedules end well: the faults do not hide the oracles


def _first_violation(seeds: range) -> str | None:
    for seed in seeds:
        try:
            check(run_schedule(seed), seed)
        except AssertionError as exc:
            return str(exc)
    return None


def test_the_oracles_catch(monkeypatch):
    """Each guard broken once, its oracle fails within the first schedules: the doubt check for rows without
    an id (at most once), the job cancelled at an abort (nothing after a failure), the rest of a batch handed
    over before later rows at a fall-back (order), the rows a batch stored before the fall-back counted (exact
    counts), a refusal reported (the failures)."""
    monkeypatch.setattr(fast_module, "check_resend", lambda feed, first, in_doubt: None)
    assert "stored twice" in (_first_violation(range(2_000)) or "")
    monkeypatch.undo()

    async def careless_abort(self) -> None:  # the job left running after the task failed
        await self._fast.close()

    monkeypatch.setattr(BatchedPublisher, "abort", careless_abort)
    assert "sends after the write failed" in (_first_violation(range(2_000)) or "")
    monkeypatch.undo()

    async def hasty_per_row(self, frames) -> None:  # later rows sent before the feed's rest is handed over
        await self.acked.publish(batched_module.reframed(frames, self.acked.reply_form))

    monkeypatch.setattr(BatchedPublisher, "_per_row", hasty_per_row)
    assert "out of order" in (_first_violation(range(4_000)) or "")
    monkeypatch.undo()

    class Uncounted(fast_module.TooManyBatches):
        def __init__(self, message, position, stored=0, duplicates=0) -> None:
            super().__init__(message, position)  # what the publish stored before it is forgotten

    monkeypatch.setattr(fast_module, "TooManyBatches", Uncounted)
    assert "counted" in (_first_violation(range(4_000)) or "")
    monkeypatch.undo()

    run = BatchedPublisher._run

    async def forgetting_failures(self, feed):
        await run(self, feed)
        self._failures.clear()  # a refusal not reported

    monkeypatch.setattr(BatchedPublisher, "_run", forgetting_failures)
    assert "failures" in (_first_violation(range(2_000)) or "")
    monkeypatch.undo()
