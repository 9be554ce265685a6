"""The package as a user gets it: a wheel built from this tree, with its license, type marker and
metadata, installed non-editable into a fresh venv, then a plain script (the README's first job)
writes and reads through ``format("jetstream")`` with no registration call."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

from ..helpers import readme_python_block, run_script

ROOT = Path(__file__).resolve().parents[2]


def _build_wheel(out: Path) -> Path:
    """Build from a clean copy of the tree: setuptools reuses a ``build/`` folder it finds, which would
    let a file deleted from the tree still reach the wheel."""
    import shutil

    source = out.parent / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    [wheel] = out.glob("pyspark_jetstream-*.whl")
    return wheel


def test_the_wheel_carries_its_license_type_marker_and_metadata(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_string(zf.read(meta_name).decode())
        license_text = zf.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert "pyspark_jetstream/py.typed" in names
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert license_text == (ROOT / "LICENSE").read_text()
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.10"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert {url.split(",")[0] for url in meta.get_all("Project-URL")} >= {"Homepage", "Source", "Issues"}
    # The package page starts with what the package does and how to install it.
    body = meta.get_payload()
    assert body.startswith("# pyspark-jetstream\n\nThe Apache Spark connector for [NATS JetStream]")
    assert body.index("pip install pyspark-jetstream") < body.index("```python")


def test_the_wheel_in_a_fresh_venv_writes_and_reads_from_a_plain_script(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", f"{wheel}[server]"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    # PySpark is not a requirement (a platform brings its own): without one, the import says what to install.
    bare = subprocess.run([python, "-c", "import pyspark_jetstream"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 1
    assert bare.stderr.strip().splitlines()[-1] == (
        "ImportError: pyspark-jetstream needs PySpark 4.0 or newer, and no PySpark is installed: pip install "
        "'pyspark>=4.0' (or 'pyspark-jetstream[spark]'; with Spark Connect, 'pyspark-client' on the client and "
        "the connector on the Connect server).")
    done = subprocess.run([python, "-m", "pip", "install", "-q", f"{wheel}[spark,server]"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    where = run_script(python, "-c", "import pyspark_jetstream as p, importlib.metadata as m; "
                       "print(p.__file__); print(m.distribution('pyspark-jetstream').read_text('direct_url.json'))")
    installed, direct_url = where.splitlines()[:2]
    assert installed.startswith(str(venv)) and "site-packages" in installed  # not this tree, not editable
    assert '"editable"' not in direct_url
    # The README's own-code script, as it is, with no NATS_URL: the wheel's [server] extra starts
    # the local server (this is also the README script's test: one Spark driver run, not two).
    script = tmp_path / "first_job.py"
    script.write_text(readme_python_block("# first_job.py"))
    out = run_script(python, script, cwd=tmp_path)
    # The batch read's table shows the three orders with their TTLs (the null one took defaultTtl);
    # the write's two partitions publish side by side, so the sequences are 1..3 in either order.
    table = [line for line in out.splitlines() if line.startswith("|") and "orders.c" in line]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert sorted(row[0] for row in cells) == ["1", "2", "3"]
    assert sorted(row[1:4] for row in cells) == [
        ["orders.c1", '{"id": 1, "amount": 9.5}', "1h"],
        ["orders.c1", '{"id": 3, "amount": 4.25}', "never"],
        ["orders.c2", '{"id": 2, "amount": 20.0}', "30m"],
    ]
    assert all(row[4] != "NULL" for row in cells if row[3] != "never")  # expires_at for a finite TTL
    # The streaming copy carried every order to ORDERS_COPY.
    assert "ORDERS_COPY: ['copy.orders.c1', 'copy.orders.c1', 'copy.orders.c2']" in out.splitlines()
