"""Spark Connect: a client session over gRPC to a local Connect server (the connector installed on
the server side) runs a batch write, a batch read and a streaming round trip through
``format("jetstream")`` with no registration call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..helpers import run_script

JOB = Path(__file__).parent / "jobs" / "connect_job.py"


@pytest.mark.slow  # run by .ci/compat's ps43 cell; CI runs the Connect example (test_examples) instead
def test_batch_and_streaming_round_trips_through_a_spark_connect_session(nats_server, nats_client, stream_name):
    out = run_script(sys.executable, JOB, nats_server.url, stream_name, timeout=400)
    result = json.loads(out.strip().splitlines()[-1])
    prefix = stream_name.lower()
    expected = [[i + 1, f"{prefix}.{i % 2}", f"v{i}", "1h" if i == 0 else None] for i in range(5)]
    assert result["batch"] == expected
    # A micro-batch's partitions publish side by side: sequences 1..5, each message once.
    assert sorted(seq for seq, _, _ in result["streamed"]) == [1, 2, 3, 4, 5]
    assert sorted((s, d) for _, s, d in result["streamed"]) == [(f"out.{prefix}.{i % 2}", f"v{i}") for i in
                                                                 sorted(range(5), key=lambda i: (i % 2, i))]
    assert result["batches"] == 3  # maxMessagesPerTrigger=2 over 5 messages
    # What the Connect session wrote reads the same through nats-py's own JetStream API.
    stored = [nats_client.run(nats_client.js.get_msg(f"{stream_name}_OUT", seq)) for seq in range(1, 6)]
    assert [(m.subject, m.data.decode()) for m in stored] == [(s, d) for _, s, d in result["streamed"]]


ANSWERS_JOB = Path(__file__).parent / "jobs" / "connect_answers_job.py"


@pytest.mark.slow  # about 6 minutes: run by .ci/compat's ps43 cell
def test_every_pattern_answers_the_same_with_pushdown_on_and_off_through_spark_connect(tmp_path):
    """Issue #46's patterns and lookup forms from a Connect client: same answers, none refused."""
    from pyspark_jetstream.tools.server import EmbeddedNatsServer

    from ..helpers import SyncNats
    from .test_pushdown_answers import fill_answers

    with EmbeddedNatsServer() as server:  # its own: the patterns' stream takes subjects another test may use
        client = SyncNats(server.url)
        try:
            stream, bucket = fill_answers(client)
            out = run_script(sys.executable, ANSWERS_JOB, server.url, stream, bucket, str(tmp_path), timeout=1200)
        finally:
            client.close()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["errors"] == {} and result["differed"] == {}, result
    assert result["patterns"] == 20
    assert result["view"] == ["user42", "user43"] and result["table"] == ["user7"]
