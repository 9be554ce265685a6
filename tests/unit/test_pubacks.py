"""PubAcks taken as a run (the fast frame path) against PubAcks taken one frame at a time.

A publisher's window is filled with tokens, then the same random replies (stored,
duplicate, a JetStream error, a dead letter's ack, a 503 status, a late reply for a
settled token) are settled both ways. The counts, the failures, what stays in flight
and the window's two events must be the same after every run. No server: the
publisher is never started; only its settling is exercised.
"""

from __future__ import annotations

import json
import random

import pytest

from pyspark_jetstream.sink.publisher import DEAD_LETTER_TAG, Publisher

PREFIX = "_INBOX.abc."


class NoServer:
    _server_info: dict = {}  # not clustered: a 503 is final


def publisher(max_pending: int) -> Publisher:
    pub = Publisher(NoServer(), max_pending=max_pending, ack_timeout=5.0)
    pub.reply_prefix, pub._prefix_len = PREFIX, len(PREFIX)
    return pub


def reply(rng: random.Random, token: str) -> tuple:
    kind = rng.random()
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
    return (pub.stored, pub.duplicates, pub.dead_lettered, sorted(pub._inflight), pub._room.is_set(),
            pub._done.is_set(), [(f.position, f.code, f.err_code, f.description, f.dead_letter) for f in pub.failures],
            pub._send_error)


@pytest.mark.parametrize("seed", range(40))
def test_a_run_of_pubacks_settles_as_one_frame_at_a_time_does(seed):
    rng = random.Random(seed)
    window = rng.choice([1, 8, 64])
    one, run = publisher(window), publisher(window)
    tokens = [str(i) for i in range(window)] + [f"{DEAD_LETTER_TAG}{i}" for i in range(window // 2)]
    for pub in (one, run):
        for token in tokens:
            pub._inflight[token] = (int(token.lstrip(DEAD_LETTER_TAG)), b"frame", "S.x", None, None, 0, 0)
        pub._room.clear()
        pub._done.clear()
    for _ in range(4):
        frames = [reply(rng, rng.choice(tokens + ["999999"])) for _ in range(rng.randrange(0, window + 3))]
        for subject, _reply, data, headers in frames:  # the per-ack path, one frame at a time
            one._on_ack(subject[len(PREFIX):].decode(), data, headers)
        run._on_ack_frames(frames)
        assert state(run) == state(one)
    assert run.stored + run.duplicates + run.dead_lettered + len(run.failures) > 0
