"""The soak script runs end to end (on request: pytest -m slow tests/perf)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).with_name("soak.py")


@pytest.mark.slow
def test_one_minute_soak_loses_and_duplicates_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SOAK), "--minutes", "1", "--restart-every", "25", "--rate", "200",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "soak.md").read_text()
    assert "| duplicates | 0 |" in report and "| losses | 0 |" in report and "| server restarts | 2 |" in report
