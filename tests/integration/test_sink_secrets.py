"""Secrets stay out of explain() output, progress and error messages."""

from __future__ import annotations

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, jetstream_writer, wait_until

PASSWORD = "pw-Zq8!s3cr3t-do-not-print"
TOKEN = "tok-Xy7-s3cr3t-token"


@pytest.fixture(scope="module")
def auth_server():
    config = f'authorization {{ users = [ {{ user: "alice", password: "{PASSWORD}" }} ] }}'
    with EmbeddedNatsServer(config=config) as server:
        yield server


@pytest.fixture(scope="module")
def auth_client(auth_server):
    client = SyncNats(auth_server.url, user="alice", password=PASSWORD)
    yield client
    client.close()


def test_wrong_password_fails_at_start_without_echoing_it(spark, auth_server):
    df = spark.createDataFrame([("a",)], "data string")
    wrong = PASSWORD + "-wrong"
    with pytest.raises(Exception) as info:
        jetstream_writer(df, auth_server.url, user="alice", password=wrong, subject="s.x").save()
    text = str(info.value)
    assert "refused the credentials" in text and "user/password" in text
    assert wrong not in text and PASSWORD not in text


def test_token_never_appears_in_errors(spark, auth_server):
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception) as info:
        jetstream_writer(df, auth_server.url, token=TOKEN, subject="s.x").save()
    # The server takes user/password only: the token is refused, and the error says so without it.
    text = str(info.value)
    assert "NatsConnectError" in text and "using token: the server refused the credentials" in text
    assert TOKEN not in text


def test_password_absent_from_explain_progress_and_row_errors(spark, auth_server, auth_client, stream_name, tmp_path, capsys):
    auth_client.add_stream(stream_name, [f"{stream_name}.>"])
    df = (
        spark.readStream.format("rate").option("rowsPerSecond", 50).load()
        .selectExpr("cast(value as string) as data")
    )
    query = (
        df.writeStream.format("jetstream")
        .option("servers", auth_server.url).option("user", "alice").option("password", PASSWORD)
        .option("stream", stream_name).option("subject", f"{stream_name}.x")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        # The rate source's first micro-batch can be empty: wait until rows were really published.
        wait_until(lambda: auth_client.stream_state(stream_name)["messages"] > 0, timeout=60)
        query.processAllAvailable()
        capsys.readouterr()
        query.explain(extended=True)
        plan = capsys.readouterr().out
        progress = str(query.lastProgress) + str(query.status) + str(query.recentProgress)
    finally:
        query.stop()
    assert "jetstream" in plan.lower() or "PythonDataSource" in plan or "MicroBatchWrite" in plan
    assert PASSWORD not in plan and PASSWORD not in progress
    assert auth_client.stream_state(stream_name)["messages"] > 0

    # A failing row's error names the row, not the credentials.
    bad = spark.createDataFrame([(f"{stream_name}.*", "x")], "subject string, data string")
    with pytest.raises(Exception) as info:
        jetstream_writer(bad, auth_server.url, user="alice", password=PASSWORD, stream=stream_name).save()
    assert "not a valid publish subject" in str(info.value) and PASSWORD not in str(info.value)
