"""The ADR-37 consume state machine, event by event, without a server."""

import json

import pytest

from pyspark_jetstream.protocol.pull_engine import (
    BYTES_MODE_BATCH,
    ConsumeConfig,
    InvalidConsumeConfig,
    Outcome,
    PullEngine,
    PullRequest,
    classify_status,
)


def cfg(**kw):
    return ConsumeConfig.build(**kw)


# ------------------------------------------------------------------ configuration rules


def test_defaults_follow_adr37():
    c = cfg(max_messages=500)
    assert (c.max_messages, c.threshold_messages, c.expires, c.idle_heartbeat, c.bytes_mode) == (500, 250, 30.0, 15.0, False)
    assert cfg(max_messages=7).threshold_messages == 4  # 50%, rounded up
    assert cfg(expires=120).idle_heartbeat == 30.0  # half of expires, capped at 30s
    assert cfg(expires=1).idle_heartbeat == 0.5


def test_bytes_mode_uses_a_large_batch():
    c = cfg(max_bytes=1000)
    assert c.bytes_mode and c.max_messages == BYTES_MODE_BATCH and c.threshold_bytes == 500


@pytest.mark.parametrize(
    "kw, option, rule",
    [
        ({"max_messages": 10, "max_bytes": 10}, "consume.maxMessages", "exclusive"),
        ({"expires": 0.5}, "consume.expires", "at least 1s"),
        ({"expires": 30, "idle_heartbeat": 0.2}, "consume.idleHeartbeat", "between 500ms and 30s"),
        ({"expires": 2, "idle_heartbeat": 1.5}, "consume.idleHeartbeat", "at most half"),
        ({"max_messages": 0}, "consume.maxMessages", "at least 1"),
        ({"max_bytes": 0}, "consume.maxBytes", "at least 1"),
        ({"max_messages": 10, "threshold_messages": 11}, "consume.thresholdMessages", "between 0 and"),
        ({"max_bytes": 10, "threshold_bytes": 11}, "consume.thresholdBytes", "between 0 and"),
        ({"threshold_bytes": 5}, "consume.thresholdBytes", "needs consume.maxBytes"),
    ],
)
def test_configuration_rules(kw, option, rule):
    with pytest.raises(InvalidConsumeConfig, match=rule) as info:
        cfg(**kw)
    assert info.value.option == option  # the option the user must change, named by the rule itself


def test_pull_request_wire_format_uses_server_field_names():
    body = json.loads(PullRequest(10, 0, 30 * 10**9, 15 * 10**9).to_json())
    assert body == {"batch": 10, "expires": 30 * 10**9, "idle_heartbeat": 15 * 10**9}
    assert json.loads(PullRequest(5, 100, 1, 1).to_json())["max_bytes"] == 100


# ------------------------------------------------------------------ pending bookkeeping


def sent(engine):
    req = engine.next_pull()
    assert req is not None
    engine.on_pull_sent(req)
    return req


def test_first_pull_fills_the_buffer_and_threshold_triggers_refill():
    e = PullEngine(cfg(max_messages=10))
    assert sent(e).batch == 10 and e.pending_msgs == 10
    assert e.next_pull() is None
    for _ in range(5):
        e.on_message(50)
        assert e.next_pull() is None  # pending 9..5: not below 5
    e.on_message(50)  # pending 4 < threshold 5
    req = sent(e)
    assert req.batch == 6 and e.pending_msgs == 10


def test_max_messages_one_never_gets_stuck():
    e = PullEngine(cfg(max_messages=1))
    for _ in range(5):
        assert sent(e).batch == 1
        assert e.next_pull() is None
        e.on_message(10)


def test_threshold_zero_pulls_only_when_empty():
    e = PullEngine(cfg(max_messages=4, threshold_messages=0))
    sent(e)
    for _ in range(3):
        e.on_message(1)
        assert e.next_pull() is None
    e.on_message(1)
    assert sent(e).batch == 4


def test_bytes_mode_accounting_and_threshold():
    e = PullEngine(cfg(max_bytes=1000))
    req = sent(e)
    assert req.batch == BYTES_MODE_BATCH and req.max_bytes == 1000
    e.on_message(300)
    assert e.pending_bytes == 700 and e.next_pull() is None
    e.on_message(300)  # 400 < 500
    req = sent(e)
    assert req.max_bytes == 600 and e.pending_bytes == 1000


def test_range_cap_never_requests_more_than_the_range_holds():
    e = PullEngine(cfg(max_messages=100), range_left=7)
    assert sent(e).batch == 7
    e.on_message(1, stream_seq_advance=3)  # two sequences skipped (deleted): 4 left
    assert e.range_left == 4
    assert e.next_pull() is None  # 6 pending already cover the 4 left
    e.on_status(408, "Request Timeout", pending_msgs=6, pending_bytes=0)
    assert sent(e).batch == 4


def test_counters_never_go_negative():
    e = PullEngine(cfg(max_messages=2))
    e.on_message(5)
    e.on_status(408, "Request Timeout", pending_msgs=50, pending_bytes=50)
    assert e.pending_msgs == 0 and e.pending_bytes == 0


# ------------------------------------------------------------------ status table


@pytest.mark.parametrize(
    "code, description, outcome",
    [
        (100, "Idle Heartbeat", Outcome.HEARTBEAT),
        (404, "No Messages", Outcome.IGNORE),
        (408, "Request Timeout", Outcome.IGNORE),
        (409, "Message Size Exceeds MaxBytes", Outcome.IGNORE),
        (409, "Batch Completed", Outcome.IGNORE),
        (400, "Bad Request", Outcome.FAIL),
        (400, "Bad Request - heartbeat value too large", Outcome.FAIL),
        (409, "Consumer Deleted", Outcome.RECREATE),
        (409, "Consumer is push based", Outcome.FAIL),
        (409, "Exceeded MaxRequestBatch of 5", Outcome.WARN),
        (409, "Exceeded MaxRequestExpires of 1s", Outcome.WARN),
        (409, "Exceeded MaxRequestMaxBytes of 100", Outcome.WARN),
        (409, "Exceeded MaxWaiting", Outcome.WARN),
        (409, "Leadership Change", Outcome.REPULL),
        (409, "Server Shutdown", Outcome.WARN),
        (408, "Interest Expired", Outcome.WARN),
        (408, "Requests Pending", Outcome.WARN),
        (423, "Nats-Pin-Id mismatch", Outcome.REPULL),
        (423, "Nats-Wrong-Pin-Id", Outcome.REPULL),
        (412, "Required Api Level", Outcome.WARN),
        (503, "", Outcome.RECREATE),
        (503, "No Responders", Outcome.RECREATE),
        (409, "Something New", Outcome.WARN),
    ],
)
def test_status_table(code, description, outcome):
    assert classify_status(code, description) is outcome


@pytest.mark.parametrize(
    "code, description",
    [(408, "Request Timeout"), (409, "Message Size Exceeds MaxBytes"), (409, "Batch Completed"), (409, "Server Shutdown"),
     (408, "Interest Expired")],
)
def test_terminating_statuses_subtract_pending_headers(code, description):
    e = PullEngine(cfg(max_bytes=1000))
    sent(e)
    e.on_status(code, description, pending_msgs=BYTES_MODE_BATCH - 3, pending_bytes=400)
    assert e.pending_msgs == 3 and e.pending_bytes == 600


def test_batch_completed_with_minus_one_pending_is_harmless():
    e = PullEngine(cfg(max_messages=10))
    sent(e)
    e.on_status(409, "Batch Completed", pending_msgs=-1, pending_bytes=0)
    assert e.pending_msgs == 10


@pytest.mark.parametrize("code, description", [(409, "Leadership Change"), (423, "Nats-Wrong-Pin-Id")])
def test_reset_statuses_force_a_full_repull(code, description):
    e = PullEngine(cfg(max_messages=10))
    sent(e)
    verdict = e.on_status(code, description)
    assert verdict.outcome is Outcome.REPULL and e.pending_msgs == 0
    assert sent(e).batch == 10


def test_statuses_without_pending_headers_leave_counts():
    e = PullEngine(cfg(max_messages=10))
    sent(e)
    e.on_status(409, "Exceeded MaxWaiting")
    assert e.pending_msgs == 10


# ------------------------------------------------------------------ heartbeats and reconnects


def test_missed_heartbeats_after_two_intervals_reset_pending():
    e = PullEngine(cfg(max_messages=10, expires=10, idle_heartbeat=1), now=0.0)
    sent(e)
    assert not e.heartbeat_missed(1.9)
    e.on_status(100, "Idle Heartbeat", now=1.9)
    assert not e.heartbeat_missed(3.8)
    assert e.heartbeat_missed(3.9)
    assert e.heartbeats_missed == 1 and e.pending_msgs == 0
    assert not e.heartbeat_missed(4.0)  # the clock restarted
    e.on_message(1, now=4.5)
    assert e.heartbeats_missed == 0


def test_disconnect_pauses_pulls_and_the_heartbeat_timer():
    e = PullEngine(cfg(max_messages=10, expires=10, idle_heartbeat=1), now=0.0)
    sent(e)
    e.on_disconnect()
    assert not e.heartbeat_missed(100.0)
    e.on_message(1)
    assert e.next_pull() is None
    e.on_reconnect(now=100.0)
    assert sent(e).batch == 10  # a new pull request refills the whole buffer
    assert not e.heartbeat_missed(101.5)


def test_a_message_larger_than_the_whole_byte_budget_is_too_large():
    engine = PullEngine(ConsumeConfig.build(max_bytes=1000))
    engine.on_pull_sent(engine.next_pull())
    # A request with part of its budget used ends on a message that does not fit what is left: normal.
    assert engine.on_status(409, "Message Size Exceeds MaxBytes", 10, 400).outcome is Outcome.IGNORE
    # A request with its whole budget left ends at once: the message can never be fetched.
    assert engine.on_status(409, "Message Size Exceeds MaxBytes", 10, 1000).outcome is Outcome.TOO_LARGE
    # Not in messages mode (no byte budget), and not without the pending header.
    messages = PullEngine(ConsumeConfig.build(max_messages=10))
    assert messages.on_status(409, "Message Size Exceeds MaxBytes", 10, 1000).outcome is Outcome.IGNORE
    assert engine.on_status(409, "Message Size Exceeds MaxBytes", 10, None).outcome is Outcome.IGNORE


def _state(engine):
    return (engine.pending_msgs, engine.pending_bytes, engine.range_left, engine.delivered, engine.last_activity,
            engine.heartbeats_missed)


@pytest.mark.parametrize("kw", [dict(max_messages=50), dict(max_bytes=5000)])
def test_messages_told_at_once_leave_the_state_that_one_by_one_leaves(kw):
    import random

    rng = random.Random(7)
    for _ in range(300):
        one, many = (PullEngine(cfg(**kw), range_left=rng.choice([None, rng.randrange(0, 200)]), now=0.0)
                     for _ in range(2))
        many.range_left = one.range_left
        for engine in (one, many):
            engine.on_pull_sent(engine.next_pull())
            engine.heartbeats_missed = 1
        run = [(rng.randrange(0, 900), rng.randrange(1, 4)) for _ in range(rng.randrange(0, 80))]
        for size, advance in run:
            one.on_message(size, advance, now=5.0)
        many.on_messages(len(run), sum(s for s, _ in run), sum(a for _, a in run), now=5.0)
        if not run:  # nothing happened: not even activity
            assert many.heartbeats_missed == 1
            continue
        assert _state(many) == _state(one)
