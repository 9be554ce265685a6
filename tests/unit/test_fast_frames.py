"""The raw subscriptions' fast frame path against nats-py's own protocol parser.

The same random byte stream, cut at the same random points, goes through a
plain nats-py ``Parser`` and through one with :class:`FastFrames` in front of
it. Both must report the same events in the same order: every frame (raw
subscriptions' and others'), every PING, PONG, -ERR and INFO, the protocol
error nats-py raises on a line it does not know, and what a reset (a stale
connection) throws away. No server: the client is a recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from pyspark_jetstream.client import nats_internals
from pyspark_jetstream.client.nats_internals import FastFrames

RAW_SIDS = (1, 2)  # raw subscriptions; 7 is a normal nats-py one
nats_internals.receive_every_subject()  # the parser as the connector runs it (VT and FF inside subjects)


class Recorder:
    """What nats-py's parser calls on its client, recorded; 'stale connection' resets the parser as
    nats-py's ``_process_op_err`` does."""

    def __init__(self, events: list) -> None:
        self.events = events
        self._ps = Parser(self)

    async def _process_msg(self, sid, subject, reply, data, headers):
        self.events.append(("msg", sid, subject, reply, data, headers))

    async def _process_err(self, text):
        self.events.append(("err", text))
        if "stale connection" in text:
            self._ps.reset()

    async def _process_ping(self):
        self.events.append(("ping",))

    async def _process_pong(self):
        self.events.append(("pong",))

    async def _process_info(self, info):
        self.events.append(("info", info))


def fast_recorder(events: list, raising: bytes | None = None) -> Recorder:
    client = Recorder(events)
    handlers, runs = {}, {}
    for sid in RAW_SIDS:
        def handler(subject, reply, data, headers, sid=sid):
            events.append(("msg", sid, subject, reply, data, headers))
            if raising is not None and data == raising:
                raise RuntimeError("a handler bug")  # logged and dropped, as nats-py's path does
        handlers[sid] = handler
    def run(frames):  # sid 2 takes its frames in runs, as the source's partitions do
        for frame in frames:
            with contextlib.suppress(RuntimeError):
                handlers[2](*frame)

    runs[2] = run
    FastFrames(client._ps, handlers, runs)
    return client


def feed(client: Recorder, chunks: list[bytes]) -> None:
    async def go():
        for chunk in chunks:
            try:
                await client._ps.parse(chunk)
            except ProtocolError as exc:  # nats-py's read loop stops on it
                client.events.append(("protocol error", str(exc)))
                return

    asyncio.run(go())


def msg(sid: int, subject: bytes, data: bytes, reply: bytes = b"") -> bytes:
    middle = b" " + reply if reply else b""
    return b"MSG %s %d%s %d\r\n%s\r\n" % (subject, sid, middle, len(data), data)


def hmsg(sid: int, subject: bytes, headers: bytes, data: bytes, reply: bytes = b"") -> bytes:
    middle = b" " + reply if reply else b""
    return b"HMSG %s %d%s %d %d\r\n%s%s\r\n" % (subject, sid, middle, len(headers), len(headers) + len(data),
                                                  headers, data)


ODD = [
    b"MSG\ta 1 3\r\nabc\r\n",  # a tab: nats-py's \s takes it
    b"MSG a  1   r  3\r\nabc\r\n",  # runs of spaces
    b"MSG a x 3\r\nabc\r\n",  # a sid that is not a number: malformed
    b"HMSG a 1 9 4\r\nabcd\r\nMORE\r\n",  # a header size past the payload
    b"HMSG a 2 0 3\r\nabc\r\n",  # HMSG with an empty header block
    b"MSG a 1 3\r\nabcXY",  # no CRLF after the payload: nats-py does not check it
    b"+OK \r\n", b"PING\r\n\r\n", b"-ERR\r\n 'x'\r\n", b"INFO {}\r\n",
    b"FOO bar\r\n",  # unknown
    b"MSG a 1\r\n",  # MSG without a size
    b"MSG a\x0cb 1 3\r\nabc\r\n", b"HMSG a\x0bb 2 0 3\r\nabc\r\n",  # VT and FF inside a subject: the server's rule
    b"MSG\x0ba 1 3\r\nabc\r\n",  # a VT is no separator: one unknown word
    b"\r\n",
]


def common_frame(rng: random.Random) -> bytes:
    sid = rng.choice(RAW_SIDS + (7,))
    subject = rng.choice([b"_INBOX.x", b"a.b.c", b"$JS.ACK.S.C.1.2.3.4.5"])
    reply = rng.choice([b"", b"$JS.ACK.S.C.1.%d.%d.1700000000000000000.0" % (rng.randrange(9), rng.randrange(9))])
    data = rng.choice([b"", b"x" * rng.randrange(1, 300), bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
                       b"MSG a 1 3\r\nabc\r\n", b"boom"])
    kind = rng.random()
    if kind < 0.45:
        return msg(sid, subject, data, reply)
    if kind < 0.85:
        headers = rng.choice([b"NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n",
                              b"NATS/1.0\r\nA: b\r\nA: c\r\n\r\n"])
        return hmsg(sid, subject, headers, data, reply)
    return rng.choice([b"PING\r\n", b"PONG\r\n", b"+OK\r\n", b"-ERR 'Permissions Violation for x'\r\n",
                       b"INFO " + json.dumps({"server_id": "x", "max_payload": 1 << 20}).encode() + b"\r\n"])


def stream_of(rng: random.Random, frames: int, odd: float, stale: bool) -> bytes:
    parts = []
    for _ in range(frames):
        parts.append(rng.choice(ODD) if rng.random() < odd else common_frame(rng))
    if stale:
        parts.insert(rng.randrange(len(parts) + 1), b"-ERR 'Stale Connection'\r\n")
    return b"".join(parts)


def cut(rng: random.Random, data: bytes) -> list[bytes]:
    points = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(0, 30)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)], strict=True)]


def both(chunks: list[bytes], raising: bytes | None = None, large: int | None = None) -> tuple[list, list]:
    reference, fast = [], []
    feed(Recorder(reference), chunks)
    client = fast_recorder(fast, raising)
    if large is not None:  # frames longer than this that a read cuts are gathered by nats-py
        client._ps.parse.__self__.large = large
    feed(client, chunks)
    return reference, fast


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), odd=st.sampled_from([0.0, 0.05, 0.3]), stale=st.booleans(),
       large=st.sampled_from([None, 0, 40, 120]))
@example(seed=1_167_764_194, odd=0.3, stale=False, large=0)  # a header size past the payload, handed over cut
def test_random_streams_cut_at_random_points_give_the_same_events(seed, odd, stale, large):
    rng = random.Random(seed)
    data = stream_of(rng, rng.randrange(1, 60), odd, stale)
    reference, fast = both(cut(rng, data), raising=b"boom", large=large)
    assert fast == reference


def test_a_large_frame_cut_by_reads_goes_through_nats_py_and_the_fast_path_resumes_after_it():
    big = msg(1, b"big", b"y" * 1_000_000)
    tail = b"".join(msg(1, b"s", b"d%d" % i) for i in range(50))
    data = msg(1, b"a", b"x") + big + tail
    chunks = [data[i:i + 32768] for i in range(0, len(data), 32768)]
    reference, fast = [], []
    feed(Recorder(reference), chunks)
    client = fast_recorder(fast)
    sizes = []
    original = client._ps.parse.__self__.original_parse

    async def counting(data=b""):
        sizes.append(len(data))
        return await original(data)

    client._ps.parse.__self__.original_parse = counting
    feed(client, chunks)
    assert fast == reference and len(fast) == 52
    # nats-py got the big frame only (its head, whole reads, then the bytes that finish it), and
    # nothing of the small frames after it.
    assert sum(sizes) == len(big)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), seed=st.integers(0, 2**32 - 1))
def test_arbitrary_bytes_give_the_same_events(data, seed):
    rng = random.Random(seed)
    # Arbitrary bytes after a valid frame, and a valid frame after arbitrary bytes.
    for stream in (msg(1, b"a", b"xyz") + data, data + msg(2, b"b", b"q")):
        assert both(cut(rng, stream))[1] == both(cut(rng, stream))[0]


def test_a_long_run_of_data_frames_is_split_without_nats_py():
    frames = [hmsg(1, b"s", b"NATS/1.0\r\nNats-TTL: 1h\r\n\r\n", b"d%d" % i, b"$JS.ACK.S.C.1.%d.%d.1.0" % (i, i))
              for i in range(500)]
    data = b"".join(frames)
    calls = []
    client = fast_recorder([])
    original = client._ps.__class__.parse

    async def counting(data=b""):
        calls.append(len(data))
        return await original(client._ps, data)

    client._ps.parse.__self__.original_parse = counting  # what FastFrames hands to nats-py
    run_lengths = []
    handler = client._ps.parse.__self__.handlers[1]
    client._ps.parse.__self__.runs[1] = lambda frames: (run_lengths.append(len(frames)),
                                                        [handler(*f) for f in frames])
    for size in (32768, 1000, 77, 7):  # reads cut control lines and payloads alike
        client.events.clear()
        feed(client, [data[i:i + size] for i in range(0, len(data), size)])
        assert len([e for e in client.events if e[0] == "msg"]) == 500
        assert calls == []  # every frame, even those cut between two reads, was split here
    assert max(run_lengths) > 100 and sum(run_lengths) == 2000  # one run per read, not one call per frame


LINE_TOKEN = st.sampled_from([b"a", b"a.b", b"\xc3\xa9", b"1", b"12", b"$JS.ACK.S.C.1.2.2.1.0", b"x\x0by", b"x\x85"])
LINE_SEPARATOR = st.sampled_from([b" ", b" ", b" ", b"  ", b"\t", b" \t", b"\x0b", b"\x0c", b"\r", b"\n"])


@settings(max_examples=1500, deadline=None)
@given(op=st.sampled_from([b"MSG", b"HMSG", b"MSGX", b" MSG"]), sid=st.sampled_from([b"1", b"2", b"7", b"x"]),
       tokens=st.lists(LINE_TOKEN, min_size=1, max_size=4), separators=st.lists(LINE_SEPARATOR, min_size=6, max_size=6),
       tail=st.sampled_from([b"", b" ", b"\t"]), payload=st.sampled_from([b"abc", b"NATS/1.0\r\n\r\nabc", b"12\r\n3"]))
@example(op=b"HMSG", sid=b"7", tokens=[b"12", b"1"], separators=[b" "] * 6, tail=b"", payload=b"abc")  # headers > size
def test_a_delivery_line_cut_without_the_regex_reads_as_nats_py_reads_it(op, sid, tokens, separators, tail, payload):
    """The fast path cuts a line that has exactly a server's form (single spaces, sizes in digits)
    without the regex: whatever the separators, tokens and sizes, the events are nats-py's."""
    fields = [b"s", sid, *tokens]
    line = op + b"".join(sep + field for sep, field in zip(separators, fields, strict=False)) + tail
    data = line + b"\r\n" + payload + b"\r\n" + msg(1, b"after", b"ok")
    reference, fast = both([data])
    assert fast == reference


@pytest.mark.parametrize("chunks", [
    [b"PING\r\nMSG a 1 3\r\nabc\r\nPONG\r\n"],
    [b"MSG a 7 3\r\nabc\r\nMSG a 1 3\r\nabc\r\n"],
    [b"MSG a 1 3\r\nab", b"c\r\nMSG a 2 3\r\nxyz\r\n"],
    [b"-ERR 'Stale Connection'\r\nMSG a 1 3\r\nabc\r\n"],
    [b"FOO\r\nMSG a 1 3\r\nabc\r\n"],
    [b"FOO", b"\r\nMSG a 1 3\r\nabc\r\n"],
])
def test_examples(chunks):
    reference, fast = both(chunks)
    assert fast == reference


def test_the_connection_uses_the_fast_path_once_a_raw_subscription_exists():
    client = Recorder([])
    client._process_msg = Recorder._process_msg.__get__(client)
    handlers = nats_internals._install(client)
    assert isinstance(client._ps.parse.__self__, FastFrames) and client._ps.parse.__self__.handlers is handlers
    assert nats_internals._install(client) is handlers  # once
