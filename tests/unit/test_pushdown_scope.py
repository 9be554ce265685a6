"""Which SQL execution a pushed read belongs to (source/plan/pushdown_scope.py) and the note that tells two
scans of one relation in one query (source/plan/pushdown_registry.py): pure rules, no Spark."""

from __future__ import annotations

import tempfile
import uuid

from pyspark_jetstream.source.plan import pushdown_registry
from pyspark_jetstream.source.plan.pushdown_scope import narrowed_applies, start_ms


def _uuid7(ms: int) -> str:
    value = (ms << 80) | (0x7 << 76) | (0x2 << 62) | 0x123456789
    return str(uuid.UUID(int=value))


def test_the_start_of_an_execution_is_read_from_its_uuid7_query_id():
    assert start_ms(_uuid7(1_795_826_047_046)) == 1_795_826_047_046
    assert start_ms("01a21f92-d846-7950-84bc-dfc55b09b64a") == 0x01A21F92D846  # seen on PySpark 4.3.0
    assert start_ms(str(uuid.uuid4())) is None  # another kind of id says nothing of time
    assert start_ms(None) is None and start_ms("") is None and start_ms("not-a-uuid") is None


def test_only_an_execution_started_by_the_planning_reads_the_narrowed_plan():
    planned = 1_000_000
    assert narrowed_applies(planned, planned) is True
    assert narrowed_applies(planned, planned - 5_000) is True  # the execution that planned it
    assert narrowed_applies(planned, planned + 1) is False  # any later query, or the same plan run again
    assert narrowed_applies(planned, None) is False  # unknown: the whole read


def test_two_pushdowns_of_one_relation_close_together_are_seen(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.mkdtemp())
    token, other = uuid.uuid4().hex, uuid.uuid4().hex
    assert pushdown_registry.another_scan_close_by(token, now=1000.0) is False
    assert pushdown_registry.another_scan_close_by(other, now=1000.5) is False  # another relation
    assert pushdown_registry.another_scan_close_by(token, now=1001.0) is True
    assert pushdown_registry.another_scan_close_by(token, now=1001.0 + pushdown_registry.WINDOW_S + 1) is False
    assert pushdown_registry.another_scan_close_by(None) is True  # no token: assume the worst


def test_two_readers_of_one_partition_in_one_execution_are_seen(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.mkdtemp())
    plan, query = uuid.uuid4().hex, str(uuid.uuid4())
    assert pushdown_registry.claim_partition(plan, query, 0, "3:0") is True
    assert pushdown_registry.claim_partition(plan, query, 0, "3:0") is True  # a retried or speculative task
    assert pushdown_registry.claim_partition(plan, query, 1, "3:1") is True
    assert pushdown_registry.claim_partition(plan, query, 0, "3:2") is False  # a union's second child
    assert pushdown_registry.claim_partition(plan, query, 1, "5:1") is False  # a scan in another stage
    assert pushdown_registry.claim_partition(plan, str(uuid.uuid4()), 0, "9:0") is True  # another execution
