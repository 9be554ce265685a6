"""A row the server drops because the stream's ingest queue is full (429, err_code 10167) is back-pressure,
not a bad row: the task fails saying so and what to change, and the row is never a dead letter.

nats-server drops a publish when the stream's ingest queue holds ``max_buffered_msgs`` (10,000 by default
on 2.11, where several tasks' windows of ``maxPendingAcks`` can exceed it; 100,000 on 2.12+). A server of
its own here, the queue set to 1, makes every write of 20,000 rows meet it. The write tasks run in-process
(``write_partition``, what each Spark task runs), a PubAck per row and in fast-ingest batches.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from pyspark_jetstream.errors import StreamBusyError
from pyspark_jetstream.sink.plan.sink_plan import plan_sink
from pyspark_jetstream.sink.task.write import write_partition
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from .. import helpers

ROWS = 20_000


@pytest.fixture(scope="module")
def busy_server():
    with EmbeddedNatsServer(config="jetstream { max_buffered_msgs: 1 }") as server:
        yield server


@pytest.mark.parametrize("mode", ["acked", "batched"])
def test_rows_the_server_drops_for_a_full_queue_fail_the_task_and_are_no_dead_letters(busy_server, stream_name, mode):
    client = helpers.SyncNats(busy_server.url)
    try:
        client.add_stream(stream_name, [f"{stream_name}.>"], allow_batched=mode == "batched" or None)
        client.add_stream(stream_name + "DLQ", [f"{stream_name}dlq"])
        options = {"servers": busy_server.url, "stream": stream_name, "subject": f"{stream_name}.x",
                   "deadLetterSubject": f"{stream_name}dlq", "publish.mode": mode, "maxPendingAcks": "4096"}
        plan = plan_sink(options, StructType([StructField("data", StringType())]), overwrite=False, streaming=False)
        batch = pa.RecordBatch.from_pydict({"data": [str(i) for i in range(ROWS)]})
        with pytest.raises(StreamBusyError) as info:
            write_partition(plan, [batch])
        text = str(info.value)
        assert "ingest queue was full" in text and "err_code 10167" in text and "'maxPendingAcks'" in text, text
        assert f"to subject '{stream_name}.x'" in text, text
        assert client.stored_count(stream_name + "DLQ") == 0
    finally:
        client.close()
