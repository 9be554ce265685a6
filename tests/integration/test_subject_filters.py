"""Any set of ``subjects`` the server accepts reads every matching message once (issue #32, item 5).

nats-server refuses a consumer whose filter subjects overlap (10138). Filters one of which contains
another used to reach a consumer together; partial overlaps were left to luck. 1,200 subjects
``t.s{0..29}.d{0..39}`` over 8 partitions, both splits; nats-py's view of the stream is the judge.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.protocol.subjects import subject_matches


@pytest.fixture(scope="module")
def tree(nats_client):
    name = "FILTERTREE"
    nats_client.api(f"STREAM.DELETE.{name}")
    nats_client.add_stream(name, ["t.>"])

    async def fill():
        for d in range(40):
            for s in range(30):
                await nats_client.js.publish(f"t.s{s}.d{d}", f"{s}:{d}".encode())

    nats_client.run(fill(), timeout=300)
    yield name, {m.seq: m.subject for m in nats_client.messages(name)}
    nats_client.api(f"STREAM.DELETE.{name}")


@pytest.mark.parametrize("filters", ["t.>,t.s1.*", "t.s1.*,t.>,t.s1.d2", "t.*.d1,t.s1.>", "t.s2.*,t.*.d3,t.s2.d3"])
@pytest.mark.parametrize("split", ["sequence", "subject"])
def test_overlapping_filters_read_every_matching_message_once(spark, nats_server, tree, filters, split):
    stream, stored = tree
    rows = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream)
            .option("subjects", filters).option("numPartitions", "8").option("split", split).load()
            .select("seq", "subject", F.spark_partition_id().alias("p")).collect())
    wanted = sorted(seq for seq, subject in stored.items()
                    if any(subject_matches(f, subject) for f in filters.split(",")))
    assert sorted(r.seq for r in rows) == wanted  # each matching message once, nothing else
    assert all(stored[r.seq] == r.subject for r in rows)
    if split == "subject":
        partitions_of: dict[str, set[int]] = {}
        for r in rows:
            partitions_of.setdefault(r.subject, set()).add(r.p)
        assert all(len(p) == 1 for p in partitions_of.values())  # each subject in one partition
