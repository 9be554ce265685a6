"""Subject validity as nats-server judges it (protocol/subjects.py), in the one place the connector
judges it: pushdown, the option ``subjects``, the sink's subjects.

The server (``sublist.go`` ``isValidSubject``) refuses only ASCII space, tab, CR, LF and FF inside a
token, an empty token and a ``>`` before the last token; U+3000, U+00A0 and the other characters
Python's ``\\s`` matches are letters to it (stored and read back on 2.15.1:
tests/integration/test_pushdown_subjects.py)."""

from __future__ import annotations

import pytest

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.options.spec import parse_stream_name
from pyspark_jetstream.protocol.subjects import (
    can_be_stored,
    is_publish_subject,
    is_receivable_subject,
    is_valid_subject,
    is_valid_token,
)
from pyspark_jetstream.source.plan.filter_pushdown import literal_subject

UNICODE_BLANKS = ["\u3000", "\u00a0", "\u2028", "\u2029", "\u1680", "\u200b", "\x0b", "\x1c", "\x1f", "\x85"]
"""What ``str.isspace`` or ``\\s`` call whitespace (or, U+200B, look like it) and the server does not."""


@pytest.mark.parametrize("blank", UNICODE_BLANKS)
def test_what_python_calls_whitespace_is_part_of_a_subject(blank):
    subject = f"uni.a{blank}b"
    assert is_valid_subject(subject) and is_publish_subject(subject) and can_be_stored(subject)
    assert is_valid_token(f"a{blank}b")
    assert literal_subject(subject) == subject
    assert is_receivable_subject(subject) is (blank != "\x0b")  # nats-py cannot parse a delivery with VT


@pytest.mark.parametrize("blank", [" ", "\t", "\r", "\n", "\f"])
def test_the_servers_five_are_refused(blank):
    for subject in (f"a.b{blank}c", f"a.{blank}", f"{blank}.a", blank):
        assert not is_valid_subject(subject) and not is_publish_subject(subject)


@pytest.mark.parametrize(("subject", "valid", "publish"), [
    ("a", True, True),
    ("a.b.c", True, True),
    ("uni.東京\u3000本店", True, True),
    ("a.*.c", True, False),
    ("a.>", True, False),
    (">", True, False),
    ("a>.b", True, True),  # '>' inside a token is a letter
    ("a.>.b", False, False),  # a '>' token before the last
    ("", False, False),
    (".a", False, False),
    ("a.", False, False),
    ("a..b", False, False),
    ("a\x00b", True, True),  # NUL is checked by the server only where it checks runes
])
def test_validity(subject, valid, publish):
    assert is_valid_subject(subject) is valid
    assert is_publish_subject(subject) is publish


def test_what_the_server_stores_without_taking_it_in_a_filter():
    """A publish to ``a.b\\fc`` is stored (observed), but a consumer filter naming it is refused: a pushed
    value with FF is unsure (Spark's), one with a space or an empty token keeps nothing."""
    assert can_be_stored("a.b\fc") and not is_valid_subject("a.b\fc")
    assert literal_subject("a.b\fc") is None
    assert literal_subject("a.b c") is False and literal_subject("a..b") is False
    for subject in ("a b", "a\tb", "a\rb", "a\nb", "a..b", ".a", "a.", ""):
        assert not can_be_stored(subject)


def test_the_option_subjects_takes_unicode_blanks_and_trims_ascii_ones():
    opts = parse_source_options({"servers": "nats://h:4222", "stream": "S",
                                 "subjects": " uni.東京\u3000本店 ,uni.a\u00a0b\t, uni.>"}, streaming=False)
    assert opts.subjects == ("uni.東京\u3000本店", "uni.a\u00a0b", "uni.>")
    for bad in ("a b", "a.\fb", "a..b", "a.>.b"):
        with pytest.raises(Exception, match="subjects"):
            parse_source_options({"servers": "nats://h:4222", "stream": "S", "subjects": bad}, streaming=False)


def test_stream_names_are_refused_for_the_servers_blanks_only():
    assert parse_stream_name("東京\u3000本店") == "東京\u3000本店"
    for bad in ("a b", "a\tb", "a\fb", "a.b", "a*", "a>", "a/b"):
        with pytest.raises(ValueError):
            parse_stream_name(bad)


def test_the_sink_writes_only_what_a_nats_py_reader_can_receive():
    """nats-py's delivery-line regex (bytes ``\\s``) splits on VT and FF: a message stored under such a
    subject is never delivered to a plain nats-py client (this connector's reader swaps the regex), so
    the sink refuses them; Unicode blanks parse."""
    from pyspark_jetstream.client.nats_internals import NATS_PY_MSG_RE as MSG_RE  # as nats-py ships it
    from pyspark_jetstream.options.spec import parse_subject

    for subject in ("uni.東京\u3000本店", "uni.a\u00a0b", "uni.a\x1cb", "uni.a\x85b"):
        line = b"MSG " + subject.encode() + b" 1 $JS.ACK.x 2\r\n"
        assert MSG_RE.match(line).group(1) == subject.encode()
        assert is_receivable_subject(subject) and parse_subject(subject) == subject
    for subject in ("uni.a\x0bb", "uni.a\x0cb"):
        theirs = MSG_RE.match(b"MSG " + subject.encode() + b" 1 $JS.ACK.x 2\r\n")
        assert theirs is None or theirs.group(1) != subject.encode()  # cut at the blank
        assert not is_receivable_subject(subject)
        with pytest.raises(ValueError):
            parse_subject(subject)
