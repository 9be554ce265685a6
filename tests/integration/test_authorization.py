"""Authorization: refused publishes and reads fail clearly, and nothing else is published."""

from __future__ import annotations

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats

CONFIG = """
authorization {
  users = [
    { user: admin, password: adminpw }
    { user: writer, password: writerpw,
      permissions: { publish: { allow: ["orders.>", "$JS.API.>"] }, subscribe: { allow: ["_INBOX.>"] } } }
    { user: cased, password: casedpw,
      permissions: { publish: { allow: ["orders.>", "deadletters.>", "$JS.API.>"] }, subscribe: { allow: ["_INBOX.>"] } } }
    { user: reader, password: readerpw,
      permissions: {
        publish: { allow: ["$JS.API.STREAM.INFO.ORDERS", "$JS.API.CONSUMER.*.ORDERS.>", "$JS.API.CONSUMER.MSG.NEXT.ORDERS.>",
                           "$JS.API.STREAM.MSG.GET.ORDERS"] }
        subscribe: { allow: ["_INBOX.>"] } } }
  ]
}
"""


@pytest.fixture(scope="module")
def secured():
    with EmbeddedNatsServer(config=CONFIG) as server:
        admin = SyncNats(server.url, user="admin", password="adminpw")
        admin.add_stream("ORDERS", ["orders.>"])
        admin.add_stream("PAYMENTS", ["payments.>"])
        yield server, admin
        admin.close()


def test_publish_outside_the_allowed_subjects_fails_clearly(spark, secured):
    server, admin = secured
    rows = [("orders.a", "1"), ("orders.b", "2"), ("payments.x", "3"), ("orders.c", "4")]
    df = spark.createDataFrame(rows, "subject string, data string").coalesce(1)
    with pytest.raises(Exception) as info:
        (df.write.format("jetstream").mode("append").option("servers", server.url).option("user", "writer")
         .option("password", "writerpw").option("ackTimeout", "120s").save())
    text = str(info.value)
    assert "subject 'payments.x'" in text and 'Permissions Violation for Publish to "payments.x" (status 403)' in text
    assert "writerpw" not in text
    assert admin.stream_state("PAYMENTS")["messages"] == 0
    # The refused row fails alone: the server stores the allowed rows before and after it.
    assert sorted(m.data for m in admin.messages("ORDERS")) == [b"1", b"2", b"4"]


def test_reading_a_forbidden_stream_fails_clearly(spark, secured):
    server, admin = secured
    assert "error" not in admin.publish_raw("orders.r", None, b"r")
    ok = (spark.read.format("jetstream").option("servers", server.url).option("user", "reader")
          .option("password", "readerpw").option("stream", "ORDERS").load())
    assert sorted((r.seq, r.data) for r in ok.collect()) == [(m.seq, m.data) for m in admin.messages("ORDERS")]
    assert b"r" in {r.data for r in ok.collect()}
    # nats-py lowercases the server's -ERR text, subject included.
    with pytest.raises(Exception, match=r'(?i)STREAM.INFO.PAYMENTS failed: the server refused it: permissions violation '
                                        r'for publish to "\$JS.API.STREAM.INFO.PAYMENTS"'):
        (spark.read.format("jetstream").option("servers", server.url).option("user", "reader")
         .option("password", "readerpw").option("stream", "PAYMENTS").load().count())


def test_a_violation_for_a_subject_in_other_case_refuses_only_that_row(spark, secured):
    """Issue #23: subjects are case-sensitive. The refusal of 'Orders.x' (not allowed) names only that row:
    the 'orders.x' rows in flight beside it are stored, and only one dead letter is written."""
    server, admin = secured
    admin.add_stream("CASED", ["Orders.>"])
    admin.add_stream("DEADLETTERS", ["deadletters.>"])
    before = admin.stream_state("ORDERS")["messages"]
    rows = [("orders.x", str(i)) for i in range(100)]
    rows.insert(50, ("Orders.x", "refused"))
    df = spark.createDataFrame(rows, "subject string, data string").coalesce(1)
    (df.write.format("jetstream").mode("append").option("servers", server.url).option("user", "cased")
     .option("password", "casedpw").option("deadLetterSubject", "deadletters.x").save())
    assert admin.stream_state("ORDERS")["messages"] == before + 100
    assert admin.stream_state("CASED")["messages"] == 0
    letters = admin.messages("DEADLETTERS")
    assert [(m.data, m.headers["Spark-JetStream-Original-Subject"]) for m in letters] == [(b"refused", ["Orders.x"])]
    [letter] = letters
    assert letter.data == b"refused"
    assert letter.headers["Spark-JetStream-Original-Subject"] == ["Orders.x"]
    assert letter.headers["Spark-JetStream-Error"] == ['Permissions Violation for Publish to "Orders.x" (status 403)']
