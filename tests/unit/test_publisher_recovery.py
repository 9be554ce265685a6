"""The ordered publisher's recovery (sink/publish/publisher.py) driven through a fake clustered connection.

Why a fake: the case under test needs one PubAck, of one resent frame, to come later than the
recovery's quiet period, and nothing else to change meanwhile; a real leader election cannot be
steered that finely. The fake is the stream as the publisher sees it: frames it stores (or drops, as a
leader that steps down does) by a script, PubAcks it answers or withholds, deletes, and the lookup of
frames whose PubAck was lost (``replay_guard.stored_sequences``, here a look at the fake's messages).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter

from pyspark_jetstream.client import transport as transport_module
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.sink.encode.msg_ids import base_id
from pyspark_jetstream.sink.publish import recovery
from pyspark_jetstream.sink.publish.publisher import Publisher
from pyspark_jetstream.sink.publish.recovery import OrderBook
from pyspark_jetstream.sink.records import replay_guard

from .model_transport import frames_in, header

STREAM = "S"
DROP, STORE, SILENT, REFUSE, NO_LEADER = "drop", "store", "silent", "refuse", "no-leader"  # one copy's fate


_frames = frames_in
_header = header


def _msg_id(block: bytes) -> str:
    msg_id = _header(block, "Nats-Msg-Id")
    assert msg_id is not None, block
    return msg_id


class _Reply:
    def __init__(self, body: dict) -> None:
        self.data = json.dumps(body).encode()


class FakeClusteredStream:
    """A connection to a clustered stream (its INFO names a cluster) in memory. ``script(msg_id, copy)``
    says what happens to the ``copy``-th arrival (1, 2, ...) of a frame: :data:`DROP` (an old leader's
    loss: not stored, no reply), :data:`STORE` (stored, or a duplicate of a stored id, and answered) or
    :data:`SILENT` (stored, its PubAck never comes: a slow new leader) or :data:`REFUSE` (refused by a per-subject
    limit, 10077: not stored)."""

    def __init__(self, script) -> None:
        self._server_info = {"cluster": "fake"}
        self._pending: list = []
        self.is_closed = False
        self.script = script
        self.copies: Counter = Counter()
        self.messages: dict[int, tuple[str, str, bytes]] = {}  # seq -> subject, msg id, payload
        self.ids: dict[str, int] = {}  # msg id -> seq (the duplicate window)
        self.last_seq = 0
        self.handler = None
        self.deny_delete = False

    def new_inbox(self) -> str:
        return "_INBOX.fake"

    async def _send_command(self, buffer: bytes) -> None:
        loop = asyncio.get_running_loop()
        for subject, reply, block, payload in _frames(buffer):
            msg_id = _msg_id(block)
            self.copies[msg_id] += 1
            fate = self.script(msg_id, self.copies[msg_id])
            if fate == DROP:
                continue
            if fate == NO_LEADER:  # a 503: no responders while a leader is elected
                loop.call_soon(self.handler, [(reply.encode(), b"", b"", b"NATS/1.0 503\r\n\r\n")])
                continue
            if fate == REFUSE:
                refusal = {"error": {"code": 400, "err_code": 10077, "description": "maximum messages per subject "
                                     "exceeded"}, "stream": STREAM, "seq": 0}
                loop.call_soon(self.handler, [(reply.encode(), b"", json.dumps(refusal).encode(), None)])
                continue
            duplicate = msg_id in self.ids
            expected = _header(block, "Nats-Expected-Last-Subject-Sequence")
            last = max((seq for seq, m in self.messages.items() if m[0] == subject), default=0)
            if not duplicate and expected is not None and int(expected) != last:
                refusal = {"error": {"code": 400, "err_code": 10071, "description": f"wrong last sequence: {last}"},
                           "stream": STREAM, "seq": 0}
                loop.call_soon(self.handler, [(reply.encode(), b"", json.dumps(refusal).encode(), None)])
                continue
            if not duplicate:
                self.last_seq += 1
                self.ids[msg_id] = self.last_seq
                self.messages[self.last_seq] = (subject, msg_id, payload)
            if fate == SILENT:
                continue
            ack = {"stream": STREAM, "seq": self.ids[msg_id], **({"duplicate": True} if duplicate else {})}
            loop.call_soon(self.handler, [(reply.encode(), b"", json.dumps(ack).encode(), None)])

    async def _flush_pending(self) -> None:
        return None

    async def request(self, subject: str, payload: bytes, timeout: float = 10.0, headers=None) -> _Reply:
        await asyncio.sleep(0.01)  # a request waits for its reply: the loop runs others meanwhile
        if subject == f"$JS.API.STREAM.INFO.{STREAM}":
            return _Reply({"config": {"name": STREAM, "deny_delete": self.deny_delete},
                           "state": {"last_seq": self.last_seq}})
        if subject == f"$JS.API.STREAM.MSG.GET.{STREAM}":  # the first message at or after seq
            seq = json.loads(payload)["seq"]
            held = sorted(s for s in self.messages if s >= seq)
            if not held:
                return _Reply({"error": {"code": 404, "err_code": 10037, "description": "no message found"}})
            found, (subj, _, data) = held[0], self.messages[held[0]]
            return _Reply({"message": {"subject": subj, "seq": found, "data": base64.b64encode(data).decode()}})
        assert subject == f"$JS.API.STREAM.MSG.DELETE.{STREAM}", subject
        seq = json.loads(payload)["seq"]
        self.messages.pop(seq)  # the id stays in the duplicate window, as the server keeps it
        return _Reply({"success": True})

    async def stored_sequences(self, nc, stream, api_prefix, after, wanted, deadline):
        return {msg_id: seq for seq, (_, msg_id, _) in self.messages.items() if seq > after and msg_id in wanted}

    async def moved_copies(self, nc, stream, api_prefix, after, bases, deadline):
        found: dict[str, list[int]] = {}
        for seq, (_, msg_id, _) in sorted(self.messages.items()):
            if seq > after and base_id(msg_id) != msg_id and base_id(msg_id) in bases:
                found.setdefault(base_id(msg_id), []).append(seq)
        return found

    def payloads(self, subject: str) -> list[bytes]:
        return [p for _, (s, _, p) in sorted(self.messages.items()) if s == subject]


def _install(monkeypatch, fake: FakeClusteredStream) -> None:
    async def subscribe(nc, subject, handler, run=None):
        fake.handler = run
        return object()

    async def unsubscribe(nc, sub):
        fake.handler = None

    monkeypatch.setattr(transport_module, "raw_subscribe", subscribe)
    monkeypatch.setattr(transport_module, "raw_unsubscribe", unsubscribe)
    monkeypatch.setattr(replay_guard, "stored_sequences", fake.stored_sequences)
    monkeypatch.setattr(replay_guard, "moved_copies", fake.moved_copies)
    monkeypatch.setattr(recovery, "QUIET", 0.1)  # the quiet period, short: the fake answers at once


def _out_frames(pub: Publisher, subject: str, count: int, expect: dict[int, int] | None = None) -> list[tuple]:
    """``count`` frames to ``subject`` in the OutFrame layout, with ids ``r:<position>``; ``expect``: the
    last subject sequence some of them expect (position -> sequence)."""
    out = []
    for position in range(count):
        condition = "" if position not in (expect or {}) else \
            f"Nats-Expected-Last-Subject-Sequence: {expect[position]}\r\n"
        block = f"NATS/1.0\r\nNats-Msg-Id: r:{position}\r\n{condition}\r\n".encode()
        payload = str(position).encode()
        frame = hpub_frame(subject, f"{pub.reply_prefix}{position}", block, payload)
        out.append((position, frame, subject, None, f"r:{position}", len(block), len(payload)))
    return out


def _write(fake: FakeClusteredStream, frames_of, **options) -> Publisher:
    """Publish what ``frames_of(pub)`` gives through a publisher on ``fake``, drained and closed: the publisher."""

    async def write() -> Publisher:
        pub = await Publisher(fake, max_pending=16, ack_timeout=10.0, idempotent=True, ordered_stream=STREAM,
                              **options).start()
        try:
            await pub.publish(frames_of(pub))
            await pub.drain()
        finally:
            await pub.close()
        return pub

    return asyncio.run(asyncio.wait_for(write(), 30))


def test_a_resent_frame_answered_after_the_quiet_period_still_gets_the_frames_stored_ahead_of_it_moved(monkeypatch):
    """Issue #39, item 1: row 0 is lost with the old leader, rows 1 and 2 of its subject are stored; the
    recovery resends row 0, and the new leader stores it but its PubAck is slower than the quiet period.
    The next round finds row 0 in the stream; rows 1 and 2, stored ahead of it, must still be moved behind
    it (they were forgotten as settled, by the send number row 0's resend was given: order lost, silently)."""

    def script(msg_id: str, copy: int) -> str:
        if msg_id == "r:0":
            return DROP if copy == 1 else SILENT if copy == 2 else STORE
        return STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "S.a", 3))
    assert fake.payloads("S.a") == [b"0", b"1", b"2"]
    assert pub.reordered == 2 and pub.found_after_loss == 1


def test_frames_answered_in_one_round_are_checked_for_order_before_anything_is_forgotten(monkeypatch):
    """Rows 0 (subject a) and 2 (subject b) are lost with the old leader, row 1 (a) is stored. The resend
    stores row 0 behind row 1 and answers it, while row 2's PubAck is slower than the quiet period. The
    round that finds row 2 in the stream must not forget rows 0 and 1 as sent before every frame still
    unanswered: their order was not checked yet, and row 1 must move behind row 0."""

    def script(msg_id: str, copy: int) -> str:
        if msg_id == "r:0":
            return DROP if copy == 1 else STORE
        if msg_id == "r:2":
            return DROP if copy == 1 else SILENT if copy == 2 else STORE
        return STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: [*_out_frames(pub, "S.a", 3)[:2], _out_frames(pub, "S.b", 3)[2]])
    assert (fake.payloads("S.a"), fake.payloads("S.b")) == ([b"0", b"1"], [b"2"])
    assert pub.reordered == 1


def test_a_compare_and_set_frame_is_sent_again_only_behind_what_precedes_it_in_the_task(monkeypatch):
    """Issue #39, item 4: row 0 creates key k (expects its subject to hold nothing), rows 1 and 2 put k. The create
    is lost with the old leader, the puts are stored. Sent again as it was, the create was refused (the key
    exists: wrong last sequence) although it succeeds in the task's order: the puts stored ahead of it are
    moved first, and it goes out ahead of them."""

    def script(msg_id: str, copy: int) -> str:
        return DROP if msg_id == "r:0" and copy == 1 else STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "$KV.B.k", 3, expect={0: 0}), bucket=True)
    assert pub.failures == []
    assert fake.payloads("$KV.B.k") == [b"0", b"1", b"2"]
    assert pub.reordered == 2


def test_frames_answered_in_order_are_not_remembered_and_a_loss_after_them_is_still_repaired(monkeypatch):
    """Issue #39, order costs nothing when nothing goes wrong: PubAcks that come in send order are settled
    with no bookkeeping (none of rows 0-99 is remembered with its sequence). Row 100 is then lost with
    the old leader: the rows of its subject stored ahead of it are remembered from there on, moved
    behind it, and both subjects end in the task's order."""

    def script(msg_id: str, copy: int) -> str:
        return DROP if msg_id == "r:100" and copy == 1 else STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)
    remembered: list[int] = []
    remember = OrderBook.remember

    def spy(self, token, send_no, sent, seq):
        remembered.append(sent[0])
        remember(self, token, send_no, sent, seq)

    monkeypatch.setattr(OrderBook, "remember", spy)

    async def write() -> Publisher:
        pub = await Publisher(fake, max_pending=16, ack_timeout=10.0, idempotent=True, ordered_stream=STREAM).start()
        frames = [a if a[0] % 2 == 0 else b for a, b in zip(_out_frames(pub, "S.a", 160), _out_frames(pub, "S.b", 160),
                                                               strict=True)]
        try:
            await pub.publish(frames)
            await pub.drain()
        finally:
            await pub.close()
        return pub

    pub = asyncio.run(asyncio.wait_for(write(), 30))
    assert remembered and min(remembered) >= 100, remembered
    assert fake.payloads("S.a") == [str(p).encode() for p in range(0, 160, 2)]
    assert fake.payloads("S.b") == [str(p).encode() for p in range(1, 160, 2)]
    assert pub.reordered > 0 and pub.stored == 160 and pub.failures == []
    assert not pub.recovery.book.stored_recent and not pub.recovery.book.pending  # all forgotten once calm


def test_a_retried_attempt_moves_what_its_predecessor_stored_ahead_of_a_missing_row(monkeypatch):
    """Issue #39: a batch write without ``writeId`` has no replay records; its retried attempt learns what its
    predecessor stored from its PubAcks. The stream (one server, no cluster) holds rows 1 and 3 of subject a
    from the failed attempt, rows 0 and 2 are missing. Sent again, rows 0 and 2 are stored new, rows 1 and 3
    come back as duplicates at their old, lower sequences: both inversions are seen (a later mark must not
    hide the first), and rows 1, 2 and 3 are moved behind row 0, each once."""
    fake = FakeClusteredStream(lambda msg_id, copy: STORE)
    fake._server_info = {}  # a single server: no leader changes, the ordered recovery is the retry's alone
    for msg_id, payload in (("r:1", b"1"), ("r:3", b"3")):
        fake.last_seq += 1
        fake.ids[msg_id] = fake.last_seq
        fake.messages[fake.last_seq] = ("S.a", msg_id, payload)
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "S.a", 4), after_retry=True)
    assert fake.payloads("S.a") == [b"0", b"1", b"2", b"3"]
    assert pub.failures == [] and pub.reordered >= 2


def test_a_first_attempt_on_one_server_keeps_the_unordered_fast_path(monkeypatch):
    """Without a retry nothing is checked on a single server (no leader changes there): the rows a stream held
    under the same ids stay where they are, as duplicates, and nothing is moved."""
    fake = FakeClusteredStream(lambda msg_id, copy: STORE)
    fake._server_info = {}
    fake.last_seq, fake.ids["r:1"], fake.messages[1] = 1, 1, ("S.a", "r:1", b"1")
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "S.a", 2))
    assert fake.payloads("S.a") == [b"1", b"0"] and pub.duplicates == 1 and pub.reordered == 0


def test_a_retry_does_not_move_again_a_row_its_predecessor_moved_already(monkeypatch):
    """The predecessor's own leader-change repair moved row 1 behind row 0: its first copy deleted, the row
    stored again under ``r:1:o1``. The retry's duplicate of ``r:1`` names the deleted copy's sequence, below
    row 0's: the row stands in order already (as ``r:1:o1``), and moving it again would store it twice."""
    fake = FakeClusteredStream(lambda msg_id, copy: STORE)
    fake._server_info = {}
    fake.last_seq = 3
    fake.ids.update({"r:1": 1, "r:0": 2, "r:1:o1": 3})  # r:1's first copy (seq 1) deleted by the repair
    fake.messages.update({2: ("S.a", "r:0", b"0"), 3: ("S.a", "r:1:o1", b"1")})
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "S.a", 2), after_retry=True)
    assert fake.payloads("S.a") == [b"0", b"1"] and pub.reordered == 0


def test_a_moved_copy_the_stream_refuses_leaves_the_row_where_it_is_counted_out_of_order(monkeypatch):
    """Issue #54: row 0 is lost with the old leader, rows 1 and 2 of its subject are stored; the recovery stores
    row 0 and moves rows 1 and 2 behind it, but the stream refuses their moved copies (a per-subject limit: the
    old copies still count, 10077). Each row is stored (its old copy stays), so neither is a refused row: no
    failure (no dead letter), both counted out of order, none as moved."""

    def script(msg_id: str, copy: int) -> str:
        if msg_id == "r:0":
            return DROP if copy == 1 else STORE
        return REFUSE if ":o" in msg_id else STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)

    pub = _write(fake, lambda pub: _out_frames(pub, "S.a", 3))
    assert fake.payloads("S.a") == [b"1", b"2", b"0"]  # every row once, the old copies where they were
    assert pub.failures == []
    assert (pub.reordered, pub.left_out_of_order) == (0, 2)


def test_an_election_is_one_warning_and_one_info_not_a_line_per_resend(monkeypatch, caplog):
    """Issue #56: row 0 gets 503 (no responders) twice while a leader is elected, then is stored. The task's
    log says so once when the answers stop, naming the target, and once when they come again."""
    import logging

    def script(msg_id: str, copy: int) -> str:
        return NO_LEADER if msg_id == "r:0" and copy <= 2 else STORE

    fake = FakeClusteredStream(script)
    _install(monkeypatch, fake)

    async def write() -> Publisher:
        pub = await Publisher(fake, max_pending=16, ack_timeout=10.0, idempotent=True, target="stream 'S'").start()
        try:
            await pub.publish(_out_frames(pub, "S.a", 3))
            await pub.drain()
        finally:
            await pub.close()
        return pub

    with caplog.at_level(logging.INFO, logger="pyspark_jetstream"):
        pub = asyncio.run(asyncio.wait_for(write(), 30))
    assert fake.payloads("S.a") == [b"1", b"2", b"0"] and pub.resent == 2 and pub.failures == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("pyspark_jetstream")]
    assert len(said) == 2, said
    assert said[0][0] == "WARNING" and said[0][1].startswith("JetStream sink: stream 'S' did not answer (503")
    assert said[1][0] == "INFO" and said[1][1].startswith("JetStream sink: stream 'S' answers again, after")
