"""Option parsing: typed values, defaults, cross-option rules, unknown keys, secrets."""

import pickle
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.options import (
    CONNECTION_OPTIONS,
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    parse_sink_options,
    parse_source_options,
)


def test_defaults():
    opts = parse_sink_options({})
    assert opts.connection.servers == ("nats://127.0.0.1:4222",)
    assert opts.ensure_stream == "validate"
    assert opts.idempotent is True
    assert opts.preserve_expiry is False
    assert opts.max_pending_acks > 0
    assert opts.default_ttl is None


def test_names_are_case_insensitive_and_values_typed():
    opts = parse_sink_options(
        {"SERVERS": "nats://a:1, tls://b:2", "defaultttl": "1h", "maxpendingacks": "100", "ackTimeout": "1m30s",
         "stream": "S", "ensureStream": "CREATE", "stream.subjects": "a.>,b.*", "stream.maxAge": "24h"}
    )
    assert opts.connection.servers == ("nats://a:1", "tls://b:2")
    assert opts.default_ttl == "1h"
    assert opts.max_pending_acks == 100
    assert opts.ack_timeout == 90.0
    assert opts.ensure_stream == "create"
    assert opts.stream_settings.subjects == ("a.>", "b.*")
    assert opts.stream_settings.max_age == 86400.0


def test_default_ttl_zero_means_no_header():
    opts = parse_sink_options({"defaultTtl": "0"})
    assert opts.default_ttl is None


@pytest.mark.parametrize(
    "key, value",
    [
        ("servers", ""), ("servers", "http://x y"), ("defaultTtl", "500ms"), ("defaultTtl", "1d"),
        ("defaultTtl", "-1"), ("preserveExpiry", "yes"), ("ensureStream", "always"), ("idempotent", "1"),
        ("maxPendingAcks", "0"), ("maxPendingAcks", "ten"), ("maxPendingAcks", "2000000"), ("ackTimeout", "500ms"),
        ("ackTimeout", "soon"), ("subject", "orders.*"), ("subject", "a b"), ("subject", "a..b"), ("subject", ">"),
        ("deadLetterSubject", "dlq.>"), ("stream", "a.b"), ("stream", "a b"), ("stream.storage", "disk"),
        ("stream.replicas", "0"), ("stream.replicas", "7"), ("stream.maxAge", "-1s"),
        ("stream.maxMsgsPerSubject", "-2"), ("stream.duplicateWindow", "0"),
        ("stream.subjectDeleteMarkerTtl", "500ms"), ("stream.subjectDeleteMarkerTtl", "0"),
        ("stream.subjects", "a,,b"), ("connectTimeout", "0"), ("credsFile", "/no/such/file.creds"),
        ("tlsCaFile", "/no/such/ca.pem"), ("allowRollup", "maybe"),
    ],
)
def test_bad_values_name_the_option_and_value(key, value):
    with pytest.raises(OptionError) as info:
        parse_sink_options({key: value})
    assert info.value.option == key
    message = str(info.value)
    assert f"'{key}'" in message and repr(value) in message and "Expected" in message


def test_credentials_in_server_urls_are_refused_without_echoing_them():
    with pytest.raises(OptionError) as info:
        parse_sink_options({"servers": "nats://a:1,nats://alice:hunter2-secret@b:2"})
    message = str(info.value)
    assert "hunter2-secret" not in message and "nats://***@b:2" in message
    assert "user'/'password" in message


@pytest.mark.parametrize("key", ["defaultTTL ", "defaulTtl", "DEFAULTTTL_"])
def test_unknown_option_suggests_the_nearest(key):
    with pytest.raises(OptionError) as info:
        parse_sink_options({key: "1h", "stream": "S"})
    assert info.value.option == key
    assert "Unknown option" in str(info.value) and "Did you mean 'defaultTtl'" in str(info.value)


def test_spark_owned_keys_are_ignored():
    parse_sink_options({"checkpointLocation": "/tmp/x", "path": "ignored"})
    # A catalog table's reserved properties and its option.* copies (CREATE TABLE ... USING jetstream).
    table = {"provider": "jetstream", "owner": "root", "option.stream": "S", "option.servers": "nats://h:4222"}
    assert parse_source_options({**table, "stream": "S"}, streaming=None).stream == "S"
    assert parse_sink_options({**table, "stream": "S"}).stream == "S"


def test_a_read_or_write_with_no_option_at_all_says_why_a_catalog_table_gets_none():
    from pyspark_jetstream.options import check_write_has_options

    with pytest.raises(OptionError, match="Spark does not pass them to a Python data source"):
        parse_source_options({}, streaming=False)
    with pytest.raises(OptionError, match="Spark does not pass them to a Python data source"):
        check_write_has_options({"path": "x"})
    check_write_has_options({"subject": "a.b"})
    with pytest.raises(OptionError) as info:  # options given: the plain message, no catalog hint
        parse_source_options({"servers": "nats://h:4222"}, streaming=False)
    assert "CREATE TABLE" not in str(info.value)


@pytest.mark.parametrize(
    "raw, option",
    [
        ({"ensureStream": "create"}, "stream"),
        ({"ensureStream": "update"}, "stream"),
        ({"ensureStream": "create", "stream": "S"}, "stream.subjects"),
        ({"user": "u"}, "password"),
        ({"password": "p"}, "user"),
        ({"user": "u", "password": "p", "token": "t"}, "token"),
        ({"subject": "a", "deadLetterSubject": "a"}, "deadLetterSubject"),
    ],
)
def test_cross_option_rules(raw, option):
    with pytest.raises(OptionError) as info:
        parse_sink_options(raw)
    assert info.value.option == option


def test_tls_pair_rule(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(OptionError) as info:
        parse_sink_options({"tlsCertFile": str(cert)})
    assert info.value.option == "tlsKeyFile"


def test_secrets_never_print():
    opts = parse_sink_options({"user": "alice", "password": "s3cr3t-pw"})
    assert "s3cr3t-pw" not in repr(opts) and "s3cr3t-pw" not in str(opts)
    assert opts.connection.password.reveal() == "s3cr3t-pw"
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert "tok-123" not in repr(parse_sink_options({"token": "tok-123"}))


def test_every_option_is_documented():
    for spec in CONNECTION_OPTIONS + SINK_OPTIONS:
        assert spec.doc and spec.allowed.startswith("Expected"), spec.name


_NAMES = [s.name for s in CONNECTION_OPTIONS + SINK_OPTIONS if s.name not in ("credsFile", "nkeySeedFile", "tlsCaFile", "tlsCertFile", "tlsKeyFile")]


@given(st.sampled_from(_NAMES), st.text(max_size=40))
def test_any_value_parses_or_raises_option_error(name, value):
    try:
        parse_sink_options({name: value})
    except OptionError as exc:
        assert exc.option in _NAMES + ["stream", "stream.subjects", "password", "user", "deadLetterSubject"]


_SOURCE_NAMES = [s.name for s in SOURCE_OPTIONS if s.name not in ("stream", "bucket")]


@given(st.sampled_from(_SOURCE_NAMES), st.text(max_size=40), st.sampled_from([True, False, None]))
def test_any_source_value_parses_or_raises_option_error(name, value, streaming):
    try:
        parse_source_options({"stream": "S", name: value}, streaming=streaming)
    except OptionError as exc:
        assert exc.option in _SOURCE_NAMES + ["stream"]
        assert exc.option in str(exc)


_PASSWORD_CHARS = st.one_of(st.sampled_from(list("/@:%, é€")),
                            st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"))


@settings(max_examples=400, deadline=None)
@given(
    password=st.text(_PASSWORD_CHARS, min_size=6, max_size=20),
    user=st.text(st.characters(whitelist_categories=("Ll", "Lu")), min_size=1, max_size=8),
    scheme=st.sampled_from(["", "nats://", "tls://", "ws://", "NATS://"]),
    host=st.sampled_from(["h", "h2:4222", "10.0.0.1:4222", "[::1]:4222"]),
    position=st.sampled_from(["alone", "first", "last", "middle"]),
    option=st.sampled_from(["servers", "connectTimeout", "stream", "deadLetterSubject"]),
)
def test_no_url_password_ever_reaches_an_error(password, user, scheme, host, position, option):
    url = f"{scheme}{user}:{password}@{host}"
    value = {"alone": url, "first": f"{url},nats://10.0.0.2:4222", "last": f"nats://10.0.0.3:4222,{url}",
             "middle": f"nats://10.0.0.4:1,{url},nats://10.0.0.5:3"}[position]
    try:
        parse_sink_options({option: value})
    except OptionError as exc:
        # The value, as shown, is the only part of the error that comes from the input ...
        assert str(exc) == f"Invalid value for option '{exc.option}': {exc.value!r}. {exc.expected}"
        assert repr(exc) == f"OptionError({str(exc)!r})"
        # ... and it holds no piece of the user info.
        assert password not in repr(exc.value) and "***@" in repr(exc.value)
    else:
        # Some odd strings are valid stream names or subjects; then nothing is printed at all.
        assert option in ("stream", "deadLetterSubject")


@pytest.mark.parametrize("value, shown", [
    ("admin:s3cret@h:4222", "***@h:4222"),
    ("nats://admin:s3cr/et@h:4222", "nats://***@h:4222"),
    ("nats://h1:4222,admin:pw@h2:4222", "nats://***@h2:4222"),
    ("nats://a:p@ss@h", "nats://***@h"),
    ("tls://u:p w,x@h", "tls://***@h"),
])
def test_url_userinfo_is_masked_up_to_the_last_at(value, shown):
    with pytest.raises(OptionError) as info:
        parse_sink_options({"servers": value})
    assert info.value.value == shown and shown in str(info.value)


@pytest.mark.parametrize("raw, prefix", [
    ({}, "$JS.API"),
    ({"domain": "hub"}, "$JS.hub.API"),
    ({"apiPrefix": "JS.acct.API"}, "JS.acct.API"),
    ({"apiPrefix": "JS.acct.API."}, "JS.acct.API"),
])
def test_the_jetstream_api_prefix_for_reads_and_writes(raw, prefix):
    assert parse_sink_options(raw).api_prefix == prefix
    assert parse_source_options({"stream": "S", **raw}, streaming=False).api_prefix == prefix


@pytest.mark.parametrize("raw, option", [
    ({"domain": "hub", "apiPrefix": "JS.x.API"}, "apiPrefix"),
    ({"domain": "a.b"}, "domain"),
    ({"apiPrefix": "JS.*.API"}, "apiPrefix"),
])
def test_domain_and_api_prefix_are_checked_at_definition(raw, option):
    with pytest.raises(OptionError) as info:
        parse_source_options({"stream": "S", **raw}, streaming=True)
    assert info.value.option == option


@pytest.mark.parametrize("raw, streaming, option, needle", [
    ({"endingTimestamp": "2026-01-01T00:00:00Z"}, True, "endingTimestamp", "batch reads only"),
    ({"endingOffsets": "9", "endingTimestamp": "2026-01-01T00:00:00Z"}, False, "endingTimestamp", "not both"),
    ({"minMessagesPerTrigger": "10"}, False, "minMessagesPerTrigger", "streaming reads only"),
    ({"maxTriggerDelay": "1m"}, True, "maxTriggerDelay", "with 'minMessagesPerTrigger' only"),
    ({"minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"}, True, "minMessagesPerTrigger",
     "must not exceed 'maxMessagesPerTrigger' (5)"),
    ({"maxTriggerDelay": "0.5s", "minMessagesPerTrigger": "2"}, True, "maxTriggerDelay", "at least 1s"),
])
def test_trigger_and_ending_rules(raw, streaming, option, needle):
    with pytest.raises(OptionError, match=re.escape(needle)) as info:
        parse_source_options({"stream": "S", **raw}, streaming=streaming)
    assert info.value.option == option


def test_trigger_and_ending_options_parse():
    opts = parse_source_options({"stream": "S", "minMessagesPerTrigger": "10", "maxTriggerDelay": "30s"},
                                streaming=True)
    assert (opts.min_messages_per_trigger, opts.max_trigger_delay) == (10, 30.0)
    assert parse_source_options({"stream": "S"}, streaming=True).max_trigger_delay == 900.0  # Kafka's 15m
    batch = parse_source_options({"stream": "S", "endingTimestamp": "1700000000000"}, streaming=False)
    assert batch.ending_timestamp.isoformat() == "2023-11-14T22:13:20+00:00"


@pytest.mark.parametrize("option, hint", [
    ("subscribe", "for JetStream use 'stream'"),
    ("subscribePattern", "for JetStream use 'stream'"),
    ("kafka.bootstrap.servers", "for JetStream use 'servers'"),
    ("maxOffsetsPerTrigger", "for JetStream use 'maxMessagesPerTrigger'"),
    ("kafka.sasl.jaas.config", "for JetStream use the connection options"),
])
def test_kafka_options_get_the_jetstream_name(option, hint):
    with pytest.raises(OptionError, match="It is a Kafka option; " + hint):
        parse_source_options({"stream": "S", option: "x"}, streaming=None)


def test_definition_time_checks_leave_the_kind_of_read_open():
    # At load() Spark has not said whether the read streams: options of one kind only are accepted then.
    parse_source_options({"stream": "S", "maxMessagesPerTrigger": "5"}, streaming=None)
    parse_source_options({"stream": "S", "endingOffsets": "5"}, streaming=None)
    with pytest.raises(OptionError, match="Unknown option"):
        parse_source_options({"stream": "S", "maxMessagePerTrigger": "5"}, streaming=None)
