"""A move killed between any two of its steps loses nothing (issue #47, part 1).

A pure-logic test with a stand-in stream (tests/unit/test_publisher_recovery.py's fake: its store, its
duplicate window, deletes, the lookups): the first attempt's ordered repair after a leader change moves
rows, and the stream "dies" before its k-th change (a message stored, or one deleted), for every k from
the first change to past the last. The task's retry then runs, without replay records (its PubAcks tell
what is stored) and with them (a scan of the stream, as ``writeId`` gives, and the walk of
publish/retry_order.py). Every row must end stored exactly once, each subject in the task's order.

Before the fix a move deleted the copies first and published them after: a kill in between left rows
with no copy, which the retry counted as stored (a duplicate PubAck of a deleted copy).
"""

from __future__ import annotations

import asyncio

import pytest

from pyspark_jetstream.sink.encode.msg_ids import base_id
from pyspark_jetstream.sink.publish.publisher import Publisher
from pyspark_jetstream.sink.publish.retry_order import RetryMoves

from .test_publisher_recovery import DROP, STORE, STREAM, FakeClusteredStream, _install, _out_frames


class Killed(ConnectionError):
    """The task died: nothing more reaches the stream."""


class MortalStream(FakeClusteredStream):
    """The fake stream, whose task dies before the stream's ``budget``-th change after this one (None: never)."""

    def __init__(self, script, budget: int | None) -> None:
        super().__init__(script)
        self.budget = budget
        self.changes = 0
        self.ever_stored: set[str] = set()  # the rows the stream held at some point

    def _change(self) -> None:
        if self.budget is not None and self.changes >= self.budget:
            self.is_closed = True
            raise Killed(f"killed before change {self.changes + 1}")
        self.changes += 1

    async def _send_command(self, buffer: bytes) -> None:
        from .test_publisher_recovery import _frames, _msg_id

        for one in _frames_of(buffer):
            subject, reply, block, payload = next(_frames(one))
            if _msg_id(block) not in self.ids and self.script(_msg_id(block), self.copies[_msg_id(block)] + 1) != DROP:
                self._change()  # a new message would be stored
            await super()._send_command(one)
            self.ever_stored.update(base_id(msg_id) for _, msg_id, _ in self.messages.values())

    async def request(self, subject: str, payload: bytes, timeout: float = 10.0, headers=None):
        if ".MSG.DELETE." in subject:
            self._change()
        return await super().request(subject, payload, timeout, headers)

    def revive(self) -> None:
        self.budget, self.is_closed, self.script = None, False, lambda msg_id, copy: STORE


def _frames_of(buffer: bytes) -> list[bytes]:
    """``buffer`` split into its HPUB frames."""
    out = []
    while buffer:
        line, _, rest = buffer.partition(b"\r\n")
        total = int(line.split(b" ")[-1])
        size = len(line) + 2 + total + 2
        out.append(buffer[:size])
        buffer = buffer[size:]
    return out


def _task(pub: Publisher) -> list[tuple]:
    """Subject a: positions 0, 1, 2, 4, 5; subject b: 3, 6."""
    a, b = _out_frames(pub, "S.a", 7), _out_frames(pub, "S.b", 7)
    return [b[p] if p in (3, 6) else a[p] for p in range(7)]


EXPECTED = {"S.a": [b"0", b"1", b"2", b"4", b"5"], "S.b": [b"3", b"6"]}


def _script(msg_id: str, copy: int) -> str:
    """Row 0 lost with the old leader (so 1, 2, 4, 5 are stored ahead of it and moved), and the first moved copy
    of row 2 lost too (a second round moves row 4 and 5 again)."""
    if copy == 1 and (msg_id == "r:0" or msg_id.startswith("r:2:o")):
        return DROP
    return STORE


async def _first_attempt(fake: MortalStream) -> None:
    pub = await Publisher(fake, max_pending=16, ack_timeout=5.0, idempotent=True, ordered_stream=STREAM).start()
    try:
        await pub.publish(_task(pub))
        await pub.drain()
    finally:
        await pub.close()


async def _retry(fake: MortalStream, records: bool) -> Publisher:
    if not records:
        pub = await Publisher(fake, max_pending=16, ack_timeout=5.0, idempotent=True, ordered_stream=STREAM,
                              move_base=7000, after_retry=True).start()
        try:
            await pub.publish(_task(pub))
            await pub.drain()
        finally:
            await pub.close()
        return pub
    stored: dict[str, tuple[int, ...]] = {}
    for seq, (_, msg_id, _) in sorted(fake.messages.items()):  # the replay scan: every copy, by the row's id
        stored[base_id(msg_id)] = (*stored.get(base_id(msg_id), ()), seq)
    retry = RetryMoves(stored, False, "attempt-2", False)
    pub = await Publisher(fake, max_pending=16, ack_timeout=5.0, idempotent=True, ordered_stream=STREAM,
                          move_base=retry.move_base, after_retry=True).start()
    try:
        frames = retry.in_order_behind(_task(pub), set(stored), None, pub)
        if frames:
            await pub.publish(frames)
        await pub.drain()
        await pub.delete_stored(retry.take_stale())
    finally:
        await pub.close()
    return pub


def _changes_of_a_whole_write(monkeypatch) -> int:
    fake = MortalStream(_script, None)
    _install(monkeypatch, fake)
    asyncio.run(asyncio.wait_for(_first_attempt(fake), 30))
    assert {s: fake.payloads(s) for s in EXPECTED} == EXPECTED  # the repair alone puts every subject in order
    return fake.changes


@pytest.mark.parametrize("records", [False, True], ids=["pubacks-tell", "replay-records"])
def test_a_move_killed_between_any_two_steps_loses_nothing_after_the_retry(monkeypatch, records):
    """Right after the kill every row the stream ever held still has a copy (a move deletes only what its new
    copy replaced); after the retry every row is stored once, each subject in order."""
    total = _changes_of_a_whole_write(monkeypatch)
    assert total >= 7 + 4 + 4  # 7 rows, every moved row stored again and its old copy deleted
    for budget in range(7, total + 1):  # the kill comes within the repair, at each step boundary
        fake = MortalStream(_script, budget)
        _install(monkeypatch, fake)
        killed = budget < total
        try:
            asyncio.run(asyncio.wait_for(_first_attempt(fake), 30))
        except Exception as exc:
            assert killed, exc
        held = {base_id(msg_id) for _, msg_id, _ in fake.messages.values()}
        assert fake.ever_stored <= held, f"killed before change {budget + 1}: rows with no copy left"
        fake.revive()
        asyncio.run(asyncio.wait_for(_retry(fake, records), 30))
        stored = {s: fake.payloads(s) for s in EXPECTED}
        assert stored == EXPECTED, f"killed before change {budget + 1} of {total}: {fake.messages}"
