"""The driver's planning requests through an outage (source/plan/stream_facts.ask_server, issue #56): one
WARNING when the server stops answering, naming it; one INFO when it answers again, with how long it took;
nothing per retry."""

from __future__ import annotations

import logging

from pyspark_jetstream.errors import JetStreamApiError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.plan import stream_facts


def test_an_outage_is_one_warning_and_one_info(caplog, monkeypatch):
    opts = parse_source_options({"stream": "S", "servers": "nats://10.1.2.3:4222", "consume.maxWait": "60s"},
                                streaming=True)
    monkeypatch.setattr(stream_facts.time, "sleep", lambda seconds: None)  # the back-off, not what is tested
    answers = iter([{"ok": 1}] + [JetStreamApiError("STREAM.INFO.S", 408, 0, "no reply within 10s")] * 6
                   + [{"ok": 2}, {"ok": 3}])

    async def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with caplog.at_level(logging.DEBUG, logger="pyspark_jetstream"):
        assert stream_facts.ask_server(opts, call, "Stream info of 'S'") == {"ok": 1}
        assert stream_facts.ask_server(opts, call, "Stream info of 'S'") == {"ok": 2}
        assert stream_facts.ask_server(opts, call, "Stream info of 'S'") == {"ok": 3}
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 2, said
    (warning_level, warning), (info_level, info) = said
    assert warning_level == "WARNING" and "nats://10.1.2.3:4222 did not answer" in warning
    assert "no reply within 10s" in warning and "after its last answer" in warning and "60s" in warning
    assert info_level == "INFO" and info.startswith("JetStream source: nats://10.1.2.3:4222 answers again, after")


def test_a_request_answered_only_after_a_long_wait_is_one_warning_and_one_info(caplog, monkeypatch):
    """A request sent during a short outage is answered after the reconnect and fails nothing (the issue's
    10 s outage: one request waited 6.5 s); the wait past PATIENCE is said, and the answer."""
    import asyncio

    opts = parse_source_options({"stream": "S", "servers": "nats://10.1.2.4:4222", "consume.maxWait": "60s"},
                                streaming=True)
    monkeypatch.setattr(stream_facts, "PATIENCE", 0.05)
    delays = iter([0.0, 0.3, 0.0])

    async def call():
        await asyncio.sleep(next(delays))
        return "answer"

    with caplog.at_level(logging.DEBUG, logger="pyspark_jetstream"):
        for _ in range(3):
            assert stream_facts.ask_server(opts, call, "Stream info of 'S'") == "answer"
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert "nats://10.1.2.4:4222 did not answer" in said[0][1] and "no answer within 0.05s" in said[0][1]
    waited = float(said[1][1].rsplit("after ", 1)[1].rstrip("s"))
    assert 0.25 <= waited < 5, said[1][1]
