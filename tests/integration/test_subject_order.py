"""Copies that keep each subject's (each key's) order through parallel reads and writes (issues #23, #32).

A read is split into sequence ranges (each message delivered once), so one subject's history is
in every partition. A copy keeps each subject's order through ``repartition(n, "subject")``: each
subject is then written by one task, which publishes its rows in source sequence order. A copy
without it (a narrow plan: each read task writes its own range) is refused before anything is
published. ``split=subject`` keeps each subject in one read partition instead (no shuffle, more
work for the server). nats-py is the judge of both ends.
"""

from __future__ import annotations

import asyncio

import pytest
from pyspark.sql import functions as F

from ..helpers import finished, history, jetstream_writer, kv_keys, latest


def _interleaved(nats_client, subjects: list[str], rounds: int) -> None:
    """``rounds`` messages per subject, the subjects taking turns: every range holds every subject (a
    round's publishes are awaited together, so the subjects' order within a round is the server's)."""
    async def go():
        for r in range(rounds):
            await asyncio.gather(*(nats_client.js.publish(s, f"{s}:{r}".encode()) for s in subjects))

    nats_client.run(go(), timeout=120)


def _by_subject(messages, prefix: str = "") -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for m in messages:
        out.setdefault(m.subject.removeprefix(prefix), []).append(m.data)
    return out


def _copy_of_interleaved(spark, nats_server, nats_client, stream_name: str, subjects_of, rounds: int, **options):
    """A source stream of ``rounds`` interleaved messages on each of ``subjects_of(source)``, an empty
    target stream, and a 4-partition read of the source: (source, target, read)."""
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
    _interleaved(nats_client, subjects_of(source), rounds)
    read = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", source)
            .option("numPartitions", "4"))
    for k, v in options.items():
        read = read.option(k, v)
    return source, target, read.load()


def _commit_lines(spark, target: str) -> list[str]:
    """The sink's log lines (its commit lines) that name stream ``target``, from Spark's Python workers."""
    from ..helpers import worker_log

    return [m for m in worker_log(spark, "pyspark_jetstream.sink") if f"to stream '{target}'" in m]


def test_a_copy_straight_from_a_read_split_by_sequence_is_refused_before_it_publishes(spark, nats_server,
                                                                                     nats_client, stream_name):
    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.dev{i}" for i in range(6)], 20)
    copy = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
    with pytest.raises(Exception) as refused:
        jetstream_writer(copy, nats_server.url, stream=target).save()
    text = str(refused.value)
    assert "OrderError" in text and f"stream '{source}' split into 4 sequence ranges" in text
    assert '.repartition(n, "subject")' in text and "order='none'" in text
    assert nats_client.stored_count(target) == 0  # refused before anything was published
    # Without the source's positions there is nothing to sort by: refused all the same.
    with pytest.raises(Exception, match="OrderError"):
        jetstream_writer(copy.select("subject", "data"), nats_server.url, stream=target).save()
    assert nats_client.stored_count(target) == 0
    # order=none: published as the tasks go (the user said the target needs no order).
    jetstream_writer(copy, nats_server.url, stream=target, order="none").save()
    assert nats_client.stored_count(target) == 120


@pytest.mark.parametrize("write_partitions", [4, 3])
def test_a_stream_copy_through_a_shuffle_keeps_every_subjects_order(spark, nats_server, nats_client, stream_name,
                                                                    write_partitions):
    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.dev{i}" for i in range(6)], 300)
    assert read.rdd.getNumPartitions() == 4
    copy = (read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
            .repartition(write_partitions, "subject"))
    jetstream_writer(copy, nats_server.url, stream=target).save()
    original = _by_subject(nats_client.messages(source))
    copied = _by_subject(nats_client.messages(target), f"{target}.")
    assert copied == original  # every subject: all 300, in the source's order


def test_a_shuffle_that_hands_a_task_the_later_rows_first_is_put_back_in_order(spark, nats_server, nats_client,
                                                                               stream_name):
    """A reduce task gets its map outputs in no fixed order; here the map task holding the later half of the
    stream comes first (a union of the later read and the earlier one), so each write task receives every
    subject's later messages before its earlier ones: the sink publishes them in source order all the same."""
    source, target, _ = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                             lambda source: [f"{source}.dev{i}" for i in range(6)], 50)

    def part(**options):
        r = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", source)
        for k, v in options.items():
            r = r.option(k, v)
        return r.option("numPartitions", "1").load()

    later_first = part(startingOffsets="151").union(part(endingOffsets="150"))
    copy = (later_first.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
            .repartition(3, "subject"))
    arrived = copy.select("seq", F.spark_partition_id().alias("p")).collect()
    assert any(a.seq > b.seq for a, b in zip(arrived, arrived[1:], strict=False) if a.p == b.p)  # really reversed
    jetstream_writer(copy, nats_server.url, stream=target).save()
    assert _by_subject(nats_client.messages(target), f"{target}.") == _by_subject(nats_client.messages(source))


def test_a_task_holding_more_than_its_buffer_spills_and_merges_in_order(spark, nats_server, nats_client,
                                                                        stream_name):
    """``order.maxBufferBytes`` at its least (1 MiB) and about 4 MiB of rows per write task: the task sorts
    and spills runs to local files and merges them; the copy is whole and in order all the same."""
    source, target, _ = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                             lambda source: [f"{source}.k{i}" for i in range(20)], 1000)

    def part(**options):  # the later half first: every task gets its subjects' later rows before the earlier
        r = spark.read.format("jetstream").option("servers", nats_server.url).option("stream", source)
        for k, v in options.items():
            r = r.option(k, v)
        return r.option("numPartitions", "1").load()

    read = part(startingOffsets="10001").union(part(endingOffsets="10000"))
    padded = read.withColumn("data", F.concat(F.col("data"), F.lit(b"x" * 400)))
    copy = (padded.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
            .repartition(2, "subject"))
    jetstream_writer(copy, nats_server.url, stream=target, order__maxBufferBytes="1048576").save()
    copied = _by_subject(nats_client.messages(target), f"{target}.")
    assert {k: [d[:-400] for d in v] for k, v in copied.items()} == _by_subject(nats_client.messages(source))


def test_a_streaming_copy_through_a_shuffle_keeps_order_across_micro_batches(spark, nats_server, nats_client,
                                                                             stream_name, tmp_path):
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
    subjects = [f"{source}.e{i}" for i in range(5)]
    _interleaved(nats_client, subjects, 120)
    read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source)
            .option("startingOffsets", "earliest").option("numPartitions", "4")
            .option("maxMessagesPerTrigger", "250").load())
    query = (read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject"))).repartition(3, "subject")
             .writeStream.format("jetstream").option("servers", nats_server.url).option("stream", target)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    finished(query)
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 2  # several micro-batches
    assert _by_subject(nats_client.messages(target), f"{target}.") == _by_subject(nats_client.messages(source))


def test_a_bucket_copy_through_a_shuffle_by_key_ends_with_the_sources_values_and_history(spark, nats_server,
                                                                                        nats_client, stream_name):
    """8 keys updated 150 times each, interleaved; read in 4 sequence ranges, repartitioned by key and
    copied bucket to bucket: nats-py's get() and history() on the copy equal the source's for every key."""
    a, b = f"A{stream_name}", f"B{stream_name}"
    kv_a = nats_client.run(nats_client.js.create_key_value(bucket=a, history=64))
    kv_b = nats_client.run(nats_client.js.create_key_value(bucket=b, history=64))
    keys = [f"dev{i}" for i in range(8)]

    async def fill():
        for r in range(150):
            for k in keys:
                await kv_a.put(k, f"{k}:{r}".encode())

    nats_client.run(fill(), timeout=120)
    read = (spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", a)
            .option("numPartitions", "4").load())
    jetstream_writer(read.repartition(4, "key"), nats_server.url, bucket=b).save()
    assert kv_keys(nats_client, kv_b) == keys
    for k in keys:
        assert latest(nats_client, kv_b, k) == f"{k}:149".encode()
        assert history(nats_client, kv_b, k) == history(nats_client, kv_a, k)


def test_split_by_subject_needs_no_shuffle(spark, nats_server, nats_client, stream_name):
    """``split=subject``, 1,000 flat subjects over 4 partitions: each partition reads the whole range and
    keeps its own subjects. Every message once, each subject in one partition, and a copy straight from
    the read (no shuffle) keeps every subject's order."""
    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.k{i:04d}" for i in range(1000)], 3,
                                                split="subject")
    rows = read.select("seq", "subject", F.spark_partition_id().alias("p")).collect()
    assert sorted(r.seq for r in rows) == list(range(1, 3001))
    partitions_of: dict[str, set[int]] = {}
    for r in rows:
        partitions_of.setdefault(r.subject, set()).add(r.p)
    assert len(partitions_of) == 1000 and all(len(p) == 1 for p in partitions_of.values())
    assert {p for ps in partitions_of.values() for p in ps} == {0, 1, 2, 3}
    copy = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
    jetstream_writer(copy, nats_server.url, stream=target).save()
    assert _by_subject(nats_client.messages(target), f"{target}.") == _by_subject(nats_client.messages(source))


def test_the_default_split_reads_every_message_once_in_ranges(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    _interleaved(nats_client, [f"{stream_name}.x{i}" for i in range(3)], 50)
    read = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
            .option("numPartitions", "4").load())
    rows = read.select("seq", F.spark_partition_id().alias("p")).collect()
    assert sorted(r.seq for r in rows) == list(range(1, 151))
    ranges = {}
    for r in rows:
        ranges.setdefault(r.p, []).append(r.seq)
    assert [(min(s), max(s)) for _, s in sorted(ranges.items())] == [(1, 38), (39, 76), (77, 113), (114, 150)]


def test_rows_reordered_before_the_write_are_put_back_or_counted(spark, nats_server, nats_client, stream_name,
                                                                worker_logging):
    """A transformation between read and write hands the task every subject's rows in reverse (a sort by
    sequence, descending). order=subject (the default) publishes them in source order all the same;
    order=none publishes them as they come and counts, in the commit line, the rows that came after a
    later one of their subject (3 subjects x 9 steps back)."""
    from ..helpers import worker_log

    source = stream_name
    nats_client.add_stream(source, [f"{source}.>"])
    _interleaved(nats_client, [f"{source}.s{i}" for i in range(3)], 10)
    reversed_rows = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", source).load()
                     .select("subject", "data", "stream", "seq").coalesce(1).sortWithinPartitions(F.desc("seq")))
    for order, prefix in (("subject", "X"), ("none", "Y")):
        target = f"{source}_{prefix}"
        nats_client.add_stream(target, [f"{prefix}{source}.>"])
        out = reversed_rows.withColumn("subject", F.concat(F.lit(prefix), F.col("subject")))
        jetstream_writer(out, nats_server.url, stream=target, order=order).save()
    assert _by_subject(nats_client.messages(f"{source}_X"), "X") == _by_subject(nats_client.messages(source))
    assert all(v == list(reversed(_by_subject(nats_client.messages(source))[k]))
               for k, v in _by_subject(nats_client.messages(f"{source}_Y"), "Y").items())
    lines = [m for m in worker_log(spark, "pyspark_jetstream.sink") if stream_name in m]
    kept = [m for m in lines if f"'{source}_X'" in m]
    broken = [m for m in lines if f"'{source}_Y'" in m]
    assert len(kept) == 1 and "committed:" in kept[0] and "out of source order" not in kept[0], lines
    assert len(broken) == 2, lines  # the commit line, and the warning that says what happened
    assert any("committed:" in m and ", 27 out of source order" in m for m in broken), lines
    assert any(": 27 rows came after a later source sequence of their subject in the same task" in m
               for m in broken), lines


def test_a_copy_spread_over_tasks_another_way_is_named_in_the_commit_line(spark, nats_server, nats_client,
                                                                         stream_name, worker_logging):
    """Rows that reach the sink without the read's notes and without a shuffle by subject (here: a cache of
    the read, then a round-robin repartition) are sorted within each task, but a subject's rows are in
    several tasks: the commit line says so, naming one subject and its tasks."""
    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.d{i}" for i in range(40)], 10)
    copy = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject"))).repartition(3)
    jetstream_writer(copy, nats_server.url, stream=target).save()
    lines = _commit_lines(spark, target)
    assert any("were written by more than one task" in m and "'.repartition(n" not in m for m in lines), lines
    shuffled_target = target + "OK"
    nats_client.add_stream(shuffled_target, [f"{shuffled_target}.>"], allow_msg_ttl=True)
    jetstream_writer(read.withColumn("subject", F.concat(F.lit(f"{shuffled_target}."), F.col("subject")))
                     .repartition(3, "subject"), nats_server.url, stream=shuffled_target).save()
    lines = _commit_lines(spark, shuffled_target)
    assert lines and not any("more than one task" in m for m in lines), lines


def test_a_narrow_streaming_copy_is_refused_at_one_message_as_at_many(spark, nats_server, nats_client, stream_name,
                                                                      tmp_path):
    """The guard is a property of the query (issue #39): a micro-batch of one message is split into as
    many ranges as one of thousands (the ranges past the data are empty), so a copy without the
    shuffle is refused at its first micro-batch, not when traffic grows."""
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
    _interleaved(nats_client, [f"{source}.one"], 1)

    def run(checkpoint: str):  # the job as a user would write it, without the line
        read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source)
                .option("startingOffsets", "earliest").option("numPartitions", "4").load())
        return (read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
                .writeStream.format("jetstream").option("servers", nats_server.url).option("stream", target)
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    query = run(str(tmp_path / "narrow"))
    with pytest.raises(Exception) as failed:  # the query ends with its first micro-batch's error
        ended = query.awaitTermination(180)
        assert ended, "the query neither failed nor finished within 180s"
    assert "OrderError" in str(failed.value) and "reads 1 of them" in str(failed.value)
    assert nats_client.stored_count(target) == 0


def test_a_filter_republished_as_a_kafka_user_writes_it_runs_in_order(spark, nats_server, nats_client, stream_name,
                                                                       tmp_path):
    """Issue #56, point 4: a streaming read with the default options, filtered, and published to another stream
    with `subject` and `data` only (no `seq`, no shuffle), as a Kafka user writes it, runs and keeps each
    subject's order: a streaming read is one partition unless `numPartitions` says otherwise (a stream is one
    log). Before, the read was split in as many ranges as the driver has cores, and the query died with an
    OrderError at its first micro-batch with data. nats-py is the judge of both ends."""
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    subjects = [f"{source}.dev{i}" for i in range(20)]
    _interleaved(nats_client, subjects, 50)
    read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", source)
            .option("startingOffsets", "earliest").load())
    alerts = (read.where(~F.col("data").cast("string").endswith(":3"))  # a stateless filter
              .select(F.concat(F.lit(f"{target}."), F.col("subject")).alias("subject"), "data"))
    query = (alerts.writeStream.format("jetstream").option("servers", nats_server.url).option("stream", target)
             .option("checkpointLocation", str(tmp_path / "filter")).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the query did not finish within 180s"
    assert query.exception() is None
    expected = {s: [m for m in data if not m.endswith(b":3")] for s, data in _by_subject(nats_client.messages(source)).items()}
    assert _by_subject(nats_client.messages(target), f"{target}.") == expected


def test_coalesce_1_after_a_read_split_in_ranges_publishes_every_subject_in_order(spark, nats_server, nats_client,
                                                                                   stream_name):
    """One task that reads every range of the read (``coalesce(1)``) has each subject's rows in source
    order: accepted, with one message as with many."""
    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.dev{i}" for i in range(6)], 500)
    copy = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject"))).coalesce(1)
    # Small Arrow batches: the write's first rows come while the task still reads its first range, so the
    # decision cannot wait for what the task's later ranges are.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        jetstream_writer(copy, nats_server.url, stream=target).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert _by_subject(nats_client.messages(target), f"{target}.") == _by_subject(nats_client.messages(source))
    # One message, four partitions (three empty): the same rule.
    single, single_target = stream_name + "ONE", stream_name + "ONET"
    nats_client.add_stream(single, [f"{single}.>"])
    nats_client.add_stream(single_target, [f"{single_target}.>"], allow_msg_ttl=True)
    _interleaved(nats_client, [f"{single}.x"], 1)
    one = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", single)
           .option("numPartitions", "4").load())
    assert one.rdd.getNumPartitions() == 4
    jetstream_writer(one.withColumn("subject", F.concat(F.lit(f"{single_target}."), F.col("subject"))).coalesce(1),
                     nats_server.url, stream=single_target).save()
    assert nats_client.stored_count(single_target) == 1
    with pytest.raises(Exception, match="OrderError"):  # and without coalesce(1): refused, one message or not
        jetstream_writer(one.withColumn("subject", F.concat(F.lit(f"{single_target}."), F.col("subject"))),
                         nats_server.url, stream=single_target).save()
    assert nats_client.stored_count(single_target) == 1


def test_a_copy_that_drops_seq_after_its_shuffle_says_so_in_the_commit_line(spark, nats_server, nats_client,
                                                                            stream_name, worker_logging):
    """Order is not lost silently when the positions go (issue #39): after the shuffle the sink cannot tell
    a copy from any other rows, so it publishes them as they come and its commit line counts them."""

    source, target, read = _copy_of_interleaved(spark, nats_server, nats_client, stream_name,
                                                lambda source: [f"{source}.d{i}" for i in range(4)], 10)
    shuffled = read.withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject"))).repartition(2, "subject")
    jetstream_writer(shuffled.select("subject", "data"), nats_server.url, stream=target).save()
    lines = _commit_lines(spark, target)
    assert any("40 rows published in the order they arrived, without the column 'seq'" in m for m in lines), lines
    kept = target + "K"
    nats_client.add_stream(kept, [f"{kept}.>"], allow_msg_ttl=True)
    jetstream_writer(read.withColumn("subject", F.concat(F.lit(f"{kept}."), F.col("subject")))
                     .repartition(2, "subject"), nats_server.url, stream=kept).save()
    lines = _commit_lines(spark, kept)
    assert lines and not any("without the column 'seq'" in m for m in lines), lines
