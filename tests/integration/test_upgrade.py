"""Upgrades keep running (issue #39): a checkpoint written by the previous release resumes, with the
job's code unchanged, exactly-once and in order.

The previous release (d7c6868) split reads by subject by default; its users' copies needed no
shuffle. The same job on this release, from that checkpoint, must go on (the checkpoint's split is
kept until the user sets the option ``split``), not stop at its first micro-batch because a copy
straight from a read split by sequence is refused. The previous release's connector is taken from
the repository's history (``git archive``) and put first on the job's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from ..helpers import run_script

PREVIOUS = "d7c686892df77d31b8474315f150f4937435ec5a"
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "jobs" / "upgrade_copy_job.py"
SUBJECTS = 6


def _previous_connector(into: Path) -> Path:
    """The package as the previous release shipped it, from the repository's history."""
    archive = into / "previous.tar"
    done = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), PREVIOUS,
                           "connector"], capture_output=True, text=True)
    assert done.returncode == 0, (f"the previous release ({PREVIOUS[:7]}) must be in this clone's history (a full "
                                  f"clone, not a shallow one): {done.stderr}")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data") if sys.version_info >= (3, 12) else tar.extractall(into)
    return into / "connector"


def _publish(nats_client, source: str, rounds: int, start: int) -> None:
    async def go():
        for r in range(start, start + rounds):
            for i in range(SUBJECTS):
                ack = await nats_client.js.publish(f"{source}.d{i}", f"{i}:{r}".encode())
                assert ack.seq > 0

    nats_client.run(go(), timeout=120)


def _run(nats_server, source: str, target: str, checkpoint: Path, connector: Path) -> dict:
    out = run_script(sys.executable, JOB, nats_server.url, source, target, str(checkpoint),
                     env={"PYTHONPATH": str(connector)}, timeout=400)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["connector"].startswith(str(connector)), result  # the release meant ran
    assert result["ended"], "the streaming copy did not finish within 600s"
    return result


def test_a_copy_checkpointed_by_the_previous_release_resumes_unchanged(nats_server, nats_client, stream_name,
                                                                      tmp_path):
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"], allow_msg_ttl=True)
    checkpoint = tmp_path / "checkpoint"
    _publish(nats_client, source, 500, 0)  # 3,000 messages
    before = _run(nats_server, source, target, checkpoint, _previous_connector(tmp_path))
    assert before["error"] is None and sum(before["rows"]) == 3000, before
    assert nats_client.stored_count(target) == 3000
    _publish(nats_client, source, 500, 500)  # 3,000 more
    after = _run(nats_server, source, target, checkpoint, ROOT / "connector")
    assert after["error"] is None, after["error"]
    assert sum(after["rows"]) == 3000, after
    copied: dict[str, list[bytes]] = {}
    for m in nats_client.messages(target):
        copied.setdefault(m.subject.removeprefix(f"{target}."), []).append(m.data)
    assert copied == {f"{source}.d{i}": [f"{i}:{r}".encode() for r in range(1000)] for i in range(SUBJECTS)}
