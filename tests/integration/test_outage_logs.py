"""What the driver logs through a server outage (issue #56, point 3), against a real nats-server stopped for 10 s.

The streaming reader Spark calls on the driver (``JetStreamStreamReader``, made by the data source as Spark
makes it) plans micro-batches every 0.5 s while the server is stopped for 10 s and started again on the same
port and store: one WARNING when its planning requests start failing, naming the server and the time since
its last answer; one INFO when answers come back, with how long it took; nothing per retry; and the offsets
planned after the outage count the messages published after it. Run in the test's own process, so that its
log records are the driver's (Spark's driver-side Python runs in a process of its own otherwise).
"""

from __future__ import annotations

import logging
import threading
import time

from pyspark_jetstream import JetStreamDataSource
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats


def test_a_server_stopped_for_10s_is_one_warning_and_one_info_on_the_driver(caplog):
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("OUT", ["out.>"], storage="file")  # it outlives the restart
        for i in range(5):
            client.publish_raw("out.a", None, f"m{i}".encode())
        source = JetStreamDataSource({"servers": server.url, "stream": "OUT", "startingOffsets": "earliest",
                                      "consume.maxWait": "60s"})
        reader = source.streamReader(schema=None)  # Spark gives the DDL parsed; None: every column
        start = reader.initialOffset()
        first = reader.latestOffset(start, None)["seq"]
        planned: list[dict] = []
        with caplog.at_level(logging.DEBUG, logger="pyspark_jetstream"):
            down: list[float] = []  # when the server was down, and when it was up again

            def stop_for_10s() -> None:
                server.stop()
                down.append(time.monotonic())
                time.sleep(10)
                server.start()
                down.append(time.monotonic())

            outage = threading.Thread(target=stop_for_10s)
            started = time.monotonic()
            outage.start()  # planning goes on meanwhile, as Spark's triggers do
            while outage.is_alive() or len(planned) < 3:
                planned.append(reader.latestOffset(start, None))
                time.sleep(0.5)
            outage.join()
            took = time.monotonic() - started
            for i in range(5, 8):
                client.publish_raw("out.a", None, f"m{i}".encode())  # the judge's connection is back too
            after = reader.latestOffset(start, None)
        client.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.INFO and r.name.startswith("pyspark_jetstream.source")]
    warnings = [m for level, m in said if level == "WARNING"]
    infos = [m for level, m in said if level == "INFO" and "answers again" in m]
    assert len(warnings) == 1 and len(infos) == 1, said
    assert server.url in warnings[0] and "did not answer" in warnings[0] and "after its last answer" in warnings[0]
    waited = float(infos[0].rsplit("after ", 1)[1].rstrip("s").split("s")[0])
    # Counted from the first request the outage left unanswered, asked within a planning interval (0.5 s, 2 s
    # of slack for a busy machine) of the stop: not from a late failure (0.3 s said once) or the answer.
    assert down[1] - down[0] - 2.0 <= waited <= took + 1.0, (infos[0], down, took)
    assert [p["seq"] for p in planned] == [first] * len(planned) and after["seq"] == first + 3  # nothing lost
