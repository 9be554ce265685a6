"""The examples run as a user runs them: as their own processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_with_its_embedded_server():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    done = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), "--orders", "1000"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Started an embedded nats-server" in out
    assert "Stream ORDERS: 1000 messages" in out and "AllowMsgTTL=True" in out
    mix = dict(re.findall(r"(\(none\)|1h|2m|30m|never): (\d+)", out.split("TTL mix:")[1]))
    # The driver's per-batch totals are visible without any logging setup.
    assert "JetStream sink write committed: 1000 published, 0 duplicates" in done.stderr
    assert mix == {"(none)": "200", "1h": "200", "2m": "200", "30m": "200", "never": "200"}
