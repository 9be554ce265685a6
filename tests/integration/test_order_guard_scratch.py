"""The order guard's verdict does not depend on a writable temp directory (issue #47).

Found: a copy straight from a 4-range read was refused, as it must be, until the read could not leave
its note in the temp directory (a plain file where its folder goes: a full disk, a read-only temp dir
or a sandbox look the same); the note was dropped without a word, the sink took the rows for shuffled
ones and stored 20,000 rows, every subject out of order. The notes now go under Spark's local
directory, which both workers of a task are given, and a read that cannot leave its note fails: a
guard that cannot decide refuses. A job of its own (tests/integration/jobs/scratch_guard_job.py) runs
each copy with the scratch space writable and not, in a Spark session whose workers have a temp
directory of the test's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..helpers import run_script
from .test_subject_order import _by_subject, _interleaved

JOB = Path(__file__).parent / "jobs" / "scratch_guard_job.py"
SUBJECTS, ROUNDS = 40, 25


def test_a_copy_gets_the_same_verdict_whether_the_scratch_space_is_writable_or_not(nats_server, nats_client,
                                                                                  stream_name, tmp_path):
    source, prefix = f"{stream_name}S", f"{stream_name}T"
    nats_client.add_stream(source, [f"{source}.>"])
    _interleaved(nats_client, [f"{source}.dev{i:02d}" for i in range(SUBJECTS)], ROUNDS)
    targets = [f"{prefix}{phase}{copy}" for phase in "WTL" for copy in ("NARROW", "DOCUMENTED")]
    for target in targets:
        nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
    workers_tmp = tmp_path / "tmp"
    workers_tmp.mkdir()
    out = run_script(sys.executable, JOB, nats_server.url, source, prefix, env={"TMPDIR": str(workers_tmp)},
                     timeout=600)
    verdicts = {(r["phase"], r["copy"]): r for r in map(json.loads, out.splitlines()) if r.get("phase")}
    original = _by_subject(nats_client.messages(source))
    assert len(original) == SUBJECTS
    for phase in "WT":  # the temp dir writable, then not: the same verdicts
        narrow, documented = verdicts[(phase, "narrow")], verdicts[(phase, "documented")]
        assert (narrow["verdict"], narrow["errors"]) == ("refused", ["OrderError"]), (phase, narrow)
        assert nats_client.stored_count(f"{prefix}{phase}NARROW") == 0, phase  # refused before it published
        assert documented["verdict"] == "stored", (phase, documented)
        target = f"{prefix}{phase}DOCUMENTED"
        assert _by_subject(nats_client.messages(target), f"{target}.") == original, phase  # each once, in order
    # Spark's local directory itself unusable for the notes: every read fails, naming the folder (the shuffle's
    # files live beside it). Never a pass: nothing stored by either copy.
    for copy in ("narrow", "documented"):
        blocked = verdicts[("L", copy)]
        assert (blocked["verdict"], blocked["errors"]) == ("refused", ["LocalDirectoryError"]), blocked
        assert "pyspark-jetstream-notes" in blocked["text"]
        assert nats_client.stored_count(f"{prefix}L{copy.upper()}") == 0
