"""The fast-ingest publisher against real nats-servers (issue #48): R1 and an R3 cluster.

Every test reads back what was stored through nats-py's JetStream API (``js.get_msg``), field by
field: sequence, subject, payload, ``Nats-Msg-Id`` and the other headers. The faults are the
server's own: a batch it forgets (a restart: 10208 unknown batch), a message it never receives (a
gap), a message it refuses (a TTL on a stream without TTLs, a wrong expected last sequence), a
stream that does not take batches, too many open batches (429/10211).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
import pytest
from nats.js.api import StreamConfig

from pyspark_jetstream.client.fast_publisher import (
    FastIngestUnavailable,
    FastPublisher,
    Feed,
    batch_frames,
    check_stream,
    prepare,
)
from pyspark_jetstream.protocol.fast_ingest import BatchReplies
from pyspark_jetstream.protocol.frames import pub_frame
from pyspark_jetstream.tools.server import EmbeddedNatsServer


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def _messages(subject: str, n: int, tag: str = "m", start: int = 0) -> list:
    return [(f"{subject}.{p % 3}", {"X-Row": str(p)}, f"payload-{p}".encode() * (1 + p % 4), f"{tag}-{p}")
            for p in range(start, start + n)]


async def _stream(js, name: str, *, replicas: int = 1, batched: bool = True, max_msg_size: int | None = None) -> None:
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], num_replicas=replicas,
                                     allow_batched=batched or None, max_msg_size=max_msg_size))


async def _stored(js, name: str) -> list:
    info = await js.stream_info(name)
    out = []
    for seq in range(1, info.state.last_seq + 1):
        msg = await js.get_msg(name, seq)
        headers = msg.headers or {}
        out.append((msg.seq, msg.subject, msg.data, headers.get("Nats-Msg-Id"), headers.get("X-Row")))
    return out


def _expected(messages: list) -> list:
    return [(seq, subject, payload, msg_id, headers["X-Row"])
            for seq, (subject, headers, payload, msg_id) in enumerate(messages, 1)]


async def _publish_all(url: str, name: str, messages: list, replicas: int = 1, **options) -> tuple:
    nc = await nats.connect(servers=url.split(","))
    try:
        js = nc.jetstream()
        await _stream(js, name, replicas=replicas)
        await check_stream(nc, name)
        pub = await FastPublisher(nc, **options).start()
        result = await pub.publish(messages)
        await pub.close()
        return result, await _stored(js, name)
    finally:
        await nc.close()


def test_every_message_is_stored_once_in_order_r1(nats_server, stream_name):
    messages = _messages(stream_name, 1500)
    result, stored = _run(_publish_all(nats_server.url, stream_name, messages, flow=100, max_batch=600))
    assert stored == _expected(messages)
    assert (result.stored, result.last_seq, result.batches, result.resent, result.refused) == (1500, 1500, 3, 0, None)


def test_every_message_is_stored_once_in_order_r3(nats_cluster, stream_name):
    messages = _messages(stream_name, 1500)
    result, stored = _run(_publish_all(nats_cluster.url, stream_name, messages, replicas=3, flow=100))
    assert stored == _expected(messages)
    assert (result.stored, result.last_seq, result.batches, result.refused) == (1500, 1500, 1, None)


class _PausingPublisher(FastPublisher):
    """Stops after a send that leaves some messages short of a flow ack, until released."""

    def __init__(self, nc, **options) -> None:
        super().__init__(nc, **options)
        self.paused, self.release, self.at = asyncio.Event(), asyncio.Event(), None

    async def _send(self, buffer: bytes) -> None:
        await super()._send(buffer)
        window = self.window
        if self.at is None and window.sent >= 120 and window.sent % window.every:
            self.at = window
            self.paused.set()
            await self.release.wait()


async def _until(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := await condition()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)
    return value


def test_a_forgotten_batch_is_resent_and_nothing_is_stored_twice(stream_name):
    """An R1 restart forgets the batch: the next message gets 10208, and the publisher starts a new
    batch from the last flow ack + 1 with the same message ids. What the server had stored past that
    ack is dropped as duplicates."""
    messages = _messages(stream_name, 600)

    async def scenario(server):
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = await _PausingPublisher(nc, flow=50, chunk=64).start()
        task = asyncio.ensure_future(pub.publish(messages))
        await asyncio.wait_for(pub.paused.wait(), 30)
        sent, every = pub.at.sent, pub.at.every
        await _until(lambda: _count(js, stream_name, sent), f"the server stored {sent}")
        await _until(lambda: _settled(pub, sent - sent % every), "the flow acks came")
        in_doubt = sent - pub.window.acked
        assert in_doubt > 0
        await asyncio.get_running_loop().run_in_executor(None, server.restart)
        await _until(lambda: _connected(nc), "reconnected")
        pub.release.set()
        result = await task
        stored = await _stored(js, stream_name)
        await nc.close()
        return result, stored, in_doubt

    with EmbeddedNatsServer() as server:
        result, stored, in_doubt = _run(scenario(server))
    assert stored == _expected(messages)
    assert result.stored == 600 and result.batches == 2 and result.resent >= in_doubt


async def _count(js, name: str, n: int) -> bool:
    return (await js.stream_info(name)).state.messages >= n


async def _settled(pub: FastPublisher, acked: int) -> bool:
    return pub.window.acked >= acked


async def _connected(nc) -> bool:
    return nc.is_connected


class _LosingPublisher(FastPublisher):
    """Drops message ``lose`` (a batch sequence, ``op`` its operation) of the first batch on its way,
    once: a gap."""

    lose, op, first = 0, 1, ""

    async def _send(self, buffer: bytes) -> None:
        if self._batches == 1:
            self.first = self._batch_id
        elif self.first:
            # A late answer of the first batch (a message in flight after its end gets 10208): it must
            # not end the second.
            late = f"{self._inbox}.{self.first}.50.fail.{self.lose + 1}.1.$FI".encode()
            self._on_answer(late, b"", b'{"error":{"code":400,"err_code":10208,"description":"batch publish ID '
                            b'unknown"},"stream":"S","seq":0}', None)
            self.first = ""
        if self.lose and self._batches == 1:
            marker = f".{self.lose}.{self.op}.$FI ".encode()
            at = buffer.find(marker)
            if at >= 0:
                start = buffer.rfind(b"HPUB ", 0, at)
                end = buffer.find(b"HPUB ", at)
                buffer = buffer[:start] + (buffer[end:] if end >= 0 else b"")
                self.lose = 0
        await super()._send(buffer)


@pytest.mark.parametrize(("lose", "op"), [(150, 1), (400, 2)], ids=["append", "commit"])
def test_a_gap_ends_the_batch_and_the_rest_goes_in_a_new_one(nats_server, stream_name, lose, op):
    """A lost message in the middle: the next one makes the gap. A lost commit: nothing follows it,
    so the silence makes the publisher ping with the highest sequence sent, and that makes the gap."""
    messages = _messages(stream_name, 400)

    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = _LosingPublisher(nc, flow=50, ping_after=0.2, ack_timeout=5)
        pub.lose, pub.op = lose, op
        await pub.start()
        result = await pub.publish(messages)
        stored = await _stored(js, stream_name)
        await nc.close()
        return result, stored, pub.lose

    result, stored, lose = _run(scenario())
    assert lose == 0  # the message was dropped
    assert stored == _expected(messages)
    assert result.stored == 400 and result.batches == 2 and result.resent == 0


@pytest.mark.parametrize(("position", "header", "err_code"), [
    (0, ("Nats-Expected-Last-Sequence", "99"), 10071),
    (1, ("Nats-TTL", "1h"), 10166),
    (350, ("Nats-TTL", "1h"), 10166),
    (420, ("Nats-Expected-Last-Sequence", "99"), 10071),
    (200, None, 10054),  # larger than the stream's max_msg_size: refused before the batch's own checks
])
def test_a_refused_message_is_named_and_nothing_after_it_is_stored(nats_server, stream_name, position, header,
                                                                  err_code):
    messages = _messages(stream_name, 500)
    subject, headers, payload, msg_id = messages[position]
    if header is None:
        messages[position] = (subject, headers, b"x" * 2000, msg_id)
    else:
        messages[position] = (subject, [*headers.items(), header], payload, msg_id)

    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name, max_msg_size=1024)
        pub = await FastPublisher(nc, flow=100).start()
        result = await pub.publish(messages)
        stored = await _stored(js, stream_name)
        await nc.close()
        return result, stored

    result, stored = _run(scenario())
    refused = result.refused
    assert (refused.position, refused.subject, refused.err_code, refused.code) == (position, subject, err_code, 400)
    assert result.stored == position
    assert stored == _expected(messages[:position])


def test_a_stream_without_batches_is_detected_before_publishing(nats_server, stream_name):
    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name, batched=False)
        with pytest.raises(FastIngestUnavailable, match="allow_batched"):
            await check_stream(nc, stream_name)
        pub = await FastPublisher(nc).start()
        with pytest.raises(FastIngestUnavailable, match="10205"):  # the server's own refusal, if unchecked
            await pub.publish(_messages(stream_name, 10))
        info = await js.stream_info(stream_name)
        await nc.close()
        return info.state.messages

    assert _run(scenario()) == 0


def test_too_many_open_batches_is_waited_out(stream_name):
    """One open batch per stream: while another publisher's batch is open (message 1 sent, never
    committed) the stream answers 429/10211; the publisher backs off until the server abandons it."""
    config = 'limits { batch { max_inflight_per_stream: 1, timeout: "1s" } }'

    async def scenario(server):
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await _stream(js, stream_name)
        other = BatchReplies(nc.new_inbox(), "other", 10)
        answers = await nc.subscribe(other.listen)
        await nc.publish(f"{stream_name}.x", b"open", reply=other.subject(1, 0))
        assert b'"type":"ack"' in (await answers.next_msg(5)).data  # the other batch is open
        messages = _messages(stream_name, 300)
        pub = await FastPublisher(nc, flow=50, busy_for=20).start()
        result = await pub.publish(messages)
        stored = await _stored(js, stream_name)
        await nc.close()
        return result, stored, messages

    with EmbeddedNatsServer(jetstream_config=config) as server:
        result, stored, messages = _run(scenario(server))
    assert result.batches >= 2 and result.stored == 300
    assert stored[0][2] == b"open" and [row[1:] for row in stored[1:]] == [row[1:] for row in _expected(messages)]


def test_a_frame_cut_around_its_reply_is_the_whole_frame():
    from pyspark_jetstream.protocol.frames import hpub_around_reply, hpub_frame

    block = b"NATS/1.0\r\nNats-Msg-Id: a\r\n\r\n"
    before, after = hpub_around_reply("s.x", block, 5)
    assert before + b"r.1" + after + b"hello\r\n" == hpub_frame("s.x", "r.1", block, b"hello")
    assert pub_frame("s", "r", b"") == b"PUB s r 0\r\n\r\n"


class _NeverCommitting(FastPublisher):
    """Sends the last message as an append: the server stores it, answers pings, and waits for a commit."""

    @staticmethod
    def _frames(prepared, base, head, first, last, size, whole=False):
        return batch_frames(prepared, base, head, first, last, size + 1, whole)


def test_a_batch_that_never_ends_fails_by_its_deadline(nats_server, stream_name):
    """Every wait has a deadline: answers to pings that repeat the last ack are not progress."""
    from pyspark_jetstream.errors import AckTimeoutError

    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = await _NeverCommitting(nc, flow=10, ping_after=0.1, ack_timeout=1.0).start()
        started = time.monotonic()
        with pytest.raises(AckTimeoutError, match="No progress"):
            await pub.publish(_messages(stream_name, 30))
        await nc.close()
        return time.monotonic() - started

    assert _run(scenario()) < 10


class _FeedPublisher(FastPublisher):
    """Counts the pings and end-of-batch frames it sends; drops the first end-of-batch when asked."""

    drop_eob = False

    def __init__(self, nc, **options) -> None:
        super().__init__(nc, **options)
        self.pings = self.eobs = 0

    async def _send(self, buffer: bytes) -> None:
        if buffer.startswith(b"PUB ") and b".4.$FI " in buffer:
            self.pings += 1
        if buffer.startswith(b"PUB ") and b".3.$FI " in buffer:
            self.eobs += 1
            if self.drop_eob and self.eobs == 1:
                return
        await super()._send(buffer)


def test_an_open_feed_is_one_batch_across_pauses_and_commits_with_its_last_message(nats_server, stream_name):
    """The sink's way, one batch per task: messages come in parts, with pauses longer than the deadline
    between them (a partial flow interval is never acked before the commit: waiting for the feed is not
    waiting for the server). The feed's newest message waits while it is open, pings every ``keepalive``
    keep the batch alive, and closing the feed commits the batch with that message: no end-of-batch, an
    empty message the subject's core subscribers would receive (issue #56)."""
    messages = _messages(stream_name, 700)

    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = _FeedPublisher(nc, flow=100, ping_after=0.1, ack_timeout=1.0, keepalive=0.2)
        await pub.start()
        feed = Feed()
        job = asyncio.ensure_future(pub.publish_feed(feed))
        for part in (messages[:450], messages[450:]):  # 450: a partial flow interval waits for the feed
            pings = pub.pings
            feed.add(prepare(part), [m[0] for m in part], [m[3] for m in part])
            started = time.monotonic()
            await _until(lambda pings=pings: _idle(pub, feed.end - 1, pings + 6), "all but the newest sent, then pings")
            assert time.monotonic() - started > pub.ack_timeout and not job.done()
        feed.close()
        result = await job
        stored = await _stored(js, stream_name)
        await nc.close()
        return result, stored, pub.eobs

    result, stored, eobs = _run(scenario())
    assert stored == _expected(messages)
    assert (result.stored, result.batches, result.resent, result.refused) == (700, 1, 0, None)
    assert eobs == 0


async def _idle(pub: FastPublisher, sent: int, pings: int) -> bool:
    return pub.window.sent == sent and pub.pings >= pings


class _LosingTheFinalAck(FastPublisher):
    """Never hears the first batch's final PubAck (lost on its way): the batch ends with the next answer,
    10208 for a message sent after its end, with the rows after the last flow ack in doubt."""

    def _on_answer(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if self._batches == 1 and b'"count"' in data:
            return
        super()._on_answer(subject, reply, data, headers)


@pytest.mark.parametrize("with_ids", [True, False], ids=["ids", "no-ids"])
def test_rows_in_doubt_before_a_refusal_go_again_only_with_their_ids(nats_server, stream_name, with_ids):
    """Message 131 is refused and the final PubAck is lost: 101..130 (past the flow ack at 100) are in
    doubt. With ids they are left for the caller to resend (the stream drops any copy); without, the
    publish fails rather than send any of them twice (issue #54: 300 rows without ids stored 349)."""
    messages = _messages(stream_name, 300)
    if not with_ids:
        messages = [(subject, headers, payload, None) for subject, headers, payload, _ in messages]
    subject, headers, payload, msg_id = messages[130]
    messages[130] = (subject, [*headers.items(), ("Nats-TTL", "1h")], payload, msg_id)

    async def scenario():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = await _LosingTheFinalAck(nc, flow=50, ping_after=0.2, ack_timeout=10).start()
        try:
            return await pub.publish(messages), None, await _stored(js, stream_name)
        except Exception as e:  # noqa: BLE001 - the failure is what the test looks at
            return None, e, await _stored(js, stream_name)
        finally:
            await nc.close()

    result, error, stored = _run(scenario())
    assert [row[4] for row in stored] == [str(p) for p in range(130)]  # each once, in order
    if with_ids:
        assert error is None and result.refused.position == 130 and result.stored == 100
    else:
        assert result is None and "no Nats-Msg-Id" in str(error) and "in doubt (from 100)" in str(error)


@pytest.mark.parametrize("how", ["abort", "close"])
def test_a_batch_given_up_while_disconnected_sends_nothing_after_the_reconnect(stream_name, how):
    """The server goes away, the batch's first message waits in nats-py's write buffer, and the publish
    is given up. After an abort nothing of it reaches the server once the connection is back (issue #54:
    a failed batched write stored 1 row after the reconnect); a plain close (a publish that ended well)
    leaves nats-py's buffer alone: what the test tells apart."""
    messages = _messages(stream_name, 50)

    async def scenario(server):
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        js = nc.jetstream()
        await _stream(js, stream_name)
        pub = await FastPublisher(nc, flow=10, ack_timeout=30).start()
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
        await _until(lambda: _disconnected(nc), "the connection saw the server go")
        publishing = asyncio.ensure_future(pub.publish(messages))
        await _until(lambda: _buffered(nc), "message 1 waits in nats-py's buffer")
        publishing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await publishing
        await (pub.abort() if how == "abort" else pub.close())
        held = nc.pending_data_size  # what nats-py would write after the reconnect
        if how == "close":
            with contextlib.suppress(Exception):  # closing while down: nats-py's flush of what it holds fails
                await nc.close()
            return held, 0
        await asyncio.get_running_loop().run_in_executor(None, server.start)
        await _until(lambda: _connected(nc), "reconnected")
        await nc.flush(5)  # whatever nats-py still held is written before the PONG comes back
        count = (await js.stream_info(stream_name)).state.messages
        await nc.close()
        return held, count

    with EmbeddedNatsServer() as server:
        held, stored = _run(scenario(server))
    assert (held > 0) is (how == "close") and stored == 0


async def _disconnected(nc) -> bool:
    return not nc.is_connected


async def _buffered(nc) -> bool:
    return nc.pending_data_size > 0
