"""How a ``multi_last`` batch's end is read (``protocol/direct_get.py``), free of I/O: the statuses as
nats-server 2.11.11 and 2.15.1 send them (observed), and a leader's ``STREAM.MSG.GET`` reply."""

from __future__ import annotations

import base64

import pytest

from pyspark_jetstream.protocol.direct_get import BatchEnd, Outcome, still_missing, stored_message


@pytest.mark.parametrize(("code", "description", "outcome"), [
    (204, "EOB", Outcome.END),
    (404, "No Results", Outcome.NONE),
    (404, "Message Not Found", Outcome.RETRY),  # a resolved message gone when loaded: a race, not an answer
    (413, "Too Many Results", Outcome.FAIL),
    (408, "Bad Request", Outcome.FAIL),
    (503, "", Outcome.UNANSWERED),  # no store answers direct gets just now (a replica catching up): ask again
])
def test_the_status_ending_a_batch(code, description, outcome):
    assert BatchEnd(code, description).outcome is outcome


def test_an_end_is_of_the_view_asked_only_with_that_sequence_echoed():
    assert BatchEnd(204, "EOB", 69).of_view(69)
    assert not BatchEnd(204, "EOB", 70).of_view(69)
    assert not BatchEnd(204, "EOB", None).of_view(69)
    assert BatchEnd(204, "EOB", 12).of_view(None)  # no sequence asked: any view is now


def test_a_batch_continues_with_what_is_still_missing_in_order():
    asked = ["$KV.b.k2", "$KV.b.k0", "$KV.b.k1"]
    assert still_missing(asked, {b"$KV.b.k0"}) == ["$KV.b.k2", "$KV.b.k1"]
    assert still_missing(asked, {s.encode() for s in asked}) == []


def test_a_leader_reply_reads_as_a_direct_get_message():
    def reply(hdrs: bytes | None) -> dict:
        m = {"subject": "$KV.b.k", "seq": 7, "data": base64.b64encode(b"v").decode(),
             "time": "2026-11-26T18:52:56.37811454Z"}
        if hdrs is not None:
            m["hdrs"] = base64.b64encode(hdrs).decode()
        return {"message": m}

    block = b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"
    m = stored_message(reply(block))
    assert (m.subject, m.data, m.headers, m.seq, m.ts_ns % 1_000_000_000) == (b"$KV.b.k", b"v", block, 7, 378114540)
    assert stored_message(reply(None)).headers is None
    assert stored_message(reply(b"NATS/1.0\r\n\r\n")).headers is None
