"""Dead-letter frames: what they carry, and that none ever exceeds the server's max_payload."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_jetstream.errors import PublishError
from pyspark_jetstream.protocol.frames import parse_hpub_frame
from pyspark_jetstream.protocol.headers import (
    DLQ_ORIGINAL_SIZE,
    DLQ_ROW,
    DLQ_TRUNCATED,
    encode_block,
    parse_headers,
)
from pyspark_jetstream.sink.encode.rows import RowRejection
from pyspark_jetstream.sink.task.dead_letters import dead_letter_frame


def _frame(payload: bytes, max_payload: int, *, subject: str = "orders.eu", reason: str = "refused",
           own: list[tuple[str, str]] | None = None, msg_id: str | None = "q:1:SRC.9") -> tuple[bytes, dict, bytes]:
    rejection = RowRejection(7, subject, reason, err_code=10054, payload=payload, ttl="1h", msg_id=msg_id)
    frame = dead_letter_frame(rejection, "dlq", "_INBOX.r.d7", 3, True, max_payload,
                              encode_block(own) if own else b"")
    line = frame.split(b"\r\n", 1)[0].split(b" ")
    assert int(line[-1]) == len(frame) - len(frame.split(b"\r\n", 1)[0]) - 4  # total size as announced
    _, block, body = parse_hpub_frame(frame)
    return frame, parse_headers(block), body


def test_a_row_that_fits_is_dead_lettered_whole():
    _, headers, body = _frame(b"x" * 100, 1024 * 1024, own=[("X-A", "1"), ("X-A", "2")])
    assert body == b"x" * 100 and headers["X-A"] == ["1", "2"]
    assert headers["Nats-Msg-Id"] == ["q:1:SRC.9:dlq"] and headers[DLQ_ROW] == ["3:7"]
    assert DLQ_TRUNCATED not in headers and DLQ_ORIGINAL_SIZE not in headers


def test_a_dead_letter_carries_no_header_that_steers_the_server():
    """A KV compare-and-set or purge row refused by the server: its expected sequence would get the dead
    letter refused too, its roll-up would purge other dead letters."""
    own = [("KV-Operation", "PURGE"), ("Nats-Rollup", "sub"), ("Nats-Expected-Last-Subject-Sequence", "4"),
           ("Nats-TTL", "1h"), ("Nats-Expected-Stream", "KV_B"), ("X-User", "u")]
    _, headers, _ = _frame(b"", 1024 * 1024, own=own)
    assert headers["KV-Operation"] == ["PURGE"] and headers["X-User"] == ["u"]
    assert [k for k in headers if k.lower().startswith("nats-")] == ["Nats-Msg-Id"]  # the dead letter's own id


def test_a_row_over_max_payload_is_cut_and_says_so():
    max_payload = 1024 * 1024
    payload = bytes(range(256)) * (max_payload // 256) + b"tail"
    frame, headers, body = _frame(payload, max_payload, own=[("X-A", "1")])
    header_len = len(frame.split(b"\r\n", 1)[0]) + 2
    assert len(frame) - header_len - 2 <= max_payload
    assert headers[DLQ_TRUNCATED] == ["true"] and headers[DLQ_ORIGINAL_SIZE] == [str(len(payload))]
    assert payload.startswith(body) and len(body) > max_payload - 2048
    assert headers["X-A"] == ["1"] and headers["Spark-JetStream-Error"] == ["refused"]


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 5000), max_payload=st.integers(256, 4096), subject_len=st.integers(1, 3000),
       reason_len=st.integers(0, 3000), own=st.lists(st.tuples(st.from_regex(r"X-[A-Z]{1,20}", fullmatch=True),
                                                                st.text("abc ", max_size=400)), max_size=8))
def test_no_dead_letter_exceeds_max_payload(size, max_payload, subject_len, reason_len, own):
    frame, headers, body = _frame(b"p" * size, max_payload, subject="s" * subject_len, reason="r" * reason_len,
                                  own=own)
    line = frame.split(b"\r\n", 1)[0]
    assert int(line.split(b" ")[-1]) <= max_payload
    assert headers[DLQ_ROW] == ["3:7"]
    if len(body) < size:
        assert headers[DLQ_TRUNCATED] == ["true"] and headers[DLQ_ORIGINAL_SIZE] == [str(size)]


def test_a_max_payload_too_small_for_any_dead_letter_fails_the_row():
    with pytest.raises(PublishError, match="row 7 of partition 3 .* cannot fit the server's max_payload of 100"):
        _frame(b"p" * 500, 100)
