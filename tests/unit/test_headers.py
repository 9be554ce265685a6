import pytest

from pyspark_jetstream.protocol.headers import (
    InvalidHeader,
    check_header_name,
    check_header_value,
    encode_block,
    parse_headers,
    parse_status,
)


@pytest.mark.parametrize("name", ["X-Trace", "a", "Content-Type", "nats-custom", "x_y.z"])
def test_good_names(name):
    assert check_header_name(name, allow_rollup=False) == name


@pytest.mark.parametrize(
    "name", ["", "a b", "a:b", "a\r\nb", "é", "Nats-Expected-Stream", "nats-expected-last-sequence", "Nats-Marker-Reason", 5]
)
def test_bad_names(name):
    with pytest.raises(InvalidHeader):
        check_header_name(name, allow_rollup=False)


def test_rollup_needs_opt_in():
    with pytest.raises(InvalidHeader, match="allowRollup"):
        check_header_name("Nats-Rollup", allow_rollup=False)
    assert check_header_name("Nats-Rollup", allow_rollup=True) == "Nats-Rollup"


@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "line\n", "cr\r", 7, None])
def test_bad_values(value):
    with pytest.raises(InvalidHeader):
        check_header_value("X", value)


def test_block_round_trip_with_repeated_keys():
    block = encode_block([("A", "1"), ("A", "2"), ("B", "x: y")])
    assert block == b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: x: y\r\n\r\n"
    assert parse_status(block) == (0, "") and parse_headers(block) == {"A": ["1", "2"], "B": ["x: y"]}
    assert parse_status(b"NATS/1.0 503\r\n\r\n") == (503, "")
