"""Pushdown never changes an answer (issue #46): every everyday SQL pattern, with
``spark.sql.python.filterPushdown.enabled`` off and on, gives the same answer, and none is refused.

PySpark 4.1 to 4.3 keep the read a scan's pushdown planned on the data source that every scan of
the same view or DataFrame shares, and no task or planner can tell which query a plan belongs to
(SPARK-FACTS.md). Each pattern below is one users write and one a rule built on clocks got wrong
or refused: a DataFrame defined before a pushed query and run after it (through ``collect``,
``toPandas``, ``toLocalIterator`` and a write), ``ORDER BY`` and ``LIMIT``, ``UNION ALL`` of a
pushed and a whole scan, a self-join, a scalar subquery, ``cache()`` then a filter, a loop of
lookups, threads sharing a view, ``EXPLAIN`` then the query, the same plan run twice. Each runs on
a stream view and on a bucket's latest view, first with the conf off, then with it on, on fresh
views of the same data: the answers must match.
"""

from __future__ import annotations

import threading

import pytest

from pyspark_jetstream.spark_api import PUSHDOWN_CONF

MESSAGES = 1000
SUBJECTS = 10
KEYS = 500

_views = iter(range(1, 1_000_000))


def fill_answers(nats_client, stream: str = "ANSWERS") -> tuple[str, str]:
    """A stream of 1,000 messages over 10 subjects and a bucket of 500 keys, both with direct gets."""
    bucket = f"{stream}_KV"
    nats_client.add_stream(stream, ["ans.>"], allow_direct=True)

    async def fill() -> None:
        for i in range(MESSAGES):
            await nats_client.js.publish(f"ans.s{i % SUBJECTS}", f"m{i}".encode())
        kv = await nats_client.js.create_key_value(bucket=bucket, direct=True)
        for i in range(KEYS):
            await kv.put(f"user{i}", f"v{i}".encode())

    nats_client.run(fill(), timeout=300)
    return stream, bucket


@pytest.fixture(scope="module")
def data(nats_client, nats_server):
    stream, bucket = fill_answers(nats_client)
    return {"url": nats_server.url, "stream": stream, "bucket": bucket}


class Source:
    """One kind of view (a stream, or a bucket's latest view): how to make a fresh one, and its lookups."""

    def __init__(self, spark, data: dict, kind: str) -> None:
        self.spark, self.data, self.kind = spark, data, kind
        self.column = "subject" if kind == "stream" else "key"

    def view(self) -> str:
        name = f"ans_{self.kind}_{next(_views)}"
        options = {"servers": self.data["url"], "numPartitions": "2"}
        if self.kind == "stream":
            options["stream"] = self.data["stream"]
        else:
            options.update({"bucket": self.data["bucket"], "kv.view": "latest"})
        body = ", ".join(f"`{k}` '{v}'" for k, v in options.items())
        self.spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {name} USING jetstream OPTIONS ({body})")
        return name

    def value(self, i: int) -> str:
        return f"ans.s{i % SUBJECTS}" if self.kind == "stream" else f"user{i}"

    def where(self, i: int = 3) -> str:
        return f"{self.column} = '{self.value(i)}'"

    def one(self, sql: str):
        return self.spark.sql(sql).collect()[0][0]


def _defined_before(s: Source, tmp_path) -> dict:
    v = s.view()
    everything = s.spark.sql(f"SELECT seq FROM {v}")
    out = {}
    out["lookup"] = s.one(f"SELECT count(*) FROM {v} WHERE {s.where()}")
    out["collect"] = len(everything.collect())
    s.one(f"SELECT count(*) FROM {v} WHERE {s.where(4)}")
    out["toPandas"] = len(everything.toPandas())
    s.one(f"SELECT count(*) FROM {v} WHERE {s.where(5)}")
    out["toLocalIterator"] = sum(1 for _ in everything.toLocalIterator())
    s.one(f"SELECT count(*) FROM {v} WHERE {s.where(6)}")
    target = str(tmp_path / f"written-{next(_views)}")
    everything.write.parquet(target)
    out["write"] = s.spark.read.parquet(target).count()
    df = s.spark.table(v)
    whole = df.select("seq")
    out["df_lookup"] = df.where(f"{s.where(7)}").count()
    out["df_whole"] = len(whole.collect())
    return out


def _order_by_and_limit(s: Source, tmp_path) -> dict:
    v = s.view()
    ordered = [r[0] for r in s.spark.sql(f"SELECT seq FROM {v} WHERE {s.where()} ORDER BY seq DESC").collect()]
    limited = [r[0] for r in s.spark.sql(f"SELECT seq FROM {v} WHERE {s.where()} ORDER BY seq LIMIT 5").collect()]
    plain_limit = len(s.spark.sql(f"SELECT seq FROM {v} WHERE {s.where()} LIMIT 3").collect())
    after = s.one(f"SELECT count(*) FROM {v}")
    return {"ordered": ordered, "limited": limited, "plain_limit": plain_limit, "after": after}


def _union_all(s: Source, tmp_path) -> dict:
    v = s.view()
    rows = s.spark.sql(f"SELECT seq FROM {v} WHERE {s.where()} UNION ALL SELECT seq FROM {v}").collect()
    return {"count": len(rows), "seqs": sorted(r[0] for r in rows)}


def _self_join(s: Source, tmp_path) -> dict:
    v = s.view()
    c = s.column
    joined = s.one(f"SELECT count(*) FROM {v} a JOIN {v} b ON a.{c} = b.{c} WHERE a.{s.where()}")
    on_seq = s.one(f"SELECT count(*) FROM {v} a JOIN {v} b ON a.seq = b.seq")
    return {"joined": joined, "on_seq": on_seq}


def _scalar_subquery(s: Source, tmp_path) -> dict:
    v = s.view()
    above = s.one(f"SELECT count(*) FROM {v} WHERE seq > (SELECT min(seq) FROM {v} WHERE {s.where()})")
    total = s.one(f"SELECT (SELECT count(*) FROM {v}) - (SELECT count(*) FROM {v} WHERE {s.where()})")
    return {"above": above, "total": total}


def _cache_then_filter(s: Source, tmp_path) -> dict:
    v = s.view()
    s.one(f"SELECT count(*) FROM {v} WHERE {s.where(8)}")
    cached = s.spark.sql(f"SELECT * FROM {v}").cache()
    try:
        everything = cached.count()
        filtered = cached.where(s.where()).count()
        sql_filtered = s.one(f"SELECT count(*) FROM {v} WHERE {s.where(2)}")
    finally:
        cached.unpersist()
    return {"everything": everything, "filtered": filtered, "sql_filtered": sql_filtered}


LOOKUPS = 20  # a loop of 20 lookups (issue #46: every second lookup of 12 was a full scan under the old time rule)
THREADS, PER_THREAD = 4, 6  # issue #46's run of 24 queries, two of which answered 100 for 1,000


def _loop_of_lookups(s: Source, tmp_path) -> dict:
    v = s.view()
    counts = [s.one(f"SELECT count(*) FROM {v} WHERE {s.where(i)}") for i in range(LOOKUPS)]
    return {"counts": counts, "after": s.one(f"SELECT count(*) FROM {v}")}


def _threads(s: Source, tmp_path) -> dict:
    v = s.view()
    answers: dict[str, list] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(t: int) -> None:
        try:
            for q in range(PER_THREAD):
                sql = (f"SELECT count(*) FROM {v}" if q % 2 == 0 else
                       f"SELECT count(*) FROM {v} WHERE {s.where(t * PER_THREAD + q)}")
                answer = s.one(sql)
                with lock:
                    answers.setdefault(sql, []).append(answer)
        except BaseException as exc:  # noqa: BLE001 - reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread's queries did not end within 10 minutes"
    assert not errors, errors
    return {sql.replace(v, "v"): sorted(a) for sql, a in answers.items()}


def _explain_then_query(s: Source, tmp_path) -> dict:
    v = s.view()
    s.spark.sql(f"EXPLAIN SELECT * FROM {v} WHERE {s.where()}").collect()
    s.spark.sql(f"SELECT * FROM {v} WHERE {s.where(4)}").explain()
    return {"count": s.one(f"SELECT count(*) FROM {v}"), "lookup": s.one(f"SELECT count(*) FROM {v} WHERE {s.where()}")}


def _same_plan_twice(s: Source, tmp_path) -> dict:
    v = s.view()
    lookup = s.spark.sql(f"SELECT count(*) FROM {v} WHERE {s.where()}")
    whole = s.spark.sql(f"SELECT count(*) FROM {v}")
    return {"runs": [lookup.collect()[0][0], whole.collect()[0][0], lookup.collect()[0][0], whole.collect()[0][0]]}


PATTERNS = {
    "defined_before": _defined_before,
    "order_by_and_limit": _order_by_and_limit,
    "union_all": _union_all,
    "self_join": _self_join,
    "scalar_subquery": _scalar_subquery,
    "cache_then_filter": _cache_then_filter,
    "loop_of_lookups": _loop_of_lookups,
    "threads": _threads,
    "explain_then_query": _explain_then_query,
    "same_plan_twice": _same_plan_twice,
}


@pytest.mark.parametrize("kind", ["stream", "bucket"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_pushdown_on_answers_as_pushdown_off(spark, data, tmp_path, pattern, kind):
    source = Source(spark, data, kind)
    run = PATTERNS[pattern]
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        off = run(source, tmp_path)
        spark.conf.set(PUSHDOWN_CONF, "true")
        on = run(source, tmp_path)
    finally:
        spark.conf.unset(PUSHDOWN_CONF)
    total, per = (MESSAGES, MESSAGES // SUBJECTS) if kind == "stream" else (KEYS, 1)
    if pattern == "loop_of_lookups":  # the answers themselves, not only their agreement
        assert off == {"counts": [per] * LOOKUPS, "after": total}
    assert on == off
