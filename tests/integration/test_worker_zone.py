"""A timestamp_ntz column means its wall-clock time read as UTC, whatever the Python workers' zone
and the session's: an ``expires_at`` (with ``preserveExpiry``) gives the TTL it says, a ``sequenceBy``
column the sequence header it says, as nats-py reads them back. On PySpark 4.0 a streaming writer is
given rows, which the sink turns into Arrow batches itself (sink/encode/row_batches.py; issue #33, item 6);
from 4.1 on it is given Spark's Arrow batches. Both must agree."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time
from pathlib import Path

from ..helpers import run_script

JOB = Path(__file__).parent / "jobs" / "zoned_write_job.py"
WORKER_ZONE = "America/New_York"  # UTC-5 or -4: read as local time, a wall clock moves by 4 or 5 hours
SESSION_ZONE = "Asia/Kolkata"


def test_ntz_expiry_and_sequence_are_read_as_utc_by_workers_in_another_zone(nats_server, nats_client, stream_name,
                                                                            tmp_path):
    bucket = f"{stream_name}_KV"
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    nats_client.run(nats_client.js.create_key_value(bucket=bucket))
    start = time.time()
    now = dt.datetime.fromtimestamp(int(start), dt.timezone.utc).replace(tzinfo=None)  # UTC's wall clock
    expires = {"a": now + dt.timedelta(hours=2), "b": now + dt.timedelta(hours=3, microseconds=250)}
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.json").write_text("".join(
        json.dumps({"key": key, "data": f"v-{key}", "at": at.isoformat(sep=" ")}) + "\n" for key, at in expires.items()))
    out = run_script(sys.executable, JOB, nats_server.url, str(tmp_path / "in"), str(tmp_path / "chk"), SESSION_ZONE,
                     stream_name, bucket, env={"TZ": WORKER_ZONE}, timeout=400)
    elapsed = time.time() - start
    offset = re.search(r"WORKER_UTC_OFFSET (\S+)", out).group(1)
    assert offset in ("-0400", "-0500"), out  # the workers really ran in New York's time
    assert "WRITTEN" in out, out
    seen, wanted = {}, {}
    for key, at in expires.items():
        stored = nats_client.run(nats_client.js.get_last_msg(stream_name, f"{stream_name}.{key}"))
        entry = nats_client.run(nats_client.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}"))
        assert entry.data == f"v-{key}".encode()
        ttl = int(stored.headers["Nats-TTL"])
        lifetime = (at - now) / dt.timedelta(seconds=1)  # from the start: the TTL is less by the job's time
        seen[key] = (ttl if lifetime - elapsed - 1 <= ttl <= lifetime + 1 else f"{ttl} for a lifetime of {lifetime}",
                     entry.headers["Spark-JetStream-Sequence"])
        micros = (at - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)  # the wall clock as UTC
        wanted[key] = (ttl, f"ts:{micros}")
    assert seen == wanted, f"the job took {elapsed:.0f}s"
