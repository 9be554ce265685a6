"""Interoperability with nats.js (3.x), field by field, against a real nats-server.

Not part of the pytest run: it needs Node 20 and the npm registry. Run it as
``.venv/bin/python tests/interop/check_nats_js.py``; it installs ``@nats-io/jetstream``,
``@nats-io/kv`` and ``@nats-io/transport-node`` into a temporary folder and prints one line
per comparison, exiting 1 on any difference.

1. What nats.js writes (a stream with binary data, repeated and padded headers, TTLs, a
   message id and an expected stream; a bucket with a per-key TTL, a delete and a purge)
   reads the same through the connector as through nats.js.
2. What the connector writes (a copy of that stream with its headers column, and rows with
   ttl, msg_id and repeated headers) reads the same through nats.js as the rows written.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from pyspark_jetstream.tools.server import EmbeddedNatsServer  # noqa: E402

PACKAGES = ["@nats-io/jetstream@3", "@nats-io/kv@3", "@nats-io/transport-node@3"]
failures: list[str] = []


def check(what: str, ours, theirs) -> None:
    ok = ours == theirs
    print(f"{'OK  ' if ok else 'DIFF'} {what}" + ("" if ok else f"\n     connector: {ours}\n     nats.js:   {theirs}"))
    if not ok:
        failures.append(what)


def node(workdir: Path, *args: str):
    done = subprocess.run(["node", str(workdir / "natsjs.mjs"), *args], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"nats.js failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def user_headers(headers: dict) -> dict:
    return {k: list(v) for k, v in (headers or {}).items() if not k.lower().startswith("nats-")}


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="natsjs-"))
    try:
        subprocess.run(["npm", "install", "--silent", "--prefix", str(workdir), *PACKAGES], check=True, timeout=300)
        shutil.copy(Path(__file__).with_name("natsjs.mjs"), workdir / "natsjs.mjs")
        version = json.loads((workdir / "node_modules/@nats-io/jetstream/package.json").read_text())["version"]
        print(f"node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}, "
              f"@nats-io/jetstream {version}")
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        with EmbeddedNatsServer() as server:
            run(spark, server.url, workdir)
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(failures)} difference(s)")
    return 1 if failures else 0


def run(spark, url: str, workdir: Path) -> None:
    def read(**options):
        r = spark.read.format("jetstream").option("servers", url)
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    written = node(workdir, "write", url)
    check("nats.js PubAck sequences", written["acks"], [1, 2, 3])

    # 1b. A bucket nats.js wrote: the change log against nats.js's kv.history() (first: its marker
    # lives 20 s, see natsjs.mjs).
    log = sorted(read(bucket="jskv").collect(), key=lambda r: r.seq)
    check("jskv: (revision, key, operation, value) as kv.history() sees them",
          [(r.seq, r.key, r.operation, bytes(r.data)) for r in log],
          sorted((e["revision"], e["key"], e["operation"], base64.b64decode(e["value"])) for e in written["kv"]))

    # 1a. A stream nats.js wrote, read by the connector and by nats.js.
    rows = sorted(read(stream="JSW").collect(), key=lambda r: r.seq)
    js_msgs = node(workdir, "stream", url, "JSW")
    check("JSW: seq, subject, data", [(r.seq, r.subject, bytes(r.data)) for r in rows],
          [(m["seq"], m["subject"], base64.b64decode(m["data"])) for m in js_msgs])
    check("JSW: every header, repeated values in order",
          [{k: list(v) for k, v in (r.headers or {}).items()} for r in rows],
          [m["headers"] for m in js_msgs])
    check("JSW: ttl column = Nats-TTL as nats.js stored it", [r.ttl for r in rows],
          [(m["headers"].get("Nats-TTL") or [None])[0] for m in js_msgs])
    check("JSW: timestamp", [r.timestamp.isoformat() for r in rows],
          [m["time"][:26].rstrip("Z").ljust(26, "0") for m in js_msgs])

    # 2a. The connector copies JSW to JSC with its headers column; nats.js reads the copy.
    (read(stream="JSW").withColumn("subject", F.concat(F.lit("jsc."), F.col("subject"))).write.format("jetstream")
     .mode("append").option("servers", url).option("stream", "JSC").option("ensureStream", "create")
     .option("stream.subjects", "jsc.>").save())
    copy = node(workdir, "stream", url, "JSC")
    by_subject = {m["subject"]: m for m in js_msgs}
    check("JSC (connector copy): subject, data, user headers as nats.js reads them",
          sorted((m["subject"], m["data"], json.dumps(user_headers(m["headers"]), sort_keys=True)) for m in copy),
          sorted(("jsc." + s, m["data"], json.dumps(user_headers(m["headers"]), sort_keys=True))
                 for s, m in by_subject.items()))
    check("JSC: Nats-TTL carried", sorted((m["subject"], m["headers"].get("Nats-TTL")) for m in copy),
          sorted(("jsc." + s, m["headers"].get("Nats-TTL")) for s, m in by_subject.items()))

    # 2b. Rows the connector writes, read by nats.js.
    rows_in = [("snk.a", b"\x00\xffbin", "90s", "id-a", {"X-Rep": ["1", "2", "3"], "X-One": ["only"]}),
               ("snk.b", b"text", None, "id-b", None),
               ("snk.a", b"again", "never", "id-c", {"X-Rep": ["z"]})]
    df = spark.createDataFrame(rows_in, "subject string, data binary, ttl string, msg_id string, "
                                        "headers map<string,array<string>>")
    (df.coalesce(1).write.format("jetstream").mode("append").option("servers", url).option("stream", "SNK")
     .option("ensureStream", "create").option("stream.subjects", "snk.>").save())
    stored = node(workdir, "stream", url, "SNK")
    check("SNK: subject, data, user headers, Nats-TTL, Nats-Msg-Id as nats.js reads them",
          [(s, d, user_headers(h), [t] if t else None, [i]) for s, d, t, i, h in rows_in],
          [(m["subject"], base64.b64decode(m["data"]), user_headers(m["headers"]), m["headers"].get("Nats-TTL"),
            m["headers"].get("Nats-Msg-Id")) for m in stored])

    # 2c. Key operations the connector writes to a bucket, read by nats.js's kv.history().
    ops = [("a", "1", None, "1h"), ("b", "2", None, None), ("a", "3", "PUT", None), ("b", None, "DEL", None),
           ("c", "4", None, None), ("c", None, "PURGE", "30s")]
    (spark.createDataFrame(ops, "key string, data string, operation string, ttl string").coalesce(1)
     .write.format("jetstream").mode("append").option("servers", url).option("bucket", "skv")
     .option("ensureBucket", "create").option("bucket.history", 5).save())
    check("skv (connector KV writes): (key, operation, value) as nats.js kv.history() sees them",
          sorted((e["key"], e["operation"], base64.b64decode(e["value"])) for e in node(workdir, "kv", url, "skv")),
          sorted([("a", "PUT", b"1"), ("b", "PUT", b"2"), ("a", "PUT", b"3"), ("b", "DEL", b""),
                  ("c", "PURGE", b"")]))
    # A bucket copy of what nats.js wrote (markers skipped), read by nats.js.
    (read(bucket="jskv").coalesce(1).write.format("jetstream").mode("append").option("servers", url)
     .option("bucket", "ckv").option("ensureBucket", "create").option("bucket.history", 5).save())
    original = [(e["key"], e["operation"], e["value"]) for e in written["kv"] if e["key"] != "short"]
    check("ckv (connector copy of jskv): (key, operation, value) as nats.js kv.history() sees them",
          sorted((e["key"], e["operation"], e["value"]) for e in node(workdir, "kv", url, "ckv")
                 if e["key"] != "short"), sorted(original))


if __name__ == "__main__":
    sys.exit(main())
