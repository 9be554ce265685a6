"""The suite's own scheduling: the unit tests first while the JVMs' class-data archive is built in the
background, and no JVM before the build has ended (tests/schedule.py, tests/jvm_archive.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import jvm_archive
from tests.schedule import file_order


def test_unit_files_come_first_then_integration_files_longest_first_and_unlisted_ones_last():
    paths = ["tests/integration/test_threads.py", "tests/integration/test_unlisted.py", "tests/unit/test_z.py",
             "tests/integration/test_source.py", "tests/unit/test_a.py", "tests/integration/test_upgrade.py"]
    assert sorted(paths, key=file_order) == [
        "tests/unit/test_a.py", "tests/unit/test_z.py", "tests/integration/test_source.py",
        "tests/integration/test_upgrade.py", "tests/integration/test_threads.py", "tests/integration/test_unlisted.py"]


# A builder as tests/jvm_archive.py starts one: it holds the archive's lock (inherited, locked before it
# started) until it ends, and writes the archive (or not: a failed build) just before.
BUILDER = textwrap.dedent("""
    import sys
    sys.stdin.readline()  # until the test lets it end
    if sys.argv[1] == "ok":
        open(sys.argv[2], "wb").write(b"archive")
""")


def _builder(archive: Path, outcome: str) -> subprocess.Popen:
    fd = os.open(jvm_archive._lock_path(archive), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return subprocess.Popen([sys.executable, "-c", BUILDER, outcome, str(archive)], pass_fds=(fd,),
                                stdin=subprocess.PIPE, text=True)
    finally:
        os.close(fd)


@pytest.mark.parametrize("outcome", ["ok", "failed"])
def test_wait_returns_when_the_build_ends_and_drops_an_archive_that_never_came(tmp_path, monkeypatch, outcome):
    archive = tmp_path / "spark-key.jsa"
    monkeypatch.setattr(jvm_archive, "_state", {"archive": archive})
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", jvm_archive._with_archive(archive))
    builder = _builder(archive, outcome)
    try:
        # Under way: another process's builder (this one did not start it) holds the lock.
        fd = os.open(jvm_archive._lock_path(archive), os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        builder.stdin.write("end\n")
        builder.stdin.flush()
        jvm_archive.wait()  # returns only once the builder has ended: the archive is whole or absent
    finally:
        builder.kill()
        builder.wait(30)
    if outcome == "ok":
        assert archive.read_bytes() == b"archive"
        assert os.environ["JAVA_TOOL_OPTIONS"] == jvm_archive._with_archive(archive)
    else:
        assert os.environ["JAVA_TOOL_OPTIONS"] == jvm_archive.C1_ONLY  # the JVMs start without it
