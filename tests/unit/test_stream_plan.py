"""ensureStream decisions and ADR-43 stream restrictions, without a server (plain requests, no options)."""

import pytest

from pyspark_jetstream.options import parse_sink_options
from pyspark_jetstream.protocol.stream_rules import (
    StreamRequest,
    StreamRuleError,
    StreamSettings,
    check_ttl_transition,
    new_stream_config,
    plan_stream,
)
from pyspark_jetstream.protocol.subjects import subject_matches

S = 1_000_000_000


def req(mode="validate", subject=None, **settings):
    return StreamRequest("S", subject, mode, StreamSettings(**settings))


def current(**config):
    return {"name": "S", "subjects": ["s.>"], "allow_msg_ttl": False, **config}


@pytest.mark.parametrize(
    "pattern, subject, match",
    [("s.>", "s.a", True), ("s.>", "s", False), ("s.*", "s.a", True), ("s.*", "s.a.b", False),
     ("s.*.c", "s.b.c", True), ("a", "a", True), ("a", "b", False), (">", "x.y", True)],
)
def test_subject_matching(pattern, subject, match):
    assert subject_matches(pattern, subject) is match


def test_validate_missing_stream_fails_with_fix():
    with pytest.raises(StreamRuleError, match="does not exist.*ensureStream"):
        plan_stream(None, req(), needs_ttl=True)


def test_validate_needs_allow_msg_ttl_only_when_rows_can_carry_ttl():
    assert plan_stream(current(), req(), needs_ttl=False).action == "none"
    with pytest.raises(StreamRuleError, match="AllowMsgTTL.*ensureStream='update'"):
        plan_stream(current(), req(), needs_ttl=True)
    assert plan_stream(current(allow_msg_ttl=True), req(), needs_ttl=True).action == "none"


def test_create_builds_adr43_config():
    plan = plan_stream(None, req("create", subjects=("s.>",), subject_delete_marker_ttl=5.0, max_age=3600.0,
                                max_msgs_per_subject=1, storage="memory"), True)
    assert plan.action == "create"
    c = plan.config
    assert c["allow_msg_ttl"] is True and c["subject_delete_marker_ttl"] == 5 * S
    assert c["allow_rollup_hdrs"] is True and c["deny_purge"] is False
    assert c["max_age"] == 3600 * S and c["max_msgs_per_subject"] == 1 and c["storage"] == "memory"


def test_create_defaults_subjects_to_subject_option():
    c = new_stream_config(req("create", subject="s.x"))
    assert c["subjects"] == ["s.x"]


def test_create_validates_existing_stream():
    with pytest.raises(StreamRuleError, match="AllowMsgTTL"):
        plan_stream(current(), req("create", subjects=("s.>",)), True)


def test_update_enables_ttl_and_sets_markers_with_companions():
    plan = plan_stream(current(allow_rollup_hdrs=False), req("update", subject_delete_marker_ttl=2.0), True)
    assert plan.action == "update"
    assert plan.config["allow_msg_ttl"] is True
    assert plan.config["subject_delete_marker_ttl"] == 2 * S
    assert plan.config["allow_rollup_hdrs"] is True and plan.config["deny_purge"] is False
    assert len(plan.changes) == 2


def test_validate_refuses_a_different_marker_ttl():
    with pytest.raises(StreamRuleError, match="SubjectDeleteMarkerTTL"):
        plan_stream(current(allow_msg_ttl=True), req(subject_delete_marker_ttl=2.0), True)


def test_mirror_is_refused():
    with pytest.raises(StreamRuleError, match="mirror"):
        plan_stream(current(mirror={"name": "ORIGIN"}), req("update"), True)


def test_counter_stream_cannot_take_ttls():
    with pytest.raises(StreamRuleError, match="counter"):
        plan_stream(current(allow_msg_counter=True), req(), True)


def test_subject_option_must_be_captured():
    with pytest.raises(StreamRuleError, match="does not capture subject 'x.y'"):
        plan_stream(current(allow_msg_ttl=True), req(subject="x.y"), True)


@pytest.mark.parametrize(
    "cur, desired, match",
    [
        ({"allow_msg_ttl": True}, {"allow_msg_ttl": False}, "cannot be disabled"),
        ({}, {"allow_msg_ttl": True, "subject_delete_marker_ttl": S // 2, "allow_rollup_hdrs": True}, "at least 1s"),
        ({}, {"allow_msg_ttl": True, "subject_delete_marker_ttl": S, "allow_rollup_hdrs": True, "mirror": {"name": "O"}}, "mirror"),
        ({}, {"allow_msg_ttl": True, "subject_delete_marker_ttl": S, "allow_rollup_hdrs": False}, "AllowRollup"),
        ({}, {"allow_msg_ttl": True, "subject_delete_marker_ttl": S, "allow_rollup_hdrs": True, "deny_purge": True}, "DenyPurge"),
    ],
)
def test_adr43_restrictions(cur, desired, match):
    with pytest.raises(StreamRuleError, match=match):
        check_ttl_transition(cur, {"name": "S", **desired})


def test_update_cannot_add_markers_to_a_deny_purge_stream():
    with pytest.raises(StreamRuleError, match="DenyPurge=true.*Recreate"):
        plan_stream(current(deny_purge=True), req("update", subject_delete_marker_ttl=2.0), True)


def test_the_sink_options_ask_for_what_they_say():
    """The sink's ``stream.*`` options become the request the rules read (options -> protocol, never back)."""
    opts = parse_sink_options({"stream": "S", "subject": "s.x", "ensureStream": "create", "stream.subjects": "s.>",
                               "stream.subjectDeleteMarkerTtl": "5s", "stream.maxAge": "1h",
                               "stream.maxMsgsPerSubject": "1", "stream.storage": "memory"})
    assert opts.stream_request == req("create", subject="s.x", subjects=("s.>",), subject_delete_marker_ttl=5.0,
                                      max_age=3600.0, max_msgs_per_subject=1, storage="memory")
