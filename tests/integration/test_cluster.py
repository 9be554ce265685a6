"""Clustered JetStream: R3 streams through a leader step-down and the loss of a node.

One streaming query reads an R3 stream and writes every message to a second R3
stream. While a partition is held mid-read (and its earlier rows are being
published), the test steps both stream leaders down; later it SIGKILLs the node
that leads the target stream and starts it again on the same store. The output
must hold every source sequence exactly once, and the query must go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import nats
import nats.errors
import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.source.plan.offsets import split_range
from pyspark_jetstream.source.read.partition import read_partition

from ..helpers import SyncNats, fill_stream, gate_at_sequence, wait_until


def _leader(client: SyncNats, stream: str) -> str:
    return client.api(f"STREAM.INFO.{stream}")["cluster"]["leader"]


def _step_down(client: SyncNats, stream: str) -> str:
    before = _leader(client, stream)
    reply = client.api(f"STREAM.LEADER.STEPDOWN.{stream}")
    assert reply.get("success"), reply
    return wait_until(lambda: (lambda now: now if now and now != before else None)(_leader_if_any(client, stream)),
                      timeout=30, what=f"a new leader of {stream}")


def _leader_if_any(client: SyncNats, stream: str) -> str | None:
    """The stream's leader, or None while the election leaves its info unanswered (a request timeout)."""
    try:
        return client.api(f"STREAM.INFO.{stream}").get("cluster", {}).get("leader")
    except nats.errors.TimeoutError:
        return None


def test_r3_pipeline_survives_step_down_and_node_loss(spark, nats_cluster, tmp_path):
    count = 12_000
    client = SyncNats(nats_cluster.url)
    try:
        client.add_stream("CSRC", ["csrc.>"], storage="file", num_replicas=3)
        client.add_stream("CDST", ["cdst.>"], storage="file", num_replicas=3, allow_msg_ttl=True)
        asyncio.run(fill_stream(nats_cluster.url, "csrc.x", count))

        first_gate = (str(tmp_path / "reached-1"), str(tmp_path / "release-1"))
        second_gate = (str(tmp_path / "reached-2"), str(tmp_path / "release-2"))
        gate_one = gate_at_sequence(2_500, *first_gate)
        gate_two = gate_at_sequence(6_500, *second_gate)

        source = (spark.readStream.format("jetstream").option("servers", nats_cluster.url).option("stream", "CSRC")
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "1600")
                  .option("numPartitions", "2").option("batchSize", "500").option("consume.maxMessages", "1000")
                  .option("consume.expires", "5s").load())
        schema = source.schema
        query = (source.mapInArrow(gate_one, schema).mapInArrow(gate_two, schema)
                 .select(F.concat(F.lit("cdst."), F.col("seq") % 4).alias("subject"),
                         F.col("seq").cast("string").alias("data"), F.lit("1h").alias("ttl"))
                 .writeStream.format("jetstream").option("servers", nats_cluster.url).option("stream", "CDST")
                 .option("order", "none")  # exactly-once of positional ids through faults, straight from the read
                 .option("checkpointLocation", str(tmp_path / "chk")).option("ackTimeout", "30s")
                 .trigger(processingTime="200 milliseconds").start())
        try:
            wait_until(lambda: os.path.exists(first_gate[0]), timeout=180, what="the query reached sequence 2500")
            _step_down(client, "CSRC")
            _step_down(client, "CDST")
            open(first_gate[1], "w").close()

            wait_until(lambda: os.path.exists(second_gate[0]), timeout=180, what="the query reached sequence 6500")
            victim = nats_cluster.node_named(_leader(client, "CDST"))
            victim.stop(kill=True)
            open(second_gate[1], "w").close()
            wait_until(lambda: client.stored_count("CDST") >= 9_600 or query.exception(),
                       timeout=240, what="the query went on without the killed node")
            assert query.exception() is None, query.exception()
            victim.start()
            nats_cluster.wait_for_jetstream()
            wait_until(lambda: client.stored_count("CDST") >= count or query.exception(),
                       timeout=240, what="every message copied")
            assert query.exception() is None, query.exception()
            assert query.isActive
        finally:
            query.stop()

        stored = client.messages("CDST")
        seqs = sorted(int(m.data) for m in stored)
        assert seqs == list(range(1, count + 1)), "every source sequence exactly once"
        assert len({m.headers["Nats-Msg-Id"][0] for m in stored}) == count
        # The restarted node caught up: all three replicas are current again.
        wait_until(lambda: all(r.get("current") for r in client.api("STREAM.INFO.CDST")["cluster"].get("replicas", []))
                   and len(client.api("STREAM.INFO.CDST")["cluster"].get("replicas", [])) == 2,
                   timeout=60, what="the restarted replica caught up")
    finally:
        for stream in ("CSRC", "CDST"):
            client.api(f"STREAM.DELETE.{stream}")
        client.close()


def _meta_leader_answers(client: SyncNats) -> bool:
    """Whether the JetStream meta leader answers (it alone answers STREAM.NAMES, and every consumer
    create goes through it)."""
    try:
        msg = client.run(client.nc.request("$JS.API.STREAM.NAMES", b"", timeout=3))
    except Exception:
        return False
    return "error" not in json.loads(msg.data)


def _stop_a_follower(cluster, leader_client: SyncNats, stream: str):
    """SIGSTOP a follower of ``stream`` that does not lead the JetStream meta group (then no consumer
    could be created at all); returns it and the URLs of the two other nodes."""
    for replica in leader_client.api(f"STREAM.INFO.{stream}")["cluster"]["replicas"]:
        follower = cluster.node_named(replica["name"])
        others = ",".join(node.url for node in cluster.nodes if node is not follower)
        probe = SyncNats(others)
        os.kill(follower.pid, signal.SIGSTOP)
        answered = _meta_leader_answers(probe)
        probe.close()
        if answered:
            return follower, others
        os.kill(follower.pid, signal.SIGCONT)
    raise AssertionError("no follower of the stream could be stopped with the meta group still answering")


def resume_once_placed(client: SyncNats, stream: str, follower, consumers: int) -> None:
    """Resume the stopped ``follower`` once ``consumers`` consumers of ``stream`` are placed, or after 6 s.

    A create placed on the stopped follower is unanswered until it resumes; a reader gives up on it after
    10 s and asks again, placed anew, so waiting longer loses the placement the test is after (a busy CI
    machine waited 90 s here, and no read met the follower in six rounds)."""

    def placed() -> bool:
        try:
            return len(client.api(f"CONSUMER.NAMES.{stream}", timeout=1).get("consumers") or []) >= consumers
        except nats.errors.TimeoutError:  # a busy cluster with a node stopped may not answer at once
            return False

    try:
        wait_until(placed, timeout=6, what="every consumer placed")
    except AssertionError:  # a busy machine: the follower resumes with some creates still on their way
        print("not every consumer placed within 6 s: the follower resumes before")
    os.kill(follower.pid, signal.SIGCONT)


def _read_six_partitions_resuming(client: SyncNats, servers: str, stream: str, follower) -> list[int]:
    """Read 1..31000 in six partitions at once; resume ``follower`` once every consumer is assigned."""
    opts = parse_source_options({"servers": servers, "stream": stream, "batchSize": "1000",
                                 "consume.maxMessages": "500"}, streaming=False)

    def read(first: int, last: int) -> list[int]:
        return [s for batch in read_partition(opts, stream, first, last) for s in batch.column("seq").to_pylist()]

    with ThreadPoolExecutor(6) as pool:
        reads = [pool.submit(read, r.first, r.last) for r in split_range(0, 31_000, 6)]
        resume_once_placed(client, stream, follower, 6)
        return [s for r in reads for s in r.result(timeout=300)]


def test_a_partition_on_a_lagging_replica_does_not_end_early(nats_cluster, caplog):
    """A one-replica partition consumer may be placed on any active peer of an R3 stream
    (nats-server shuffles them). A follower stopped while 30,000 messages are published, and
    resumed while the partitions create their consumers, answers for a consumer placed on it
    from a store that is still catching up: ``num_pending`` 0 (observed) for a range the leader
    holds. Such a partition must not end there.

    Six partitions are read at once by the connector's partition reader in this process (Spark's
    two task slots would make the placement rarer); placement is random, so the round is repeated,
    on a new stream, until a partition met the lagging replica (each round: 1 - (2/3)^6 = 91%).
    Every round must read every sequence exactly once.
    """
    caplog.set_level(logging.INFO, logger="pyspark_jetstream")
    leader_client = SyncNats(nats_cluster.url)
    met = 0
    for attempt in range(6):
        stream = f"LAG{attempt}"
        leader_client.add_stream(stream, [f"lag{attempt}.>"], storage="file", num_replicas=3)
        try:
            asyncio.run(fill_stream(nats_cluster.url, f"lag{attempt}.x", 1000))
            follower, others = _stop_a_follower(nats_cluster, leader_client, stream)
            client = SyncNats(others)  # never connected to the node that is stopped
            try:
                asyncio.run(fill_stream(others, f"lag{attempt}.x", 30_000))
                seqs = _read_six_partitions_resuming(client, others, stream, follower)
            finally:
                os.kill(follower.pid, signal.SIGCONT)
            assert sorted(seqs) == list(range(1, 31_001)), f"round {attempt}: every sequence exactly once"
            met = len([r for r in caplog.records if "waiting for the replica to catch up" in r.getMessage()
                       and f"stream {stream}:" in r.getMessage()])
            client.close()
        finally:
            leader_client.api(f"STREAM.DELETE.{stream}")
        if met:
            break
    leader_client.close()
    print(f"a partition met a lagging replica in round {attempt} ({met} time(s))")
    assert met, "no partition's consumer was placed on the lagging follower in six rounds"


@pytest.mark.parametrize("window_ns", [
    # The short window is the stricter case (a resend past it is stored again unless found first); the
    # default one runs under -m slow (CI's 25 minutes).
    pytest.param(120 * 10**9, marks=pytest.mark.slow, id="2-minute-window"),
    pytest.param(10**8, id="100-ms-window"),
])
def test_each_subjects_order_holds_through_leader_step_downs_at_full_rate(nats_cluster, window_ns):
    """Issue #33, item 3: a write task publishes 150,000 rows over 4 subjects to an R3 stream, thousands in
    flight, while the stream's leader steps down again and again. Frames the old leader dropped (or answered
    503) used to be sent again after later frames of their subject were stored (1,339 and 3,057 rows out of
    order in two probes of 200,000). The publisher stops at the first sign, moves the rows stored ahead of
    an unanswered one back into order, and every subject ends in the task's order, each row once.
    With a duplicate window shorter than the recovery (100 ms), a frame stored whose PubAck was lost with
    the leader would be stored again by its resend: the publisher finds it in the stream first (the
    chaos soak's cluster phase at full rate stored 418 rows twice that way)."""
    import threading

    import pyarrow as pa
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.write import write_partition

    rows, subjects, stream = 150_000, 4, "ORDERED"
    client = SyncNats(nats_cluster.url)
    try:
        client.api(f"STREAM.DELETE.{stream}")
        client.add_stream(stream, [f"{stream}.>"], storage="file", num_replicas=3, duplicate_window=window_ns)
        schema = StructType([StructField("subject", StringType()), StructField("data", BinaryType()),
                             StructField("stream", StringType()), StructField("seq", LongType())])
        plan = plan_sink({"servers": nats_cluster.url, "stream": stream, "sinkState": "none"}, schema,
                         overwrite=False, streaming=False)

        def batches():
            for start in range(0, rows, 10_000):
                ids = range(start, min(rows, start + 10_000))
                yield pa.RecordBatch.from_pydict({"subject": [f"{stream}.s{i % subjects}" for i in ids],
                                                  "data": [str(i).encode() for i in ids],
                                                  "stream": ["SRC"] * len(ids), "seq": [i + 1 for i in ids]})

        stop, downs = threading.Event(), []

        def step_downs():  # one each time the stream holds another 25,000 messages: always mid-write
            marks = list(range(15_000, rows, 25_000))
            while marks and not stop.wait(0.02):
                try:
                    if client.stored_count(stream) >= marks[0]:
                        marks.pop(0)
                        downs.append(_step_down(client, stream))
                except Exception as exc:  # a request lost mid-election: the next mark goes
                    downs.append(repr(exc))

        thread = threading.Thread(target=step_downs, daemon=True)
        thread.start()
        try:
            message = write_partition(plan, batches())
        finally:
            stop.set()
            thread.join(60)
        assert any(d.startswith("jetstream-cluster") for d in downs), downs  # the leader did change mid-write
        by_subject: dict[str, list[int]] = {}
        for subject, data in client.subjects_and_data(stream):
            by_subject.setdefault(subject, []).append(int(data))
        for subject, values in by_subject.items():
            assert values == sorted(values), f"{subject}: {sum(b < a for a, b in zip(values, values[1:], strict=False))} out of order"
        assert sorted(v for vs in by_subject.values() for v in vs) == list(range(rows))  # each once
        assert message.published + message.duplicates >= rows
    finally:
        client.api(f"STREAM.DELETE.{stream}")
        client.close()


@contextlib.contextmanager
def _stream_of_five_ids(nats_cluster, stream: str):
    """An R3 stream ``stream`` holding five messages with ids ``id0`` .. ``id4`` (sequences 1 to 5): a client
    and the node leading it; the stream deleted after."""
    client = SyncNats(nats_cluster.url)
    try:
        with contextlib.suppress(Exception):
            client.api(f"STREAM.DELETE.{stream}")
        client.add_stream(stream, [f"{stream}.>"], storage="file", num_replicas=3)
        for i in range(5):
            client.publish_raw(f"{stream}.a", f"NATS/1.0\r\nNats-Msg-Id: id{i}\r\n\r\n".encode(), b"x")
        yield client, nats_cluster.node_named(_leader(client, stream))
    finally:
        with contextlib.suppress(Exception):
            client.api(f"STREAM.DELETE.{stream}")
        client.close()


async def _looked_up(url: str, stream: str) -> dict[str, int]:
    """Where ``id1`` and ``id3`` are stored, as the ordered publisher's lookup finds them through ``url``."""
    from pyspark_jetstream.sink.records.replay_guard import stored_sequences

    nc = await nats.connect(url)
    try:
        return await stored_sequences(nc, stream, "$JS.API", 1, {"id1", "id3"}, deadline=60)
    finally:
        await nc.close()


def test_the_lookup_of_frames_whose_puback_was_lost_waits_for_the_streams_new_leader(nats_cluster):
    """Issue #39, item 2: after a leader change the ordered publisher looks in the stream for the frames whose
    PubAck was lost with the old leader (``_find_stored``: STREAM.INFO, then a headers-only consumer). Right
    then the stream may have no leader yet: nothing answers its STREAM.INFO (observed: 408s for about 6 s
    after its leader is killed). Those requests are asked again until the lookup's deadline, as every other
    request is, instead of failing the task with the repair half done."""
    stream = "LOOKUP"
    with _stream_of_five_ids(nats_cluster, stream) as (_, leader):
        follower = next(node for node in nats_cluster.nodes if node is not leader)
        leader.stop(kill=True)
        try:
            found = asyncio.run(_looked_up(follower.url, stream))
        finally:
            leader.start()
            nats_cluster.wait_for_jetstream()
        assert found == {"id1": 2, "id3": 4}


def test_the_lookup_of_frames_whose_puback_was_lost_waits_for_a_quorum(nats_cluster):
    """Issue #39, item 2, the consumer: with two of three nodes gone the stream's leader still answers STREAM.INFO,
    but no consumer can be created (the JetStream meta group has no quorum: the create gets no reply). The
    lookup's CONSUMER.CREATE is asked again until the nodes are back, within the lookup's deadline."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    stream = "LOOKUPQ"
    with _stream_of_five_ids(nats_cluster, stream) as (_, leader):
        others = [node for node in nats_cluster.nodes if node is not leader]
        watch = SyncNats(leader.url)  # sees each consumer create the lookup sends
        creates: list[str] = []

        async def seen(msg) -> None:
            creates.append(msg.subject)

        watch.run(watch.nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}.>", cb=seen))
        for node in others:
            node.stop(kill=True)
        try:
            with Pool(1) as pool:
                lookup = pool.submit(asyncio.run, _looked_up(leader.url, stream))
                # The nodes stay away until the first create went unanswered and was asked again.
                wait_until(lambda: lookup.done() or len(creates) >= 2, timeout=60, what="a consumer create asked again")
                for node in others:
                    node.start()
                found = lookup.result(timeout=120)
        finally:
            for node in others:
                node.start()
            nats_cluster.wait_for_jetstream()
            watch.close()
        assert found == {"id1": 2, "id3": 4}

