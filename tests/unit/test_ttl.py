"""ADR-43 TTL grammar: Go durations, the server's verdicts and the connector's rule."""

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.ttl import (
    InvalidTtl,
    parse_go_duration,
    remaining_ttl_seconds,
    resolve_ttl,
    server_ttl_seconds,
)

S = 1_000_000_000


@pytest.mark.parametrize(
    "text, ns",
    [
        ("0", 0), ("-0", 0), ("+0", 0), ("1s", S), ("+1s", S), ("-1s", -S), ("1.5s", 3 * S // 2),
        (".5m", 30 * S), ("5.m", 300 * S), ("1.s", S), ("1h30m", 5400 * S), ("2m30s", 150 * S),
        ("1m0s", 60 * S), ("1000ms", S), ("1000000us", S), ("1000000µs", S), ("1000000μs", S),
        ("1000000000ns", S), ("1s1s", 2 * S), ("2562047h", 2562047 * 3600 * S), ("1.999999999s", 1999999999),
        ("9223372036s", 9223372036 * S),
    ],
)
def test_go_duration_accepts(text, ns):
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(
    "text",
    ["", "1", "1d", "abc", "1 s", "5 ", ".s", "-.s", "1h-1m", "1e3", "0x10", "2562048h", "9223372037s", "s", "+", "-"],
)
def test_go_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_go_duration(text)


# Verdicts observed from nats-server 2.15.1 PubAcks (None: stored without a TTL).
@pytest.mark.parametrize(
    "value, seconds",
    [
        ("1", 1), ("1s", 1), ("3600", 3600), ("2m30s", 150), ("1h", 3600), ("1.5s", 1), ("1.9s", 1),
        ("never", -1), ("NEVER", -1), ("Never", -1), ("", None), (" ", None), (" 5", 5), ("00001", 1),
        ("00", None), ("18446744073709551617", 1), ("9223372036854775807", 9223372036854775807),
    ],
)
def test_server_grammar_accepts(value, seconds):
    assert server_ttl_seconds(value) == seconds


@pytest.mark.parametrize(
    "value",
    ["0", "0s", "-0", "+0", "500ms", "999ms", "-1", "-1s", "abc", "1d", "+5", "5 ", "1 s", "1e3",
     "9223372036854775808", "2562048h", "1.5", "١"],
)
def test_server_grammar_rejects(value):
    with pytest.raises(InvalidTtl):
        server_ttl_seconds(value)


@pytest.mark.parametrize(
    "value, header",
    [
        (3600, "3600"), (1, "1"), ("1h", "1h"), ("  90s", "90s"), ("never", "never"), ("1.5s", "1.5s"),
        # ADR-43: zero is ignored: no header, whatever its spelling.
        (0, None), ("0", None), ("0s", None), ("0.0h", None), ("-0s", None), ("00", None),
        ("", None), ("   ", None),
    ],
)
def test_resolve_ttl(value, header):
    assert resolve_ttl(value) == header


@pytest.mark.parametrize(
    "value",
    [-1, "-1", "-5s", "500ms", "abc", "1d", "5 ", True, 1.5, None, 2**63, "18446744073709551617", "99999999999999999999"],
)
def test_resolve_ttl_rejects(value):
    with pytest.raises(InvalidTtl):
        resolve_ttl(value)


TTL_LIKE = st.one_of(
    st.text(max_size=30),  # mostly refused
    # Mostly accepted: whole seconds, Go durations of every unit, 'never' in any case, odd spacing.
    st.builds(lambda pad, n: pad + str(n), st.sampled_from(["", " ", "  "]), st.integers(0, 2**64)),
    st.builds(lambda n, frac, unit: f"{n}{frac}{unit}", st.integers(0, 10**6), st.sampled_from(["", ".5", ".25"]),
              st.sampled_from(["ns", "us", "µs", "ms", "s", "m", "h"])),
    st.sampled_from(["never", "NEVER", "Never", " never", "1h30m", "2m30s", "1.5h"]),
)


@given(TTL_LIKE)
def test_resolve_ttl_only_raises_invalid_ttl(text):
    try:
        header = resolve_ttl(text)
    except InvalidTtl:
        return
    # Anything accepted is something the server stores with a TTL (or, for zero/empty, no header).
    if header is not None:
        assert server_ttl_seconds(header) is not None
        assert "\r" not in header and "\n" not in header


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_resolve_ttl_integers_round_trip(n):
    assert server_ttl_seconds(resolve_ttl(n)) == n


def test_remaining_ttl_rounds_up_and_detects_expiry():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert remaining_ttl_seconds(now + dt.timedelta(seconds=10), now) == 10
    assert remaining_ttl_seconds(now + dt.timedelta(seconds=9, microseconds=1), now) == 10
    assert remaining_ttl_seconds(now + dt.timedelta(microseconds=1), now) == 1
    assert remaining_ttl_seconds(now, now) == 0
    assert remaining_ttl_seconds(now - dt.timedelta(seconds=5), now) == 0


def test_the_resolver_memo_gives_what_resolve_ttl_gives_value_by_value():
    from pyspark_jetstream.protocol.ttl import TtlResolver

    resolver = TtlResolver()
    for value in ["1h", "1h", 1, True, 1, "bogus", "bogus", 0, "0", "never", -1, " 30", 2**64]:
        for _ in range(2):  # the second time from the memo
            try:
                expected = ("ok", resolve_ttl(value))
            except InvalidTtl as exc:
                expected = ("refused", str(exc))
            try:
                got = ("ok", resolver(value))
            except InvalidTtl as exc:
                got = ("refused", str(exc))
            assert got == expected, value
