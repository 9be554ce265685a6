"""PubAcks taken as a run (the fast frame path) against PubAcks taken one frame at a time.

A publisher's window is filled with tokens, then the same random replies (stored,
duplicate, a JetStream error, a dead letter's ack, a 503 status, a late reply for a
settled token) are settled both ways. The counts, the failures, what stays in flight
and the window's two events must be the same after every run. No server: the
publisher is never started; only its settling is exercised.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from pyspark_jetstream.sink.publish.acks import DEAD_LETTER_TAG
from pyspark_jetstream.sink.publish.publisher import Publisher

PREFIX = "_INBOX.abc."


class NoServer:
    _server_info: dict = {}  # not clustered: a 503 is final
    is_closed = False


def publisher(max_pending: int) -> Publisher:
    pub = Publisher(NoServer(), max_pending=max_pending, ack_timeout=5.0)
    pub.reply_prefix, pub.window.prefix_len = PREFIX, len(PREFIX)
    return pub


def reply(rng: random.Random, token: str, plain: float = 0.7) -> tuple:
    kind = rng.random() * 0.7 / plain if plain < 1 else 0.0
    subject = (PREFIX + token).encode()
    if kind < 0.7:
        return subject, b"", json.dumps({"stream": "S", "seq": rng.randrange(1, 10**6)}).encode(), None
    if kind < 0.8:
        return subject, b"", b'{"stream":"S","seq":7, "duplicate": true}', None
    if kind < 0.9:
        error = {"code": 400, "err_code": 10164, "description": "message TTL invalid"}
        return subject, b"", json.dumps({"error": error}).encode(), None
    return subject, b"", b"", b"NATS/1.0 503\r\n\r\n"


def state(pub: Publisher) -> tuple:
    return (pub.stored, pub.duplicates, pub.dead_lettered, sorted(pub.window.inflight), pub.window.room.is_set(),
            pub.window.done.is_set(), [(f.position, f.code, f.err_code, f.description, f.dead_letter) for f in pub.failures],
            pub.window.send_error)


@pytest.mark.parametrize("seed", range(40))
def test_a_run_of_pubacks_settles_as_one_frame_at_a_time_does(seed):
    rng = random.Random(seed)
    window = rng.choice([1, 8, 64])
    one, run = publisher(window), publisher(window)
    tokens = [str(i) for i in range(window)] + [f"{DEAD_LETTER_TAG}{i}" for i in range(window // 2)]
    for pub in (one, run):
        for token in tokens:
            pub.window.inflight[token] = (int(token.lstrip(DEAD_LETTER_TAG)), b"frame", "S.x", None, None, 0, 0)
        pub.window.room.clear()
        pub.window.done.clear()
    for _ in range(4):
        frames = [reply(rng, rng.choice(tokens + ["999999"])) for _ in range(rng.randrange(0, window + 3))]
        for subject, _reply, data, headers in frames:  # the per-ack path, one frame at a time
            one.acks.on_ack(subject[len(PREFIX):].decode(), data, headers)
        run.acks.on_frames(frames)
        assert state(run) == state(one)
    assert run.stored + run.duplicates + run.dead_lettered + len(run.failures) > 0


@pytest.mark.parametrize("seed", range(20))
def test_a_run_of_plain_acks_settles_in_one_pass_as_one_frame_at_a_time_does(seed):
    """Runs of nothing but plain acks take settle_plain_run (C-level passes); some with a late reply for a
    settled token or a dead letter's ack among them (which send the run to the per-reply loop), frames whose
    503s are being waited out (first_503), and mostly plain runs."""
    rng = random.Random(seed)
    window = rng.choice([8, 64, 512])
    one, run = publisher(window), publisher(window)
    tokens = [str(i) for i in range(window)] + [f"{DEAD_LETTER_TAG}{i}" for i in range(2)]
    for pub in (one, run):
        for token in tokens:
            pub.window.inflight[token] = (int(token.lstrip(DEAD_LETTER_TAG)), b"frame", "S.x", None, None, 0, 0)
        pub.window.first_503.update({str(i): 1.0 for i in range(0, window, 3)})
        pub.window.room.clear()
        pub.window.done.clear()
    rows = tokens[:-2]
    for _ in range(6):
        size = rng.randrange(1, window // 2 + 2)
        picked = rng.sample(rows, min(size, len(rows))) + (["999999"] if rng.random() < 0.3 else [])
        if rng.random() < 0.2:
            picked.append(rng.choice(tokens[-2:]))
        frames = [reply(rng, token, plain=rng.choice([1.0, 1.0, 0.95])) for token in picked]
        for subject, _reply, data, headers in frames:
            one.acks.on_ack(subject[len(PREFIX):].decode(), data, headers)
        run.acks.on_frames(frames)
        assert state(run) == state(one) and run.window.first_503 == one.window.first_503
    assert run.stored > 0


def test_all_plain_is_may_be_plain_of_every_body():
    from pyspark_jetstream.protocol.puback import all_plain, may_be_plain

    rng = random.Random(7)
    pieces = PLAIN_ACKS + DUPLICATE_ACKS + [e[0] for e in ERROR_ACKS] + [b"", b'x"err', b'or"y', b'"dupli', b'cate"']
    assert all_plain([]) and not all_plain([b""]) and not all_plain([b'{"stream":"S","seq":1}', b""])
    assert all_plain([b'x"err', b'or"y']) and all_plain([b'"dupli', b'cate"'])  # no match across two bodies
    for _ in range(2000):
        bodies = [rng.choice(pieces) for _ in range(rng.randrange(0, 6))]
        assert all_plain(bodies) == all(b and may_be_plain(b) for b in bodies), bodies


# ---- decided on parsed keys (issue #23): stream and domain names are free text in a PubAck

PLAIN_ACKS = [  # what nats-server sends for a stored message, for awkward stream / domain names
    b'{"stream":"error", "seq":1}',
    b'{"stream":"duplicate", "seq":2}',
    b'{"stream":"S", "domain":"error", "seq":3}',
    b'{"stream":"S", "domain":"duplicate", "seq":4}',
    json.dumps({"stream": 'a"error"b', "seq": 5}).encode(),
    json.dumps({"stream": '"duplicate": true', "seq": 6}).encode(),
    b'{"stream":"ORDERS", "seq":7}',
]
DUPLICATE_ACKS = [
    b'{"stream":"error", "seq":1,"duplicate": true}',
    b'{"stream":"duplicate", "seq":1,"duplicate": true}',
    b'{"stream":"S", "domain":"error", "seq":1,"duplicate": true}',
    json.dumps({"stream": "S", "seq": 1, "duplicate": True}).encode(),
]
ERROR_ACKS = [
    (b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}', 400, 10071,
     "wrong last sequence: 3"),
    (b'{"error":{"code":503,"err_code":10077,"description":"duplicate stream name"}}', 503, 10077,
     "duplicate stream name"),
    (b'{"error":{"code":400,"description":"stream \\"duplicate\\" is sealed"}}', 400, None,
     'stream "duplicate" is sealed'),
    (b'{"stream":"x"}', 0, None, "not a PubAck: b'{\"stream\":\"x\"}'"),
    (b'not json', 0, None, "not a PubAck: b'not json'"),
    (b'{"stream":"S","seq":1,"duplicate":false,"error":{"code":500,"err_code":1,"description":"e"}}', 500, 1, "e"),
]


@pytest.mark.parametrize("data", PLAIN_ACKS)
def test_an_ack_of_a_stored_message_is_stored_whatever_the_names_in_it(data):
    from pyspark_jetstream.protocol.puback import STORED, PubAck, parse_puback

    assert parse_puback(data) == PubAck(STORED)


@pytest.mark.parametrize("data", DUPLICATE_ACKS)
def test_a_duplicate_is_decided_on_the_duplicate_key(data):
    from pyspark_jetstream.protocol.puback import DUPLICATE, PubAck, may_be_plain, parse_puback

    assert parse_puback(data) == PubAck(DUPLICATE)
    assert not may_be_plain(data)  # the pre-check never vouches for a duplicate


@pytest.mark.parametrize(("data", "code", "err_code", "description"), ERROR_ACKS)
def test_an_error_is_decided_on_the_error_object(data, code, err_code, description):
    from pyspark_jetstream.protocol.puback import ERROR, PubAck, may_be_plain, parse_puback

    assert parse_puback(data) == PubAck(ERROR, code, err_code, description)
    if b'"error"' in data:
        assert not may_be_plain(data)


@pytest.mark.parametrize("fast", [True, False], ids=["run", "one-at-a-time"])
def test_a_publisher_settles_acks_of_streams_named_error_or_duplicate_as_stored(fast):
    acks = PLAIN_ACKS + DUPLICATE_ACKS + [e[0] for e in ERROR_ACKS[:3]] + [b'{"stream":"error", "seq":9}']
    dead = [b'{"stream":"duplicate", "seq":10}', b'{"stream":"error", "seq":11}',
            b'{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}']
    pub = publisher(64)
    tokens = [str(i) for i in range(len(acks))] + [f"{DEAD_LETTER_TAG}{i}" for i in range(len(dead))]
    for token in tokens:
        pub.window.inflight[token] = (int(token.lstrip(DEAD_LETTER_TAG)), b"frame", "S.x", None, None, 0, 0)
    frames = [((PREFIX + t).encode(), b"", data, None) for t, data in zip(tokens, acks + dead, strict=True)]
    if fast:
        pub.acks.on_frames(frames)
    else:
        for subject, _reply, data, headers in frames:
            pub.acks.on_ack(subject[len(PREFIX):].decode(), data, headers)
    assert (pub.stored, pub.duplicates, pub.dead_lettered) == (len(PLAIN_ACKS) + 1, len(DUPLICATE_ACKS), 2)
    assert [(f.position, f.code, f.err_code, f.dead_letter) for f in pub.failures] == [
        (len(PLAIN_ACKS) + len(DUPLICATE_ACKS) + k, c, e, False) for k, (_, c, e, _d) in enumerate(ERROR_ACKS[:3])
    ] + [(2, 400, 10060, True)]
    assert pub.window.inflight == {} and pub.window.done.is_set()


IN_PROCESS = json.dumps({"error": {"code": 409, "err_code": 10158,
                                   "description": "duplicate message id is in process"}}).encode()


def test_only_the_in_process_refusal_is_taken_for_one():
    from pyspark_jetstream.protocol.puback import id_in_process

    assert id_in_process(IN_PROCESS)
    assert not id_in_process(b'{"error":{"code":400,"err_code":10164,"description":"message TTL invalid"}}')
    assert not id_in_process(b'{"stream":"S10158","seq":10158}')  # the number in a name or a sequence


def test_a_copy_whose_id_is_still_in_process_is_sent_again_not_failed(monkeypatch):
    """10158: a clustered leader still proposes an earlier copy with the frame's id (a resend, a retried task's
    copy). No decision about the row: it is sent again later, and the answer then (here: the duplicate of the
    copy once stored) settles it. CI saw a retried task fail on it (test_cluster_moves)."""
    from pyspark_jetstream.sink.publish import publisher as publisher_module

    monkeypatch.setattr(publisher_module, "RETRY_503_INTERVAL", 0.01)

    async def go():
        pub = publisher(4)
        sent: list[bytes] = []

        async def capture(buffer: bytes) -> None:
            sent.append(buffer)

        pub.send = capture
        pub.window.inflight["1"] = (1, b"frame-1", "S.x", None, "id-1", 0, 0)
        pub.acks.on_frames([((PREFIX + "1").encode(), b"", IN_PROCESS, None)])
        assert not pub.failures and "1" in pub.window.inflight
        for _ in range(200):
            if sent:
                break
            await asyncio.sleep(0.01)
        assert sent == [b"frame-1"]  # the same frame, the same id
        pub.acks.on_frames([((PREFIX + "1").encode(), b"", b'{"stream":"S","seq":5,"duplicate":true}', None)])
        assert (pub.duplicates, pub.failures, pub.window.inflight) == (1, [], {})

    asyncio.run(go())


def test_an_ordered_publisher_repairs_in_order_a_copy_whose_id_is_still_in_process():
    """Ordered, a resend could land behind later frames of its subject: a 10158 starts a recovery (which finds
    the copy stored, or sends it again in its subject's order), as a 503 does; the row is not failed."""

    class Clustered:
        _server_info: dict = {"cluster": "c"}

    async def go():
        pub = Publisher(Clustered(), max_pending=4, ack_timeout=5.0, idempotent=True, ordered_stream="S")
        pub.reply_prefix, pub.window.prefix_len = PREFIX, len(PREFIX)
        pub.recovery.book.note_sends([(1, b"frame-1", "S.x", None, "id-1", 0, 0)], pub.window.inflight)
        pub.acks.on_frames([((PREFIX + "1").encode(), b"", IN_PROCESS, None)])
        try:
            assert not pub.failures and "1" in pub.window.inflight and "1" in pub.recovery.book.pending
            assert not pub.recovery.calm()  # a recovery runs
        finally:
            pub.recovery._task.cancel()

    asyncio.run(go())
