"""The connector's TTL verdicts against a real nats-server's PubAcks, value by value.

Each value is published raw as ``Nats-TTL: <value>`` to a TTL-enabled stream.
The server's verdict must equal the pure emulation (ttl.server_ttl_seconds) for
every value, and the connector's own rule (ttl.resolve_ttl) for every value
except the documented divergences, which are asserted as documented.
"""

import pytest

from pyspark_jetstream.client.jsapi import ERR_MESSAGE_TTL_INVALID
from pyspark_jetstream.protocol.ttl import InvalidTtl, resolve_ttl, server_ttl_seconds

VALUES = [
    # plain integers
    "1", "60", "3600", "00001", "00", "-1", "+5", "9223372036854775807", "9223372036854775808",
    # Go durations: every unit, fractions, signs, compound
    "1s", "1.5s", "1.999999999s", "0.5s", "999ms", "1000ms", "1000000us", "1000000µs", "1000000μs",
    "1000000000ns", "2m30s", "1m0s", ".5m", "5.m", "1.s", "1h", "1h30m", "1s1s", "+1s", "-1s", "-1h",
    "2562047h", "2562048h", "9223372036s", "9223372037s",
    # never, in any case
    "never", "NEVER", "Never",
    # zero in several spellings (ADR-43: ignored; the server rejects)
    "0", "0s", "-0s", "+0", "0.0h",
    # garbage, whitespace, empty
    "abc", "1d", "1 s", "5 ", " 5", " ", "", "1e3", "0x10", "1_000", "1.5", "1h-1m", "never ", "١",
    # huge: overflowing int64 digits wrap around inside the server
    "18446744073709551617", "99999999999999999999",
]

# value -> (server accepts, connector accepts, why they differ)
DIVERGENCES = {
    "0": (False, True, "ADR-43: zero is ignored; published without Nats-TTL"),
    "0s": (False, True, "ADR-43: zero is ignored"),
    "-0s": (False, True, "ADR-43: zero is ignored"),
    "+0": (False, True, "ADR-43: zero is ignored"),
    "0.0h": (False, True, "ADR-43: zero is ignored"),
    "18446744073709551617": (True, False, "the server wraps int64 and would expire it after 1s"),
    "99999999999999999999": (True, False, "the server wraps int64"),
}


def _accepts(fn, value) -> bool:
    try:
        fn(value)
        return True
    except InvalidTtl:
        return False


@pytest.fixture(scope="module")
def ttl_stream(nats_client):
    nats_client.add_stream("TTLDIFF", ["ttldiff.>"], allow_msg_ttl=True)
    return "TTLDIFF"


def test_table_is_large_enough():
    assert len(VALUES) >= 25 and len(set(VALUES)) == len(VALUES)


def test_client_verdicts_match_pubacks(nats_client, ttl_stream):
    server, emulated, connector = {}, {}, {}
    for i, value in enumerate(VALUES):
        ack = nats_client.publish_raw(
            f"ttldiff.{i}", b"NATS/1.0\r\nNats-TTL: " + value.encode() + b"\r\n\r\n", b"x"
        )
        if "error" in ack:
            assert ack["error"]["err_code"] == ERR_MESSAGE_TTL_INVALID, (value, ack)
        server[value] = "error" not in ack
        emulated[value] = _accepts(server_ttl_seconds, value)
        connector[value] = _accepts(resolve_ttl, value)

    assert emulated == server
    expected_connector = {v: DIVERGENCES[v][1] if v in DIVERGENCES else server[v] for v in VALUES}
    assert connector == expected_connector
    for value, (server_ok, _, _why) in DIVERGENCES.items():
        assert server[value] is server_ok, f"nats-server changed its verdict on {value!r}; revisit DIVERGENCES"


def test_what_the_connector_sends_is_accepted(nats_client, ttl_stream):
    for i, value in enumerate(VALUES):
        try:
            header = resolve_ttl(value)
        except InvalidTtl:
            continue
        block = b"NATS/1.0\r\n" + (f"Nats-TTL: {header}\r\n".encode() if header is not None else b"") + b"\r\n"
        ack = nats_client.publish_raw(f"ttldiff.sent.{i}", block, b"x")
        assert "error" not in ack, (value, header, ack)
