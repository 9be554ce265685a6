"""Option 'publish.mode' and what keeps a write from fast-ingest batches (sink/plan/publish_mode.py),
without a server: the decision is a pure function of the server's version and the target's config."""

from types import SimpleNamespace

import pytest

from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.options import parse_sink_options
from pyspark_jetstream.sink.plan import publish_mode
from pyspark_jetstream.sink.plan.publish_mode import allow_batches, blocker, decide

NEW, OLD = (2, 15, 1), (2, 12, 4)
BATCHED = {"name": "S", "subjects": ["s.>"], "allow_batched": True}


def test_the_option_defaults_to_auto_and_takes_three_values():
    assert parse_sink_options({"stream": "S"}).publish_mode == "auto"
    for mode in ("auto", "batched", "acked"):
        assert parse_sink_options({"stream": "S", "publish.mode": mode}).publish_mode == mode
    with pytest.raises(OptionError, match="publish.mode"):
        parse_sink_options({"stream": "S", "publish.mode": "fast"})


@pytest.mark.parametrize("version, target, config, sequence_by, found", [
    (NEW, "S", BATCHED, None, None),
    (NEW, "S", {**BATCHED, "sources": [{"name": "O"}]}, None, None),  # a stream that sources others is fine
    (NEW, None, None, None, "no target stream is named"),
    ((2, 14, 2), "S", BATCHED, None, "nats-server 2.14.2 has no fast-ingest batches"),
    (OLD, "S", {"name": "S"}, None, "nats-server 2.12.4 has no fast-ingest batches"),
    (NEW, "S", {**BATCHED, "mirror": {"name": "O"}}, None, "is a mirror of 'O'"),
    (NEW, "S", {"name": "S", "subjects": ["s.>"]}, None, "does not allow fast-ingest batches"),
    (NEW, "S", BATCHED, "ts", "option 'sequenceBy'"),
])
def test_what_keeps_a_write_from_batches(version, target, config, sequence_by, found):
    reason = blocker(version, target, config, sequence_by)
    assert reason is None if found is None else found in reason, reason


def _nc(version):
    major, minor, patch = version
    return SimpleNamespace(connected_server_version=SimpleNamespace(major=major, minor=minor, patch=patch))


def test_auto_falls_back_and_says_why_once_batched_refuses_naming_option_stream_and_cause(monkeypatch):
    logged = []
    monkeypatch.setattr(publish_mode.log, "info", lambda *args: logged.append(args[0] % args[1:]))
    opts = parse_sink_options({"stream": "S"})
    assert decide(_nc(NEW), opts, BATCHED) == publish_mode.PublishMode(True, "S", ("s.>",))
    assert logged == []
    mode = decide(_nc(OLD), opts, BATCHED)
    assert not mode.batched and "2.12.4" in mode.reason
    assert len(logged) == 1 and "PubAck per row" in logged[0] and "2.12.4" in logged[0]
    with pytest.raises(OptionError) as info:
        decide(_nc(NEW), parse_sink_options({"stream": "S", "publish.mode": "batched"}), {"name": "S"})
    text = str(info.value)
    assert "'publish.mode'" in text and "stream 'S'" in text and "allow_batched is false" in text
    acked = decide(_nc(NEW), parse_sink_options({"stream": "S", "publish.mode": "acked"}), BATCHED)
    assert not acked.batched
    bucket = decide(_nc(NEW), parse_sink_options({"bucket": "B"}), {"name": "KV_B", "subjects": ["$KV.B.>"],
                                                                     "allow_batched": True})
    assert bucket.batched and bucket.target == "KV_B"


def test_a_created_stream_allows_batches_where_the_server_has_them():
    opts = parse_sink_options({"stream": "S"})
    config = {"name": "S"}
    assert allow_batches(_nc(NEW), opts, config) and config["allow_batched"] is True
    clustered = _nc(NEW)
    clustered._server_info = {"cluster": "c1"}
    for nc, options in ((_nc(OLD), {"stream": "S"}), (_nc(NEW), {"stream": "S", "publish.mode": "acked"}),
                        (clustered, {"stream": "S"})):  # a cluster: only when asked (issue #54)
        config = {"name": "S"}
        assert allow_batches(nc, parse_sink_options(options), config) is None and "allow_batched" not in config
    config = {"name": "S"}
    assert allow_batches(clustered, parse_sink_options({"stream": "S", "publish.mode": "batched"}), config)
    assert config["allow_batched"] is True
